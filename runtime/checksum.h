// checksum.h — exact checksums of tensors (kernels/checksum.h), taken where the data lives.
//
// A rank takes the checksums of one step into numbered slots as it goes and reads them all at once:
// on the cuda backend each take() is a device reduction into a device array and read() is the one
// device-to-host copy of the step; on the simulator each take() is charged on the rank's vector
// units (a roofline of one integer add per element against HBM) at the moment it is taken; the
// host computes them for free. Every backend gives the same bits (integer sums do not depend on
// the order a device adds in).
//
//   rt::Checksums cs(rank, 8 * layers);
//   cs.take(8 * l + 0, shard, kernels::ChecksumKind::word);
//   cs.take_pair(8 * l + 2, 8 * l + 3, x);                // word and mix, one pass
//   ...
//   std::vector<std::uint64_t> v = cs.read();
//
// The element order of a strided view is row-major over the view; `base` is its first element's
// index in a larger tensor (kernels/checksum.h: mix sums of chunks add up to the whole's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/checksum.h"
#include "runtime/tensor.h"

namespace cubesim::rt {

class Checksums {
 public:
  // Inside spawn(), on the calling rank.
  Checksums(int rank, std::size_t slots);
  ~Checksums();
  Checksums(const Checksums&) = delete;
  Checksums& operator=(const Checksums&) = delete;

  std::size_t size() const { return slots_; }
  // Takes t's checksum into `slot` (RuntimeError when the slot is out of range, already taken, or t
  // is not on this rank). A timing-only backend charges the time and stores 0.
  void take(std::size_t slot, const Tensor& t, kernels::ChecksumKind kind, std::uint64_t base = 0);
  // Both kinds in one pass over t: the word sum into `word_slot`, the mix sum into `mix_slot`.
  void take_pair(std::size_t word_slot, std::size_t mix_slot, const Tensor& t, std::uint64_t base = 0);
  // Every slot (0 where nothing was taken), in one read.
  std::vector<std::uint64_t> read();

 private:
  // Checks and marks the slots; the backend's pass into them (kNoSlot: not taken).
  void take_slots(std::size_t word, std::size_t mix, const Tensor& t, std::uint64_t base);
  int rank_;
  std::size_t slots_;
  std::shared_ptr<void> device_;     // the backend's slots (cuda), or null
  std::vector<std::uint64_t> host_;  // the slots computed on host values
  std::vector<bool> taken_;
};

}  // namespace cubesim::rt
