// abft.h — algorithm-based fault tolerance for det_gemm: Huang-Abraham row and column checksums.
//
// For C = A·B (+ bias), every row sum of C equals A's row times B's row sums (plus the bias sum),
// and every column sum equals A's column sums times B's column (plus M x that column's bias); an
// output element that a fault changed breaks one row check and one column check, which locates it.
// The expected sums are computed in f64 from A and B alone (O(MK + KN), no second GEMM).
//
// C itself is rounded (f32 accumulation over K, then the output dtype), so a check compares within
// a threshold derived from the dtype and K: each element's accumulation error is modelled as K
// roundings of at most one f32 ulp of |a_i|·|b_j| (Cauchy-Schwarz bounds every partial sum by the
// norms of A's row and B's column), the output rounding as one ulp of the output dtype at |C_ij|,
// both uniform; the threshold is `z` standard deviations of the row's (column's) summed error plus
// the f64 sums' own error. z = 10 by default: a Gaussian tail of 1e-23 per check (the measured
// false-positive rate on clean GEMMs is in docs/PERFORMANCE.md). An error smaller than the
// threshold is indistinguishable from rounding and is not reported; NaN and Inf always are.
//
//   auto enc = kernels::abft_encode(A, B, bias_or_null, C.dtype);   // before or after the GEMM
//   kernels::det_gemm(A, B, bias_or_null, C);
//   auto v = kernels::abft_verify(enc, C);                            // v.ok, v.located[(row, col)]
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/det_gemm.h"

namespace cubesim::kernels {

struct AbftOptions {
  double z = 10;  // standard deviations of the modelled rounding error a check allows
};

// What the checks need of A, B and the bias (C's shape M x N and dtype).
struct AbftEncoding {
  std::int64_t m = 0, n = 0, k = 0;
  DType c_dtype = DType::f32;
  AbftOptions options;
  std::vector<double> row_expect, col_expect;  // the exact row and column sums, in f64
  std::vector<double> row_norm;                // ||A_i||_2
  std::vector<double> col_norm;                // ||B_:,j||_2
  std::vector<double> row_abs, col_abs;        // sums of |terms|: the f64 sums' own error scale
};

struct AbftResult {
  bool ok = true;
  std::vector<std::int64_t> bad_rows, bad_cols;  // ascending
  // Elements located: every (bad row, bad column) pair when there are few (<= 64 pairs), else none.
  std::vector<std::pair<std::int64_t, std::int64_t>> located;
  double worst_ratio = 0;  // the largest |residual| / threshold over all checks (> 1: a failed check)
};

// std::invalid_argument when A and B do not chain (A's cols != B's rows) or the bias is not N long.
AbftEncoding abft_encode(const MatrixView& A, const MatrixView& B, const VectorView* bias, DType c_dtype,
                         AbftOptions options = {});
// std::invalid_argument when C is not M x N of the encoded dtype.
AbftResult abft_verify(const AbftEncoding& enc, const MatrixView& C);

}  // namespace cubesim::kernels
