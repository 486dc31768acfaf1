#include "sim/hw/memory.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "sim/hw/address_hash.h"
#include "sim/hw/errors.h"
#include "sim/hw/format.h"

namespace cubesim::hw {

Memory::Memory(sim::Simulator& sim, HazardTracker& hazards, MemorySetup setup)
    : PathUnit(UnitKind::memory, UnitPlace{.cube = setup.cube, .pe = setup.pe}, Order::local),
      sim_(&sim),
      hazards_(&hazards),
      kind_(setup.kind),
      functional_(setup.functional),
      check_uninitialized_(setup.check_uninitialized),
      capacity_(setup.capacity),
      bandwidth_(setup.bandwidth),
      latency_(setup.latency),
      interleave_(setup.interleave == 0 ? 1 : setup.interleave),
      hashed_(setup.hashed && setup.channels > 1),
      channels_(setup.channels == 0 ? 1 : setup.channels),
      allocator_(name(), setup.capacity) {
  const sim::Bandwidth bandwidth = setup.bandwidth;
  // Equal channels (the remainder of bytes_per_s / channels, under one byte per second per channel,
  // is dropped), so that evenly striped traffic books all channels alike.
  const std::uint64_t n = channels_.size();
  for (Server& c : channels_) c.bandwidth = sim::Bandwidth{bandwidth.bytes_per_s / n};
  stripe_.bandwidth = channels_[0].bandwidth;
  if (hashed_) per_channel_.assign(n, 0);
  // serve()'s test for an even chunk (multiple of the interleave at the address, of the stripe in
  // size, and of the stripe at the address when hashed) as two masks, when both sizes are powers of two.
  const std::uint64_t stripe = interleave_ * n;
  auto pow2 = [](std::uint64_t x) { return x != 0 && (x & (x - 1)) == 0; };
  fast_single_ = n == 1;
  fast_masks_ = n > 1 && pow2(interleave_) && pow2(stripe);
  if (fast_masks_) {
    addr_mask_ = (hashed_ ? stripe : interleave_) - 1;
    bytes_mask_ = stripe - 1;
  }
}

std::uint32_t Memory::channel_of(std::uint64_t addr) const {
  const std::uint64_t n = channels_.size(), b = addr / interleave_;
  if (!hashed_) return static_cast<std::uint32_t>(b % n);
  return static_cast<std::uint32_t>((b % n + spread(b / n, n)) % n);
}

void Memory::check_range(std::uint64_t addr, std::uint64_t len, std::string_view what) const {
  if (!contains(addr, len)) {
    throw MemoryError(fmt::format("{}: {} [{:#x}, {:#x}) ({} bytes) is outside the memory: capacity {} ({} bytes), "
                                  "valid addresses 0x0..{:#x}",
                                  name(), what, addr, addr + len, len, format_bytes(capacity_), capacity_,
                                  capacity_ - 1));
  }
}

void Memory::check_region(const Region& r, std::string_view what) const {
  if (r.empty()) return;
  if (r.rows > 1 && r.pitch < r.row_bytes) {
    throw MemoryError(fmt::format("{}: {} has pitch {} smaller than its rows ({} bytes); rows must not overlap", name(),
                                  what, r.pitch, r.row_bytes));
  }
  // rows * pitch must not wrap before the bounds check sees it.
  if (r.rows > 1 && r.pitch > (capacity_ / (r.rows - 1))) {
    throw MemoryError(fmt::format("{}: {} spans {} rows {} bytes apart, beyond the capacity {}", name(), what, r.rows,
                                  r.pitch, format_bytes(capacity_)));
  }
  check_range(r.addr, r.end() - r.addr, what);
}

void Memory::write(std::uint64_t addr, std::span<const std::byte> data) {
  check_range(addr, data.size(), "write");
  if (data.empty()) return;
  hazards_->check(*this, in_flight_, Region::contiguous(addr, data.size()), true, nullptr);
  if (functional_) store_.write(addr, data.data(), data.size());
}

void Memory::fill(std::uint64_t addr, std::uint64_t len, std::byte value) {
  check_range(addr, len, "fill");
  if (len == 0) return;
  hazards_->check(*this, in_flight_, Region::contiguous(addr, len), true, nullptr);
  if (functional_) store_.fill(addr, len, value);
}

void Memory::read(std::uint64_t addr, std::span<std::byte> out) {
  check_range(addr, out.size(), "read");
  if (out.empty()) return;
  hazards_->check(*this, in_flight_, Region::contiguous(addr, out.size()), false, nullptr);
  if (!functional_) {
    std::memset(out.data(), 0, out.size());
    return;
  }
  check_written(addr, out.size());
  store_.read(addr, out.data(), out.size());
}

void Memory::check_written(std::uint64_t addr, std::uint64_t len) const {
  if (!check_uninitialized_) return;
  if (auto u = store_.first_unwritten(addr, len)) {
    throw UninitializedReadError(
        fmt::format("{}: {} reads [{:#x}, {:#x}) at {} but byte {:#x} was never written; write it first, or set "
                    "check_uninitialized off to read zeros (Context(check_uninitialized=False) in Python)",
                    name(), hazards_->actor(), addr, addr + len, sim::format_time(sim_->now()), *u),
        *u);
  }
}

void Memory::combine(Memory& src, std::uint64_t src_addr, std::uint64_t dst_addr, std::uint64_t len,
                     SparseStore::Combine f, void* ctx) {
  check_range(dst_addr, len, "combine");
  src.check_range(src_addr, len, "combine source");
  if (len == 0) return;
  // As read(dst), read(src), write(dst) would check them, in that order.
  const Region d = Region::contiguous(dst_addr, len);
  hazards_->check(*this, in_flight_, d, false, nullptr);
  if (functional_) check_written(dst_addr, len);
  src.hazards_->check(src, src.in_flight_, Region::contiguous(src_addr, len), false, nullptr);
  if (src.functional_) src.check_written(src_addr, len);
  hazards_->check(*this, in_flight_, d, true, nullptr);
  if (functional_ && src.functional_) store_.combine_from(src.store_, src_addr, dst_addr, len, f, ctx);
}

std::optional<std::uint64_t> Memory::first_unwritten(std::uint64_t addr, std::uint64_t len) const {
  check_range(addr, len, "first_unwritten");
  if (!functional_) return std::nullopt;
  return store_.first_unwritten(addr, len);
}

}  // namespace cubesim::hw

// ---------------------------------------------------------------- as a unit on transfer paths

namespace cubesim::hw {

namespace {

std::uint64_t region_addr(const Region& r, std::uint64_t off) {
  if (r.rows == 1) return r.addr + off;
  return r.row_addr(off / r.row_bytes) + off % r.row_bytes;
}

// Calls f(channel, bytes) for each channel that [addr, addr + len) touches, with blocks of
// `interleave` bytes going to channels round robin.
template <class F>
void for_each_piece(std::uint64_t addr, std::uint64_t len, std::uint64_t interleave, std::uint32_t n, F&& f) {
  const std::uint64_t b0 = addr / interleave, b1 = (addr + len - 1) / interleave;
  if (b1 - b0 + 1 <= n) {  // each block on its own channel
    std::uint32_t ch = static_cast<std::uint32_t>(b0 % n);
    for (std::uint64_t b = b0; b <= b1; ++b) {
      const std::uint64_t lo = std::max(addr, b * interleave), hi = std::min(addr + len, (b + 1) * interleave);
      f(ch, hi - lo);
      if (++ch == n) ch = 0;
    }
    return;
  }
  // More blocks than channels: every channel gets q or q + 1 whole blocks (the q + 1 ones follow
  // the first block's channel round the ring), less the cut-off parts of the first and last block.
  const std::uint64_t nb = b1 - b0 + 1, q = nb / n, rem = nb % n;
  const std::uint32_t c0 = static_cast<std::uint32_t>(b0 % n), c1 = static_cast<std::uint32_t>(b1 % n);
  const std::uint64_t cut_front = addr - b0 * interleave, cut_back = (b1 + 1) * interleave - (addr + len);
  for (std::uint32_t ch = 0; ch < n; ++ch) {
    const std::uint32_t from_first = ch >= c0 ? ch - c0 : ch + n - c0;
    std::uint64_t bytes = (q + (from_first < rem ? 1 : 0)) * interleave;
    if (ch == c0) bytes -= cut_front;
    if (ch == c1) bytes -= cut_back;
    f(ch, bytes);
  }
}

// for_each_piece with hashed channels: block b = q * n + r goes to channel (r + spread(q, n)) % n,
// so each whole stripe of n blocks gives every channel one block. Adds each channel's bytes of
// [addr, addr + len) to per[] (n entries, zero on entry). Returns false when the range covers whole
// stripes (every channel has bytes); else true, with the channels it gave bytes appended to
// `touched` once each, in ascending order (a short access: a few of the n channels).
bool add_hashed_pieces(std::uint64_t addr, std::uint64_t len, std::uint64_t interleave, std::uint64_t n,
                       std::uint64_t* per, std::vector<std::uint32_t>& touched) {
  const std::uint64_t b0 = addr / interleave, b1 = (addr + len - 1) / interleave;
  auto block = [&](std::uint64_t b) {
    const std::uint64_t lo = std::max(addr, b * interleave), hi = std::min(addr + len, (b + 1) * interleave);
    const std::uint64_t ch = (b % n + spread(b / n, n)) % n;
    if (per[ch] == 0) touched.push_back(static_cast<std::uint32_t>(ch));
    per[ch] += hi - lo;
  };
  const std::uint64_t q0 = b0 / n, q1 = b1 / n;
  if (q1 - q0 < 2) {  // at most two stripes: block by block
    for (std::uint64_t b = b0; b <= b1; ++b) block(b);
    std::sort(touched.begin(), touched.end());
    return true;
  }
  for (std::uint64_t b = b0; b < (q0 + 1) * n; ++b) block(b);  // the first stripe's tail
  const std::uint64_t whole = (q1 - q0 - 1) * interleave;     // the stripes between: one block each
  for (std::uint64_t ch = 0; ch < n; ++ch) per[ch] += whole;
  for (std::uint64_t b = q1 * n; b <= b1; ++b) block(b);      // the last stripe's head
  return false;
}

}  // namespace

Passage Memory::serve(const ChunkVisit& v) {
  // Each channel does its piece's work in the gaps from the head's arrival on; the chunk leaves
  // once the work is done and its tail has arrived.
  const std::uint32_t n = channels();
  sim::Time first = sim::kTimeMax, last = 0;
  // Books `per` bytes of work on s (each of the channels it stands for doing `per`; `total` in all).
  auto piece_on = [&](Server& s, std::uint64_t ch, std::uint64_t per, std::uint64_t total) {
    const sim::Duration d = s.duration(per);
    const auto [start, end] = s.book(v.forget_before, v.head + v.pre, d);
    s.account(total, d);
    first = std::min(first, start);
    last = std::max(last, end);
    // Evenly striped chunks go on the memory's own track, others on their channel's.
    if (v.trace) trace_chunk(v, s, n > 1 && ch != sim::kTimeMax ? ch : kNoChannel, start, end, total);
  };
  auto piece = [&](std::uint32_t ch, std::uint64_t bytes) { piece_on(channels_[ch], ch, bytes, bytes); };
  if (n == 1) {
    piece(0, v.bytes);
  } else {
    const std::uint64_t addr = region_addr(*v.region, v.offset);
    const std::uint64_t stripe = interleave_ * n;
    // Hashed: a chunk is even only when it covers whole stripes from a stripe's start. (Sizes are
    // mostly powers of two: a mask, not a 64-bit division, three of which per chunk and stage
    // showed in the chunk level's profile.)
    auto multiple = [](std::uint64_t x, std::uint64_t m) { return (m & (m - 1)) == 0 ? (x & (m - 1)) == 0 : x % m == 0; };
    const bool even = multiple(addr, interleave_) && multiple(v.bytes, stripe) && (!hashed_ || multiple(addr, stripe));
    if (even && !uniform_) {
      // The channels may have drifted back into step: all idle again.
      bool idle = true;
      for (Server& c : channels_) {
        c.forget(v.forget_before);
        idle = idle && c.bookings() == 0;
      }
      if (idle) {
        stripe_.forget(sim::kTimeMax);
        uniform_ = true;
      }
    }
    if (even && uniform_) {
      piece_on(stripe_, sim::kTimeMax, v.bytes / n, v.bytes);
    } else {
      if (uniform_) {
        stripe_.forget(v.forget_before);
        for (Server& c : channels_) c.copy_bookings(stripe_);
        uniform_ = false;
      }
      if (hashed_) {
        touched_.clear();
        if (add_hashed_pieces(addr, v.bytes, interleave_, n, per_channel_.data(), touched_)) {
          for (std::uint32_t ch : touched_) {  // a short access: only the channels it touched
            piece(ch, per_channel_[ch]);
            per_channel_[ch] = 0;
          }
        } else {
          for (std::uint32_t ch = 0; ch < n; ++ch) {
            if (per_channel_[ch] == 0) continue;
            piece(ch, per_channel_[ch]);
            per_channel_[ch] = 0;
          }
        }
      } else {
        for_each_piece(addr, v.bytes, interleave_, n, piece);
      }
    }
  }
  return {first + v.post, std::max(last, v.tail + v.pre) + v.post};
}

StageFigures Memory::figures() const {
  return StageFigures::of(bandwidth_, channels(), interleave_);
}

std::string Memory::track_group() const { return kind_ == MemoryKind::kHost ? std::string("host") : cube_name(cube()); }

std::string Memory::track_name() const {
  switch (kind_) {
    case MemoryKind::kHbm: return "hbm";
    case MemoryKind::kTcm: return pe_name(pe()) + ".tcm";
    case MemoryKind::kHost: return "memory";
  }
  return "memory";
}

std::string Memory::track_name_of(std::uint64_t channel) const {
  return channel == kNoChannel ? track_name() : track_name() + ".ch" + std::to_string(channel);
}

void Memory::declare_tracks(sim::Trace& trace) {
  if (channels_.size() == 1) {
    trace.track(track_name(), track_group());
    return;
  }
  for (std::size_t ch = 0; ch < channels_.size(); ++ch) trace.track(track_name_of(ch), track_group());
}

void Memory::count(UnitCounters& u) const {
  // Striped work occupied every channel alike: it counts on each.
  u.bytes += stripe_.bytes;
  u.pieces += stripe_.chunks;
  for (const Server& c : channels_) {
    u.bytes += c.bytes;
    u.pieces += c.chunks;
  }
  if (channels_.size() == 1) {
    u.busy += stripe_.busy + channels_[0].busy;
    return;
  }
  sim::Duration busiest = 0;
  u.channel_busy.reserve(channels_.size());
  for (const Server& c : channels_) {
    u.channel_busy.push_back(stripe_.busy + c.busy);
    busiest = std::max(busiest, u.channel_busy.back());
  }
  u.busy += busiest;
}

}  // namespace cubesim::hw
