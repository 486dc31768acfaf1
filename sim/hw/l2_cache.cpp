#include "sim/hw/l2_cache.h"

#include <algorithm>
#include <bit>
#include <limits>

#include <fmt/format.h>

namespace cubesim::hw {

namespace {

// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

std::uint32_t log2_of(std::uint64_t pow2) { return static_cast<std::uint32_t>(std::countr_zero(pow2)); }

}  // namespace

L2Cache::L2Cache(int cube, const L2Spec& spec, Memory& hbm)
    : PathUnit(UnitKind::l2, UnitPlace{.cube = cube}, Order::local),
      spec_(spec),
      hbm_(&hbm),
      sets_(spec.capacity_bytes / (std::uint64_t{spec.line_bytes} * spec.ways)),
      sectors_(spec.line_bytes / spec.sector_bytes),
      line_shift_(log2_of(spec.line_bytes)),
      sector_shift_(log2_of(spec.sector_bytes)) {
  server_.bandwidth = spec.bandwidth;
}

std::uint64_t L2Cache::set_of_line(std::uint64_t line) const {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(mix(line)) * sets_) >> 64);
}

bool L2Cache::holds(std::uint64_t addr, std::uint64_t len) const {
  if (len == 0) return true;
  if (lines_.empty()) return false;
  const std::uint64_t end = addr + len;
  for (std::uint64_t line = addr >> line_shift_; (line << line_shift_) < end; ++line) {
    const std::uint64_t base = line << line_shift_;
    const std::uint64_t lo = std::max(addr, base) - base, hi = std::min(end, base + spec_.line_bytes) - base;
    const std::uint32_t s0 = static_cast<std::uint32_t>(lo >> sector_shift_);
    const std::uint32_t s1 = static_cast<std::uint32_t>((hi - 1) >> sector_shift_);
    const std::uint32_t mask = ((2u << s1) - 1) & ~((1u << s0) - 1);
    const Line* set = &lines_[set_of_line(line) * spec_.ways];
    bool found = false;
    for (std::uint32_t w = 0; w < spec_.ways; ++w) {
      if (set[w].tag == line + 1) {
        found = (set[w].valid & mask) == mask;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

void L2Cache::add_run(std::vector<Run>& runs, std::uint64_t addr, std::uint64_t len) {
  if (!runs.empty() && runs.back().addr + runs.back().len == addr) {
    runs.back().len += len;
  } else {
    runs.push_back({addr, len});
  }
}

void L2Cache::add_sectors(std::vector<Run>& runs, std::uint64_t line, std::uint32_t mask) {
  const std::uint64_t base = line << line_shift_;
  while (mask) {
    const std::uint32_t s = static_cast<std::uint32_t>(std::countr_zero(mask));
    // The run of set bits from s.
    const std::uint32_t n = static_cast<std::uint32_t>(std::countr_one(mask >> s));
    add_run(runs, base + (std::uint64_t{s} << sector_shift_), std::uint64_t{n} << sector_shift_);
    mask &= ~(((n >= 32 ? 0u : (1u << n)) - 1u) << s);
  }
}

void L2Cache::lookup(const Probe& p, bool write) {
  ++line_lookups_;
  Line* set = &lines_[p.set * spec_.ways];
  std::uint32_t& clock = clock_[p.set];
  if (clock == std::numeric_limits<std::uint32_t>::max()) {
    // The set's stamps would wrap: renumber them 1..ways in LRU order (empty ways stay 0).
    std::vector<std::pair<std::uint32_t, std::uint32_t>> order;
    for (std::uint32_t w = 0; w < spec_.ways; ++w) {
      if (set[w].tag != 0) order.emplace_back(set[w].stamp, w);
    }
    std::sort(order.begin(), order.end());
    for (std::uint32_t i = 0; i < order.size(); ++i) set[order[i].second].stamp = i + 1;
    clock = static_cast<std::uint32_t>(order.size());
  }
  const std::uint32_t stamp = ++clock;
  const std::uint64_t tag = p.line + 1;
  const std::uint32_t mask = p.mask;
  std::uint32_t victim = 0;
  for (std::uint32_t w = 0; w < spec_.ways; ++w) {
    Line& l = set[w];
    if (l.tag == tag) {
      l.stamp = stamp;
      if (write) {
        l.valid = static_cast<std::uint16_t>(l.valid | mask);
        l.dirty = static_cast<std::uint16_t>(l.dirty | mask);
        return;
      }
      const std::uint32_t missed = mask & ~std::uint32_t{l.valid};
      chunk_hits_ += static_cast<std::uint64_t>(std::popcount(mask & l.valid));
      if (missed) {
        chunk_misses_ += static_cast<std::uint64_t>(std::popcount(missed));
        add_sectors(misses_run_, p.line, missed);
        l.valid = static_cast<std::uint16_t>(l.valid | missed);
      }
      return;
    }
    // LRU victim: an empty way first, else the oldest stamp.
    if (set[victim].tag != 0 && (l.tag == 0 || l.stamp < set[victim].stamp)) victim = w;
  }
  Line& l = set[victim];
  if (l.tag != 0 && l.dirty) add_sectors(writeback_run_, l.tag - 1, l.dirty);
  l.tag = tag;
  l.stamp = stamp;
  l.valid = static_cast<std::uint16_t>(mask);
  l.dirty = static_cast<std::uint16_t>(write ? mask : 0);
  if (!write) {
    chunk_misses_ += static_cast<std::uint64_t>(std::popcount(mask));
    add_sectors(misses_run_, p.line, mask);
  }
}

void L2Cache::probe(std::uint64_t addr, std::uint64_t len) {
  const std::uint64_t end = addr + len;
  const std::uint64_t line_bytes = spec_.line_bytes;
  const std::uint32_t full = (1u << sectors_) - 1u;
  std::uint64_t line = addr >> line_shift_;
  std::uint64_t base = line << line_shift_;
  for (; base < end; ++line, base += line_bytes) {
    std::uint32_t mask = full;
    if (addr > base || end < base + line_bytes) {
      const std::uint64_t lo = std::max(addr, base) - base, hi = std::min(end, base + line_bytes) - base;
      const std::uint32_t s0 = static_cast<std::uint32_t>(lo >> sector_shift_);
      const std::uint32_t s1 = static_cast<std::uint32_t>((hi - 1) >> sector_shift_);
      mask = ((2u << s1) - 1) & ~((1u << s0) - 1);
    }
    probes_.push_back(Probe{.line = line, .set = set_of_line(line), .mask = mask});
  }
}

void L2Cache::look_up_probes(bool write) {
  // Prefetches are written out in this loop, not in a helper: GCC deems a function that only
  // prefetches free of effects and deletes the call.
  constexpr std::size_t kAhead = 8;
  const std::size_t n = probes_.size();
  const std::size_t set_bytes = std::size_t{spec_.ways} * sizeof(Line);
  for (std::size_t i = 0; i < n + kAhead; ++i) {
    if (i < n) {
      const std::uint64_t s = probes_[i].set;
      const char* p = reinterpret_cast<const char*>(lines_.data() + s * spec_.ways);
      for (std::size_t off = 0; off < set_bytes; off += 64) __builtin_prefetch(p + off);
      __builtin_prefetch(clock_.data() + s);
    }
    if (i >= kAhead) lookup(probes_[i - kAhead], write);
  }
}

Passage L2Cache::serve(const ChunkVisit& v) {
  if (lines_.empty()) {
    lines_.resize(sets_ * spec_.ways);
    clock_.resize(sets_);
  }
  misses_run_.clear();
  writeback_run_.clear();
  chunk_hits_ = chunk_misses_ = 0;
  const bool write = !v.read;
  // Look up every sector the chunk's bytes touch, row segment by row segment.
  probes_.clear();
  const Region& r = *v.region;
  if (r.rows == 1 || r.pitch == r.row_bytes) {
    probe(r.addr + v.offset, v.bytes);
  } else {
    std::uint64_t row = v.offset / r.row_bytes, in = v.offset % r.row_bytes, left = v.bytes;
    while (left > 0) {
      const std::uint64_t n = std::min(r.row_bytes - in, left);
      probe(r.row_addr(row) + in, n);
      left -= n;
      in = 0;
      ++row;
    }
  }
  look_up_probes(write);
  hits_ += chunk_hits_;
  misses_ += chunk_misses_;

  const sim::Time ready = v.head + v.pre;
  ChunkVisit below = v;
  Region run_region;
  below.region = &run_region;
  below.offset = 0;
  below.post = 0;
  // Missed sectors come from the HBM, asked for once the tags have been looked up.
  sim::Time miss_head = sim::kTimeMax, miss_tail = 0;
  if (!misses_run_.empty()) {
    below.head = below.tail = ready;
    below.pre = hbm_->latency();
    below.read = true;
    for (const Run& run : misses_run_) {
      run_region = Region::contiguous(run.addr, run.len);
      below.bytes = run.len;
      const Passage p = hbm_->serve(below);
      miss_head = std::min(miss_head, p.head);
      miss_tail = std::max(miss_tail, p.tail);
      fill_bytes_ += run.len;
    }
  }
  // Evicted dirty sectors are written back from the chunk's head on; nothing waits for them.
  if (!writeback_run_.empty()) {
    below.head = below.tail = v.head;
    below.pre = 0;
    below.read = false;
    for (const Run& run : writeback_run_) {
      run_region = Region::contiguous(run.addr, run.len);
      below.bytes = run.len;
      hbm_->serve(below);
      writeback_bytes_ += run.len;
    }
  }
  // The chunk passes the L2: hits from `ready`, a chunk that hit nothing once its first bytes
  // arrive from the HBM.
  const sim::Time from = (write || chunk_hits_ > 0 || misses_run_.empty()) ? ready : std::max(ready, miss_head);
  const sim::Duration d = server_.duration(v.bytes);
  const auto [start, end] = server_.book(v.forget_before, from, d);
  server_.account(v.bytes, d);
  if (v.trace) {
    sim::Trace& tr = *v.trace;
    if (server_.track == Server::kNoTrack) server_.track = tr.track(track_name(), track_group());
    const sim::Time s = std::max(start, server_.traced_until);
    if (end > s) {
      server_.traced_until = end;
      tr.span(server_.track, fmt::format("t{}", v.transfer), s, end,
              {{"bytes", v.bytes},
               {"chunk", v.chunk},
               {"from", *v.from},
               {"to", *v.to},
               {"access", write ? "write" : "read"},
               {"hit_sectors", chunk_hits_},
               {"miss_sectors", chunk_misses_}});
    }
  }
  const sim::Time tail = std::max({end, v.tail + v.pre, miss_tail});
  return {start + v.post, tail + v.post};
}

std::string L2Cache::track_group() const { return cube_name(cube()); }
std::string L2Cache::track_name() const { return "l2"; }
void L2Cache::declare_tracks(sim::Trace& trace) { trace.track(track_name(), track_group()); }

void L2Cache::count(UnitCounters& u) const {
  count_server(server_, u);
  u.hits += hits_;
  u.misses += misses_;
  u.fill_bytes += fill_bytes_;
  u.writeback_bytes += writeback_bytes_;
}

}  // namespace cubesim::hw
