// elementwise_cuda.h — the cuda backend's device kernels for everything but GEMMs.
//
// Each computes exactly what the host path of the runtime computes, so a cuda run gives the host's
// bits: elements are widened exactly to f32, combined with the same correctly rounded operations
// (kernels/elementwise.h's det_* on the device are the non-contracting __fadd_rn/__fmul_rn/
// __fmaf_rn), and rounded once to the output dtype (RNE; CUDA's canonical NaNs, which the host's
// conversions reproduce).
//   reduce       dst = op(dst, src): sum as f32 a + b, max NaN-propagating (kernels/reduce.h); an
//                f32 sum with a NaN operand is NaN with the GPU's payload (the host keeps the operand's)
//   gelu, gelu_backward, add, add_bias   elementwise in f32 (kernels/elementwise.h, as runtime/ops.cpp)
//   bias_gelu    pre = x + bias rounded to pre's dtype, y = gelu(pre): add_bias then gelu in one pass
//   bias_grad    db[n] = sum over rows m ascending from +0.0f (det_gemm_bias_grad)
//   checksum     *word, *mix += kernels::checksum_pair(x) (kernels/checksum.h): 64-bit integer sums,
//                per warp and then atomically into the slots, in any order: the host's bits
// Every launcher is asynchronous on `stream` and throws cubesim::cuda::CudaError naming the kernel
// when the launch fails. Tensors are contiguous; n may be 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/checksum.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace cubesim::cuda {

using kernels::ReduceOp;

void reduce(void* dst, const void* src, DType dtype, std::int64_t n, ReduceOp op, cudaStream_t stream);
void gelu(kernels::GeluKind k, const void* x, DType xt, void* y, DType yt, std::int64_t n, cudaStream_t stream);
void gelu_backward(kernels::GeluKind k, const void* x, DType xt, const void* dy, DType dyt, void* dx, DType dxt,
                   std::int64_t n, cudaStream_t stream);
void add(const void* a, DType at, const void* b, DType bt, void* y, DType yt, std::int64_t n, cudaStream_t stream);
// y[r, c] = x[r, c] + bias[c] (y may be x).
void add_bias(const void* x, DType xt, const void* bias, DType bt, void* y, DType yt, std::int64_t rows,
              std::int64_t cols, cudaStream_t stream);
void bias_grad(const void* dy, DType dyt, void* db, DType dbt, std::int64_t rows, std::int64_t cols,
               cudaStream_t stream);
// pre[r, c] = x[r, c] + bias[c] (pre may be x), y = gelu(pre), pre rounded to its dtype first.
void bias_gelu(kernels::GeluKind k, const void* x, DType xt, const void* bias, DType bt, void* pre, DType pt, void* y,
               DType yt, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// Adds the word and mix checksums of n elements of x (the first at index `base` of its tensor) to
// *word and *mix, 64-bit integers in device memory (zero them first to take one checksum; either may
// be null: not computed), in one pass over x.
void checksum(const void* x, DType t, std::int64_t n, std::uint64_t base, std::uint64_t* word, std::uint64_t* mix,
              cudaStream_t stream);
}  // namespace cubesim::cuda
