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

// Megatron's fused QKV row (per query group: its query heads, its key head, its value head) read in
// place through group_stride, and the gradients written into one such row, give the bits of Q, K, V
// (and dQ, dK, dV) held apart with their heads side by side.
TEST(Attention, AFusedQkvRowInQueryGroupsGivesTheBitsOfSeparateOperands) {
  const std::int64_t heads = 6, kv = 2, G = 3, d = 16, seq = 70, gs = (G + 2) * d, width = kv * gs;
  const AttentionCase c{.backward = true, .seq = seq, .heads = heads, .kv_heads = kv, .head_dim = d,
                        .in = DType::bf16, .out = DType::bf16};
  const AttentionShape s = c.shape(1);
  const AttnInputs apart = attn_inputs(c, 1, seq, seq, 9);
  HostMatrix fused(DType::bf16, seq, width, Layout::row_major);
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t g = 0; g < kv; ++g)
      for (std::int64_t e = 0; e < d; ++e) {
        for (std::int64_t i = 0; i < G; ++i) fused.set(t, g * gs + i * d + e, apart.q.at(t, (g * G + i) * d + e));
        fused.set(t, g * gs + G * d + e, apart.k.at(t, g * d + e));
        fused.set(t, g * gs + (G + 1) * d + e, apart.v.at(t, g * d + e));
      }
  const AttnResults want = attn_run(host_attention(), c, s, apart);
  const std::size_t es = 2;
  auto* base = static_cast<const std::uint8_t*>(fused.view().data);
  const AttentionBuffer q{base, DType::bf16, width, gs}, k{base + G * d * es, DType::bf16, width, gs},
      v{base + (G + 1) * d * es, DType::bf16, width, gs};
  HostMatrix out = HostMatrix::output(DType::bf16, seq, heads * d, Layout::row_major);
  std::vector<float> stats(static_cast<std::size_t>(seq * heads * 2));
  attention_forward(s, q, k, v, mbuf(out), stats.data());
  EXPECT_TRUE(attn_rows_equal("out", out, 0, want.out, 0, seq));
  HostMatrix dqkv = HostMatrix::output(DType::bf16, seq, width, Layout::row_major);
  auto* dbase = static_cast<std::uint8_t*>(dqkv.mview().data);
  attention_backward(s, q, k, v, abuf(out), stats.data(), abuf(apart.dout), {dbase, DType::bf16, width, gs},
                     {dbase + G * d * es, DType::bf16, width, gs}, {dbase + (G + 1) * d * es, DType::bf16, width, gs});
  EXPECT_TRUE(dqkv.fully_written());
  for (std::int64_t t = 0; t < seq; ++t)
    for (std::int64_t g = 0; g < kv; ++g)
      for (std::int64_t e = 0; e < d; ++e) {
        for (std::int64_t i = 0; i < G; ++i)
          ASSERT_EQ(dqkv.bits(t, g * gs + i * d + e), want.dq.bits(t, (g * G + i) * d + e)) << t << " " << g << " " << i;
        ASSERT_EQ(dqkv.bits(t, g * gs + G * d + e), want.dk.bits(t, g * d + e));
        ASSERT_EQ(dqkv.bits(t, g * gs + (G + 1) * d + e), want.dv.bits(t, g * d + e));
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
    EXPECT_NE(std::string(e.what()).find("q's row_stride 40 is less than its heads' extent 48"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cubesim::kernels::testing
