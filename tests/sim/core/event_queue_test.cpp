#include "sim/core/event_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <vector>

namespace cubesim::sim {
namespace {

TEST(EventQueue, OrdersByTimeThenPriorityThenInsertion) {
  EventQueue q;
  std::vector<int> order;
  q.push(ns(5), 0, [&] { order.push_back(4); });
  q.push(ns(1), 1, [&] { order.push_back(2); });
  q.push(ns(1), 0, [&] { order.push_back(0); });
  q.push(ns(1), 1, [&] { order.push_back(3); });
  q.push(ns(1), 0, [&] { order.push_back(1); });
  q.push(ns(1), -5, [&] { order.push_back(-1); });
  while (!q.empty()) q.pop_and_run();
  EXPECT_EQ(order, (std::vector<int>{-1, 0, 1, 2, 3, 4}));
  EXPECT_EQ(q.now(), ns(5));
}

// Property: for random (time, priority) pushes, interleaved with pushes from inside callbacks
// (some at the current time, which take the O(1) lane), every pop is the minimum by
// (time, priority, sequence) of the events pending at that moment (checked against a std::set).
TEST(EventQueue, RandomWorkloadPopsThePendingMinimum) {
  for (int seed = 0; seed < 20; ++seed) {
    using Key = std::tuple<Time, int, std::uint64_t>;
    struct State {
      std::mt19937_64 rng;
      EventQueue q;
      std::set<Key> pending;
      std::size_t pops = 0;
      int seed;
      void push_one(int depth) {
        const Time t = q.now() + (rng() % 4 == 0 ? 0 : rng() % 50);
        const int prio = static_cast<int>(rng() % 3) - 1;
        auto key = std::make_shared<Key>();
        const std::uint64_t seq = q.push(t, prio, [st = this, key, depth] {
          ASSERT_EQ(*key, *st->pending.begin()) << "seed " << st->seed << " pop " << st->pops;
          st->pending.erase(st->pending.begin());
          ++st->pops;
          if (depth < 3 && st->rng() % 2) st->push_one(depth + 1);
        });
        *key = Key{t, prio, seq};
        pending.insert(*key);
      }
    } st{std::mt19937_64(seed), {}, {}, 0, seed};
    auto& q = st.q;
    auto& pending = st.pending;
    auto& pops = st.pops;
    auto push_one = [&](int d) { st.push_one(d); };
    for (int i = 0; i < 300; ++i) push_one(0);
    while (!q.empty()) q.pop_and_run();
    EXPECT_TRUE(pending.empty());
    EXPECT_GT(pops, 300u);
  }
}

// Property, at the scale where the heap is several levels deep and grows: callbacks and
// push_resume targets, pushed from outside and from inside callbacks (at now() and later), with
// many ties on time and on priority, run exactly in the reference order: the pending set's
// minimum by (time, priority, sequence) each time. Reads of the queue between events (size,
// next_time, run_next with a limit) settle a popped root at odd moments; clear() at the end drops
// what is left. The queue's order hash must equal the hash of the reference sequence.
TEST(EventQueue, LargeRandomWorkloadWithResumesMatchesTheReferenceOrder) {
  using Key = std::tuple<Time, int, std::uint64_t>;
  struct Target {
    Key key;
  };
  for (int seed = 0; seed < 12; ++seed) {
    struct State {
      std::mt19937_64 rng;
      EventQueue q;
      std::set<Key> pending;
      std::vector<std::unique_ptr<Target>> targets;
      std::uint64_t expect_hash = 0xcbf29ce484222325ull;
      std::size_t runs = 0, budget = 0;
      int seed = 0;
      void check(const Key& k) {
        ASSERT_FALSE(pending.empty()) << "seed " << seed;
        ASSERT_EQ(k, *pending.begin()) << "seed " << seed << " event " << runs;
        ASSERT_EQ(std::get<0>(k), q.now());
        pending.erase(pending.begin());
        const auto [t, prio, seq] = k;
        const std::uint64_t key = (static_cast<std::uint64_t>(prio + 32768) << 48) | seq;
        expect_hash = ((expect_hash ^ t) * 0x100000001b3ull ^ key) * 0x9e3779b97f4a7c15ull;
        ++runs;
        if (budget > 0) {
          const int n = static_cast<int>(rng() % 3);  // 0, 1 or 2 successors: the set breathes
          for (int i = 0; i < n && budget > 0; ++i, --budget) push_one();
        }
      }
      Time pick_time() {
        switch (rng() % 8) {
          case 0: case 1: case 2: return q.now();                     // ties on now (the lane)
          case 3: return q.now() + rng() % 4;                         // near ties
          case 4: return q.now() + 1000 * (rng() % 5);                // ties on a coarse grid
          case 5: return q.now() + (rng() % 1'000'000);               // far
          default: return q.now() + rng() % 2000;
        }
      }
      void push_one() {
        const Time t = pick_time();
        const int prio = rng() % 2 ? 0 : static_cast<int>(rng() % 5) - 2;
        if (rng() % 3 == 0) {
          targets.push_back(std::make_unique<Target>());
          Target* tg = targets.back().get();
          tg->key = Key{t, prio, q.push_resume(t, prio, tg)};
          pending.insert(tg->key);
        } else {
          auto key = std::make_shared<Key>();
          *key = Key{t, prio, q.push(t, prio, [this, key] { check(*key); })};
          pending.insert(*key);
        }
      }
    } st;
    st.rng.seed(seed);
    st.seed = seed;
    st.budget = 20000;
    for (int i = 0; i < 3000; ++i) st.push_one();  // past the heap's first capacity
    auto resume = [&](void* p) { st.check(static_cast<Target*>(p)->key); };
    while (!st.q.empty()) {
      ASSERT_EQ(st.q.size(), st.pending.size());
      switch (st.rng() % 16) {
        case 0: ASSERT_EQ(st.q.next_time(), std::get<0>(*st.pending.begin())); break;
        case 1: {
          const Time front = std::get<0>(*st.pending.begin());
          const Time limit = front > 0 ? front - st.rng() % 2 : 0;
          ASSERT_EQ(st.q.run_next(limit, resume), front <= limit);
          continue;
        }
        default: break;
      }
      if (st.runs > 15000 && st.rng() % 500 == 0) break;  // leave some pending for clear()
      st.q.pop_and_run(resume);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_EQ(st.q.order_hash(), st.expect_hash) << "seed " << seed;
    EXPECT_EQ(st.q.executed(), st.runs);
    st.q.clear();
    EXPECT_TRUE(st.q.empty());
    EXPECT_EQ(st.q.size(), 0u);
  }
}

TEST(EventQueue, PastEventsAndBadPrioritiesAreErrors) {
  EventQueue q;
  q.push(ns(10), 0, [] {});
  q.pop_and_run();
  EXPECT_THROW(q.push(ns(9), 0, [] {}), std::logic_error);
  EXPECT_THROW(q.push(ns(11), 40000, [] {}), std::invalid_argument);
}

TEST(EventQueue, PoolRecyclesNodes) {
  EventQueue q;
  int n = 0;
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 1000; ++i) q.push(q.now() + i, 0, [&] { ++n; });
    while (!q.empty()) q.pop_and_run();
  }
  EXPECT_EQ(n, 5000);
  EXPECT_EQ(q.executed(), 5000u);
}

// Events pushed in ascending order go to the run (a ring) instead of the heap: it wraps as its front
// is popped and grows while wrapped, and events out of its order (earlier, or ties on time with a
// lower priority) go to the heap; the pops still follow (time, priority, sequence) exactly.
TEST(EventQueue, TheAscendingRunWrapsGrowsAndMergesWithTheHeap) {
  using Key = std::tuple<Time, int, std::uint64_t>;
  EventQueue q;
  std::set<Key> pending;
  std::vector<Key> ran;
  auto push = [&](Time t, int prio) {
    auto key = std::make_shared<Key>();
    *key = Key{t, prio, q.push(t, prio, [&ran, key] { ran.push_back(*key); })};
    pending.insert(*key);
  };
  auto pop = [&](std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_FALSE(pending.empty());
      q.pop_and_run();
      ASSERT_EQ(ran.back(), *pending.begin());
      pending.erase(pending.begin());
    }
  };
  std::mt19937_64 rng(7);
  Time t = 100;
  for (int i = 0; i < 1000; ++i) push(t += 10, 0);  // ascending: all in the run
  EXPECT_EQ(q.run_size(), 1000u);
  pop(600);
  for (int i = 0; i < 624; ++i) push(t += 10, 0);  // the ring wraps and fills
  EXPECT_EQ(q.run_size(), 1024u);
  push(t += 10, 0);  // grows while wrapped
  EXPECT_EQ(q.run_size(), 1025u);
  for (int i = 0; i < 2000; ++i) {
    // Interleaved: ties on the run's last time at priorities below and above it, earlier times
    // (the heap), and more of the run.
    switch (rng() % 4) {
      case 0: push(t, static_cast<int>(rng() % 5) - 2); break;
      case 1: push(q.now() + rng() % (t - q.now() + 1), 0); break;
      default: push(t += rng() % 20, 0); break;
    }
    if (rng() % 3 == 0) pop(1);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(q.run_size(), 0u);
  EXPECT_EQ(q.size(), pending.size());
  pop(pending.size());
  EXPECT_TRUE(q.empty());
}

// Two wake-ups ping-ponging at one instant keep the now-lane non-empty forever; it must recycle its
// space rather than grow (regression: it once doubled on every wrap, ~24 bytes per event).
TEST(EventQueue, SteadyWakeupsDoNotGrowTheLane) {
  EventQueue q;
  int remaining = 1'000'000;
  struct Bounce {
    EventQueue* q;
    int* remaining;
    void operator()() const {
      if (--*remaining > 0) q->push(q->now(), 0, Bounce{q, remaining});
    }
  };
  q.push(0, 0, Bounce{&q, &remaining});
  q.push(0, 0, Bounce{&q, &remaining});
  while (!q.empty()) q.pop_and_run();
  EXPECT_LE(q.lane_capacity(), 1024u);
  EXPECT_EQ(q.executed(), 1'000'001u);
}

TEST(EventQueue, CallbacksWithStateAreDestroyed) {
  auto token = std::make_shared<int>(1);
  {
    EventQueue q;
    q.push(ns(1), 0, [token] {});
    q.push(ns(2), 0, [token] {});
    EXPECT_EQ(token.use_count(), 3);
    q.pop_and_run();
    EXPECT_EQ(token.use_count(), 2);
  }
  EXPECT_EQ(token.use_count(), 1);  // the pending one was destroyed with the queue
}

}  // namespace
}  // namespace cubesim::sim
