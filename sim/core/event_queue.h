// event_queue.h — the pending-event set, totally ordered by (time, priority, insertion sequence).
//
// Two runs that push the same events in the same order pop them in the same order: ties on time
// are broken by priority (lower first), then by insertion sequence (earlier first). Events live in
// a pool that grows in chunks and is recycled, and callbacks are stored inline, so after warm-up a
// push/pop pair allocates nothing.
//
//   EventQueue q;
//   q.push(ns(5), 0, [&] { ... });
//   while (!q.empty()) q.pop_and_run();   // sets q.now() before running each callback
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "sim/core/inplace_function.h"
#include "sim/core/time.h"

namespace cubesim::sim {

class EventQueue {
 public:
  static constexpr std::size_t kCallbackBytes = 48;
  using Callback = InplaceFunction<void(), kCallbackBytes>;
  // Priorities order events at the same time; lower runs first. Range [-32768, 32767].
  static constexpr int kDefaultPriority = 0;

  EventQueue();
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // Schedules a callable at time t (which must not be before now()); it is constructed in place.
  // Returns the insertion sequence.
  template <class F>
  std::uint64_t push(Time t, int priority, F&& fn) {
    Node* n = alloc_node();
    n->cb.emplace(std::forward<F>(fn));
    return insert(t, priority, reinterpret_cast<std::uintptr_t>(n));
  }
  std::uint64_t push(Time t, int priority, Callback&& cb) {
    Node* n = alloc_node();
    n->cb = std::move(cb);
    return insert(t, priority, reinterpret_cast<std::uintptr_t>(n));
  }
  // Schedules a bare pointer (a process to resume): no callback node at all. pop_and_run hands it
  // to its `resume` argument. The pointer must be at least 2-byte aligned.
  [[gnu::always_inline]] std::uint64_t push_resume(Time t, int priority, void* target) {
    return insert(t, priority, reinterpret_cast<std::uintptr_t>(target) | 1u);
  }

  bool empty() const {
    return heap_end_ == (hole_ ? kRoot + 1 : kRoot) && lane_head_ == lane_tail_ && run_size_ == 0;
  }
  std::size_t size() const {
    return heap_end_ - kRoot - (hole_ ? 1 : 0) + (lane_tail_ - lane_head_) + run_size_;
  }
  // Precondition: !empty().
  Time next_time() const {
    switch (next_source()) {
      case Source::lane: return now_;
      case Source::run: return run_[run_head_].time;
      default: return keys_[kRoot].time;
    }
  }
  Time now() const { return now_; }

  // Pops the earliest event, advances now() to its time, runs it: a callback is called, a
  // push_resume target is passed to resume(void*). Precondition: !empty().
  template <class Resume>
  void pop_and_run(Resume&& resume) {
    dispatch(pop(), resume);
  }
  // The scheduler's loop step: if the next event is due at or before `limit`, pops and runs it
  // and returns true; otherwise (or when empty) returns false.
  template <class Resume>
  bool run_next(Time limit, Resume&& resume) {
    std::uintptr_t item;
    switch (next_source()) {
      case Source::lane:
        if (now_ > limit) return false;
        item = pop_lane();
        break;
      case Source::run:
        if (run_[run_head_].time > limit) return false;
        item = pop_run();
        break;
      case Source::heap:
        if (keys_[kRoot].time > limit) return false;  // next_source() settled the heap
        item = pop_heap();
        break;
      default:
        return false;
    }
    dispatch(item, resume);
    return true;
  }
  void pop_and_run() {
    pop_and_run([](void*) { throw_resume_without_handler(); });
  }
  // If the next event is a push_resume target due at or before `limit`, pops it (advancing now()
  // as pop_and_run does) and returns the target; otherwise pops nothing and returns nullptr.
  // (The scheduler's direct hand-over from one process to the next.)
  void* pop_resume(Time limit) {
    std::uintptr_t item;
    switch (next_source()) {
      case Source::lane:
        if (now_ > limit || !(lane_[lane_head_].item & 1u)) return nullptr;
        item = pop_lane();
        break;
      case Source::run:
        if (run_[run_head_].time > limit || !(run_[run_head_].item & 1u)) return nullptr;
        item = pop_run();
        break;
      case Source::heap:
        if (keys_[kRoot].time > limit || !(items_[kRoot] & 1u)) return nullptr;
        item = pop_heap();
        break;
      default:
        return nullptr;
    }
    return reinterpret_cast<void*>(item & ~std::uintptr_t{1});
  }

  // Drops every pending event without running it (callbacks are destroyed).
  void clear();

  // The event running now did nothing (a wake-up superseded since it was scheduled). When such
  // events are the last ones a run executes, rewind_noop_tail() takes the clock back to the last
  // event that did something: a superseded wake-up far in the future does not move the end of a run.
  void note_noop() {
    if (noop_last_ + 1 != executed_) noop_rewind_ = prev_now_;  // a new tail starts with this event
    noop_last_ = executed_;
  }
  // With nothing pending and the last executed event one of a tail of no-ops: now() goes back to the
  // time of the event before that tail (true), else nothing changes (false).
  bool rewind_noop_tail() {
    if (!empty() || executed_ == 0 || noop_last_ != executed_ || noop_rewind_ >= now_) return false;
    now_ = noop_rewind_;
    noop_last_ = ~std::uint64_t{0};
    return true;
  }

  std::uint64_t pushed() const { return seq_; }
  std::size_t lane_capacity() const { return lane_cap_; }
  // Pending events held in the ascending run (not the heap), for tests.
  std::size_t run_size() const { return run_size_; }
  std::uint64_t executed() const { return executed_; }
  // A running hash of (time, priority, sequence) of every executed event: two runs of the same
  // input give the same value; a test compares it across runs.
  std::uint64_t order_hash() const { return hash_; }

 private:
  // One cache line: a pending node holds its callback; a free one reuses the space for the link.
  struct alignas(64) Node {
    union {
      Callback cb;
      Node* next_free;
    };
    Node() : next_free(nullptr) {}
    ~Node() {}  // the queue destroys every pending callback (clear()) before the pool goes
  };
  static_assert(sizeof(Node) == 64, "a callback node is one cache line");
  struct Entry {
    Time time;
    std::uint64_t key;   // (priority + 2^15) << 48 | sequence
    std::uintptr_t item; // Node*, or a push_resume target with bit 0 set
  };
  // The heap's sort key alone: 16 bytes, so the four children of a node fill one cache line.
  struct Key {
    Time time;
    std::uint64_t key;
  };
  static bool before(const Entry& a, const Key& b) {
    using u128 = unsigned __int128;
    return ((u128{a.time} << 64) | a.key) < ((u128{b.time} << 64) | b.key);
  }
  Node* alloc_node() {
    if (!free_) grow_pool();
    Node* n = free_;
    free_ = n->next_free;
    ::new (&n->cb) Callback();
    return n;
  }
  void free_node(Node* n) {
    n->cb.~Callback();
    n->next_free = free_;
    free_ = n;
  }
  [[gnu::always_inline]] std::uint64_t insert(Time t, int priority, std::uintptr_t item) {
    if (t == now_ && priority == kDefaultPriority && lane_tail_ < lane_cap_) [[likely]] {
      const std::uint64_t seq = seq_++;
      lane_[lane_tail_++] = Entry{t, (std::uint64_t{32768} << 48) | seq, item};
      return seq;
    }
    if (t > now_ && static_cast<unsigned>(priority + 32768) <= 65535u) {
      if (t < horizon_) horizon_ = t;
      const std::uint64_t seq = seq_++;
      const std::uint64_t key = (static_cast<std::uint64_t>(priority + 32768) << 48) | seq;
      if (run_size_ == 0 || t > run_back_.time || (t == run_back_.time && key > run_back_.key)) {
        // After every event in the run: appended, already in order.
        if (run_size_ == run_cap_) [[unlikely]] grow_run();
        run_[(run_head_ + run_size_++) & (run_cap_ - 1)] = Entry{t, key, item};
        run_back_ = Key{t, key};
        return seq;
      }
      if (hole_) {
        // A successor for the popped root's slot (the common case of a callback's push).
        hole_ = false;
        sift_down(Key{t, key}, item);
        return seq;
      }
      if (heap_end_ == heap_cap_) [[unlikely]] grow_heap();
      sift_up(heap_end_++, Key{t, key}, item);
      return seq;
    }
    return insert_slow(t, priority, item);
  }
  std::uint64_t insert_slow(Time t, int priority, std::uintptr_t item);
  std::uintptr_t pop() {
    switch (next_source()) {
      case Source::lane: return pop_lane();
      case Source::run: return pop_run();
      default: return pop_heap();
    }
  }
  std::uintptr_t pop_run() {
    const Entry e = run_[run_head_];
    run_head_ = (run_head_ + 1) & (run_cap_ - 1);
    --run_size_;
    note(e);
    // The next in the run is likely next to run: start loading its node, pushed long ago.
    if (run_size_) __builtin_prefetch(reinterpret_cast<const void*>(run_[run_head_].item & ~std::uintptr_t{1}));
    return e.item;
  }
  std::uintptr_t pop_lane() {
    const Entry& e = lane_[lane_head_++];
    if (lane_head_ == lane_tail_) lane_head_ = lane_tail_ = 0;
    note(e);
    return e.item;
  }
  std::uintptr_t pop_heap() {
    settle();
    hole_ = true;  // removed when the next push or read of the heap comes (settle())
    note(Entry{keys_[kRoot].time, keys_[kRoot].key, 0});
    return items_[kRoot];
  }
  void note(const Entry& e) {
    prev_now_ = now_;
    now_ = e.time;
    ++executed_;
    hash_ = ((hash_ ^ e.time) * 0x100000001b3ull ^ e.key) * 0x9e3779b97f4a7c15ull;
  }
  template <class Resume>
  void dispatch(std::uintptr_t item, Resume& resume) {
    if (item & 1u) {
      resume(reinterpret_cast<void*>(item & ~std::uintptr_t{1}));
    } else {
      run_node(reinterpret_cast<Node*>(item));
    }
  }
  void run_node(Node* n);
  [[noreturn]] static void throw_resume_without_handler();
  void drop(std::uintptr_t item) {
    if (!(item & 1u)) free_node(reinterpret_cast<Node*>(item));
  }
  void sift_up(std::size_t i, Key k, std::uintptr_t item);
  void sift_down(Key k, std::uintptr_t item);
  void grow_heap();
  void grow_pool();
  void grow_run();
  // Where the next event to run is: the smallest of the now-lane's front, the run's front and the
  // heap's top. (Settles a pending root removal first: after it keys_[kRoot] is the heap's true
  // minimum.)
  enum class Source { none, lane, run, heap };
  Source next_source() const {
    settle();
    const bool run = run_size_ != 0, heap = heap_end_ != kRoot;
    if (lane_head_ != lane_tail_) [[likely]] {
      // The lane's front is due now; the others are due now or later, and beat it only when due
      // now with a smaller key (an earlier push at a lower priority). Mostly they are due later,
      // which a lower bound of their times says without reading them.
      if (horizon_ > now_) [[likely]] return Source::lane;
      const Time rt = run ? run_[run_head_].time : kTimeMax, ht = heap ? keys_[kRoot].time : kTimeMax;
      horizon_ = std::min(rt, ht);
      if (horizon_ > now_) return Source::lane;
      const std::uint64_t lk = lane_[lane_head_].key;
      if (!(run && rt == now_ && run_[run_head_].key < lk) && !(heap && ht == now_ && keys_[kRoot].key < lk)) {
        return Source::lane;
      }
    }
    if (!run) return heap ? Source::heap : Source::none;
    if (!heap) return Source::run;
    return before(run_[run_head_], keys_[kRoot]) ? Source::run : Source::heap;
  }
  // pop_heap() leaves the popped root in place (hole_) so that an event pushed while the popped
  // one runs (a callback scheduling its successor: the common case) takes the root's place with
  // one sift-down, instead of the last leaf sifting down now and the new entry sifting up later.
  // Anything else that reads the heap settles the hole first: the last leaf takes the root.
  void settle() const {
    if (hole_) [[unlikely]] settle_slow();
  }
  void settle_slow() const;

  // A 4-ary min-heap of keys, with the items in a parallel array (moved along, never compared).
  // Slot kRoot (3) is the root and the children of slot i are slots 4i-8 .. 4i-5: with keys_
  // 64-byte aligned, every group of four siblings is one cache line. Slots 0..2 are unused.
  // Slots [kRoot, heap_end_) are in use; keys_[kRoot] is stale while hole_.
  static constexpr std::size_t kRoot = 3;
  struct FreeAligned {
    void operator()(Key* p) const;
  };
  mutable std::unique_ptr<Key[], FreeAligned> keys_;
  mutable std::unique_ptr<std::uintptr_t[]> items_;
  mutable std::size_t heap_end_ = kRoot;
  std::size_t heap_cap_ = 0;
  mutable bool hole_ = false;
  // Events pushed for the current time at the default priority (wake-ups, mostly) skip the heap:
  // they arrive in sequence order, so this FIFO is already sorted, and popping takes the smaller of
  // its front and the heap's top. The total order is unchanged; the common case is O(1).
  std::unique_ptr<Entry[]> lane_;
  std::size_t lane_head_ = 0, lane_tail_ = 0, lane_cap_ = 0;
  // Future events pushed after every event already in it, by (time, priority, sequence), skip the
  // heap too: a FIFO ring in ascending order (a stream of chunks injected a pace apart, each event
  // scheduling its successor: pushed in the order they are due). The next event is the smallest of
  // the lane's front, this run's front and the heap's top; the total order is unchanged.
  std::unique_ptr<Entry[]> run_;
  std::size_t run_head_ = 0, run_size_ = 0, run_cap_ = 0;  // run_cap_ a power of two
  Key run_back_{0, 0};  // the run's last entry
  // At most the earliest time in the run and the heap (lowered by every push there, made exact when
  // the lane's front is weighed against them): while it is after now(), the lane's front is next.
  mutable Time horizon_ = kTimeMax;
  std::vector<std::unique_ptr<Node[]>> chunks_;
  std::size_t chunk_size_ = 256;
  Node* free_ = nullptr;
  Time now_ = 0;
  Time prev_now_ = 0;     // now() before the event running now (note_noop)
  Time noop_rewind_ = 0;  // where the current tail of no-op events started from
  std::uint64_t noop_last_ = ~std::uint64_t{0};  // executed() at the last no-op event
  std::uint64_t seq_ = 0;
  std::uint64_t executed_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace cubesim::sim
