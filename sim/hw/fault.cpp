#include "sim/hw/fault.h"

#include <algorithm>
#include <bit>
#include <random>

#include <fmt/format.h>

#include "sim/hw/engine.h"
#include "sim/hw/system.h"

namespace cubesim::hw {

namespace {
constexpr const char* kSiteNames[] = {"link", "dma", "hbm", "tcm", "gemm_tile", "reduce"};
constexpr const char* kModelNames[] = {"bit_flip", "multi_bit", "stuck_at", "word_burst"};

std::string join_names(const char* const* names, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::string(names[i]);
  return s;
}

bool at_rest(FaultSite s) { return s == FaultSite::hbm || s == FaultSite::tcm; }
}  // namespace

std::string_view fault_site_name(FaultSite s) { return kSiteNames[static_cast<int>(s)]; }
std::string_view fault_model_name(FaultModel m) { return kModelNames[static_cast<int>(m)]; }

FaultSite parse_fault_site(std::string_view s, std::string_view what) {
  for (FaultSite x : kFaultSites)
    if (fault_site_name(x) == s) return x;
  throw FaultError(fmt::format("{}: unknown fault site '{}' (valid: {})", what, s, join_names(kSiteNames, 6)));
}

FaultModel parse_fault_model(std::string_view s, std::string_view what) {
  for (FaultModel x : kFaultModels)
    if (fault_model_name(x) == s) return x;
  throw FaultError(fmt::format("{}: unknown fault model '{}' (valid: {})", what, s, join_names(kModelNames, 4)));
}

std::string describe(const FaultRecord& r) {
  return fmt::format("{} at {}: {} changing {} bit{} in {} [{:#x}, {:#x})", r.unit, sim::format_time(r.time), fault_model_name(r.model), r.bits_changed,
                     r.bits_changed == 1 ? "" : "s", r.memory, r.address, r.address + r.bytes);
}

void check_fault_model(const FaultSpec& s, std::string_view where) {
  if (s.word_bytes != 2 && s.word_bytes != 4)
    throw FaultError(fmt::format("{}.word_bytes = {}: valid are 2 (bf16, f16) and 4 (f32)", where, s.word_bytes));
  const int word_bits = 8 * s.word_bytes;
  if (s.model == FaultModel::multi_bit && (s.bits < 2 || s.bits > word_bits))
    throw FaultError(fmt::format("{}.bits = {}: a multi_bit fault flips 2 to {} adjacent bits of a {}-byte word", where,
                                 s.bits, word_bits, s.word_bytes));
  if (s.model == FaultModel::word_burst && (s.words < 2 || s.words > 1 << 20))
    throw FaultError(fmt::format("{}.words = {}: a word_burst covers 2 to 1048576 consecutive words", where, s.words));
  if (s.model == FaultModel::stuck_at && s.stuck_value != 0 && s.stuck_value != 1)
    throw FaultError(fmt::format("{}.stuck_value = {}: valid are 0 and 1", where, s.stuck_value));
  if (!at_rest(s.site) && s.nth < 1)
    throw FaultError(fmt::format("{}.nth = 0: the first matching operation is 1", where));
}

std::pair<std::uint64_t, std::uint64_t> fault_window(const FaultSpec& s, std::uint64_t span_bytes) {
  const std::uint64_t wb = static_cast<std::uint64_t>(s.word_bytes);
  const std::uint64_t nwords = span_bytes / wb;
  if (nwords == 0) return {0, std::min<std::uint64_t>(span_bytes, wb)};  // a span shorter than a word: all of it
  std::mt19937_64 rng(s.seed);
  const std::uint64_t want = s.model == FaultModel::word_burst ? static_cast<std::uint64_t>(s.words) : 1;
  const std::uint64_t n = std::min(want, nwords);
  const std::uint64_t first = rng() % (nwords - n + 1);
  return {first * wb, n * wb};
}

FaultRecord apply_fault_model(const FaultSpec& s, std::span<std::byte> span) {
  FaultRecord r;
  r.site = s.site;
  r.model = s.model;
  const auto [offset, bytes] = fault_window(s, span.size());
  r.offset = offset, r.bytes = bytes;
  // The bits come from a second stream of the seed, so the window and the bits are independent.
  std::mt19937_64 rng(s.seed ^ 0x5bd1e9955bd1e995ull);
  const std::size_t wb = std::min<std::size_t>(static_cast<std::size_t>(s.word_bytes), bytes);
  auto flip = [&](std::size_t word_start, int bit) {
    span[word_start + static_cast<std::size_t>(bit / 8)] ^= static_cast<std::byte>(1u << (bit % 8));
    ++r.bits_changed;
  };
  const int word_bits = static_cast<int>(8 * wb);
  if (word_bits == 0) return r;
  switch (s.model) {
    case FaultModel::bit_flip: flip(offset, static_cast<int>(rng() % word_bits)); break;
    case FaultModel::multi_bit: {
      const int n = std::min(s.bits, word_bits);
      const int b0 = static_cast<int>(rng() % static_cast<std::uint64_t>(word_bits - n + 1));
      for (int b = b0; b < b0 + n; ++b) flip(offset, b);
      break;
    }
    case FaultModel::stuck_at:
      for (std::size_t i = 0; i < wb; ++i) {
        const auto want = static_cast<std::byte>(s.stuck_value ? 0xff : 0x00);
        r.bits_changed += static_cast<std::uint32_t>(std::popcount(static_cast<unsigned>(span[offset + i] ^ want)));
        span[offset + i] = want;
      }
      break;
    case FaultModel::word_burst:
      for (std::uint64_t w = offset; w < offset + bytes; w += wb) flip(w, static_cast<int>(rng() % word_bits));
      break;
  }
  return r;
}

void FaultInjector::add(const FaultSpec& s, std::string_view where) {
  if (!sys_->options().functional)
    throw FaultError(fmt::format("{}: fault injection needs values, and this system is timing-only (turn timing_only "
                                 "off)",
                                 where));
  check_fault_model(s, where);
  const int cubes = sys_->num_cubes();
  auto check_cube = [&](bool required) {
    if ((required || s.cube != -1) && (s.cube < 0 || s.cube >= cubes))
      throw FaultError(fmt::format("{}.cube = {}: the topology '{}' has cubes 0..{}{}", where, s.cube,
                                   sys_->topology().name, cubes - 1, required ? "" : " (or -1: any cube)"));
  };
  auto check_pe = [&](bool required) {
    int pes = 0;  // the cube's PEs, or any cube's (-1): the most a cube has
    if (s.cube >= 0) pes = sys_->cube(s.cube).num_pes();
    else
      for (int c = 0; c < cubes; ++c) pes = std::max(pes, sys_->cube(c).num_pes());
    if ((required || s.pe != -1) && (s.pe < 0 || s.pe >= pes))
      throw FaultError(fmt::format("{}.pe = {}: a cube of '{}' has PEs 0..{}{}", where, s.pe, sys_->topology().name,
                                   pes - 1, required ? "" : " (or -1: any PE)"));
  };
  switch (s.site) {
    case FaultSite::link:
      if (s.link < 0 || s.link >= sys_->num_links())
        throw FaultError(fmt::format("{}.link = {}: the topology '{}' has links 0..{} (cubesim topo show lists them)",
                                     where, s.link, sys_->topology().name, sys_->num_links() - 1));
      break;
    case FaultSite::dma:
    case FaultSite::gemm_tile:
      check_cube(false);
      check_pe(false);
      break;
    case FaultSite::reduce: check_cube(false); break;
    case FaultSite::hbm:
    case FaultSite::tcm: {
      check_cube(true);
      if (s.site == FaultSite::tcm) check_pe(true);
      Memory& m = s.site == FaultSite::hbm ? sys_->hbm(s.cube) : sys_->tcm(s.cube, s.pe);
      if (s.bytes == 0 || s.address >= m.capacity() || s.bytes > m.capacity() - s.address)
        throw FaultError(fmt::format("{}: region [{:#x}, +{}) is not inside {} (capacity {} bytes; bytes must be > 0)",
                                     where, s.address, s.bytes, m.name(), m.capacity()));
      if (!s.at) throw FaultError(fmt::format("{}.at: a fault at rest needs the simulated time it strikes", where));
      if (*s.at < sys_->simulator().now())
        throw FaultError(fmt::format("{}.at = {}: already past (the simulator is at {})", where,
                                     sim::format_time(*s.at), sim::format_time(sys_->simulator().now())));
      break;
    }
  }
  specs_.push_back(s);
  state_.push_back({});
  ++armed_;
  if (at_rest(s.site)) {
    const std::size_t i = specs_.size() - 1;
    const std::uint64_t gen = generation_;
    sys_->simulator().at(*s.at, [this, i, gen] {
      if (gen == generation_) fire_at_rest(i);
    });
  }
}

void FaultInjector::clear() {
  specs_.clear();
  state_.clear();
  log_.clear();
  armed_ = 0;
  ++generation_;
}

std::vector<std::size_t> FaultInjector::pending() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < state_.size(); ++i)
    if (!state_[i].fired) out.push_back(i);
  return out;
}

bool FaultInjector::due(std::size_t i) {
  Armed& a = state_[i];
  if (a.fired) return false;
  const FaultSpec& s = specs_[i];
  if (s.at && sys_->simulator().now() < *s.at) return false;
  return ++a.seen == s.nth;
}

template <class Map>
void FaultInjector::corrupt(std::size_t i, std::string unit, Memory& mem, std::uint64_t span_bytes, Map address_of) {
  const FaultSpec& s = specs_[i];
  const auto [offset, bytes] = fault_window(s, span_bytes);
  // The window's words, read, changed by the model and written back (apply_fault_model on a span
  // that is exactly the window takes all of it: the same bits as on the whole span).
  std::vector<std::byte> buf(static_cast<std::size_t>(bytes));
  for (std::uint64_t b = 0; b < bytes; ++b) mem.peek(address_of(offset + b), std::span(&buf[b], 1));
  FaultRecord r = apply_fault_model(s, std::span(buf));
  for (std::uint64_t b = 0; b < buf.size(); ++b) mem.poke(address_of(offset + b), std::span(&buf[b], 1));
  r.spec = i;
  r.time = sys_->simulator().now();
  r.unit = std::move(unit);
  r.memory = mem.name();
  r.cube = mem.cube();
  r.offset = offset;
  r.bytes = bytes;
  r.address = address_of(offset);
  r.operation = at_rest(s.site) ? 0 : state_[i].seen;
  log_.push_back(std::move(r));
  state_[i].fired = true;
  --armed_;
}

void FaultInjector::fire_at_rest(std::size_t i) {
  const FaultSpec& s = specs_[i];
  Memory& m = s.site == FaultSite::hbm ? sys_->hbm(s.cube) : sys_->tcm(s.cube, s.pe);
  const std::uint64_t base = s.address;
  corrupt(i, m.name(), m, s.bytes, [base](std::uint64_t off) { return base + off; });
}

void FaultInjector::on_landed(const TransferRecord& r) {
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (state_[i].fired || (s.site != FaultSite::link && s.site != FaultSite::dma)) continue;
    const Unit* hit = nullptr;
    auto dma_matches = [&s](const Unit& u) {
      return (u.kind() == UnitKind::dma_read || u.kind() == UnitKind::dma_write) &&
             (s.cube == -1 || u.place().cube == s.cube) && (s.pe == -1 || u.place().pe == s.pe);
    };
    // The DMA channel that issues the transfer's requests (it is not always a stage of its own).
    if (s.site == FaultSite::dma && r.path->injector && dma_matches(*r.path->injector)) hit = r.path->injector;
    for (const Stage& st : r.path->stages) {
      if (hit) break;
      const Unit& u = *st.unit;
      if (s.site == FaultSite::link ? u.kind() == UnitKind::link && static_cast<const Link&>(u).index() == s.link
                                    : dma_matches(u))
        hit = &u;
    }
    if (!hit || !due(i)) continue;
    const Region& d = r.dst_region;
    corrupt(i, hit->name(), *r.dst, r.bytes, [&d](std::uint64_t off) {
      return d.row_addr(off / d.row_bytes) + off % d.row_bytes;
    });
  }
}

void FaultInjector::on_gemm_tile(int cube, int pe, Memory& tcm, std::uint64_t addr, std::uint64_t bytes) {
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.site != FaultSite::gemm_tile || state_[i].fired) continue;
    if ((s.cube != -1 && s.cube != cube) || (s.pe != -1 && s.pe != pe) || !due(i)) continue;
    corrupt(i, fmt::format("cube{}.pe{}.mac (GEMM tile)", cube, pe), tcm, bytes, [addr](std::uint64_t off) { return addr + off; });
  }
}

void FaultInjector::on_reduce(int cube, Memory& mem, std::uint64_t addr, std::uint64_t bytes) {
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& s = specs_[i];
    if (s.site != FaultSite::reduce || state_[i].fired) continue;
    if ((s.cube != -1 && s.cube != cube) || !due(i)) continue;
    corrupt(i, fmt::format("cube{} reduction step", cube), mem, bytes, [addr](std::uint64_t off) { return addr + off; });
  }
}

}  // namespace cubesim::hw
