// test_det_gemm_cuda — det_gemm on the GPU against the contract, on random data, outputs poisoned.
//
//   exact mode:        bitwise equal to the scalar reference of the contract over a table of shapes
//                      (M, N, K in {1, 7, 16, 129, 1000}), dtypes, layouts, bias on/off, backward;
//   tensor_core mode:  bitwise batch invariance (M, chunks, zero padding, row position, other rows,
//                      every tile configuration), determinism, and accuracy against f64.
//
// Without a CUDA device (CI, the build machine) every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/accumulator.h"
#include "kernels/cuda/det_gemm_cuda.h"
#include "kernels/cuda/elementwise_cuda.h"

using namespace cubesim;
using namespace cubesim::cuda;
using namespace cubesim::cuda::test;

namespace {

std::uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!have_cuda_device(&why)) GTEST_SKIP() << why;
    seed_ = fresh_seed();
    rng_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
  }
  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

class CudaGemmTc : public CudaGemm {
 protected:
  void SetUp() override {
    CudaGemm::SetUp();
    if (IsSkipped()) return;
    if (!tensor_core_mode_supported()) GTEST_SKIP() << "tensor_core mode needs an sm_90 GPU (H100/H200)";
  }
};

std::string dn(DType t) { return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "f16"; }

}  // namespace

// ---- exact mode ------------------------------------------------------------------------------------

struct ExactCase {
  DType ta, tb, tc;
  Layout la, lb, lc;
  bool bias;
  DType tbias;
};

TEST_F(CudaGemm, ExactBitwiseEqualsReferenceOverShapeTable) {
  const std::vector<std::int64_t> sizes = {1, 7, 16, 129, 1000};
  const std::vector<ExactCase> cases = {
      {DType::f32, DType::f32, DType::f32, Layout::row_major, Layout::row_major, Layout::row_major, false, DType::f32},
      {DType::bf16, DType::bf16, DType::f32, Layout::row_major, Layout::col_major, Layout::row_major, true, DType::f32},
      {DType::bf16, DType::bf16, DType::bf16, Layout::padded_rows, Layout::row_major, Layout::padded_rows, true, DType::bf16},
      {DType::f16, DType::f16, DType::f16, Layout::col_major, Layout::row_major, Layout::col_major, true, DType::f16},
      {DType::f32, DType::bf16, DType::bf16, Layout::row_major, Layout::padded_rows, Layout::row_major, true, DType::f32},
      {DType::bf16, DType::f16, DType::f32, Layout::col_major, Layout::col_major, Layout::row_major, false, DType::f32},
      // 16-byte aligned rows at odd sizes: the async staging path with partial chunks at every edge, in
      // each of its forms (f32 copied in place along m/n, f32 and 16-bit k-major transposed, 16-bit
      // along m/n widened).
      {DType::f32, DType::f32, DType::f32, Layout::aligned_cols, Layout::aligned_rows, Layout::row_major, true, DType::f32},
      {DType::f32, DType::f32, DType::bf16, Layout::aligned_rows, Layout::aligned_cols, Layout::row_major, true, DType::f32},
      {DType::bf16, DType::f16, DType::f32, Layout::aligned_cols, Layout::aligned_cols, Layout::row_major, false, DType::f32},
      {DType::f16, DType::bf16, DType::f16, Layout::aligned_rows, Layout::aligned_rows, Layout::row_major, true, DType::bf16},
  };
  std::size_t checked = 0;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const ExactCase& cs = cases[ci];
    for (auto M : sizes)
      for (auto N : sizes)
        for (auto K : sizes) {
          // Every case at the small sizes; the 1000-cubed corner once per dtype case.
          if (M * N * K > 22'000'000 && !(M == 1000 && N == 1000 && K == 1000)) continue;
          SCOPED_TRACE("case " + std::to_string(ci) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                       " K=" + std::to_string(K) + " seed=" + std::to_string(seed_));
          Operand a = Operand::random(rng_, cs.ta, M, K, cs.la);
          Operand b = Operand::random(rng_, cs.tb, K, N, cs.lb);
          Operand bias = Operand::random(rng_, cs.tbias, 1, N, Layout::row_major);
          Operand c = Operand::output(cs.tc, M, N, cs.lc), ref = Operand::output(cs.tc, M, N, cs.lc);
          const VectorView bv = bias.dev_vec(), bh = bias.host_vec();
          c.poison();
          det_gemm_cuda(a.dev(), b.dev(), cs.bias ? &bv : nullptr, c.dev_mut(), {.mode = GemmMode::exact}, nullptr);
          c.download();
          reference_gemm(a.host(), b.host(), cs.bias ? &bh : nullptr, ref.host_mut());
          const std::int64_t bad = count_bit_mismatches(c, 0, ref, 0, M);
          ASSERT_EQ(bad, 0) << "exact mode differs from the contract's reference in " << bad << " of " << M * N
                            << " elements; first: got " << c.at(0, 0) << " want " << ref.at(0, 0);
          ++checked;
        }
  }
  std::printf("exact mode: %zu shape/dtype/layout cases bitwise equal to the reference\n", checked);
}

TEST_F(CudaGemm, ExactKZeroWritesBiasOnly) {
  Operand a = Operand::random(rng_, DType::f32, 5, 1, Layout::row_major);
  Operand b = Operand::random(rng_, DType::f32, 1, 9, Layout::row_major);
  Operand bias = Operand::random(rng_, DType::f32, 1, 9, Layout::row_major);
  Operand c = Operand::output(DType::f32, 5, 9, Layout::row_major), ref = Operand::output(DType::f32, 5, 9, Layout::row_major);
  const VectorView bv = bias.dev_vec(), bh = bias.host_vec();
  MatrixView a0 = a.dev(), b0 = b.dev();
  a0.cols = 0;
  b0.rows = 0;
  c.poison();
  det_gemm_cuda(a0, b0, &bv, c.dev_mut(), {.mode = GemmMode::exact}, nullptr);
  c.download();
  MatrixView ah = a.host(), bhv = b.host();
  ah.cols = 0;
  bhv.rows = 0;
  reference_gemm(ah, bhv, &bh, ref.host_mut());
  EXPECT_EQ(count_bit_mismatches(c, 0, ref, 0, 5), 0);
}

TEST_F(CudaGemm, ExactBackwardBitwiseEqualsReference) {
  // C = A·B with A [M,K], B [K,N]; dA = dC·Bᵀ (ascending n), dB = Aᵀ·dC (ascending m).
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{129, 7, 1000}, {1000, 129, 16}, {7, 1000, 129}}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                 " seed=" + std::to_string(seed_));
    Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);  // B = Wᵀ with W [N,K] row-major
    Operand dc = Operand::random(rng_, DType::f32, M, N, Layout::row_major);
    Operand da = Operand::output(DType::f32, M, K, Layout::row_major), da_ref = Operand::output(DType::f32, M, K, Layout::row_major);
    Operand db = Operand::output(DType::bf16, K, N, Layout::col_major), db_ref = Operand::output(DType::bf16, K, N, Layout::col_major);
    da.poison();
    db.poison();
    det_gemm_cuda_backward_input(dc.dev(), b.dev(), da.dev_mut(), {.mode = GemmMode::exact}, nullptr);
    det_gemm_cuda_backward_weight(a.dev(), dc.dev(), db.dev_mut(), {.mode = GemmMode::exact}, nullptr);
    da.download();
    db.download();
    reference_gemm(dc.host(), b.host().transposed(), nullptr, da_ref.host_mut());
    reference_gemm(a.host().transposed(), dc.host(), nullptr, db_ref.host_mut());
    EXPECT_EQ(count_bit_mismatches(da, 0, da_ref, 0, M), 0) << "dA";
    EXPECT_EQ(count_bit_mismatches(db, 0, db_ref, 0, K), 0) << "dB";
  }
}

TEST_F(CudaGemm, ExactBatchInvariantAndDeterministic) {
  const std::int64_t N = 300, K = 777, Mbig = 1000;
  Operand a = Operand::random(rng_, DType::bf16, Mbig, K, Layout::row_major);
  Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::row_major);
  Operand full = Operand::output(DType::f32, Mbig, N, Layout::row_major), again = Operand::output(DType::f32, Mbig, N, Layout::row_major);
  full.poison();
  det_gemm_cuda(a.dev(), b.dev(), nullptr, full.dev_mut(), {.mode = GemmMode::exact}, nullptr);
  full.download();
  again.poison();
  det_gemm_cuda(a.dev(), b.dev(), nullptr, again.dev_mut(), {.mode = GemmMode::exact}, nullptr);
  again.download();
  EXPECT_EQ(count_bit_mismatches(full, 0, again, 0, Mbig), 0) << "two runs differ";
  for (std::int64_t r0 : {0, 1, 333}) {
    for (std::int64_t m : {1, 3, 130}) {
      Operand part = Operand::output(DType::f32, m, N, Layout::row_major);
      part.poison();
      det_gemm_cuda(a.dev().row_block(r0, m), b.dev(), nullptr, part.dev_mut(), {.mode = GemmMode::exact}, nullptr);
      part.download();
      EXPECT_EQ(count_bit_mismatches(part, 0, full, r0, m), 0) << "rows " << r0 << ".." << r0 + m;
    }
  }
}

// ---- tensor-core mode ------------------------------------------------------------------------------

namespace {

GemmOptions tc(TcConfig cfg = TcConfig::automatic) {
  GemmOptions o;
  o.mode = GemmMode::tensor_core;
  o.tc_config = cfg;
  return o;
}

const TcConfig kAllConfigs[] = {TcConfig::m128n256,      TcConfig::m128n256_c2, TcConfig::m128n128,
                                TcConfig::m64n32,        TcConfig::m64n256_pp,  TcConfig::m64n256_pp_c2,
                                TcConfig::m128n32,       TcConfig::m128n224,    TcConfig::m128n224_c2,
                                TcConfig::m224n128_c2};
const TcConfig kPingPongConfigs[] = {TcConfig::m64n256_pp, TcConfig::m64n256_pp_c2};

}  // namespace

TEST_F(CudaGemmTc, AccuracyAgainstF64) {
  struct Case {
    std::int64_t M, N, K;
    DType ta, tc;
    Layout la, lb;
    bool bias;
    double tol;
  };
  // bf16 operands, f32 output: only the accumulation differs from f64 (bound 1e-3, far above f32
  // rounding, far below any indexing error). Other dtypes are rounded to
  // bf16 (the mode's definition) and compared with f64 of the unrounded inputs: bf16 tolerance.
  const Case cases[] = {
      {1000, 1000, 1000, DType::bf16, DType::f32, Layout::row_major, Layout::col_major, false, 1e-3},
      {257, 129, 1000, DType::bf16, DType::f32, Layout::row_major, Layout::row_major, true, 1e-3},
      {64, 1000, 77, DType::bf16, DType::bf16, Layout::padded_rows, Layout::col_major, true, 8e-3},
      {7, 16, 7, DType::f32, DType::f32, Layout::col_major, Layout::row_major, true, 1e-2},
      {1, 1000, 129, DType::f16, DType::f16, Layout::row_major, Layout::col_major, false, 1e-2},
      {2048, 512, 4096, DType::bf16, DType::bf16, Layout::row_major, Layout::col_major, false, 8e-3},
  };
  for (const Case& cs : cases) {
    for (TcConfig cfg : {TcConfig::automatic, TcConfig::m128n256, TcConfig::m128n256_c2, TcConfig::m128n128, TcConfig::m64n32,
                         TcConfig::m64n256_pp, TcConfig::m64n256_pp_c2, TcConfig::m128n32, TcConfig::m128n224,
                         TcConfig::m128n224_c2, TcConfig::m224n128_c2}) {
      SCOPED_TRACE("M=" + std::to_string(cs.M) + " N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K) +
                   " " + dn(cs.ta) + "->" + dn(cs.tc) + " cfg=" + tc_config_name(cfg) + " seed=" + std::to_string(seed_));
      Operand a = Operand::random(rng_, cs.ta, cs.M, cs.K, cs.la);
      Operand b = Operand::random(rng_, cs.ta, cs.K, cs.N, cs.lb);
      Operand bias = Operand::random(rng_, DType::f32, 1, cs.N, Layout::row_major);
      Operand c = Operand::output(cs.tc, cs.M, cs.N, Layout::row_major);
      const VectorView bv = bias.dev_vec(), bh = bias.host_vec();
      c.poison();
      det_gemm_cuda(a.dev(), b.dev(), cs.bias ? &bv : nullptr, c.dev_mut(), tc(cfg), nullptr);
      c.download();
      const ErrorStats e = tc_error(a.host(), b.host(), cs.bias ? &bh : nullptr, c, false);
      std::printf("tc accuracy M=%lld N=%lld K=%lld %s->%s %s: rel_fro=%.3e\n", (long long)cs.M, (long long)cs.N,
                  (long long)cs.K, dn(cs.ta).c_str(), dn(cs.tc).c_str(), tc_config_name(cfg), e.rel_fro);
      EXPECT_EQ(e.unwritten, 0) << "elements left unwritten (poison visible)";
      EXPECT_LE(e.rel_fro, cs.tol);
      if (cs.M * cs.N * cs.K > 100'000'000) break;  // the big cases once (automatic) plus below
    }
  }
}

TEST_F(CudaGemmTc, EveryConfigurationGivesTheSameBits) {
  // The per-M tile choice must not change an element: the configurations are compared bit for bit
  // on shapes whose edges cut every tile (N, K not multiples of 256, 128, 32 or 64).
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{300, 1000, 1000}, {64, 4096, 4096}, {1000, 520, 77},
                         {1, 1000, 300}, {17, 520, 77}, {100, 1000, 300}, {128, 520, 77}}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " seed=" + std::to_string(seed_));
    Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);
    Operand first = Operand::output(DType::f32, M, N, Layout::row_major);
    first.poison();
    det_gemm_cuda(a.dev(), b.dev(), nullptr, first.dev_mut(), tc(kAllConfigs[0]), nullptr);
    first.download();
    for (TcConfig cfg : kAllConfigs) {
      for (int margin : {0, 16, 131}) {  // a smaller persistent grid (SMs left to a collective) too
        GemmOptions o = tc(cfg);
        o.sm_margin = margin;
        Operand c = Operand::output(DType::f32, M, N, Layout::row_major);
        c.poison();
        det_gemm_cuda(a.dev(), b.dev(), nullptr, c.dev_mut(), o, nullptr);
        c.download();
        EXPECT_EQ(count_bit_mismatches(c, 0, first, 0, M), 0)
            << tc_config_name(cfg) << " (sm_margin " << margin << ") vs " << tc_config_name(kAllConfigs[0]);
      }
    }
  }
}

TEST_F(CudaGemmTc, TwoByteOutputsAreTheF32OutputRounded) {
  // A 2-byte output (TMA-store epilogue through swizzled staging chunks, or element stores for
  // strided rows) must equal the f32 output of the same product (bias added in f32) rounded to
  // nearest even: every configuration, one CTA with many tiles (margin 131) and the whole grid, one
  // k-tile and many, M from 1 (A boxes of M rows), with and without bias.
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{300, 1000, 1000}, {129, 257, 65},
                         {256, 512, 64}, {1, 1000, 129}, {17, 300, 200}, {640, 384, 130}, {256, 448, 130},
                         {448, 256, 130}}) {
    Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);
    Operand bias = Operand::random(rng_, DType::f32, 1, N, Layout::row_major);
    const VectorView bv = bias.dev_vec();
    for (bool with_bias : {false, true}) {
      Operand f32 = Operand::output(DType::f32, M, N, Layout::row_major);
      f32.poison();
      det_gemm_cuda(a.dev(), b.dev(), with_bias ? &bv : nullptr, f32.dev_mut(), tc(TcConfig::m128n256), nullptr);
      f32.download();
      for (DType out : {DType::bf16, DType::f16}) {
        for (Layout lc : {Layout::row_major, Layout::padded_rows}) {
          SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " " + dn(out) +
                       " bias " + std::to_string(with_bias) + " layout " + std::to_string(static_cast<int>(lc)) +
                       " seed=" + std::to_string(seed_));
          Operand want = Operand::output(out, M, N, lc);
          for (std::int64_t r = 0; r < M; ++r) want.set_row(r, f32, r);
          for (TcConfig cfg : kAllConfigs) {
            for (int margin : {0, 131}) {
              GemmOptions o = tc(cfg);
              o.sm_margin = margin;
              Operand c = Operand::output(out, M, N, lc);
              c.poison();
              det_gemm_cuda(a.dev(), b.dev(), with_bias ? &bv : nullptr, c.dev_mut(), o, nullptr);
              c.download();
              EXPECT_EQ(count_bit_mismatches(c, 0, want, 0, M), 0) << tc_config_name(cfg) << " (sm_margin " << margin << ")";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaGemmTc, PingPongOddTileCountsGiveTheSameBits) {
  // Ping-pong consumers take alternate tiles of a CTA's sequence: with an odd count one consumer has
  // one tile more, with a single tile (or fewer tiles than CTAs) the second consumer has none, and a
  // cluster of 2 over an odd number of m-tiles has a CTA with nothing to store. Every such schedule
  // (whole grid, 7 CTAs, one CTA) must give the cooperative m128n256's bits, with and without bias,
  // for f32 and bf16 outputs (TMA-store epilogue) and a strided output (element stores).
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{300, 300, 200}, {100, 100, 1000},
                         {129, 257, 65}, {448, 640, 130}}) {
    for (DType out : {DType::f32, DType::bf16}) {
      SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " " + dn(out) +
                   " seed=" + std::to_string(seed_));
      Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
      Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);
      Operand bias = Operand::random(rng_, DType::f32, 1, N, Layout::row_major);
      const VectorView bv = bias.dev_vec();
      for (bool with_bias : {false, true}) {
        for (Layout lc : {Layout::row_major, Layout::padded_rows}) {
          Operand ref = Operand::output(out, M, N, lc);
          ref.poison();
          det_gemm_cuda(a.dev(), b.dev(), with_bias ? &bv : nullptr, ref.dev_mut(), tc(TcConfig::m128n256), nullptr);
          ref.download();
          for (TcConfig cfg : kPingPongConfigs) {
            for (int margin : {0, 125, 131}) {
              GemmOptions o = tc(cfg);
              o.sm_margin = margin;
              Operand c = Operand::output(out, M, N, lc);
              c.poison();
              det_gemm_cuda(a.dev(), b.dev(), with_bias ? &bv : nullptr, c.dev_mut(), o, nullptr);
              c.download();
              EXPECT_EQ(count_bit_mismatches(c, 0, ref, 0, M), 0)
                  << tc_config_name(cfg) << " (sm_margin " << margin << ", bias " << with_bias << ", layout "
                  << static_cast<int>(lc) << ") vs m128n256";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaGemmTc, BackToBackGemmsOnOneStreamSeeEachOthersData) {
  // Tensor-core launches are programmatic dependent launches: a GEMM may be scheduled while the one
  // before it in the stream drains, and must not read or write global memory before that one is
  // complete. Chains with no synchronisation in between: X = A·B1, then Y = X·B2 reads X (read
  // after write), then X = A2·B1 overwrites the X that Y's GEMM reads (write after read), then
  // Z = X·B2 reads the new X; every result equals the same GEMMs run one at a time, bit for bit.
  // Small M (m64n32, m128n32: a short kernel after a short kernel) and the large tiles `automatic`
  // picks (m128n256_c2, m64n256_pp_c2 and m128n128), on a created stream and on the legacy default
  // stream, repeated.
  for (auto [M, N1, K, N2] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{64, 1024, 4096, 512},
                              {1, 4096, 1000, 300}, {100, 1024, 512, 256}, {4096, 4096, 256, 1024},
                              {4096, 3584, 256, 640}}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " N1=" + std::to_string(N1) + " K=" + std::to_string(K) +
                 " N2=" + std::to_string(N2) + " seed=" + std::to_string(seed_));
    Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand a2 = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand b1 = Operand::random(rng_, DType::bf16, K, N1, Layout::col_major);
    Operand b2 = Operand::random(rng_, DType::bf16, N1, N2, Layout::row_major);  // N-major: read in place
    // One at a time: each GEMM finished before the next is launched.
    Operand x_ref = Operand::output(DType::bf16, M, N1, Layout::row_major), y_ref = Operand::output(DType::f32, M, N2, Layout::row_major);
    Operand x2_ref = Operand::output(DType::bf16, M, N1, Layout::row_major), z_ref = Operand::output(DType::f32, M, N2, Layout::row_major);
    det_gemm_cuda(a.dev(), b1.dev(), nullptr, x_ref.dev_mut(), tc(), nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    det_gemm_cuda(x_ref.dev(), b2.dev(), nullptr, y_ref.dev_mut(), tc(), nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    det_gemm_cuda(a2.dev(), b1.dev(), nullptr, x2_ref.dev_mut(), tc(), nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    det_gemm_cuda(x2_ref.dev(), b2.dev(), nullptr, z_ref.dev_mut(), tc(), nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    y_ref.download();
    x2_ref.download();
    z_ref.download();
    cudaStream_t created = nullptr;
    CUBESIM_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    for (cudaStream_t st : {created, static_cast<cudaStream_t>(nullptr)}) {
      for (int rep = 0; rep < 5; ++rep) {
        Operand x = Operand::output(DType::bf16, M, N1, Layout::row_major), y = Operand::output(DType::f32, M, N2, Layout::row_major);
        Operand z = Operand::output(DType::f32, M, N2, Layout::row_major);
        x.poison();
        y.poison();
        z.poison();
        det_gemm_cuda(a.dev(), b1.dev(), nullptr, x.dev_mut(), tc(), st);
        det_gemm_cuda(x.dev(), b2.dev(), nullptr, y.dev_mut(), tc(), st);
        det_gemm_cuda(a2.dev(), b1.dev(), nullptr, x.dev_mut(), tc(), st);
        det_gemm_cuda(x.dev(), b2.dev(), nullptr, z.dev_mut(), tc(), st);
        CUBESIM_CUDA_CHECK(cudaStreamSynchronize(st));
        y.download();
        x.download();
        z.download();
        EXPECT_EQ(count_bit_mismatches(y, 0, y_ref, 0, M), 0) << "Y (read after write), rep " << rep;
        EXPECT_EQ(count_bit_mismatches(x, 0, x2_ref, 0, M), 0) << "X overwritten (write after read), rep " << rep;
        EXPECT_EQ(count_bit_mismatches(z, 0, z_ref, 0, M), 0) << "Z, rep " << rep;
      }
    }
    CUBESIM_CUDA_CHECK(cudaStreamDestroy(created));
  }
}

TEST_F(CudaGemmTc, BiasGradRightAfterAGemmSeesItsOutput) {
  // The long narrow bias gradient (elementwise_cuda.cu: the tiles kernel, from 2048 rows) between
  // tensor-core GEMMs, which are programmatic dependent launches that let their dependents start at
  // once. On one stream, no synchronisation: X = A·B, db = bias_grad(X) (read after write), then
  // X = A2·B overwrites what that bias gradient reads (write after read), db2 = bias_grad(X). Each
  // equals the host's bias gradient (kernels::det_gemm_bias_grad, rows in order) over the X of a
  // one-at-a-time run, bit for bit. (A bias gradient made a dependent launch without its wait fails
  // here: tried 2026-11-29.)
  const auto chain = [](const Operand& x) {
    std::vector<float> want(static_cast<std::size_t>(x.cols()));
    kernels::det_gemm_bias_grad(x.host(), kernels::MutableVectorView::contiguous(want.data(), DType::f32, x.cols()));
    return want;
  };
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{4096, 4096, 128}, {2304, 264, 64},
                         {8200, 1032, 64}}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                 " seed=" + std::to_string(seed_));
    Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand a2 = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);
    Operand x_ref = Operand::output(DType::bf16, M, N, Layout::row_major), x2_ref = Operand::output(DType::bf16, M, N, Layout::row_major);
    det_gemm_cuda(a.dev(), b.dev(), nullptr, x_ref.dev_mut(), tc(), nullptr);
    det_gemm_cuda(a2.dev(), b.dev(), nullptr, x2_ref.dev_mut(), tc(), nullptr);
    x_ref.download();
    x2_ref.download();
    const std::vector<float> want = chain(x_ref), want2 = chain(x2_ref);
    cudaStream_t created = nullptr;
    CUBESIM_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    for (cudaStream_t st : {created, static_cast<cudaStream_t>(nullptr)}) {
      for (int rep = 0; rep < 3; ++rep) {
        Operand x = Operand::output(DType::bf16, M, N, Layout::row_major);
        Operand db = Operand::output(DType::f32, 1, N, Layout::row_major), db2 = Operand::output(DType::f32, 1, N, Layout::row_major);
        x.poison();
        db.poison();
        db2.poison();
        det_gemm_cuda(a.dev(), b.dev(), nullptr, x.dev_mut(), tc(), st);
        bias_grad(x.dev().data, DType::bf16, db.dev_mut().data, DType::f32, M, N, st);
        det_gemm_cuda(a2.dev(), b.dev(), nullptr, x.dev_mut(), tc(), st);
        bias_grad(x.dev().data, DType::bf16, db2.dev_mut().data, DType::f32, M, N, st);
        CUBESIM_CUDA_CHECK(cudaStreamSynchronize(st));
        db.download();
        db2.download();
        int bad = 0, bad2 = 0;
        for (std::int64_t c = 0; c < N; ++c) {
          const float g = db.at(0, c), g2 = db2.at(0, c);
          bad += std::memcmp(&g, &want[static_cast<std::size_t>(c)], 4) != 0;
          bad2 += std::memcmp(&g2, &want2[static_cast<std::size_t>(c)], 4) != 0;
        }
        EXPECT_EQ(bad, 0) << "columns off after the first GEMM (read after write), rep " << rep;
        EXPECT_EQ(bad2, 0) << "columns off after the overwrite (write after read), rep " << rep;
      }
    }
    CUBESIM_CUDA_CHECK(cudaStreamDestroy(created));
  }
}

TEST_F(CudaGemmTc, BatchInvariantBitwise) {
  // One big batch is the reference; sub-batches, chunks, padded and shuffled batches must reproduce
  // its rows bit for bit. K is not a multiple of the 64-wide k-tile, N not a multiple of any tile.
  // B k-major (the forward layer's Wᵀ) and N-major (the input gradient's W, read in place).
  for (auto [N, K, out, bl] : {std::tuple<std::int64_t, std::int64_t, DType, Layout>{1000, 1000, DType::f32, Layout::col_major},
                               {4096, 4096, DType::bf16, Layout::col_major}, {520, 77, DType::f32, Layout::col_major},
                               {1000, 1000, DType::f32, Layout::row_major}, {4096, 4096, DType::bf16, Layout::row_major},
                               {520, 77, DType::f32, Layout::row_major}}) {
    const std::int64_t Mbig = 2048 + 57;
    SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K) + " out=" + dn(out) + " B " + layout_name(bl) +
                 " seed=" + std::to_string(seed_));
    Operand a = Operand::random(rng_, DType::bf16, Mbig, K, Layout::row_major);
    Operand b = Operand::random(rng_, DType::bf16, K, N, bl);
    Operand bias = Operand::random(rng_, DType::f32, 1, N, Layout::row_major);
    const VectorView bv = bias.dev_vec();
    Operand full = Operand::output(out, Mbig, N, Layout::row_major);
    full.poison();
    det_gemm_cuda(a.dev(), b.dev(), &bv, full.dev_mut(), tc(), nullptr);
    full.download();
    // Determinism: the same call again.
    {
      Operand again = Operand::output(out, Mbig, N, Layout::row_major);
      again.poison();
      det_gemm_cuda(a.dev(), b.dev(), &bv, again.dev_mut(), tc(), nullptr);
      again.download();
      EXPECT_EQ(count_bit_mismatches(again, 0, full, 0, Mbig), 0) << "two identical calls differ";
    }
    // Prefixes: M = 1, 2, 3, 64, 257, 2048.
    for (std::int64_t m : {1, 2, 3, 64, 257, 2048}) {
      Operand part = Operand::output(out, m, N, Layout::row_major);
      part.poison();
      det_gemm_cuda(a.dev().row_block(0, m), b.dev(), &bv, part.dev_mut(), tc(), nullptr);
      part.download();
      EXPECT_EQ(count_bit_mismatches(part, 0, full, 0, m), 0) << "prefix M=" << m;
    }
    // Uneven chunks at uneven offsets (some rows then are not 16-byte aligned: the repack path).
    {
      const std::int64_t cuts[] = {0, 1, 6, 70, 71, 700, 1300, Mbig};
      for (std::size_t i = 0; i + 1 < std::size(cuts); ++i) {
        const std::int64_t r0 = cuts[i], m = cuts[i + 1] - cuts[i];
        Operand part = Operand::output(out, m, N, Layout::row_major);
        part.poison();
        det_gemm_cuda(a.dev().row_block(r0, m), b.dev(), &bv, part.dev_mut(), tc(), nullptr);
        part.download();
        EXPECT_EQ(count_bit_mismatches(part, 0, full, r0, m), 0) << "chunk " << r0 << "+" << m;
      }
    }
    // A row at any position among other random rows, and padded with zero rows.
    {
      std::uniform_int_distribution<std::int64_t> pick(0, Mbig - 1);
      for (std::int64_t msz : {5, 64, 200}) {
        const std::int64_t src = pick(rng_), pos = pick(rng_) % msz;
        Operand mix = Operand::random(rng_, DType::bf16, msz, K, Layout::row_major);
        mix.set_row(pos, a, src);
        mix.upload();
        Operand out_mix = Operand::output(out, msz, N, Layout::row_major);
        out_mix.poison();
        det_gemm_cuda(mix.dev(), b.dev(), &bv, out_mix.dev_mut(), tc(), nullptr);
        out_mix.download();
        EXPECT_EQ(count_bit_mismatches(out_mix, pos, full, src, 1), 0) << "row " << src << " at " << pos << " of " << msz;

        Operand pad = Operand::zeros(DType::bf16, msz, K, Layout::row_major);  // zero rows are the point here
        pad.set_row(pos, a, src);
        pad.upload();
        Operand out_pad = Operand::output(out, msz, N, Layout::row_major);
        out_pad.poison();
        det_gemm_cuda(pad.dev(), b.dev(), &bv, out_pad.dev_mut(), tc(), nullptr);
        out_pad.download();
        EXPECT_EQ(count_bit_mismatches(out_pad, pos, full, src, 1), 0) << "row " << src << " padded at " << pos;
      }
    }
  }
}

TEST_F(CudaGemmTc, EveryLayoutGivesTheSameBits) {
  // Each operand read in place k-major or MN-major (the backward GEMMs' transposed views), or
  // repacked (MN-major rows not 16-byte aligned), in every tile configuration, with a bias: the same
  // bits as k-major A and B. Edges cut every tile; a dimension that is a multiple of 8 lets the rows
  // along it be read in place, the others take the repack path.
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{304, 1000, 1000}, {1000, 520, 77},
                         {64, 264, 136}, {129, 40, 200}, {8, 4096, 64}}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " seed=" + std::to_string(seed_));
    Operand a_k = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
    Operand b_k = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);
    Operand a_m = Operand::zeros(DType::bf16, M, K, Layout::col_major);
    Operand b_n = Operand::zeros(DType::bf16, K, N, Layout::row_major);
    for (std::int64_t r = 0; r < M; ++r) a_m.set_row(r, a_k, r);
    for (std::int64_t r = 0; r < K; ++r) b_n.set_row(r, b_k, r);
    a_m.upload();
    b_n.upload();
    Operand bias = Operand::random(rng_, DType::f32, 1, N, Layout::row_major);
    const VectorView bv = bias.dev_vec();
    Operand ref = Operand::output(DType::f32, M, N, Layout::row_major);
    ref.poison();
    det_gemm_cuda(a_k.dev(), b_k.dev(), &bv, ref.dev_mut(), tc(TcConfig::m128n256), nullptr);
    ref.download();
    for (TcConfig cfg : kAllConfigs) {
      for (const Operand* a : {&a_k, &a_m}) {
        for (const Operand* b : {&b_k, &b_n}) {
          // In place when the strided dimension's rows are 16-byte aligned: K for k-major, M or N else.
          const bool a_in_place = (a == &a_k ? K : M) % 8 == 0, b_in_place = (b == &b_k ? K : N) % 8 == 0;
          const std::size_t ws = det_gemm_cuda_workspace_bytes(a->dev(), b->dev(), tc(cfg));
          EXPECT_EQ(ws == 0, a_in_place && b_in_place) << "workspace " << ws;
          Operand c = Operand::output(DType::f32, M, N, Layout::row_major);
          c.poison();
          det_gemm_cuda(a->dev(), b->dev(), &bv, c.dev_mut(), tc(cfg), nullptr);
          c.download();
          EXPECT_EQ(count_bit_mismatches(c, 0, ref, 0, M), 0)
              << tc_config_name(cfg) << ": A " << (a == &a_k ? "k-major" : "M-major") << ", B "
              << (b == &b_k ? "k-major" : "N-major");
        }
      }
    }
  }
}

TEST_F(CudaGemmTc, BackwardAccuracy) {
  const std::int64_t M = 512, N = 384, K = 256;
  Operand a = Operand::random(rng_, DType::bf16, M, K, Layout::row_major);
  Operand b = Operand::random(rng_, DType::bf16, K, N, Layout::col_major);
  Operand dc = Operand::random(rng_, DType::bf16, M, N, Layout::row_major);
  Operand da = Operand::output(DType::f32, M, K, Layout::row_major);
  Operand db = Operand::output(DType::f32, K, N, Layout::row_major);
  da.poison();
  db.poison();
  det_gemm_cuda_backward_input(dc.dev(), b.dev(), da.dev_mut(), tc(), nullptr);
  det_gemm_cuda_backward_weight(a.dev(), dc.dev(), db.dev_mut(), tc(), nullptr);
  da.download();
  db.download();
  const ErrorStats ea = tc_error(dc.host(), b.host().transposed(), nullptr, da, false);
  const ErrorStats eb = tc_error(a.host().transposed(), dc.host(), nullptr, db, false);
  std::printf("tc backward: dA rel_fro=%.3e dB rel_fro=%.3e\n", ea.rel_fro, eb.rel_fro);
  EXPECT_EQ(ea.unwritten + eb.unwritten, 0);
  EXPECT_LE(ea.rel_fro, 1e-3);
  EXPECT_LE(eb.rel_fro, 1e-3);
}

// The simulator's hopper_tc accumulator model (kernels/accumulator.h) against the GPU's tensor-core
// det_gemm, bit for bit: the shape table of the other tensor-core tests, wide exponent ranges (so
// alignment and truncation decide bits), and millions of single-instruction dot products (K = 16:
// one k16 MMA from c = 0; K = 32: the second one's c is the first's result).
TEST_F(CudaGemmTc, HopperTcModelIsBitwise) {
  auto wide = [&](Operand& o, int spread) {
    const MutableMatrixView v = o.host_mut();
    std::uniform_int_distribution<int> e(-spread, spread);
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    for (std::int64_t r = 0; r < v.rows; ++r)
      for (std::int64_t c = 0; c < v.cols; ++c) {
        const std::uint64_t u = rng_();
        const float x = (u % 17 == 0) ? 0.0f : ((u & 1) ? -1.0f : 1.0f) * std::ldexp(m(rng_), e(rng_));
        store_f32(v.data, v.dtype, r * v.row_stride + c * v.col_stride, x);
      }
    o.upload();
  };
  struct Case {
    std::int64_t M, N, K;
    DType out;
    bool bias;
    int spread;  // 0: uniform [-1, 1)
  };
  const Case cases[] = {
      {257, 129, 1000, DType::f32, true, 0},  {64, 1000, 77, DType::bf16, true, 0}, {300, 520, 1000, DType::f32, false, 0},
      {128, 256, 64, DType::f32, false, 12},  {100, 200, 333, DType::f32, true, 20}, {4096, 4096, 16, DType::f32, false, 24},
      {2048, 2048, 32, DType::f32, false, 30}, {256, 256, 4096, DType::f32, false, 3},
  };
  std::int64_t elements = 0;
  for (const Case& cs : cases) {
    SCOPED_TRACE("M=" + std::to_string(cs.M) + " N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K) +
                 " spread=" + std::to_string(cs.spread) + " seed=" + std::to_string(seed_));
    Operand a = Operand::random(rng_, DType::bf16, cs.M, cs.K, Layout::row_major);
    Operand b = Operand::random(rng_, DType::bf16, cs.K, cs.N, Layout::col_major);
    if (cs.spread) wide(a, cs.spread), wide(b, cs.spread);
    Operand bias = Operand::random(rng_, DType::f32, 1, cs.N, Layout::row_major);
    Operand c = Operand::output(cs.out, cs.M, cs.N, Layout::row_major);
    Operand ref = Operand::output(cs.out, cs.M, cs.N, Layout::row_major);
    const VectorView bv = bias.dev_vec(), bh = bias.host_vec();
    c.poison();
    det_gemm_cuda(a.dev(), b.dev(), cs.bias ? &bv : nullptr, c.dev_mut(), tc(), nullptr);
    c.download();
    kernels::gemm_model(kernels::AccumulatorModel::hopper_tc, a.host(), b.host(), cs.bias ? &bh : nullptr, ref.host_mut());
    std::int64_t bad = 0, differ_from_contract = 0;
    std::string first;
    Operand contract = Operand::output(cs.out, cs.M, cs.N, Layout::row_major);
    kernels::det_gemm(a.host(), b.host(), cs.bias ? &bh : nullptr, contract.host_mut(), {.threads = 8});
    for (std::int64_t r = 0; r < cs.M; ++r)
      for (std::int64_t col = 0; col < cs.N; ++col) {
        const bool diff = c.bits(r, col) != ref.bits(r, col);
        differ_from_contract += c.bits(r, col) != contract.bits(r, col);
        if (diff && bad++ == 0)
          first = "(" + std::to_string(r) + ", " + std::to_string(col) + "): GPU " + std::to_string(c.at(r, col)) +
                  " model " + std::to_string(ref.at(r, col));
      }
    elements += cs.M * cs.N;
    std::printf("hopper_tc model vs GPU M=%lld N=%lld K=%lld spread=%d: %lld of %lld elements differ (the contract's "
                "f32 FMA differs from the GPU in %lld)\n",
                (long long)cs.M, (long long)cs.N, (long long)cs.K, cs.spread, (long long)bad, (long long)(cs.M * cs.N),
                (long long)differ_from_contract);
    EXPECT_EQ(bad, 0) << "first: " << first;
  }
  std::printf("hopper_tc model vs GPU: %lld elements compared\n", (long long)elements);
}

// A million single-instruction tiles: GEMMs of K = 16 (each output one MMA k-group, its accumulator the
// zero start) and K = 32 (the second k-group adds onto the first's result), counted in units of the
// smallest instruction tile, m64n8k16 (512 k-group sums). The operands reach the edges a random uniform
// draw never does: signed zeros, bf16 subnormals, products below the f32 range (underflow, f32
// subnormal sums) and above it (overflow of the f32 result), and operands 140 binades apart (products
// 280) within a group.
TEST_F(CudaGemmTc, HopperTcModelOnAMillionSingleInstructionTiles) {
  struct Draw {
    const char* name;
    int lo, hi;  // operand exponents
  };
  auto fill = [&](Operand& o, const Draw& d) {
    const MutableMatrixView v = o.host_mut();
    std::uniform_int_distribution<int> e(d.lo, d.hi), sub(-133, -127);
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    for (std::int64_t r = 0; r < v.rows; ++r)
      for (std::int64_t c = 0; c < v.cols; ++c) {
        const std::uint64_t u = rng_();
        const float sign = (u & 1) ? -1.0f : 1.0f;
        float x;
        if (u % 23 == 0)
          x = sign * 0.0f;
        else if (u % 29 == 0)
          x = sign * std::ldexp(m(rng_), sub(rng_));  // a bf16 subnormal (rounded to bf16 by store_f32)
        else
          x = sign * std::ldexp(m(rng_), e(rng_));
        store_f32(v.data, v.dtype, r * v.row_stride + c * v.col_stride, x);
      }
    o.upload();
  };
  struct Case {
    std::int64_t M, N, K;
    Draw draw;
  };
  // wide: operands over 140 binades; overflow: some sums beyond the f32 range; underflow: products
  // around the f32 subnormal range (subnormal sums, terms cut to nothing).
  const Case cases[] = {
      {8192, 8192, 16, {"wide", -100, 40}},     {8192, 8192, 16, {"overflow", -30, 70}},
      {4096, 8192, 16, {"underflow", -76, -60}}, {8192, 16384, 32, {"wide", -100, 40}},
      {8192, 16384, 32, {"overflow", -30, 70}}, {4096, 8192, 32, {"underflow", -76, -60}},
  };
  std::int64_t groups = 0, outputs = 0, subnormal = 0, infinite = 0;
  for (const Case& cs : cases) {
    SCOPED_TRACE(std::string(cs.draw.name) + " M=" + std::to_string(cs.M) + " N=" + std::to_string(cs.N) +
                 " K=" + std::to_string(cs.K) + " seed=" + std::to_string(seed_));
    Operand a = Operand::zeros(DType::bf16, cs.M, cs.K, Layout::row_major);
    Operand b = Operand::zeros(DType::bf16, cs.K, cs.N, Layout::col_major);
    fill(a, cs.draw), fill(b, cs.draw);
    Operand c = Operand::output(DType::f32, cs.M, cs.N, Layout::row_major);
    Operand ref = Operand::output(DType::f32, cs.M, cs.N, Layout::row_major);
    c.poison();
    det_gemm_cuda(a.dev(), b.dev(), nullptr, c.dev_mut(), tc(), nullptr);
    c.download();
    // The model, a block of rows per thread.
    const MatrixView A = a.host();
    const MutableMatrixView R = ref.host_mut();
    constexpr std::int64_t kRows = 64;
    parallel_rows((cs.M + kRows - 1) / kRows, [&](std::int64_t blk) {
      const std::int64_t r0 = blk * kRows, n = std::min(kRows, cs.M - r0);
      const MatrixView Ab{static_cast<const std::uint8_t*>(A.data) + r0 * A.row_stride * 2, A.dtype, n, A.cols,
                          A.row_stride, A.col_stride};
      const MutableMatrixView Rb{static_cast<std::uint8_t*>(R.data) + r0 * R.row_stride * 4, R.dtype, n, R.cols,
                                 R.row_stride, R.col_stride};
      kernels::gemm_model(kernels::AccumulatorModel::hopper_tc, Ab, b.host(), nullptr, Rb);
    });
    std::int64_t bad = 0, dumped_ok = 0;
    std::string first;
    // CUBESIM_TC_DUMP=FILE: each differing output of a one-group case (K = 16) and a sample of equal
    // subnormal ones, as hex: GPU bits, model bits, then the 16 a and 16 b operands' bits (to study).
    static std::FILE* dump = std::getenv("CUBESIM_TC_DUMP") ? std::fopen(std::getenv("CUBESIM_TC_DUMP"), "w") : nullptr;
    auto dump_row = [&](std::int64_t r, std::int64_t col, std::uint32_t g, std::uint32_t w) {
      std::fprintf(dump, "%s %08x %08x", cs.draw.name, g, w);
      for (std::int64_t k = 0; k < cs.K; ++k) std::fprintf(dump, " %04x", a.bits(r, k));
      for (std::int64_t k = 0; k < cs.K; ++k) std::fprintf(dump, " %04x", b.bits(k, col));
      std::fprintf(dump, "\n");
    };
    for (std::int64_t r = 0; r < cs.M; ++r)
      for (std::int64_t col = 0; col < cs.N; ++col) {
        const std::uint32_t g = c.bits(r, col), w = ref.bits(r, col);
        const float gv = c.at(r, col);
        const bool sub = gv != 0 && std::fpclassify(gv) == FP_SUBNORMAL;
        subnormal += sub;
        infinite += std::isinf(gv);
        if (dump && cs.K == 16 && g != w) dump_row(r, col, g, w);
        if (dump && cs.K == 16 && g == w && sub && dumped_ok < 20000 && (r * 7 + col) % 97 == 0) dump_row(r, col, g, w), ++dumped_ok;
        if (g == w || (std::isnan(gv) && std::isnan(ref.at(r, col)))) continue;
        if (bad++ < 3) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "(%lld, %lld): GPU %a (0x%08x) model %a (0x%08x); k-group inputs:",
                        (long long)r, (long long)col, gv, g, ref.at(r, col), w);
          first += buf;
          for (std::int64_t k = 0; k < cs.K; ++k) {
            std::snprintf(buf, sizeof buf, " %a*%a", a.at(r, k), b.at(k, col));
            first += buf;
          }
          first += "\n";
        }
      }
    std::printf("hopper_tc model vs GPU, %s, M=%lld N=%lld K=%lld: %lld of %lld outputs differ\n", cs.draw.name,
                (long long)cs.M, (long long)cs.N, (long long)cs.K, (long long)bad, (long long)(cs.M * cs.N));
    EXPECT_EQ(bad, 0) << first;
    outputs += cs.M * cs.N;
    groups += cs.M * cs.N * (cs.K / 16);
  }
  std::printf("hopper_tc model vs GPU: %lld outputs, %lld k-groups = %lld m64n8k16 instruction tiles; %lld f32 "
              "subnormal and %lld infinite outputs among them\n",
              (long long)outputs, (long long)groups, (long long)(groups / 512), (long long)subnormal,
              (long long)infinite);
  EXPECT_GE(groups / 512, 1000000);
  EXPECT_GT(subnormal, 0);  // the edges were reached
  EXPECT_GT(infinite, 0);
}

// The edges of the f32 range, built by hand (K = 32: the second group adds onto the first's sum). B's
// columns are 1, -1, 2^-40 and -2^-40, so each A row gives its sum, the negation, and the same terms
// scaled into the subnormal range. Each output is checked against its value worked out here (and
// against the model): a sum just under 2^128 (cut to FLT_MAX), exactly 2^128 (infinite), FLT_MAX less
// a term the alignment keeps or cuts, the alignment floor of 2^-133 (a term of 2^-159 beside 2^-134 is
// cut), f32 subnormal sums, and sums cut to nothing (+0 whatever their sign).
TEST_F(CudaGemmTc, HopperTcModelAtTheEdgesOfTheF32Range) {
  constexpr std::int64_t M = 64, N = 8, K = 32;
  Operand a = Operand::zeros(DType::bf16, M, K, Layout::row_major);
  Operand b = Operand::zeros(DType::bf16, K, N, Layout::col_major);
  const MutableMatrixView av = a.host_mut(), bv = b.host_mut();
  auto setA = [&](std::int64_t r, std::int64_t k, float x) { store_f32(av.data, av.dtype, r * av.row_stride + k * av.col_stride, x); };
  const float tiny = std::ldexp(1.0f, -40);
  const float cols[4] = {1.0f, -1.0f, tiny, -tiny};
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t c = 0; c < 4; ++c) store_f32(bv.data, bv.dtype, k * bv.row_stride + c * bv.col_stride, cols[c]);
  const float ones8 = 2.0f - std::ldexp(1.0f, -7);  // 1.1111111b, a bf16
  const float fmax = std::numeric_limits<float>::max(), inf = std::numeric_limits<float>::infinity();
  // FLT_MAX = 2^128 - 2^104: three products of eight ones each, in the first group.
  auto flt_max_first_group = [&](std::int64_t r) {
    setA(r, 0, std::ldexp(ones8, 127)), setA(r, 1, std::ldexp(ones8, 119)), setA(r, 2, std::ldexp(ones8, 111));
  };
  struct Want {
    float c0, c2;  // columns 1 and 3 are their negations (a zero stays +0)
  };
  std::vector<Want> want;
  std::int64_t r = 0;
  auto row = [&](Want w) { want.push_back(w), ++r; };
  // The scaled columns of the FLT_MAX rows are 2^-40 times the same sums: plain normal numbers.
  flt_max_first_group(r), setA(r, 16, std::ldexp(1.0f, 103)), row({fmax, std::ldexp(fmax, -40)});      // 2^128 - 2^103
  flt_max_first_group(r), setA(r, 16, std::ldexp(1.0f, 104)), row({inf, std::ldexp(1.0f, 88)});        // exactly 2^128
  flt_max_first_group(r), setA(r, 16, -std::ldexp(1.0f, 102)),                                          // kept: 2^128 - 2^104 - 2^102,
      row({fmax - std::ldexp(1.0f, 104), std::ldexp(fmax - std::ldexp(1.0f, 104), -40)});              // cut toward zero
  flt_max_first_group(r), setA(r, 16, -std::ldexp(1.0f, 101)), row({fmax, std::ldexp(fmax, -40)});     // cut (25 bits below 2^127)
  flt_max_first_group(r), setA(r, 3, std::ldexp(1.0f, 103)), row({fmax, std::ldexp(fmax, -40)});       // in one group
  flt_max_first_group(r), setA(r, 3, std::ldexp(1.0f, 104)), row({inf, std::ldexp(1.0f, 88)});          // in one group: 2^128
  setA(r, 0, std::ldexp(1.5f, 127)), setA(r, 1, std::ldexp(1.0f, 126)), row({inf, std::ldexp(1.0f, 88)});  // 2^128
  // A bf16 subnormal alone; scaled, 2^-170 is far below the least f32 subnormal: +0 for both signs.
  setA(r, 0, std::ldexp(1.0f, -130)), row({std::ldexp(1.0f, -130), 0.0f});
  // Scaled into an exact f32 subnormal: 1.5 * 2^-140.
  setA(r, 0, std::ldexp(1.5f, -100)), row({std::ldexp(1.5f, -100), std::ldexp(1.5f, -140)});
  // The floor: scaled, 2^-134 beside -2^-159: 25 bits below 2^-134 would keep -2^-159 (and the sum, cut
  // to the subnormal grid, would be 2^-134 - 2^-149); the floor at 2^-133 cuts it: 2^-134.
  setA(r, 0, std::ldexp(1.0f, -94)), setA(r, 1, -std::ldexp(1.0f, -119)),
      row({std::nextafter(std::ldexp(1.0f, -94), 0.0f), std::ldexp(1.0f, -134)});  // 2^-94 - 2^-119, cut to 24 bits
  // Exact cancellation in the first group, then a term that the second cuts to nothing when scaled.
  setA(r, 0, std::ldexp(1.0f, -100)), setA(r, 1, -std::ldexp(1.0f, -100)), setA(r, 16, std::ldexp(1.0f, -115)),
      row({std::ldexp(1.0f, -115), 0.0f});
  setA(r, 0, -0.0f), row({0.0f, 0.0f});  // zeros: the sign of an all-zero sum
  a.upload(), b.upload();
  Operand c = Operand::output(DType::f32, M, N, Layout::row_major);
  Operand ref = Operand::output(DType::f32, M, N, Layout::row_major);
  c.poison();
  det_gemm_cuda(a.dev(), b.dev(), nullptr, c.dev_mut(), tc(), nullptr);
  c.download();
  kernels::gemm_model(kernels::AccumulatorModel::hopper_tc, a.host(), b.host(), nullptr, ref.host_mut());
  auto bits = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t col = 0; col < 4; ++col) {
      const float base = col < 2 ? want[static_cast<std::size_t>(i)].c0 : want[static_cast<std::size_t>(i)].c2;
      const float expect = (col % 2 && base != 0) ? -base : base;
      std::printf("edge row %lld col %lld: GPU %a model %a expected %a\n", (long long)i, (long long)col, c.at(i, col),
                  ref.at(i, col), expect);
      EXPECT_EQ(c.bits(i, col), bits(expect)) << "row " << i << " col " << col << ": GPU " << c.at(i, col) << " expected "
                                              << expect;
      EXPECT_EQ(ref.bits(i, col), bits(expect)) << "row " << i << " col " << col << ": model " << ref.at(i, col)
                                                << " expected " << expect;
    }
}

TEST(CudaGemmArgs, ErrorsNameTheOperand) {
  // Shape errors are checked before any CUDA call, so this runs without a GPU too.
  float x = 0;
  MatrixView a{&x, DType::f32, 2, 3, 3, 1}, b{&x, DType::f32, 4, 5, 5, 1};
  MutableMatrixView c{&x, DType::f32, 2, 5, 5, 1};
  try {
    det_gemm_cuda(a, b, nullptr, c, {}, nullptr);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("A [M,K], B [K,N]"), std::string::npos) << e.what();
  }
}

TEST(CudaGemmPlan, TheLayersGemmsReadTheirOperandsInPlace) {
  // Which operands TMA reads in place is decided on the host from the views (no GPU needed): the six
  // GEMMs of a linear layer's step take no workspace; what TMA cannot describe is repacked, and the
  // reason (what the cuda backend says once in a run report) names the operand, its shape and why.
  const std::int64_t M = 4096, H = 1024, F = 4096;
  void* p = reinterpret_cast<void*>(std::uintptr_t{1} << 20);  // 16-byte aligned; never dereferenced
  const MatrixView x{p, DType::bf16, M, H, H, 1}, w{p, DType::bf16, F, H, H, 1}, dy{p, DType::bf16, M, F, F, 1};
  GemmOptions o;
  o.mode = GemmMode::tensor_core;
  auto in_place = [&](const MatrixView& a, const MatrixView& b, const char* what) {
    EXPECT_EQ(det_gemm_cuda_workspace_bytes(a, b, o), 0u) << what;
    EXPECT_EQ(det_gemm_cuda_repack_reason(a, b, o), "") << what;
  };
  in_place(x, w.transposed(), "fprop X·Wᵀ");
  in_place(dy, w, "dgrad dY·W (W N-major)");
  in_place(dy.transposed(), x, "wgrad dYᵀ·X (both MN-major)");
  auto repacked = [&](const MatrixView& a, const MatrixView& b, std::initializer_list<const char*> parts) {
    EXPECT_GT(det_gemm_cuda_workspace_bytes(a, b, o), 0u) << *parts.begin();
    const std::string why = det_gemm_cuda_repack_reason(a, b, o);
    for (const char* s : parts) EXPECT_NE(why.find(s), std::string::npos) << "'" << s << "' not in: " << why;
  };
  // Fallbacks: another dtype, rows not 16-byte aligned, a negative stride, a misaligned start, no
  // unit stride.
  const MatrixView wf{p, DType::f32, F, H, H, 1}, wpad{p, DType::bf16, F, H, H + 3, 1},
      wneg{static_cast<char*>(p) + (F - 1) * H * 2, DType::bf16, F, H, -H, 1},
      wodd{static_cast<char*>(p) + 2, DType::bf16, F, H, H, 1}, wgap{p, DType::bf16, F, H, 2, 2 * F};
  EXPECT_EQ(det_gemm_cuda_workspace_bytes(dy, wf, o), static_cast<std::size_t>(H * F * 2)) << "f32 B";
  repacked(dy, wf, {"B [4096 x 1024] is f32", "converted", "repacked"});
  repacked(dy, wpad, {"B [4096 x 1024]", "1027 elements apart, not a multiple of 16 bytes"});
  repacked(dy, wneg, {"B [4096 x 1024]", "run backwards", "-1024"});
  repacked(dy, wodd, {"B [4096 x 1024]", "not 16-byte aligned"});
  repacked(dy, wgap, {"B [4096 x 1024]", "no unit stride", "2 and 8192"});
  repacked(MatrixView{p, DType::f16, M, F, F, 1}, wf, {"A [4096 x 4096] is f16", "; B [4096 x 1024] is f32"});
  o.mode = GemmMode::exact;
  EXPECT_EQ(det_gemm_cuda_workspace_bytes(dy, wf, o), 0u) << "exact mode never repacks";
  EXPECT_EQ(det_gemm_cuda_repack_reason(dy, wf, o), "") << "exact mode reads any layout";
}

// The bias gradient of a bf16 tensor (elementwise_cuda.cu: the 8-warp block for short narrow
// tensors, the widened transposed tiles from 2048 rows (256-row tiles; 512 from 8192 rows), a warp per
// 32 columns for wide ones): every
// column one chain of f32 adds over the rows in ascending order from +0.0f, equal bit for bit to that
// chain on the host; shapes that cut the 256-row chunks and tiles (fewer rows, a chunk and one, many
// and a part, whole tiles only) and the 32-column blocks, and values with cancellations, -0 and
// infinities (of one sign a column).
TEST_F(CudaGemm, BiasGradBf16EqualsTheHostChain) {
  std::mt19937_64 rng(2025);
  for (auto [R, C] : {std::pair<std::int64_t, std::int64_t>{1, 8}, {255, 40}, {256, 32}, {257, 264}, {1000, 200},
                      {2333, 1032}, {4096, 4096}, {4099, 4104}, {513, 8456}, {2048, 40}, {2047, 8}, {2304, 8},
                      {5000, 2056}, {8192, 264}, {9000, 40}}) {
    SCOPED_TRACE(std::to_string(R) + " x " + std::to_string(C));
    std::vector<std::uint16_t> x(static_cast<std::size_t>(R * C));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      float f = u(rng) * (i % 97 == 0 ? 1024.0f : 1.0f);
      std::uint32_t b;
      std::memcpy(&b, &f, 4);
      b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest even
      x[i] = static_cast<std::uint16_t>(b >> 16);
    }
    x[static_cast<std::size_t>(C % (R * C))] = 0x8000u;  // -0
    x[x.size() - 1] = 0x7f80u;                            // +inf in the last column
    if (R > 2) x[static_cast<std::size_t>(C)] = 0xff80u;  // -inf in column 0
    std::vector<float> want(static_cast<std::size_t>(C));
    for (std::int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (std::int64_t r = 0; r < R; ++r) {
        const std::uint32_t b = static_cast<std::uint32_t>(x[static_cast<std::size_t>(r * C + c)]) << 16;
        float v;
        std::memcpy(&v, &b, 4);
        acc = acc + v;
      }
      want[static_cast<std::size_t>(c)] = acc;
    }
    DeviceBuffer dx(x.size() * 2), db(static_cast<std::size_t>(C) * 4);
    CUBESIM_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CUBESIM_CUDA_CHECK(cudaMemset(db.get(), 0x7f, static_cast<std::size_t>(C) * 4));  // poison
    bias_grad(dx.get(), DType::bf16, db.get(), DType::f32, R, C, nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(static_cast<std::size_t>(C));
    CUBESIM_CUDA_CHECK(cudaMemcpy(got.data(), db.get(), got.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    int bad = 0;
    for (std::int64_t c = 0; c < C && bad < 3; ++c) {
      if (std::memcmp(&got[static_cast<std::size_t>(c)], &want[static_cast<std::size_t>(c)], 4) != 0) {
        ADD_FAILURE() << "column " << c << ": got " << got[static_cast<std::size_t>(c)] << " want "
                      << want[static_cast<std::size_t>(c)];
        ++bad;
      }
    }
  }
}
