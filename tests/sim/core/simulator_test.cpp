#include "sim/core/simulator.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <csignal>
#include <random>
#include <string>
#include <vector>

#include "sim/core/barrier.h"
#include "sim/core/event.h"
#include "sim/core/interrupt.h"
#include "sim/core/resource.h"
#include "sim/core/wait.h"

namespace cubesim::sim {
namespace {

// Counts live instances: a process unwound at teardown must run its destructors.
struct Tracked {
  static inline int live = 0;
  Tracked() { ++live; }
  ~Tracked() { --live; }
};

TEST(Simulator, ProcessesSleepAndSeeSimulatedTime) {
  Simulator sim;
  std::vector<std::string> log;
  sim.spawn("a", [&] {
    this_process::sleep(ns(10));
    log.push_back("a@" + std::to_string(this_process::now()));
  });
  sim.spawn("b", [&] {
    this_process::sleep(ns(5));
    log.push_back("b@" + std::to_string(sim.now()));
    this_process::sleep(ns(5));
    log.push_back("b@" + std::to_string(sim.now()));
  });
  sim.run();
  // At 10 ns both are due; a's wake-up was pushed first (at t=0), so a runs first.
  EXPECT_EQ(log, (std::vector<std::string>{"b@5000", "a@10000", "b@10000"}));
  EXPECT_EQ(sim.now(), ns(10));
  EXPECT_EQ(sim.processes_live(), 0u);
}

TEST(Simulator, SpawnOrderIsStartOrderAndYieldLetsOthersRun) {
  Simulator sim;
  std::string s;
  for (char c : std::string("abc")) {
    sim.spawn(std::string(1, c), [&s, c] {
      s += c;
      this_process::yield();
      s += static_cast<char>(c - 32);
    });
  }
  sim.run();
  EXPECT_EQ(s, "abcABC");
}

TEST(Simulator, ProcessesSpawnProcesses) {
  Simulator sim;
  int done = 0;
  sim.spawn("parent", [&] {
    for (int i = 0; i < 10; ++i) {
      sim.spawn("child" + std::to_string(i), [&, i] {
        this_process::sleep(ns(i));
        ++done;
      });
    }
  });
  sim.run();
  EXPECT_EQ(done, 10);
  EXPECT_EQ(sim.now(), ns(9));
}

// A random workload: processes sleep random times, contend for a resource, pass events and meet at
// a barrier. The observable order (who did what when) is hashed; two runs must agree bit for bit,
// and so must the queue's own event-order hash.
std::pair<std::uint64_t, std::uint64_t> random_workload(std::uint64_t seed) {
  Simulator sim;
  Resource res(2, "shared");
  Barrier bar(8, "bar");
  std::vector<std::unique_ptr<Event>> evs;
  for (int i = 0; i < 8; ++i) evs.push_back(std::make_unique<Event>("e" + std::to_string(i)));
  std::uint64_t h = 1469598103934665603ull;
  auto note = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull ^ sim.now(); };
  for (int r = 0; r < 8; ++r) {
    sim.spawn("p" + std::to_string(r), [&, r] {
      std::mt19937_64 rng(seed * 100 + r);
      for (int step = 0; step < 50; ++step) {
        this_process::sleep(rng() % 3 == 0 ? 0 : ps(rng() % 2000));
        res.acquire(1 + rng() % 2);
        note(r * 1000 + step);
        this_process::sleep(ps(rng() % 500));
        res.release(res.capacity() - res.available());
        if (step == 25) {
          evs[r]->trigger();
          evs[(r + 1) % 8]->wait();
          bar.arrive_and_wait();
          note(77 + r);
        }
      }
    });
  }
  sim.run();
  return {h, sim.event_order_hash()};
}

TEST(Simulator, DeterministicEventOrderAcrossRuns) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    auto a = random_workload(seed);
    auto b = random_workload(seed);
    EXPECT_EQ(a.first, b.first) << "seed " << seed;
    EXPECT_EQ(a.second, b.second) << "seed " << seed;
  }
  EXPECT_NE(random_workload(1).first, random_workload(2).first);  // the hash does see the workload
}

// Ctrl-C (interrupt.h): the run stops between events, unwinds its processes and says how far it
// got; the simulator then runs again.
TEST(Simulator, AnInterruptStopsTheRunAndTheSimulatorRunsAgain) {
  Tracked::live = 0;
  Simulator sim;
  int steps = 0;
  sim.spawn("ticker", [&] {
    Tracked t;
    for (int i = 0; i < 1000000; ++i) {
      this_process::sleep(ns(1));
      ++steps;
      if (i == 5000) request_interrupt();  // as the signal handler would
    }
  });
  try {
    sim.run();
    FAIL() << "run() should have been interrupted";
  } catch (const InterruptedError& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted (SIGINT) at simulated time"), std::string::npos) << e.what();
    // Stopped within one poll of the request, never before it.
    EXPECT_GE(steps, 5001);
    EXPECT_LE(steps, 5001 + static_cast<int>(kInterruptPoll));
    EXPECT_EQ(e.time(), sim.now());
    EXPECT_GT(e.events(), 5000u);
  }
  EXPECT_EQ(Tracked::live, 0);  // the ticker was unwound
  EXPECT_EQ(sim.processes_live(), 0u);
  clear_interrupt();
  const Time t0 = sim.now();
  bool ran = false;
  sim.spawn("again", [&] {
    this_process::sleep(ns(7));
    ran = true;
  });
  sim.run();
  EXPECT_TRUE(ran);
  EXPECT_EQ(sim.now(), t0 + ns(7));
}

// A SigintScope installs its handler for its lifetime: a SIGINT raised inside sets the flag (and
// the process survives); outside, the previous disposition is back.
TEST(Simulator, ASigintScopeTurnsTheSignalIntoTheFlag) {
  // From SIGINT's default disposition, whatever the test inherited (a background job ignores it,
  // and an ignored SIGINT stays ignored by design).
  struct sigaction inherited {}, dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, &inherited);
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  clear_interrupt();
  {
    SigintScope scope;
    SigintScope nested;
    std::raise(SIGINT);
    EXPECT_TRUE(interrupt_requested());
  }
  clear_interrupt();
  struct sigaction after {};
  sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  sigaction(SIGINT, &inherited, nullptr);
}

TEST(Simulator, ExceptionEndsRunNamingProcessAndTime) {
  Tracked::live = 0;
  Simulator sim;
  Event never("never");
  int after_throw = 0;
  sim.spawn("worker", [&] {
    this_process::sleep(ns(3));
    throw std::runtime_error("bad tile index 17");
  });
  sim.spawn("waiter", [&] {
    Tracked t;
    never.wait();
    ++after_throw;
  });
  sim.spawn("sleeper", [&] {
    Tracked t;
    this_process::sleep(us(5));
    ++after_throw;
  });
  try {
    sim.run();
    FAIL() << "run() should have thrown";
  } catch (const ProcessError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'worker'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3.000 ns"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad tile index 17"), std::string::npos) << msg;
    ASSERT_EQ(e.failures().size(), 1u);
    EXPECT_EQ(e.failures()[0].time, ns(3));
    EXPECT_THROW(std::rethrow_exception(e.failures()[0].error), std::runtime_error);
  }
  EXPECT_EQ(after_throw, 0);
  EXPECT_EQ(Tracked::live, 0);  // siblings were unwound, destructors ran
  EXPECT_EQ(sim.processes_live(), 0u);
  EXPECT_EQ(sim.now(), ns(3));  // the sleeper's 5 us never happened
}

TEST(Simulator, AllFailuresAtTheSameInstantAreReported) {
  Simulator sim;
  for (int r = 0; r < 4; ++r) {
    sim.spawn("rank" + std::to_string(r), [r] {
      this_process::sleep(ns(r < 2 ? 7 : 8));
      throw std::invalid_argument("shape mismatch on rank " + std::to_string(r));
    });
  }
  try {
    sim.run();
    FAIL();
  } catch (const ProcessError& e) {
    ASSERT_EQ(e.failures().size(), 2u);  // ranks 0 and 1 at 7 ns; ranks 2, 3 never got to 8 ns
    EXPECT_EQ(e.failures()[0].process, "rank0");
    EXPECT_EQ(e.failures()[1].process, "rank1");
    EXPECT_NE(std::string(e.what()).find("2 processes failed at 7.000 ns"), std::string::npos) << e.what();
  }
}

TEST(Simulator, DeadlockReportListsEachBlockedProcessAndWhatItWaitsOn) {
  Simulator sim;
  Event a("grad.ready"), b("weights.loaded");
  Resource r(2, "hbm.port");
  Barrier bar(3, "step.barrier");
  sim.spawn("rank0", [&] { a.wait(); });
  sim.spawn("rank1", [&] {
    this_process::sleep(ns(4));
    wait_any({&a, &b});
  });
  sim.spawn("dma", [&] {
    r.acquire(2);
    this_process::sleep(ns(1));
    r.acquire(1);  // holds both units and asks for a third: waits forever
  });
  sim.spawn("rank2", [&] { bar.arrive_and_wait(); });
  try {
    sim.run();
    FAIL() << "expected a deadlock";
  } catch (const DeadlockError& e) {
    const std::string msg = e.what();
    ASSERT_EQ(e.blocked().size(), 4u) << msg;
    EXPECT_EQ(e.blocked()[0].process, "rank0");
    EXPECT_EQ(e.blocked()[0].waits_on, "Event 'grad.ready'");
    EXPECT_EQ(e.blocked()[1].waits_on, "any of [Event 'grad.ready', Event 'weights.loaded']");
    EXPECT_EQ(e.blocked()[1].since, ns(4));
    EXPECT_EQ(e.blocked()[2].waits_on, "Resource 'hbm.port' (1 units) (0 of 2 free, 1 queued)");
    EXPECT_EQ(e.blocked()[3].waits_on, "Barrier 'step.barrier' (1 of 3 arrived)");
    EXPECT_NE(msg.find("deadlock at 4.000 ns"), std::string::npos) << msg;
  }
  EXPECT_EQ(sim.processes_live(), 0u);
}

TEST(Simulator, BlockingOutsideAProcessIsAClearError) {
  Event e("x");
  try {
    e.wait();
    FAIL();
  } catch (const NotInProcessError& err) {
    EXPECT_NE(std::string(err.what()).find("Event::wait()"), std::string::npos);
  }
  EXPECT_THROW(this_process::sleep(ns(1)), NotInProcessError);
  Simulator sim;
  Resource r(1, "r");
  sim.at(ns(1), [&] { r.acquire(); });  // a callback is not a process
  try {
    sim.run();
    FAIL();
  } catch (const NotInProcessError& err) {
    EXPECT_NE(std::string(err.what()).find("Resource::acquire()"), std::string::npos) << err.what();
  }
}

TEST(Simulator, HundredThousandProcessesFinishWithoutLeaks) {
  Tracked::live = 0;
  SimulatorOptions o;
  o.stack_size = 32 * 1024;
  Simulator sim(o);
  std::uint64_t sum = 0;
  constexpr int kN = 100000;
  sim.spawn("spawner", [&] {
    for (int i = 0; i < kN; ++i) {
      sim.spawn("p", [&sum, i] {
        Tracked t;
        this_process::sleep(ps(i % 1000));
        sum += static_cast<std::uint64_t>(i);
      });
      if (i % 1000 == 999) this_process::sleep(ps(2000));  // waves: the pool recycles stacks
    }
  });
  sim.run();
  EXPECT_EQ(sum, std::uint64_t{kN} * (kN - 1) / 2);
  EXPECT_EQ(sim.processes_spawned(), std::uint64_t{kN} + 1);
  EXPECT_EQ(sim.processes_live(), 0u);
  EXPECT_EQ(Tracked::live, 0);
  EXPECT_LE(sim.stacks_allocated(), 2100u);  // at most ~2 waves alive at once
}

// A simulator takes the stacks an earlier one left (a sweep runs thousands of short simulations):
// no new mapping, and the processes on the reused stacks run as on fresh ones.
TEST(Simulator, ReusesTheStacksOfAnEarlierSimulator) {
  SimulatorOptions o;
  o.stack_size = 44 * 4096;  // a size no other simulator in this test uses
  auto run = [&](std::uint64_t seed, std::size_t* mapped) {
    Simulator sim(o);
    std::uint64_t sum = 0;
    for (int i = 0; i < 12; ++i) {
      sim.spawn("p", [&sum, i, seed] {
        volatile char deep[8192];  // touch the stack well below its top
        deep[0] = static_cast<char>(i);
        this_process::sleep(ps(1 + (seed * 7 + static_cast<std::uint64_t>(i)) % 5));
        sum += seed * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(deep[0]);
      });
    }
    sim.run();
    EXPECT_EQ(sim.stacks_allocated(), 12u);
    *mapped = sim.stacks_mapped();
    return sum;
  };
  std::size_t first = 0, second = 0;
  EXPECT_EQ(run(3, &first), 3u * 66u + 66u);
  EXPECT_LE(first, 12u);  // 12 unless an earlier test in this process left stacks of this size
  EXPECT_EQ(run(5, &second), 5u * 66u + 66u);
  EXPECT_EQ(second, 0u);  // all twelve from the cache
  SimulatorOptions other = o;
  other.stack_size = 45 * 4096;  // another size: not interchangeable
  Simulator sim(other);
  sim.spawn("q", [] {});
  sim.run();
  EXPECT_LE(sim.stacks_mapped(), 1u);
  EXPECT_EQ(sim.stacks_allocated(), 1u);
}

TEST(Simulator, TeardownUnwindsBlockedProcesses) {
  Tracked::live = 0;
  Event never("never");
  {
    Simulator sim;
    for (int i = 0; i < 5; ++i) sim.spawn("w", [&] {
      Tracked t;
      never.wait();
    });
    sim.spawn("late", [&] {
      Tracked t;
      this_process::sleep(ms(1));
    });
    sim.run_until(us(1));
    EXPECT_EQ(Tracked::live, 6);
    EXPECT_EQ(sim.processes_live(), 6u);
  }
  EXPECT_EQ(Tracked::live, 0);
  EXPECT_EQ(never.waiting(), 0u);
}

TEST(Simulator, RunUntilThenRunContinues) {
  Simulator sim;
  std::vector<Time> seen;
  sim.spawn("p", [&] {
    for (int i = 0; i < 5; ++i) {
      this_process::sleep(ns(10));
      seen.push_back(sim.now());
    }
  });
  sim.run_until(ns(25));
  EXPECT_EQ(seen.size(), 2u);
  sim.run();
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(sim.now(), ns(50));
}

TEST(Simulator, ProtectedStacksRun) {
  SimulatorOptions o;
  o.protected_stacks = true;
  Simulator sim(o);
  int n = 0;
  for (int i = 0; i < 10; ++i) sim.spawn("p", [&] {
    volatile char buf[8192];
    buf[0] = 1;
    this_process::sleep(ns(1));
    n += buf[0];
  });
  sim.run();
  EXPECT_EQ(n, 10);
}

TEST(Simulator, TooSmallStackIsRejected) {
  SimulatorOptions o;
  o.stack_size = 1024;
  EXPECT_THROW(Simulator s(o), std::invalid_argument);
}

// Simulator::off_stack: work that does not block runs on the scheduler's stack and comes back
// with its result or its exception; from a callback, nested or outside a run it runs in place.
TEST(Simulator, OffStackCallsReturnTheirResultOnAnotherStackAndRethrow) {
  Simulator sim;
  std::vector<std::string> log;
  auto sp = [] {
    char c;
    return reinterpret_cast<std::uintptr_t>(&c);
  };
  for (int r = 0; r < 3; ++r) {
    sim.spawn(fmt::format("p{}", r), [&, r] {
      const std::uintptr_t mine = sp();
      this_process::sleep(r + 1);
      // A result of a type with a destructor, built on the other stack.
      const std::string s = sim.off_stack([&] {
        const std::uintptr_t there = sp();
        const bool moved = there + 65536 < mine || there > mine + 65536;
#if defined(__x86_64__) && defined(__ELF__) && !defined(__CET__) && !defined(CUBESIM_ASAN)
        EXPECT_TRUE(moved) << "off_stack ran on the process's own stack";
#endif
        EXPECT_TRUE(sim.in_off_stack_call());
        // Nested: runs in place.
        const int nested = sim.off_stack([&] { return static_cast<int>(there - sp() < 4096 ? 7 : 8); });
        EXPECT_EQ(nested, 7);
        return fmt::format("p{} at {} moved {}", r, sim.now(), moved ? 1 : 0);
      });
      EXPECT_FALSE(sim.in_off_stack_call());
      log.push_back(s.substr(0, s.rfind(' ')));
      // An exception thrown there comes out here, with its message.
      try {
        sim.off_stack([&] { throw std::runtime_error(fmt::format("thrown by p{}", r)); });
        ADD_FAILURE() << "no exception";
      } catch (const std::runtime_error& e) {
        log.push_back(e.what());
      }
      // The process goes on blocking and resuming normally afterwards.
      this_process::sleep(10);
      sim.off_stack([&] { log.push_back(fmt::format("p{} again at {}", r, sim.now())); });
    });
  }
  // From a callback: in place (the scheduler's stack already).
  sim.at(2, [&] { log.push_back(fmt::format("callback {}", sim.off_stack([] { return 41 + 1; }))); });
  sim.run();
  EXPECT_EQ(log, (std::vector<std::string>{"p0 at 1 moved", "thrown by p0", "callback 42", "p1 at 2 moved", "thrown by p1",
                                           "p2 at 3 moved", "thrown by p2", "p0 again at 11", "p1 again at 12",
                                           "p2 again at 13"}));
  // Outside run(): in place.
  EXPECT_EQ(sim.off_stack([] { return 5; }), 5);
}

TEST(SimulatorDeathTest, BlockingInsideAnOffStackCallIsAnInternalError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Simulator sim;
        sim.spawn("p", [&] { sim.off_stack([] { this_process::sleep(1); }); });
        sim.run();
      },
      "blocked inside Simulator::off_stack");
}

TEST(Simulator, CallbacksAndProcessesInterleaveByTime) {
  Simulator sim;
  std::vector<int> order;
  sim.at(ns(5), [&] { order.push_back(1); });
  sim.spawn("p", [&] {
    this_process::sleep(ns(5));
    order.push_back(2);
  });
  sim.at(ns(5), [&] { order.push_back(3); }, -1);  // higher priority: first at 5 ns
  sim.run();
  EXPECT_EQ(order, (std::vector<int>{3, 1, 2}));
}

// A process that blocks hands over directly to the next process when that is the queue's next
// event, and goes back to the scheduler otherwise; either way the queue's order holds. At every
// 10 ns: a callback of priority -1 first, then the priority-0 events by insertion (the processes'
// wake-ups in the order they went to sleep; at 10 ns a callback pushed before the run, so before
// them), then one of priority +1. p1 yields after its turn, so it runs again after the others due
// then, and its next wake-up is pushed after p2's.
TEST(Simulator, DirectHandOversKeepTheQueueOrder) {
  Simulator sim;
  std::vector<std::string> log;
  auto note = [&](const std::string& what) { log.push_back(fmt::format("{} {}", sim.now() / ns(1), what)); };
  for (int i = 0; i < 3; ++i) {
    sim.spawn(fmt::format("p{}", i), [&, i] {
      for (int round = 0; round < 3; ++round) {
        this_process::sleep(ns(10));
        note(fmt::format("p{}", i));
        if (i == 1) {
          this_process::yield();
          note("p1 again");
        }
      }
    });
  }
  for (int t = 10; t <= 30; t += 10) {
    sim.at(ns(t), [&] { note("early"); }, -1);
    sim.at(ns(t), [&] { note("late"); }, 1);
  }
  sim.at(ns(10), [&] { note("default"); });  // pushed after the processes' first wake-ups
  sim.run();
  const std::vector<std::string> expect = {
      "10 early", "10 default", "10 p0", "10 p1", "10 p2", "10 p1 again", "10 late",  //
      "20 early", "20 p0", "20 p2", "20 p1", "20 p1 again", "20 late",                //
      "30 early", "30 p0", "30 p2", "30 p1", "30 p1 again", "30 late"};
  EXPECT_EQ(log, expect);
}

// Callbacks that say they did nothing (superseded wake-ups) at the end of a run do not move its
// end: now() goes back to the last event that did something. A no-op followed by real work, or a
// no-op before pending events, changes nothing.
TEST(Simulator, ANoOpTailDoesNotMoveTheEndOfARun) {
  Simulator sim;
  int work = 0;
  sim.at(100, [&] { ++work; });
  sim.at(150, [&] { sim.note_noop_event(); });  // a no-op between real events: no effect
  sim.at(200, [&] { ++work; });
  sim.at(5000, [&] { sim.note_noop_event(); });
  sim.at(9000, [&] { sim.note_noop_event(); });
  sim.run();
  EXPECT_EQ(work, 2);
  EXPECT_EQ(sim.now(), 200u);
  EXPECT_EQ(sim.events_executed(), 5u);
  // The next run goes on from there; an event that did something last keeps the clock where it is.
  sim.at(300, [&] { sim.note_noop_event(); });
  sim.at(400, [&] { ++work; });
  sim.run();
  EXPECT_EQ(sim.now(), 400u);
  // A process's wake-up after a no-op is real work: the clock stays at the process's time.
  sim.at(450, [&] { sim.note_noop_event(); });
  sim.spawn("p", [&] { this_process::sleep(100); ++work; });
  sim.run();
  EXPECT_EQ(sim.now(), 500u);
  EXPECT_EQ(work, 4);
}

}  // namespace
}  // namespace cubesim::sim
