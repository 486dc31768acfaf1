// allocator.h — first-fit allocation over one memory's address space, with statistics.
//
// Every Memory owns one; the runtime places tensors with it. Out of memory is an exception whose
// message carries the statistics (in use, free, largest free block), because "out of memory" alone
// does not say whether the memory is full or fragmented.
//
//   Allocator a("cube0.hbm", 48ull << 30);
//   std::uint64_t x = a.allocate(1 << 20, 256, "activations");   // 256-byte aligned
//   a.free(x);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace cubesim::hw {

class Allocator {
 public:
  struct Stats {
    std::uint64_t capacity = 0;
    std::uint64_t used = 0;          // bytes in live allocations
    std::uint64_t peak = 0;          // the most `used` has been
    std::uint64_t allocations = 0;   // live allocations
    std::uint64_t largest_free = 0;  // the biggest block an allocation could still get
    std::uint64_t free_blocks = 0;
  };

  Allocator(std::string owner, std::uint64_t capacity);

  // Returns the address of `bytes` bytes (at least 1) aligned to `align` (a power of two), taken
  // from the lowest free block that fits. Throws OutOfMemoryError with the statistics, or
  // MemoryError for a bad alignment. `what` names the allocation in messages.
  std::uint64_t allocate(std::uint64_t bytes, std::uint64_t align = 256, std::string_view what = {});
  // Throws MemoryError if `addr` is not the start of a live allocation.
  void free(std::uint64_t addr);
  // The size given to allocate() for the allocation starting at addr; throws like free().
  std::uint64_t size_of(std::uint64_t addr) const;
  bool is_allocated(std::uint64_t addr) const { return live_.count(addr) != 0; }

  Stats stats() const;
  // "in use 47.00 GiB in 12 allocations (peak 47.50 GiB), free 1.00 GiB in 3 blocks, largest 768.00 MiB"
  std::string describe() const;
  void reset();

 private:
  struct Live {
    std::uint64_t size;   // as requested
    std::uint64_t start;  // of the block carved out (before alignment padding)
    std::uint64_t end;
  };
  std::string owner_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;  // start -> end, disjoint, coalesced
  std::map<std::uint64_t, Live> live_;           // aligned address -> allocation
};

}  // namespace cubesim::hw
