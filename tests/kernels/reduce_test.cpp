// The reduction step (kernels/reduce.h): each vector path (AVX2 and F16C, AVX-512) gives the scalar loop's bits
// for every dtype and op, on random bit patterns that include NaNs, infinities, subnormals, signed
// zeros and values that overflow when added, at every length around the vector width; and the
// sum against its definition computed in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/reduce.h"

namespace cubesim::kernels {
namespace {

// Random bytes of dtype d: mostly ordinary values, with the special patterns mixed in.
std::vector<std::uint8_t> random_bits(DType d, std::int64_t n, std::mt19937_64& rng, bool nans) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(n) * dtype_size(d));
  std::uniform_int_distribution<int> pick(0, 15);
  std::uniform_real_distribution<float> val(-4.0f, 4.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    float f = val(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
    std::uint32_t raw = 0;
    bool use_raw = false;
    switch (pick(rng)) {
      case 0: f = nans ? std::numeric_limits<float>::quiet_NaN() : 1.0f; break;
      case 1: f = (rng() & 1) ? INFINITY : -INFINITY; break;
      case 2: f = (rng() & 1) ? 0.0f : -0.0f; break;
      case 3: f = (rng() & 1) ? 60000.0f : 3.3e38f; break;  // sums overflow f16 / f32
      case 4: raw = static_cast<std::uint32_t>(rng()); use_raw = true; break;  // any pattern (subnormals, NaNs)
      default: break;
    }
    if (use_raw && !nans) {
      // Any pattern that is not a NaN of the dtype.
      if (d == DType::f32 && (raw & 0x7fffffffu) > 0x7f800000u) raw &= 0xff7fffffu;
      if (d != DType::f32 && (raw & 0x7fffu) > (d == DType::bf16 ? 0x7f80u : 0x7c00u)) raw &= 0xbfffu;
    }
    if (d == DType::f32) {
      const std::uint32_t b = use_raw ? raw : std::bit_cast<std::uint32_t>(f);
      std::memcpy(v.data() + 4 * i, &b, 4);
    } else {
      const std::uint16_t b = use_raw ? static_cast<std::uint16_t>(raw)
                                      : (d == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f));
      std::memcpy(v.data() + 2 * i, &b, 2);
    }
  }
  return v;
}

// Each vector loop this CPU runs (AVX2 and AVX-512 on most hosts, both when both exist) against the
// scalar loop, on fresh random bits each run (the seed is printed), at lengths around every vector
// width and the loops' 64-byte line, from offsets that leave the operands misaligned.
TEST(ReduceValues, EveryVectorPathGivesTheScalarBits) {
  // CUBESIM_TEST_SEED=<seed> replays a failing run's draw.
  const char* given = std::getenv("CUBESIM_TEST_SEED");
  const std::uint64_t seed = given ? std::strtoull(given, nullptr, 10) : std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CUBESIM_TEST_SEED to replay)");
  std::mt19937_64 rng(seed);
  int paths = 0;
  for (ReduceIsa isa : {ReduceIsa::automatic, ReduceIsa::avx2, ReduceIsa::avx512}) {
    if (!reduce_isa_available(isa)) {
      EXPECT_THROW(reduce_values(nullptr, nullptr, DType::f32, 0, ReduceOp::sum, isa), std::invalid_argument);
      continue;
    }
    ++paths;
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      for (ReduceOp op : kAllReduceOps) {
        for (std::int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099, 70000}) {
          const std::int64_t off = static_cast<std::int64_t>(rng() % 5);  // elements: misaligned starts
          // f32 sums of two NaNs keep either payload (the hardware's choice): NaNs only in dst there.
          const bool src_nans = !(d == DType::f32 && op == ReduceOp::sum);
          const auto a = random_bits(d, n + off, rng, true), b = random_bits(d, n + off, rng, src_nans);
          auto fast = a, slow = a;
          const std::size_t o = static_cast<std::size_t>(off) * dtype_size(d);
          reduce_values(fast.data() + o, b.data() + o, d, n, op, isa);
          reduce_values_scalar(slow.data() + o, b.data() + o, d, n, op);
          ASSERT_EQ(fast, slow) << reduce_isa_name(isa) << " " << dtype_name(d) << " " << reduce_op_name(op)
                                << " n=" << n << " offset " << off;
        }
      }
    }
  }
  if (reduce_isa_automatic() == ReduceIsa::scalar) GTEST_SKIP() << "no AVX2/F16C on this CPU: only the scalar loop";
  EXPECT_GE(paths, 2) << "automatic and at least one forced vector loop";
}

TEST(ReduceValues, AutomaticIsTheWidestAvailable) {
  const ReduceIsa a = reduce_isa_automatic();
  EXPECT_TRUE(reduce_isa_available(a));
  if (reduce_isa_available(ReduceIsa::avx512)) EXPECT_EQ(a, ReduceIsa::avx512);
  else if (reduce_isa_available(ReduceIsa::avx2)) EXPECT_EQ(a, ReduceIsa::avx2);
  else EXPECT_EQ(a, ReduceIsa::scalar);
  EXPECT_EQ(reduce_simd_available(), a != ReduceIsa::scalar);
}

// reduce.h's definition: both operands widened exactly, the f32 sum (an IEEE f32 addition: the f64
// sum of two f32 values is exact, so casting it rounds once), then the store's rounding to the dtype.
TEST(ReduceValues, SumIsTheF32SumRoundedToTheDtype) {
  std::mt19937_64 rng(7);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    const std::int64_t n = 5000;
    const auto a = random_bits(d, n, rng, false), b = random_bits(d, n, rng, false);
    auto got = a;
    reduce_values(got.data(), b.data(), d, n, ReduceOp::sum);
    for (std::int64_t i = 0; i < n; ++i) {
      const double x = load_f32(a.data(), d, i), y = load_f32(b.data(), d, i);
      const float want = round_to(d, static_cast<float>(x + y));
      const float g = load_f32(got.data(), d, i);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(g)) << i;
      } else {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(g), std::bit_cast<std::uint32_t>(want))
            << dtype_name(d) << " " << x << " + " << y << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace cubesim::kernels
