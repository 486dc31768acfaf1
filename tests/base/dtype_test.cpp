#include "base/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cubesim {
namespace {

float f(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

TEST(DType, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  try {
    parse_dtype("fp8");
    FAIL() << "parse_dtype accepted fp8";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'fp8'"), std::string::npos) << m;
    EXPECT_NE(m.find("f32"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16"), std::string::npos) << m;
    EXPECT_NE(m.find("f16"), std::string::npos) << m;
  }
  EXPECT_FALSE(dtype_valid(static_cast<DType>(7)));
  EXPECT_EQ(dtype_name(static_cast<DType>(7)), "?");
}

struct Case {
  std::uint32_t in;
  std::uint16_t out;
  const char* what;
};

TEST(DType, F32ToBf16KnownPatterns) {
  const Case cases[] = {
      {0x3f800000, 0x3f80, "1.0"},
      {0x3eaaaaab, 0x3eab, "1/3 rounds up"},
      {0x3f808000, 0x3f80, "tie, even lsb stays"},
      {0x3f818000, 0x3f82, "tie, odd lsb rounds up to even"},
      {0x3f808001, 0x3f81, "just above a tie"},
      {0x3f807fff, 0x3f80, "just below a tie"},
      {0xbf818000, 0xbf82, "negative tie"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x00000001, 0x0000, "smallest f32 subnormal rounds to 0"},
      {0x00008000, 0x0000, "subnormal tie to even 0"},
      {0x00008001, 0x0001, "smallest bf16 subnormal"},
      {0x00018000, 0x0002, "subnormal tie up to even"},
      {0x807fffff, 0x8080, "largest negative subnormal rounds to smallest normal"},
      {0x7f7f0000, 0x7f7f, "max finite bf16"},
      {0x7f7f7fff, 0x7f7f, "below the overflow tie"},
      {0x7f7f8000, 0x7f80, "overflow tie rounds to inf (odd lsb)"},
      {0x7f7fffff, 0x7f80, "max finite f32 rounds up to inf"},
      {0xff7fffff, 0xff80, "-max f32 rounds to -inf"},
      {0x7f800000, 0x7f80, "+inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x7fc00000, 0x7fff, "quiet NaN -> canonical"},
      {0xffc00000, 0x7fff, "negative NaN -> canonical (CUDA drops the sign)"},
      {0x7f800001, 0x7fff, "signalling NaN whose payload is below bit 16 stays NaN"},
      {0x7fffffff, 0x7fff, "NaN with all-ones payload does not carry"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(f32_to_bf16(f(c.in)), c.out) << c.what << " (0x" << std::hex << c.in << ")";
  }
}

TEST(DType, F32ToF16KnownPatterns) {
  const Case cases[] = {
      {0x3f800000, 0x3c00, "1.0"},
      {0x3eaaaaab, 0x3555, "1/3"},
      {0x3f801000, 0x3c00, "tie, even lsb stays"},
      {0x3f803000, 0x3c02, "tie, odd lsb rounds up to even"},
      {0x3f801001, 0x3c01, "just above a tie"},
      {0x477fe000, 0x7bff, "65504 = max finite f16"},
      {0x477fefff, 0x7bff, "just below 65520"},
      {0x477ff000, 0x7c00, "65520 rounds to inf"},
      {0x49742400, 0x7c00, "1e6 overflows to inf"},
      {0xc77ff000, 0xfc00, "-65520 rounds to -inf"},
      {0x7f7fffff, 0x7c00, "max f32 -> inf"},
      {0x38800000, 0x0400, "2^-14 smallest normal"},
      {0x387fffff, 0x0400, "just below 2^-14 rounds up to the smallest normal"},
      {0x387fc000, 0x03ff, "largest subnormal"},
      {0x33800000, 0x0001, "2^-24 smallest subnormal"},
      {0x33000000, 0x0000, "2^-25 tie rounds to even 0"},
      {0x33000001, 0x0001, "just above 2^-25 rounds up"},
      {0xb3000000, 0x8000, "-2^-25 -> -0"},
      {0x33c00000, 0x0002, "1.5 units tie -> 2"},
      {0x34200000, 0x0002, "2.5 units tie -> 2"},
      {0x34600000, 0x0004, "3.5 units tie -> 4"},
      {0x00000001, 0x0000, "f32 subnormal -> 0"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7c00, "+inf"},
      {0xff800000, 0xfc00, "-inf"},
      {0x7fc00000, 0x7fff, "NaN -> canonical"},
      {0xffc00001, 0x7fff, "negative NaN -> canonical"},
      {0x7f800001, 0x7fff, "signalling NaN with low payload stays NaN"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(f32_to_f16(f(c.in)), c.out) << c.what << " (0x" << std::hex << c.in << ")";
  }
}

TEST(DType, WideningKnownPatterns) {
  EXPECT_EQ(bits(bf16_to_f32(0x3f80)), 0x3f800000u);
  EXPECT_EQ(bits(bf16_to_f32(0x7f7f)), 0x7f7f0000u);
  EXPECT_EQ(bits(bf16_to_f32(0x0001)), 0x00010000u);
  EXPECT_EQ(bits(bf16_to_f32(0xff80)), 0xff800000u);
  EXPECT_EQ(bits(bf16_to_f32(0x7fff)), 0x7fff0000u);
  EXPECT_EQ(bits(bf16_to_f32(0xff81)), 0xff810000u) << "a NaN keeps its bits, as __bfloat162float";
  EXPECT_EQ(bits(f16_to_f32(0x3c00)), 0x3f800000u);
  EXPECT_EQ(bits(f16_to_f32(0x0001)), 0x33800000u);
  EXPECT_EQ(bits(f16_to_f32(0x03ff)), 0x387fc000u);
  EXPECT_EQ(bits(f16_to_f32(0x0400)), 0x38800000u);
  EXPECT_EQ(bits(f16_to_f32(0x7bff)), 0x477fe000u);
  EXPECT_EQ(bits(f16_to_f32(0x7c00)), 0x7f800000u);
  EXPECT_EQ(bits(f16_to_f32(0xfc00)), 0xff800000u);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
  // Every f16 NaN widens to the canonical f32 NaN, as the GPU's __half2float does.
  EXPECT_EQ(bits(f16_to_f32(0x7e00)), 0x7fffffffu);
  EXPECT_EQ(bits(f16_to_f32(0xfc01)), 0x7fffffffu);
  EXPECT_EQ(bits(f16_to_f32(0x7fff)), 0x7fffffffu);
}

// Every non-NaN 16-bit pattern widens and narrows back to itself.
TEST(DType, RoundTripIsIdentityForEveryPattern) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    if (!std::isnan(bf16_to_f32(x))) {
      ASSERT_EQ(f32_to_bf16(bf16_to_f32(x)), x) << "bf16 0x" << std::hex << h;
    }
    if (!std::isnan(f16_to_f32(x))) {
      ASSERT_EQ(f32_to_f16(f16_to_f32(x)), x) << "f16 0x" << std::hex << h;
    }
  }
}

// An independent oracle: the rounded value is a nearest representable one (in f64), ties going to
// the even pattern; overflow follows from treating 2^16 (f16) and 2^128 (bf16) as the next step.
template <class Widen, class Narrow>
void check_nearest_even(std::uint32_t x_bits, Widen widen, Narrow narrow, double overflow_step, const char* what) {
  const float x = f(x_bits);
  const std::uint16_t h = narrow(x);
  if (std::isnan(x)) {
    ASSERT_EQ(h, 0x7fff) << what;
    return;
  }
  const double xd = x;
  const double got = widen(h);
  const std::uint16_t mag = h & 0x7fff;
  const std::uint16_t sign = h & 0x8000;
  auto value_of = [&](std::uint16_t m) -> double {
    const double v = widen(static_cast<std::uint16_t>(sign | m));
    return std::isinf(v) ? std::copysign(overflow_step, v) : v;
  };
  const double got_v = value_of(mag);
  ASSERT_EQ(std::signbit(got), std::signbit(xd)) << what << " 0x" << std::hex << x_bits;
  const double err = std::fabs(xd - got_v);
  // Neighbours in magnitude: one step down (when > 0) and one step up (while finite).
  const bool is_inf = std::isinf(got);
  if (mag > 0) {
    const double down = std::fabs(xd - value_of(mag - 1));
    ASSERT_TRUE(err < down || (err == down && (mag % 2 == 0))) << what << " 0x" << std::hex << x_bits;
  }
  if (!is_inf) {
    const double up = std::fabs(xd - value_of(mag + 1));
    ASSERT_TRUE(err < up || (err == up && (mag % 2 == 0))) << what << " 0x" << std::hex << x_bits;
  }
}

TEST(DType, NarrowingIsNearestEvenOnSampledFloats) {
  std::mt19937_64 rng(42);
  std::vector<std::uint32_t> samples;
  for (std::uint64_t x = 0; x < (1ull << 32); x += 4099) samples.push_back(static_cast<std::uint32_t>(x));
  for (int i = 0; i < 200000; ++i) samples.push_back(static_cast<std::uint32_t>(rng()));
  // Dense around the edges: f16 overflow, f16 subnormals, bf16 overflow, ties.
  for (std::uint32_t base : {0x477fe000u, 0x477ff000u, 0x38800000u, 0x33000000u, 0x33800000u, 0x7f7f8000u}) {
    for (std::uint32_t d = 0; d < 4096; ++d) samples.push_back(base - 2048 + d);
  }
  for (std::uint32_t x : samples) {
    for (std::uint32_t s : {0u, 0x80000000u}) {
      check_nearest_even(x ^ s, bf16_to_f32, f32_to_bf16, 0x1p128, "bf16");
      check_nearest_even(x ^ s, f16_to_f32, f32_to_f16, 65536.0, "f16");
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("f16c"))) std::uint16_t hw_f32_to_f16(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(std::uint16_t h) { return _cvtsh_ss(h); }

// Cross-check against the CPU's own F16C conversion where the CPU has it (it rounds the same way;
// only its NaNs differ: it keeps payloads where CUDA gives canonical NaNs).
TEST(DType, F16MatchesF16cHardware) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    if ((h & 0x7fff) > 0x7c00) continue;  // NaN
    ASSERT_EQ(bits(f16_to_f32(x)), bits(hw_f16_to_f32(x))) << "0x" << std::hex << h;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float x = f(static_cast<std::uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_f16(x), hw_f32_to_f16(x)) << "0x" << std::hex << bits(x);
  }
}
#endif

TEST(DType, BulkConversionsMatchScalar) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::vector<float> x(1000);
  for (float& v : x) v = u(rng);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = 1e-30f;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::uint8_t> buf(x.size() * dtype_size(t));
    convert_from_f32(x.data(), buf.data(), t, x.size());
    std::vector<float> back(x.size());
    convert_to_f32(buf.data(), t, back.data(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(bits(back[i]), bits(load_f32(buf.data(), t, static_cast<std::int64_t>(i))));
      if (i > 0) {
        EXPECT_EQ(bits(back[i]), bits(round_to(t, x[i]))) << dtype_name(t) << " " << i;
      }
    }
  }
  EXPECT_THROW(convert_to_f32(nullptr, static_cast<DType>(9), nullptr, 0), std::invalid_argument);
}

}  // namespace
}  // namespace cubesim
