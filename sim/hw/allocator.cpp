#include "sim/hw/allocator.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "sim/hw/errors.h"
#include "sim/hw/format.h"

namespace cubesim::hw {

Allocator::Allocator(std::string owner, std::uint64_t capacity) : owner_(std::move(owner)), capacity_(capacity) {
  reset();
}

void Allocator::reset() {
  free_.clear();
  live_.clear();
  used_ = peak_ = 0;
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

std::uint64_t Allocator::allocate(std::uint64_t bytes, std::uint64_t align, std::string_view what) {
  if (align == 0 || (align & (align - 1)) != 0) {
    throw MemoryError(fmt::format("{}: alignment {} for allocation '{}' is not valid; give a power of two",
                                  owner_, align, what));
  }
  const std::uint64_t need = std::max<std::uint64_t>(bytes, 1);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::uint64_t start = it->first, end = it->second;
    const std::uint64_t a = (start + align - 1) & ~(align - 1);
    if (a < start || a >= end || end - a < need) continue;  // a < start: wrapped
    // The padding in front of an aligned allocation goes back to the free list; so does the tail.
    free_.erase(it);
    if (a > start) free_.emplace(start, a);
    if (a + need < end) free_.emplace(a + need, end);
    live_.emplace(a, Live{bytes, a, a + need});
    used_ += need;
    peak_ = std::max(peak_, used_);
    return a;
  }
  throw OutOfMemoryError(fmt::format(
      "{}: out of memory: cannot allocate {} ({} bytes, aligned to {}){}: capacity {}, {}", owner_,
      format_bytes(need), need, align, what.empty() ? "" : fmt::format(" for '{}'", what), format_bytes(capacity_),
      describe()));
}

void Allocator::free(std::uint64_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) {
    throw MemoryError(fmt::format("{}: free({:#x}): no live allocation starts at this address ({} live)", owner_,
                                  addr, live_.size()));
  }
  std::uint64_t start = it->second.start, end = it->second.end;
  used_ -= end - start;
  live_.erase(it);
  // Coalesce with the neighbours so first-fit sees the largest blocks.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == end) {
    end = next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  free_.emplace(start, end);
}

std::uint64_t Allocator::size_of(std::uint64_t addr) const {
  auto it = live_.find(addr);
  if (it == live_.end()) {
    throw MemoryError(fmt::format("{}: no live allocation starts at {:#x}", owner_, addr));
  }
  return it->second.size;
}

Allocator::Stats Allocator::stats() const {
  Stats s;
  s.capacity = capacity_;
  s.used = used_;
  s.peak = peak_;
  s.allocations = live_.size();
  s.free_blocks = free_.size();
  for (const auto& [start, end] : free_) s.largest_free = std::max(s.largest_free, end - start);
  return s;
}

std::string Allocator::describe() const {
  const Stats s = stats();
  return fmt::format("in use {} in {} allocation{} (peak {}), free {} in {} block{}, largest free block {}",
                     format_bytes(s.used), s.allocations, s.allocations == 1 ? "" : "s", format_bytes(s.peak),
                     format_bytes(s.capacity - s.used), s.free_blocks, s.free_blocks == 1 ? "" : "s",
                     format_bytes(s.largest_free));
}

}  // namespace cubesim::hw
