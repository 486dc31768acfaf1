#include "sim/core/event_queue.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::sim {

namespace {
constexpr std::uint64_t kSeqBits = 48;
constexpr std::uint64_t kSeqMask = (std::uint64_t{1} << kSeqBits) - 1;
constexpr std::size_t kLine = 64;

}  // namespace

void EventQueue::FreeAligned::operator()(Key* p) const { ::operator delete[](p, std::align_val_t{kLine}); }

EventQueue::EventQueue()
    : lane_(std::make_unique<Entry[]>(1024)), lane_cap_(1024), run_(std::make_unique<Entry[]>(1024)), run_cap_(1024) {
  grow_heap();
}

EventQueue::~EventQueue() { clear(); }

void EventQueue::grow_heap() {
  const std::size_t cap = heap_cap_ ? 2 * heap_cap_ : 1024;
  std::unique_ptr<Key[], FreeAligned> keys(static_cast<Key*>(::operator new[](cap * sizeof(Key), std::align_val_t{kLine})));
  auto items = std::make_unique<std::uintptr_t[]>(cap);
  if (heap_cap_) {
    std::copy(keys_.get(), keys_.get() + heap_end_, keys.get());
    std::copy(items_.get(), items_.get() + heap_end_, items.get());
  }
  keys_ = std::move(keys);
  items_ = std::move(items);
  heap_cap_ = cap;
}

void EventQueue::grow_run() {
  // Full: the ring wraps exactly, so its entries in order are [head, cap) then [0, head).
  auto bigger = std::make_unique<Entry[]>(2 * run_cap_);
  std::copy(run_.get() + run_head_, run_.get() + run_cap_, bigger.get());
  std::copy(run_.get(), run_.get() + run_head_, bigger.get() + (run_cap_ - run_head_));
  run_ = std::move(bigger);
  run_head_ = 0;
  run_cap_ *= 2;
}

void EventQueue::grow_pool() {
  auto chunk = std::make_unique<Node[]>(chunk_size_);
  for (std::size_t i = 0; i < chunk_size_; ++i) {
    chunk[i].next_free = free_;
    free_ = &chunk[i];
  }
  chunks_.push_back(std::move(chunk));
  if (chunk_size_ < 65536) chunk_size_ *= 2;
}

std::uint64_t EventQueue::insert_slow(Time t, int priority, std::uintptr_t item) {
  if (t < now_ || priority < -32768 || priority > 32767) {
    drop(item);
    if (t < now_) {
      throw std::logic_error(fmt::format("cubesim: event scheduled in the past (at {} ps, now {} ps)", t, now_));
    }
    throw std::invalid_argument(fmt::format("cubesim: event priority {} outside [-32768, 32767]", priority));
  }
  const std::uint64_t seq = seq_++;
  assert(seq <= kSeqMask);
  if (!(t == now_ && priority == kDefaultPriority) && t < horizon_) horizon_ = t;  // into the heap
  const std::uint64_t key = (static_cast<std::uint64_t>(priority + 32768) << kSeqBits) | (seq & kSeqMask);
  if (t == now_ && priority == kDefaultPriority) {
    // The lane's tail reached its end. Its head advances too (the lane only resets when it
    // drains, which a steady stream of wake-ups may never let it do): slide the live entries to
    // the front, and grow only if they fill more than half of it.
    const std::size_t live = lane_tail_ - lane_head_;
    if (live * 2 > lane_cap_) {
      const std::size_t cap = 2 * lane_cap_;
      auto bigger = std::make_unique<Entry[]>(cap);
      std::copy(lane_.get() + lane_head_, lane_.get() + lane_tail_, bigger.get());
      lane_ = std::move(bigger);
      lane_cap_ = cap;
    } else {
      std::copy(lane_.get() + lane_head_, lane_.get() + lane_tail_, lane_.get());
    }
    lane_head_ = 0;
    lane_tail_ = live;
    lane_[lane_tail_++] = Entry{t, key, item};
  } else if (hole_) {
    // The popped root's slot is free: the new entry goes there and sifts down.
    hole_ = false;
    sift_down(Key{t, key}, item);
  } else {
    if (heap_end_ == heap_cap_) [[unlikely]] grow_heap();
    sift_up(heap_end_++, Key{t, key}, item);
  }
  return seq;
}

void EventQueue::settle_slow() const {
  hole_ = false;
  const std::size_t last = --heap_end_;
  if (last != kRoot) const_cast<EventQueue*>(this)->sift_down(keys_[last], items_[last]);
}

void EventQueue::run_node(Node* n) {
  // The node stays out of the free list while its callback runs (the callback may push events).
  struct Release {
    EventQueue* q;
    Node* n;
    ~Release() { q->free_node(n); }
  } release{this, n};
  n->cb();
}

void EventQueue::throw_resume_without_handler() {
  throw std::logic_error("cubesim: EventQueue::pop_and_run() met a push_resume event but was given no resume handler");
}

void EventQueue::clear() {
  for (std::size_t i = hole_ ? kRoot + 1 : kRoot; i < heap_end_; ++i) drop(items_[i]);  // a hole is not pending
  heap_end_ = kRoot;
  hole_ = false;
  for (std::size_t i = lane_head_; i < lane_tail_; ++i) drop(lane_[i].item);
  lane_head_ = lane_tail_ = 0;
  for (std::size_t i = 0; i < run_size_; ++i) drop(run_[(run_head_ + i) & (run_cap_ - 1)].item);
  run_head_ = run_size_ = 0;
  horizon_ = sim::kTimeMax;
}

namespace {
using u128 = unsigned __int128;
inline u128 wide(Time t, std::uint64_t key) { return (u128{t} << 64) | key; }

// If (bt, bk) < (at, ak), take b's key and index. Written as cmp/sbb/cmov: compilers turn the
// plain `?:` into jumps, which mispredict half the time here (the four-way minimum is the hot spot).
__attribute__((always_inline)) inline void take_smaller(std::uint64_t& at, std::uint64_t& ak, std::size_t& ai,
                                                        std::uint64_t bt, std::uint64_t bk, std::size_t bi) {
#if defined(__x86_64__)
  std::uint64_t scratch;
  asm("cmp %[ak], %[bk]\n\t"
      "mov %[bt], %[s]\n\t"
      "sbb %[at], %[s]\n\t"
      "cmovb %[bt], %[at]\n\t"
      "cmovb %[bk], %[ak]\n\t"
      "cmovb %[bi], %[ai]"
      : [at] "+&r"(at), [ak] "+&r"(ak), [ai] "+&r"(ai), [s] "=&r"(scratch)
      : [bt] "r"(bt), [bk] "r"(bk), [bi] "r"(bi)
      : "cc");
#else
  if (wide(bt, bk) < wide(at, ak)) {
    at = bt;
    ak = bk;
    ai = bi;
  }
#endif
}
}  // namespace

void EventQueue::sift_up(std::size_t i, Key k, std::uintptr_t item) {
  Key* h = keys_.get();
  std::uintptr_t* it = items_.get();
  const u128 w = wide(k.time, k.key);
  while (i > kRoot) {
    const std::size_t parent = i / 4 + 2;
    if (!(w < wide(h[parent].time, h[parent].key))) break;
    h[i] = h[parent];
    it[i] = it[parent];
    i = parent;
  }
  h[i] = k;
  it[i] = item;
}

// Fills the root slot with (k, item). Floyd's variant: move the hole down to a leaf along the
// smaller children, then sift the new entry up from there (it usually belongs near the bottom).
// The smallest child's key is carried in registers, so each level is one load of a cache line of
// four siblings and three compare-and-selects.
void EventQueue::sift_down(Key k, std::uintptr_t item) {
  const std::size_t end = heap_end_;
  Key* h = keys_.get();
  std::uintptr_t* it = items_.get();
  std::size_t i = kRoot;
  for (;;) {
    const std::size_t first = 4 * i - 8;
    std::uint64_t bt, bk;
    std::size_t best;
    if (first + 4 <= end) [[likely]] {
      std::uint64_t t0 = h[first].time, k0 = h[first].key, t2 = h[first + 2].time, k2 = h[first + 2].key;
      std::size_t i0 = first, i2 = first + 2;
      take_smaller(t0, k0, i0, h[first + 1].time, h[first + 1].key, first + 1);
      take_smaller(t2, k2, i2, h[first + 3].time, h[first + 3].key, first + 3);
      take_smaller(t0, k0, i0, t2, k2, i2);
      bt = t0, bk = k0, best = i0;
    } else if (first < end) {
      bt = h[first].time, bk = h[first].key, best = first;
      for (std::size_t c = first + 1; c < end; ++c) take_smaller(bt, bk, best, h[c].time, h[c].key, c);
    } else {
      break;
    }
    h[i] = Key{bt, bk};
    it[i] = it[best];
    i = best;
  }
  sift_up(i, k, item);
  // The root is the next event unless the lane has an earlier one: start loading its callback node
  // (or process record), which was last touched when it was pushed, long enough ago to be cold.
  __builtin_prefetch(reinterpret_cast<const void*>(it[kRoot] & ~std::uintptr_t{1}));
}

}  // namespace cubesim::sim
