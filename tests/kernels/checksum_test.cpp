// Checksums (kernels/checksum.h) against a 128-bit reference on random data, what each kind detects,
// and ABFT for det_gemm (kernels/abft.h): no false positive on clean random GEMMs, every corrupted
// element above the threshold found and located.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gemm_test_util.h"
#include "kernels/abft.h"
#include "kernels/checksum.h"

namespace cubesim::kernels {
namespace {

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

// The definition, written another way: words as unsigned, sign by subtraction, summed in 128 bits.
std::uint64_t reference(const std::vector<std::uint8_t>& b, DType t, ChecksumKind kind, std::uint64_t base = 0) {
  const std::size_t w = dtype_size(t);
  unsigned __int128 s = 0;
  for (std::size_t i = 0; i * w < b.size(); ++i) {
    std::uint64_t u = 0;
    for (std::size_t j = 0; j < w; ++j) u |= static_cast<std::uint64_t>(b[i * w + j]) << (8 * j);
    if (kind == ChecksumKind::word) {
      const std::int64_t v = static_cast<std::int64_t>(u) - ((u >> (8 * w - 1)) ? (std::int64_t{1} << (8 * w)) : 0);
      s += static_cast<unsigned __int128>(static_cast<std::uint64_t>(v));
    } else {
      // fmix32 spelled out (MurmurHash3's constants), the position's low 32 bits by 128-bit product.
      const auto pos = static_cast<std::uint32_t>(static_cast<unsigned __int128>(base + i + 1) * kMixStep);
      std::uint32_t h = static_cast<std::uint32_t>(u) ^ pos;
      h ^= h >> 16, h *= 0x85ebca6bu, h ^= h >> 13, h *= 0xc2b2ae35u, h ^= h >> 16;
      s += h;
    }
  }
  return static_cast<std::uint64_t>(s);
}

TEST(Checksum, MatchesTheReferenceOnRandomData) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (ChecksumKind k : kChecksumKinds)
      for (std::size_t n : {0u, 1u, 7u, 1000u, 65537u}) {
        const auto b = random_bytes(n * dtype_size(t), n * 31 + static_cast<int>(t));
        EXPECT_EQ(checksum(b.data(), t, static_cast<std::int64_t>(n), k), reference(b, t, k))
            << dtype_name(t) << " " << checksum_kind_name(k) << " n=" << n;
      }
}

TEST(Checksum, EveryBitOfEveryWordCounts) {
  for (DType t : {DType::f32, DType::bf16}) {
    const std::size_t w = dtype_size(t);
    auto b = random_bytes(64 * w, 5);
    for (ChecksumKind k : kChecksumKinds) {
      const std::uint64_t clean = checksum(b.data(), t, 64, k);
      for (std::size_t byte = 0; byte < b.size(); byte += 3)
        for (int bit = 0; bit < 8; ++bit) {
          b[byte] ^= static_cast<std::uint8_t>(1u << bit);
          EXPECT_NE(checksum(b.data(), t, 64, k), clean) << checksum_kind_name(k) << " byte " << byte << " bit " << bit;
          b[byte] ^= static_cast<std::uint8_t>(1u << bit);
        }
    }
  }
}

TEST(Checksum, OnlyMixCatchesSwappedWords) {
  auto b = random_bytes(2 * 512, 9);
  const auto word = checksum(b.data(), DType::bf16, 512, ChecksumKind::word);
  const auto mix = checksum(b.data(), DType::bf16, 512, ChecksumKind::mix);
  std::swap(b[10], b[400]), std::swap(b[11], b[401]);  // elements 5 and 200
  ASSERT_NE(b[10] | (b[11] << 8), b[400] | (b[401] << 8));
  EXPECT_EQ(checksum(b.data(), DType::bf16, 512, ChecksumKind::word), word);
  EXPECT_NE(checksum(b.data(), DType::bf16, 512, ChecksumKind::mix), mix);
}

TEST(Checksum, ThePairIsBothKinds) {
  const auto b = random_bytes(2 * 999, 12);
  const ChecksumPair p = checksum_pair(b.data(), DType::bf16, 999, 17);
  EXPECT_EQ(p.word, checksum(b.data(), DType::bf16, 999, ChecksumKind::word, 17));
  EXPECT_EQ(p.mix, checksum(b.data(), DType::bf16, 999, ChecksumKind::mix, 17));
}

TEST(Checksum, ChunksAddUpToTheWhole) {
  const auto b = random_bytes(4 * 1000, 11);
  for (ChecksumKind k : kChecksumKinds) {
    std::uint64_t parts = 0;
    const std::int64_t edges[] = {0, 300, 301, 777, 1000};
    for (int c = 0; c < 4; ++c)
      parts += checksum(b.data() + edges[c] * 4, DType::f32, edges[c + 1] - edges[c], k,
                        static_cast<std::uint64_t>(edges[c]));
    EXPECT_EQ(parts, checksum(b.data(), DType::f32, 1000, k)) << checksum_kind_name(k);
  }
}

TEST(Checksum, KindNamesRoundTripAndBadNamesAreRefused) {
  for (ChecksumKind k : kChecksumKinds) EXPECT_EQ(parse_checksum_kind(checksum_kind_name(k)), k);
  try {
    parse_checksum_kind("crc");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'crc' (valid: word, mix)"), std::string::npos) << e.what();
  }
}

using testing::HostMatrix;
using testing::Layout;

struct Gemm {
  HostMatrix a, b, c;
  std::vector<std::uint8_t> bias_bytes;
  VectorView bias;
  bool has_bias = false;
};

Gemm run_gemm(DType in, DType out, std::int64_t m, std::int64_t n, std::int64_t k, bool bias, std::uint64_t seed) {
  Gemm g;
  g.a = HostMatrix::random(in, m, k, Layout::row_major, seed);
  g.b = HostMatrix::random(in, k, n, seed % 2 ? Layout::col_major : Layout::row_major, seed + 1);
  g.c = HostMatrix::output(out, m, n, Layout::row_major);
  if (bias) {
    HostMatrix bm = HostMatrix::random(DType::f32, 1, n, Layout::row_major, seed + 2);
    g.bias_bytes.resize(static_cast<std::size_t>(n) * 4);
    for (std::int64_t j = 0; j < n; ++j) {
      const float v = bm.at(0, j);
      std::memcpy(g.bias_bytes.data() + j * 4, &v, 4);
    }
    g.bias = VectorView::contiguous(g.bias_bytes.data(), DType::f32, n);
    g.has_bias = true;
  }
  det_gemm(g.a.view(), g.b.view(), g.has_bias ? &g.bias : nullptr, g.c.mview());
  return g;
}

TEST(Abft, NoFalsePositiveOnCleanRandomGemms) {
  int gemms = 0;
  double worst = 0;
  std::mt19937 rng(3);
  for (DType in : {DType::bf16, DType::f16, DType::f32})
    for (DType out : {DType::f32, DType::bf16, DType::f16})
      for (int trial = 0; trial < 12; ++trial) {
        const std::int64_t m = 1 + rng() % 40, n = 1 + rng() % 40, k = 1 + rng() % 300;
        const Gemm g = run_gemm(in, out, m, n, k, trial % 2, 1000 + gemms);
        const auto enc = abft_encode(g.a.view(), g.b.view(), g.has_bias ? &g.bias : nullptr, out);
        const auto v = abft_verify(enc, g.c.view());
        ASSERT_TRUE(v.ok) << dtype_name(in) << "->" << dtype_name(out) << " " << m << "x" << n << "x" << k
                          << " ratio " << v.worst_ratio;
        worst = std::max(worst, v.worst_ratio);
        ++gemms;
      }
  // The threshold is z = 10 standard deviations of the modelled rounding: clean residuals stay far
  // inside it (a few standard deviations at most).
  EXPECT_LT(worst, 0.5) << gemms << " gemms";
}

// Flipping one bit of one output element: an exponent or high significand bit moves the element by
// far more than rounding can, and ABFT names its row and column; a flip in the lowest bits may be
// below the threshold (then it is indistinguishable from rounding and none is reported, never a
// wrong location).
TEST(Abft, LocatesACorruptedElement) {
  for (DType out : {DType::f32, DType::bf16}) {
    Gemm g = run_gemm(DType::bf16, out, 33, 47, 256, true, 77);
    const auto enc = abft_encode(g.a.view(), g.b.view(), &g.bias, out);
    ASSERT_TRUE(abft_verify(enc, g.c.view()).ok);
    const int bits = out == DType::f32 ? 32 : 16;
    std::mt19937 rng(4);
    int located = 0;
    for (int bit = 0; bit < bits; ++bit) {
      const std::int64_t i = rng() % 33, j = rng() % 47;
      auto* p = static_cast<unsigned char*>(g.c.mview().element_ptr(i, j));
      p[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      const auto v = abft_verify(enc, g.c.view());
      if (!v.ok) {
        ASSERT_EQ(v.located.size(), 1u) << "bit " << bit;
        EXPECT_EQ(v.located[0], std::make_pair(i, j)) << "bit " << bit;
        ++located;
      }
      // The exponent's top bits and the sign of a non-tiny element are always caught.
      if (bit >= bits - 4) {
        EXPECT_FALSE(v.ok) << dtype_name(out) << " bit " << bit;
      }
      p[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    }
    EXPECT_GE(located, bits / 3) << dtype_name(out);
  }
}

TEST(Abft, NonFiniteOutputsAreCaught) {
  Gemm g = run_gemm(DType::f16, DType::f32, 8, 8, 16, false, 5);
  const auto enc = abft_encode(g.a.view(), g.b.view(), nullptr, DType::f32);
  const float nan = std::nanf("");
  std::memcpy(g.c.mview().element_ptr(3, 6), &nan, 4);
  const auto v = abft_verify(enc, g.c.view());
  EXPECT_FALSE(v.ok);
  ASSERT_EQ(v.located.size(), 1u);
  EXPECT_EQ(v.located[0], std::make_pair(std::int64_t{3}, std::int64_t{6}));
}

TEST(Abft, ShapeErrorsNameTheOperands) {
  Gemm g = run_gemm(DType::bf16, DType::f32, 4, 5, 6, false, 8);
  EXPECT_THROW(abft_encode(g.a.view(), g.a.view(), nullptr, DType::f32), std::invalid_argument);
  const auto enc = abft_encode(g.a.view(), g.b.view(), nullptr, DType::f32);
  try {
    abft_verify(enc, g.a.view());
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("encoding is for f32 4x5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cubesim::kernels
