// The scalar definition of the numerics contract. This file is compiled with -ffp-contract=off
// (kernels/CMakeLists.txt says so even if the project-wide flag were dropped): every fma below is
// the one std::fma asks for, and no other multiply-add is fused behind our back.
#include <cmath>
#include <vector>

#include "kernels/det_gemm.h"
#include "kernels/detail/det_gemm_checks.h"

namespace cubesim::kernels {
namespace {

// acc[i*ld + j] continued (or started from +0.0f) by fma over k ascending. The operands are first
// widened to dense f32 (exact), B transposed so the k loop reads both contiguously.
void reference_accumulate(const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld, bool from_zero) {
  const std::int64_t M = A.rows, N = B.cols, K = A.cols;
  std::vector<float> a(static_cast<std::size_t>(M * K)), bt(static_cast<std::size_t>(N * K));
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k) a[i * K + k] = A.at(i, k);
  for (std::int64_t j = 0; j < N; ++j)
    for (std::int64_t k = 0; k < K; ++k) bt[j * K + k] = B.at(k, j);
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      float s = from_zero ? 0.0f : acc[i * ld + j];
      const float* ai = &a[i * K];
      const float* bj = &bt[j * K];
      for (std::int64_t k = 0; k < K; ++k) s = std::fma(ai[k], bj[k], s);
      acc[i * ld + j] = s;
    }
  }
}

void reference_product(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
  const std::int64_t M = A.rows, N = B.cols;
  std::vector<float> acc(static_cast<std::size_t>(M * N));
  reference_accumulate(A, B, acc.data(), N, /*from_zero=*/true);
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      float v = acc[i * N + j];
      if (bias) v = v + bias->at(j);  // after the whole sum: one rounding
      store_f32(C.data, C.dtype, i * C.row_stride + j * C.col_stride, v);
    }
  }
}

}  // namespace

void det_gemm_reference(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
  detail::check_gemm("det_gemm_reference", A, B, bias, C);
  reference_product(A, B, bias, C);
}

void det_gemm_backward_input_reference(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
  detail::check_backward_input("det_gemm_backward_input_reference", dC, B, dA);
  reference_product(dC, B.transposed(), nullptr, dA);  // the product's k is the forward's n
}

void det_gemm_backward_weight_reference(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
  detail::check_backward_weight("det_gemm_backward_weight_reference", A, dC, dB);
  reference_product(A.transposed(), dC, nullptr, dB);  // the product's k is the forward's m
}

void det_gemm_accumulate_reference(const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld) {
  detail::check_accumulate("det_gemm_accumulate_reference", A, B, acc, ld);
  reference_accumulate(A, B, acc, ld, /*from_zero=*/false);
}

}  // namespace cubesim::kernels
