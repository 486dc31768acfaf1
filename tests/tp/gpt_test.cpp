// GPTModel (tp/gpt.h) through check_gpt_equivalence: against the unsharded model (bitwise at tp 1,
// within tolerance above), the host replay (bitwise, on the simulator) and across ranks; the loss of
// an untrained model is near log(vocab); and the sizes and ids a user can get wrong.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/errors.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/equivalence.h"
#include "tp/gpt_step.h"
#include "tp/parallel_state.h"
#include "tests/tp/tp_test_util.h"

namespace cubesim::tp {
namespace {

struct Case {
  int tp;
  bool sp, tied, sim;
  DType dtype;
  std::string name() const {
    return fmt::format("tp{}_{}_{}_{}_{}", tp, sp ? "sp" : "nosp", tied ? "tied" : "untied", dtype_name(dtype),
                       sim ? "sim" : "host");
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

using tptest::make;

GptOptions small(const Case& c) {
  return {.vocab = 96, .hidden = 32, .heads = 4, .kv_heads = c.tp == 4 ? 4 : 2, .ffn = 64, .seq = 72, .layers = 2,
          .norm = NormKind::rms_norm, .swiglu = c.sp, .rotary = !c.tied, .sequence_parallel = c.sp,
          .tie_embeddings = c.tied,
          .dtype = c.dtype, .seed = 5};
}

class TpGpt : public ::testing::TestWithParam<Case> {};

TEST_P(TpGpt, EquivalentToUnshardedModelAndHostReplay) {
  const Case c = GetParam();
  auto ctx = make(c.sim, c.tp);
  const EquivalenceReport rep = check_gpt_equivalence(*ctx, {.model = small(c), .batch = 2, .tp = c.tp, .data_seed = 3});
  int unsharded = 0, replay = 0, ranks = 0;
  for (const auto& t : rep.checks) {
    EXPECT_TRUE(t.pass) << t.tensor << " vs " << t.against << ": rel norm " << t.rel_norm << ", tolerance "
                        << t.tolerance << (t.bitwise_claim ? " (bitwise claim)" : "");
    unsharded += t.against == "unsharded";
    replay += t.against == "host replay";
    ranks += t.against == "ranks";
  }
  // loss, embedding, final norm, 2 layers x (6 weights + 6 biases with RMSNorm: 4), untied LM head.
  EXPECT_EQ(unsharded, 1 + 1 + 1 + 2 * 10 + (c.tied ? 0 : 1));
  EXPECT_EQ(replay, c.sim ? unsharded : 0);
  EXPECT_GE(ranks, 1 + 1 + 2 * 4);  // loss, final norm, per layer two norms and two row biases
  EXPECT_TRUE(rep.pass);
}

std::vector<Case> cases() {
  return {{1, false, true, true, DType::bf16},  {1, false, false, false, DType::f32}, {2, false, true, true, DType::bf16},
          {2, true, false, true, DType::bf16},  {2, false, false, false, DType::f32}, {4, true, true, true, DType::f32},
          {4, false, false, true, DType::bf16}};
}
INSTANTIATE_TEST_SUITE_P(Models, TpGpt, ::testing::ValuesIn(cases()), [](const auto& info) { return info.param.name(); });

TEST(TpGptLoss, AnUntrainedModelsLossIsNearLogVocab) {
  auto ctx = make(false, 2);
  const Case c{2, false, true, false, DType::f32};
  const GptStepResult r = run_gpt_step(*ctx, {.model = small(c), .batch = 2, .tp = 2, .data_seed = 4});
  EXPECT_NEAR(r.mean_loss, std::log(96.0), 0.1 * std::log(96.0));
}

std::string error_of(int tp, const GptOptions& m) {
  auto ctx = make(false, tp);
  try {
    run_gpt_step(*ctx, {.model = m, .tp = tp});
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(TpGptErrors, NameTheSizesIdsAndValidChoices) {
  const GptOptions ok{.vocab = 96, .hidden = 32, .heads = 4, .kv_heads = 2, .ffn = 64, .seq = 8, .layers = 1};
  EXPECT_EQ(error_of(2, ok), "no error");
  GptOptions bad = ok;
  bad.vocab = 97;
  std::string m = error_of(2, bad);
  EXPECT_NE(m.find("vocab 97 is not divisible by the tensor-parallel size 2"), std::string::npos) << m;
  EXPECT_NE(m.find("use a tp in 1, 97"), std::string::npos) << m;
  bad = ok;
  bad.layers = 0;
  m = error_of(1, bad);
  EXPECT_NE(m.find("layers 0 must be at least 1"), std::string::npos) << m;
  // A token id outside the vocabulary, through the embedding itself.
  auto ctx = make(false, 1);
  try {
    ctx->spawn(1, [&](int) {
      initialize_model_parallel(1);
      VocabParallelEmbedding emb(*ctx, {.vocab = 16, .hidden = 8});
      const std::vector<std::int64_t> ids{3, 15, 16, 2};
      emb.forward(ids);
    });
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("token id 16 at position 2 is outside the vocabulary [0, 16)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cubesim::tp
