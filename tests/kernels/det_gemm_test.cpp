// The host det_gemm against its scalar reference, bit for bit: every shape of {1,7,16,129,1000}^3
// within a work budget, every dtype pair, strided/transposed/reversed views, thread counts, cache
// blockings and every micro-kernel; then the tile API, the bias gradient and the argument errors.
// The backend-independent contract (invariance, accuracy) is in gemm_cases.h.
#include "kernels/det_gemm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <functional>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/kernels/gemm_test_util.h"

namespace cubesim::kernels {
namespace {

using testing::bitwise_equal;
using testing::HostMatrix;
using testing::Layout;

// Sanitized builds run ~10x slower: they keep every dimension value but fewer large products.
#if defined(CUBESIM_ASAN)
constexpr double kShapeBudget = 2.1e6;
#else
constexpr double kShapeBudget = 2.1e7;
#endif

struct Config {
  const char* name;
  GemmOptions options;
};

// Fast configurations that must all reproduce the reference. min_flops_per_thread = 0 makes two
// threads really split even tiny products; the odd blockings put k-block, row-block and
// column-block edges everywhere.
std::vector<Config> configs() {
  std::vector<Config> c = {
      {"1 thread", {.threads = 1, .min_flops_per_thread = 0}},
      {"2 threads", {.threads = 2, .min_flops_per_thread = 0}},
      {"2 threads, tiny blocks 6x16x7", {.threads = 2, .mc = 6, .nc = 16, .kc = 7, .min_flops_per_thread = 0}},
      {"portable, blocks 12x32x100", {.threads = 1, .isa = GemmIsa::portable, .mc = 12, .nc = 32, .kc = 100}},
      {"3 threads, blocks 18x48x1", {.threads = 3, .mc = 18, .nc = 48, .kc = 1, .min_flops_per_thread = 0}},
  };
  if (cpu_has_avx2_fma()) c.push_back({"avx2 forced", {.threads = 1, .isa = GemmIsa::avx2}});
  // 12x32 tiles with 6x16 tiles on every side of them: 30 rows are two 12-row tiles and a 6-row
  // one, 80 columns two 32-column tiles and a 16-column one; kc = 9 continues the accumulator.
  if (cpu_has_avx512f()) {
    c.push_back({"avx512 forced", {.threads = 1, .isa = GemmIsa::avx512}});
    c.push_back({"avx512, 2 threads, blocks 30x80x9",
                 {.threads = 2, .isa = GemmIsa::avx512, .mc = 30, .nc = 80, .kc = 9, .min_flops_per_thread = 0}});
  }
  return c;
}

VectorView as_vector(const HostMatrix& m) {
  const MatrixView v = m.view();
  return {v.data, v.dtype, v.cols, v.col_stride};
}

void expect_forward_matches(const HostMatrix& A, const HostMatrix& B, const HostMatrix* bias, DType out, Layout out_layout,
                            const std::vector<Config>& cfgs, const std::string& what) {
  const VectorView bv = bias ? as_vector(*bias) : VectorView{};
  HostMatrix want = HostMatrix::output(out, A.rows(), B.cols(), out_layout, 1);
  det_gemm_reference(A.view(), B.view(), bias ? &bv : nullptr, want.mview());
  ASSERT_TRUE(want.fully_written()) << what;
  for (const Config& cfg : cfgs) {
    HostMatrix got = HostMatrix::output(out, A.rows(), B.cols(), out_layout, 0);
    det_gemm(A.view(), B.view(), bias ? &bv : nullptr, got.mview(), cfg.options);
    EXPECT_TRUE(got.fully_written()) << what << ", " << cfg.name;
    EXPECT_TRUE(bitwise_equal(got, want)) << what << ", " << cfg.name;
  }
}

TEST(DetGemm, EveryEdgeShapeMatchesReferenceBitwise) {
  const std::int64_t dims[] = {1, 7, 16, 129, 1000};
  const auto cfgs = configs();
  int shapes = 0;
  for (std::int64_t M : dims)
    for (std::int64_t N : dims)
      for (std::int64_t K : dims) {
        if (static_cast<double>(M) * N * K > kShapeBudget) continue;
        ++shapes;
        const std::uint64_t seed = static_cast<std::uint64_t>(M * 1000003 + N * 1009 + K);
        HostMatrix A = HostMatrix::random(DType::f32, M, K, Layout::row_major, seed);
        HostMatrix B = HostMatrix::random(DType::f32, K, N, Layout::row_major, seed + 1);
        HostMatrix bias = HostMatrix::random(DType::f32, 1, N, Layout::row_major, seed + 2);
        expect_forward_matches(A, B, (M + N + K) % 2 ? &bias : nullptr, DType::f32, Layout::row_major, cfgs,
                               "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
      }
  EXPECT_GE(shapes, 60);
}

TEST(DetGemm, EveryDtypePairAndBiasMatchesReference) {
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  const std::vector<Config> cfgs = {configs()[1], configs()[3]};
  for (DType ta : types)
    for (DType tb : types)
      for (DType tc : types) {
        HostMatrix A = HostMatrix::random(ta, 37, 300, Layout::row_major, 11);
        HostMatrix B = HostMatrix::random(tb, 300, 45, Layout::row_major, 12);
        HostMatrix bias = HostMatrix::random(tb, 1, 45, Layout::row_padded, 13);
        const std::string what =
            std::string(dtype_name(ta)) + "·" + std::string(dtype_name(tb)) + "->" + std::string(dtype_name(tc));
        expect_forward_matches(A, B, &bias, tc, Layout::row_major, cfgs, what + " with bias");
        expect_forward_matches(A, B, nullptr, tc, Layout::row_major, cfgs, what);
      }
}

TEST(DetGemm, StridedAndTransposedViewsMatchReference) {
  const Layout layouts[] = {Layout::row_major, Layout::col_major, Layout::row_padded, Layout::col_padded};
  const auto cfgs = configs();
  for (Layout la : layouts)
    for (Layout lb : layouts)
      for (Layout lc : layouts) {
        for (DType t : {DType::f32, DType::bf16}) {
          HostMatrix A = HostMatrix::random(t, 29, 263, la, 21);
          HostMatrix B = HostMatrix::random(t, 263, 35, lb, 22);
          HostMatrix bias = HostMatrix::random(t, 1, 35, Layout::row_padded, 23);
          expect_forward_matches(A, B, &bias, t, lc, cfgs,
                                 std::string(testing::layout_name(la)) + "/" + testing::layout_name(lb) + "/" +
                                     testing::layout_name(lc) + " " + std::string(dtype_name(t)));
        }
      }
}

// Megatron's Y = X·Wᵀ with W stored [out, in]: B is a transposed view, nothing is copied.
TEST(DetGemm, TransposedWeightViewIsTheLinearLayer) {
  const std::int64_t M = 33, in = 200, out = 70;
  HostMatrix X = HostMatrix::random(DType::bf16, M, in, Layout::row_major, 31);
  HostMatrix W = HostMatrix::random(DType::bf16, out, in, Layout::row_major, 32);
  HostMatrix Y = HostMatrix::output(DType::bf16, M, out, Layout::row_major);
  det_gemm(X.view(), W.view().transposed(), nullptr, Y.mview(), {.threads = 2, .min_flops_per_thread = 0});
  ASSERT_TRUE(Y.fully_written());
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < out; ++j) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < in; ++k) acc = std::fma(X.at(i, k), W.at(j, k), acc);
      ASSERT_EQ(Y.bits(i, j), f32_to_bf16(acc)) << i << "," << j;
    }
}

// Views with negative strides (a matrix read bottom-up, right to left) are views like any other.
TEST(DetGemm, NegativeStridesMatchReference) {
  HostMatrix A = HostMatrix::random(DType::f32, 20, 50, Layout::row_major, 41);
  HostMatrix B = HostMatrix::random(DType::f32, 50, 24, Layout::row_major, 42);
  MatrixView Ar = A.view();
  Ar = {Ar.element_ptr(19, 49), Ar.dtype, 20, 50, -Ar.row_stride, -1};  // reversed both ways
  std::vector<float> want(20 * 24), got(20 * 24, std::nanf("1"));
  det_gemm_reference(Ar, B.view(), nullptr, MutableMatrixView::row_major(want.data(), DType::f32, 20, 24));
  MutableMatrixView Cr = MutableMatrixView::row_major(got.data(), DType::f32, 20, 24);
  Cr = {Cr.element_ptr(19, 0), DType::f32, 20, 24, -24, 1};  // written bottom-up
  det_gemm(Ar, B.view(), nullptr, Cr, {.threads = 2, .mc = 6, .kc = 16, .min_flops_per_thread = 0});
  for (int i = 0; i < 20; ++i)
    for (int j = 0; j < 24; ++j) ASSERT_EQ(std::bit_cast<std::uint32_t>(got[(19 - i) * 24 + j]),
                                           std::bit_cast<std::uint32_t>(want[i * 24 + j])) << i << "," << j;
}

TEST(DetGemm, EmptyDimensions) {
  // K = 0: the sum is +0.0f, then the bias.
  HostMatrix A(DType::f32, 5, 0, Layout::row_major), B(DType::f32, 0, 20, Layout::row_major);
  HostMatrix bias = HostMatrix::random(DType::f32, 1, 20, Layout::row_major, 3);
  const VectorView bv = as_vector(bias);
  for (const auto& cfg : configs()) {
    HostMatrix C = HostMatrix::output(DType::bf16, 5, 20, Layout::row_padded);
    det_gemm(A.view(), B.view(), &bv, C.mview(), cfg.options);
    ASSERT_TRUE(C.fully_written());
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 20; ++j) EXPECT_EQ(C.bits(i, j), f32_to_bf16(0.0f + bias.at(0, j)));
    HostMatrix Cz = HostMatrix::output(DType::f32, 5, 20, Layout::row_major);
    det_gemm(A.view(), B.view(), nullptr, Cz.mview(), cfg.options);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 20; ++j) EXPECT_EQ(Cz.bits(i, j), 0u) << "+0.0f, not -0.0f";
  }
  // M = 0 or N = 0: nothing to write, nothing read.
  HostMatrix A0(DType::f32, 0, 7, Layout::row_major), B7 = HostMatrix::random(DType::f32, 7, 3, Layout::row_major, 1);
  HostMatrix C0(DType::f32, 0, 3, Layout::row_major);
  EXPECT_NO_THROW(det_gemm(A0.view(), B7.view(), nullptr, C0.mview(), {.threads = 2}));
}

// Zero rows give +0 (fma(0, b, +0) is +0 for either sign of b): no -0 sneaks in from a shortcut
// such as starting the sum at the first product.
TEST(DetGemm, SignedZerosFollowTheContract) {
  HostMatrix A = HostMatrix::random(DType::f32, 8, 40, Layout::row_major, 5);
  HostMatrix B = HostMatrix::random(DType::f32, 40, 16, Layout::row_major, 6);
  for (int k = 0; k < 40; ++k) A.set(3, k, k % 2 ? -0.0f : 0.0f);
  B.set(0, 5, -0.0f);
  for (const auto& cfg : configs()) {
    HostMatrix C = HostMatrix::output(DType::f32, 8, 16, Layout::row_major), R = C;
    det_gemm(A.view(), B.view(), nullptr, C.mview(), cfg.options);
    det_gemm_reference(A.view(), B.view(), nullptr, R.mview());
    EXPECT_TRUE(bitwise_equal(C, R)) << cfg.name;
    for (int j = 0; j < 16; ++j) EXPECT_EQ(C.bits(3, j), 0u) << cfg.name;
  }
}

// The contract says fma, not multiply-then-add: a product whose rounding error decides the sum.
// (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24; minus (1 + 2^-11) leaves 2^-24, which a separately rounded
// product would lose (it rounds 1 + 2^-11 + 2^-24 to 1 + 2^-11 under ties to even).
TEST(DetGemm, UsesFusedMultiplyAdd) {
  const float x = 1.0f + 0x1p-12f;
  const float a[2] = {-(1.0f + 0x1p-11f), x};  // row of A: first term is -(1+2^-11)*1
  const float b[2] = {1.0f, x};
  for (const auto& cfg : configs()) {
    float c = 0;
    det_gemm(MatrixView::row_major(a, DType::f32, 1, 2), MatrixView::row_major(b, DType::f32, 2, 1), nullptr,
             MutableMatrixView::row_major(&c, DType::f32, 1, 1), cfg.options);
    EXPECT_EQ(c, 0x1p-24f) << cfg.name;
  }
}

TEST(DetGemm, BackwardMatchesReference) {
  struct S {
    std::int64_t M, N, K;
  };
  const auto cfgs = configs();
  for (S s : {S{1, 1, 1}, S{7, 129, 16}, S{129, 7, 1000}, S{1000, 16, 7}, S{64, 300, 40}}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      const std::string what = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + " " +
                               std::string(dtype_name(t));
      HostMatrix A = HostMatrix::random(t, s.M, s.K, Layout::row_major, 51);
      HostMatrix W = HostMatrix::random(t, s.N, s.K, Layout::row_major, 52);  // weight [out, in]
      HostMatrix dC = HostMatrix::random(t, s.M, s.N, Layout::row_padded, 53);
      const MatrixView B = W.view().transposed();  // the forward's [K, N] operand
      HostMatrix dA_ref = HostMatrix::output(t, s.M, s.K, Layout::row_major, 1);
      HostMatrix dB_ref = HostMatrix::output(DType::f32, s.K, s.N, Layout::col_major, 1);  // = dWᵀ, stored as dW
      det_gemm_backward_input_reference(dC.view(), B, dA_ref.mview());
      det_gemm_backward_weight_reference(A.view(), dC.view(), dB_ref.mview());
      ASSERT_TRUE(dA_ref.fully_written());
      ASSERT_TRUE(dB_ref.fully_written());
      for (const auto& cfg : cfgs) {
        HostMatrix dA = HostMatrix::output(t, s.M, s.K, Layout::row_major);
        HostMatrix dB = HostMatrix::output(DType::f32, s.K, s.N, Layout::col_major);
        det_gemm_backward_input(dC.view(), B, dA.mview(), cfg.options);
        det_gemm_backward_weight(A.view(), dC.view(), dB.mview(), cfg.options);
        EXPECT_TRUE(dA.fully_written()) << what << ", " << cfg.name;
        EXPECT_TRUE(dB.fully_written()) << what << ", " << cfg.name;
        EXPECT_TRUE(bitwise_equal(dA, dA_ref)) << "dA " << what << ", " << cfg.name;
        EXPECT_TRUE(bitwise_equal(dB, dB_ref)) << "dB " << what << ", " << cfg.name;
      }
      // The definitions, written out: ascending n for dA, ascending m for dB.
      for (std::int64_t i = 0; i < s.M; i += 5)
        for (std::int64_t k = 0; k < s.K; k += 3) {
          float acc = 0.0f;
          for (std::int64_t n = 0; n < s.N; ++n) acc = std::fma(dC.at(i, n), W.at(n, k), acc);
          const std::uint32_t want = t == DType::f32    ? std::bit_cast<std::uint32_t>(acc)
                                     : t == DType::bf16 ? f32_to_bf16(acc)
                                                        : f32_to_f16(acc);
          ASSERT_EQ(dA_ref.bits(i, k), want) << what << " dA(" << i << "," << k << ")";
        }
      for (std::int64_t k = 0; k < s.K; k += 3)
        for (std::int64_t n = 0; n < s.N; n += 5) {
          float acc = 0.0f;
          for (std::int64_t m = 0; m < s.M; ++m) acc = std::fma(A.at(m, k), dC.at(m, n), acc);
          ASSERT_EQ(dB_ref.bits(k, n), std::bit_cast<std::uint32_t>(acc));
        }
    }
  }
}

// The header's advice for W stored [out, in]: dW = backward_weight(dY, X) is (Xᵀ·dY)ᵀ bit for bit.
TEST(DetGemm, WeightGradOfOutInWeightEqualsTransposedForm) {
  const std::int64_t M = 300, in = 70, out = 45;
  HostMatrix X = HostMatrix::random(DType::bf16, M, in, Layout::row_major, 91);
  HostMatrix dY = HostMatrix::random(DType::bf16, M, out, Layout::row_major, 92);
  HostMatrix dW = HostMatrix::output(DType::f32, out, in, Layout::row_major);
  HostMatrix dWt = HostMatrix::output(DType::f32, in, out, Layout::row_major, 1);
  det_gemm_backward_weight(dY.view(), X.view(), dW.mview(), {.threads = 2, .min_flops_per_thread = 0});
  det_gemm_backward_weight(X.view(), dY.view(), dWt.mview());
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) ASSERT_EQ(dW.bits(o, i), dWt.bits(i, o)) << o << "," << i;
}

TEST(DetGemm, BiasGradSumsColumnsInAscendingRows) {
  HostMatrix dC = HostMatrix::random(DType::bf16, 1000, 37, Layout::col_padded, 61);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    HostMatrix db = HostMatrix::output(t, 1, 37, Layout::row_padded);
    const MutableMatrixView v = db.mview();
    det_gemm_bias_grad(dC.view(), MutableVectorView{v.data, t, 37, v.col_stride});
    ASSERT_TRUE(db.fully_written());
    for (int n = 0; n < 37; ++n) {
      float acc = 0.0f;
      for (int m = 0; m < 1000; ++m) acc = acc + dC.at(m, n);
      EXPECT_EQ(db.at(0, n), round_to(t, acc)) << n;
    }
  }
}

// The simulated PE's way: C tile by tile, k block by k block, through det_gemm_accumulate (or its
// reference) and det_gemm_store, gives det_gemm's bits.
TEST(DetGemm, TileByTileAccumulationEqualsTheWholeProduct) {
  const std::int64_t M = 45, N = 70, K = 333;
  HostMatrix A = HostMatrix::random(DType::bf16, M, K, Layout::row_major, 71);
  HostMatrix B = HostMatrix::random(DType::bf16, K, N, Layout::col_major, 72);
  HostMatrix bias = HostMatrix::random(DType::bf16, 1, N, Layout::row_major, 73);
  const VectorView bv = as_vector(bias);
  HostMatrix want = HostMatrix::output(DType::bf16, M, N, Layout::row_major, 1);
  det_gemm(A.view(), B.view(), &bv, want.mview());
  for (bool use_reference : {false, true}) {
    HostMatrix got = HostMatrix::output(DType::bf16, M, N, Layout::row_major);
    const std::int64_t mt = 16, nt = 32, kb = 50;  // tiles that divide nothing evenly
    for (std::int64_t m0 = 0; m0 < M; m0 += mt)
      for (std::int64_t n0 = 0; n0 < N; n0 += nt) {
        const std::int64_t mm = std::min(mt, M - m0), nn = std::min(nt, N - n0), ld = nt + 3;
        std::vector<float> acc(static_cast<std::size_t>(mt * ld), 0.0f);
        for (std::int64_t k0 = 0; k0 < K; k0 += kb) {
          const std::int64_t kk = std::min(kb, K - k0);
          const MatrixView a = A.view().block(m0, k0, mm, kk), b = B.view().block(k0, n0, kk, nn);
          if (use_reference) {
            det_gemm_accumulate_reference(a, b, acc.data(), ld);
          } else {
            det_gemm_accumulate(a, b, acc.data(), ld, {.threads = 2, .kc = 7, .min_flops_per_thread = 0});
          }
        }
        const VectorView bslice = bv.slice(n0, nn);
        det_gemm_store(acc.data(), ld, &bslice, got.mview().block(m0, n0, mm, nn));
      }
    EXPECT_TRUE(got.fully_written());
    EXPECT_TRUE(bitwise_equal(got, want)) << (use_reference ? "reference tiles" : "fast tiles");
  }
}

// Two callers at once: the pool serves one, the other runs its regions itself; same bits.
TEST(DetGemm, ConcurrentCallersGetTheSameBits) {
  HostMatrix A = HostMatrix::random(DType::f32, 200, 300, Layout::row_major, 81);
  HostMatrix B = HostMatrix::random(DType::f32, 300, 100, Layout::row_major, 82);
  HostMatrix want = HostMatrix::output(DType::f32, 200, 100, Layout::row_major, 1);
  det_gemm_reference(A.view(), B.view(), nullptr, want.mview());
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 5; ++rep) {
        HostMatrix C = HostMatrix::output(DType::f32, 200, 100, Layout::row_major);
        det_gemm(A.view(), B.view(), nullptr, C.mview(), {.threads = 2, .min_flops_per_thread = 0});
        if (!bitwise_equal(C, want)) ++failures;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0);
}

// Inputs from an explicit integer hash (not <random>'s distributions, which differ between standard
// libraries), with full 24-bit mantissas so that every fma rounds and any change of order shows.
float golden_value(std::uint64_t i) {
  std::uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<std::int64_t>(z >> 40) - (1 << 23)) * 0x1p-23f;  // [-1, 1)
}

std::uint64_t fnv1a(const HostMatrix& m) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int64_t i = 0; i < m.rows(); ++i)
    for (std::int64_t j = 0; j < m.cols(); ++j) {
      h ^= m.bits(i, j);
      h *= 0x100000001b3ull;
    }
  return h;
}

// The same bits on every machine and compiler: hashes of outputs for fixed inputs, recorded once.
// A change here means the numerics changed, which the contract forbids (CI, the GPU machine and a
// developer's laptop are different CPUs).
TEST(DetGemm, GoldenOutputsAreTheSameOnEveryMachine) {
  struct Golden {
    std::int64_t M, N, K;
    DType in, out;
    bool bias;
    std::uint64_t hash;
  };
  const Golden goldens[] = {
      {37, 53, 1000, DType::f32, DType::f32, true, 0x0f0a936273ceb865ull},
      {19, 40, 300, DType::bf16, DType::bf16, false, 0x99f3f2a8f39bf839ull},
      {64, 17, 129, DType::f16, DType::f16, true, 0x0d00f78825760bbfull},
  };
  for (const Golden& g : goldens) {
    HostMatrix A(g.in, g.M, g.K, Layout::row_major), B(g.in, g.K, g.N, Layout::row_major);
    HostMatrix bias(g.in, 1, g.N, Layout::row_major);
    for (std::int64_t i = 0; i < g.M; ++i)
      for (std::int64_t k = 0; k < g.K; ++k) A.set(i, k, golden_value(static_cast<std::uint64_t>(i * g.K + k)));
    for (std::int64_t k = 0; k < g.K; ++k)
      for (std::int64_t j = 0; j < g.N; ++j) B.set(k, j, golden_value(1000000 + static_cast<std::uint64_t>(k * g.N + j)));
    for (std::int64_t j = 0; j < g.N; ++j) bias.set(0, j, golden_value(2000000 + static_cast<std::uint64_t>(j)));
    const VectorView bv = as_vector(bias);
    HostMatrix ref = HostMatrix::output(g.out, g.M, g.N, Layout::row_major, 1);
    HostMatrix fast = HostMatrix::output(g.out, g.M, g.N, Layout::row_major, 0);
    det_gemm_reference(A.view(), B.view(), g.bias ? &bv : nullptr, ref.mview());
    det_gemm(A.view(), B.view(), g.bias ? &bv : nullptr, fast.mview(), {.threads = 2});
    EXPECT_TRUE(bitwise_equal(fast, ref));
    EXPECT_EQ(fnv1a(ref), g.hash) << g.M << "x" << g.N << "x" << g.K << " " << dtype_name(g.in) << "->"
                                  << dtype_name(g.out) << ": 0x" << std::hex << fnv1a(ref);
  }
}

void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning " << fragments.front();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const auto& s : fragments) EXPECT_NE(m.find(s), std::string::npos) << "'" << s << "' not in: " << m;
  }
}

TEST(DetGemm, ErrorsNameTheOperandsAndWhatIsValid) {
  std::vector<float> a(64 * 128), b(127 * 32), c(64 * 32), bias(31);
  const auto A = MatrixView::row_major(a.data(), DType::f32, 64, 128);
  const auto B = MatrixView::row_major(b.data(), DType::f32, 127, 32);
  const auto C = MutableMatrixView::row_major(c.data(), DType::f32, 64, 32);
  expect_invalid([&] { det_gemm(A, B, nullptr, C); },
                 {"det_gemm:", "A is 64x128 but B is 127x32", "A.cols must equal B.rows"});
  expect_invalid([&] { det_gemm_reference(A, B, nullptr, C); }, {"det_gemm_reference:", "A.cols must equal B.rows"});
  const auto B2 = MatrixView::row_major(b.data(), DType::f32, 128, 31);
  expect_invalid([&] { det_gemm(A, B2, nullptr, C); }, {"C is 64x32 but A·B is 64x31", "A.rows x B.cols"});
  std::vector<float> bb(128 * 32);
  const auto Bok = MatrixView::row_major(bb.data(), DType::f32, 128, 32);
  const VectorView bv = VectorView::contiguous(bias.data(), DType::f32, 31);
  expect_invalid([&] { det_gemm(A, Bok, &bv, C); }, {"bias has 31 elements", "C.cols = 32"});
  expect_invalid([&] { det_gemm(A, Bok, nullptr, C, {.threads = 0}); }, {"options.threads is 0", ">= 1"});
  expect_invalid([&] { det_gemm(A, Bok, nullptr, C, {.kc = -1}); }, {"options.mc/nc/kc"});
  MatrixView bad_dtype = A;
  bad_dtype.dtype = static_cast<DType>(5);
  expect_invalid([&] { det_gemm(bad_dtype, Bok, nullptr, C); }, {"A has invalid dtype value 5", "f32, bf16, f16"});
  expect_invalid([&] { det_gemm(MatrixView{nullptr, DType::f32, 64, 128, 128, 1}, Bok, nullptr, C); },
                 {"A is 64x128 but its data pointer is null"});
  // An output whose rows overlap, and an output aliasing an input.
  MutableMatrixView overlapping = C;
  overlapping.row_stride = 16;
  expect_invalid([&] { det_gemm(A, Bok, nullptr, overlapping); }, {"output C", "overlap", "row stride"});
  const auto C_on_A = MutableMatrixView::row_major(a.data(), DType::f32, 64, 32);
  expect_invalid([&] { det_gemm(A, Bok, nullptr, C_on_A); }, {"output C overlaps input A"});
  // Backward names its own operands.
  std::vector<float> dc(64 * 32), da(64 * 128), db(128 * 32);
  const auto dC = MatrixView::row_major(dc.data(), DType::f32, 64, 32);
  const auto Bw = MatrixView::row_major(bb.data(), DType::f32, 128, 31);
  expect_invalid([&] { det_gemm_backward_input(dC, Bw, MutableMatrixView::row_major(da.data(), DType::f32, 64, 128)); },
                 {"det_gemm_backward_input:", "dC is 64x32 but B is 128x31", "dC.cols == B.cols"});
  expect_invalid(
      [&] { det_gemm_backward_weight(A, dC, MutableMatrixView::row_major(db.data(), DType::f32, 127, 32)); },
      {"det_gemm_backward_weight:", "dB is 127x32 but Aᵀ·dC is 128x32"});
  expect_invalid([&] { det_gemm_bias_grad(dC, MutableVectorView::contiguous(bias.data(), DType::f32, 31)); },
                 {"det_gemm_bias_grad:", "dbias has 31 elements", "dC is 64x32"});
  expect_invalid([&] { det_gemm_accumulate(A, Bok, c.data(), 31); }, {"det_gemm_accumulate:", "ld must be >= 32"});
  if (!cpu_has_avx2_fma()) {
    expect_invalid([&] { det_gemm(A, Bok, nullptr, C, {.isa = GemmIsa::avx2}); }, {"lacks AVX2"});
  }
  if (!cpu_has_avx512f()) {
    expect_invalid([&] { det_gemm(A, Bok, nullptr, C, {.isa = GemmIsa::avx512}); }, {"lacks AVX-512F"});
  }
  expect_invalid([&] { det_gemm(A, Bok, nullptr, C, {.isa = static_cast<GemmIsa>(7)}); },
                 {"options.isa has invalid value 7", "avx512"});
}

}  // namespace
}  // namespace cubesim::kernels
