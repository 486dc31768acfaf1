// The vocabulary's kernels (kernels/vocab.h) against f64 on random data, outputs poisoned first: the
// embedding lookup and its gradient on a slice of the vocabulary, and the cross-entropy's pieces (the
// loss of a whole vocabulary, and of slices combined as the vocab-parallel all-reduces combine them),
// its gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/vocab.h"

namespace cubesim::kernels {
namespace {

std::vector<float> random(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> u(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}
std::vector<std::int64_t> ids(std::size_t n, std::int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> u(0, vocab - 1);
  std::vector<std::int64_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(Vocab, EmbeddingLooksUpItsSliceAndSumsGradientsInTokenOrder) {
  const std::int64_t vocab = 50, hidden = 12, tokens = 200, start = 20, rows = 15;  // the slice [20, 35)
  const auto w = random(static_cast<std::size_t>(rows * hidden), 1, 1.0f), dy = random(tokens * hidden, 2, 1.0f);
  const auto tok = ids(tokens, vocab, 3);
  std::vector<float> out(tokens * hidden, NAN), dw(rows * hidden, NAN);
  embedding_forward({w.data(), DType::f32, hidden}, rows, start, tok.data(), tokens, hidden, {out.data(), DType::f32, hidden});
  embedding_backward({dy.data(), DType::f32, hidden}, tok.data(), tokens, hidden, rows, start, {dw.data(), DType::f32, hidden});
  std::vector<double> ref(rows * hidden, 0.0);
  int mine = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const bool in = tok[t] >= start && tok[t] < start + rows;
    mine += in;
    for (std::int64_t e = 0; e < hidden; ++e) {
      ASSERT_EQ(out[t * hidden + e], in ? w[(tok[t] - start) * hidden + e] : 0.0f) << t;
      if (in) ref[(tok[t] - start) * hidden + e] += dy[t * hidden + e];
    }
  }
  ASSERT_GT(mine, 20);
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << i;
}

TEST(Vocab, CrossEntropyAndItsGradientAgainstF64WholeAndInSlices) {
  const std::int64_t vocab = 300, tokens = 40;
  const auto logits = random(tokens * vocab, 4, 3.0f);
  const auto tgt = ids(tokens, vocab, 5);
  // The whole vocabulary at once.
  std::vector<float> m(tokens), part(2 * tokens, NAN), dl(tokens), dx(tokens * vocab, NAN);
  cross_entropy_max({logits.data(), DType::f32, vocab}, tokens, vocab, m.data());
  cross_entropy_partials({logits.data(), DType::f32, vocab}, tokens, vocab, m.data(), tgt.data(), 0, part.data());
  const auto dloss = random(tokens, 6, 1.0f);
  cross_entropy_backward({logits.data(), DType::f32, vocab}, tokens, vocab, m.data(), part.data(), tgt.data(), 0,
                         dloss.data(), {dx.data(), DType::f32, vocab});
  // Three slices of 100, combined as the all-reduces would: max, then sums.
  std::vector<float> ms(tokens, -INFINITY), ps(2 * tokens, 0.0f);
  for (std::int64_t r = 0; r < 3; ++r) {
    std::vector<float> mr(tokens);
    cross_entropy_max({logits.data() + r * 100, DType::f32, vocab}, tokens, 100, mr.data());
    for (std::int64_t t = 0; t < tokens; ++t) ms[t] = std::max(ms[t], mr[t]);
  }
  for (std::int64_t r = 0; r < 3; ++r) {
    std::vector<float> pr(2 * tokens);
    cross_entropy_partials({logits.data() + r * 100, DType::f32, vocab}, tokens, 100, ms.data(), tgt.data(), r * 100,
                           pr.data());
    for (std::size_t i = 0; i < pr.size(); ++i) ps[i] += pr[i];
  }
  for (std::int64_t t = 0; t < tokens; ++t) {
    double mx = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, double(logits[t * vocab + j]));
    for (std::int64_t j = 0; j < vocab; ++j) s += std::exp(logits[t * vocab + j] - mx);
    const double loss = std::log(s) + mx - logits[t * vocab + tgt[t]];
    EXPECT_EQ(m[t], ms[t]);
    EXPECT_NEAR(cross_entropy_loss(part[2 * t], m[t], part[2 * t + 1]), loss, 2e-6 * (1 + loss)) << t;
    EXPECT_NEAR(cross_entropy_loss(ps[2 * t], ms[t], ps[2 * t + 1]), loss, 2e-6 * (1 + loss)) << t;
    for (std::int64_t j = 0; j < vocab; ++j) {
      const double g = (std::exp(logits[t * vocab + j] - mx) / s - (j == tgt[t])) * dloss[t];
      ASSERT_NEAR(dx[t * vocab + j], g, 1e-6 * (1 + std::fabs(g))) << t << " " << j;
    }
  }
  // The gradient of the summed loss by central differences, for a few logits (the sign and scale).
  for (std::int64_t t : {0, 17}) {
    for (std::int64_t j : {tgt[t], (tgt[t] + 1) % vocab}) {
      auto loss_at = [&](double delta) {
        double mx = -INFINITY, s = 0;
        std::vector<double> row(logits.begin() + t * vocab, logits.begin() + (t + 1) * vocab);
        row[j] += delta;
        for (double x : row) mx = std::max(mx, x);
        for (double x : row) s += std::exp(x - mx);
        return std::log(s) + mx - row[tgt[t]];
      };
      const double fd = (loss_at(1e-4) - loss_at(-1e-4)) / 2e-4 * dloss[t];
      EXPECT_NEAR(dx[t * vocab + j], fd, 1e-4) << t << " " << j;
    }
  }
}

}  // namespace
}  // namespace cubesim::kernels
