// The nccl collective family (runtime/algorithms/nccl.h): NCCL's choice of algorithm and protocol
// by size, the model's formula, the simulated time of a call against a hand-computed one, bitwise
// equality with the ring/tree orders it follows, the plan in op records, and the errors of the
// topology's "nccl" section.
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "collective_harness.h"
#include "runtime/algorithms/nccl.h"
#include "runtime/errors.h"
#include "runtime/sim_backend.h"
#include "sim/hw/errors.h"
#include "sim/hw/topology.h"

namespace cubesim::rt::testing {
namespace {

using algo::Collective;
using algo::NcclAlgo;
using hw::NcclProtocol;
using json = nlohmann::json;

void expect_error_contains(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
    }
  }
}

Factory sim_with(const hw::Topology& topo) {
  return [topo](int ranks) {
    ContextOptions o;
    o.world_size = ranks;
    o.stack_size = 64 * 1024;
    o.record_ops = true;
    return make_sim_context(o, topo, {.check_uninitialized = true});
  };
}

// ---------------------------------------------------------------- selection

TEST(NcclSelection, LLForTinyMessagesSimpleForLargeOnes) {
  const hw::NcclSpec& d = hw::NcclSpec::defaults();
  const hw::NcclSpec& shipped = hw::load_topology("h200x4").nccl;
  EXPECT_TRUE(shipped.present);
  for (const hw::NcclSpec* s : {&d, &shipped}) {
    for (int p : {2, 4, 8}) {
      for (Collective k : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter}) {
        const algo::NcclPlan small = algo::nccl_plan(k, p, 1024, *s);
        EXPECT_EQ(small.protocol, NcclProtocol::ll) << p << " ranks, " << small.describe();
        EXPECT_EQ(small.algo, NcclAlgo::ring);
        const algo::NcclPlan big = algo::nccl_plan(k, p, 1ull << 30, *s);
        EXPECT_EQ(big.protocol, NcclProtocol::simple) << p << " ranks, " << big.describe();
        EXPECT_EQ(big.algo, NcclAlgo::ring);
        EXPECT_EQ(big.channels, 16);
      }
    }
  }
  // The shipped section holds NCCL's defaults: the same plan as a topology without one.
  for (std::uint64_t b = 64; b <= (1ull << 30); b *= 2) {
    EXPECT_EQ(algo::nccl_plan(Collective::all_reduce, 8, b, d).describe(),
              algo::nccl_plan(Collective::all_reduce, 8, b, shipped).describe());
  }
}

// The smallest power of two from 1 KiB on where the plan leaves LL.
std::uint64_t ll_boundary(const hw::NcclSpec& s, int p) {
  for (std::uint64_t b = 1024; b <= (1ull << 32); b *= 2) {
    if (algo::nccl_plan(Collective::all_reduce, p, b, s).protocol != NcclProtocol::ll) return b;
  }
  return 0;
}

TEST(NcclSelection, TheBoundaryMovesWithTheFigures) {
  hw::NcclSpec s = hw::NcclSpec::defaults();
  const std::uint64_t b0 = ll_boundary(s, 4);
  ASSERT_GT(b0, 1024u);
  // Dearer LL128 and Simple calls keep LL longer.
  s.protocols[1].base_latency[0] = s.protocols[2].base_latency[0] = sim::from_ns(60000);
  const std::uint64_t b1 = ll_boundary(s, 4);
  EXPECT_GT(b1, b0);
  // A slower LL hop moves it the other way.
  hw::NcclSpec t = hw::NcclSpec::defaults();
  t.protocols[0].hop_latency[0] = sim::from_ns(3000);
  EXPECT_LT(ll_boundary(t, 4), b0);
  // Only Simple enabled: always Simple.
  hw::NcclSpec u = hw::NcclSpec::defaults();
  u.protocols[0].enabled = u.protocols[1].enabled = false;
  EXPECT_EQ(algo::nccl_plan(Collective::all_reduce, 4, 64, u).protocol, NcclProtocol::simple);
}

TEST(NcclSelection, PredictedTimeIsNcclsFormula) {
  const hw::NcclSpec& d = hw::NcclSpec::defaults();
  // all_reduce, 4 ranks, 1 MiB, ring/Simple: base 8.4 + 6 steps x 3.4 + bytes / (16 x 20.6 GB/s x 4/6).
  const double simple = 8.4 + 6 * 3.4 + 1048576.0 / (16 * 20.6 * 4.0 / 6.0 * 1e3);
  EXPECT_NEAR(algo::nccl_predicted_us(Collective::all_reduce, 4, 1 << 20, NcclAlgo::ring, NcclProtocol::simple, d),
              simple, 1e-9);
  // ring/LL: half the bandwidth on the wire, capped at 141 GB/s bus.
  const double ll = 6.6 + 6 * 0.6 + 1048576.0 / (std::min(16 * 20.6 * 0.5, 141.0) * 4.0 / 6.0 * 1e3);
  EXPECT_NEAR(algo::nccl_predicted_us(Collective::all_reduce, 4, 1 << 20, NcclAlgo::ring, NcclProtocol::ll, d), ll,
              1e-9);
  // tree/LL128: 2(p-1) hops of 1.25, bus x 0.92 x 7/9 / 2.
  const double tree = 14.0 + 6 * 1.25 + 1048576.0 / (16 * 20.6 * 120.0 / 128.0 * 0.92 * 7.0 / 9.0 / 2 * 1e3);
  EXPECT_NEAR(algo::nccl_predicted_us(Collective::all_reduce, 4, 1 << 20, NcclAlgo::tree, NcclProtocol::ll128, d),
              tree, 1e-6);
  // all_gather: p-1 steps, no tree.
  EXPECT_LT(algo::nccl_predicted_us(Collective::all_gather, 4, 1 << 20, NcclAlgo::tree, NcclProtocol::simple, d), 0);
  const double ag = 8.4 + 3 * 3.4 + 1048576.0 / (16 * 20.6 * 4.0 / 3.0 * 1e3);
  EXPECT_NEAR(algo::nccl_predicted_us(Collective::all_gather, 4, 1 << 20, NcclAlgo::ring, NcclProtocol::simple, d), ag,
              1e-9);
  // The plan is the minimum over the candidates.
  const algo::NcclPlan pl = algo::nccl_plan(Collective::all_reduce, 4, 1 << 20, d);
  for (NcclAlgo a : {NcclAlgo::ring, NcclAlgo::tree}) {
    for (NcclProtocol p : hw::kNcclProtocols) {
      const double t = algo::nccl_predicted_us(Collective::all_reduce, 4, 1 << 20, a, p, d);
      if (t >= 0) {
        EXPECT_LE(pl.predicted_us, t);
      }
    }
  }
}

// ---------------------------------------------------------------- simulated time

// Two cubes, one link each way (100 GB/s, 1 us), memories without latency and very fast, one big
// network chunk; an nccl section with one channel and round latencies.
json tiny_doc() {
  json d = hw::load_topology_json("h200x4");
  d["name"] = "nccl_tiny";
  d["cubes"] = 2;
  d.erase("host");
  d["cube"].erase("l2");  // no cache: the hand-computed time has no L2 stage
  d["cube"]["hbm"] = {{"capacity_GB", 1}, {"bandwidth_GBps", 1e6}, {"latency_ns", 0}, {"channels", 1}, {"interleave_bytes", 256}};
  d["network"] = {{"kind", "full"},
                  {"chunk_bytes", 1 << 30},
                  {"link", {{"bandwidth_GBps", 100}, {"latency_ns", 1000}, {"overhead_ns", 0}}}};
  json lat = {{"ring", 0}, {"tree", 0}};
  json proto = {{"base_latency_ns", {{"ring", 5000}, {"tree", 5000}}},
                {"hop_latency_ns", {{"ring", 2000}, {"tree", 2000}}},
                {"slice_bytes", 1 << 30}};
  d["nccl"] = {{"launch_latency_ns", 1000}, {"channels", 1}, {"algorithms", {"ring"}}, {"protocols", json::object()}};
  for (const char* p : {"LL", "LL128", "Simple"}) d["nccl"]["protocols"][p] = proto;
  return d;
}

sim::Time all_gather_time(const json& doc, std::int64_t n_per_rank) {
  const hw::Topology topo = hw::topology_from_json(doc, "tiny");
  CollCase c{"all_gather", Algorithm::nccl, DType::f32, 2, n_per_rank};
  return run_collective(sim_with(topo), c).report.sim_time;
}

TEST(NcclTiming, LaunchHopsAndWireBytesAsHandComputed) {
  const std::int64_t n = 1 << 18;  // 1 MiB of f32 per rank: one step of 1 MiB each way
  const double payload = static_cast<double>(n) * 4;
  for (const char* only : {"Simple", "LL"}) {
    json d = tiny_doc();
    for (const char* p : {"LL", "LL128", "Simple"}) d["nccl"]["protocols"][p]["enabled"] = std::string(p) == only;
    const double wire = std::string(only) == "LL" ? 2.0 : 1.0;
    // launch 1 us + base 5 us + one hop 2 us + link latency 1 us + wire bytes at 100 GB/s.
    const double expected_ps = (1000 + 5000 + 2000 + 1000) * 1e3 + payload * wire / 100e9 * 1e12;
    const double got = static_cast<double>(all_gather_time(d, n));
    EXPECT_NEAR(got, expected_ps, 5e3) << only << ": simulated " << sim::format_time(static_cast<sim::Time>(got));
  }
  // LL128: 128 wire bytes per 120.
  json d = tiny_doc();
  d["nccl"]["protocols"]["LL"]["enabled"] = false;
  d["nccl"]["protocols"]["Simple"]["enabled"] = false;
  const double expected_ps = 9000e3 + std::ceil(payload * 128 / 120) / 100e9 * 1e12;
  EXPECT_NEAR(static_cast<double>(all_gather_time(d, n)), expected_ps, 5e3);
}

TEST(NcclTiming, ChannelsShareTheLink) {
  json d = tiny_doc();
  d["nccl"]["protocols"]["LL"]["enabled"] = false;
  d["nccl"]["protocols"]["LL128"]["enabled"] = false;
  const sim::Time one = all_gather_time(d, 1 << 18);
  d["nccl"]["channels"] = 4;
  const sim::Time four = all_gather_time(d, 1 << 18);
  // Four channels over one link: the same bytes at the same bandwidth, latencies overlapped.
  EXPECT_NEAR(static_cast<double>(four), static_cast<double>(one), 0.001 * static_cast<double>(one));
}

// The physical figures (fixed_latency_ns, send_latency_ns, copy_bandwidth_GBps) replace the tuning
// figures in the simulated time and leave NCCL's choice alone.
TEST(NcclTiming, PhysicalFiguresAsHandComputed) {
  const std::int64_t n = 1 << 18;  // 1 MiB of f32 per rank: one step, one slice
  const double payload = static_cast<double>(n) * 4;
  json d = tiny_doc();
  d["nccl"]["protocols"]["LL"]["enabled"] = false;
  d["nccl"]["protocols"]["LL128"]["enabled"] = false;
  json& s = d["nccl"]["protocols"]["Simple"];
  s["fixed_latency_ns"] = 3000;      // instead of base 5 us
  s["send_latency_ns"] = 500;        // instead of hop 2 us
  s["copy_bandwidth_GBps"] = 50;     // the received slice is copied into the output after it lands
  s["send_bandwidth_GBps"] = 1000;   // one send: spaces nothing
  // launch 1 us + fixed 3 us + send latency 0.5 us + link latency 1 us + payload at 100 GB/s, then
  // the copy of the payload at 50 GB/s.
  const double expected_ps = (1000 + 3000 + 500 + 1000) * 1e3 + payload / 100e9 * 1e12 + payload / 50e9 * 1e12;
  EXPECT_NEAR(static_cast<double>(all_gather_time(d, n)), expected_ps, 5e3);
  // NCCL's choice reads the tuning figures only.
  const hw::Topology with = hw::topology_from_json(d, "t");
  json plain = tiny_doc();
  plain["nccl"]["protocols"]["LL"]["enabled"] = false;
  plain["nccl"]["protocols"]["LL128"]["enabled"] = false;
  const hw::Topology without = hw::topology_from_json(plain, "t");
  EXPECT_EQ(algo::nccl_predicted_us(Collective::all_gather, 2, 1 << 20, NcclAlgo::ring, NcclProtocol::simple, with.nccl),
            algo::nccl_predicted_us(Collective::all_gather, 2, 1 << 20, NcclAlgo::ring, NcclProtocol::simple, without.nccl));
}

// chunk_slices: a channel sends all slices of a chunk before it waits for a receive, so the
// second slice's latency hides behind the first's (NCCL's chunk of slices); with one slice per
// chunk the slices wait for each other.
TEST(NcclTiming, ChunkSlicesPipelineTheSteps) {
  const std::int64_t n = 1 << 18;  // 1 MiB per rank, in two slices of 512 KiB
  const double payload = static_cast<double>(n) * 4;
  json d = tiny_doc();
  d["nccl"]["protocols"]["LL"]["enabled"] = false;
  d["nccl"]["protocols"]["LL128"]["enabled"] = false;
  json& s = d["nccl"]["protocols"]["Simple"];
  s["slice_bytes"] = 1 << 19;
  s["send_bandwidth_GBps"] = 1e6;
  const double fixed = (1000 + 5000) * 1e3, hop = 2000e3, link = 1000e3, half = payload / 2 / 100e9 * 1e12;
  // One slice per chunk: each slice pays hop + link latency + its bytes, one after the other.
  EXPECT_NEAR(static_cast<double>(all_gather_time(d, n)), fixed + 2 * (hop + link + half), 5e3);
  // Two: both sends start after one hop and share the link.
  s["chunk_slices"] = 2;
  EXPECT_NEAR(static_cast<double>(all_gather_time(d, n)), fixed + hop + link + 2 * half, 5e3);
}

// The physical figures move no bits: the ring's order whatever the chunking and copies.
TEST(NcclValues, PhysicalFiguresKeepTheBits) {
  const hw::Topology topo = hw::load_topology(
      "h200x4", {{"nccl.rings", json::array()},
                 {"nccl.protocols.Simple.chunk_slices", 3},
                 {"nccl.protocols.Simple.slice_bytes", 4096},
                 {"nccl.protocols.Simple.copy_bandwidth_GBps", 40},
                 {"nccl.protocols.LL.copy_bandwidth_GBps", 20},
                 {"nccl.protocols.Simple.send_latency_ns", 700},
                 {"nccl.protocols.Simple.fixed_latency_ns", 9000}});
  for (const char* coll : {"all_reduce", "reduce_scatter", "all_gather"}) {
    for (std::int64_t n : {std::int64_t{1001}, std::int64_t{300001}}) {
      CollCase c{coll, Algorithm::nccl, DType::bf16, 3, n};
      c.seed = static_cast<std::uint64_t>(n) + 7;
      const CollResult sr = run_collective(sim_with(topo), c);
      CollCase ring = c;
      ring.algo = Algorithm::ring;
      const CollResult h = run_collective(host_context, ring);
      for (int k = 0; k < 3; ++k) ASSERT_EQ(sr.out_bytes[k], h.out_bytes[k]) << c.name() << " rank " << k;
    }
  }
}

// ---------------------------------------------------------------- values and plans

TEST(NcclValues, BitwiseTheRingOrTreeItRuns) {
  // Rings in group order (h200x4 ships other orders: NcclValues.RingOrdersAsDocumented).
  const hw::Topology topo = hw::load_topology("h200x4", {{"nccl.rings", json::array()}});
  const hw::Topology trees = hw::load_topology("h200x4", {{"nccl.algorithms", json::array({"tree"})}});
  // Sizes that pick LL, LL128 and Simple on 4 ranks; odd counts.
  for (std::int64_t n : {std::int64_t{1001}, std::int64_t{300001}, std::int64_t{4000001}}) {
    for (DType d : {DType::bf16, DType::f32}) {
      CollCase c{"all_reduce", Algorithm::nccl, d, 4, n};
      c.seed = static_cast<std::uint64_t>(n);
      const CollResult s = run_collective(sim_with(topo), c);
      CollCase ring = c;
      ring.algo = Algorithm::ring;
      const CollResult h = run_collective(host_context, ring);
      for (int k = 0; k < 4; ++k) ASSERT_EQ(s.out_bytes[k], h.out_bytes[k]) << c.name() << " rank " << k;
      const CollResult st = run_collective(sim_with(trees), c);
      CollCase tree = c;
      tree.algo = Algorithm::tree;
      const CollResult ht = run_collective(host_context, tree);
      for (int k = 0; k < 4; ++k) ASSERT_EQ(st.out_bytes[k], ht.out_bytes[k]) << c.name() << " (trees) rank " << k;
    }
  }
  for (const char* coll : {"reduce_scatter", "all_gather", "broadcast"}) {
    CollCase c{coll, Algorithm::nccl, DType::bf16, 3, 200001};
    c.root = 2;
    const CollResult s = run_collective(sim_with(topo), c);
    CollCase ring = c;
    ring.algo = Algorithm::ring;
    const CollResult h = run_collective(host_context, ring);
    for (int k = 0; k < 3; ++k) ASSERT_EQ(s.out_bytes[k], h.out_bytes[k]) << c.name() << " rank " << k;
  }
}

// Ring orders per channel (nccl.h): chunk c (owned by member c) is summed along channel ch's ring R
// starting after c: x[R[i+1]] + x[R[i+2]] + ... + x[c], where R[i] = c; replayed independently.
TEST(NcclValues, RingOrdersAsDocumented) {
  const hw::Topology topo = hw::load_topology("h200x4");
  ASSERT_EQ(topo.nccl.rings.size(), 6u);
  const int p = 4;
  for (DType d : {DType::bf16, DType::f32}) {
    for (std::int64_t n : {std::int64_t{1001}, std::int64_t{400003}}) {
      CollCase c{"all_reduce", Algorithm::nccl, d, p, n};
      c.seed = static_cast<std::uint64_t>(n) + 7;
      const CollResult s = run_collective(sim_with(topo), c);
      const int planned =
          algo::nccl_plan(Collective::all_reduce, p, static_cast<std::uint64_t>(n) * dtype_size(d), topo.nccl).channels;
      const int C = static_cast<int>(std::clamp<std::int64_t>(n / p, 1, planned));
      std::vector<float> want(static_cast<std::size_t>(n));
      for (int ch = 0; ch < C; ++ch) {
        const std::vector<int>& R = topo.nccl.rings[static_cast<std::size_t>(ch % 6)];
        for (int i = 0; i < p; ++i) {
          const int owner = R[static_cast<std::size_t>(i)];
          const Range cr = chunk_range(n, p, owner);
          const Range pc = chunk_range(cr.count, C, ch);
          for (std::int64_t e = cr.begin + pc.begin; e < cr.begin + pc.begin + pc.count; ++e) {
            float acc = s.inputs[static_cast<std::size_t>(R[static_cast<std::size_t>((i + 1) % p)])][e];
            for (int k = 2; k <= p; ++k) {
              acc = round_to(d, acc + s.inputs[static_cast<std::size_t>(R[static_cast<std::size_t>((i + k) % p)])][e]);
            }
            want[static_cast<std::size_t>(e)] = acc;
          }
        }
      }
      for (int k = 0; k < p; ++k) ASSERT_EQ(s.out[static_cast<std::size_t>(k)], want) << c.name() << " rank " << k;
      // reduce_scatter: member k ends with chunk k, in the same order.
      CollCase rs{"reduce_scatter", Algorithm::nccl, d, p, n / p};
      rs.seed = c.seed;
      const CollResult r = run_collective(sim_with(topo), rs);
      const CollResult h = run_collective(
          [&](int ranks) {
            ContextOptions o;
            o.world_size = ranks;
            o.stack_size = 64 * 1024;
            o.nccl = topo.nccl;
            return std::make_unique<Context>(o);
          },
          rs);
      for (int k = 0; k < p; ++k) ASSERT_EQ(r.out_bytes[static_cast<std::size_t>(k)], h.out_bytes[static_cast<std::size_t>(k)]);
    }
  }
}

// A host given the section (ContextOptions::nccl) plans as the simulated run: here, trees.
TEST(NcclValues, AHostGivenTheSectionReplaysIt) {
  const hw::Topology trees = hw::load_topology("h200x4", {{"nccl.algorithms", json::array({"tree"})}});
  Factory host_trees = [&](int ranks) {
    ContextOptions o;
    o.world_size = ranks;
    o.stack_size = 64 * 1024;
    o.nccl = trees.nccl;
    return std::make_unique<Context>(o);
  };
  CollCase c{"all_reduce", Algorithm::nccl, DType::bf16, 4, 300001};
  const CollResult s = run_collective(sim_with(trees), c);
  const CollResult h = run_collective(host_trees, c);
  const CollResult plain = run_collective(host_context, c);  // defaults: a ring, other bits
  for (int k = 0; k < 4; ++k) ASSERT_EQ(s.out_bytes[k], h.out_bytes[k]) << "rank " << k;
  EXPECT_NE(s.out_bytes[0], plain.out_bytes[0]);
}

TEST(NcclValues, ThePlanShowsInOpRecords) {
  const hw::Topology topo = hw::load_topology("h200x4");
  // 512 bytes: one channel (NCCL's reduction for small calls); 128 MiB: all 16.
  for (auto [n, plan] : {std::pair<std::int64_t, std::string>{256, "nccl ring/LL x1"},
                         std::pair<std::int64_t, std::string>{std::int64_t{1} << 26, "nccl ring/Simple x16"}}) {
    auto ctx = sim_with(topo)(4);
    ctx->spawn(4, [&](int r) {
      Tensor t = ctx->zeros(r, {n}, DType::bf16);
      all_reduce(t, ReduceOp::sum, nullptr, {.algorithm = Algorithm::nccl});
    });
    ASSERT_EQ(ctx->op_records().size(), 4u);
    for (const OpRecord& o : ctx->op_records()) {
      EXPECT_NE(o.detail.find(plan), std::string::npos) << o.detail;
    }
  }
}

// NCCL's channel reduction for small calls (nccl.h): the largest nc with bytes >= nc x threads x
// threshold (x p on a ring), checked against NCCL_DEBUG=INFO's counts on 4 H200s (LL all_reduce:
// 16 KiB 1 channel, 32 KiB 2, 64 KiB 4, 128 KiB 8, 256 KiB 16, 512 KiB 24).
TEST(NcclPlan, SmallCallsUseFewerChannels) {
  hw::NcclSpec s = hw::NcclSpec::defaults();
  s.channels = 24;
  const std::pair<std::uint64_t, int> logged[] = {{16 << 10, 1}, {32 << 10, 2}, {64 << 10, 4},
                                                  {128 << 10, 8}, {256 << 10, 16}, {512 << 10, 24}};
  for (auto [bytes, nc] : logged) {
    EXPECT_EQ(algo::nccl_channels(NcclAlgo::ring, NcclProtocol::ll, 4, bytes, s), nc) << bytes;
  }
  // Simple's threshold is 8x LL's; a tree's is not multiplied by the ranks; tiny calls keep one.
  EXPECT_EQ(algo::nccl_channels(NcclAlgo::ring, NcclProtocol::simple, 4, 1 << 20, s), 8);
  EXPECT_EQ(algo::nccl_channels(NcclAlgo::tree, NcclProtocol::simple, 4, 1 << 20, s), 24);
  EXPECT_EQ(algo::nccl_channels(NcclAlgo::ring, NcclProtocol::ll, 4, 8, s), 1);
  // The plan carries the count; a section whose thresholds are 0 keeps every channel.
  EXPECT_EQ(algo::nccl_plan(Collective::all_reduce, 4, 64 << 10, s).channels, 4);
  for (hw::NcclProtocolSpec& f : s.protocols) f.thread_threshold = 0;
  EXPECT_EQ(algo::nccl_plan(Collective::all_reduce, 4, 64 << 10, s).channels, 24);
}

// ---------------------------------------------------------------- errors

TEST(NcclErrors, TheSectionsErrorsNameThePathAndTheValidChoices) {
  auto with = [](const std::string& path, const json& v) {
    return [path, v] { hw::load_topology("h200x4", {{path, v}}); };
  };
  // A protocol the file does not define: apply_override names the path and the protocols there.
  expect_error_contains(with("nccl.protocols.LL64.enabled", true),
                        {"nccl.protocols has no field 'LL64'", "LL", "LL128", "Simple"});
  json d = hw::load_topology_json("h200x4");
  d["nccl"]["protocols"]["LL64"] = {{"enabled", true}};
  expect_error_contains([&] { hw::topology_from_json(d, "t"); },
                        {"nccl.protocols", "unknown key 'LL64'", "valid keys here: LL, LL128, Simple"});
  expect_error_contains(with("nccl.algorithms", json::array({"ring", "rings"})),
                        {"nccl.algorithms.1", "unknown algorithm \"rings\"", "valid: ring, tree"});
  expect_error_contains(with("nccl.protocols.LL.wire_bytes", 4), {"nccl.protocols.LL.wire_bytes", "data_bytes 8"});
  expect_error_contains(with("nccl.channels", 0), {"nccl.channels", "integer from 1 to 64"});
  expect_error_contains(with("nccl.rings", json::array({"0 1 2 3", "0 1 1 3"})),
                        {"nccl.rings.1", "\"0 1 1 3\" is not valid", "permutation of 0..p-1"});
  expect_error_contains(with("nccl.protocols.Simple.chunk_slices", 0),
                        {"nccl.protocols.Simple.chunk_slices", "integer from 1 to 64"});
  expect_error_contains(with("nccl.protocols.LL.copy_bandwidth_GBps", -3), {"nccl.protocols.LL.copy_bandwidth_GBps", "-3"});
  expect_error_contains(with("nccl.protocols.LL128.send_latency_ns", "soon"), {"nccl.protocols.LL128.send_latency_ns"});
  json off = hw::load_topology_json("h200x4");
  for (const char* p : {"LL", "LL128", "Simple"}) off["nccl"]["protocols"][p]["enabled"] = false;
  expect_error_contains([&] { hw::topology_from_json(off, "t"); }, {"nccl.protocols", "enable at least one"});
}

TEST(NcclErrors, ACollectiveTheFiguresDoNotAllowIsRefused) {
  const hw::Topology trees = hw::load_topology("h200x4", {{"nccl.algorithms", json::array({"tree"})}});
  auto ctx = sim_with(trees)(2);
  expect_error_contains(
      [&] {
        ctx->spawn(2, [&](int r) {
          Tensor in = ctx->zeros(r, {8}, DType::f32);
          Tensor out = ctx->zeros(r, {16}, DType::f32);
          all_gather(out, in, nullptr, {.algorithm = Algorithm::nccl});
        });
      },
      {"nccl all_gather", "nccl.algorithms: tree", "add \"ring\" to nccl.algorithms"});
}

}  // namespace
}  // namespace cubesim::rt::testing
