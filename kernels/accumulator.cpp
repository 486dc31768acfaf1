#include "kernels/accumulator.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace cubesim::kernels {

namespace {

constexpr std::string_view kNames[] = {"f32_fma_seq", "pairwise", "bf16_acc", "hopper_tc"};

float element(const MatrixView& v, std::int64_t r, std::int64_t c) {
  return load_f32(v.data, v.dtype, r * v.row_stride + c * v.col_stride);
}

// A group's exact sum to f32 as the Hopper tensor core does: rounded toward zero, but a sum beyond the
// f32 range (|d| >= 2^128) is infinite, not the largest finite value that IEEE round-toward-zero gives,
// and a negative sum cut to zero is +0 (measured on an H200:
// CudaGemmTc.HopperTcModelOnAMillionSingleInstructionTiles).
float to_f32_rz(double d) {
  if (std::fabs(d) >= 0x1p128) return std::copysign(std::numeric_limits<float>::infinity(), static_cast<float>(d));
  float f = static_cast<float>(d);  // nearest even
  if (std::isinf(f)) return std::copysign(std::numeric_limits<float>::max(), static_cast<float>(d));
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return f == 0.0f ? 0.0f : f;  // a sum cut to nothing is +0, whatever its sign (measured on an H200)
}

float pairwise_sum(float* p, int n) {
  // Balanced: halves of a power of two, adjacent pairs first.
  while (n > 1) {
    const int half = (n + 1) / 2;
    for (int i = 0; i < n / 2; ++i) p[i] = p[2 * i] + p[2 * i + 1];
    if (n % 2) p[n / 2] = p[n - 1];
    n = half;
  }
  return n == 1 ? p[0] : 0.0f;
}

}  // namespace

std::string_view accumulator_model_name(AccumulatorModel m) { return kNames[static_cast<int>(m)]; }

AccumulatorModel parse_accumulator_model(std::string_view s, std::string_view what) {
  for (AccumulatorModel m : kAccumulatorModels)
    if (accumulator_model_name(m) == s) return m;
  throw std::invalid_argument(fmt::format("{}: '{}' is not an accumulator model (valid: f32_fma_seq, pairwise, "
                                          "bf16_acc, hopper_tc)",
                                          what, s));
}

int accumulator_group(AccumulatorModel m) {
  switch (m) {
    case AccumulatorModel::pairwise: return kPairwiseGroup;
    case AccumulatorModel::hopper_tc: return kHopperGroup;
    default: return 1;
  }
}

// floor(log2 |x|) for x != 0, at least `min_exp` (a subnormal's exponent is its format's least).
int exponent_of(double x, int min_exp) {
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  return std::max(e - 1, min_exp);
}

float hopper_tc_step(float acc, const float* a, const float* b, int n, int min_exp_a, int min_exp_b, int frac_bits) {
  // Products of bf16/f16 values are exact in double (at most 22 significant bits).
  double t[kHopperGroup + 1];
  int ex[kHopperGroup + 1];
  t[0] = acc;
  ex[0] = exponent_of(acc, -126);
  bool finite = std::isfinite(acc);
  for (int i = 0; i < n; ++i) {
    t[i + 1] = static_cast<double>(a[i]) * static_cast<double>(b[i]);
    finite = finite && std::isfinite(t[i + 1]);
    // The product's exponent is e_a + e_b: its significand stays in [1, 4).
    ex[i + 1] = t[i + 1] == 0 ? 0 : exponent_of(a[i], min_exp_a) + exponent_of(b[i], min_exp_b);
  }
  if (!finite) {
    // An infinite or NaN input: the exact products (finite ones cannot overflow in double) and the
    // accumulator summed as IEEE arithmetic does, so inf + finite is inf (a product beyond the f32
    // range does not turn an infinite accumulator into NaN, as an f32 sum would; measured on an H200).
    double s = acc;
    for (int i = 0; i < n; ++i) s += t[i + 1];
    return static_cast<float>(s);
  }
  int emax = std::numeric_limits<int>::min();
  for (int i = 0; i <= n; ++i)
    if (t[i] != 0) emax = std::max(emax, ex[i]);
  if (emax == std::numeric_limits<int>::min()) return acc;  // every term zero: the accumulator's zero
  // The alignment never goes below 2^kHopperMinAlignExp (the exponent of the least bf16 subnormal): in
  // a group of tiny terms the cut is 2^(-133 - 25), coarser than 25 bits below their own largest.
  emax = std::max(emax, kHopperMinAlignExp);
  // Each term as an integer multiple of 2^(emax - frac_bits), truncated toward zero; exact sum.
  const int scale = frac_bits - emax;
  std::int64_t sum = 0;
  for (int i = 0; i <= n; ++i) sum += static_cast<std::int64_t>(std::trunc(std::ldexp(t[i], scale)));
  if (sum == 0) return 0.0f;
  return to_f32_rz(std::ldexp(static_cast<double>(sum), -scale));
}

void accumulate_model(AccumulatorModel m, const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld,
                      bool last) {
  if (A.cols != B.rows)
    throw std::invalid_argument(fmt::format("accumulate_model: A has {} columns but B {} rows", A.cols, B.rows));
  const int g = accumulator_group(m);
  if (!last && A.cols % g != 0)
    throw std::invalid_argument(fmt::format(
        "gemm_numerics {}: a k-block of {} is not a whole number of the model's groups of {} products (give the "
        "PE's tile a k that is a multiple of {})",
        accumulator_model_name(m), A.cols, g, g));
  if (m == AccumulatorModel::hopper_tc && (A.dtype == DType::f32 || B.dtype == DType::f32))
    throw std::invalid_argument(fmt::format("gemm_numerics hopper_tc models bf16/f16 tensor-core MMAs; this GEMM's "
                                            "operands are {} and {} (use f32_fma_seq, pairwise or bf16_acc for f32)",
                                            dtype_name(A.dtype), dtype_name(B.dtype)));
  const std::int64_t M = A.rows, N = B.cols, K = A.cols;
  if (m == AccumulatorModel::f32_fma_seq) {
    det_gemm_accumulate_reference(A, B, acc, ld);
    return;
  }
  // The operands' least exponent (a subnormal's): f16 -14; bf16 -126.
  const int min_a = A.dtype == DType::f16 ? -14 : -126, min_b = B.dtype == DType::f16 ? -14 : -126;
  std::vector<float> a(static_cast<std::size_t>(K)), p(static_cast<std::size_t>(kPairwiseGroup));
  std::vector<float> b(static_cast<std::size_t>(K));
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t k = 0; k < K; ++k) a[static_cast<std::size_t>(k)] = element(A, i, k);
    for (std::int64_t j = 0; j < N; ++j) {
      for (std::int64_t k = 0; k < K; ++k) b[static_cast<std::size_t>(k)] = element(B, k, j);
      float s = acc[i * ld + j];
      switch (m) {
        case AccumulatorModel::bf16_acc:
          for (std::int64_t k = 0; k < K; ++k) s = round_to(DType::bf16, std::fma(a[k], b[k], s));
          break;
        case AccumulatorModel::pairwise:
          for (std::int64_t k0 = 0; k0 < K; k0 += kPairwiseGroup) {
            const int n = static_cast<int>(std::min<std::int64_t>(kPairwiseGroup, K - k0));
            for (int q = 0; q < n; ++q) p[q] = a[k0 + q] * b[k0 + q];
            s = s + pairwise_sum(p.data(), n);
          }
          break;
        case AccumulatorModel::hopper_tc:
          for (std::int64_t k0 = 0; k0 < K; k0 += kHopperGroup) {
            const int n = static_cast<int>(std::min<std::int64_t>(kHopperGroup, K - k0));
            s = hopper_tc_step(s, a.data() + k0, b.data() + k0, n, min_a, min_b);
          }
          break;
        case AccumulatorModel::f32_fma_seq: break;
      }
      acc[i * ld + j] = s;
    }
  }
}

void gemm_model(AccumulatorModel m, const MatrixView& A, const MatrixView& B, const VectorView* bias,
                const MutableMatrixView& C) {
  if (A.rows != C.rows || B.cols != C.cols || A.cols != B.rows)
    throw std::invalid_argument(fmt::format("gemm_model: A [{}, {}] times B [{}, {}] does not give C [{}, {}]", A.rows,
                                            A.cols, B.rows, B.cols, C.rows, C.cols));
  std::vector<float> acc(static_cast<std::size_t>(C.rows * C.cols), 0.0f);
  if (m == AccumulatorModel::f32_fma_seq) {
    det_gemm(A, B, bias, C);
    return;
  }
  accumulate_model(m, A, B, acc.data(), C.cols, true);
  det_gemm_store(acc.data(), C.cols, bias, C);
}

}  // namespace cubesim::kernels
