#include "sim/hw/l2_cache.h"

#include "sim/hw/address_hash.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include <fmt/format.h>

#ifdef __linux__
#include <sys/mman.h>
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace cubesim::hw {

namespace {

std::uint32_t log2_of(std::uint64_t pow2) { return static_cast<std::uint32_t>(std::countr_zero(pow2)); }

}  // namespace

L2Cache::L2Cache(int cube, const L2Spec& spec, Memory& hbm)
    : PathUnit(UnitKind::l2, UnitPlace{.cube = cube}, Order::local),
      spec_(spec),
      hbm_(&hbm),
      sets_(spec.capacity_bytes / (std::uint64_t{spec.line_bytes} * spec.ways)),
      sectors_(spec.line_bytes / spec.sector_bytes),
      line_shift_(log2_of(spec.line_bytes)),
      sector_shift_(log2_of(spec.sector_bytes)),
      // The largest tag is (HBM lines - 1) / sets + 1.
      narrow_((hbm.capacity() >> line_shift_) / sets_ < 0xffffu),
      // `ways` entries, rounded up to whole 64-byte host cache lines.
      block_words_((std::uint64_t{spec.ways} * (narrow_ ? 4 : 8) + 63) / 64 * 8) {
  server_.bandwidth = spec.bandwidth;
  // floor(2^64 / sets) (one set: locate() needs none).
  sets_inverse_ = sets_ == 1 ? 0 : static_cast<std::uint64_t>((static_cast<unsigned __int128>(1) << 64) / sets_);
  last_hash_ = hash_of_quotient(last_q_);
}

void L2Cache::Free::operator()(std::uint64_t* p) const { std::free(p); }

void L2Cache::allocate_sets() {
  // Huge pages where the kernel offers them: lookups land on random sets of a table of megabytes,
  // and with 4 KiB pages nearly every one would miss the TLB.
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t bytes = (sets_ * block_words_ * 8 + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes);
  if (!p) throw std::bad_alloc();
#ifdef __linux__
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without it the table works the same, slower
#endif
  std::memset(p, 0, bytes);
  sets_storage_.reset(static_cast<std::uint64_t*>(p));
  sets_mem_ = sets_storage_.get();
}

std::uint64_t L2Cache::hash_of_quotient(std::uint64_t q) const {
  return spread(q, sets_);
}

void L2Cache::split(std::uint64_t line, std::uint64_t& q, std::uint64_t& r) const {
  // line / sets by a multiplication (a division costs tens of cycles, once per row of a tile):
  // floor(line * floor(2^64 / sets) / 2^64) is the quotient or one less.
  q = line;
  r = 0;
  if (sets_ > 1) {
    q = static_cast<std::uint64_t>((static_cast<unsigned __int128>(line) * sets_inverse_) >> 64);
    r = line - q * sets_;
    if (r >= sets_) {
      r -= sets_;
      ++q;
    }
  }
}

L2Cache::Probe L2Cache::at(std::uint64_t line, std::uint64_t q, std::uint64_t r) const {
  if (q != last_q_) {
    last_q_ = q;
    last_hash_ = hash_of_quotient(q);
  }
  std::uint64_t set = r + last_hash_;
  if (set >= sets_) set -= sets_;
  return Probe{.line = line, .set = set, .tag = static_cast<std::uint32_t>(q + 1), .mask = 0};
}

L2Cache::Probe L2Cache::locate(std::uint64_t line) const {
  std::uint64_t q, r;
  split(line, q, r);
  return at(line, q, r);
}

std::uint64_t L2Cache::line_of(std::uint64_t set, std::uint32_t tag) const {
  const std::uint64_t q = tag - 1, h = hash_of_quotient(q);
  return q * sets_ + (set >= h ? set - h : set + sets_ - h);
}

bool L2Cache::holds(std::uint64_t addr, std::uint64_t len) const {
  if (len == 0) return true;
  if (!sets_mem_) return false;
  const std::uint64_t end = addr + len;
  for (std::uint64_t line = addr >> line_shift_; (line << line_shift_) < end; ++line) {
    const std::uint64_t base = line << line_shift_;
    const std::uint64_t lo = std::max(addr, base) - base, hi = std::min(end, base + spec_.line_bytes) - base;
    const std::uint32_t s0 = static_cast<std::uint32_t>(lo >> sector_shift_);
    const std::uint32_t s1 = static_cast<std::uint32_t>((hi - 1) >> sector_shift_);
    Probe where = locate(line);
    where.mask = ((2u << s1) - 1) & ~((1u << s0) - 1);
    if (!(narrow_ ? holds_line<std::uint32_t>(where) : holds_line<std::uint64_t>(where))) return false;
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
  if (mask == (1u << sectors_) - 1u) {  // the whole line
    add_run(runs, base, spec_.line_bytes);
    return;
  }
  while (mask) {
    const std::uint32_t s = static_cast<std::uint32_t>(std::countr_zero(mask));
    // The run of set bits from s.
    const std::uint32_t n = static_cast<std::uint32_t>(std::countr_one(mask >> s));
    add_run(runs, base + (std::uint64_t{s} << sector_shift_), std::uint64_t{n} << sector_shift_);
    mask &= ~(((1u << n) - 1u) << s);
  }
}

namespace {

// Bits set in a byte (sector masks have at most 8 bits; the baseline x86-64 has no popcount).
constexpr std::array<std::uint8_t, 256> kBits = [] {
  std::array<std::uint8_t, 256> t{};
  for (int i = 1; i < 256; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>((i & 1) + t[static_cast<std::size_t>(i / 2)]);
  return t;
}();
std::uint64_t bits(std::uint32_t mask) { return kBits[mask & 0xffu]; }

// A set entry of type E: the tag in the low T bits, the valid sectors in the next 8, the dirty ones in
// the 8 above.
template <class E>
struct EntryBits {
  static constexpr std::uint32_t kTag = sizeof(E) == 4 ? 16 : 32;
  static constexpr E kTagMask = (E{1} << kTag) - 1;
  static std::uint32_t tag(E e) { return static_cast<std::uint32_t>(e & kTagMask); }
  static std::uint32_t valid(E e) { return static_cast<std::uint32_t>(e >> kTag) & 0xffu; }
  static std::uint32_t dirty(E e) { return static_cast<std::uint32_t>(e >> (kTag + 8)) & 0xffu; }
  static E make(std::uint32_t tag, std::uint32_t valid, std::uint32_t dirty) {
    return static_cast<E>(E{tag} | (E{valid} << kTag) | (E{dirty} << (kTag + 8)));
  }
};

// The first entry of e[0, ways) whose tag is `tag` (tags are never 0) and the first empty one (0),
// each `ways` when there is none.
template <class E>
std::pair<std::uint32_t, std::uint32_t> find_way(const E* e, std::uint32_t ways, std::uint32_t tag) {
  using B = EntryBits<E>;
  std::uint32_t w = 0;
#ifdef __SSE2__
  // 16 bytes at a time: a bit per entry where the tag matches, and where the entry is empty.
  constexpr std::uint32_t kPer = 16 / sizeof(E);
  const __m128i zero = _mm_setzero_si128();
  if constexpr (sizeof(E) == 4) {
    const __m128i want = _mm_set1_epi32(static_cast<int>(tag));
    const __m128i tag_mask = _mm_set1_epi32(static_cast<int>(B::kTagMask));
    for (; w + kPer <= ways; w += kPer) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e + w));
      const int hit = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(x, tag_mask), want)));
      const int empty = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(x, zero)));
      if (hit) return {w + static_cast<std::uint32_t>(std::countr_zero(static_cast<unsigned>(hit))), ways};
      // Empty entries come last: past the first one no tag can match.
      if (empty) return {ways, w + static_cast<std::uint32_t>(std::countr_zero(static_cast<unsigned>(empty)))};
    }
  } else {
    // The tag is the low 32 bits of each 8-byte entry: compare 32-bit lanes, keep the even ones.
    const __m128i want = _mm_set_epi32(0, static_cast<int>(tag), 0, static_cast<int>(tag));
    const __m128i tag_mask = _mm_set_epi32(0, -1, 0, -1);
    for (; w + kPer <= ways; w += kPer) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e + w));
      const int hit = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(x, tag_mask), want))) & 0x5;
      const int empty = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(x, zero)));
      if (hit) return {w + static_cast<std::uint32_t>(std::countr_zero(static_cast<unsigned>(hit))) / 2, ways};
      // An entry is empty when both of its halves are zero.
      const int both = empty & (empty >> 1) & 0x5;
      if (both) return {ways, w + static_cast<std::uint32_t>(std::countr_zero(static_cast<unsigned>(both))) / 2};
    }
  }
#endif
  for (; w < ways; ++w) {
    if (B::tag(e[w]) == tag) return {w, ways};
    if (e[w] == 0) return {ways, w};
  }
  return {ways, ways};
}

}  // namespace

template <class E>
bool L2Cache::holds_line(const Probe& p) const {
  const E* e = entries_of<E>(p.set);
  const std::uint32_t w = find_way(e, spec_.ways, p.tag).first;
  return w < spec_.ways && (EntryBits<E>::valid(e[w]) & p.mask) == p.mask;
}

template <class E>
void L2Cache::lookup(const Probe& p, bool write) {
  using B = EntryBits<E>;
  ++line_lookups_;
  const std::uint32_t ways = spec_.ways;
  E* e = entries_of<E>(p.set);
  const std::uint32_t mask = p.mask;
  const auto [hit, empty] = find_way(e, ways, p.tag);
  E now;
  std::uint32_t moved;  // the entries before the line's, which age by one (move back one place)
  if (hit < ways) {
    const E x = e[hit];
    const std::uint32_t valid = B::valid(x), dirty = B::dirty(x);
    if (write) {
      now = B::make(p.tag, valid | mask, dirty | mask);
    } else {
      const std::uint32_t missed = mask & ~valid;
      chunk_hits_ += bits(mask & valid);
      if (missed) {
        chunk_misses_ += bits(missed);
        add_sectors(misses_run_, p.line, missed);
      }
      now = B::make(p.tag, valid | missed, dirty);
    }
    moved = hit;
  } else {
    // A miss: the first empty way (every line ages), else the oldest line (the last), written back
    // if dirty.
    if (empty == ways) {
      const E victim = e[ways - 1];
      if (const std::uint32_t dirty = B::dirty(victim)) add_sectors(writeback_run_, line_of(p.set, B::tag(victim)), dirty);
      moved = ways - 1;
    } else {
      moved = empty;
    }
    now = write ? B::make(p.tag, mask, mask) : B::make(p.tag, mask, 0);
    if (!write) {
      chunk_misses_ += bits(mask);
      add_sectors(misses_run_, p.line, mask);
    }
  }
  // The line becomes the most recent: the ones before it move back a place.
  std::memmove(e + 1, e, std::size_t{moved} * sizeof(E));
  e[0] = now;
}

void L2Cache::probe(std::uint64_t addr, std::uint64_t len) {
  std::uint64_t q, r;
  split(addr >> line_shift_, q, r);
  probe(addr, len, q, r);
}

void L2Cache::probe(std::uint64_t addr, std::uint64_t len, std::uint64_t q0, std::uint64_t r0) {
  const std::uint64_t end = addr + len;
  const std::uint64_t line_bytes = spec_.line_bytes;
  const std::uint32_t full = (1u << sectors_) - 1u;  // at most 8 sectors
  std::uint64_t line = addr >> line_shift_;
  std::uint64_t base = line << line_shift_;
  // Scalars, not a Probe updated field by field: the compiler would assemble it on the stack and
  // stall reloading it whole.
  const Probe first = at(line, q0, r0);
  std::uint64_t set = first.set;
  std::uint32_t tag = first.tag;
  std::uint64_t r = r0;  // line % sets
  for (; base < end; ++line, base += line_bytes) {
    std::uint32_t mask = full;
    if (addr > base || end < base + line_bytes) {
      const std::uint64_t lo = std::max(addr, base) - base, hi = std::min(end, base + line_bytes) - base;
      const std::uint32_t s0 = static_cast<std::uint32_t>(lo >> sector_shift_);
      const std::uint32_t s1 = static_cast<std::uint32_t>((hi - 1) >> sector_shift_);
      mask = ((2u << s1) - 1) & ~((1u << s0) - 1);
    }
    probes_.push_back(Probe{.line = line, .set = set, .tag = tag, .mask = mask});
    // The next line: the next set, until line % sets wraps and the quotient (and its hash) moves on.
    if (++r == sets_) {
      const Probe next = locate(line + 1);
      set = next.set;
      tag = next.tag;
      r = 0;
    } else if (++set == sets_) {
      set = 0;
    }
  }
}

template <class E>
void L2Cache::look_up_probes(bool write) {
  // Prefetches are written out in this loop, not in a helper: GCC deems a function that only
  // prefetches free of effects and deletes the call.
  constexpr std::size_t kAhead = 8;
  const std::size_t n = probes_.size();
  const std::uint64_t block_bytes = block_words_ * 8;
  for (std::size_t i = 0; i < n + kAhead; ++i) {
    if (i < n) {
      const char* b = reinterpret_cast<const char*>(entries_of<E>(probes_[i].set));
      for (std::uint64_t off = 0; off < block_bytes; off += 64) __builtin_prefetch(b + off);
    }
    if (i >= kAhead) lookup<E>(probes_[i - kAhead], write);
  }
}

Passage L2Cache::serve(const ChunkVisit& v) {
  if (!sets_mem_) allocate_sets();
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
    // Rows a whole number of lines apart: a row's first line is the previous row's plus `lines`,
    // so its quotient and residue by sets step along instead of being divided out afresh.
    const bool stepping = (r.pitch & (spec_.line_bytes - 1)) == 0;
    const std::uint64_t lines = r.pitch >> line_shift_;
    const std::uint64_t step_q = stepping ? lines / sets_ : 0, step_r = stepping ? lines % sets_ : 0;
    bool known = false;
    std::uint64_t q = 0, rs = 0;  // of the next row's first line, once known
    while (left > 0) {
      const std::uint64_t n = std::min(r.row_bytes - in, left);
      const std::uint64_t a = r.row_addr(row) + in;
      if (stepping && in == 0) {
        if (!known) split(a >> line_shift_, q, rs);
        known = true;
        probe(a, n, q, rs);
        q += step_q;
        rs += step_r;
        if (rs >= sets_) {
          rs -= sets_;
          ++q;
        }
      } else {
        probe(a, n);
      }
      left -= n;
      in = 0;
      ++row;
    }
  }
  if (narrow_) {
    look_up_probes<std::uint32_t>(write);
  } else {
    look_up_probes<std::uint64_t>(write);
  }
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
               {"from", v.from->name()},
               {"to", v.to->name()},
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
