// det_gemm.h — the deterministic, batch-invariant GEMM of the numerics contract, on the host.
//
// C[M,N] = A[M,K]·B[K,N] (+ bias[N]), each element computed as
//
//     acc = +0.0f;
//     for (k = 0; k < K; ++k) acc = fma(A[m,k], B[k,n], acc);      // f32, ascending k, no split-K
//     C[m,n] = round_to_nearest_even(C.dtype, bias ? acc + bias[n] : acc);
//
// with f32/bf16/f16 inputs widened exactly to f32 first. That order depends on nothing but k, so
// a row of C is bitwise the same whatever M is, whatever the other rows hold, however the batch is
// chunked or padded, on any thread count, tile shape or backend (simulated PE and CUDA exact mode
// compute the same bits). The fast kernel vectorises across n only (one vector FMA lane is one
// scalar fma) and blocks over k by reloading the running accumulator, never by summing partials.
//
//   using namespace cubesim; using namespace cubesim::kernels;
//   std::vector<std::uint16_t> x(M * K), w(N * K);          // bf16 activations, weight W[out,in]
//   std::vector<float> y(M * N);
//   det_gemm(MatrixView::row_major(x.data(), DType::bf16, M, K),
//            MatrixView::row_major(w.data(), DType::bf16, N, K).transposed(),   // Y = X·Wᵀ
//            nullptr, MutableMatrixView::row_major(y.data(), DType::f32, M, N), {.threads = 2});
//
// Views are strided (row and column strides in elements, any sign), so a transpose or a block is a
// view, not a copy. Errors a caller can cause (shapes, dtypes, overlapping outputs, an output that
// aliases an input) throw std::invalid_argument naming the operands and what would be valid.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "base/dtype.h"

namespace cubesim::kernels {

// A strided matrix of rows x cols elements of `dtype`; element (r, c) lives at
// data + (r * row_stride + c * col_stride) * dtype_size(dtype). Ptr is `const void` for inputs
// (MatrixView) and `void` for outputs (MutableMatrixView), which converts to MatrixView.
template <class Ptr>
struct BasicMatrixView {
  Ptr* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 1;

  static BasicMatrixView row_major(Ptr* data, DType dtype, std::int64_t rows, std::int64_t cols) {
    return {data, dtype, rows, cols, cols, 1};
  }
  static BasicMatrixView col_major(Ptr* data, DType dtype, std::int64_t rows, std::int64_t cols) {
    return {data, dtype, rows, cols, 1, rows};
  }
  BasicMatrixView transposed() const { return {data, dtype, cols, rows, col_stride, row_stride}; }
  // The nrows x ncols block whose top-left element is (r0, c0); no bounds check.
  BasicMatrixView block(std::int64_t r0, std::int64_t c0, std::int64_t nrows, std::int64_t ncols) const {
    return {element_ptr(r0, c0), dtype, nrows, ncols, row_stride, col_stride};
  }
  BasicMatrixView row_block(std::int64_t r0, std::int64_t nrows) const { return block(r0, 0, nrows, cols); }
  Ptr* element_ptr(std::int64_t r, std::int64_t c) const {
    using Byte = std::conditional_t<std::is_const_v<Ptr>, const unsigned char, unsigned char>;
    return static_cast<Byte*>(data) +
           (r * row_stride + c * col_stride) * static_cast<std::int64_t>(dtype_size(dtype));
  }
  float at(std::int64_t r, std::int64_t c) const { return load_f32(data, dtype, r * row_stride + c * col_stride); }
  std::int64_t size() const { return rows * cols; }

  operator BasicMatrixView<const void>() const
    requires(!std::is_const_v<Ptr>)
  {
    return {data, dtype, rows, cols, row_stride, col_stride};
  }
};
using MatrixView = BasicMatrixView<const void>;
using MutableMatrixView = BasicMatrixView<void>;

// A strided vector of `size` elements; element i at data + i * stride * dtype_size(dtype).
template <class Ptr>
struct BasicVectorView {
  Ptr* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t size = 0;
  std::int64_t stride = 1;

  static BasicVectorView contiguous(Ptr* data, DType dtype, std::int64_t size) { return {data, dtype, size, 1}; }
  BasicVectorView slice(std::int64_t i0, std::int64_t n) const {
    using Byte = std::conditional_t<std::is_const_v<Ptr>, const unsigned char, unsigned char>;
    return {static_cast<Byte*>(data) + i0 * stride * static_cast<std::int64_t>(dtype_size(dtype)), dtype, n,
            stride};
  }
  float at(std::int64_t i) const { return load_f32(data, dtype, i * stride); }

  operator BasicVectorView<const void>() const
    requires(!std::is_const_v<Ptr>)
  {
    return {data, dtype, size, stride};
  }
};
using VectorView = BasicVectorView<const void>;
using MutableVectorView = BasicVectorView<void>;

// Which micro-kernel the fast path runs. Every choice gives the same bits; `portable` exists so
// tests cover the fallback on machines that have AVX2, and `avx2`/`avx512` throw where the CPU
// lacks them. `avx512` runs a 12x32 tile over the bulk of the output and the 6x16 AVX2 tile on
// the edges.
enum class GemmIsa { automatic, portable, avx2, avx512 };
std::string_view gemm_isa_name(GemmIsa isa);
// True when this CPU (and OS) run AVX2 and FMA.
bool cpu_has_avx2_fma();
// True when this CPU (and OS) also run AVX-512F (zmm registers).
bool cpu_has_avx512f();
// What `automatic` runs on this CPU: avx512, else avx2, else portable.
GemmIsa gemm_isa_automatic();

struct GemmOptions {
  int threads = 1;  // >= 1; threads split M and N only, never K
  GemmIsa isa = GemmIsa::automatic;
  // Cache blocking in elements; 0 picks the tuned default, others are rounded up to the micro-tile
  // (6 rows, 16 columns; a block that is not a whole number of 12x32 tiles runs 6x16 on its edges). Tests shrink them to reach every edge with small shapes: the result
  // never depends on them.
  std::int64_t mc = 0, nc = 0, kc = 0;
  // Below this much work per thread (2·M·N·K flops), fewer threads are used, since waking one costs
  // more than it saves. Tests set 0 to split even tiny products.
  double min_flops_per_thread = 1.0e6;
};

// ---- forward: C = A·B (+ bias) ----------------------------------------------------------------
// A [M,K], B [K,N], bias [N] or null, C [M,N]; any of f32/bf16/f16 each, mixed freely.

// The scalar definition: std::fma in a translation unit compiled with -ffp-contract=off.
void det_gemm_reference(const MatrixView& A, const MatrixView& B, const VectorView* bias,
                        const MutableMatrixView& C);
// The fast kernel: packed f32 panels, a 12x32 AVX-512 or 6x16 AVX2/FMA register-blocked
// micro-kernel (portable fallback), bitwise equal to det_gemm_reference on every shape, layout,
// dtype and thread count.
void det_gemm(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C,
              const GemmOptions& options = {});

// ---- backward ---------------------------------------------------------------------------------
// dA [M,K] = dC [M,N] · Bᵀ, where B is the forward's [K,N] operand: each element sums over n ascending.
void det_gemm_backward_input_reference(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA);
void det_gemm_backward_input(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA,
                             const GemmOptions& options = {});
// dB [K,N] = Aᵀ · dC, where A is the forward's [M,K] operand: each element sums over m ascending.
void det_gemm_backward_weight_reference(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB);
void det_gemm_backward_weight(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB,
                              const GemmOptions& options = {});
// For a linear layer Y = X·Wᵀ with W stored [out, in], dW [out, in] = det_gemm_backward_weight(dY, X,
// dW): element (o, i) sums dY[m,o]·X[m,i] over m ascending, the same bits as (Xᵀ·dY)ᵀ (fma(a,b,c) ==
// fma(b,a,c)), written row by row — faster than writing Xᵀ·dY into the transposed view of dW.
// dbias [N] = column sums of dC [M,N]: acc = +0.0f; acc = acc + dC[m,n] for ascending m; rounded
// to dbias.dtype. One definition serves every backend.
void det_gemm_bias_grad(const MatrixView& dC, const MutableVectorView& dbias);

// ---- tiles, for engines that block the product themselves (the simulated PE) ---------------------
// A PE that computes C tile by tile, K block by K block, gets the contract's bits with:
//
//   std::fill(acc, acc + mt * ld, 0.0f);                                  // +0.0f: the contract's start
//   for (k0 = 0; k0 < K; k0 += kb)                                        // ascending k blocks
//     det_gemm_accumulate(A.block(m0, k0, mt, kb'), B.block(k0, n0, kb', nt), acc, ld);
//   det_gemm_store(acc, ld, bias ? &bias_slice : nullptr, C.block(m0, n0, mt, nt));
//
// det_gemm_accumulate continues acc[i*ld + j] (an mt x nt f32 tile, row-major with leading
// dimension ld >= nt) by fma over A's columns in ascending order; it is the fast kernel started
// from the given accumulator, and det_gemm_accumulate_reference the scalar loop.
void det_gemm_accumulate(const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld,
                         const GemmOptions& options = {});
void det_gemm_accumulate_reference(const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld);
// C[i,j] = round(C.dtype, bias ? acc[i*ld+j] + bias[j] : acc[i*ld+j]); bias has C.cols elements.
void det_gemm_store(const float* acc, std::int64_t ld, const VectorView* bias, const MutableMatrixView& C);

// The contract's last step for one element: bias after the full sum, one f32 rounding.
inline float det_gemm_finish(float acc, const float* bias) { return bias ? acc + *bias : acc; }

// "64x128" — for messages.
std::string shape_string(std::int64_t rows, std::int64_t cols);

}  // namespace cubesim::kernels
