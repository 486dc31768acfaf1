// dtype_cuda.cuh — device-side loads and stores of cubesim::DType elements (widening is exact; narrowing
// is round-to-nearest-even through CUDA's own __float2bfloat16_rn / __float2half_rn, which
// base/dtype.h reproduces on the host bit for bit).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "base/dtype.h"

namespace cubesim::cuda::detail {

template <DType T> struct Storage;
template <> struct Storage<DType::f32> { using type = float; };
template <> struct Storage<DType::bf16> { using type = __nv_bfloat16; };
template <> struct Storage<DType::f16> { using type = __half; };

template <DType T>
__device__ __forceinline__ float load_elem(const void* p, std::int64_t i) {
  if constexpr (T == DType::f32) {
    return __ldg(static_cast<const float*>(p) + i);
  } else if constexpr (T == DType::bf16) {
    const unsigned short h = __ldg(static_cast<const unsigned short*>(p) + i);
    return __uint_as_float(static_cast<unsigned>(h) << 16);  // exact
  } else {
    return __half2float(__ldg(static_cast<const __half*>(p) + i));  // exact
  }
}

__device__ __forceinline__ float load_elem_rt(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::bf16: return load_elem<DType::bf16>(p, i);
    case DType::f16: return load_elem<DType::f16>(p, i);
    case DType::f32: break;
  }
  return load_elem<DType::f32>(p, i);
}

__device__ __forceinline__ void store_elem_rt(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); return;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); return;
    case DType::f32: break;
  }
  static_cast<float*>(p)[i] = v;
}

}  // namespace cubesim::cuda::detail
