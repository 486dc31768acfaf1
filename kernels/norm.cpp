#include "kernels/norm.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "kernels/elementwise.h"

namespace cubesim::kernels {

namespace {

void check(const char* op, const char* what, const void* p, std::int64_t stride, std::int64_t n, bool matrix) {
  if (p == nullptr) throw std::invalid_argument(fmt::format("{}: {} is null", op, what));
  if (matrix && stride < n) {
    throw std::invalid_argument(fmt::format("{}: {}'s row_stride {} is less than the row length {}", op, what, stride, n));
  }
}

void check_sizes(const char* op, std::int64_t rows, std::int64_t n) {
  if (rows < 0 || n < 1) throw std::invalid_argument(fmt::format("{}: rows {} must be >= 0 and n {} >= 1", op, rows, n));
}

float at(NormBuffer b, std::int64_t r, std::int64_t j) { return load_f32(b.data, b.dtype, r * b.row_stride + j); }

// Σ_rows of per-row terms, rows ascending from +0, for each column: the weight and bias gradients.
struct ColumnSums {
  std::vector<float> acc;
  explicit ColumnSums(std::int64_t n) : acc(static_cast<std::size_t>(n), 0.0f) {}
  void store(MutableNormBuffer out) const {
    for (std::size_t j = 0; j < acc.size(); ++j) store_f32(out.data, out.dtype, static_cast<std::int64_t>(j), acc[j]);
  }
};

}  // namespace

void rms_norm_forward(NormBuffer x, NormBuffer w, MutableNormBuffer y, float* rstd, std::int64_t rows,
                      std::int64_t n, float eps) {
  const char* op = "rms_norm";
  check_sizes(op, rows, n);
  check(op, "x", x.data, x.row_stride, n, true);
  check(op, "weight", w.data, 0, n, false);
  check(op, "y", y.data, y.row_stride, n, true);
  check(op, "rstd", rstd, 0, n, false);
  const float fn = static_cast<float>(n);
  std::vector<float> row(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < rows; ++r) {
    float ss = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      row[j] = at(x, r, j);
      ss = det_fma(row[j], row[j], ss);
    }
    const float rs = det_div(1.0f, det_sqrt(det_add(det_div(ss, fn), eps)));
    rstd[r] = rs;
    for (std::int64_t j = 0; j < n; ++j) {
      store_f32(y.data, y.dtype, r * y.row_stride + j, det_mul(det_mul(row[j], rs), load_f32(w.data, w.dtype, j)));
    }
  }
}

void rms_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* rstd, MutableNormBuffer dx,
                       MutableNormBuffer dw, std::int64_t rows, std::int64_t n) {
  const char* op = "rms_norm backward";
  check_sizes(op, rows, n);
  check(op, "x", x.data, x.row_stride, n, true);
  check(op, "weight", w.data, 0, n, false);
  check(op, "dy", dy.data, dy.row_stride, n, true);
  check(op, "rstd", rstd, 0, n, false);
  check(op, "dx", dx.data, dx.row_stride, n, true);
  check(op, "dweight", dw.data, 0, n, false);
  const float fn = static_cast<float>(n);
  std::vector<float> xr(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n));
  ColumnSums sw(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float rs = rstd[r];
    float c = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      xr[j] = at(x, r, j);
      const float dyj = at(dy, r, j);
      g[j] = det_mul(dyj, load_f32(w.data, w.dtype, j));
      c = det_fma(g[j], xr[j], c);
      sw.acc[j] = det_fma(dyj, det_mul(xr[j], rs), sw.acc[j]);
    }
    const float a = det_mul(det_mul(rs, rs), det_div(c, fn));
    for (std::int64_t j = 0; j < n; ++j) {
      store_f32(dx.data, dx.dtype, r * dx.row_stride + j, det_mul(rs, det_fma(-xr[j], a, g[j])));
    }
  }
  sw.store(dw);
}

void layer_norm_forward(NormBuffer x, NormBuffer w, NormBuffer b, MutableNormBuffer y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t n, float eps) {
  const char* op = "layer_norm";
  check_sizes(op, rows, n);
  check(op, "x", x.data, x.row_stride, n, true);
  check(op, "weight", w.data, 0, n, false);
  check(op, "bias", b.data, 0, n, false);
  check(op, "y", y.data, y.row_stride, n, true);
  check(op, "mean", mean, 0, n, false);
  check(op, "rstd", rstd, 0, n, false);
  const float fn = static_cast<float>(n);
  std::vector<float> row(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      row[j] = at(x, r, j);
      sum = det_add(sum, row[j]);
    }
    const float mu = det_div(sum, fn);
    float var = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      const float c = det_add(row[j], -mu);
      var = det_fma(c, c, var);
    }
    const float rs = det_div(1.0f, det_sqrt(det_add(det_div(var, fn), eps)));
    mean[r] = mu;
    rstd[r] = rs;
    for (std::int64_t j = 0; j < n; ++j) {
      const float xh = det_mul(det_add(row[j], -mu), rs);
      store_f32(y.data, y.dtype, r * y.row_stride + j,
                det_fma(xh, load_f32(w.data, w.dtype, j), load_f32(b.data, b.dtype, j)));
    }
  }
}

void layer_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* mean, const float* rstd,
                         MutableNormBuffer dx, MutableNormBuffer dw, MutableNormBuffer db, std::int64_t rows,
                         std::int64_t n) {
  const char* op = "layer_norm backward";
  check_sizes(op, rows, n);
  check(op, "x", x.data, x.row_stride, n, true);
  check(op, "weight", w.data, 0, n, false);
  check(op, "dy", dy.data, dy.row_stride, n, true);
  check(op, "mean", mean, 0, n, false);
  check(op, "rstd", rstd, 0, n, false);
  check(op, "dx", dx.data, dx.row_stride, n, true);
  check(op, "dweight", dw.data, 0, n, false);
  check(op, "dbias", db.data, 0, n, false);
  const float fn = static_cast<float>(n);
  std::vector<float> xh(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n));
  ColumnSums sw(n), sb(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      const float dyj = at(dy, r, j);
      xh[j] = det_mul(det_add(at(x, r, j), -mu), rs);
      g[j] = det_mul(dyj, load_f32(w.data, w.dtype, j));
      sg = det_add(sg, g[j]);
      sgx = det_fma(g[j], xh[j], sgx);
      sw.acc[j] = det_fma(dyj, xh[j], sw.acc[j]);
      sb.acc[j] = det_add(sb.acc[j], dyj);
    }
    const float a = det_div(sg, fn), c = det_div(sgx, fn);
    for (std::int64_t j = 0; j < n; ++j) {
      store_f32(dx.data, dx.dtype, r * dx.row_stride + j, det_mul(rs, det_fma(-xh[j], c, det_add(g[j], -a))));
    }
  }
  sw.store(dw);
  sb.store(db);
}

}  // namespace cubesim::kernels
