#include "kernels/abft.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::kernels {

namespace {
// Precision bits of the output dtype's significand (with the implicit bit); f32 output: the
// accumulator is the output, no further rounding (0).
int output_precision(DType d) {
  switch (d) {
    case DType::bf16: return 8;
    case DType::f16: return 11;
    default: return 0;
  }
}

// One ulp of the output dtype at |c|; 0 for f32 output.
double output_ulp(double c, int p, DType d) {
  if (p == 0) return 0;
  int e = 0;
  std::frexp(std::fabs(c), &e);  // |c| = f x 2^e, f in [0.5, 1)
  const int min_e = d == DType::f16 ? -13 : -125;  // below: subnormal spacing
  return std::ldexp(1.0, std::max(e, min_e) - p);
}
}  // namespace

AbftEncoding abft_encode(const MatrixView& A, const MatrixView& B, const VectorView* bias, DType c_dtype,
                         AbftOptions options) {
  if (A.cols != B.rows)
    throw std::invalid_argument(fmt::format("abft_encode: A is {}x{} and B {}x{}: A's columns must equal B's rows",
                                            A.rows, A.cols, B.rows, B.cols));
  if (bias && bias->size != B.cols)
    throw std::invalid_argument(
        fmt::format("abft_encode: bias has {} elements, C has {} columns: they must be equal", bias->size, B.cols));
  if (!(options.z > 0) || !std::isfinite(options.z))
    throw std::invalid_argument(fmt::format("abft_encode: z = {} (valid: a finite number > 0)", options.z));
  AbftEncoding e;
  e.m = A.rows, e.n = B.cols, e.k = A.cols;
  e.c_dtype = c_dtype;
  e.options = options;
  // B's row sums (and their |.|), A's column sums (and their |.|), the norms.
  std::vector<double> b_row(e.k, 0), b_row_abs(e.k, 0), a_col(e.k, 0), a_col_abs(e.k, 0);
  e.col_norm.assign(e.n, 0);
  for (std::int64_t k = 0; k < e.k; ++k)
    for (std::int64_t j = 0; j < e.n; ++j) {
      const double v = B.at(k, j);
      b_row[k] += v, b_row_abs[k] += std::fabs(v), e.col_norm[j] += v * v;
    }
  e.row_norm.assign(e.m, 0);
  for (std::int64_t i = 0; i < e.m; ++i)
    for (std::int64_t k = 0; k < e.k; ++k) {
      const double v = A.at(i, k);
      a_col[k] += v, a_col_abs[k] += std::fabs(v), e.row_norm[i] += v * v;
    }
  for (auto& x : e.row_norm) x = std::sqrt(x);
  for (auto& x : e.col_norm) x = std::sqrt(x);
  double bias_sum = 0, bias_abs = 0;
  if (bias)
    for (std::int64_t j = 0; j < e.n; ++j) bias_sum += bias->at(j), bias_abs += std::fabs(bias->at(j));
  e.row_expect.assign(e.m, bias_sum);
  e.row_abs.assign(e.m, bias_abs);
  for (std::int64_t i = 0; i < e.m; ++i)
    for (std::int64_t k = 0; k < e.k; ++k) {
      const double a = A.at(i, k);
      e.row_expect[i] += a * b_row[k];
      e.row_abs[i] += std::fabs(a) * b_row_abs[k];
    }
  e.col_expect.assign(e.n, 0);
  e.col_abs.assign(e.n, 0);
  for (std::int64_t j = 0; j < e.n; ++j) {
    if (bias) e.col_expect[j] = static_cast<double>(e.m) * bias->at(j), e.col_abs[j] = e.m * std::fabs(bias->at(j));
    for (std::int64_t k = 0; k < e.k; ++k) {
      const double b = B.at(k, j);
      e.col_expect[j] += a_col[k] * b;
      e.col_abs[j] += a_col_abs[k] * std::fabs(b);
    }
  }
  return e;
}

AbftResult abft_verify(const AbftEncoding& e, const MatrixView& C) {
  if (C.rows != e.m || C.cols != e.n || C.dtype != e.c_dtype)
    throw std::invalid_argument(fmt::format("abft_verify: C is {} {}x{}, the encoding is for {} {}x{}",
                                            dtype_name(C.dtype), C.rows, C.cols, dtype_name(e.c_dtype), e.m, e.n));
  const int p = output_precision(e.c_dtype);
  // Accumulation: K + 1 roundings (the bias add) of at most 2^-23 x |a_i| |b_j| each, uniform.
  const double acc_var = static_cast<double>(e.k + 1) * std::ldexp(1.0, -46) / 12.0;
  double sum_row_norm2 = 0, sum_col_norm2 = 0;
  for (double x : e.row_norm) sum_row_norm2 += x * x;
  for (double x : e.col_norm) sum_col_norm2 += x * x;
  std::vector<double> row_sum(e.m, 0), col_sum(e.n, 0), row_var(e.m, 0), col_var(e.n, 0);
  for (std::int64_t i = 0; i < e.m; ++i)
    for (std::int64_t j = 0; j < e.n; ++j) {
      const double c = C.at(i, j);
      row_sum[i] += c, col_sum[j] += c;
      const double u = output_ulp(c, p, e.c_dtype);
      row_var[i] += u * u / 12.0, col_var[j] += u * u / 12.0;
    }
  const double f64_rel = static_cast<double>(e.m + e.n + e.k + 4) * std::ldexp(1.0, -52);
  AbftResult r;
  auto check = [&](double sum, double expect, double var, double abs, double abs_c, std::vector<std::int64_t>& bad,
                   std::int64_t index) {
    const double tol = e.options.z * std::sqrt(var) + f64_rel * (abs + abs_c) + 1e-300;
    const double resid = std::fabs(sum - expect);
    const double ratio = std::isfinite(resid) ? resid / tol : INFINITY;
    r.worst_ratio = std::max(r.worst_ratio, ratio);
    if (!(resid <= tol)) bad.push_back(index);
  };
  std::vector<double> row_abs_c(e.m, 0), col_abs_c(e.n, 0);
  for (std::int64_t i = 0; i < e.m; ++i)
    for (std::int64_t j = 0; j < e.n; ++j) {
      const double a = std::fabs(C.at(i, j));
      row_abs_c[i] += a, col_abs_c[j] += a;
    }
  for (std::int64_t i = 0; i < e.m; ++i)
    check(row_sum[i], e.row_expect[i], row_var[i] + acc_var * e.row_norm[i] * e.row_norm[i] * sum_col_norm2,
          e.row_abs[i], row_abs_c[i], r.bad_rows, i);
  for (std::int64_t j = 0; j < e.n; ++j)
    check(col_sum[j], e.col_expect[j], col_var[j] + acc_var * e.col_norm[j] * e.col_norm[j] * sum_row_norm2,
          e.col_abs[j], col_abs_c[j], r.bad_cols, j);
  // A non-finite element makes its row and column sums non-finite: both checks fail.
  r.ok = r.bad_rows.empty() && r.bad_cols.empty();
  if (!r.ok && r.bad_rows.size() * r.bad_cols.size() <= 64)
    for (auto i : r.bad_rows)
      for (auto j : r.bad_cols) r.located.emplace_back(i, j);
  return r;
}

}  // namespace cubesim::kernels
