// Collectives on the simulated backend: the same cases as on the host, bitwise equal to the host
// run (the replay of the same order); ring all-reduce time equal to the alpha-beta formula; and
// timing-only runs that keep every time.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "collective_harness.h"
#include "runtime/errors.h"
#include "sim/core/interrupt.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"

namespace cubesim::rt::testing {
namespace {

Factory sim_on(hw::Topology topo, bool timing_only = false) {
  return [topo, timing_only](int ranks) {
    ContextOptions o;
    o.world_size = ranks;
    o.stack_size = 64 * 1024;
    return make_sim_context(o, topo, {.timing_only = timing_only, .check_uninitialized = true});
  };
}
Factory sim_on(const std::string& topo, bool timing_only = false) { return sim_on(hw::load_topology(topo), timing_only); }

// A shipped topology with its cubes' L2 caches taken out.
hw::Topology without_l2(const std::string& name) {
  nlohmann::json doc = hw::load_topology_json(name);
  doc["cube"].erase("l2");
  return hw::topology_from_json(doc, name + " without L2");
}

class SimCollectives : public ::testing::TestWithParam<CollCase> {};

TEST_P(SimCollectives, BitwiseEqualToHostReplay) {
  const CollCase c = GetParam();
  const CollResult h = run_collective(host_context, c);
  const CollResult s = run_collective(sim_on("mesh4x4"), c);
  for (int k = 0; k < c.ranks; ++k) {
    ASSERT_EQ(s.out_bytes[static_cast<std::size_t>(k)], h.out_bytes[static_cast<std::size_t>(k)]) << "rank " << k;
  }
  EXPECT_GT(s.report.sim_time, 0u);
  EXPECT_EQ(h.report.sim_time, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllCases, SimCollectives, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });

// Ring all-reduce: 2(p-1) steps, each one chunk over one idle path: T = 2(p-1) * path.time(chunk).
// Path figures are the cold path's: with L2 caches a step that reads what its cube's L2 still holds
// is faster, by at most the HBM's read latency, so there T lies between that and the formula.
void expect_alpha_beta(const hw::Topology& topo, int p, std::int64_t n, DType d) {
  auto ctx = sim_on(topo)(p);
  auto& be = static_cast<SimBackend&>(ctx->backend());
  const hw::PathFigures fig = be.system().path_figures(be.system().hbm(0), be.system().hbm(1));
  std::mt19937_64 rng(3);
  std::vector<std::vector<float>> in;
  for (int r = 0; r < p; ++r) in.push_back(random_values(n, d, rng));
  const RunReport rep = ctx->spawn(p, [&](int r) {
    Tensor t = ctx->from_host_f32(r, {n}, d, in[static_cast<std::size_t>(r)]);
    all_reduce(t, ReduceOp::sum, nullptr, {.algorithm = Algorithm::ring});
  });
  const std::uint64_t chunk = static_cast<std::uint64_t>(n / p) * dtype_size(d);
  const double expected = 2.0 * (p - 1) * static_cast<double>(fig.time(chunk));
  const double got = static_cast<double>(rep.sim_time);
  const std::string what = fmt::format("{}: simulated {}, alpha-beta {} us (alpha {}, {} GB/s)", topo.name,
                                       sim::format_time(rep.sim_time), expected / 1e6, sim::format_time(fig.alpha),
                                       fig.bandwidth.gbps());
  if (!topo.cubes[0].l2.present) {
    EXPECT_NEAR(got / expected, 1.0, 0.01) << what;
    return;
  }
  const double all_hits = 2.0 * (p - 1) * static_cast<double>(fig.time(chunk) - be.system().hbm(0).latency());
  EXPECT_LE(got / expected, 1.01) << what;
  EXPECT_GE(got / all_hits, 0.99) << what;
}

TEST(SimAlphaBeta, RingAllReduceOnRingTopology) { expect_alpha_beta(hw::load_topology("ring4"), 4, 4 << 20, DType::bf16); }
TEST(SimAlphaBeta, RingAllReduceOnSwitchedTopology) {
  expect_alpha_beta(without_l2("dgx_h100x8"), 8, 8 << 20, DType::bf16);
  expect_alpha_beta(hw::load_topology("dgx_h100x8"), 8, 8 << 20, DType::bf16);
}
TEST(SimAlphaBeta, RingAllReduceOnAllToAllTopology) {
  expect_alpha_beta(without_l2("h200x4"), 4, 4 << 20, DType::f32);
  expect_alpha_beta(hw::load_topology("h200x4"), 4, 4 << 20, DType::f32);
}

TEST(SimTiming, TimingOnlyKeepsEveryTime) {
  for (Algorithm a : supported_algorithms("all_reduce")) {
    CollCase c{"all_reduce", a, DType::bf16, 8, 100000};
    const CollResult f = run_collective(sim_on("mesh4x4"), c);
    const CollResult t = run_collective(sim_on("mesh4x4", true), c);
    EXPECT_EQ(f.report.sim_time, t.report.sim_time) << algorithm_name(a);
    EXPECT_EQ(f.report.events, t.report.events) << algorithm_name(a);
  }
}

// run_collective on a timing-only context takes no inputs, reads nothing back and times the
// collective between barriers exactly as a run with values does.
TEST(SimTiming, RunCollectiveTimedWithoutValues) {
  CollectiveCase c{.collective = CollectiveRequest::Kind::reduce_scatter,
                   .dtype = DType::bf16,
                   .count = 8 * 4096,
                   .ranks = 8,
                   .read_outputs = false,
                   .timed = true};
  auto timing = sim_on("mesh4x4", true)(8);
  const CollectiveOutcome t = rt::run_collective(*timing, c);
  std::mt19937_64 rng(9);
  for (int r = 0; r < 8; ++r) {
    const auto v = random_values(c.count, DType::bf16, rng);
    std::vector<std::uint8_t> b(v.size() * 2);
    convert_from_f32(v.data(), b.data(), DType::bf16, v.size());
    c.inputs.push_back(std::move(b));
  }
  auto functional = sim_on("mesh4x4")(8);  // checks for uninitialized reads, barrier tokens included
  const CollectiveOutcome f = rt::run_collective(*functional, c);
  EXPECT_TRUE(t.outputs.empty() && f.outputs.empty());
  EXPECT_EQ(t.start, f.start);
  EXPECT_EQ(t.end, f.end);
  EXPECT_EQ(t.report.events, f.report.events);
  for (std::size_t r = 0; r < 8; ++r) EXPECT_LT(t.start[r], t.end[r]) << r;
}

TEST(SimTiming, SameInputSameTimeAndTrace) {
  CollCase c{"all_reduce", Algorithm::tree, DType::bf16, 6, 50000};
  const CollResult a = run_collective(sim_on("mesh4x4"), c);
  const CollResult b = run_collective(sim_on("mesh4x4"), c);
  EXPECT_EQ(a.report.sim_time, b.report.sim_time);
  EXPECT_EQ(a.report.events, b.report.events);
  EXPECT_EQ(a.out_bytes, b.out_bytes);
}

TEST(SimErrors, OutOfHbmNamesTheAllocationAndStatistics) {
  ContextOptions o;
  o.world_size = 1;
  std::unique_ptr<Context> ctx;
  try {
    ctx = make_sim_context(o, hw::load_topology("single_cube", {{"cube.hbm.capacity_GiB", 0.001}}));
  } catch (const std::exception& e) {
    GTEST_SKIP() << "override path differs in this topology schema: " << e.what();
  }
  try {
    ctx->spawn(1, [&](int r) { ctx->empty(r, {1 << 20}, DType::f32, "activations"); });
    FAIL();
  } catch (const RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("activations"), std::string::npos) << m;
    EXPECT_NE(m.find("largest"), std::string::npos) << m;
  }
}

// Ctrl-C in the middle of collectives with transfers in flight: spawn() raises InterruptedError
// saying how far it got, and the same context then runs a correct program with correct values.
TEST(SimInterrupt, ACollectiveRunStopsAndTheContextRunsAgain) {
  auto ctx = sim_on("ring4")(4);
  try {
    ctx->spawn(4, [&](int r) {
      Tensor t = ctx->zeros(r, {1 << 20}, DType::bf16);
      for (int i = 0; i < 50; ++i) {
        if (r == 0 && i == 3) sim::request_interrupt();  // as the SIGINT handler would
        all_reduce(t);
      }
    });
    FAIL() << "spawn() should have been interrupted";
  } catch (const InterruptedError& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted (SIGINT) at simulated time"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the context can run again"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(sim::interrupt_requested());
  std::vector<float> got;
  ctx->spawn(4, [&](int r) {
    Tensor t = ctx->from_host_f32(r, {1000}, DType::f32, std::vector<float>(1000, 1.0f + static_cast<float>(r)));
    all_reduce(t);
    if (r == 0) got = t.to_host_f32();
  });
  EXPECT_EQ(got, std::vector<float>(1000, 10.0f));
}

}  // namespace
}  // namespace cubesim::rt::testing
