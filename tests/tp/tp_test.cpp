// Tensor parallelism: the TP MLP against the unsharded host model (bitwise where the contract
// fixes the order, within tolerance where tp partials are summed), against the host replay of the
// same order (bitwise, on sim), and ranks identical after all-reduces; single layers with
// gather_output / input_is_parallel; and the errors a user can cause.
#include <gtest/gtest.h>

#include <random>

#include "runtime/errors.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/equivalence.h"
#include "tp/parallel_state.h"

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

std::unique_ptr<rt::Context> make(bool sim, int world) {
  rt::ContextOptions o;
  o.world_size = world;
  o.stack_size = 128 * 1024;
  if (!sim) return std::make_unique<rt::Context>(o);
  return rt::make_sim_context(o, hw::load_topology("mesh4x4"), {.check_uninitialized = true});
}

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
