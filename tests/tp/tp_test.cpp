// Tensor parallelism: the TP MLP against the unsharded host model (bitwise where the contract
// fixes the order, within tolerance where tp partials are summed), against the host replay of the
// same order (bitwise, on sim), and ranks identical after all-reduces; single layers with
// gather_output / input_is_parallel; and the errors a user can cause.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "runtime/algorithms/table.h"
#include "runtime/errors.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/equivalence.h"
#include "tp/mlp_step.h"
#include "tp/parallel_state.h"
#include "tests/tp/tp_test_util.h"

namespace cubesim::tp {
namespace {

struct Case {
  int tp;
  DType dtype;
  bool bias;
  bool sp;
  kernels::GeluKind gelu;
  bool sim;
  std::string name() const {
    return fmt::format("tp{}_{}_{}_{}_{}_{}", tp, dtype_name(dtype), bias ? "bias" : "nobias", sp ? "sp" : "nosp",
                       kernels::gelu_kind_name(gelu), sim ? "sim" : "host");
  }
};

using tptest::make;

class TpMlp : public ::testing::TestWithParam<Case> {};

TEST_P(TpMlp, EquivalentToUnshardedModel) {
  const Case c = GetParam();
  auto ctx = make(c.sim, c.tp);
  MlpCheckOptions o;
  o.tp = c.tp;
  o.tokens = 32;
  o.mlp.hidden = 64;
  o.mlp.ffn = 128;
  o.mlp.dtype = c.dtype;
  o.mlp.bias = c.bias;
  o.mlp.sequence_parallel = c.sp;
  o.mlp.gelu = c.gelu;
  o.mlp.seed = 17 + c.tp;
  o.data_seed = 5 + c.tp;
  const EquivalenceReport rep = check_mlp_equivalence(*ctx, o);
  for (const auto& t : rep.checks) {
    EXPECT_TRUE(t.pass) << t.tensor << " vs " << t.against << ": " << (t.bitwise_claim ? "bitwise claim" : "tolerance")
                        << ", bitwise " << t.bitwise << ", max abs " << t.max_abs << ", rel " << t.rel_norm << " (tol "
                        << t.tolerance << ")";
    if (c.tp > 1 && (t.tensor == "output" || t.tensor == "input_grad") && t.against == "unsharded") {
      EXPECT_FALSE(t.bitwise_claim);
    }
  }
  EXPECT_TRUE(rep.pass);
  // Every tensor compared against the unsharded model; on sim, against the host replay too.
  const auto n = std::count_if(rep.checks.begin(), rep.checks.end(), [](auto& t) { return t.against == "unsharded"; });
  EXPECT_EQ(n, c.bias ? 7 : 5);
  if (c.sim) {
    EXPECT_GT(rep.run.sim_time, 0u);
    for (const auto& r : rep.run.ranks) EXPECT_GT(r.compute, 0u);
    if (c.tp > 1) {
      for (const auto& r : rep.run.ranks) EXPECT_GT(r.comm, 0u);
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int tp : {1, 2, 4, 8}) {
    for (DType d : {DType::bf16, DType::f32, DType::f16}) {
      for (bool sim : {false, true}) {
        v.push_back({tp, d, true, false, kernels::GeluKind::tanh, sim});
        if (d == DType::bf16) {
          v.push_back({tp, d, false, false, kernels::GeluKind::erf, sim});
          if (tp > 1) v.push_back({tp, d, true, true, kernels::GeluKind::erf, sim});
        }
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, TpMlp, ::testing::ValuesIn(cases()), [](const auto& i) { return i.param.name(); });

// The host replay runs the collectives as the context does, so the check holds for every
// algorithm of the table (each fixes its own reduction order), with and without f32 accumulation
// and sequence parallelism where the algorithm does the collectives that needs.
TEST(TpMlp, EquivalentOnSimForEveryAlgorithm) {
  for (const rt::algo::Row& row : rt::algo::rows()) {
    using K = rt::CollectiveRequest::Kind;
    if (!row.supports(K::all_reduce)) continue;
    const bool sp = row.supports(K::all_gather) && row.supports(K::reduce_scatter);
    for (const bool acc : {false, true}) {
      for (const bool seq : {false, sp}) {
        rt::ContextOptions co{.world_size = 8, .algorithm = row.id, .accumulate_f32 = acc, .stack_size = 128 * 1024};
        auto ctx = rt::make_sim_context(co, hw::load_topology("mesh4x4"), {.check_uninitialized = true});
        MlpCheckOptions o{.mlp = {.hidden = 64, .ffn = 128, .sequence_parallel = seq, .dtype = DType::bf16},
                          .tokens = 32,
                          .tp = 8};
        const EquivalenceReport rep = check_mlp_equivalence(*ctx, o);
        for (const auto& t : rep.checks) {
          EXPECT_TRUE(t.pass) << row.name << (acc ? " accumulate_f32" : "") << (seq ? " sequence parallel" : "") << ": "
                              << t.tensor << " vs " << t.against << ", max abs " << t.max_abs;
        }
        EXPECT_TRUE(rep.pass) << row.name;
        EXPECT_EQ(std::count_if(rep.checks.begin(), rep.checks.end(), [](auto& t) { return t.against == "host replay"; }),
                  7)
            << row.name;
      }
    }
  }
}

// The step's data: seeded (bitwise the same every run, row shards with sequence parallelism) or
// given; and its errors.
TEST(TpMlpStep, DataCollectAndErrors) {
  auto ctx = make(true, 4);
  MlpStepOptions o{.mlp = {.hidden = 32, .ffn = 64, .sequence_parallel = true, .dtype = DType::bf16},
                   .tokens = 8,
                   .tp = 4,
                   .collect = Collect::outputs};
  const MlpStepResult a = run_mlp_step(*ctx, o);
  ASSERT_EQ(a.tensors.size(), 4u);
  EXPECT_EQ(a.tensors[0].size(), 2u);
  EXPECT_EQ(a.tensors[0].at("output").size(), 2u * 32 * 2);  // 2 of 8 rows, bf16
  EXPECT_TRUE(a.steps[0].empty());
  // The same values, given: the same bits.
  {
    std::mt19937_64 rng(o.data_seed);
    std::normal_distribution<float> nrm(0.0f, 1.0f);
    o.x.resize(8 * 32);
    o.dy.resize(8 * 32);
    for (auto& v : o.x) v = nrm(rng);
    for (auto& v : o.dy) v = 0.1f * nrm(rng);
  }
  const MlpStepResult b = run_mlp_step(*ctx, o);
  EXPECT_EQ(a.tensors, b.tensors);
  o.iterations = 3;
  o.step_regions = true;
  const MlpStepResult c = run_mlp_step(*ctx, o);
  EXPECT_EQ(c.steps[1].size(), 3u);
  EXPECT_EQ(a.tensors, c.tensors);  // an iteration recomputes the same step
  // Iterations as a graph where the backend records none (the simulator): they run as usual.
  o.graph = true;
  const MlpStepResult g = run_mlp_step(*ctx, o);
  EXPECT_EQ(g.graphs, 0);
  EXPECT_EQ(g.steps[1].size(), 3u);
  EXPECT_EQ(a.tensors, g.tensors);
  EXPECT_EQ(g.report.sim_time, c.report.sim_time);
  EXPECT_EQ(g.report.events, c.report.events);
  o.graph = false;

  auto expect_error = [&](MlpStepOptions bad, const std::string& needle, rt::Context& on) {
    try {
      run_mlp_step(on, bad);
      ADD_FAILURE() << "expected an error containing: " << needle;
    } catch (const rt::RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  MlpStepOptions base{.mlp = {.hidden = 32, .ffn = 64}, .tokens = 8, .tp = 4};
  expect_error({.mlp = base.mlp, .tokens = 8, .tp = 5}, "tp 5 needs 1 to 4 ranks", *ctx);
  expect_error({.mlp = base.mlp, .tokens = 8, .tp = 0}, "tp 0 needs 1 to 4 ranks", *ctx);
  expect_error({.mlp = {.hidden = 32, .ffn = 64, .sequence_parallel = true}, .tokens = 6, .tp = 4},
               "sequence parallel needs tokens (6) divisible by tp (4); valid tp for these tokens and ffn: 1, 2", *ctx);
  expect_error({.mlp = base.mlp, .tokens = 0, .tp = 4}, "tokens 0 is not valid", *ctx);
  expect_error({.mlp = base.mlp, .tokens = 8, .tp = 4, .x = std::vector<float>(5)}, "x has 5 values; give tokens x hidden",
               *ctx);
  auto timing = rt::make_sim_context(rt::ContextOptions{.world_size = 4}, hw::load_topology("ring4"), {.timing_only = true});
  expect_error({.mlp = base.mlp, .tokens = 8, .tp = 4, .collect = Collect::all}, "timing-only", *timing);
  EXPECT_GT(run_mlp_step(*timing, base).report.sim_time, 0u);
}

TEST(TpMlpStep, ValidTpSizes) {
  EXPECT_EQ(valid_tp_sizes({.ffn = 96}, 10, 8), (std::vector<int>{1, 2, 3, 4, 6, 8}));
  EXPECT_EQ(valid_tp_sizes({.ffn = 96, .sequence_parallel = true}, 10, 8), (std::vector<int>{1, 2}));
  EXPECT_EQ(valid_tp_sizes({.ffn = 7}, 64, 4), (std::vector<int>{1}));
  EXPECT_THROW(valid_tp_sizes({.ffn = 96}, 10, 0), rt::RuntimeError);
}

// A column layer with gather_output feeding a row layer that splits its own input, against tp 1.
TEST(TpLayers, GatherOutputAndSplitInput) {
  const std::int64_t T = 24, IN = 32, MID = 48, OUT = 40;
  std::mt19937 rng(4);
  std::normal_distribution<float> nrm;
  std::vector<float> x(T * IN), dy(T * OUT);
  for (auto& v : x) v = round_to(DType::bf16, nrm(rng));
  for (auto& v : dy) v = round_to(DType::bf16, nrm(rng));
  auto run = [&](int tp) {
    auto ctx = make(true, tp);
    std::vector<std::vector<std::vector<float>>> res(static_cast<std::size_t>(tp));
    ctx->spawn(tp, [&](int r) {
      initialize_model_parallel(tp);
      LinearOptions co;
      co.gather_output = true;
      co.layer_id = 1;
      LinearOptions ro;
      ro.layer_id = 2;
      ColumnParallelLinear col(*ctx, IN, MID, co);
      RowParallelLinear row(*ctx, MID, OUT, ro);
      auto h = col.forward(ctx->from_host_f32(r, {T, IN}, DType::bf16, x)).output;
      auto y = row.forward(h).output;
      auto dh = row.backward(ctx->from_host_f32(r, {T, OUT}, DType::bf16, dy));
      auto dx = col.backward(dh);
      res[static_cast<std::size_t>(r)] = {h.to_host_f32(), y.to_host_f32(), dh.to_host_f32(), dx.to_host_f32()};
    });
    return res;
  };
  const auto ref = run(1);
  const auto got = run(4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[static_cast<std::size_t>(r)][0], ref[0][0]) << "column forward, gathered, rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)][2], ref[0][2]) << "row backward, gathered input grad, rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)][1], got[0][1]) << "ranks identical after the all-reduce";
  }
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref[0][1].size(); ++i) {
    num += std::pow(got[0][1][i] - ref[0][1][i], 2);
    den += std::pow(ref[0][1][i], 2);
  }
  EXPECT_LE(std::sqrt(num / den), tp_tolerance(DType::bf16, 4));
}

TEST(TpErrors, ClearMessages) {
  auto ctx = make(false, 4);
  auto expect_error = [&](const std::function<void(int)>& fn, const std::string& needle) {
    try {
      ctx->spawn(4, fn);
      ADD_FAILURE() << "expected an error containing: " << needle;
    } catch (const rt::RankError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&](int) { ColumnParallelLinear l(*ctx, 8, 8); }, "model parallel is not initialized");
  expect_error([&](int) { initialize_model_parallel(3); }, "must divide the world size 4");
  expect_error(
      [&](int) {
        initialize_model_parallel(4);
        ColumnParallelLinear l(*ctx, 8, 10);
      },
      "output features (10) are not divisible by the tensor-parallel size 4");
  expect_error(
      [&](int r) {
        initialize_model_parallel(4);
        ColumnParallelLinear l(*ctx, 8, 16);
        l.forward(ctx->zeros(r, {4, 9}, DType::bf16));
      },
      "input must be [tokens, 8], got bf16[4, 9]");
  expect_error(
      [&](int r) {
        initialize_model_parallel(4);
        RowParallelLinear l(*ctx, 16, 8);
        l.forward(ctx->zeros(r, {4, 16}, DType::f32));
      },
      "has dtype f32 but the layer is bf16");
  expect_error(
      [&](int r) {
        initialize_model_parallel(2);
        ColumnParallelLinear l(*ctx, 8, 16);
        l.forward(ctx->zeros((r + 1) % 4, {4, 8}, DType::bf16));  // a tensor of another rank
      },
      "lives on rank");
}

}  // namespace
}  // namespace cubesim::tp
