// The attention contract (kernels/attention.h) on the host definition: the case table, the
// online softmax's block edges against a one-pass softmax, and the refusals of bad shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/attention.h"
#include "tests/kernels/attention_cases.h"

namespace cubesim::kernels::testing {
namespace {

INSTANTIATE_ATTENTION_CONTRACT(Host, ::testing::Values(host_attention()));

// The stats are the softmax's running max and sum after the last block: m is the largest visible
// score and l = Σ exp(s_j - m) within f32 rounding of the blocks' rescaling.
TEST(Attention, StatsAreTheMaxAndSumOfTheVisibleScores) {
  const AttentionCase c{.seq = 150, .heads = 2, .kv_heads = 1, .head_dim = 16};
  const AttentionShape s = c.shape(1);
  const AttnInputs in = attn_inputs(c, 1, c.seq, c.seq, 5);
  const AttnResults r = attn_run(host_attention(), c, s, in);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t t : {0, 63, 64, 149}) {
      double mx = -INFINITY;
      std::vector<double> sc;
      for (std::int64_t j = 0; j <= t; ++j) {
        float dot = 0;
        for (std::int64_t e = 0; e < 16; ++e) dot = std::fma(in.q.at(t, h * 16 + e), in.k.at(j, e), dot);
        sc.push_back(dot * s.softmax_scale());
        mx = std::max(mx, sc.back());
      }
      double sum = 0;
      for (double x : sc) sum += std::exp(x - mx);
      const float* st = &r.stats[static_cast<std::size_t>((t * 2 + h) * 2)];
      EXPECT_EQ(st[0], static_cast<float>(mx)) << "row " << t;
      EXPECT_NEAR(st[1], sum, 1e-5 * sum) << "row " << t;
    }
}

TEST(Attention, RefusesBadShapesNamingTheValidChoice) {
  AttentionShape s{.seq_q = 4, .seq_k = 4, .heads = 6, .kv_heads = 4, .head_dim = 8};
  auto message = [](const AttentionShape& x) {
    try {
      x.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(s).find("heads 6 must be a positive multiple of kv_heads 4"), std::string::npos) << message(s);
  s.kv_heads = 3;
  EXPECT_EQ(message(s), "no error");
  s.head_dim = 0;
  EXPECT_NE(message(s).find("head_dim 0"), std::string::npos);
  s.head_dim = 8;
  s.seq_q = 6;
  EXPECT_NE(message(s).find("needs q_offset"), std::string::npos) << message(s);
  s.q_offset = 1;
  EXPECT_NE(message(s).find("need keys up to 6, but seq_k is 4"), std::string::npos) << message(s);
  s.causal = false;
  EXPECT_EQ(message(s), "no error");
  // A buffer narrower than its heads.
  std::vector<float> q(6 * 48), k(4 * 24), v(4 * 24), o(6 * 48), st(6 * 6 * 2);
  s.q_offset = -1;
  try {
    attention_forward(s, {q.data(), DType::f32, 40}, {k.data(), DType::f32, 24}, {v.data(), DType::f32, 24},
                      {o.data(), DType::f32, 48}, st.data());
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q's row_stride 40 is less than its heads x head_dim = 48"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cubesim::kernels::testing
