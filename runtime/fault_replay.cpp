#include "runtime/fault_replay.h"

#include <cstddef>
#include <span>

#include <fmt/format.h>

#include "runtime/tensor.h"

namespace cubesim::rt {

void FaultReplay::add(const hw::FaultSpec& s, std::string_view where, int ranks) {
  if (s.site != hw::FaultSite::gemm_tile && s.site != hw::FaultSite::reduce && s.site != hw::FaultSite::link)
    throw hw::FaultError(fmt::format("{}.site: '{}' needs a simulated system; on this backend faults replay at the "
                                     "runtime's points (valid: gemm_tile: a GEMM's output; reduce: a reduction step's "
                                     "result; link: a collective's result where it landed)",
                                     where, hw::fault_site_name(s.site)));
  if (s.site == hw::FaultSite::link && s.link != -1)
    throw hw::FaultError(fmt::format("{}.link: {}: this backend has no simulated links; a link fault strikes a "
                                     "collective's result on rank `cube` (valid: -1)",
                                     where, s.link));
  if (s.cube < -1 || s.cube >= ranks)
    throw hw::FaultError(fmt::format("{}.cube: {} is not a rank (valid: -1 for any, or 0..{})", where, s.cube, ranks - 1));
  if (s.pe != -1)
    throw hw::FaultError(fmt::format("{}.pe: {}: this backend has no simulated PEs (valid: -1)", where, s.pe));
  if (s.at)
    throw hw::FaultError(fmt::format("{}.at: this backend keeps no simulated time; give the nth operation only", where));
  hw::check_fault_model(s, where);
  specs_.push_back(s);
  state_.push_back({});
  ++armed_;
}

void FaultReplay::clear() {
  specs_.clear();
  state_.clear();
  log_.clear();
  phase_.clear();
  armed_ = 0;
}

std::vector<std::size_t> FaultReplay::pending() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (!state_[i].fired) out.push_back(i);
  return out;
}

void FaultReplay::set_phase(int rank, int phase) {
  if (rank < 0) return;
  if (phase_.size() <= static_cast<std::size_t>(rank)) phase_.resize(static_cast<std::size_t>(rank) + 1, -1);
  phase_[static_cast<std::size_t>(rank)] = phase;
}

void FaultReplay::on_point(FaultPoint p, const Tensor& t) {
  if (!armed_ || !t.is_contiguous() || t.nbytes() == 0) return;
  const hw::FaultSite site = p == FaultPoint::gemm_output ? hw::FaultSite::gemm_tile
                             : p == FaultPoint::reduce    ? hw::FaultSite::reduce
                                                          : hw::FaultSite::link;
  const int rank = t.device();
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const hw::FaultSpec& s = specs_[i];
    if (state_[i].fired || s.site != site || (s.cube != -1 && s.cube != rank)) continue;
    if (++state_[i].seen != s.nth) continue;
    // The model's window of the output, read from where it lives, changed and written back.
    const auto [offset, bytes] = hw::fault_window(s, t.nbytes());
    std::vector<std::byte> buf(static_cast<std::size_t>(bytes));
    t.storage().read(t.byte_offset() + offset, buf.data(), bytes);
    Record r;
    r.fault = hw::apply_fault_model(s, std::span(buf));
    t.storage().write(t.byte_offset() + offset, buf.data(), bytes);
    r.fault.spec = i;
    r.fault.unit = fmt::format("rank{} {}", rank,
                               p == FaultPoint::gemm_output ? "GEMM output"
                               : p == FaultPoint::reduce    ? "reduction step"
                                                            : "collective output");
    r.fault.memory = fmt::format("rank{}", rank);
    r.fault.cube = rank;
    r.fault.offset = offset;
    r.fault.bytes = bytes;
    r.fault.address = t.byte_offset() + offset;
    r.fault.operation = state_[i].seen;
    r.rank = rank;
    r.phase = static_cast<std::size_t>(rank) < phase_.size() ? phase_[static_cast<std::size_t>(rank)] : -1;
    log_.push_back(std::move(r));
    state_[i].fired = true;
    --armed_;
  }
}

}  // namespace cubesim::rt
