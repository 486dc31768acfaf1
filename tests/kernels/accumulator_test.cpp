// The accumulator models (kernels/accumulator.h): each against its definition written here apart
// from the library, the hopper_tc model's published properties (per-term truncation at 25 bits below
// the largest exponent, a product's exponent e_a + e_b, round toward zero), blocking over k, and the
// refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/accumulator.h"

namespace cubesim::kernels {
namespace {

struct Operands {
  std::int64_t M, N, K;
  DType dt;
  std::vector<std::uint8_t> a, b;
  MatrixView A() const { return MatrixView::row_major(a.data(), dt, M, K); }
  MatrixView B() const { return MatrixView::row_major(b.data(), dt, K, N); }
  float av(std::int64_t i, std::int64_t k) const { return load_f32(a.data(), dt, i * K + k); }
  float bv(std::int64_t k, std::int64_t j) const { return load_f32(b.data(), dt, k * N + j); }
};

Operands random_operands(std::int64_t M, std::int64_t N, std::int64_t K, DType dt, std::uint64_t seed) {
  Operands o{M, N, K, dt, std::vector<std::uint8_t>(static_cast<std::size_t>(M * K) * dtype_size(dt)),
             std::vector<std::uint8_t>(static_cast<std::size_t>(K * N) * dtype_size(dt))};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::int64_t i = 0; i < M * K; ++i) store_f32(o.a.data(), dt, i, nd(rng));
  for (std::int64_t i = 0; i < K * N; ++i) store_f32(o.b.data(), dt, i, nd(rng));
  return o;
}

std::vector<float> run_model(AccumulatorModel m, const Operands& o) {
  std::vector<float> c(static_cast<std::size_t>(o.M * o.N));
  gemm_model(m, o.A(), o.B(), nullptr, MutableMatrixView::row_major(c.data(), DType::f32, o.M, o.N));
  return c;
}

TEST(Accumulator, F32FmaSeqIsTheContract) {
  const Operands o = random_operands(7, 9, 77, DType::bf16, 1);
  std::vector<float> want(static_cast<std::size_t>(7 * 9));
  det_gemm_reference(o.A(), o.B(), nullptr, MutableMatrixView::row_major(want.data(), DType::f32, 7, 9));
  EXPECT_EQ(run_model(AccumulatorModel::f32_fma_seq, o), want);
}

TEST(Accumulator, Bf16AccAndPairwiseFollowTheirDefinitions) {
  for (std::int64_t K : {1, 31, 32, 33, 100}) {
    const Operands o = random_operands(3, 4, K, DType::bf16, 10 + static_cast<std::uint64_t>(K));
    const auto narrow = run_model(AccumulatorModel::bf16_acc, o);
    const auto pair = run_model(AccumulatorModel::pairwise, o);
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 4; ++j) {
        float acc = 0.0f;
        for (std::int64_t k = 0; k < K; ++k) acc = round_to(DType::bf16, std::fma(o.av(i, k), o.bv(k, j), acc));
        EXPECT_EQ(narrow[static_cast<std::size_t>(i * 4 + j)], acc) << "bf16_acc K=" << K;
        // Groups of 32 from k = 0; in a group, levels of adjacent pairs, an odd last element carried.
        float s = 0.0f;
        for (std::int64_t k0 = 0; k0 < K; k0 += 32) {
          std::vector<float> level;
          for (std::int64_t k = k0; k < std::min(K, k0 + 32); ++k) level.push_back(o.av(i, k) * o.bv(k, j));
          while (level.size() > 1) {
            std::vector<float> up;
            for (std::size_t q = 0; q + 1 < level.size(); q += 2) up.push_back(level[q] + level[q + 1]);
            if (level.size() % 2) up.push_back(level.back());
            level = up;
          }
          s = s + level[0];
        }
        EXPECT_EQ(pair[static_cast<std::size_t>(i * 4 + j)], s) << "pairwise K=" << K;
      }
  }
}

float tc(float acc, std::vector<float> a, std::vector<float> b) {
  return hopper_tc_step(acc, a.data(), b.data(), static_cast<int>(a.size()));
}

TEST(HopperTc, ExactWhenEveryTermFitsAndTruncatesEachTermBelowTwentyFiveBits) {
  // Small integers: every term and the sum are exact.
  EXPECT_EQ(tc(3.0f, {1, 2, -3, 4}, {5, -6, 7, 8}), 3.0f + 5 - 12 - 21 + 32);
  // Sixteen terms of 2^-26 beside c = 1: each lies below the 25th bit under 2^0 and is cut, although
  // their exact sum with c, 1 + 2^-22, is an f32 value (summing the products first keeps it).
  std::vector<float> a(16, std::ldexp(1.0f, -26)), b(16, 1.0f);
  EXPECT_EQ(tc(1.0f, a, b), 1.0f);
  float products = 0.0f;
  for (int i = 0; i < 16; ++i) products += a[i] * b[i];
  EXPECT_EQ(1.0f + products, 1.0f + std::ldexp(1.0f, -22));
  // Without c the largest exponent is the products' own: nothing is cut.
  EXPECT_EQ(tc(0.0f, a, b), std::ldexp(1.0f, -22));
  // At 2^-25 they are kept: 16 · 2^-25 = 2^-21.
  std::fill(a.begin(), a.end(), std::ldexp(1.0f, -25));
  EXPECT_EQ(tc(1.0f, a, b), 1.0f + std::ldexp(1.0f, -21));
}

TEST(HopperTc, AProductsExponentIsTheSumOfItsOperandsExponents) {
  // 1.5 · 1.5 = 2.25 has exponent 0 + 0 (significand 2.25 in [1, 4)), so the alignment is to 2^0 and
  // terms of 2^-25 survive; aligned to 2.25's own leading bit (2^1) they would be cut.
  std::vector<float> a{1.5f}, b{1.5f};
  for (int i = 0; i < 8; ++i) a.push_back(std::ldexp(1.0f, -25)), b.push_back(1.0f);
  EXPECT_EQ(tc(0.0f, a, b), 2.25f + std::ldexp(1.0f, -22));
}

TEST(HopperTc, RoundsTowardZeroAndKeepsSigns) {
  // 1 + 3·2^-25 in exact terms rounds to nearest as 1 + 2^-23, toward zero as 1.
  EXPECT_EQ(tc(1.0f, {std::ldexp(1.0f, -24), std::ldexp(1.0f, -25)}, {1.0f, 1.0f}), 1.0f);
  EXPECT_EQ(tc(-1.0f, {std::ldexp(1.0f, -24), std::ldexp(1.0f, -25)}, {-1.0f, -1.0f}), -1.0f);
  // Truncation is of magnitudes: -(2^-26) beside 1 is cut to 0, not floored to -2^-25.
  EXPECT_EQ(tc(1.0f, {std::ldexp(1.0f, -26)}, {-1.0f}), 1.0f);
  EXPECT_EQ(tc(0.0f, {0.0f, 0.0f}, {1.0f, 2.0f}), 0.0f);
  EXPECT_TRUE(std::isnan(tc(1.0f, {NAN, 1.0f}, {1.0f, 1.0f})));
  EXPECT_EQ(tc(1.0f, {INFINITY}, {2.0f}), INFINITY);
}

TEST(HopperTc, TinyGroupsAreCutAtTwoToTheMinus158) {
  // Products 2^-134 and -2^-159: 25 bits below 2^-134 would keep the second (2^-134 - 2^-159, then
  // cut to the subnormal grid: 2^-134 - 2^-149); the alignment floor of 2^-133 cuts it: 2^-134.
  EXPECT_EQ(tc(0.0f, {std::ldexp(1.0f, -67), std::ldexp(1.0f, -80)}, {std::ldexp(1.0f, -67), -std::ldexp(1.0f, -79)}),
            std::ldexp(1.0f, -134));
  // From 2^-133 up the cut is 25 bits below the largest term as before: -2^-158 beside 2^-133 stays.
  EXPECT_EQ(tc(0.0f, {std::ldexp(1.0f, -66), std::ldexp(1.0f, -79)}, {std::ldexp(1.0f, -67), -std::ldexp(1.0f, -79)}),
            std::ldexp(1.0f, -133) - std::ldexp(1.0f, -149));
  // A negative sum below the least subnormal is cut to +0, not -0.
  const float z = tc(0.0f, {-std::ldexp(1.0f, -75)}, {std::ldexp(1.0f, -76)});
  EXPECT_EQ(z, 0.0f);
  EXPECT_FALSE(std::signbit(z));
}

TEST(HopperTc, ASumBeyondTheF32RangeIsInfiniteNotTheLargestFloat) {
  // IEEE round-toward-zero would give FLT_MAX; the tensor core gives inf (measured on an H200).
  const float big = std::ldexp(1.0f, 100);
  EXPECT_EQ(tc(0.0f, {big}, {std::ldexp(1.0f, 30)}), INFINITY);
  EXPECT_EQ(tc(0.0f, {big}, {-std::ldexp(1.0f, 28)}), -INFINITY);
  // Products beyond the range that cancel leave a finite sum: only the group's sum overflows.
  EXPECT_EQ(tc(0.0f, {big, big}, {std::ldexp(1.0f, 30), -std::ldexp(1.0f, 30)}), 0.0f);
  // Just below 2^128 the sum is cut to FLT_MAX (rounding to nearest would give inf).
  const float m = std::ldexp(1.0f, 64);
  EXPECT_EQ(tc(std::numeric_limits<float>::max(), {m}, {std::ldexp(1.0f, 39)}), std::numeric_limits<float>::max());
  EXPECT_EQ(tc(std::numeric_limits<float>::max(), {m}, {std::ldexp(1.0f, 40)}), INFINITY);  // exactly 2^128
  // An infinite accumulator stays infinite beside products beyond the f32 range of the other sign
  // (exact products: no inf - inf); inf - inf from the inputs themselves is NaN.
  EXPECT_EQ(tc(-INFINITY, {big}, {std::ldexp(1.0f, 40)}), -INFINITY);
  EXPECT_TRUE(std::isnan(tc(-INFINITY, {INFINITY}, {1.0f})));
}

TEST(HopperTc, GroupsOfSixteenAlongKWhateverTheBlocking) {
  const Operands o = random_operands(5, 6, 100, DType::bf16, 3);
  const auto whole = run_model(AccumulatorModel::hopper_tc, o);
  // Blocks of 32 (two groups each), the last one short.
  std::vector<float> acc(30, 0.0f);
  for (std::int64_t k0 = 0; k0 < 100; k0 += 32) {
    const std::int64_t kb = std::min<std::int64_t>(32, 100 - k0);
    accumulate_model(AccumulatorModel::hopper_tc, o.A().block(0, k0, 5, kb), o.B().block(k0, 0, kb, 6), acc.data(), 6,
                     k0 + kb >= 100);
  }
  EXPECT_EQ(acc, whole);
  // Element (i, j) is the steps over groups of 16 from c = 0.
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 6; ++j) {
      float c = 0.0f;
      for (std::int64_t k0 = 0; k0 < 100; k0 += 16) {
        std::vector<float> a, b;
        for (std::int64_t k = k0; k < std::min<std::int64_t>(100, k0 + 16); ++k) a.push_back(o.av(i, k)), b.push_back(o.bv(k, j));
        c = tc(c, a, b);
      }
      EXPECT_EQ(whole[static_cast<std::size_t>(i * 6 + j)], c);
    }
  // It is not the contract's sum (on random data some elements differ), but close to it.
  std::vector<float> contract(30);
  det_gemm_reference(o.A(), o.B(), nullptr, MutableMatrixView::row_major(contract.data(), DType::f32, 5, 6));
  int differ = 0;
  for (std::size_t e = 0; e < 30; ++e) {
    differ += whole[e] != contract[e];
    EXPECT_NEAR(whole[e], contract[e], 1e-4 * (1 + std::fabs(contract[e])));
  }
  EXPECT_GT(differ, 0);
}

TEST(Accumulator, RefusesWhatItCannotModel) {
  const Operands o = random_operands(2, 2, 40, DType::bf16, 4);
  std::vector<float> acc(4, 0.0f);
  try {
    accumulate_model(AccumulatorModel::pairwise, o.A().block(0, 0, 2, 20), o.B().block(0, 0, 20, 2), acc.data(), 2, false);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a k-block of 20 is not a whole number of the model's groups of 32"),
              std::string::npos) << e.what();
  }
  const Operands f = random_operands(2, 2, 8, DType::f32, 5);
  EXPECT_THROW(run_model(AccumulatorModel::hopper_tc, f), std::invalid_argument);
  EXPECT_NO_THROW(run_model(AccumulatorModel::pairwise, f));
  EXPECT_THROW(parse_accumulator_model("tf32_acc"), std::invalid_argument);
  for (AccumulatorModel m : kAccumulatorModels) EXPECT_EQ(parse_accumulator_model(accumulator_model_name(m)), m);
}

}  // namespace
}  // namespace cubesim::kernels
