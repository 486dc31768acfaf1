// GPTModel (tp/gpt.h) through check_gpt_equivalence: against the unsharded model (bitwise at tp 1,
// within tolerance above), the host replay (bitwise, on the simulator) and across ranks; the loss of
// an untrained model is near log(vocab); and the sizes and ids a user can get wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

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

// Right padding through the model (GPTModel::forward's lengths): a real token's loss is bitwise the one
// its sequence gives alone (unpadded, at its own length), padding reports 0, and what the padding holds
// changes no loss and no gradient (the loss mask: padding gives no gradient, and no real token attends to
// it). Fresh random ids every run; the padding's ids differ between the two padded runs.
struct PaddedRun {
  std::vector<float> loss;                 // rank 0's per-token losses
  std::vector<std::vector<float>> grads;   // every rank's weight gradients, in a fixed order
};

PaddedRun run_padded(bool sim, int tp, const GptOptions& m, const std::vector<std::int64_t>& ids,
                     const std::vector<std::int64_t>& targets, const std::vector<std::int64_t>& lengths) {
  auto ctx = make(sim, tp);
  PaddedRun out;
  std::vector<std::vector<std::vector<float>>> per_rank(static_cast<std::size_t>(tp));
  ctx->spawn(tp, [&](int r) {
    initialize_model_parallel(tp);
    GPTModel gpt(*ctx, m);
    const rt::Tensor loss = gpt.forward(ids, targets, lengths);
    gpt.backward();
    if (r == 0) out.loss = loss.to_host_f32();
    auto& g = per_rank[static_cast<std::size_t>(r)];
    g.push_back(gpt.embedding.weight_grad.to_host_f32());
    g.push_back(gpt.final_norm.weight_grad.to_host_f32());
    if (!m.tie_embeddings) g.push_back(gpt.lm_head.weight_grad.to_host_f32());
    for (const auto& l : gpt.layers) {
      for (const rt::Tensor* t : {&l->input_norm.weight_grad, &l->attention.qkv.weight_grad, &l->attention.proj.weight_grad,
                                  &l->post_attention_norm.weight_grad, &l->mlp.fc1.weight_grad, &l->mlp.fc2.weight_grad}) {
        g.push_back(t->to_host_f32());
      }
    }
    destroy_model_parallel();
  });
  for (auto& g : per_rank)
    for (auto& t : g) out.grads.push_back(std::move(t));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TpGptPadding, RealTokensGiveTheirBitsAloneAndPaddingChangesNothing) {
  for (const bool sim : {false, true}) {
    const int tp = 2;
    const Case c{tp, sim, false, sim, DType::bf16};  // sequence parallel on the simulator; untied; rotary
    GptOptions m = small(c);
    m.seq = 24;
    const std::vector<std::int64_t> lengths{24, 10, 16};
    const std::int64_t B = static_cast<std::int64_t>(lengths.size());
    const std::uint64_t seed = std::random_device{}();
    SCOPED_TRACE(::testing::Message() << "data seed " << seed);
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int64_t> tok(0, m.vocab - 1);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(B * m.seq)), targets(ids.size());
    for (auto& v : ids) v = tok(rng);
    for (auto& v : targets) v = tok(rng);
    const PaddedRun a = run_padded(sim, tp, m, ids, targets, lengths);
    // The same real tokens, other padding.
    std::vector<std::int64_t> ids2 = ids, targets2 = targets;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = lengths[static_cast<std::size_t>(b)]; t < m.seq; ++t) {
        ids2[static_cast<std::size_t>(b * m.seq + t)] = tok(rng);
        targets2[static_cast<std::size_t>(b * m.seq + t)] = tok(rng);
      }
    const PaddedRun a2 = run_padded(sim, tp, m, ids2, targets2, lengths);
    ASSERT_TRUE(same_bits(a.loss, a2.loss)) << (sim ? "sim" : "host");
    ASSERT_EQ(a.grads.size(), a2.grads.size());
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
      EXPECT_TRUE(same_bits(a.grads[i], a2.grads[i])) << "gradient " << i << (sim ? " sim" : " host");
    }
    double real_sum = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = lengths[static_cast<std::size_t>(b)];
      // Alone: a model of seq n (the same weights: they depend on the seed and ids, not on seq).
      GptOptions alone = m;
      alone.seq = n;
      const std::vector<std::int64_t> ids1(ids.begin() + b * m.seq, ids.begin() + b * m.seq + n);
      const std::vector<std::int64_t> targets1(targets.begin() + b * m.seq, targets.begin() + b * m.seq + n);
      const PaddedRun one = run_padded(sim, tp, alone, ids1, targets1, {});
      const std::vector<float> mine(a.loss.begin() + b * m.seq, a.loss.begin() + b * m.seq + n);
      EXPECT_TRUE(same_bits(mine, one.loss)) << "sequence " << b << (sim ? " sim" : " host");
      if (b == 1) {
        // The gradients of the loss mask's mean: sequence 1 alone in a batch, padded to seq, against it
        // unpadded at its own length (both the mean over its n tokens; a wrong divisor is off by seq / n).
        // The padding rows add exact zeros to the weight gradients' sums, so without sequence parallelism
        // they agree to the signs of zeros at most; with it the norms' gradients are each rank's rows
        // rounded to bf16 and all-reduced, and the ranks hold other rows when the batch is padded: a few
        // bf16 roundings apart.
        std::vector<std::int64_t> ids_p(ids.begin() + b * m.seq, ids.begin() + (b + 1) * m.seq);
        std::vector<std::int64_t> targets_p(targets.begin() + b * m.seq, targets.begin() + (b + 1) * m.seq);
        const PaddedRun padded1 = run_padded(sim, tp, m, ids_p, targets_p, {n});
        ASSERT_EQ(padded1.grads.size(), one.grads.size());
        for (std::size_t i = 0; i < one.grads.size(); ++i) {
          double num = 0, den = 0;
          for (std::size_t k = 0; k < one.grads[i].size(); ++k) {
            const double d = static_cast<double>(padded1.grads[i][k]) - one.grads[i][k];
            num += d * d;
            den += static_cast<double>(one.grads[i][k]) * one.grads[i][k];
          }
          EXPECT_LE(std::sqrt(num), (c.sp ? 1e-2 : 1e-6) * std::sqrt(den)) << "gradient " << i << " padded vs alone"
                                                            << (sim ? " sim" : " host");
        }
      }
      for (std::int64_t t = n; t < m.seq; ++t) EXPECT_EQ(a.loss[static_cast<std::size_t>(b * m.seq + t)], 0.0f);
      for (const float v : mine) real_sum += v;
    }
    EXPECT_NEAR(real_sum / 50.0, std::log(96.0), 0.15 * std::log(96.0));  // untrained: near log(vocab)
  }
}

TEST(TpGptPadding, BadLengthsAreClearErrors) {
  auto ctx = make(false, 1);
  const GptOptions m{.vocab = 96, .hidden = 32, .heads = 4, .kv_heads = 2, .ffn = 64, .seq = 8, .layers = 1};
  const std::vector<std::int64_t> ids(16, 3);
  auto message = [&](std::vector<std::int64_t> lengths) -> std::string {
    try {
      ctx->spawn(1, [&](int) {
        initialize_model_parallel(1);
        GPTModel gpt(*ctx, m);
        gpt.forward(ids, ids, lengths);
        destroy_model_parallel();
      });
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message({8, 5}), "no error");
  std::string e = message({8});
  EXPECT_NE(e.find("1 lengths for a batch of 2 sequences"), std::string::npos) << e;
  e = message({8, 9});
  EXPECT_NE(e.find("sequence 1 has length 9; valid lengths are 1 to seq 8"), std::string::npos) << e;
  e = message({0, 8});
  EXPECT_NE(e.find("sequence 0 has length 0"), std::string::npos) << e;
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
