// Ring collectives run by callbacks in timing-only runs (runtime/algorithms/ring_callbacks.h)
// against the ranks' own per-message code: the same times on every rank, the same work on every
// unit, at both timing levels; and a skipped collective still reported by name.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/collectives.h"
#include "runtime/errors.h"
#include "runtime/run_collective.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"

namespace cubesim::rt {
namespace {

using Kind = CollectiveRequest::Kind;

struct Outcome {
  CollectiveOutcome res;
  std::uint64_t rings = 0;
};

Outcome run(const hw::Topology& topo, hw::TimingModel timing, bool callbacks, Kind k, std::int64_t count, DType d,
            int ranks, Algorithm a = Algorithm::ring) {
  ContextOptions o;
  o.stack_size = 64 * 1024;
  o.callback_collectives = callbacks;
  auto ctx = make_sim_context(o, topo, {.timing_only = true, .timing = timing});
  CollectiveCase c{.collective = k,
                   .dtype = d,
                   .count = count,
                   .options = {.algorithm = a},
                   .ranks = ranks,
                   .read_outputs = false,
                   .timed = true};
  Outcome out;
  out.res = run_collective(*ctx, c);
  out.rings = ctx->callback_rings();
  return out;
}

// same_events: also the same events (count and order hash): every case but empty last chunks.
void expect_same(const Outcome& a, const Outcome& b, const std::string& what, bool same_events = true) {
  ASSERT_EQ(a.res.start.size(), b.res.start.size()) << what;
  for (std::size_t r = 0; r < a.res.start.size(); ++r) {
    EXPECT_EQ(a.res.start[r], b.res.start[r]) << what << " rank " << r;
    EXPECT_EQ(a.res.end[r], b.res.end[r]) << what << " rank " << r;
    EXPECT_EQ(a.res.report.ranks[r].comm, b.res.report.ranks[r].comm) << what << " rank " << r;
  }
  if (same_events) {
    EXPECT_EQ(a.res.report.events, b.res.report.events) << what;
    EXPECT_EQ(a.res.report.event_hash, b.res.report.event_hash) << what;
  }
  const auto& ua = a.res.report.unit_counters;
  const auto& ub = b.res.report.unit_counters;
  ASSERT_EQ(ua.size(), ub.size()) << what;
  for (std::size_t u = 0; u < ua.size(); ++u) {
    EXPECT_EQ(ua[u].bytes, ub[u].bytes) << what << " unit " << u;
    EXPECT_EQ(ua[u].pieces, ub[u].pieces) << what << " unit " << u;
    EXPECT_EQ(ua[u].busy, ub[u].busy) << what << " unit " << u;
    EXPECT_EQ(ua[u].channel_busy, ub[u].channel_busy) << what << " unit " << u;
    EXPECT_EQ(ua[u].hits, ub[u].hits) << what << " unit " << u;
    EXPECT_EQ(ua[u].fill_bytes, ub[u].fill_bytes) << what << " unit " << u;
    EXPECT_EQ(ua[u].writeback_bytes, ub[u].writeback_bytes) << what << " unit " << u;
  }
}

// Random sizes (uneven chunks, chunks of no elements on the larger rings, chunks past an L2's
// capacity), every shipped topology family, both timing levels: bit-equal times and counters.
TEST(RingCallbacks, SameTimesAsTheRanksCode) {
  std::mt19937_64 rng(std::random_device{}());
  const std::string topos[] = {"ring4", "h200x4", "mesh4x4", "dgx_h100x8", "torus8x8"};
  const Kind kinds[] = {Kind::all_reduce, Kind::reduce_scatter, Kind::all_gather};
  int cases = 0;
  for (const std::string& topo : topos) {
    for (hw::TimingModel tm : {hw::TimingModel::chunk, hw::TimingModel::flow}) {
      for (Kind k : kinds) {
        // Every rank, or (one case in three) a group of the first ranks.
        const int all = static_cast<int>(hw::load_topology(topo).cubes.size());
        const int p = all > 2 && rng() % 3 == 0 ? static_cast<int>(2 + rng() % (all - 1)) : all;
        // Up to a few MiB a rank (bf16 or f32), sometimes fewer elements than ranks.
        std::int64_t count = rng() % 4 == 0 ? 1 + static_cast<std::int64_t>(rng() % (2 * p))
                                            : 1 + static_cast<std::int64_t>(rng() % (1 << 20));
        if (k == Kind::reduce_scatter) count = (count + p - 1) / p * p;
        const DType d = rng() % 2 ? DType::bf16 : DType::f32;
        const std::string what = topo + (tm == hw::TimingModel::flow ? " flow " : " chunk ") +
                                 std::string(collective_kind_name(k)) + " " + std::to_string(count) + " " +
                                 std::string(dtype_name(d)) + " on " + std::to_string(p) + " ranks";
        const Outcome by_code = run(hw::load_topology(topo), tm, false, k, count, d, p);
        const Outcome by_callbacks = run(hw::load_topology(topo), tm, true, k, count, d, p);
        EXPECT_EQ(by_code.rings, 0u) << what;
        EXPECT_EQ(by_callbacks.rings, 1u) << what;
        expect_same(by_code, by_callbacks, what, count / p > 0);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 30);
}

// Hierarchical all-reduce: an inner ring's reduce-scatter, an outer ring's all-reduce over one slice,
// the inner ring's all-gather, each ring a part of the group and run by callbacks as a ring of its
// own (inner rings of h ranks, outer rings of p / h; h the largest divisor of p with h * h <= p, as
// the algorithm picks by default).
TEST(RingCallbacks, HierarchicalRingsOfPartsOfTheGroup) {
  std::mt19937_64 rng(std::random_device{}());
  const std::string topos[] = {"ring4", "h200x4", "mesh4x4", "dgx_h100x8", "torus8x8"};
  int cases = 0;
  for (const std::string& topo : topos) {
    for (hw::TimingModel tm : {hw::TimingModel::chunk, hw::TimingModel::flow}) {
      const int all = static_cast<int>(hw::load_topology(topo).cubes.size());
      const int p = all > 4 && rng() % 3 == 0 ? static_cast<int>(4 + rng() % (all - 3)) : all;
      int h = 1;
      for (int i = 1; i * i <= p; ++i) {
        if (p % i == 0) h = i;
      }
      const int groups = p / h;
      const std::uint64_t rings = (h > 1 ? 2u * static_cast<std::uint64_t>(groups) : 0u) +
                                  (groups > 1 ? static_cast<std::uint64_t>(h) : 0u);
      const std::int64_t count = 1 + static_cast<std::int64_t>(rng() % (1 << 20));
      const DType d = rng() % 2 ? DType::bf16 : DType::f32;
      const std::string what = topo + (tm == hw::TimingModel::flow ? " flow " : " chunk ") + "hierarchical " +
                               std::to_string(count) + " " + std::string(dtype_name(d)) + " on " + std::to_string(p) +
                               " ranks (" + std::to_string(groups) + " x " + std::to_string(h) + ")";
      const Outcome by_code = run(hw::load_topology(topo), tm, false, Kind::all_reduce, count, d, p, Algorithm::hierarchical);
      const Outcome by_callbacks = run(hw::load_topology(topo), tm, true, Kind::all_reduce, count, d, p, Algorithm::hierarchical);
      EXPECT_EQ(by_code.rings, 0u) << what;
      EXPECT_EQ(by_callbacks.rings, rings) << what;
      // Empty last chunks (fewer elements than ranks in a ring) cost the ranks' code no event.
      expect_same(by_code, by_callbacks, what, count / p > 0 && count / h / groups > 0);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 10);
}

// A large one with every chunk of the same size, the worst case for ties at equal times.
TEST(RingCallbacks, SameTimesOnAWholeTorus) {
  for (hw::TimingModel tm : {hw::TimingModel::chunk, hw::TimingModel::flow}) {
    const Outcome a = run(hw::load_topology("torus8x8"), tm, false, Kind::all_reduce, 64 << 14, DType::bf16, 64);
    const Outcome b = run(hw::load_topology("torus8x8"), tm, true, Kind::all_reduce, 64 << 14, DType::bf16, 64);
    EXPECT_EQ(b.rings, 1u);
    expect_same(a, b, tm == hw::TimingModel::flow ? "flow" : "chunk");
  }
}

// Links faster than the reduction (ring4's links at 4 TB/s against 1 TB/s of HBM): every step of the
// reduce-scatter waits for its reduction's excess.
TEST(RingCallbacks, SameTimesWhenReductionsOutlastTheirReceives) {
  const hw::Topology fast = hw::load_topology("ring4", {{"network.link.bandwidth_GBps", 4096}});
  for (hw::TimingModel tm : {hw::TimingModel::chunk, hw::TimingModel::flow}) {
    for (Kind k : {Kind::all_reduce, Kind::reduce_scatter}) {
      const Outcome a = run(fast, tm, false, k, 1 << 20, DType::f32, 4);
      const Outcome b = run(fast, tm, true, k, 1 << 20, DType::f32, 4);
      EXPECT_EQ(b.rings, 1u);
      expect_same(a, b, tm == hw::TimingModel::flow ? "flow" : "chunk");
      // The reductions set the pace: three of a 1 MiB chunk, each reading 2 MiB and writing 1 MiB at
      // 1 TB/s, take >= 9.2 us, where the links alone would move the chunks in 0.8 us.
      const sim::Duration span = b.res.end[0] - b.res.start[0];
      EXPECT_GE(span, sim::from_us(9.2)) << "the reductions did not pace the fast ring";
    }
  }
}

// Not used where a run needs the ranks' code: values kept, a trace recorded, other algorithms.
TEST(RingCallbacks, OnlyWhereNothingButTimeIsAsked) {
  ContextOptions o;
  o.stack_size = 64 * 1024;
  auto values = make_sim_context(o, hw::load_topology("ring4"), {});
  CollectiveCase c{.collective = Kind::all_reduce, .dtype = DType::f32, .count = 4096,
                   .options = {.algorithm = Algorithm::ring}, .ranks = 4,
                   .make_input = [](int, std::span<std::uint8_t> b) { std::fill(b.begin(), b.end(), 0); }};
  run_collective(*values, c);
  EXPECT_EQ(values->callback_rings(), 0u);
  ContextOptions traced = o;
  traced.trace = true;
  auto t = make_sim_context(traced, hw::load_topology("ring4"), {.timing_only = true});
  c.make_input = nullptr;
  run_collective(*t, c);
  EXPECT_EQ(t->callback_rings(), 0u);
  auto hd = make_sim_context(o, hw::load_topology("ring4"), {.timing_only = true});
  c.options.algorithm = Algorithm::halving_doubling;
  run_collective(*hd, c);
  EXPECT_EQ(hd->callback_rings(), 0u);
}

// A rank that skips the collective: the others wait, and the deadlock report says who did not come
// and where each waiting rank is in the ring.
TEST(RingCallbacks, ASkippedCollectiveIsReported) {
  for (hw::TimingModel tm : {hw::TimingModel::chunk, hw::TimingModel::flow}) {
    ContextOptions o;
    o.stack_size = 64 * 1024;
    auto ctx = make_sim_context(o, hw::load_topology("ring4"), {.timing_only = true, .timing = tm});
    std::string err;
    try {
      ctx->spawn(4, [&](int r) {
        Tensor t = ctx->empty(r, {1 << 16}, DType::bf16, "x");
        if (r != 2) all_reduce(t, ReduceOp::sum, nullptr, {.algorithm = Algorithm::ring});
      });
    } catch (const RankError& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("deadlocked"), std::string::npos) << err;
    EXPECT_NE(err.find("ranks 0, 1, 3 arrived; rank 2 did not"), std::string::npos) << err;
    EXPECT_NE(err.find("rank 3 at step 1 of 3 of the ring's reduce-scatter: waiting for the message from rank 2"),
              std::string::npos)
        << err;
    EXPECT_EQ(ctx->callback_rings(), 1u);
    // The context runs again afterwards, by callbacks.
    ctx->spawn(4, [&](int r) {
      Tensor t = ctx->empty(r, {1 << 16}, DType::bf16, "x");
      all_reduce(t, ReduceOp::sum, nullptr, {.algorithm = Algorithm::ring});
    });
    EXPECT_EQ(ctx->callback_rings(), 2u);
  }
}

}  // namespace
}  // namespace cubesim::rt
