// The cuda backend's elementwise, reduction and bias-gradient kernels (kernels/cuda/elementwise_cuda.h).
// Grid-stride loops over contiguous buffers; memory-bound. Where every operand is bf16 and 16-byte
// aligned (the MLP's tensors), a thread moves 8 elements per 16-byte access; otherwise one element per
// thread per step, any dtype. Both compute each element with the same operations: the same bits.
#include "kernels/cuda/elementwise_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

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

// Integer sums are associative: each thread sums its elements, each warp and block its threads, and
// one atomic add per block lands in each slot; the order never changes the bits.
// Each thread reads 16 bytes at a time (8 bf16/f16 or 4 f32 words) where x is 16-byte aligned, so the
// pass runs at memory speed; the elements before the first aligned vector and after the last go one
// by one.
template <class W, bool kMix>
__device__ __forceinline__ void checksum_add(W v, std::uint64_t pos, std::uint64_t& sw, std::uint64_t& sm) {
  using U = std::make_unsigned_t<W>;
  sw += static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
  if constexpr (kMix) sm += kernels::mix_term(static_cast<U>(v), pos);
}

template <class W, bool kMix>
__global__ void checksum_kernel(const W* x, std::int64_t n, std::int64_t head, std::uint64_t base,
                                unsigned long long* word, unsigned long long* mix) {
  constexpr int kPer = 16 / sizeof(W);
  std::uint64_t sw = 0, sm = 0;
  const std::int64_t tid = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t nvec = (n - head) / kPer;
  const uint4* xv = reinterpret_cast<const uint4*>(x + head);
  for (std::int64_t v = tid; v < nvec; v += stride) {
    const uint4 q = xv[v];
    W w[kPer];
    memcpy(w, &q, 16);
    const std::uint64_t pos = base + static_cast<std::uint64_t>(head + v * kPer);
    // Eight int16 words sum exactly in 32 bits: one wide add per vector for the word sum (f32 words
    // are added wide). The mix terms' positions step by a 32-bit add.
    if constexpr (sizeof(W) == 2) {
      std::int32_t s32 = 0;
#pragma unroll
      for (int k = 0; k < kPer; ++k) s32 += w[k];
      sw += static_cast<std::uint64_t>(static_cast<std::int64_t>(s32));
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) sw += static_cast<std::uint64_t>(static_cast<std::int64_t>(w[k]));
    }
    if constexpr (kMix) {
      // lo32((pos + k + 1) * kMixStep) = lo32(pos + k + 1) * lo32(kMixStep): 32-bit arithmetic.
      constexpr std::uint32_t step = static_cast<std::uint32_t>(kernels::kMixStep);
      std::uint32_t h = (static_cast<std::uint32_t>(pos) + 1u) * step;
#pragma unroll
      for (int k = 0; k < kPer; ++k, h += step)
        sm += kernels::fmix32(static_cast<std::uint32_t>(static_cast<std::make_unsigned_t<W>>(w[k])) ^ h);
    }
  }
  // The elements outside the vectors: [0, head) and [head + nvec * kPer, n).
  const std::int64_t tail0 = head + nvec * kPer;
  for (std::int64_t i = tid; i < head + (n - tail0); i += stride) {
    const std::int64_t e = i < head ? i : tail0 + (i - head);
    checksum_add<W, kMix>(x[e], base + static_cast<std::uint64_t>(e), sw, sm);
  }
  // Warp sums, then the block's in shared memory, then one atomic per block and slot (atomics on
  // one address serialize: one per warp would cost more than the pass).
  for (int off = 16; off > 0; off /= 2) {
    sw += __shfl_down_sync(0xffffffffu, sw, off);
    if constexpr (kMix) sm += __shfl_down_sync(0xffffffffu, sm, off);
  }
  __shared__ std::uint64_t warp_w[kThreads / 32], warp_m[kThreads / 32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) warp_w[wid] = sw, warp_m[wid] = sm;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint64_t bw = 0, bm = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) bw += warp_w[i], bm += warp_m[i];
    if (word && bw) atomicAdd(word, static_cast<unsigned long long>(bw));
    if (kMix && bm) atomicAdd(mix, static_cast<unsigned long long>(bm));
  }
}

template <class W>
void launch_checksum(const void* x, std::int64_t n, std::uint64_t base, unsigned long long* w, unsigned long long* m,
                     cudaStream_t stream) {
  constexpr int kPer = 16 / sizeof(W);
  const auto addr = reinterpret_cast<std::uintptr_t>(x);
  // Elements before the first 16-byte boundary (x is at least element-aligned).
  const std::int64_t head = std::min<std::int64_t>(n, static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(W)));
  const std::int64_t work = (n - head) / kPer + head + (n - head) % kPer;
  const auto* p = static_cast<const W*>(x);
  // A few vectors per thread and no more blocks than fill the GPU a few times over: fewer atomics.
  const unsigned blocks = std::min(blocks_for((work + 3) / 4), 132u * 8u);
  if (m) checksum_kernel<W, true><<<blocks, kThreads, 0, stream>>>(p, n, head, base, w, m);
  else checksum_kernel<W, false><<<blocks, kThreads, 0, stream>>>(p, n, head, base, w, m);
}

// ---- bf16, 8 elements per 16-byte access ---------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ void unpack8(const uint4& q, float (&f)[8]) {
  const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);  // the lower address holds the lower half (exact widening)
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  // The scalar path's conversion, element by element (RNE, CUDA's canonical NaN).
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i]))) |
           (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]))) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float bf16_at(const void* p, std::int64_t i) {
  return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(p)[i]) << 16);
}
__device__ __forceinline__ void bf16_store(void* p, std::int64_t i, float v) {
  static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

// y = f(x[, z]) on n bf16 elements: 16-byte vectors, then the n % 8 left one by one. With kCol,
// f(c, a, b) gets the element's column c = index % cols (add_bias), worked out once per vector when
// cols is a multiple of 8.
template <bool kTwo, bool kCol, class F>
__global__ void bf16_map_kernel(const void* x, const void* z, void* y, std::int64_t n, std::int64_t cols, F f) {
  const std::int64_t nvec = n / 8;
  const std::int64_t tid = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const bool whole = !kCol || cols % 8 == 0;
  for (std::int64_t v = tid; v < nvec; v += stride) {
    float a[8], b[8], r[8];
    unpack8(static_cast<const uint4*>(x)[v], a);
    if constexpr (kTwo) unpack8(static_cast<const uint4*>(z)[v], b);
    const std::int64_t c = kCol && whole ? (v * 8) % cols : 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const std::int64_t col = !kCol ? 0 : whole ? c + k : (v * 8 + k) % cols;
      r[k] = f(col, a[k], kTwo ? b[k] : 0.0f);
    }
    static_cast<uint4*>(y)[v] = pack8(r);
  }
  for (std::int64_t i = nvec * 8 + tid; i < n; i += stride) {
    bf16_store(y, i, f(kCol ? i % cols : 0, bf16_at(x, i), kTwo ? bf16_at(z, i) : 0.0f));
  }
}

template <bool kTwo, bool kCol = false, class F>
void launch_bf16_map(const void* x, const void* z, void* y, std::int64_t n, F f, cudaStream_t stream,
                     std::int64_t cols = 1) {
  bf16_map_kernel<kTwo, kCol><<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(x, z, y, n, cols, f);
  CUBESIM_CUDA_CHECK_LAUNCH("bf16_map_kernel");
}

bool all_bf16(std::initializer_list<std::pair<const void*, DType>> ops) {
  for (const auto& [p, t] : ops) {
    if (t != DType::bf16 || !aligned16(p)) return false;
  }
  return true;
}

// A GELU kind over every bf16 input (65536 bit patterns), computed once per device by the same device
// functions: the forward's value rounded to bf16 (as the store rounds it), and the backward's factor
// D(x) in f32. kernels::gelu_backward(k, x, dy) ends in det_mul(dy, D(x)) and D(x) =
// gelu_backward(k, x, 1) exactly (x * 1 = x), so dy * D(x) from the table gives the computed bits.
// A lookup turns the compute-bound GELU passes (exp and a correctly rounded division per element)
// into memory-bound ones; the hot entries (activations span a few binades) stay in L1.
struct GeluTables {
  const unsigned short* fwd = nullptr;
  const float* bwd = nullptr;
};

__global__ void gelu_tables_kernel(kernels::GeluKind k, unsigned short* fwd, float* bwd) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536u) return;
  const float x = __uint_as_float(i << 16);
  fwd[i] = __bfloat16_as_ushort(__float2bfloat16_rn(kernels::gelu(k, x)));
  bwd[i] = kernels::gelu_backward(k, x, 1.0f);
}

GeluTables gelu_tables(kernels::GeluKind k, cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, GeluTables> made;  // (device, kind); kept for the process
  int dev = 0;
  CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, static_cast<int>(k));
  if (const auto it = made.find(key); it != made.end()) return it->second;
  // Made once per device, waited for here: not inside a CUDA graph's recording of the stream.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CUBESIM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone)
    throw std::runtime_error("GELU on GPU " + std::to_string(dev) + " while its stream records a CUDA graph: the GELU "
                             "tables are made at a device's first GELU of each kind, which cannot be recorded; run "
                             "the step once before recording it");
  void* p = nullptr;
  CUBESIM_CUDA_CHECK(cudaMalloc(&p, 65536 * (2 + 4)));
  auto* bwd = static_cast<float*>(p);
  auto* fwd = reinterpret_cast<unsigned short*>(bwd + 65536);
  gelu_tables_kernel<<<256, 256, 0, stream>>>(k, fwd, bwd);
  CUBESIM_CUDA_CHECK_LAUNCH("gelu_tables_kernel");
  CUBESIM_CUDA_CHECK(cudaStreamSynchronize(stream));  // ready for every stream of the device, once
  return made[key] = GeluTables{fwd, bwd};
}

__device__ __forceinline__ unsigned bf16_bits(float x) { return __float_as_uint(x) >> 16; }  // x widened from bf16

struct GeluF {
  GeluTables t;
  __device__ float operator()(std::int64_t, float a, float) const {
    return __uint_as_float(static_cast<unsigned>(__ldg(t.fwd + bf16_bits(a))) << 16);
  }
};
struct GeluBackwardF {
  GeluTables t;
  __device__ float operator()(std::int64_t, float a, float b) const { return __fmul_rn(b, __ldg(t.bwd + bf16_bits(a))); }
};
struct AddF {
  __device__ float operator()(std::int64_t, float a, float b) const { return __fadd_rn(a, b); }
};
struct AddBiasF {
  const void* bias;
  __device__ float operator()(std::int64_t c, float a, float) const { return __fadd_rn(a, bf16_at(bias, c)); }
};

// bias_gelu on bf16 (x, pre, y bf16 and 16-byte aligned, cols % 8 == 0): 16-byte vectors; pre's
// rounding is a bf16 store, so gelu sees exactly the value stored.
__global__ void bias_gelu_bf16_kernel(GeluTables t, const void* x, const void* bias, DType bt, void* pre, void* y,
                                      std::int64_t nvec, std::int64_t cols) {
  for (std::int64_t v = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; v < nvec;
       v += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float a[8], p[8];
    unpack8(static_cast<const uint4*>(x)[v], a);
    const std::int64_t c = (v * 8) % cols;
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = __fadd_rn(a[j], load(bias, bt, c + j));
    const uint4 pq = pack8(p);
    static_cast<uint4*>(pre)[v] = pq;
    const unsigned w[4] = {pq.x, pq.y, pq.z, pq.w};
    unsigned o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      o[j] = static_cast<unsigned>(__ldg(t.fwd + (w[j] & 0xffffu))) | (static_cast<unsigned>(__ldg(t.fwd + (w[j] >> 16))) << 16);
    }
    static_cast<uint4*>(y)[v] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// Any dtypes: pre's rounding through a store and a reload of that element (the thread's own).
__global__ void bias_gelu_kernel(kernels::GeluKind k, const void* x, DType xt, const void* bias, DType bt, void* pre,
                                 DType pt, void* y, DType yt, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    detail::store_elem_rt(pre, pt, i, __fadd_rn(load(x, xt, i), load(bias, bt, i % cols)));
    detail::store_elem_rt(y, yt, i, kernels::gelu(k, load(pre, pt, i)));
  }
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

// Each column's sum walks m in ascending order from +0.0f, as det_gemm_bias_grad does: a chain of
// `rows` dependent adds per column, which no split may shorten. What makes it fast is the loading: a
// block owns 32 columns; warps 1..7 stream chunks of rows of them into shared memory, two chunks
// ahead of warp 0 (a lane per column), which adds each chunk's rows in order. bf16 rows whose starts
// are 16-byte aligned go as 16-byte vectors and stay bf16 in the tile (256 rows a chunk); other
// inputs are widened on load (128 rows a chunk).
constexpr int kBgCols = 32, kBgThreads = 256, kBgBufs = 3;

template <bool kVec>
__global__ void __launch_bounds__(kBgThreads) bias_grad_kernel(const void* dy, DType dyt, void* db, DType dbt,
                                                               std::int64_t rows, std::int64_t cols) {
  using T = std::conditional_t<kVec, unsigned short, float>;
  constexpr int R = kVec ? 256 : 128;
  __shared__ __align__(16) T tile[kBgBufs][R][kBgCols];
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kBgCols;
  const int tid = threadIdx.x;
  auto load_chunk = [&](std::int64_t r0, int buf) {
    const int t = tid - 32;  // loaders: warps 1..7
    constexpr int kLoaders = kBgThreads - 32;
    if constexpr (kVec) {
      // 4 vectors of 8 bf16 per row (cols % 8 == 0, so a vector never crosses the last column). All of
      // a thread's loads are issued before any lands in the tile: several in flight per thread.
      constexpr int kPer = (R * 4 + kLoaders - 1) / kLoaders;
      uint4 v[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = t + i * kLoaders, r = e / 4, q = e % 4;
        const std::int64_t m = r0 + r, c = c0 + q * 8;
        v[i] = make_uint4(0, 0, 0, 0);
        if (e < R * 4 && m < rows && c < cols)
          v[i] = *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(dy) + m * cols + c);
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = t + i * kLoaders;
        if (e < R * 4) *reinterpret_cast<uint4*>(&tile[buf][e / 4][(e % 4) * 8]) = v[i];
      }
    } else {
      for (int e = t; e < R * kBgCols; e += kLoaders) {
        const int r = e / kBgCols, cc = e % kBgCols;
        const std::int64_t m = r0 + r, c = c0 + cc;
        tile[buf][r][cc] = m < rows && c < cols ? load(dy, dyt, m * cols + c) : 0.0f;
      }
    }
  };
  float acc = 0.0f;
  const std::int64_t chunks = (rows + R - 1) / R;
  if (tid >= 32) {
    for (int i = 0; i < kBgBufs - 1 && i < chunks; ++i) load_chunk(i * R, i);
  }
  __syncthreads();
  for (std::int64_t i = 0; i < chunks; ++i) {
    const int buf = static_cast<int>(i % kBgBufs);
    if (tid >= 32) {
      const std::int64_t ahead = i + kBgBufs - 1;  // into the buffer chunk i - 1 left
      if (ahead < chunks) load_chunk(ahead * R, static_cast<int>(ahead % kBgBufs));
    } else {
      const int n = static_cast<int>(std::min<std::int64_t>(R, rows - i * R));
      auto add_row = [&](int r) {
        float v;
        if constexpr (kVec) v = __uint_as_float(static_cast<unsigned>(tile[buf][r][tid]) << 16);
        else v = tile[buf][r][tid];
        acc = __fadd_rn(acc, v);
      };
      if (n == R) {
        // A whole chunk, unrolled: the shared-memory reads run ahead of the chain of adds (which
        // keeps its order: one add per row, in row order).
#pragma unroll 32
        for (int r = 0; r < R; ++r) add_row(r);
      } else {
        for (int r = 0; r < n; ++r) add_row(r);
      }
    }
    __syncthreads();
  }
  if (tid < 32 && c0 + tid < cols) detail::store_elem_rt(db, dbt, c0 + tid, acc);
}

// The bf16 path for wide tensors (rows' starts 16-byte aligned): one warp per block owns kCols columns
// and keeps kStages - 1 chunks of kRows rows in flight into a shared-memory ring (cp.async, 16 bytes a
// copy, no registers held while they fly), while its lanes add each landed chunk's rows in order (a
// lane per column, or two adjacent columns per lane when kCols is 64). The adds stay one chain per
// column, row by row from +0.0f, as on the host. Used as <32, 64, 6> (24 KB a block) where the warps
// fill the SMs several times over; what limits it is the adding warp's pace (NOTES.md, issue 18).
__device__ __forceinline__ void bg_cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void bg_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bg_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int kCols, int kRows, int kStages>
__global__ void __launch_bounds__(32) bias_grad_bf16_kernel(const unsigned short* __restrict__ dy, void* db, DType dbt,
                                                            std::int64_t rows, std::int64_t cols) {
  static_assert(kCols == 16 || kCols == 32 || kCols == 64, "a lane per column, or two for 64");
  constexpr int kVecs = kCols / 8;              // 16-byte vectors per row
  constexpr int kPerLane = kRows * kVecs / 32;  // copies per lane per stage
  static_assert(kRows * kVecs % 32 == 0, "whole copies per lane");
  extern __shared__ __align__(16) unsigned short bg_ring[];  // [kStages][kRows][kCols]
  const int lane = threadIdx.x;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kCols;
  const std::int64_t chunks = (rows + kRows - 1) / kRows;
  auto issue = [&](std::int64_t chunk) {
    unsigned short* st = bg_ring + static_cast<int>(chunk % kStages) * (kRows * kCols);
    const std::int64_t r0 = chunk * kRows;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i, r = e / kVecs, q = e % kVecs;
      const std::int64_t m = r0 + r, c = c0 + q * 8;
      if (m < rows && c < cols) bg_cp_async16(st + r * kCols + q * 8, dy + m * cols + c);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) issue(s);
    bg_cp_async_commit();
  }
  float acc0 = 0.0f, acc1 = 0.0f;
  for (std::int64_t i = 0; i < chunks; ++i) {
    bg_cp_async_wait<kStages - 2>();  // chunk i has landed (this lane's copies) ...
    __syncwarp();                     // ... and every lane's; chunk i - 1's buffer is free
    if (i + kStages - 1 < chunks) issue(i + kStages - 1);
    bg_cp_async_commit();
    const unsigned short* st = bg_ring + static_cast<int>(i % kStages) * (kRows * kCols);
    const int n = static_cast<int>(std::min<std::int64_t>(kRows, rows - i * kRows));
    auto add_row = [&](int r) {
      if constexpr (kCols == 64) {
        const unsigned w = reinterpret_cast<const unsigned*>(st + r * kCols)[lane];
        acc0 = __fadd_rn(acc0, __uint_as_float(w << 16));
        acc1 = __fadd_rn(acc1, __uint_as_float(w & 0xffff0000u));
      } else {
        acc0 = __fadd_rn(acc0, __uint_as_float(static_cast<unsigned>(st[r * kCols + (lane % kCols)]) << 16));
      }
    };
    if (n == kRows) {
#pragma unroll 32
      for (int r = 0; r < kRows; ++r) add_row(r);
    } else {
      for (int r = 0; r < n; ++r) add_row(r);
    }
  }
  if constexpr (kCols == 64) {
    const std::int64_t c = c0 + 2 * lane;
    if (c < cols) detail::store_elem_rt(db, dbt, c, acc0);
    if (c + 1 < cols) detail::store_elem_rt(db, dbt, c + 1, acc1);
  } else {
    if (lane < kCols && c0 + lane < cols) detail::store_elem_rt(db, dbt, c0 + lane, acc0);
  }
}

// The bf16 path for long, narrow tensors (rows >= 2048, fewer 32-column strips than 2 x SMs): what
// limits the 8-warp block there is the adding warp's pace (a dependent f32 add a row, 4 cycles, plus
// a 2-byte shared load and a shift a row that the chain waits on). Here the adding warp (warp 0)
// reads f32 values already widened and transposed, four rows of its column in one 16-byte shared
// load, and only adds. Warps 1, 2, 3 and 5 (the producers; warp 4 leaves at once, kBtBlock) load
// each 256-row tile's 4-row x 8-column quads from global memory into registers kBtAhead tiles ahead,
// then widen and store them as
// tile[row / 4][column][row % 4] (XOR-swizzled so that neither the producers' 16-byte stores nor the
// adder's loads conflict), into a ring of kBtBufs tiles of kBtRows rows handed over by named barriers (FULL: the
// producers arrive, the adder waits; EMPTY: the reverse). Order unchanged: each column one chain of
// f32 adds over m ascending from +0.0f. (kernels/cuda/NOTES.md, bias_grad v3.)
// Two shapes of the ring: <256 rows, 3 tiles, 3 ahead> (96 KB) and, from 8192 rows, <512, 2, 2>
// (128 KB: more bytes in flight, which data that must come from HBM rather than the L2 needs).
constexpr int kBtThreads = 160;  // the adding warp and four producers: the named barriers' count
// The block has a sixth warp that leaves at once: warp w issues from the SM's sub-partition w % 4, so
// with warps 0-4 the adder shared its scheduler with producer warp 4; with warp 4 idle and the fourth
// producer in warp 5, the adder has a scheduler of its own.
constexpr int kBtBlock = 192;

__device__ __forceinline__ void bt_bar_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kBtThreads) : "memory"); }
__device__ __forceinline__ void bt_bar_arrive(int id) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kBtThreads) : "memory"); }
// Where column c of a 4-row group lives in its 32 slots of 16 bytes: the low three bits XORed with
// the column's 8-block and the group's parity, so that 8 producers storing one column of their quads
// (two groups x four 8-blocks) hit 8 different bank groups; a warp of adding lanes reads a group's
// 512 bytes, each 8 lanes a permutation of one 8-block.
__device__ __forceinline__ int bt_slot(int c, int odd) { return (c & ~7) | ((c & 7) ^ ((c >> 3) | (odd << 2))); }

template <int kBtRows, int kBtBufs, int kBtAhead>
__global__ void __launch_bounds__(kBtBlock, 1) bias_grad_bf16_tiles_kernel(const unsigned short* __restrict__ dy, void* db,
                                                                          DType dbt, std::int64_t rows, std::int64_t cols) {
  static_assert(kBtRows % 128 == 0 && kBtRows / 64 % 2 == 0, "whole quads a producer, an even number of pieces");
  constexpr int kGroups = kBtRows / 4, kQuads = kBtRows / 128;  // 4-row groups a tile; quads a producer a tile
  extern __shared__ __align__(16) float4 bt_tiles[];              // [kBtBufs][kGroups][32]
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  const std::int64_t tiles = (rows + kBtRows - 1) / kBtRows;
  // Barriers 1..kBtBufs: FULL of a buffer; kBtBufs + 1..2 kBtBufs: EMPTY.
  const int warp = static_cast<int>(threadIdx.x >> 5);
  if (warp == 4) return;  // (kBtBlock: keeps sub-partition 0 to the adder)
  if (warp > 0) {
    // 4 rows (group p / 4 + 32 q) x 8 columns (8-block cb); producers are warps 1, 2, 3 and 5
    const int p = (warp == 5 ? 3 : warp - 1) * 32 + static_cast<int>(threadIdx.x & 31), cb = p & 3;
    uint4 v[kBtAhead][kQuads][4];
    auto issue = [&](std::int64_t t, uint4 (&x)[kQuads][4]) {
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const std::int64_t m = t * kBtRows + 4 * ((p >> 2) + 32 * q) + i, c = c0 + cb * 8;
          x[q][i] = m < rows && c < cols ? __ldg(reinterpret_cast<const uint4*>(dy + m * cols + c)) : make_uint4(0, 0, 0, 0);
        }
      }
    };
    auto put = [&](int b, const uint4 (&x)[kQuads][4]) {
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        const int g = (p >> 2) + 32 * q;
        float4* dst = bt_tiles + (b * kGroups + g) * 32;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          auto widen = [&](const uint4& w) {
            const unsigned u = j < 2 ? w.x : j < 4 ? w.y : j < 6 ? w.z : w.w;
            return __uint_as_float((j & 1) ? (u & 0xffff0000u) : (u << 16));
          };
          dst[bt_slot(cb * 8 + j, g & 1)] = make_float4(widen(x[q][0]), widen(x[q][1]), widen(x[q][2]), widen(x[q][3]));
        }
      }
    };
#pragma unroll
    for (int d = 0; d < kBtAhead; ++d)
      if (d < tiles) issue(d, v[d]);
    int b = 0;
    for (std::int64_t t0 = 0; t0 < tiles; t0 += kBtAhead) {
#pragma unroll
      for (int d = 0; d < kBtAhead; ++d) {
        const std::int64_t t = t0 + d;
        if (t < tiles) {
          if (t >= kBtBufs) bt_bar_sync(1 + kBtBufs + b);  // the adder is done with tile t - kBtBufs
          put(b, v[d]);
          bt_bar_arrive(1 + b);
          if (t + kBtAhead < tiles) issue(t + kBtAhead, v[d]);
          b = b + 1 == kBtBufs ? 0 : b + 1;
        }
      }
    }
    return;
  }
  const int lane = threadIdx.x, s0 = bt_slot(lane, 0), s1 = bt_slot(lane, 1);
  float acc = 0.0f;
  float4 piece[2][16];  // 64 rows: one piece's loads run under the previous piece's adds
  auto add = [&](const float4 (&x)[16]) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc = __fadd_rn(acc, x[j].x);
      acc = __fadd_rn(acc, x[j].y);
      acc = __fadd_rn(acc, x[j].z);
      acc = __fadd_rn(acc, x[j].w);
    }
  };
  auto load = [&](float4 (&x)[16], const float4* tile, int i) {
#pragma unroll
    for (int j = 0; j < 16; ++j) x[j] = tile[(i * 16 + j) * 32 + ((j & 1) ? s1 : s0)];
  };
  constexpr int kPieces = kBtRows / 64;
  const std::int64_t whole = rows / kBtRows;
  std::int64_t t = 0;
  int b = 0, prev = 0;
  bool pending = false;  // piece[1] holds the last piece of the previous tile, not yet added
  if (whole > 0) {       // tile 0 apart: the loop's body has no branch to split its schedule
    bt_bar_sync(1);
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      load(piece[i & 1], bt_tiles, i);
      if (i > 0) add(piece[(i - 1) & 1]);
    }
    pending = true;
    t = 1;
    b = 1 % kBtBufs;
  }
  for (; t < whole; ++t) {
    if (t - 1 + kBtBufs < tiles) bt_bar_arrive(1 + kBtBufs + prev);
    bt_bar_sync(1 + b);
    const float4* tile = bt_tiles + b * kGroups * 32;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      load(piece[i & 1], tile, i);
      add(piece[(i - 1) & 1]);  // i = 0: the previous tile's last piece
    }
    prev = b;
    b = b + 1 == kBtBufs ? 0 : b + 1;
  }
  if (pending) add(piece[1]);
  if (t < tiles) {  // the last, partial tile
    if (t >= 1 && t - 1 + kBtBufs < tiles) bt_bar_arrive(1 + kBtBufs + prev);
    bt_bar_sync(1 + b);
    const float4* tile = bt_tiles + b * kGroups * 32;
    const int n = static_cast<int>(rows - t * kBtRows);
    for (int r = 0; r < n; ++r) {
      const float4 q = tile[(r >> 2) * 32 + (((r >> 2) & 1) ? s1 : s0)];
      const int k = r & 3;
      acc = __fadd_rn(acc, k == 0 ? q.x : k == 1 ? q.y : k == 2 ? q.z : q.w);
    }
  }
  if (c0 + lane < cols) detail::store_elem_rt(db, dbt, c0 + lane, acc);
}

template <int kBtRows, int kBtBufs, int kBtAhead>
void launch_bias_grad_bf16_tiles(const void* dy, void* db, DType dbt, std::int64_t rows, std::int64_t cols, int dev,
                                 cudaStream_t stream) {
  // The dynamic shared memory (over 48 KB) needs the kernel's attribute raised once per device.
  constexpr int kSmem = kBtBufs * kBtRows * 32 * 4;
  auto* kernel = bias_grad_bf16_tiles_kernel<kBtRows, kBtBufs, kBtAhead>;
  static std::mutex mu;
  static std::uint64_t raised = 0;  // a bit per device ordinal below 64
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::uint64_t bit = dev < 64 ? std::uint64_t{1} << dev : 0;
    if (!bit || !(raised & bit)) {
      CUBESIM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      raised |= bit;
    }
  }
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  kernel<<<blocks, kBtBlock, kSmem, stream>>>(static_cast<const unsigned short*>(dy), db, dbt, rows, cols);
}

template <int kCols, int kRows, int kStages>
void launch_bias_grad_bf16(const void* dy, void* db, DType dbt, std::int64_t rows, std::int64_t cols,
                           cudaStream_t stream) {
  constexpr int kSmem = kStages * kRows * kCols * 2;
  static_assert(kSmem <= 48 * 1024, "within the default dynamic shared memory: no attribute to set per device");
  const unsigned blocks = static_cast<unsigned>((cols + kCols - 1) / kCols);
  bias_grad_bf16_kernel<kCols, kRows, kStages>
      <<<blocks, 32, kSmem, stream>>>(static_cast<const unsigned short*>(dy), db, dbt, rows, cols);
}


}  // namespace

void checksum(const void* x, DType t, std::int64_t n, std::uint64_t base, std::uint64_t* word, std::uint64_t* mix,
              cudaStream_t stream) {
  if (n <= 0 || (!word && !mix)) return;
  auto* w = reinterpret_cast<unsigned long long*>(word);
  auto* m = reinterpret_cast<unsigned long long*>(mix);
  if (dtype_size(t) == 4) launch_checksum<std::int32_t>(x, n, base, w, m, stream);
  else launch_checksum<std::int16_t>(x, n, base, w, m, stream);
  CUBESIM_CUDA_CHECK_LAUNCH("checksum_kernel");
}

void reduce(void* dst, const void* src, DType dtype, std::int64_t n, ReduceOp op, cudaStream_t stream) {
  if (n <= 0) return;
  reduce_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, dtype, n, op);
  CUBESIM_CUDA_CHECK_LAUNCH("reduce_kernel");
}

void gelu(kernels::GeluKind k, const void* x, DType xt, void* y, DType yt, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_bf16({{x, xt}, {y, yt}})) return launch_bf16_map<false>(x, nullptr, y, n, GeluF{gelu_tables(k, stream)}, stream);
  gelu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(k, x, xt, y, yt, n);
  CUBESIM_CUDA_CHECK_LAUNCH("gelu_kernel");
}

void gelu_backward(kernels::GeluKind k, const void* x, DType xt, const void* dy, DType dyt, void* dx, DType dxt,
                   std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_bf16({{x, xt}, {dy, dyt}, {dx, dxt}})) {
    return launch_bf16_map<true>(x, dy, dx, n, GeluBackwardF{gelu_tables(k, stream)}, stream);
  }
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(k, x, xt, dy, dyt, dx, dxt, n);
  CUBESIM_CUDA_CHECK_LAUNCH("gelu_backward_kernel");
}

void add(const void* a, DType at, const void* b, DType bt, void* y, DType yt, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_bf16({{a, at}, {b, bt}, {y, yt}})) return launch_bf16_map<true>(a, b, y, n, AddF{}, stream);
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, at, b, bt, y, yt, n);
  CUBESIM_CUDA_CHECK_LAUNCH("add_kernel");
}

void add_bias(const void* x, DType xt, const void* bias, DType bt, void* y, DType yt, std::int64_t rows,
              std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  if (all_bf16({{x, xt}, {y, yt}}) && bt == DType::bf16) {
    return launch_bf16_map<false, true>(x, nullptr, y, n, AddBiasF{bias}, stream, cols);
  }
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, xt, bias, bt, y, yt, n, cols);
  CUBESIM_CUDA_CHECK_LAUNCH("add_bias_kernel");
}

void bias_gelu(kernels::GeluKind k, const void* x, DType xt, const void* bias, DType bt, void* pre, DType pt, void* y,
               DType yt, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  if (all_bf16({{x, xt}, {pre, pt}, {y, yt}}) && cols % 8 == 0) {
    bias_gelu_bf16_kernel<<<blocks_for(n / 8), kThreads, 0, stream>>>(gelu_tables(k, stream), x, bias, bt, pre, y, n / 8, cols);
  } else {
    bias_gelu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(k, x, xt, bias, bt, pre, pt, y, yt, n, cols);
  }
  CUBESIM_CUDA_CHECK_LAUNCH("bias_gelu_kernel");
}

void bias_grad(const void* dy, DType dyt, void* db, DType dbt, std::int64_t rows, std::int64_t cols,
               cudaStream_t stream) {
  if (cols <= 0) return;
  const unsigned blocks = static_cast<unsigned>((cols + kBgCols - 1) / kBgCols);
  int dev = 0, sms = 0;
  CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
  CUBESIM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int smem_optin = 0;  // what a block may have (227 KB on an H100 or H200)
  CUBESIM_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (dyt == DType::bf16 && aligned16(dy) && cols % 8 == 0) {
    // A warp per 32 columns wherever they fill the SMs twice over ([4096, 14336]: 448 warps); below
    // that, long tensors take the widened transposed tiles, short ones the 8-warp block (whose first
    // chunk lands sooner) (kernels/cuda/NOTES.md, issue 18).
    if ((cols + 31) / 32 >= 2 * static_cast<std::int64_t>(sms)) launch_bias_grad_bf16<32, 64, 6>(dy, db, dbt, rows, cols, stream);
    else if (rows >= 8192 && smem_optin >= 128 * 1024) launch_bias_grad_bf16_tiles<512, 2, 2>(dy, db, dbt, rows, cols, dev, stream);
    else if (rows >= 2048 && smem_optin >= 96 * 1024) launch_bias_grad_bf16_tiles<256, 3, 3>(dy, db, dbt, rows, cols, dev, stream);
    else bias_grad_kernel<true><<<blocks, kBgThreads, 0, stream>>>(dy, dyt, db, dbt, rows, cols);
  } else {
    bias_grad_kernel<false><<<blocks, kBgThreads, 0, stream>>>(dy, dyt, db, dbt, rows, cols);
  }
  CUBESIM_CUDA_CHECK_LAUNCH("bias_grad_kernel");
}

}  // namespace cubesim::cuda
