// norm.h — RMSNorm and LayerNorm over the last dimension, forward and backward, in a fixed order.
//
// Megatron's two normalisations, each row of `n` elements on its own (so a row's output never
// depends on the other rows), statistics in f32, one rounding of each output to its dtype:
//
//   rms_norm_forward(x, w, y, rstd, rows, n, 1e-5f);          // NormBuffer views; rstd: f32 [rows]
//   rms_norm_backward(x, w, dy, rstd, dx, dw, rows, n);       // dw: summed over rows
//
// The order (arithmetic as kernels/elementwise.h's det_* operations, sums by fma or add from +0 over
// the index ascending):
//   RMSNorm    ss = Σ_j x_j·x_j;  r = 1 / sqrt(ss / n + eps);  y_j = (x_j · r) · w_j
//     backward g_j = dy_j · w_j;  c = Σ_j g_j·x_j;  a = (r · r) · (c / n);  dx_j = r · (g_j − x_j·a)
//              dw_j = Σ_rows dy_j · (x_j · r)                        (rows ascending)
//   LayerNorm  μ = (Σ_j x_j) / n;  var = Σ_j (x_j − μ)² / n;  r = 1 / sqrt(var + eps);
//              x̂_j = (x_j − μ) · r;  y_j = fma(x̂_j, w_j, b_j)
//     backward g_j = dy_j · w_j;  a = (Σ_j g_j) / n;  c = (Σ_j g_j·x̂_j) / n;  dx_j = r · ((g_j − a) − x̂_j·c)
//              dw_j = Σ_rows dy_j · x̂_j;  db_j = Σ_rows dy_j                (rows ascending)
// where x̂_j·c, (x_j − μ)² and the Σ of products are fma. Inputs f32, bf16 or f16, widened exactly;
// rstd and mean are f32 [rows] (saved by the forward for the backward).
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace cubesim::kernels {

// A [rows, n] operand: row r at data + r * row_stride elements (n contiguous), or a [n] vector
// (weight, bias, their gradients: row_stride unused).
struct NormBuffer {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t row_stride = 0;
};
struct MutableNormBuffer {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t row_stride = 0;
  operator NormBuffer() const { return {data, dtype, row_stride}; }
};

void rms_norm_forward(NormBuffer x, NormBuffer w, MutableNormBuffer y, float* rstd, std::int64_t rows,
                      std::int64_t n, float eps);
void rms_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* rstd, MutableNormBuffer dx,
                       MutableNormBuffer dw, std::int64_t rows, std::int64_t n);

void layer_norm_forward(NormBuffer x, NormBuffer w, NormBuffer b, MutableNormBuffer y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t n, float eps);
void layer_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* mean, const float* rstd,
                         MutableNormBuffer dx, MutableNormBuffer dw, MutableNormBuffer db, std::int64_t rows,
                         std::int64_t n);

}  // namespace cubesim::kernels
