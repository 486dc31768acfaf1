#include "runtime/checksum.h"

#include <fmt/format.h>

#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/errors.h"

namespace cubesim::rt {

Checksums::Checksums(int rank, std::size_t slots) : rank_(rank), slots_(slots), host_(slots, 0), taken_(slots, false) {
  Context& ctx = Context::current("Checksums");
  if (Context::current_rank("Checksums") != rank)
    throw RuntimeError(fmt::format("Checksums: made for rank {} on rank {}: a rank takes its own checksums", rank,
                                   Context::current_rank("Checksums")));
  device_ = ctx.backend().checksum_slots(rank, slots);
}

Checksums::~Checksums() = default;

void Checksums::take(std::size_t slot, const Tensor& t, kernels::ChecksumKind kind, std::uint64_t base) {
  if (kind == kernels::ChecksumKind::word) take_slots(slot, Backend::kNoSlot, t, base);
  else take_slots(Backend::kNoSlot, slot, t, base);
}

void Checksums::take_pair(std::size_t word_slot, std::size_t mix_slot, const Tensor& t, std::uint64_t base) {
  if (word_slot == mix_slot)
    throw RuntimeError(fmt::format("Checksums::take_pair: both kinds into slot {}; give two slots", word_slot));
  take_slots(word_slot, mix_slot, t, base);
}

void Checksums::take_slots(std::size_t word, std::size_t mix, const Tensor& t, std::uint64_t base) {
  for (std::size_t slot : {word, mix}) {
    if (slot == Backend::kNoSlot) continue;
    if (slot >= slots_)
      throw RuntimeError(slots_ == 0 ? fmt::format("Checksums::take: slot {}, but these Checksums have no slots", slot)
                                     : fmt::format("Checksums::take: slot {} of {} (valid: 0..{})", slot, slots_,
                                                   slots_ - 1));
    if (taken_[slot])
      throw RuntimeError(fmt::format("Checksums::take: slot {} was taken already; each slot holds one checksum", slot));
  }
  for (std::size_t slot : {word, mix})
    if (slot != Backend::kNoSlot) taken_[slot] = true;
  Context& ctx = Context::current("checksum");
  ctx.check_owned(t, "checksum");
  if (t.device() != rank_)
    throw RuntimeError(fmt::format("checksum on rank {}: tensor {} lives on rank {}", rank_, t.describe(), t.device()));
  Backend& be = ctx.backend();
  if (device_) {
    be.checksum(t, base, device_.get(), word, mix);
    return;
  }
  kernels::ChecksumPair v;
  if (!be.timing_only() && t.numel() > 0) {
    const std::vector<std::uint8_t> bytes = t.to_host_bytes();
    if (mix == Backend::kNoSlot) v.word = kernels::checksum(bytes.data(), t.dtype(), t.numel(), kernels::ChecksumKind::word, base);
    else v = kernels::checksum_pair(bytes.data(), t.dtype(), t.numel(), base);
  }
  if (word != Backend::kNoSlot) host_[word] = v.word;
  if (mix != Backend::kNoSlot) host_[mix] = v.mix;
  // One pass: an integer add per element (and the mix's hash: a few more operations) on the vector
  // units, against reading t once.
  OpCost c;
  c.kind = OpCost::Kind::elementwise;
  c.name = "checksum";
  c.dtype = t.dtype();
  c.bytes_read = t.nbytes();
  c.flops = static_cast<double>(t.numel()) * (mix == Backend::kNoSlot ? 1 : 5);
  c.kernel = true;
  const sim::Time t0 = ctx.simulator().now();
  be.charge(rank_, c);
  const sim::Time t1 = ctx.simulator().now();
  ctx.add_compute(rank_, t1 - t0);
  if (t1 > t0 && ctx.trace().enabled()) ctx.trace().span(ctx.compute_track(rank_), "checksum", t0, t1);
}

std::vector<std::uint64_t> Checksums::read() {
  if (!device_) return host_;
  std::vector<std::uint64_t> out(slots_);
  Context::current("Checksums::read").backend().read_checksums(rank_, device_.get(), out.data(), slots_);
  return out;
}

}  // namespace cubesim::rt
