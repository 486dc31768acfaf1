#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/core/barrier.h"
#include "sim/core/event.h"
#include "sim/core/resource.h"
#include "sim/core/simulator.h"
#include "sim/core/wait.h"

namespace cubesim::sim {
namespace {

TEST(Event, WaitersResumeInFifoOrderWhenTriggered) {
  Simulator sim;
  Event e("go");
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) {
    sim.spawn("w" + std::to_string(i), [&, i] {
      this_process::sleep(ns(5 - i));  // arrive in reverse id order: w4 first
      e.wait();
      order.push_back(i);
      EXPECT_EQ(sim.now(), ns(20));
    });
  }
  sim.at(ns(20), [&] { e.trigger(); });  // from a callback
  sim.run();
  EXPECT_EQ(order, (std::vector<int>{4, 3, 2, 1, 0}));
  EXPECT_TRUE(e.triggered());
}

TEST(Event, WaitOnTriggeredReturnsAtOnceAndSecondTriggerIsNoop) {
  Simulator sim;
  Event e("e");
  sim.spawn("p", [&] {
    e.trigger();
    e.trigger();
    const Time t = sim.now();
    e.wait();
    EXPECT_EQ(sim.now(), t);
  });
  sim.run();
}

TEST(Resource, FifoWithoutBarging) {
  Simulator sim;
  Resource r(4, "r");
  std::vector<std::string> log;
  auto user = [&](std::string name, Duration start, std::uint64_t n, Duration hold) {
    sim.spawn(name, [&, name, start, n, hold] {
      this_process::sleep(start);
      r.acquire(n);
      log.push_back(name + "@" + std::to_string(sim.now() / 1000));
      this_process::sleep(hold);
      r.release(n);
    });
  };
  user("big0", 0, 3, ns(10));   // holds 3 of 4 until 10
  user("big1", ns(1), 4, ns(5));  // needs all 4: waits until 10
  user("small", ns(2), 1, ns(1)); // 1 is free, but big1 queued first: no barging, waits until 15
  sim.run();
  EXPECT_EQ(log, (std::vector<std::string>{"big0@0", "big1@10", "small@15"}));
}

TEST(Resource, ErrorsNameTheResourceAndValidRange) {
  Simulator sim;
  Resource r(2, "link3");
  sim.spawn("p", [&] { r.acquire(3); });
  try {
    sim.run();
    FAIL();
  } catch (const ProcessError& e) {
    EXPECT_NE(std::string(e.what()).find("Resource 'link3': acquire(3) can never be granted; ask for 1 to 2 units"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(r.release(1), std::logic_error);
  EXPECT_TRUE(r.try_acquire(2));
  EXPECT_FALSE(r.try_acquire(1));
  r.release(2);
  EXPECT_THROW(Resource(0, "zero"), std::invalid_argument);
}

TEST(Barrier, ReleasesAllAndResetsEachRound) {
  Simulator sim;
  Barrier b(3, "b");
  std::vector<std::pair<int, Time>> passed;
  for (int r = 0; r < 3; ++r) {
    sim.spawn("r" + std::to_string(r), [&, r] {
      for (int round = 0; round < 3; ++round) {
        this_process::sleep(ns(r + 1));
        b.arrive_and_wait();
        passed.push_back({r, sim.now()});
      }
    });
  }
  sim.run();
  ASSERT_EQ(passed.size(), 9u);
  EXPECT_EQ(b.generation(), 3u);
  // Each round ends when the slowest (r2, +3 ns) arrives: 3, 6, 9 ns.
  for (int i = 0; i < 9; ++i) EXPECT_EQ(passed[i].second, ns(3 * (i / 3 + 1)));
}

TEST(Wait, AllAndAny) {
  Simulator sim;
  Event a("a"), b("b"), c("c");
  std::size_t first = 99;
  Time all_at = 0;
  sim.spawn("any", [&] { first = wait_any({&a, &b, &c}); });
  sim.spawn("all", [&] {
    wait_all({&a, &b, &c});
    all_at = sim.now();
  });
  sim.at(ns(3), [&] { b.trigger(); });
  sim.at(ns(5), [&] { c.trigger(); });
  sim.at(ns(9), [&] { a.trigger(); });
  sim.run();
  EXPECT_EQ(first, 1u);
  EXPECT_EQ(all_at, ns(9));
  EXPECT_EQ(a.waiting() + b.waiting() + c.waiting(), 0u);  // the any-waiter unlinked itself
}

TEST(Wait, AlreadyTriggeredHandles) {
  Simulator sim;
  Event a("a"), b("b");
  b.trigger();
  std::size_t i = 99;
  sim.spawn("p", [&] {
    i = wait_any({&a, &b});
    a.trigger();
    wait_all({&a, &b});
  });
  sim.run();
  EXPECT_EQ(i, 1u);
}

}  // namespace
}  // namespace cubesim::sim
