// The row-wise ops' kernels (kernels/cuda/rowwise_cuda.h). Three shapes of kernel:
//   row_sweep   a chain per row (Σ_j ascending): warp 0's lane k walks row r0 + k; warps 1..7 stage
//               the next chunks of 32 rows x kCols columns, transformed to the chain's f32 terms;
//   col_sweep   a chain per column (Σ over rows ascending: the weight gradients), the same with 32
//               columns and chunks of kColRows rows;
//   row_map     one thread per element of a [rows, n] grid, with per-row and per-column operands.
// Each op is a small functor: fetch (a chunk element's loads, nothing else) and prep (its terms from
// them), step (one link of the chain), finish (the row's or column's results); or load/store for row_map. The arithmetic in them is the host's,
// line for line, through kernels/elementwise.h's det_* (the non-contracting intrinsics on the device).
#include "kernels/cuda/rowwise_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dtype_cuda.cuh"
#include "kernels/elementwise.h"

namespace cubesim::cuda {

namespace {

using kernels::det_add;
using kernels::det_div;
using kernels::det_exp;
using kernels::det_fma;
using kernels::det_mul;
using kernels::det_sqrt;

// Plain (coherent) loads: some outputs alias inputs.
__device__ __forceinline__ float ld(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::bf16: return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(p)[i]) << 16);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::f32: break;
  }
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ float at(NormBuffer b, std::int64_t r, std::int64_t j) {
  return ld(b.data, b.dtype, r * b.row_stride + j);
}
// The same with the dtype known at compile time (T = int(DType)), or at run time (T = -1). The sweeps'
// loaders use these: with no branch between a load and the next, a thread's loads of a chunk are all
// in flight together (a run-time switch per element serialises them).
template <int T>
__device__ __forceinline__ float ldt(const void* p, DType t, std::int64_t i) {
  if constexpr (T < 0) {
    return ld(p, t, i);
  } else if constexpr (T == static_cast<int>(DType::bf16)) {
    return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(p)[i]) << 16);
  } else if constexpr (T == static_cast<int>(DType::f16)) {
    return __half2float(static_cast<const __half*>(p)[i]);
  } else {
    return static_cast<const float*>(p)[i];
  }
}
template <int T>
__device__ __forceinline__ float at_t(NormBuffer b, std::int64_t r, std::int64_t j) {
  return ldt<T>(b.data, b.dtype, r * b.row_stride + j);
}
template <int T>
__device__ __forceinline__ float vec_t(NormBuffer b, std::int64_t j) {
  return ldt<T>(b.data, b.dtype, j);
}
__device__ __forceinline__ void put(MutableNormBuffer b, std::int64_t r, std::int64_t j, float v) {
  detail::store_elem_rt(b.data, b.dtype, r * b.row_stride + j, v);
}

// ---- row_sweep --------------------------------------------------------------------------------------

// A launch's error, naming the op (a runtime name: CUBESIM_CUDA_CHECK_LAUNCH takes a literal).
void check_launch(const char* name) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda_error(e, (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
}

constexpr int kChains = 32, kSweepThreads = 256, kLoaderWarps = kSweepThreads / 32 - 1, kBufs = 3;

// NT terms per element; a chunk is kChains rows x kCols columns (NT = 1: 512, 2: 256: about 197 KB of
// shared memory for three chunks), f32 with a padded pitch so that the 32 lanes (32 rows, one column)
// hit 32 banks. Loader warp w (1..7) stages rows w - 1, w + 6, ... of a chunk, lane l its columns l,
// l + 32, ...: one row address per row, each load a whole warp's 32 consecutive elements.
template <int NT>
constexpr int row_cols() {
  return NT == 1 ? 512 : 256;
}
template <int NT>
constexpr std::size_t row_sweep_smem() {
  return sizeof(float) * kBufs * NT * kChains * (row_cols<NT>() + 1);
}

// The chains of a sweep (row or column), shared by both: the loader warps (threads 32 and up) keep
// kBufs - 1 chunks of K terms staged ahead through load(first term, buffer); warp 0's lanes each walk
// one chain over all `total` terms in order, term c of buffer buf read by at(buf, c, v). Returns the
// lane's state (the loaders' is unused).
template <int NT, int K, class Op, class Load, class At>
__device__ __forceinline__ typename Op::State sweep_chains(const Op& op, std::int64_t total, Load& load, At&& at) {
  const int tid = threadIdx.x;
  const std::int64_t chunks = (total + K - 1) / K;
  if (tid >= 32) {
    for (int i = 0; i < kBufs - 1 && i < chunks; ++i) load(i * K, i);
  }
  typename Op::State st{};
  op.init(st);
  __syncthreads();
  for (std::int64_t i = 0; i < chunks; ++i) {
    const int buf = static_cast<int>(i % kBufs);
    if (tid >= 32) {
      const std::int64_t ahead = i + kBufs - 1;  // into the buffer chunk i - 1 left
      if (ahead < chunks) load(ahead * K, static_cast<int>(ahead % kBufs));
    } else {
      const int m = static_cast<int>(std::min<std::int64_t>(K, total - i * K));
      auto step = [&](int c) {
        float v[NT];
        at(buf, c, v);
        op.step(st, v);
      };
      if (m == K) {
#pragma unroll 16
        for (int c = 0; c < K; ++c) step(c);
      } else {
        for (int c = 0; c < m; ++c) step(c);
      }
    }
    __syncthreads();
  }
  return st;
}

template <int NT, class Op>
__global__ void __launch_bounds__(kSweepThreads) row_sweep_kernel(Op op, std::int64_t rows, std::int64_t n) {
  constexpr int K = row_cols<NT>(), P = K + 1, kRowsPer = (kChains + kLoaderWarps - 1) / kLoaderWarps,
                kColsPer = K / 32;
  extern __shared__ float smem[];
  auto tile = [&](int buf, int k, int r, int c) -> float& { return smem[((buf * NT + k) * kChains + r) * P + c]; };
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * kChains;
  const int tid = threadIdx.x, wl = tid / 32 - 1, lane = tid % 32;
  // Every load of a chunk is issued before any is used: at clamped (always valid) indices and with no
  // branch between them, so that all are in flight together; then the terms are made (prep) and what
  // lies outside the rows and columns is dropped.
  auto load_chunk = [&](std::int64_t j0, int buf) {
    float v[kRowsPer][kColsPer][NT];
#pragma unroll
    for (int a = 0; a < kRowsPer; ++a) {
      const std::int64_t r = std::min<std::int64_t>(r0 + std::min(wl + a * kLoaderWarps, kChains - 1), rows - 1);
#pragma unroll
      for (int c = 0; c < kColsPer; ++c) op.fetch(r, std::min<std::int64_t>(j0 + lane + 32 * c, n - 1), v[a][c]);
    }
#pragma unroll
    for (int a = 0; a < kRowsPer; ++a) {
      const int rr = wl + a * kLoaderWarps;
      const std::int64_t r = std::min<std::int64_t>(r0 + std::min(rr, kChains - 1), rows - 1);
#pragma unroll
      for (int c = 0; c < kColsPer; ++c) {
        const std::int64_t j = j0 + lane + 32 * c;
        op.prep(r, std::min<std::int64_t>(j, n - 1), v[a][c]);
        if (!(r0 + rr < rows && j < n)) {
#pragma unroll
          for (int k = 0; k < NT; ++k) v[a][c][k] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int a = 0; a < kRowsPer; ++a) {
      const int rr = wl + a * kLoaderWarps;
      if (rr < kChains) {
#pragma unroll
        for (int c = 0; c < kColsPer; ++c)
#pragma unroll
          for (int k = 0; k < NT; ++k) tile(buf, k, rr, lane + 32 * c) = v[a][c][k];
      }
    }
  };
  const typename Op::State st = sweep_chains<NT, K>(op, n, load_chunk, [&](int buf, int c, float (&v)[NT]) {
#pragma unroll
    for (int k = 0; k < NT; ++k) v[k] = tile(buf, k, tid, c);
  });
  if (tid < 32 && r0 + tid < rows) op.finish(r0 + tid, st);
}

template <int NT, class Op>
void row_sweep(const Op& op, std::int64_t rows, std::int64_t n, cudaStream_t stream, const char* name) {
  if (rows <= 0 || n <= 0) return;
  constexpr std::size_t smem = row_sweep_smem<NT>();
  CUBESIM_CUDA_CHECK(cudaFuncSetAttribute(row_sweep_kernel<NT, Op>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  const unsigned blocks = static_cast<unsigned>((rows + kChains - 1) / kChains);
  row_sweep_kernel<NT, Op><<<blocks, kSweepThreads, smem, stream>>>(op, rows, n);
  check_launch(name);
}

// ---- col_sweep --------------------------------------------------------------------------------------

// A chunk: kColRows rows x 32 columns (about 197 KB for three chunks of two terms). Loader warp w
// (1..7) stages rows w - 1, w + 6, ..., lane l column c0 + l.
constexpr int kColRows = 256;
template <int NT>
constexpr std::size_t col_sweep_smem() {
  return sizeof(float) * kBufs * NT * kColRows * kChains;
}

template <int NT, class Op>
__global__ void __launch_bounds__(kSweepThreads) col_sweep_kernel(Op op, std::int64_t rows, std::int64_t n) {
  constexpr int R = kColRows, kRowsPer = (R + kLoaderWarps - 1) / kLoaderWarps;
  extern __shared__ float smem[];
  auto tile = [&](int buf, int k, int r, int c) -> float& { return smem[((buf * NT + k) * R + r) * kChains + c]; };
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kChains;
  const int tid = threadIdx.x, wl = tid / 32 - 1, lane = tid % 32;
  // As the row sweep's: clamped loads first, all in flight together, then the terms.
  auto load_chunk = [&](std::int64_t q0, int buf) {
    const std::int64_t jc = std::min<std::int64_t>(c0 + lane, n - 1);
    float v[kRowsPer][NT];
#pragma unroll
    for (int a = 0; a < kRowsPer; ++a) {
      op.fetch(std::min<std::int64_t>(q0 + std::min(wl + a * kLoaderWarps, R - 1), rows - 1), jc, v[a]);
    }
#pragma unroll
    for (int a = 0; a < kRowsPer; ++a) {
      const int rr = wl + a * kLoaderWarps;
      const std::int64_t r = std::min<std::int64_t>(q0 + std::min(rr, R - 1), rows - 1);
      op.prep(r, jc, v[a]);
      if (!(q0 + rr < rows && c0 + lane < n)) {
#pragma unroll
        for (int k = 0; k < NT; ++k) v[a][k] = 0.0f;
      }
    }
#pragma unroll
    for (int a = 0; a < kRowsPer; ++a) {
      const int rr = wl + a * kLoaderWarps;
      if (rr < R) {
#pragma unroll
        for (int k = 0; k < NT; ++k) tile(buf, k, rr, lane) = v[a][k];
      }
    }
  };
  const typename Op::State st = sweep_chains<NT, R>(op, rows, load_chunk, [&](int buf, int r, float (&v)[NT]) {
#pragma unroll
    for (int k = 0; k < NT; ++k) v[k] = tile(buf, k, r, tid);
  });
  if (tid < 32 && c0 + tid < n) op.finish(c0 + tid, st);
}

template <int NT, class Op>
void col_sweep(const Op& op, std::int64_t rows, std::int64_t n, cudaStream_t stream, const char* name) {
  if (n <= 0) return;
  constexpr std::size_t smem = col_sweep_smem<NT>();
  CUBESIM_CUDA_CHECK(cudaFuncSetAttribute(col_sweep_kernel<NT, Op>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  const unsigned blocks = static_cast<unsigned>((n + kChains - 1) / kChains);
  col_sweep_kernel<NT, Op><<<blocks, kSweepThreads, smem, stream>>>(op, rows, n);
  check_launch(name);
}

// Op<T> with T the operands' common dtype (every load typed at compile time), or Op<-1> when they differ.
template <template <int> class Op, int NT, bool kColumns, class... A>
void sweep(std::initializer_list<DType> types, std::int64_t rows, std::int64_t n, cudaStream_t stream,
           const char* name, const A&... a) {
  const DType t0 = *types.begin();
  bool same = true;
  for (DType t : types) same = same && t == t0;
  auto go = [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if constexpr (kColumns) col_sweep<NT>(Op<T>{a...}, rows, n, stream, name);
    else row_sweep<NT>(Op<T>{a...}, rows, n, stream, name);
  };
  if (!same) return go(std::integral_constant<int, -1>{});
  switch (t0) {
    case DType::bf16: return go(std::integral_constant<int, static_cast<int>(DType::bf16)>{});
    case DType::f16: return go(std::integral_constant<int, static_cast<int>(DType::f16)>{});
    case DType::f32: return go(std::integral_constant<int, static_cast<int>(DType::f32)>{});
  }
}

// ---- row_map ----------------------------------------------------------------------------------------

constexpr int kMapThreads = 256;

// W consecutive elements from index i of a buffer: 16-byte vectors (W a multiple of 8, i·size and the
// address 16-byte aligned: the launcher checks), or one by one (W < 8: the scalar path, where a
// functor of width 1 reads a pair). Widening and rounding are the scalar path's, element by element.
template <int W>
__device__ __forceinline__ void ldv_at(const void* data, DType t, std::int64_t i, float (&v)[W]) {
  if constexpr (W < 8) {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = ld(data, t, i + k);
  } else if (t == DType::f32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(data) + i);
#pragma unroll
    for (int q = 0; q < W / 4; ++q) {
      const float4 f = p[q];
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(data) + i);
    const bool bf = t == DType::bf16;
#pragma unroll
    for (int q = 0; q < W / 8; ++q) {
      const uint4 u = p[q];
      const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const unsigned short lo = static_cast<unsigned short>(w[k] & 0xffffu), hi = static_cast<unsigned short>(w[k] >> 16);
        v[8 * q + 2 * k] = bf ? __uint_as_float(static_cast<unsigned>(lo) << 16) : __half2float(__ushort_as_half(lo));
        v[8 * q + 2 * k + 1] = bf ? __uint_as_float(static_cast<unsigned>(hi) << 16) : __half2float(__ushort_as_half(hi));
      }
    }
  }
}
template <int W>
__device__ __forceinline__ void putv_at(void* data, DType t, std::int64_t i, const float (&v)[W]) {
  if constexpr (W < 8) {
#pragma unroll
    for (int k = 0; k < W; ++k) detail::store_elem_rt(data, t, i + k, v[k]);
  } else if (t == DType::f32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(data) + i);
#pragma unroll
    for (int q = 0; q < W / 4; ++q) p[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  } else {
    uint4* p = reinterpret_cast<uint4*>(static_cast<unsigned short*>(data) + i);
    const bool bf = t == DType::bf16;
    auto bits = [&](float f) -> unsigned {
      return bf ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
    };
#pragma unroll
    for (int q = 0; q < W / 8; ++q) {
      unsigned w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = bits(v[8 * q + 2 * k]) | (bits(v[8 * q + 2 * k + 1]) << 16);
      p[q] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}
template <int W>
__device__ __forceinline__ void ldv(NormBuffer b, std::int64_t r, std::int64_t j, float (&v)[W]) {
  ldv_at<W>(b.data, b.dtype, r * b.row_stride + j, v);
}
template <int W>
__device__ __forceinline__ void putv(MutableNormBuffer b, std::int64_t r, std::int64_t j, const float (&v)[W]) {
  putv_at<W>(b.data, b.dtype, r * b.row_stride + j, v);
}

// Groups of W columns (W = 1, or 8 where every operand allows 16-byte vectors); each thread loads
// kUnroll groups of a row (kMapThreads apart) before it computes and stores any, so that loads stay
// in flight together and an output aliasing an input reads the old values.
template <int W, class F>
__global__ void __launch_bounds__(kMapThreads) row_map_kernel(F f, std::int64_t rows, std::int64_t n) {
  constexpr int kUnroll = W == 1 ? 8 : 4;
  constexpr std::int64_t kSpan = static_cast<std::int64_t>(kMapThreads) * kUnroll;
  const std::int64_t groups = n / W;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (std::int64_t q0 = blockIdx.x * kSpan + threadIdx.x; q0 < groups;
         q0 += static_cast<std::int64_t>(gridDim.x) * kSpan) {
      typename F::In in[kUnroll];
      // At clamped (valid) groups and with no branch: the loads in flight together.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) in[u] = f.load(r, std::min<std::int64_t>(q0 + u * kMapThreads, groups - 1) * W);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t q = q0 + u * kMapThreads;
        if (q < groups) f.store(r, q * W, in[u]);
      }
    }
  }
}

template <int W, class F>
void row_map(const F& f, std::int64_t rows, std::int64_t n, cudaStream_t stream, const char* name) {
  if (rows <= 0 || n <= 0) return;
  constexpr std::int64_t kSpan = static_cast<std::int64_t>(kMapThreads) * (W == 1 ? 8 : 4);
  const std::int64_t groups = n / W;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((groups + kSpan - 1) / kSpan, 1024)),
                  static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
  row_map_kernel<W, F><<<grid, kMapThreads, 0, stream>>>(f, rows, n);
  check_launch(name);
}

// Whether every buffer allows 16-byte vectors of 8 elements over n columns.
bool vec_ok(std::initializer_list<NormBuffer> bs, std::int64_t n) {
  if (n % 8 != 0) return false;
  for (const NormBuffer& b : bs) {
    const auto es = static_cast<std::int64_t>(dtype_size(b.dtype));
    if (reinterpret_cast<std::uintptr_t>(b.data) % 16 != 0 || (b.row_stride * es) % 16 != 0) return false;
  }
  return true;
}

// F<8> where `vec`, else F<1>, built from the same operands.
template <template <int> class F, class... A>
void map_rows(bool vec, std::int64_t rows, std::int64_t n, cudaStream_t stream, const char* name, const A&... a) {
  if (vec) row_map<8>(F<8>{a...}, rows, n, stream, name);
  else row_map<1>(F<1>{a...}, rows, n, stream, name);
}

// ---- norms ------------------------------------------------------------------------------------------

struct Pair {
  float a, b;
};

// RMSNorm forward: ss = Σ_j x_j·x_j; r = 1 / sqrt(ss / n + eps).
template <int T>
struct RmsStats {
  NormBuffer x;
  float* rstd;
  float fn, eps;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at_t<T>(x, r, j); }
  __device__ void prep(std::int64_t, std::int64_t, float (&)[1]) const {}
  __device__ void step(State& s, const float (&v)[1]) const { s = det_fma(v[0], v[0], s); }
  __device__ void finish(std::int64_t r, const State& s) const {
    rstd[r] = det_div(1.0f, det_sqrt(det_add(det_div(s, fn), eps)));
  }
};
template <int W>
struct RmsY {
  NormBuffer x, w;
  MutableNormBuffer y;
  const float* rstd;
  struct In {
    float x[W];
  };
  __device__ In load(std::int64_t r, std::int64_t j) const {
    In in;
    ldv(x, r, j, in.x);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t j, const In& in) const {
    float wv[W], o[W];
    ldv(w, 0, j, wv);
    const float rs = rstd[r];
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = det_mul(det_mul(in.x[k], rs), wv[k]);
    putv(y, r, j, o);
  }
};

// RMSNorm backward: g_j = dy_j·w_j; c = Σ_j g_j·x_j; a = (r·r)·(c / n); dx_j = r·(g_j − x_j·a);
// dw_j = Σ_rows dy_j·(x_j·r).
template <int T>
struct RmsBackStats {
  NormBuffer x, w, dy;
  const float* rstd;
  float* a;
  float fn;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = at_t<T>(dy, r, j);
    v[1] = at_t<T>(x, r, j);
  }
  __device__ void prep(std::int64_t, std::int64_t j, float (&v)[2]) const { v[0] = det_mul(v[0], vec_t<T>(w, j)); }
  __device__ void step(State& s, const float (&v)[2]) const { s = det_fma(v[0], v[1], s); }
  __device__ void finish(std::int64_t r, const State& s) const {
    const float rs = rstd[r];
    a[r] = det_mul(det_mul(rs, rs), det_div(s, fn));
  }
};
template <int T>
struct RmsDw {
  NormBuffer x, dy;
  const float* rstd;
  MutableNormBuffer dw;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = at_t<T>(dy, r, j);
    v[1] = at_t<T>(x, r, j);
  }
  __device__ void prep(std::int64_t r, std::int64_t, float (&v)[2]) const { v[1] = det_mul(v[1], rstd[r]); }
  __device__ void step(State& s, const float (&v)[2]) const { s = det_fma(v[0], v[1], s); }
  __device__ void finish(std::int64_t j, const State& s) const { put(dw, 0, j, s); }
};
template <int W>
struct RmsDx {
  NormBuffer x, w, dy;
  const float *rstd, *a;
  MutableNormBuffer dx;
  struct In {
    float x[W], dy[W];
  };
  __device__ In load(std::int64_t r, std::int64_t j) const {
    In in;
    ldv(x, r, j, in.x);
    ldv(dy, r, j, in.dy);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t j, const In& in) const {
    float wv[W], o[W];
    ldv(w, 0, j, wv);
    const float rs = rstd[r], ar = a[r];
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = det_mul(rs, det_fma(-in.x[k], ar, det_mul(in.dy[k], wv[k])));
    putv(dx, r, j, o);
  }
};

// LayerNorm forward: μ = (Σ_j x_j) / n; var = Σ_j (x_j − μ)² / n; r = 1 / sqrt(var + eps);
// y_j = fma((x_j − μ)·r, w_j, b_j).
template <int T>
struct LnMean {
  NormBuffer x;
  float* mean;
  float fn;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at_t<T>(x, r, j); }
  __device__ void prep(std::int64_t, std::int64_t, float (&)[1]) const {}
  __device__ void step(State& s, const float (&v)[1]) const { s = det_add(s, v[0]); }
  __device__ void finish(std::int64_t r, const State& s) const { mean[r] = det_div(s, fn); }
};
template <int T>
struct LnVar {
  NormBuffer x;
  const float* mean;
  float* rstd;
  float fn, eps;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at_t<T>(x, r, j); }
  __device__ void prep(std::int64_t r, std::int64_t, float (&v)[1]) const { v[0] = det_add(v[0], -mean[r]); }
  __device__ void step(State& s, const float (&v)[1]) const { s = det_fma(v[0], v[0], s); }
  __device__ void finish(std::int64_t r, const State& s) const {
    rstd[r] = det_div(1.0f, det_sqrt(det_add(det_div(s, fn), eps)));
  }
};
template <int W>
struct LnY {
  NormBuffer x, w, b;
  MutableNormBuffer y;
  const float *mean, *rstd;
  struct In {
    float x[W];
  };
  __device__ In load(std::int64_t r, std::int64_t j) const {
    In in;
    ldv(x, r, j, in.x);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t j, const In& in) const {
    float wv[W], bv[W], o[W];
    ldv(w, 0, j, wv);
    ldv(b, 0, j, bv);
    const float mu = mean[r], rs = rstd[r];
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = det_fma(det_mul(det_add(in.x[k], -mu), rs), wv[k], bv[k]);
    putv(y, r, j, o);
  }
};

// LayerNorm backward: g_j = dy_j·w_j; a = (Σ_j g_j) / n; c = (Σ_j g_j·x̂_j) / n;
// dx_j = r·((g_j − a) − x̂_j·c); dw_j = Σ_rows dy_j·x̂_j; db_j = Σ_rows dy_j.
template <int T>
struct LnBackStats {
  NormBuffer x, w, dy;
  const float *mean, *rstd;
  float* ac;  // a [rows], then c [rows]
  std::int64_t rows;
  float fn;
  using State = Pair;  // Σ g, Σ g·x̂
  __device__ void init(State& s) const { s = {0.0f, 0.0f}; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = at_t<T>(dy, r, j);
    v[1] = at_t<T>(x, r, j);
  }
  __device__ void prep(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = det_mul(v[0], vec_t<T>(w, j));
    v[1] = det_mul(det_add(v[1], -mean[r]), rstd[r]);  // x̂
  }
  __device__ void step(State& s, const float (&v)[2]) const {
    s.a = det_add(s.a, v[0]);
    s.b = det_fma(v[0], v[1], s.b);
  }
  __device__ void finish(std::int64_t r, const State& s) const {
    ac[r] = det_div(s.a, fn);
    ac[rows + r] = det_div(s.b, fn);
  }
};
template <int T>
struct LnDwDb {
  NormBuffer x, dy;
  const float *mean, *rstd;
  MutableNormBuffer dw, db;
  using State = Pair;  // Σ dy·x̂, Σ dy
  __device__ void init(State& s) const { s = {0.0f, 0.0f}; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = at_t<T>(dy, r, j);
    v[1] = at_t<T>(x, r, j);
  }
  __device__ void prep(std::int64_t r, std::int64_t, float (&v)[2]) const {
    v[1] = det_mul(det_add(v[1], -mean[r]), rstd[r]);  // x̂
  }
  __device__ void step(State& s, const float (&v)[2]) const {
    s.a = det_fma(v[0], v[1], s.a);
    s.b = det_add(s.b, v[0]);
  }
  __device__ void finish(std::int64_t j, const State& s) const {
    put(dw, 0, j, s.a);
    put(db, 0, j, s.b);
  }
};
template <int W>
struct LnDx {
  NormBuffer x, w, dy;
  const float *mean, *rstd, *ac;
  std::int64_t rows;
  MutableNormBuffer dx;
  struct In {
    float x[W], dy[W];
  };
  __device__ In load(std::int64_t r, std::int64_t j) const {
    In in;
    ldv(x, r, j, in.x);
    ldv(dy, r, j, in.dy);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t j, const In& in) const {
    float wv[W], o[W];
    ldv(w, 0, j, wv);
    const float rs = rstd[r], mu = mean[r], a = ac[r], c = ac[rows + r];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float xh = det_mul(det_add(in.x[k], -mu), rs);
      const float g = det_mul(in.dy[k], wv[k]);
      o[k] = det_mul(rs, det_fma(-xh, c, det_add(g, -a)));
    }
    putv(dx, r, j, o);
  }
};

// ---- SwiGLU, rotary ------------------------------------------------------------------------------

// Column i of y: (gate, up) = x's columns (2i, 2i + 1).
template <int W>
struct SwigluF {
  NormBuffer x;
  MutableNormBuffer y;
  struct In {
    float gu[2 * W];
  };
  __device__ In load(std::int64_t r, std::int64_t i) const {
    In in;
    ldv(x, r, 2 * i, in.gu);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t i, const In& in) const {
    float o[W];
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = kernels::swiglu(in.gu[2 * k], in.gu[2 * k + 1]);
    putv(y, r, i, o);
  }
};
template <int W>
struct SwigluBackF {
  NormBuffer x, dy;
  MutableNormBuffer dx;
  struct In {
    float gu[2 * W], d[W];
  };
  __device__ In load(std::int64_t r, std::int64_t i) const {
    In in;
    ldv(x, r, 2 * i, in.gu);
    ldv(dy, r, i, in.d);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t i, const In& in) const {
    float o[2 * W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const kernels::SwigluGrad g = kernels::swiglu_backward(in.gu[2 * k], in.gu[2 * k + 1], in.d[k]);
      o[2 * k] = g.dg;
      o[2 * k + 1] = g.du;
    }
    putv(dx, r, 2 * i, o);
  }
};

// Row: a token (batch x seq); column k: head k / half, element e = k % half and its partner e + half.
// Row: a token (batch x seq); column k: head k / half, element e = k % half and its partner e + half
// (W consecutive e of one head: half % W == 0).
template <int W>
struct RotaryF {
  MutableNormBuffer buf;  // row_stride: the buffer's
  std::int64_t group_stride, per_group, d, half, seq;
  const float *cos, *sin;
  bool inverse;
  struct In {
    std::int64_t i;  // x1's index
    float x1[W], x2[W];
  };
  __device__ In load(std::int64_t r, std::int64_t k) const {
    In in;
    const std::int64_t h = k / half, e = k % half;
    in.i = r * buf.row_stride + kernels::attention_head_offset(group_stride, h, per_group, d) + e;
    ldv_at(buf.data, buf.dtype, in.i, in.x1);
    ldv_at(buf.data, buf.dtype, in.i + half, in.x2);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t k, const In& in) const {
    const std::int64_t t0 = (r % seq) * half + k % half;
    float y1[W], y2[W];
#pragma unroll
    for (int q = 0; q < W; ++q) {
      const float c = cos[t0 + q], s = sin[t0 + q], x1 = in.x1[q], x2 = in.x2[q];
      if (!inverse) {
        y1[q] = det_fma(x1, c, det_mul(-x2, s));
        y2[q] = det_fma(x2, c, det_mul(x1, s));
      } else {
        y1[q] = det_fma(x1, c, det_mul(x2, s));
        y2[q] = det_fma(x2, c, det_mul(-x1, s));
      }
    }
    putv_at(buf.data, buf.dtype, in.i, y1);
    putv_at(buf.data, buf.dtype, in.i + half, y2);
  }
};

// ---- the vocabulary --------------------------------------------------------------------------------

__device__ __forceinline__ bool in_slice(std::int64_t id, std::int64_t start, std::int64_t rows) {
  return id >= start && id < start + rows;
}

template <int W>
struct EmbeddingF {
  NormBuffer w;
  std::int64_t rows, start;
  const std::int64_t* ids;
  MutableNormBuffer out;
  struct In {
    float v[W];
  };
  __device__ In load(std::int64_t t, std::int64_t e) const {
    In in;
    const std::int64_t id = ids[t];
    if (in_slice(id, start, rows)) {
      ldv(w, id - start, e, in.v);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) in.v[k] = 0.0f;
    }
    return in;
  }
  __device__ void store(std::int64_t t, std::int64_t e, const In& in) const { putv(out, t, e, in.v); }
};
struct ZeroF {
  MutableNormBuffer out;
  using In = float;
  __device__ In load(std::int64_t, std::int64_t) const { return 0.0f; }
  __device__ void store(std::int64_t r, std::int64_t j, In v) const { put(out, r, j, v); }
};
// Row g of the grid: group g; its sum walks the group's tokens in order from +0.
struct EmbeddingBackF {
  NormBuffer dy;
  const std::int64_t *order, *row, *begin;
  MutableNormBuffer dw;
  using In = float;
  __device__ In load(std::int64_t g, std::int64_t e) const {
    float acc = 0.0f;
    for (std::int64_t k = begin[g]; k < begin[g + 1]; ++k) acc = det_add(acc, at(dy, order[k], e));
    return acc;
  }
  __device__ void store(std::int64_t g, std::int64_t e, In v) const { put(dw, row[g], e, v); }
};

template <int T>
struct CeMax {
  NormBuffer x;
  float* max;
  using State = float;
  __device__ void init(State& s) const { s = -INFINITY; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at_t<T>(x, r, j); }
  __device__ void prep(std::int64_t, std::int64_t, float (&)[1]) const {}
  __device__ void step(State& m, const float (&v)[1]) const {
    if (v[0] > m || v[0] != v[0]) m = v[0];  // NaN wins, as on the host
  }
  __device__ void finish(std::int64_t r, const State& m) const { max[r] = m; }
};
template <int T>
struct CePartials {
  NormBuffer x;
  const float* max;
  const std::int64_t* targets;
  std::int64_t start, vocab;
  float* partials;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void fetch(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at_t<T>(x, r, j); }
  __device__ void prep(std::int64_t r, std::int64_t, float (&v)[1]) const { v[0] = det_exp(det_add(v[0], -max[r])); }
  __device__ void step(State& s, const float (&v)[1]) const { s = det_add(s, v[0]); }
  __device__ void finish(std::int64_t r, const State& s) const {
    partials[2 * r] = s;
    const std::int64_t t = targets[r];
    partials[2 * r + 1] = in_slice(t, start, vocab) ? at(x, r, t - start) : 0.0f;
  }
};
template <int W>
struct CeBackF {
  NormBuffer x;
  const float *max, *partials, *dloss;
  const std::int64_t* targets;
  std::int64_t start;
  MutableNormBuffer dx;
  struct In {
    float x[W];
  };
  __device__ In load(std::int64_t r, std::int64_t j) const {
    In in;
    ldv(x, r, j, in.x);
    return in;
  }
  __device__ void store(std::int64_t r, std::int64_t j, const In& in) const {
    const float m = max[r], s = partials[2 * r], dl = dloss[r];
    const std::int64_t target = targets[r] - start - j;  // the target's k, if in this group
    float o[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float p = det_div(det_exp(det_add(in.x[k], -m)), s);
      o[k] = det_mul(det_add(p, target == k ? -1.0f : 0.0f), dl);
    }
    putv(dx, r, j, o);
  }
};

__global__ void ce_loss_kernel(const float* partials, const float* max, float* loss, std::int64_t tokens) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    loss[t] = det_add(kernels::det_log(partials[2 * t]), -det_add(partials[2 * t + 1], -max[t]));
  }
}

}  // namespace

void rms_norm_forward(NormBuffer x, NormBuffer w, MutableNormBuffer y, float* rstd, std::int64_t rows, std::int64_t n,
                      float eps, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  sweep<RmsStats, 1, false>({x.dtype}, rows, n, stream, "rms_norm stats", x, rstd, fn, eps);
  map_rows<RmsY>(vec_ok({x, w, y}, n), rows, n, stream, "rms_norm y", x, w, y, rstd);
}

void rms_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* rstd, MutableNormBuffer dx,
                       MutableNormBuffer dw, std::int64_t rows, std::int64_t n, float* scratch, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  sweep<RmsBackStats, 2, false>({x.dtype, w.dtype, dy.dtype}, rows, n, stream, "rms_norm_backward stats", x, w, dy,
                                rstd, scratch, fn);
  // The weight gradient before dx: dx may be dy or x.
  sweep<RmsDw, 2, true>({x.dtype, dy.dtype}, rows, n, stream, "rms_norm_backward dweight", x, dy, rstd, dw);
  map_rows<RmsDx>(vec_ok({x, w, dy, dx}, n), rows, n, stream, "rms_norm_backward dx", x, w, dy, rstd,
                  static_cast<const float*>(scratch), dx);
}

void layer_norm_forward(NormBuffer x, NormBuffer w, NormBuffer b, MutableNormBuffer y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t n, float eps, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  sweep<LnMean, 1, false>({x.dtype}, rows, n, stream, "layer_norm mean", x, mean, fn);
  sweep<LnVar, 1, false>({x.dtype}, rows, n, stream, "layer_norm variance", x, static_cast<const float*>(mean), rstd,
                         fn, eps);
  map_rows<LnY>(vec_ok({x, w, b, y}, n), rows, n, stream, "layer_norm y", x, w, b, y, static_cast<const float*>(mean),
                static_cast<const float*>(rstd));
}

void layer_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* mean, const float* rstd,
                         MutableNormBuffer dx, MutableNormBuffer dw, MutableNormBuffer db, std::int64_t rows,
                         std::int64_t n, float* scratch, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  sweep<LnBackStats, 2, false>({x.dtype, w.dtype, dy.dtype}, rows, n, stream, "layer_norm_backward stats", x, w, dy,
                               mean, rstd, scratch, rows, fn);
  sweep<LnDwDb, 2, true>({x.dtype, dy.dtype}, rows, n, stream, "layer_norm_backward dweight", x, dy, mean, rstd, dw, db);
  map_rows<LnDx>(vec_ok({x, w, dy, dx}, n), rows, n, stream, "layer_norm_backward dx", x, w, dy, mean, rstd,
                 static_cast<const float*>(scratch), rows, dx);
}

void swiglu(NormBuffer x, MutableNormBuffer y, std::int64_t rows, std::int64_t f, cudaStream_t stream) {
  map_rows<SwigluF>(vec_ok({x, y}, f), rows, f, stream, "swiglu", x, y);
}

void swiglu_backward(NormBuffer x, NormBuffer dy, MutableNormBuffer dx, std::int64_t rows, std::int64_t f,
                     cudaStream_t stream) {
  map_rows<SwigluBackF>(vec_ok({x, dy, dx}, f), rows, f, stream, "swiglu_backward", x, dy, dx);
}

void rotary_apply(const kernels::AttentionShape& s, kernels::MutableAttentionBuffer b, std::int64_t heads,
                  std::int64_t per_group, const float* cos, const float* sin, bool inverse, cudaStream_t stream) {
  const std::int64_t half = s.head_dim / 2;
  const MutableNormBuffer buf{b.data, b.dtype, b.row_stride};
  const bool vec = vec_ok({buf}, heads * half) && half % 8 == 0 && b.group_stride % 8 == 0 && s.head_dim % 8 == 0;
  map_rows<RotaryF>(vec, s.batch * s.seq_q, heads * half, stream, "rotary", buf, b.group_stride, per_group, s.head_dim,
                    half, s.seq_q, cos, sin, inverse);
}

void embedding_forward(NormBuffer weight, std::int64_t rows, std::int64_t vocab_start, const std::int64_t* ids,
                       std::int64_t tokens, std::int64_t hidden, MutableNormBuffer out, cudaStream_t stream) {
  map_rows<EmbeddingF>(vec_ok({weight, out}, hidden), tokens, hidden, stream, "embedding", weight, rows, vocab_start,
                       ids, out);
}

EmbeddingGroups embedding_groups(const std::int64_t* ids, std::int64_t tokens, std::int64_t rows,
                                 std::int64_t vocab_start) {
  EmbeddingGroups g;
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (ids[t] >= vocab_start && ids[t] < vocab_start + rows) g.order.push_back(t);
  }
  std::stable_sort(g.order.begin(), g.order.end(), [&](std::int64_t a, std::int64_t b) { return ids[a] < ids[b]; });
  for (std::size_t k = 0; k < g.order.size(); ++k) {
    const std::int64_t v = ids[g.order[k]] - vocab_start;
    if (g.row.empty() || g.row.back() != v) {
      g.row.push_back(v);
      g.begin.push_back(static_cast<std::int64_t>(k));
    }
  }
  g.begin.push_back(static_cast<std::int64_t>(g.order.size()));
  return g;
}

void embedding_backward(NormBuffer dy, std::int64_t hidden, std::int64_t rows, const std::int64_t* order,
                        const std::int64_t* row, const std::int64_t* begin, std::int64_t groups,
                        MutableNormBuffer dweight, cudaStream_t stream) {
  row_map<1>(ZeroF{dweight}, rows, hidden, stream, "embedding_backward zeros");
  row_map<1>(EmbeddingBackF{dy, order, row, begin, dweight}, groups, hidden, stream, "embedding_backward");
}

void cross_entropy_max(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, float* max, cudaStream_t stream) {
  sweep<CeMax, 1, false>({logits.dtype}, tokens, vocab, stream, "cross_entropy_max", logits, max);
}

void cross_entropy_partials(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const std::int64_t* targets, std::int64_t vocab_start, float* partials,
                            cudaStream_t stream) {
  sweep<CePartials, 1, false>({logits.dtype}, tokens, vocab, stream, "cross_entropy_partials", logits, max, targets,
                              vocab_start, vocab, partials);
}

void cross_entropy_loss(const float* partials, const float* max, float* loss, std::int64_t tokens, cudaStream_t stream) {
  if (tokens <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((tokens + 255) / 256, 1024));
  ce_loss_kernel<<<blocks, 256, 0, stream>>>(partials, max, loss, tokens);
  CUBESIM_CUDA_CHECK_LAUNCH("cross_entropy_loss");
}

void cross_entropy_backward(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const float* partials, const std::int64_t* targets, std::int64_t vocab_start,
                            const float* dloss, MutableNormBuffer dlogits, cudaStream_t stream) {
  map_rows<CeBackF>(vec_ok({logits, dlogits}, vocab), tokens, vocab, stream, "cross_entropy_backward", logits, max,
                    partials, dloss, targets, vocab_start, dlogits);
}

}  // namespace cubesim::cuda
