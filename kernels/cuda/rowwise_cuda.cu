// The row-wise ops' kernels (kernels/cuda/rowwise_cuda.h). Three shapes of kernel:
//   row_sweep   a chain per row (Σ_j ascending): warp 0's lane k walks row r0 + k; warps 1..7 stage
//               the next chunks of 32 rows x kCols columns, transformed to the chain's f32 terms;
//   col_sweep   a chain per column (Σ over rows ascending: the weight gradients), the same with 32
//               columns and chunks of kColRows rows;
//   row_map     one thread per element of a [rows, n] grid, with per-row and per-column operands.
// Each op is a small functor: load (a chunk element's terms), step (one link of the chain), finish
// (the row's or column's results), or load/store for row_map. The arithmetic in them is the host's,
// line for line, through kernels/elementwise.h's det_* (the non-contracting intrinsics on the device).
#include "kernels/cuda/rowwise_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

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
__device__ __forceinline__ float vec(NormBuffer b, std::int64_t j) { return ld(b.data, b.dtype, j); }
__device__ __forceinline__ void put(MutableNormBuffer b, std::int64_t r, std::int64_t j, float v) {
  detail::store_elem_rt(b.data, b.dtype, r * b.row_stride + j, v);
}

// ---- row_sweep --------------------------------------------------------------------------------------

// A launch's error, naming the op (a runtime name: CUBESIM_CUDA_CHECK_LAUNCH takes a literal).
void check_launch(const char* name) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda_error(e, (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
}

constexpr int kChains = 32, kSweepThreads = 256, kLoaders = kSweepThreads - 32, kBufs = 3;

// NT terms per element; a chunk is kChains rows x kCols columns (NT = 1: 256, 2: 128), f32 in shared
// memory with a padded pitch so that the 32 lanes (32 rows, one column) hit 32 banks.
template <int NT>
constexpr int row_cols() {
  return NT == 1 ? 256 : 128;
}
template <int NT>
constexpr std::size_t row_sweep_smem() {
  return sizeof(float) * kBufs * NT * kChains * (row_cols<NT>() + 1);
}

template <int NT, class Op>
__global__ void __launch_bounds__(kSweepThreads) row_sweep_kernel(Op op, std::int64_t rows, std::int64_t n) {
  constexpr int K = row_cols<NT>(), P = K + 1, kPer = (kChains * K + kLoaders - 1) / kLoaders;
  extern __shared__ float smem[];
  auto tile = [&](int buf, int k, int r, int c) -> float& { return smem[((buf * NT + k) * kChains + r) * P + c]; };
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * kChains;
  const int tid = threadIdx.x;
  // A loader's elements: e = t + i * kLoaders, row e / K, column e % K (a warp reads a row's columns).
  auto load_chunk = [&](std::int64_t j0, int buf) {
    const int t = tid - 32;
    float v[kPer][NT];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = t + i * kLoaders;
      const std::int64_t r = r0 + e / K, j = j0 + e % K;
      if (e < kChains * K && r < rows && j < n) {
        op.load(r, j, v[i]);
      } else {
#pragma unroll
        for (int k = 0; k < NT; ++k) v[i][k] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = t + i * kLoaders;
      if (e < kChains * K) {
#pragma unroll
        for (int k = 0; k < NT; ++k) tile(buf, k, e / K, e % K) = v[i][k];
      }
    }
  };
  const std::int64_t chunks = (n + K - 1) / K;
  if (tid >= 32) {
    for (int i = 0; i < kBufs - 1 && i < chunks; ++i) load_chunk(i * K, i);
  }
  typename Op::State st{};
  op.init(st);
  __syncthreads();
  for (std::int64_t i = 0; i < chunks; ++i) {
    const int buf = static_cast<int>(i % kBufs);
    if (tid >= 32) {
      const std::int64_t ahead = i + kBufs - 1;  // into the buffer chunk i - 1 left
      if (ahead < chunks) load_chunk(ahead * K, static_cast<int>(ahead % kBufs));
    } else {
      const int m = static_cast<int>(std::min<std::int64_t>(K, n - i * K));
      auto step = [&](int c) {
        float v[NT];
#pragma unroll
        for (int k = 0; k < NT; ++k) v[k] = tile(buf, k, tid, c);
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

constexpr int kColRows = 128;
template <int NT>
constexpr std::size_t col_sweep_smem() {
  return sizeof(float) * kBufs * NT * kColRows * kChains;
}

template <int NT, class Op>
__global__ void __launch_bounds__(kSweepThreads) col_sweep_kernel(Op op, std::int64_t rows, std::int64_t n) {
  constexpr int R = kColRows, kPer = (R * kChains + kLoaders - 1) / kLoaders;
  extern __shared__ float smem[];
  auto tile = [&](int buf, int k, int r, int c) -> float& { return smem[((buf * NT + k) * R + r) * kChains + c]; };
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kChains;
  const int tid = threadIdx.x;
  auto load_chunk = [&](std::int64_t q0, int buf) {
    const int t = tid - 32;
    float v[kPer][NT];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = t + i * kLoaders;
      const std::int64_t r = q0 + e / kChains, j = c0 + e % kChains;
      if (e < R * kChains && r < rows && j < n) {
        op.load(r, j, v[i]);
      } else {
#pragma unroll
        for (int k = 0; k < NT; ++k) v[i][k] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = t + i * kLoaders;
      if (e < R * kChains) {
#pragma unroll
        for (int k = 0; k < NT; ++k) tile(buf, k, e / kChains, e % kChains) = v[i][k];
      }
    }
  };
  const std::int64_t chunks = (rows + R - 1) / R;
  if (tid >= 32) {
    for (int i = 0; i < kBufs - 1 && i < chunks; ++i) load_chunk(i * R, i);
  }
  typename Op::State st{};
  op.init(st);
  __syncthreads();
  for (std::int64_t i = 0; i < chunks; ++i) {
    const int buf = static_cast<int>(i % kBufs);
    if (tid >= 32) {
      const std::int64_t ahead = i + kBufs - 1;
      if (ahead < chunks) load_chunk(ahead * R, static_cast<int>(ahead % kBufs));
    } else {
      const int m = static_cast<int>(std::min<std::int64_t>(R, rows - i * R));
      auto step = [&](int r) {
        float v[NT];
#pragma unroll
        for (int k = 0; k < NT; ++k) v[k] = tile(buf, k, r, tid);
        op.step(st, v);
      };
      if (m == R) {
#pragma unroll 16
        for (int r = 0; r < R; ++r) step(r);
      } else {
        for (int r = 0; r < m; ++r) step(r);
      }
    }
    __syncthreads();
  }
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

// ---- row_map ----------------------------------------------------------------------------------------

constexpr int kMapThreads = 256, kMapUnroll = 4;

// Each thread loads kMapUnroll elements of a row (kMapThreads apart) before it computes and stores any,
// so that loads stay in flight together and an output aliasing an input reads the old values.
template <class F>
__global__ void __launch_bounds__(kMapThreads) row_map_kernel(F f, std::int64_t rows, std::int64_t n) {
  constexpr std::int64_t kSpan = static_cast<std::int64_t>(kMapThreads) * kMapUnroll;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (std::int64_t j0 = blockIdx.x * kSpan + threadIdx.x; j0 < n; j0 += static_cast<std::int64_t>(gridDim.x) * kSpan) {
      typename F::In in[kMapUnroll];
#pragma unroll
      for (int u = 0; u < kMapUnroll; ++u) {
        const std::int64_t j = j0 + u * kMapThreads;
        if (j < n) in[u] = f.load(r, j);
      }
#pragma unroll
      for (int u = 0; u < kMapUnroll; ++u) {
        const std::int64_t j = j0 + u * kMapThreads;
        if (j < n) f.store(r, j, in[u]);
      }
    }
  }
}

template <class F>
void row_map(const F& f, std::int64_t rows, std::int64_t n, cudaStream_t stream, const char* name) {
  if (rows <= 0 || n <= 0) return;
  constexpr std::int64_t kSpan = static_cast<std::int64_t>(kMapThreads) * kMapUnroll;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((n + kSpan - 1) / kSpan, 1024)),
                  static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
  row_map_kernel<F><<<grid, kMapThreads, 0, stream>>>(f, rows, n);
  check_launch(name);
}

// ---- norms ------------------------------------------------------------------------------------------

struct Scalar {
  float v;
};
struct Pair {
  float a, b;
};

// RMSNorm forward: ss = Σ_j x_j·x_j; r = 1 / sqrt(ss / n + eps).
struct RmsStats {
  NormBuffer x;
  float* rstd;
  float fn, eps;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at(x, r, j); }
  __device__ void step(State& s, const float (&v)[1]) const { s = det_fma(v[0], v[0], s); }
  __device__ void finish(std::int64_t r, const State& s) const {
    rstd[r] = det_div(1.0f, det_sqrt(det_add(det_div(s, fn), eps)));
  }
};
struct RmsY {
  NormBuffer x, w;
  MutableNormBuffer y;
  const float* rstd;
  using In = float;
  __device__ In load(std::int64_t r, std::int64_t j) const { return at(x, r, j); }
  __device__ void store(std::int64_t r, std::int64_t j, In xv) const {
    put(y, r, j, det_mul(det_mul(xv, rstd[r]), vec(w, j)));
  }
};

// RMSNorm backward: g_j = dy_j·w_j; c = Σ_j g_j·x_j; a = (r·r)·(c / n); dx_j = r·(g_j − x_j·a);
// dw_j = Σ_rows dy_j·(x_j·r).
struct RmsBackStats {
  NormBuffer x, w, dy;
  const float* rstd;
  float* a;
  float fn;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = det_mul(at(dy, r, j), vec(w, j));
    v[1] = at(x, r, j);
  }
  __device__ void step(State& s, const float (&v)[2]) const { s = det_fma(v[0], v[1], s); }
  __device__ void finish(std::int64_t r, const State& s) const {
    const float rs = rstd[r];
    a[r] = det_mul(det_mul(rs, rs), det_div(s, fn));
  }
};
struct RmsDw {
  NormBuffer x, dy;
  const float* rstd;
  MutableNormBuffer dw;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = at(dy, r, j);
    v[1] = det_mul(at(x, r, j), rstd[r]);
  }
  __device__ void step(State& s, const float (&v)[2]) const { s = det_fma(v[0], v[1], s); }
  __device__ void finish(std::int64_t j, const State& s) const { put(dw, 0, j, s); }
};
struct RmsDx {
  NormBuffer x, w, dy;
  const float *rstd, *a;
  MutableNormBuffer dx;
  using In = Pair;
  __device__ In load(std::int64_t r, std::int64_t j) const { return {at(x, r, j), at(dy, r, j)}; }
  __device__ void store(std::int64_t r, std::int64_t j, In in) const {
    const float g = det_mul(in.b, vec(w, j));
    put(dx, r, j, det_mul(rstd[r], det_fma(-in.a, a[r], g)));
  }
};

// LayerNorm forward: μ = (Σ_j x_j) / n; var = Σ_j (x_j − μ)² / n; r = 1 / sqrt(var + eps);
// y_j = fma((x_j − μ)·r, w_j, b_j).
struct LnMean {
  NormBuffer x;
  float* mean;
  float fn;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at(x, r, j); }
  __device__ void step(State& s, const float (&v)[1]) const { s = det_add(s, v[0]); }
  __device__ void finish(std::int64_t r, const State& s) const { mean[r] = det_div(s, fn); }
};
struct LnVar {
  NormBuffer x;
  const float* mean;
  float* rstd;
  float fn, eps;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = det_add(at(x, r, j), -mean[r]); }
  __device__ void step(State& s, const float (&v)[1]) const { s = det_fma(v[0], v[0], s); }
  __device__ void finish(std::int64_t r, const State& s) const {
    rstd[r] = det_div(1.0f, det_sqrt(det_add(det_div(s, fn), eps)));
  }
};
struct LnY {
  NormBuffer x, w, b;
  MutableNormBuffer y;
  const float *mean, *rstd;
  using In = float;
  __device__ In load(std::int64_t r, std::int64_t j) const { return at(x, r, j); }
  __device__ void store(std::int64_t r, std::int64_t j, In xv) const {
    const float xh = det_mul(det_add(xv, -mean[r]), rstd[r]);
    put(y, r, j, det_fma(xh, vec(w, j), vec(b, j)));
  }
};

// LayerNorm backward: g_j = dy_j·w_j; a = (Σ_j g_j) / n; c = (Σ_j g_j·x̂_j) / n;
// dx_j = r·((g_j − a) − x̂_j·c); dw_j = Σ_rows dy_j·x̂_j; db_j = Σ_rows dy_j.
__device__ __forceinline__ float x_hat(NormBuffer x, const float* mean, const float* rstd, std::int64_t r,
                                       std::int64_t j) {
  return det_mul(det_add(at(x, r, j), -mean[r]), rstd[r]);
}
struct LnBackStats {
  NormBuffer x, w, dy;
  const float *mean, *rstd;
  float* ac;  // a [rows], then c [rows]
  std::int64_t rows;
  float fn;
  using State = Pair;  // Σ g, Σ g·x̂
  __device__ void init(State& s) const { s = {0.0f, 0.0f}; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = det_mul(at(dy, r, j), vec(w, j));
    v[1] = x_hat(x, mean, rstd, r, j);
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
struct LnDwDb {
  NormBuffer x, dy;
  const float *mean, *rstd;
  MutableNormBuffer dw, db;
  using State = Pair;  // Σ dy·x̂, Σ dy
  __device__ void init(State& s) const { s = {0.0f, 0.0f}; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[2]) const {
    v[0] = at(dy, r, j);
    v[1] = x_hat(x, mean, rstd, r, j);
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
struct LnDx {
  NormBuffer x, w, dy;
  const float *mean, *rstd, *ac;
  std::int64_t rows;
  MutableNormBuffer dx;
  using In = Pair;
  __device__ In load(std::int64_t r, std::int64_t j) const { return {at(x, r, j), at(dy, r, j)}; }
  __device__ void store(std::int64_t r, std::int64_t j, In in) const {
    const float rs = rstd[r];
    const float xh = det_mul(det_add(in.a, -mean[r]), rs);
    const float g = det_mul(in.b, vec(w, j));
    put(dx, r, j, det_mul(rs, det_fma(-xh, ac[rows + r], det_add(g, -ac[r]))));
  }
};

// ---- SwiGLU, rotary ------------------------------------------------------------------------------

struct SwigluF {
  NormBuffer x;
  MutableNormBuffer y;
  using In = Pair;
  __device__ In load(std::int64_t r, std::int64_t i) const { return {at(x, r, 2 * i), at(x, r, 2 * i + 1)}; }
  __device__ void store(std::int64_t r, std::int64_t i, In in) const { put(y, r, i, kernels::swiglu(in.a, in.b)); }
};
struct SwigluBackF {
  NormBuffer x, dy;
  MutableNormBuffer dx;
  struct In {
    float g, u, d;
  };
  __device__ In load(std::int64_t r, std::int64_t i) const {
    return {at(x, r, 2 * i), at(x, r, 2 * i + 1), at(dy, r, i)};
  }
  __device__ void store(std::int64_t r, std::int64_t i, In in) const {
    const kernels::SwigluGrad d = kernels::swiglu_backward(in.g, in.u, in.d);
    put(dx, r, 2 * i, d.dg);
    put(dx, r, 2 * i + 1, d.du);
  }
};

// Row: a token (batch x seq); column k: head k / half, element e = k % half and its partner e + half.
struct RotaryF {
  MutableNormBuffer buf;  // row_stride: the buffer's
  std::int64_t group_stride, per_group, d, half, seq;
  const float *cos, *sin;
  bool inverse;
  struct In {
    std::int64_t i;  // x1's index
    float x1, x2;
  };
  __device__ In load(std::int64_t r, std::int64_t k) const {
    const std::int64_t h = k / half, e = k % half;
    const std::int64_t i = r * buf.row_stride + kernels::attention_head_offset(group_stride, h, per_group, d) + e;
    return {i, load_x(i), load_x(i + half)};
  }
  __device__ float load_x(std::int64_t i) const { return ld(buf.data, buf.dtype, i); }
  __device__ void store(std::int64_t r, std::int64_t k, In in) const {
    const std::int64_t e = k % half, t = (r % seq) * half + e;
    const float c = cos[t], s = sin[t];
    float y1, y2;
    if (!inverse) {
      y1 = det_fma(in.x1, c, det_mul(-in.x2, s));
      y2 = det_fma(in.x2, c, det_mul(in.x1, s));
    } else {
      y1 = det_fma(in.x1, c, det_mul(in.x2, s));
      y2 = det_fma(in.x2, c, det_mul(-in.x1, s));
    }
    detail::store_elem_rt(buf.data, buf.dtype, in.i, y1);
    detail::store_elem_rt(buf.data, buf.dtype, in.i + half, y2);
  }
};

// ---- the vocabulary --------------------------------------------------------------------------------

__device__ __forceinline__ bool in_slice(std::int64_t id, std::int64_t start, std::int64_t rows) {
  return id >= start && id < start + rows;
}

struct EmbeddingF {
  NormBuffer w;
  std::int64_t rows, start;
  const std::int64_t* ids;
  MutableNormBuffer out;
  using In = float;
  __device__ In load(std::int64_t t, std::int64_t e) const {
    const std::int64_t id = ids[t];
    return in_slice(id, start, rows) ? at(w, id - start, e) : 0.0f;
  }
  __device__ void store(std::int64_t t, std::int64_t e, In v) const { put(out, t, e, v); }
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

struct CeMax {
  NormBuffer x;
  float* max;
  using State = float;
  __device__ void init(State& s) const { s = -INFINITY; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = at(x, r, j); }
  __device__ void step(State& m, const float (&v)[1]) const {
    if (v[0] > m || v[0] != v[0]) m = v[0];  // NaN wins, as on the host
  }
  __device__ void finish(std::int64_t r, const State& m) const { max[r] = m; }
};
struct CePartials {
  NormBuffer x;
  const float* max;
  const std::int64_t* targets;
  std::int64_t start, vocab;
  float* partials;
  using State = float;
  __device__ void init(State& s) const { s = 0.0f; }
  __device__ void load(std::int64_t r, std::int64_t j, float (&v)[1]) const { v[0] = det_exp(det_add(at(x, r, j), -max[r])); }
  __device__ void step(State& s, const float (&v)[1]) const { s = det_add(s, v[0]); }
  __device__ void finish(std::int64_t r, const State& s) const {
    partials[2 * r] = s;
    const std::int64_t t = targets[r];
    partials[2 * r + 1] = in_slice(t, start, vocab) ? at(x, r, t - start) : 0.0f;
  }
};
struct CeBackF {
  NormBuffer x;
  const float *max, *partials, *dloss;
  const std::int64_t* targets;
  std::int64_t start;
  MutableNormBuffer dx;
  using In = float;
  __device__ In load(std::int64_t r, std::int64_t j) const { return at(x, r, j); }
  __device__ void store(std::int64_t r, std::int64_t j, In v) const {
    const float p = det_div(det_exp(det_add(v, -max[r])), partials[2 * r]);
    const float g = det_add(p, targets[r] == start + j ? -1.0f : 0.0f);
    put(dx, r, j, det_mul(g, dloss[r]));
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
  row_sweep<1>(RmsStats{x, rstd, fn, eps}, rows, n, stream, "rms_norm stats");
  row_map(RmsY{x, w, y, rstd}, rows, n, stream, "rms_norm y");
}

void rms_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* rstd, MutableNormBuffer dx,
                       MutableNormBuffer dw, std::int64_t rows, std::int64_t n, float* scratch, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  row_sweep<2>(RmsBackStats{x, w, dy, rstd, scratch, fn}, rows, n, stream, "rms_norm_backward stats");
  // The weight gradient before dx: dx may be dy or x.
  col_sweep<2>(RmsDw{x, dy, rstd, dw}, rows, n, stream, "rms_norm_backward dweight");
  row_map(RmsDx{x, w, dy, rstd, scratch, dx}, rows, n, stream, "rms_norm_backward dx");
}

void layer_norm_forward(NormBuffer x, NormBuffer w, NormBuffer b, MutableNormBuffer y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t n, float eps, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  row_sweep<1>(LnMean{x, mean, fn}, rows, n, stream, "layer_norm mean");
  row_sweep<1>(LnVar{x, mean, rstd, fn, eps}, rows, n, stream, "layer_norm variance");
  row_map(LnY{x, w, b, y, mean, rstd}, rows, n, stream, "layer_norm y");
}

void layer_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* mean, const float* rstd,
                         MutableNormBuffer dx, MutableNormBuffer dw, MutableNormBuffer db, std::int64_t rows,
                         std::int64_t n, float* scratch, cudaStream_t stream) {
  const float fn = static_cast<float>(n);
  row_sweep<2>(LnBackStats{x, w, dy, mean, rstd, scratch, rows, fn}, rows, n, stream, "layer_norm_backward stats");
  col_sweep<2>(LnDwDb{x, dy, mean, rstd, dw, db}, rows, n, stream, "layer_norm_backward dweight");
  row_map(LnDx{x, w, dy, mean, rstd, scratch, rows, dx}, rows, n, stream, "layer_norm_backward dx");
}

void swiglu(NormBuffer x, MutableNormBuffer y, std::int64_t rows, std::int64_t f, cudaStream_t stream) {
  row_map(SwigluF{x, y}, rows, f, stream, "swiglu");
}

void swiglu_backward(NormBuffer x, NormBuffer dy, MutableNormBuffer dx, std::int64_t rows, std::int64_t f,
                     cudaStream_t stream) {
  row_map(SwigluBackF{x, dy, dx}, rows, f, stream, "swiglu_backward");
}

void rotary_apply(const kernels::AttentionShape& s, kernels::MutableAttentionBuffer b, std::int64_t heads,
                  std::int64_t per_group, const float* cos, const float* sin, bool inverse, cudaStream_t stream) {
  const std::int64_t half = s.head_dim / 2;
  const RotaryF f{{b.data, b.dtype, b.row_stride}, b.group_stride, per_group, s.head_dim, half, s.seq_q, cos, sin,
                  inverse};
  row_map(f, s.batch * s.seq_q, heads * half, stream, "rotary");
}

void embedding_forward(NormBuffer weight, std::int64_t rows, std::int64_t vocab_start, const std::int64_t* ids,
                       std::int64_t tokens, std::int64_t hidden, MutableNormBuffer out, cudaStream_t stream) {
  row_map(EmbeddingF{weight, rows, vocab_start, ids, out}, tokens, hidden, stream, "embedding");
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
  row_map(ZeroF{dweight}, rows, hidden, stream, "embedding_backward zeros");
  row_map(EmbeddingBackF{dy, order, row, begin, dweight}, groups, hidden, stream, "embedding_backward");
}

void cross_entropy_max(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, float* max, cudaStream_t stream) {
  row_sweep<1>(CeMax{logits, max}, tokens, vocab, stream, "cross_entropy_max");
}

void cross_entropy_partials(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const std::int64_t* targets, std::int64_t vocab_start, float* partials,
                            cudaStream_t stream) {
  row_sweep<1>(CePartials{logits, max, targets, vocab_start, vocab, partials}, tokens, vocab, stream,
               "cross_entropy_partials");
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
  row_map(CeBackF{logits, max, partials, dloss, targets, vocab_start, dlogits}, tokens, vocab, stream,
          "cross_entropy_backward");
}

}  // namespace cubesim::cuda
