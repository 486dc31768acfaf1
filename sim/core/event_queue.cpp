#include "sim/core/event_queue.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::sim {

namespace {
constexpr std::size_t kArity = 4;
constexpr std::uint64_t kSeqBits = 48;
constexpr std::uint64_t kSeqMask = (std::uint64_t{1} << kSeqBits) - 1;

}  // namespace

EventQueue::EventQueue() : lane_(std::make_unique<Entry[]>(1024)), lane_cap_(1024) { heap_.reserve(1024); }

EventQueue::~EventQueue() { clear(); }

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
    heap_.front() = Entry{t, key, item};
    sift_down(0);
  } else {
    heap_.push_back(Entry{t, key, item});
    sift_up(heap_.size() - 1);
  }
  return seq;
}

void EventQueue::settle_slow() const {
  hole_ = false;
  const Entry last = heap_.back();
  heap_.pop_back();
  if (!heap_.empty()) {
    heap_.front() = last;
    const_cast<EventQueue*>(this)->sift_down(0);
  }
}

std::uintptr_t EventQueue::pop_heap() {
  settle();
  const Entry top = heap_.front();
  hole_ = true;  // removed when the next push or read of the heap comes (settle())
  note(top);
  return top.item;
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
  if (hole_) {
    heap_.front() = heap_.back();  // the popped root is not pending any more
    heap_.pop_back();
    hole_ = false;
  }
  for (Entry& e : heap_) drop(e.item);
  heap_.clear();
  for (std::size_t i = lane_head_; i < lane_tail_; ++i) drop(lane_[i].item);
  lane_head_ = lane_tail_ = 0;
}

void EventQueue::sift_up(std::size_t i) {
  const Entry e = heap_[i];
  while (i > 0) {
    const std::size_t parent = (i - 1) / kArity;
    if (!before(e, heap_[parent])) break;
    heap_[i] = heap_[parent];
    i = parent;
  }
  heap_[i] = e;
}

// Floyd's variant: move the hole down to a leaf along the smaller children (picked without
// branches: the four-way minimum is the hot spot), then sift the displaced entry up from there.
void EventQueue::sift_down(std::size_t i) {
  const std::size_t n = heap_.size();
  const Entry e = heap_[i];
  Entry* h = heap_.data();
  using u128 = unsigned __int128;
  auto k = [](const Entry& a) { return (u128{a.time} << 64) | a.key; };
  auto less = [&](const Entry& a, const Entry& b) { return k(a) < k(b); };
  // cond ? x : y without a branch (the compiler turns ?: into mispredicted jumps here).
  auto sel = [](std::size_t cond, std::size_t x, std::size_t y) { return y ^ ((x ^ y) & (std::size_t{0} - cond)); };
  for (;;) {
    const std::size_t first = i * kArity + 1;
    std::size_t best;
    if (first + kArity <= n) [[likely]] {
      const std::size_t b01 = sel(k(h[first + 1]) < k(h[first]), first + 1, first);
      const std::size_t b23 = sel(k(h[first + 3]) < k(h[first + 2]), first + 3, first + 2);
      best = sel(k(h[b23]) < k(h[b01]), b23, b01);
    } else if (first < n) {
      best = first;
      for (std::size_t c = first + 1; c < n; ++c) best = less(h[c], h[best]) ? c : best;
    } else {
      break;
    }
    h[i] = h[best];
    i = best;
  }
  while (i > 0) {
    const std::size_t parent = (i - 1) / kArity;
    if (!less(e, h[parent])) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = e;
}

}  // namespace cubesim::sim
