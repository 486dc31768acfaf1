#include "kernels/cuda/attention_cuda.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dtype_cuda.cuh"
#include "kernels/elementwise.h"

namespace cubesim::cuda {

namespace {

using detail::load_elem_rt;
using detail::store_elem_rt;
using kernels::det_add;
using kernels::det_div;
using kernels::det_exp;
using kernels::det_fma;
using kernels::det_mul;

constexpr int kRows = 16;                                  // query (or key) rows per block
constexpr int kBlock = static_cast<int>(kernels::kAttentionKeyBlock);  // keys (or queries) per step
constexpr int kThreads = 256;
constexpr float kNegInf = -__builtin_inff();

struct Shape {
  std::int64_t batch, seq_q, seq_k, heads, kv_heads, d, q_offset, group;
  bool causal;
  float scale;
};

struct Buf {
  const void* data;
  DType dtype;
  std::int64_t row_stride, group_stride, seq, per_group;
  __device__ std::int64_t at(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) const {
    return (b * seq + t) * row_stride + kernels::attention_head_offset(group_stride, h, per_group, d);
  }
  __device__ float load(std::int64_t i) const { return load_elem_rt(data, dtype, i); }
};

Buf make(kernels::AttentionBuffer b, std::int64_t seq, std::int64_t per_group) {
  return {b.data, b.dtype, b.row_stride, b.group_stride, seq, per_group};
}

__device__ std::int64_t visible_keys(const Shape& s, std::int64_t b, std::int64_t t, const std::int64_t* kv_valid) {
  return kernels::attention_visible_keys(s.seq_k, s.q_offset, s.causal, b, t, kv_valid);
}

// dot(a row, b row) over e ascending from +0 (a and b element offsets).
__device__ float dot(const Buf& a, std::int64_t ia, const Buf& b, std::int64_t ib, std::int64_t d) {
  float acc = 0.0f;
  for (std::int64_t e = 0; e < d; ++e) acc = det_fma(a.load(ia + e), b.load(ib + e), acc);
  return acc;
}

// grid (ceil(seq_q / kRows), heads, batch); shared: acc [kRows][d], p [kRows][kBlock], row state.
__global__ void __launch_bounds__(kThreads) forward_kernel(Shape s, Buf Q, Buf K, Buf V, Buf O, float* stats,
                                                           const std::int64_t* kv_valid) {
  extern __shared__ float smem[];
  const std::int64_t d = s.d, b = blockIdx.z, h = blockIdx.y, g = h / s.group, t0 = std::int64_t(blockIdx.x) * kRows;
  float* acc = smem;                 // [kRows][d]
  float* p = acc + kRows * d;        // [kRows][kBlock]
  __shared__ float m_s[kRows], l_s[kRows], c_s[kRows];
  __shared__ std::int64_t nk_s[kRows];
  const int tid = threadIdx.x;
  if (tid < kRows) {
    const std::int64_t t = t0 + tid;
    nk_s[tid] = t < s.seq_q ? visible_keys(s, b, t, kv_valid) : 0;
    m_s[tid] = kNegInf;
    l_s[tid] = 0.0f;
  }
  for (std::int64_t i = tid; i < kRows * d; i += kThreads) acc[i] = 0.0f;
  __syncthreads();
  std::int64_t most = 0;
  for (int r = 0; r < kRows; ++r) most = nk_s[r] > most ? nk_s[r] : most;
  for (std::int64_t j0 = 0; j0 < most; j0 += kBlock) {
    for (int i = tid; i < kRows * kBlock; i += kThreads) {  // scores
      const int r = i / kBlock, jj = i % kBlock;
      const std::int64_t j = j0 + jj;
      if (j < nk_s[r]) p[i] = det_mul(dot(Q, Q.at(b, t0 + r, h, d), K, K.at(b, j, g, d), d), s.scale);
    }
    __syncthreads();
    if (tid < kRows && j0 < nk_s[tid]) {  // the row's max, rescale and sum, keys ascending
      const int r = tid;
      const int n = static_cast<int>((nk_s[r] - j0) < kBlock ? nk_s[r] - j0 : kBlock);
      float mb = kNegInf;
      for (int jj = 0; jj < n; ++jj) {
        const float x = p[r * kBlock + jj];
        if (x > mb) mb = x;
      }
      const float m = m_s[r], mn = mb > m ? mb : m;
      const float c = m == kNegInf ? 0.0f : det_exp(det_add(m, -mn));
      float l = det_mul(l_s[r], c);
      for (int jj = 0; jj < n; ++jj) {
        const float e = det_exp(det_add(p[r * kBlock + jj], -mn));
        p[r * kBlock + jj] = e;
        l = det_add(l, e);
      }
      m_s[r] = mn;
      l_s[r] = l;
      c_s[r] = c;
    }
    __syncthreads();
    for (std::int64_t i = tid; i < kRows * d; i += kThreads) {  // acc = acc·c + Σ p·v, keys ascending
      const int r = static_cast<int>(i / d);
      const std::int64_t e = i % d;
      if (j0 >= nk_s[r]) continue;
      const int n = static_cast<int>((nk_s[r] - j0) < kBlock ? nk_s[r] - j0 : kBlock);
      float a = det_mul(acc[i], c_s[r]);
      for (int jj = 0; jj < n; ++jj) a = det_fma(p[r * kBlock + jj], V.load(V.at(b, j0 + jj, g, d) + e), a);
      acc[i] = a;
    }
    __syncthreads();
  }
  for (std::int64_t i = tid; i < kRows * d; i += kThreads) {
    const int r = static_cast<int>(i / d);
    const std::int64_t t = t0 + r, e = i % d;
    if (t >= s.seq_q) continue;
    store_elem_rt(const_cast<void*>(O.data), O.dtype, O.at(b, t, h, d) + e, nk_s[r] == 0 ? 0.0f : det_div(acc[i], l_s[r]));
  }
  if (tid < kRows && t0 + tid < s.seq_q) {
    float* st = stats + ((b * s.seq_q + t0 + tid) * s.heads + h) * 2;
    st[0] = m_s[tid];
    st[1] = l_s[tid];
  }
}

// D[b, t, h] = dot(dO, O) over e ascending.
__global__ void delta_kernel(Shape s, Buf O, Buf dO, float* D) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= s.batch * s.seq_q * s.heads) return;
  const std::int64_t h = i % s.heads, t = (i / s.heads) % s.seq_q, b = i / (s.heads * s.seq_q);
  D[i] = dot(dO, dO.at(b, t, h, s.d), O, O.at(b, t, h, s.d), s.d);
}

struct Grad {
  float p, ds;
};

// p and ds of query row t against key j (the contract's backward).
__device__ Grad grad_of(const Shape& s, const Buf& Q, const Buf& K, const Buf& V, const Buf& dO, const float* stats,
                        const float* D, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t j) {
  const std::int64_t d = s.d, g = h / s.group, row = (b * s.seq_q + t) * s.heads + h;
  const float x = det_mul(dot(Q, Q.at(b, t, h, d), K, K.at(b, j, g, d), d), s.scale);
  const float p = det_div(det_exp(det_add(x, -stats[2 * row])), stats[2 * row + 1]);
  const float dp = dot(dO, dO.at(b, t, h, d), V, V.at(b, j, g, d), d);
  return {p, det_mul(p, det_add(dp, -D[row]))};
}

// dQ: grid (ceil(seq_q / kRows), heads, batch); dq[e] = scale · Σ_j ds·k_j[e], j ascending.
__global__ void __launch_bounds__(kThreads) dq_kernel(Shape s, Buf Q, Buf K, Buf V, Buf dO, const float* stats,
                                                      const float* D, Buf dQ, const std::int64_t* kv_valid) {
  extern __shared__ float smem[];
  const std::int64_t d = s.d, b = blockIdx.z, h = blockIdx.y, g = h / s.group, t0 = std::int64_t(blockIdx.x) * kRows;
  float* acc = smem;           // [kRows][d]
  float* ds = acc + kRows * d;  // [kRows][kBlock]
  __shared__ std::int64_t nk_s[kRows];
  const int tid = threadIdx.x;
  if (tid < kRows) nk_s[tid] = t0 + tid < s.seq_q ? visible_keys(s, b, t0 + tid, kv_valid) : 0;
  for (std::int64_t i = tid; i < kRows * d; i += kThreads) acc[i] = 0.0f;
  __syncthreads();
  std::int64_t most = 0;
  for (int r = 0; r < kRows; ++r) most = nk_s[r] > most ? nk_s[r] : most;
  for (std::int64_t j0 = 0; j0 < most; j0 += kBlock) {
    for (int i = tid; i < kRows * kBlock; i += kThreads) {
      const int r = i / kBlock, jj = i % kBlock;
      if (j0 + jj < nk_s[r]) ds[i] = grad_of(s, Q, K, V, dO, stats, D, b, t0 + r, h, j0 + jj).ds;
    }
    __syncthreads();
    for (std::int64_t i = tid; i < kRows * d; i += kThreads) {
      const int r = static_cast<int>(i / d);
      const std::int64_t e = i % d;
      if (j0 >= nk_s[r]) continue;
      const int n = static_cast<int>((nk_s[r] - j0) < kBlock ? nk_s[r] - j0 : kBlock);
      float a = acc[i];
      for (int jj = 0; jj < n; ++jj) a = det_fma(ds[r * kBlock + jj], K.load(K.at(b, j0 + jj, g, d) + e), a);
      acc[i] = a;
    }
    __syncthreads();
  }
  for (std::int64_t i = tid; i < kRows * d; i += kThreads) {
    const int r = static_cast<int>(i / d);
    if (t0 + r >= s.seq_q) continue;
    store_elem_rt(const_cast<void*>(dQ.data), dQ.dtype, dQ.at(b, t0 + r, h, d) + i % d, det_mul(acc[i], s.scale));
  }
}

// dK, dV: grid (ceil(seq_k / kRows), kv_heads, batch); over the group's heads ascending, then the
// queries ascending: dk[e] = scale · Σ ds·q_t[e], dv[e] = Σ p·dO_t[e].
__global__ void __launch_bounds__(kThreads) dkv_kernel(Shape s, Buf Q, Buf K, Buf V, Buf dO, const float* stats,
                                                       const float* D, Buf dK, Buf dV, const std::int64_t* kv_valid) {
  extern __shared__ float smem[];
  const std::int64_t d = s.d, b = blockIdx.z, g = blockIdx.y, j0 = std::int64_t(blockIdx.x) * kRows;
  float* dk = smem;              // [kRows][d]
  float* dv = dk + kRows * d;     // [kRows][d]
  float* pp = dv + kRows * d;     // [kRows][kBlock]
  float* ds = pp + kRows * kBlock;
  __shared__ std::int64_t nk_s[kBlock];
  const int tid = threadIdx.x;
  for (std::int64_t i = tid; i < 2 * kRows * d; i += kThreads) dk[i] = 0.0f;  // dk and dv
  for (std::int64_t h = g * s.group; h < (g + 1) * s.group; ++h) {
    for (std::int64_t t0 = 0; t0 < s.seq_q; t0 += kBlock) {
      __syncthreads();
      if (tid < kBlock) nk_s[tid] = t0 + tid < s.seq_q ? visible_keys(s, b, t0 + tid, kv_valid) : 0;
      __syncthreads();
      for (int i = tid; i < kRows * kBlock; i += kThreads) {
        const int r = i / kBlock, tt = i % kBlock;
        const std::int64_t j = j0 + r;
        if (j < s.seq_k && j < nk_s[tt]) {
          const Grad gr = grad_of(s, Q, K, V, dO, stats, D, b, t0 + tt, h, j);
          pp[i] = gr.p;
          ds[i] = gr.ds;
        }
      }
      __syncthreads();
      for (std::int64_t i = tid; i < kRows * d; i += kThreads) {
        const int r = static_cast<int>(i / d);
        const std::int64_t e = i % d, j = j0 + r;
        if (j >= s.seq_k) continue;
        float ak = dk[i], av = dv[i];
        for (int tt = 0; tt < kBlock && t0 + tt < s.seq_q; ++tt) {
          if (j >= nk_s[tt]) continue;
          ak = det_fma(ds[r * kBlock + tt], Q.load(Q.at(b, t0 + tt, h, d) + e), ak);
          av = det_fma(pp[r * kBlock + tt], dO.load(dO.at(b, t0 + tt, h, d) + e), av);
        }
        dk[i] = ak;
        dv[i] = av;
      }
    }
  }
  __syncthreads();
  for (std::int64_t i = tid; i < kRows * d; i += kThreads) {
    const int r = static_cast<int>(i / d);
    const std::int64_t j = j0 + r, e = i % d;
    if (j >= s.seq_k) continue;
    store_elem_rt(const_cast<void*>(dK.data), dK.dtype, dK.at(b, j, g, d) + e, det_mul(dk[i], s.scale));
    store_elem_rt(const_cast<void*>(dV.data), dV.dtype, dV.at(b, j, g, d) + e, dv[i]);
  }
}

Shape shape_of(const kernels::AttentionShape& a) {
  a.validate();
  if (a.head_dim > 512) {
    throw std::invalid_argument("attention (cuda): head_dim " + std::to_string(a.head_dim) +
                                " is above the kernels' 512 (shared memory holds a block's rows)");
  }
  return {a.batch, a.seq_q,    a.seq_k, a.heads, a.kv_heads, a.head_dim, a.query_offset(), a.heads / a.kv_heads,
          a.causal, a.softmax_scale()};
}

void set_smem(const void* kernel, std::size_t bytes) {
  CUBESIM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

void attention_forward(const kernels::AttentionShape& a, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                       kernels::AttentionBuffer v, kernels::MutableAttentionBuffer out, float* stats,
                       const std::int64_t* kv_valid, cudaStream_t stream) {
  const Shape s = shape_of(a);
  kernels::check_attention_buffer("q", q, s.heads, s.group, s.d);
  kernels::check_attention_buffer("k", k, s.kv_heads, 1, s.d);
  kernels::check_attention_buffer("v", v, s.kv_heads, 1, s.d);
  kernels::check_attention_buffer("out", out, s.heads, s.group, s.d);
  if (stats == nullptr) throw std::invalid_argument("attention (cuda): stats is null");
  const std::size_t smem = sizeof(float) * (kRows * s.d + kRows * kBlock);
  set_smem(reinterpret_cast<const void*>(forward_kernel), smem);
  const dim3 grid(static_cast<unsigned>((s.seq_q + kRows - 1) / kRows), static_cast<unsigned>(s.heads),
                  static_cast<unsigned>(s.batch));
  forward_kernel<<<grid, kThreads, smem, stream>>>(s, make(q, s.seq_q, s.group), make(k, s.seq_k, 1),
                                                   make(v, s.seq_k, 1), make(out, s.seq_q, s.group), stats, kv_valid);
  CUBESIM_CUDA_CHECK_LAUNCH("attention forward_kernel");
}

std::size_t attention_backward_workspace_bytes(const kernels::AttentionShape& a) {
  return sizeof(float) * static_cast<std::size_t>(a.batch * a.seq_q * a.heads);
}

void attention_backward(const kernels::AttentionShape& a, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                        kernels::AttentionBuffer v, kernels::AttentionBuffer out, const float* stats,
                        kernels::AttentionBuffer dout, kernels::MutableAttentionBuffer dq,
                        kernels::MutableAttentionBuffer dk, kernels::MutableAttentionBuffer dv,
                        const std::int64_t* kv_valid, void* workspace, cudaStream_t stream) {
  const Shape s = shape_of(a);
  const std::pair<const char*, kernels::AttentionBuffer> qs[] = {{"q", q}, {"out", out}, {"dout", dout}, {"dq", dq}};
  for (const auto& [what, b] : qs) kernels::check_attention_buffer(what, b, s.heads, s.group, s.d);
  const std::pair<const char*, kernels::AttentionBuffer> ks[] = {{"k", k}, {"v", v}, {"dk", dk}, {"dv", dv}};
  for (const auto& [what, b] : ks) kernels::check_attention_buffer(what, b, s.kv_heads, 1, s.d);
  if (stats == nullptr || workspace == nullptr) {
    throw std::invalid_argument("attention backward (cuda): stats and workspace must be device memory, not null");
  }
  auto* D = static_cast<float*>(workspace);
  const Buf Q = make(q, s.seq_q, s.group), K = make(k, s.seq_k, 1), V = make(v, s.seq_k, 1),
            O = make(out, s.seq_q, s.group), dO = make(dout, s.seq_q, s.group);
  const std::int64_t rows = s.batch * s.seq_q * s.heads;
  delta_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(s, O, dO, D);
  CUBESIM_CUDA_CHECK_LAUNCH("attention delta_kernel");
  const std::size_t smem_q = sizeof(float) * (kRows * s.d + kRows * kBlock);
  set_smem(reinterpret_cast<const void*>(dq_kernel), smem_q);
  const dim3 gq(static_cast<unsigned>((s.seq_q + kRows - 1) / kRows), static_cast<unsigned>(s.heads),
                static_cast<unsigned>(s.batch));
  dq_kernel<<<gq, kThreads, smem_q, stream>>>(s, Q, K, V, dO, stats, D, make(dq, s.seq_q, s.group), kv_valid);
  CUBESIM_CUDA_CHECK_LAUNCH("attention dq_kernel");
  const std::size_t smem_kv = sizeof(float) * (2 * kRows * s.d + 2 * kRows * kBlock);
  set_smem(reinterpret_cast<const void*>(dkv_kernel), smem_kv);
  const dim3 gk(static_cast<unsigned>((s.seq_k + kRows - 1) / kRows), static_cast<unsigned>(s.kv_heads),
                static_cast<unsigned>(s.batch));
  dkv_kernel<<<gk, kThreads, smem_kv, stream>>>(s, Q, K, V, dO, stats, D, make(dk, s.seq_k, 1), make(dv, s.seq_k, 1),
                                                kv_valid);
  CUBESIM_CUDA_CHECK_LAUNCH("attention dkv_kernel");
}

}  // namespace cubesim::cuda
