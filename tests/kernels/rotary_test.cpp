// Rotary position embeddings (kernels/rotary.h): against an f64 rotation on random data, the inverse
// undoing the forward, q·k depending only on the distance between positions, the group layout of a
// fused QKV row, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/rotary.h"

namespace cubesim::kernels {
namespace {

std::vector<float> random(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(Rotary, MatchesAnF64RotationAndTheInverseUndoesIt) {
  const AttentionShape s{.batch = 2, .seq_q = 300, .seq_k = 300, .heads = 3, .kv_heads = 1, .head_dim = 64};
  const RotaryTable t = rotary_table(300, 64);
  const auto x = random(static_cast<std::size_t>(2 * 300 * 3 * 64), 1);
  std::vector<float> y = x;
  rotary_apply(s, {y.data(), DType::f32, 3 * 64, 0}, 3, 3, t, false);
  double num = 0, den = 0;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t p = 0; p < 300; ++p)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t e = 0; e < 32; ++e) {
          const std::size_t i = static_cast<std::size_t>(((b * 300 + p) * 3 + h) * 64 + e);
          const double a = p * std::pow(10000.0, -2.0 * e / 64);
          const double y1 = x[i] * std::cos(a) - x[i + 32] * std::sin(a), y2 = x[i + 32] * std::cos(a) + x[i] * std::sin(a);
          num += (y[i] - y1) * (y[i] - y1) + (y[i + 32] - y2) * (y[i + 32] - y2);
          den += y1 * y1 + y2 * y2;
        }
  EXPECT_LT(std::sqrt(num / den), 2e-7);
  rotary_apply(s, {y.data(), DType::f32, 3 * 64, 0}, 3, 3, t, true);
  num = den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (y[i] - x[i]) * (y[i] - x[i]);
    den += x[i] * x[i];
  }
  EXPECT_LT(std::sqrt(num / den), 3e-7);
}

// The point of RoPE: q at position p and k at position p' score the same as at p + 17 and p' + 17.
TEST(Rotary, ScoresDependOnlyOnTheDistance) {
  const std::int64_t d = 128;
  const AttentionShape one{.seq_q = 400, .seq_k = 400, .heads = 1, .kv_heads = 1, .head_dim = d};
  const RotaryTable t = rotary_table(400, d);
  const auto q0 = random(d, 2), k0 = random(d, 3);
  std::vector<float> q(400 * d), k(400 * d);
  for (std::int64_t p = 0; p < 400; ++p)
    for (std::int64_t e = 0; e < d; ++e) q[p * d + e] = q0[e], k[p * d + e] = k0[e];
  rotary_apply(one, {q.data(), DType::f32, d, 0}, 1, 1, t, false);
  rotary_apply(one, {k.data(), DType::f32, d, 0}, 1, 1, t, false);
  auto score = [&](std::int64_t pq, std::int64_t pk) {
    double s = 0;
    for (std::int64_t e = 0; e < d; ++e) s += double(q[pq * d + e]) * k[pk * d + e];
    return s;
  };
  for (auto [pq, pk] : {std::pair<std::int64_t, std::int64_t>{5, 3}, {100, 0}, {250, 249}, {40, 40}}) {
    EXPECT_NEAR(score(pq, pk), score(pq + 17, pk + 17), 2e-4) << pq << " " << pk;
    EXPECT_NEAR(score(pq, pk), score(pq + 123, pk + 123), 2e-4) << pq << " " << pk;
  }
}

// In a fused QKV row (query groups) the query heads and the key head rotate alike and the value head
// does not move.
TEST(Rotary, RotatesTheHeadsOfAFusedRowInPlace) {
  const std::int64_t d = 16, G = 2, gs = (G + 2) * d, w = 2 * gs;
  const AttentionShape s{.seq_q = 5, .seq_k = 5, .heads = 4, .kv_heads = 2, .head_dim = d};
  const RotaryTable t = rotary_table(5, d);
  const auto x = random(static_cast<std::size_t>(5 * w), 4);
  std::vector<float> y = x;
  rotary_apply(s, {y.data(), DType::f32, w, gs}, 4, G, t, false);
  rotary_apply(s, {y.data() + G * d, DType::f32, w, gs}, 2, 1, t, false);
  for (std::int64_t p = 0; p < 5; ++p)
    for (std::int64_t g = 0; g < 2; ++g) {
      for (std::int64_t e = 0; e < d; ++e) EXPECT_EQ(y[p * w + g * gs + (G + 1) * d + e], x[p * w + g * gs + (G + 1) * d + e]);
      // every head of the group and its key head: the same rotation of their own values
      for (std::int64_t hh = 0; hh <= G; ++hh) {
        std::vector<float> one(x.begin() + p * w + g * gs + hh * d, x.begin() + p * w + g * gs + (hh + 1) * d);
        std::vector<float> alone(static_cast<std::size_t>(5 * d), 0.0f);
        std::copy(one.begin(), one.end(), alone.begin() + p * d);
        const AttentionShape a{.seq_q = 5, .seq_k = 5, .heads = 1, .kv_heads = 1, .head_dim = d};
        rotary_apply(a, {alone.data(), DType::f32, d, 0}, 1, 1, t, false);
        for (std::int64_t e = 0; e < d; ++e) EXPECT_EQ(y[p * w + g * gs + hh * d + e], alone[p * d + e]) << p << g << hh;
      }
    }
}

TEST(Rotary, RefusesOddHeadsAndShortTables) {
  EXPECT_THROW(rotary_table(8, 7), std::invalid_argument);
  EXPECT_THROW(rotary_table(0, 8), std::invalid_argument);
  EXPECT_THROW(rotary_table(8, 8, 1.0), std::invalid_argument);
  std::vector<float> x(16 * 8);
  const AttentionShape s{.seq_q = 16, .seq_k = 16, .heads = 1, .kv_heads = 1, .head_dim = 8};
  try {
    rotary_apply(s, {x.data(), DType::f32, 8, 0}, 1, 1, rotary_table(8, 8), false);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the table has 8 positions for sequences of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cubesim::kernels
