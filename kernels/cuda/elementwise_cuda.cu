// The cuda backend's elementwise, reduction and bias-gradient kernels (kernels/cuda/elementwise_cuda.h).
// Grid-stride loops over contiguous buffers; memory-bound, one element per thread per step.
#include "kernels/cuda/elementwise_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dtype_cuda.cuh"

namespace cubesim::cuda {

namespace {

// Plain (coherent) loads: reduce reads dst, which it also writes.
__device__ __forceinline__ float load(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::bf16: return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(p)[i]) << 16);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::f32: break;
  }
  return static_cast<const float*>(p)[i];
}

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(b, 1, 132 * 32));
}

__global__ void reduce_kernel(void* dst, const void* src, DType t, std::int64_t n, ReduceOp op) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float a = load(dst, t, i), b = load(src, t, i);
    float r;
    if (op == ReduceOp::sum) {
      r = __fadd_rn(a, b);
    } else {
      // As kernels/reduce.cpp: NaN in either operand gives the quiet NaN; else b when a < b, else a
      // (so max(-0, +0) keeps dst's zero, as on the host).
      r = (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : (a < b ? b : a);
    }
    detail::store_elem_rt(dst, t, i, r);
  }
}

// Integer sums are associative: each thread sums its elements, each warp its threads, and one
// atomic add per warp lands in the slot; the order never changes the bits.
__global__ void checksum_kernel(const void* x, int word_bytes, std::int64_t n, kernels::ChecksumKind kind,
                                std::uint64_t base, unsigned long long* slot) {
  std::uint64_t s = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t w;
    if (word_bytes == 4) {
      const std::int32_t v = static_cast<const std::int32_t*>(x)[i];
      w = kind == kernels::ChecksumKind::word ? static_cast<std::uint64_t>(static_cast<std::int64_t>(v))
                                              : static_cast<std::uint64_t>(static_cast<std::uint32_t>(v));
    } else {
      const std::int16_t v = static_cast<const std::int16_t*>(x)[i];
      w = kind == kernels::ChecksumKind::word ? static_cast<std::uint64_t>(static_cast<std::int64_t>(v))
                                              : static_cast<std::uint64_t>(static_cast<std::uint16_t>(v));
    }
    s += kind == kernels::ChecksumKind::word
             ? w
             : kernels::fmix64(w + (base + static_cast<std::uint64_t>(i) + 1) * kernels::kMixStep);
  }
  for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
  if ((threadIdx.x & 31) == 0 && s != 0) atomicAdd(slot, static_cast<unsigned long long>(s));
}

__global__ void gelu_kernel(kernels::GeluKind k, const void* x, DType xt, void* y, DType yt, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    detail::store_elem_rt(y, yt, i, kernels::gelu(k, load(x, xt, i)));
  }
}

__global__ void gelu_backward_kernel(kernels::GeluKind k, const void* x, DType xt, const void* dy, DType dyt, void* dx,
                                     DType dxt, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    detail::store_elem_rt(dx, dxt, i, kernels::gelu_backward(k, load(x, xt, i), load(dy, dyt, i)));
  }
}

__global__ void add_kernel(const void* a, DType at, const void* b, DType bt, void* y, DType yt, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    detail::store_elem_rt(y, yt, i, __fadd_rn(load(a, at, i), load(b, bt, i)));
  }
}

__global__ void add_bias_kernel(const void* x, DType xt, const void* bias, DType bt, void* y, DType yt, std::int64_t n,
                                std::int64_t cols) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    detail::store_elem_rt(y, yt, i, __fadd_rn(load(x, xt, i), load(bias, bt, i % cols)));
  }
}

// One thread per column: consecutive threads read consecutive columns of a row (coalesced), and
// each walks m in ascending order, as det_gemm_bias_grad does.
__global__ void bias_grad_kernel(const void* dy, DType dyt, void* db, DType dbt, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t m = 0; m < rows; ++m) acc = __fadd_rn(acc, load(dy, dyt, m * cols + c));
    detail::store_elem_rt(db, dbt, c, acc);
  }
}

}  // namespace

void checksum(const void* x, DType t, std::int64_t n, kernels::ChecksumKind kind, std::uint64_t base,
              std::uint64_t* slot, cudaStream_t stream) {
  if (n <= 0) return;
  checksum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<int>(dtype_size(t)), n, kind, base,
                                                           reinterpret_cast<unsigned long long*>(slot));
  CUBESIM_CUDA_CHECK_LAUNCH("checksum_kernel");
}

void reduce(void* dst, const void* src, DType dtype, std::int64_t n, ReduceOp op, cudaStream_t stream) {
  if (n <= 0) return;
  reduce_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, dtype, n, op);
  CUBESIM_CUDA_CHECK_LAUNCH("reduce_kernel");
}

void gelu(kernels::GeluKind k, const void* x, DType xt, void* y, DType yt, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(k, x, xt, y, yt, n);
  CUBESIM_CUDA_CHECK_LAUNCH("gelu_kernel");
}

void gelu_backward(kernels::GeluKind k, const void* x, DType xt, const void* dy, DType dyt, void* dx, DType dxt,
                   std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(k, x, xt, dy, dyt, dx, dxt, n);
  CUBESIM_CUDA_CHECK_LAUNCH("gelu_backward_kernel");
}

void add(const void* a, DType at, const void* b, DType bt, void* y, DType yt, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, at, b, bt, y, yt, n);
  CUBESIM_CUDA_CHECK_LAUNCH("add_kernel");
}

void add_bias(const void* x, DType xt, const void* bias, DType bt, void* y, DType yt, std::int64_t rows,
              std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, xt, bias, bt, y, yt, n, cols);
  CUBESIM_CUDA_CHECK_LAUNCH("add_bias_kernel");
}

void bias_grad(const void* dy, DType dyt, void* db, DType dbt, std::int64_t rows, std::int64_t cols,
               cudaStream_t stream) {
  if (cols <= 0) return;
  bias_grad_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(dy, dyt, db, dbt, rows, cols);
  CUBESIM_CUDA_CHECK_LAUNCH("bias_grad_kernel");
}

}  // namespace cubesim::cuda
