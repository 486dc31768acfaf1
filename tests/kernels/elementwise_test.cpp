// GELU and its building blocks against f64 formulas on random inputs, and the derivative against
// a central difference of the f64 function.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kernels/elementwise.h"

namespace cubesim::kernels {
namespace {

double ulp_distance(float a, double ref) {
  const float r = static_cast<float>(ref);
  const double u = std::nextafter(std::fabs(r), INFINITY) - std::fabs(r);
  return std::fabs(static_cast<double>(a) - ref) / u;
}

TEST(Elementwise, ExpWithinTwoUlp) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-87.0f, 88.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng);
    ASSERT_LE(ulp_distance(det_exp(x), std::exp(static_cast<double>(x))), 2.0) << x;
  }
  EXPECT_EQ(det_exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isinf(det_exp(100.0f)));
  EXPECT_EQ(det_exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(det_exp(NAN)));
  // Subnormal results are exact to within their spacing (2^-149), which is all a float can hold.
  for (float x : {-88.0f, -95.0f, -100.0f, -103.0f}) {
    EXPECT_LE(std::fabs(det_exp(x) - std::exp(static_cast<double>(x))), 2 * std::numeric_limits<float>::denorm_min()) << x;
  }
}

TEST(Elementwise, LogWithinTwoUlpOverTheWholeRange) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> bits(1, 0x7f7fffffu);  // every positive finite float, subnormals too
  for (int i = 0; i < 300000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    const double ref = std::log(static_cast<double>(x));
    ASSERT_LE(ulp_distance(det_log(x), ref), 2.0) << x;
  }
  for (float x : {1.0f, 2.0f, 0.5f, 1.41421356f, 1.41421366f, 0.999999f, 1.000001f}) {
    EXPECT_LE(ulp_distance(det_log(x), std::log(static_cast<double>(x))), 2.0) << x;
  }
  EXPECT_EQ(det_log(1.0f), 0.0f);
  EXPECT_EQ(det_log(0.0f), -INFINITY);
  EXPECT_EQ(det_log(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(det_log(-1.0f)));
  EXPECT_TRUE(std::isnan(det_log(NAN)));
}

TEST(Elementwise, SwigluAndItsGradientAgainstF64) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  for (int i = 0; i < 100000; ++i) {
    const float g = u(rng), up = u(rng), dy = u(rng);
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g)));
    const double y = g * s * up;
    ASSERT_NEAR(swiglu(g, up), y, 4e-7 * std::fabs(y) + 1e-30) << g << " " << up;
    const SwigluGrad d = swiglu_backward(g, up, dy);
    const double dg = dy * static_cast<double>(up) * s * (1 + g * (1 - s)), du = dy * g * s;
    ASSERT_NEAR(d.dg, dg, 1e-6 * (std::fabs(dy * up) + std::fabs(dg)) + 1e-30) << g;
    ASSERT_NEAR(d.du, du, 4e-7 * std::fabs(du) + 1e-30) << g;
  }
}

TEST(Elementwise, TanhAndErf) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-9.0f, 9.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    ASSERT_NEAR(det_tanh(x), std::tanh(static_cast<double>(x)), 3e-7) << x;
    ASSERT_NEAR(det_erf(x), std::erf(static_cast<double>(x)), 5e-7) << x;
  }
}

double gelu64(GeluKind k, double x) {
  return k == GeluKind::tanh ? 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)))
                             : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

TEST(Elementwise, GeluForwardAndBackwardAgainstF64) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nrm(0.0f, 2.0f);
  for (GeluKind k : {GeluKind::tanh, GeluKind::erf}) {
    for (int i = 0; i < 100000; ++i) {
      const float x = nrm(rng), dy = nrm(rng);
      const double ref = gelu64(k, x);
      ASSERT_NEAR(gelu(k, x), ref, 1e-6 * (1 + std::fabs(ref))) << gelu_kind_name(k) << " x=" << x;
      const double h = 1e-5;
      const double dref = dy * (gelu64(k, x + h) - gelu64(k, x - h)) / (2 * h);
      ASSERT_NEAR(gelu_backward(k, x, dy), dref, 2e-5 * (1 + std::fabs(dref))) << gelu_kind_name(k) << " x=" << x;
    }
  }
  EXPECT_THROW(parse_gelu_kind("relu"), std::invalid_argument);
}

}  // namespace
}  // namespace cubesim::kernels
