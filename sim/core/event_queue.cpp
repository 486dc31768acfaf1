#include "sim/core/event_queue.h"

#include <cassert>
#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::sim {

namespace {
constexpr std::size_t kArity = 4;
constexpr std::uint64_t kSeqBits = 48;
constexpr std::uint64_t kSeqMask = (std::uint64_t{1} << kSeqBits) - 1;

inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}
}  // namespace

EventQueue::EventQueue() {
  heap_.reserve(1024);
  now_lane_.reserve(1024);
}

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

std::uint64_t EventQueue::insert(Time t, int priority, std::uintptr_t item) {
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
    now_lane_.push_back(Entry{t, key, item});
  } else {
    heap_.push_back(Entry{t, key, item});
    sift_up(heap_.size() - 1);
  }
  return seq;
}

std::uintptr_t EventQueue::pop() {
  assert(!empty());
  Entry top;
  if (lane_has_next()) {
    top = now_lane_[now_lane_head_++];
    if (now_lane_head_ == now_lane_.size()) {
      now_lane_.clear();
      now_lane_head_ = 0;
    }
  } else {
    top = heap_.front();
    const Entry last = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) {
      heap_.front() = last;
      sift_down(0);
    }
  }
  now_ = top.time;
  ++executed_;
  hash_ = mix(mix(hash_, top.time), top.key);
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
  for (Entry& e : heap_) drop(e.item);
  heap_.clear();
  for (std::size_t i = now_lane_head_; i < now_lane_.size(); ++i) drop(now_lane_[i].item);
  now_lane_.clear();
  now_lane_head_ = 0;
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

void EventQueue::sift_down(std::size_t i) {
  const std::size_t n = heap_.size();
  const Entry e = heap_[i];
  for (;;) {
    const std::size_t first = i * kArity + 1;
    if (first >= n) break;
    std::size_t best = first;
    const std::size_t end = first + kArity < n ? first + kArity : n;
    for (std::size_t c = first + 1; c < end; ++c) {
      if (before(heap_[c], heap_[best])) best = c;
    }
    if (!before(heap_[best], e)) break;
    heap_[i] = heap_[best];
    i = best;
  }
  heap_[i] = e;
}

}  // namespace cubesim::sim
