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
