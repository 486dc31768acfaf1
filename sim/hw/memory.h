// memory.h — a simulated memory (a cube's HBM, a PE's TCM, the host's DRAM): real bytes at
// addresses, an allocator, and the channel servers that time accesses. A memory is a unit on the
// transfer paths that read or write it (path_unit.h).
//
// Functional access (read/write/fill) takes no simulated time: it is how a PE computes on its TCM
// and how the runtime initializes tensors. Time is spent by System::transfer (moving bytes between
// memories) and Pe::compute. Every access is checked: bounds, never-written bytes (when
// SystemOptions::check_uninitialized), and hazards against transfers in flight (hazard.h).
// In timing-only mode (SystemOptions::functional = false) nothing is stored and reads give zeros.
//
//   Memory& hbm = sys.hbm(0);
//   std::uint64_t a = hbm.allocate(n * 4, 256, "x");
//   hbm.write_as<float>(a, values);              // std::span<const float>
//   sys.transfer(hbm.at(a), sys.hbm(1).at(b), n * 4);
//   auto back = sys.hbm(1).read_as<float>(b, n); // std::vector<float>
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sim/core/simulator.h"
#include "sim/core/time.h"
#include "sim/hw/allocator.h"
#include "sim/hw/hazard.h"
#include "sim/hw/path_unit.h"
#include "sim/hw/region.h"
#include "sim/hw/server.h"
#include "sim/hw/sparse_store.h"

namespace cubesim::hw {

class Memory;
struct Path;  // system.cpp: a transfer path (Memory keeps the last one into it)

enum class MemoryKind : std::uint8_t { kHbm, kTcm, kHost };

// What a memory is made of: its figures and where it sits.
struct MemorySetup {
  MemoryKind kind = MemoryKind::kHbm;
  int cube = -1;  // -1 for the host
  int pe = -1;    // -1 unless a TCM
  std::uint64_t capacity = 0;
  sim::Bandwidth bandwidth;
  sim::Duration latency = 0;  // paid by reads
  std::uint32_t channels = 1;
  std::uint64_t interleave = 0;  // bytes per channel before the next (0: one block)
  bool hashed = false;           // blocks go to channels by a hash of the address (HbmSpec::channel_hash)
  bool functional = true;        // keeps values (SystemOptions::functional)
  bool check_uninitialized = true;
};

// An address in a memory: what transfer() takes.
struct MemRef {
  Memory* memory = nullptr;
  std::uint64_t addr = 0;
  MemRef operator+(std::uint64_t off) const { return MemRef{memory, addr + off}; }
};

class Memory final : public PathUnit {
 public:
  // `sim` times messages; `hazards` is the System's checker, which this memory's accesses report to.
  Memory(sim::Simulator& sim, HazardTracker& hazards, MemorySetup setup);

  MemRef at(std::uint64_t addr) { return MemRef{this, addr}; }

  MemoryKind memory_kind() const { return kind_; }  // HBM, TCM or host (kind() is the unit kind)
  int cube() const { return place().cube; }  // -1 for the host
  int pe() const { return place().pe; }      // -1 unless a TCM
  std::uint64_t capacity() const { return capacity_; }
  sim::Bandwidth bandwidth() const { return bandwidth_; }
  sim::Duration latency() const { return latency_; }
  std::uint32_t channels() const { return static_cast<std::uint32_t>(channels_.size()); }
  std::uint64_t interleave_bytes() const { return interleave_; }
  bool hashed() const { return hashed_; }
  // The channel that byte `addr` is served by.
  std::uint32_t channel_of(std::uint64_t addr) const;
  // The hazard checker this memory reports to: one per System, so it also tells which System a
  // memory belongs to.
  const HazardTracker& hazard_tracker() const { return *hazards_; }

  // ---- functional access (zero simulated time; checked) ----
  void write(std::uint64_t addr, std::span<const std::byte> data);
  void read(std::uint64_t addr, std::span<std::byte> out);
  void fill(std::uint64_t addr, std::uint64_t len, std::byte value);
  // The bytes as they are, with no hazard check, no time and no counters: what fault injection
  // (fault.h) reads and changes. Bytes never written read as zero.
  void peek(std::uint64_t addr, std::span<std::byte> out) const { store_.read(addr, out.data(), out.size()); }
  void poke(std::uint64_t addr, std::span<const std::byte> data) { store_.write(addr, data.data(), data.size()); }
  template <class T>
  void write_as(std::uint64_t addr, std::span<const T> values) {
    write(addr, std::as_bytes(values));
  }
  template <class T>
  void read_as(std::uint64_t addr, std::span<T> out) {
    read(addr, std::as_writable_bytes(out));
  }
  template <class T>
  std::vector<T> read_as(std::uint64_t addr, std::size_t count) {
    std::vector<T> v(count);
    read_as<T>(addr, std::span<T>(v));
    return v;
  }
  // dst = f(dst, src) in place over [dst_addr, dst_addr + len) of this memory and [src_addr,
  // src_addr + len) of `src` (may be this one; the ranges must not overlap), with the checks of
  // reading dst, reading src, then writing dst (bounds, hazards, never-written bytes) and no copy
  // out and back: what a reduction step does (SimBackend::reduce). Nothing in timing-only mode.
  void combine(Memory& src, std::uint64_t src_addr, std::uint64_t dst_addr, std::uint64_t len,
               SparseStore::Combine f, void* ctx);
  // The first never-written byte in [addr, addr + len), if any (nullopt in timing-only mode).
  std::optional<std::uint64_t> first_unwritten(std::uint64_t addr, std::uint64_t len) const;

  // ---- allocation ----
  std::uint64_t allocate(std::uint64_t bytes, std::uint64_t align = 256, std::string_view what = {}) {
    return allocator_.allocate(bytes, align, what);
  }
  void free(std::uint64_t addr) { allocator_.free(addr); }
  Allocator& allocator() { return allocator_; }
  const Allocator& allocator() const { return allocator_; }

  // ---- footprint and timing state ----
  const SparseStore& store() const { return store_; }
  std::uint64_t resident_bytes() const { return store_.resident_bytes(); }
  // What the channels served: counters() (unit.h).

  // Whether [addr, addr + len) lies inside the memory.
  bool contains(std::uint64_t addr, std::uint64_t len) const { return len <= capacity_ && addr <= capacity_ - len; }
  // Throws MemoryError unless [addr, addr + len) lies inside the memory. `what` says who asked.
  void check_range(std::uint64_t addr, std::uint64_t len, std::string_view what) const;
  void check_region(const Region& r, std::string_view what) const;

  // ---- as a unit on transfer paths ----
  // Books a chunk's bytes on the channels its addresses fall in (the interleave deals blocks round
  // them), from the head's arrival plus `pre` on; the chunk leaves once the work is done and its
  // tail has arrived.
  Passage serve(const ChunkVisit& v) override;
  // serve() for the chunk level's loop: the common case inline (an untraced chunk of one row that
  // books whole stripes while the channels are in step, or any untraced chunk of a one-channel
  // memory: one booking), the rest through serve(). The same bookings, counters and times.
  Passage serve_chunk(const ChunkVisit& v) {
    if (v.trace == nullptr && v.region->rows == 1 && (fast_single_ || (uniform_ && fast_masks_))) {
      const std::uint64_t addr = v.region->addr + v.offset;
      if (fast_single_ || ((addr & addr_mask_) | (v.bytes & bytes_mask_)) == 0) {
        Server& s = fast_single_ ? channels_[0] : stripe_;
        if (v.bytes != fast_bytes_) {
          fast_bytes_ = v.bytes;
          fast_duration_ = s.duration(fast_single_ ? v.bytes : v.bytes / channels_.size());
        }
        const sim::Duration d = fast_duration_;
        const auto [start, end] = s.book(v.forget_before, v.head + v.pre, d);
        s.account(v.bytes, d);
        return {start + v.post, std::max(end, v.tail + v.pre) + v.post};
      }
    }
    return serve(v);
  }
  StageFigures figures() const override;
  // The HBM's channel tracks ("hbm.ch0", ...), or the memory's own track when it has one channel.
  void declare_tracks(sim::Trace& trace) override;
  std::string track_group() const override;  // "cube3", "host"
  std::string track_name() const override;   // "hbm", "pe5.tcm", "memory"
  std::string track_name_of(std::uint64_t channel) const override;  // "hbm.ch3"

 private:
  friend class System;  // moves bytes when a transfer lands, and keeps in_flight_
  void count(UnitCounters& u) const override;
  // Throws UninitializedReadError if a byte of [addr, addr + len) was never written (when checking).
  void check_written(std::uint64_t addr, std::uint64_t len) const;
  Server& flow_server() override { return stripe_; }  // a flow spreads over every channel
  sim::Simulator* sim_;
  HazardTracker* hazards_;
  MemoryKind kind_;
  bool functional_;
  bool check_uninitialized_;
  std::uint64_t capacity_;
  // What every transfer from or to it reads, next to the fields above (two cache lines, not four):
  // Transfers reading from / writing to this memory right now (for the hazard checker).
  InFlightSet in_flight_;
  // The System's path from path_src_ to this memory, the last one asked for (System::path).
  const Memory* path_src_ = nullptr;
  Path* path_ = nullptr;
  sim::Bandwidth bandwidth_;
  sim::Duration latency_;
  std::uint64_t interleave_;
  bool hashed_ = false;
  std::vector<std::uint64_t> per_channel_;  // scratch of serve() on a hashed memory
  std::vector<std::uint32_t> touched_;      // scratch: the channels a short access touched
  std::vector<Server> channels_;
  // While every channel's bookings are the same (all traffic so far striped evenly over them), one
  // server stands for all of them: a chunk costs one booking instead of one per channel.
  Server stripe_;
  bool uniform_ = true;
  // serve_chunk()'s test for an even chunk with power-of-two interleave and stripe: (addr &
  // addr_mask_) | (bytes & bytes_mask_) == 0 (fast_masks_ false: other sizes take serve()); one
  // channel: every chunk is one booking (fast_single_). The last chunk size's booking time.
  bool fast_masks_ = false, fast_single_ = false;
  std::uint64_t addr_mask_ = 0, bytes_mask_ = 0;
  std::uint64_t fast_bytes_ = ~std::uint64_t{0};
  sim::Duration fast_duration_ = 0;
  SparseStore store_;
  Allocator allocator_;
};

}  // namespace cubesim::hw
