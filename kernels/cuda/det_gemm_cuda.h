// det_gemm_cuda.h — the deterministic GEMM C = A·B (+ bias) on a CUDA GPU, in two numerics modes.
//
//   GemmMode::exact        the numerics contract itself (../shared/DESIGN.md): every operand widened
//                          exactly to f32, each C[m][n] accumulated from 0.0f by one FFMA per k in
//                          ascending k, bias added after the sum, then rounded to nearest even to the
//                          output type. Bitwise equal to the CPU kernels (det_gemm_reference).
//   GemmMode::tensor_core  its own numerics mode, never passed off as exact: operands rounded to bf16
//                          (a no-op for bf16 inputs), wgmma bf16 MMA with f32 accumulators on sm_90a,
//                          k walked in a fixed sequence of 64-wide tiles of four k16 MMAs from an
//                          accumulator that starts at 0, bias and rounding as above. Deterministic and
//                          batch-invariant bit for bit (a row of C does not depend on M, chunking,
//                          padding, its position or the other rows); within bf16 tolerance of f64.
//
// Operands are the strided views of kernels/det_gemm.h (element strides, any sign) over device
// memory, so the backward GEMMs are the forward kernel on transposed views, and the call mirrors the
// CPU det_gemm:
//
//   using namespace cubesim; using namespace cubesim::kernels; using namespace cubesim::cuda;
//   auto x = MatrixView::row_major(d_x, DType::bf16, M, K);                // activations
//   auto w = MatrixView::row_major(d_w, DType::bf16, N, K);                // weight W[out, in]
//   auto y = MutableMatrixView::row_major(d_y, DType::f32, M, N);
//   det_gemm_cuda(x, w.transposed(), nullptr, y, {.mode = GemmMode::exact}, stream);   // Y = X·Wᵀ
//   det_gemm_cuda_backward_input(dy, w.transposed(), dx, opt, stream);     // dX = dY·W   (ascending n)
//   det_gemm_cuda_backward_weight(x, dy, dwt, opt, stream);                // d(Wᵀ) = Xᵀ·dY (ascending m)
//
// All calls are asynchronous on `stream` (like a kernel launch). Errors the caller can cause
// (shapes, dtypes, tensor_core on a GPU that is not sm_90) throw std::invalid_argument naming the
// operand and what would be valid; CUDA failures throw cubesim::cuda::CudaError naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/det_gemm.h"
#include "base/dtype.h"

namespace cubesim::cuda {

using kernels::MatrixView;
using kernels::MutableMatrixView;
using kernels::VectorView;

enum class GemmMode : std::uint8_t {
  exact,        // FFMA in the contract's order: bitwise equal to the CPU kernels
  tensor_core,  // bf16 wgmma, f32 accumulation: deterministic, batch-invariant, not exact
};

// "exact" / "tensor_core".
const char* gemm_mode_name(GemmMode m);
// "exact" | "tensor_core"; anything else throws std::invalid_argument naming the input and the modes.
GemmMode parse_gemm_mode(std::string_view s);

// Tensor-core tile configurations. Every one computes the same bits for every element (the
// per-element k sequence is the same; only how many rows/columns a CTA covers differs); `automatic`
// picks by shape. Forcing one exists for tests (they pin the bitwise equality) and benchmarks.
enum class TcConfig : std::uint8_t {
  automatic,
  m128n256,  // 2 consumer warpgroups of m64n256, 1 TMA producer warpgroup, 4 stages
  m128n256_c2,  // the same in clusters of 2 CTAs along M, each multicasting half of the B tile
  m128n128,  // 2 consumer warpgroups of m64n128, 6 stages
  m64n32,    // 1 consumer warpgroup of m64n32, 16 stages: small M, many CTAs along N
  // Ping-pong: 2 consumer warpgroups each owning whole m64n256 tiles, taking turns on the tensor
  // cores (one's epilogue runs under the other's MMAs), 1 TMA producer warpgroup, 4 stages.
  m64n256_pp,
  m64n256_pp_c2,  // the same in clusters of 2 CTAs along M, each multicasting half of the B tile
  m128n32,   // 2 consumer warpgroups of m64n32, 11 stages: 65 <= M <= 128, many CTAs along N
  m128n224,  // as m128n256 with 224 columns (4 stages): N = 3584 in 16 n-tiles, whole waves
  m128n224_c2,  // the same in clusters of 2 CTAs along M, each multicasting part of the B tile
  m224n128_c2,  // m128n224_c2 on Cᵀ = Bᵀ·Aᵀ, each tile stored transposed: M = 3584 in whole waves
};
const char* tc_config_name(TcConfig c);
// The configuration a tensor_core call of this shape runs on the current device (`requested`
// unless it is `automatic`).
TcConfig resolve_tc_config(TcConfig requested, std::int64_t M, std::int64_t N);
// CTAs a tensor_core launch of this configuration keeps resident (its persistent grid, at most).
int tc_config_resident_ctas(TcConfig c);

struct GemmOptions {
  GemmMode mode = GemmMode::exact;
  TcConfig tc_config = TcConfig::automatic;
  // Scratch for tensor_core operands that must be repacked: TMA reads a bf16 operand in place when
  // one of its dimensions is contiguous (k-major, or MN-major as the backward GEMMs' transposed
  // views are) and the other's stride is a multiple of 16 bytes at least that dimension's extent (rows
  // that do not overlap) with a 16-byte aligned start; any other operand (f32, f16, other strides) is
  // repacked to k-major bf16 first.
  // nullptr: allocated with cudaMallocAsync on the stream and freed after.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // tensor_core: SMs the persistent grid leaves free, for a collective running beside the GEMM
  // (NCCL's kernel needs SMs of its own to overlap; the bits do not depend on the grid).
  int sm_margin = 0;
};

// Bytes of workspace det_gemm_cuda needs for these operands in tensor_core mode (0 in exact mode or
// when both operands are used in place).
std::size_t det_gemm_cuda_workspace_bytes(const MatrixView& A, const MatrixView& B, const GemmOptions& opt);

// Why a tensor_core call of det_gemm_cuda reads an operand through a repacked k-major bf16 copy
// instead of in place, e.g. "A [4096 x 4096] is f32: the tensor cores read bf16, so it is converted
// (rounded to nearest even) and repacked first"; "" when both operands are read in place, and in
// exact mode (which reads any layout). Host code only: no GPU needed. The cuda backend says it once
// per run in the run report (RunReport::notes).
std::string det_gemm_cuda_repack_reason(const MatrixView& A, const MatrixView& B, const GemmOptions& opt);

// C [M,N] = A [M,K] · B [K,N] (+ bias [N], or nullptr). Any of f32/bf16/f16 each, mixed freely.
// C must not overlap A, B or bias.
void det_gemm_cuda(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C,
                   const GemmOptions& opt, cudaStream_t stream);

// Backward of C = A·B, same modes and contract (the forward kernel on transposed views):
// dA [M,K] = dC [M,N] · Bᵀ, each element summed over n ascending;
void det_gemm_cuda_backward_input(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA,
                                  const GemmOptions& opt, cudaStream_t stream);
// dB [K,N] = Aᵀ · dC, each element summed over m ascending.
void det_gemm_cuda_backward_weight(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB,
                                   const GemmOptions& opt, cudaStream_t stream);

// True when the current device can run GemmMode::tensor_core (compute capability 9.0: sm_90a).
bool tensor_core_mode_supported();

}  // namespace cubesim::cuda
