// det_gemm_cuda_internal.h — what the pieces of kernels/cuda share; not part of the public API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/det_gemm_cuda.h"

namespace cubesim::cuda::detail {

[[noreturn]] inline void throw_shape_error(const std::string& what) { throw std::invalid_argument(what); }

// The bias as the kernels read it: element n at data + n*stride (data == nullptr: no bias).
struct BiasArg {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t stride = 1;
};

// GemmMode::exact on any strided views (det_gemm_exact.cu). Views already checked.
void launch_exact_gemm(const MatrixView& a, const MatrixView& b, const BiasArg& bias, const MutableMatrixView& c,
                       cudaStream_t stream);

// GemmMode::tensor_core on bf16 operands TMA can read in place (det_gemm_tc.cu):
// a: M x K, k contiguous, row stride lda elements (element (m, k) at a + m*lda + k), or with a_mn
// m contiguous (at a + k*lda + m); bt: Bᵀ, N x K, k contiguous (element (n, k) at bt + n*ldb + k),
// or with b_mn n contiguous (at bt + k*ldb + n). lda*2 and ldb*2 multiples of 16, both pointers
// 16-byte aligned, K >= 1.
struct TcOperands {
  const void* a;
  std::int64_t lda;
  const void* bt;
  std::int64_t ldb;
  int M, N, K;
  bool a_mn = false, b_mn = false;
};
void launch_tc_gemm(const TcOperands& ops, const BiasArg& bias, const MutableMatrixView& c, TcConfig cfg,
                    cudaStream_t stream, int sm_margin = 0);

// Repack rows x kdim elements (element (r, k) at src + r*rs + k*ks) into bf16 dst[r*ld + k],
// rounding to nearest even; ld >= kdim. Columns kdim..ld are left as they are (TMA never reads them:
// the tensor map's k extent is kdim).
void launch_pack_bf16(const void* src, DType t, std::int64_t rows, std::int64_t kdim, std::int64_t rs,
                      std::int64_t ks, void* dst, std::int64_t ld, cudaStream_t stream);

}  // namespace cubesim::cuda::detail
