// attention_tc.cu — the attention contract's tensor_core mode (kernels/attention_tc.h) on tensor cores:
// FlashAttention-2-style kernels, bf16 or f16 operands, f32 accumulators, cp.async tiles in
// XOR-swizzled shared memory. Two instruction paths that give the same bits (a test pins it):
// wgmma on sm_90a (forward_wg_kernel, dq_wg_kernel, dkdv_wg_kernel: the defaults), and mma.sync
// m16n8k16 with ldmatrix (forward_kernel, dq_kernel, dkdv_kernel: variants, attention_tc_set_variant).
//
// Kernels (one CTA works on one (sequence, head) or (sequence, kv head) and one tile):
//   forward_kernel  a tile of BM query rows (warps of 16 x MT rows) walks the 64-key blocks from key 0
//                   ascending: S = Q·Kᵀ, online softmax, O += P·V (P rounded to the operand dtype);
//   prep_kernel     per (token, head): D = rowsum(dO·O) and lse2 = m·scale·log2(e) + log2(l);
//   dq_kernel       a tile of BM query rows walks the key blocks ascending: S, P, dP = dO·Vᵀ,
//                   dS = P·(dP − D), dQ += dS·K;
//   dkdv_kernel     a tile of BN keys walks the query group's heads ascending, then 64-query blocks
//                   ascending from query 0: Sᵀ, Pᵀ, dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ, dK += dSᵀ·Q.
// No atomics: every output element is written once by one thread, after its whole sum.
//
// Why a sequence's bits do not depend on the batch, its position, the chunking or the padding: every
// sum runs over fixed blocks whose boundaries are counted from key 0 (query 0 for dK, dV) of the
// sequence itself, in ascending order, each element's accumulator in one register; the MMA computes
// an element from its own row of A, column of B and accumulator (which rows share an instruction
// never changes an element's arithmetic: the property det_gemm's tensor_core mode pins too); which
// rows share a tile decides only whether a fully invisible block is skipped or applied as exact
// zeros (p = 0, rescale c = 1), and a final "+ 0.0f" makes the one difference that could leave
// (the sign of an all-zero sum) disappear. Rows and keys outside the sequence, past kv_valid or past
// seq_q / seq_k are zero-filled on load and masked by select, so NaN or inf there never reaches a sum.
#include "kernels/cuda/attention_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dtype_cuda.cuh"

namespace cubesim::cuda {

namespace {

constexpr int kKB = static_cast<int>(kernels::kAttentionTcKeyBlock);  // keys a block (64)
constexpr int kQB = 64;                                               // queries a block in dkdv
constexpr float kLog2e = 1.4426950408889634f;

struct In {
  const void* p;
  std::int64_t rs, gs;  // row stride, group stride (elements)
  int per_group;
  DType dt;
};
struct Out {
  void* p;
  std::int64_t rs, gs;
  int per_group;
  DType dt;
};

struct Params {
  In q, k, v, o_in, dout;
  Out o, dq, dk, dv;
  float* stats;
  const float* lse2;  // prep: [b][h][t]
  const float* delta;
  float* lse2_w;
  float* delta_w;
  const std::int64_t* kv_valid;
  int batch, seq_q, seq_k, heads, kv_heads, group, q_offset;
  bool causal;
  float scale, scale_log2;
};

__device__ __forceinline__ std::int64_t head_off(std::int64_t gs, int h, int per_group, int d) {
  return kernels::attention_head_offset(gs, h, per_group, d);
}

// Keys the sequence has (kv_valid clamped, else seq_k).
__device__ __forceinline__ int key_len(const Params& p, int b) {
  if (!p.kv_valid) return p.seq_k;
  const std::int64_t n = p.kv_valid[b];
  return static_cast<int>(n < 0 ? 0 : (n > p.seq_k ? p.seq_k : n));
}
// Query rows [0, q_end) that may see a key (later rows are past seq_q or padding).
__device__ __forceinline__ int query_end(const Params& p, int klen) {
  if (!p.kv_valid) return p.seq_q;
  const int e = klen - p.q_offset;
  return e < 0 ? 0 : (e > p.seq_q ? p.seq_q : e);
}
// Visible keys [0, n) of query row t (0 outside the sequence): the contract's rule.
__device__ __forceinline__ int visible(const Params& p, int klen, int t) {
  if (t < 0 || t >= p.seq_q) return 0;
  const int pos = p.q_offset + t;
  if (p.kv_valid && pos >= klen) return 0;
  int n = klen;
  if (p.causal && pos + 1 < n) n = pos + 1;
  return n < 0 ? 0 : n;
}

// ---- PTX wrappers -----------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], std::uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(std::uint32_t (&r)[4], std::uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
template <bool F16>
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Two f32 rounded to nearest even into one register of the operand dtype (lo in the low half).
template <bool F16>
__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  std::uint32_t r;
  if constexpr (F16) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- shared-memory tiles ----------------------------------------------------------------------
// A tile of R rows x D elements (16-bit) keeps row r's 16-byte chunk c at chunk c ^ (r % 8): the 8
// rows an ldmatrix reads at one column land in 8 different bank groups.
template <int D>
__device__ __forceinline__ std::uint32_t swz(int r, int c) {
  return static_cast<std::uint32_t>(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

// Rows [row0, row0 + R) of an operand, rows at or past `lim` zero-filled.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(std::uint32_t dst, const char* base, std::int64_t rs_bytes, int row0, int lim,
                                          int tid) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int i = tid; i < R * CH; i += NT) {
    const int r = i / CH, c = i % CH, row = row0 + r;
    const bool ok = row < lim;
    const char* src = ok ? base + row * rs_bytes + c * 16 : base;
    cp_async16(dst + swz<D>(r, c), src, ok);
  }
}

// ldmatrix addresses for lane l. The k (or n) chunk enters only through an XOR of the address's bits
// 5..7 with a compile-time constant and the row through an added multiple of 16 rows, so each
// operand needs one register a lane (tile bases are 256-byte aligned; row starts and the chunk XOR
// stay inside one row). A operand (16 rows from r0, k chunks kc, kc+1; kc even):
template <int D>
__device__ __forceinline__ std::uint32_t a_addr(std::uint32_t base, int r0, int kc, int lane) {
  const std::uint32_t lb = base + swz<D>(lane & 15, lane >> 4);
  return (lb ^ static_cast<std::uint32_t>(kc << 4)) + static_cast<std::uint32_t>(r0 * D * 2);
}
// B operand stored [n][k] (two n8 tiles from n0, k chunks kc, kc+1): regs {0,1} tile n0, {2,3} n0+8.
template <int D>
__device__ __forceinline__ std::uint32_t b_addr(std::uint32_t base, int n0, int kc, int lane) {
  const int i = lane >> 3;
  const std::uint32_t lb = base + swz<D>((lane & 7) + ((i >> 1) << 3), i & 1);
  return (lb ^ static_cast<std::uint32_t>(kc << 4)) + static_cast<std::uint32_t>(n0 * D * 2);
}
// B operand stored [k][n] (k rows k0..k0+15, n chunks dc, dc+1), read transposed: {0,1} chunk dc.
template <int D>
__device__ __forceinline__ std::uint32_t bt_addr(std::uint32_t base, int k0, int dc, int lane) {
  const int i = lane >> 3;
  const std::uint32_t lb = base + swz<D>((lane & 7) + ((i & 1) << 3), i >> 1);
  return (lb ^ static_cast<std::uint32_t>(dc << 4)) + static_cast<std::uint32_t>(k0 * D * 2);
}

__device__ __forceinline__ void store2(const Out& o, std::int64_t idx, float a, float b) {
  switch (o.dt) {
    case DType::bf16: {
      __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(o.p) + idx) = v;
      return;
    }
    case DType::f16: {
      __half2 v = __floats2half2_rn(a, b);
      *reinterpret_cast<__half2*>(static_cast<__half*>(o.p) + idx) = v;
      return;
    }
    case DType::f32: break;
  }
  *reinterpret_cast<float2*>(static_cast<float*>(o.p) + idx) = make_float2(a, b);
}

// ---- forward ----------------------------------------------------------------------------------
// grid (batch * heads, query tiles, reversed: the longest causal tiles start first); NW warps of
// MT x 16 query rows. Shared: Q [BM][D], K and V [2][64][D].
template <bool F16, int D, int NW, int MT>
__global__ void __launch_bounds__(NW * 32, 1) forward_kernel(Params p) {
  constexpr int NT = NW * 32, BM = NW * MT * 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sQ = smem_u32(smem), sK = sQ + BM * D * 2, sV = sK + 2 * kKB * D * 2;
  int& cta_max_s = *reinterpret_cast<int*>(smem + BM * D * 2 + 4 * kKB * D * 2);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, g = h / p.group;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const int esz = 2;
  const char* qb = static_cast<const char*>(p.q.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * esz;
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * esz;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * esz;
  const std::int64_t qrs = p.q.rs * esz, krs = p.k.rs * esz, vrs = p.v.rs * esz;

  // Each thread holds rows (mt, half): t0 + warp*16*MT + mt*16 + lane/4 + half*8.
  // Each thread holds rows (mt, half): t0 + warp*16*MT + mt*16 + lane/4 + half*8; their visible key
  // counts are recomputed where needed (registers are the forward's limit).
  const int wr0 = warp * 16 * MT;  // warp's first row in the tile
  auto row_nk = [&](int mt, int hf) { return visible(p, klen, t0 + wr0 + mt * 16 + (lane >> 2) + hf * 8); };
  int wmax = 0, wmin = 1 << 30;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int n = row_nk(mt, hf);
      wmax = max(wmax, n);
      wmin = min(wmin, n);
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
    wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
  }
  if (tid == 0) cta_max_s = 0;
  __syncthreads();
  if (lane == 0) atomicMax(&cta_max_s, wmax);  // an integer max: order-free
  load_tile<BM, D, NT>(sQ, qb, qrs, t0, qend, tid);
  __syncthreads();
  const int nblk = (cta_max_s + kKB - 1) / kKB;
  if (nblk > 0) {
    load_tile<kKB, D, NT>(sK, kb, krs, 0, klen, tid);
    load_tile<kKB, D, NT>(sV, vb, vrs, 0, klen, tid);
  }
  cp_commit();

  float acc[MT][D / 8][4];
  float m[MT][2], l[MT][2];
  std::uint32_t qf[MT == 1 ? D / 16 : 1][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  for (int n = 0; n < nblk; ++n) {
    const int buf = n & 1, j0 = n * kKB;
    if (n + 1 < nblk) {
      load_tile<kKB, D, NT>(sK + (buf ^ 1) * kKB * D * 2, kb, krs, j0 + kKB, klen, tid);
      load_tile<kKB, D, NT>(sV + (buf ^ 1) * kKB * D * 2, vb, vrs, j0 + kKB, klen, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (j0 < wmax) {  // the warp's rows see some key of this block
      const std::uint32_t kt = sK + buf * kKB * D * 2, vt = sV + buf * kKB * D * 2;
      float s[MT][8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
      if constexpr (MT == 1) {  // one 16-row tile a warp: Q's fragments stay in registers
        if (n == 0) {
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qf[kk], a_addr<D>(sQ, wr0, 2 * kk, lane));
        }
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (MT == 1) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[mt][i] = qf[kk][i];
          } else {
            ldsm_x4(a[mt], a_addr<D>(sQ, wr0 + mt * 16, 2 * kk, lane));
          }
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          std::uint32_t bb[4];
          ldsm_x4(bb, b_addr<D>(kt, np * 16, 2 * kk, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma<F16>(s[mt][2 * np], a[mt], bb[0], bb[1]);
            mma<F16>(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
          }
        }
      }
      // Online softmax, per row: mask by select, max, rescale, p = 2^(s·c − m·c).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float cr[2];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (j0 + kKB > wmin) {  // some row of the warp does not see the whole block
            const int lim = row_nk(mt, hf) - j0;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int col = nt * 8 + 2 * (lane & 3) + e;
                float& x = s[mt][nt][hf * 2 + e];
                x = col < lim ? x : -INFINITY;
              }
          }
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][hf * 2], s[mt][nt][hf * 2 + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float mo = m[mt][hf], mn = fmaxf(mo, mx);
          const float mcn = mn == -INFINITY ? 0.0f : (mn * p.scale) * kLog2e;
          const float mco = (mo * p.scale) * kLog2e;
          const float c = mn == mo ? 1.0f : ex2(mco - mcn);
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mt][nt][hf * 2 + e];
              x = ex2(fmaf(x, p.scale_log2, -mcn));  // -inf -> 0
              sum += x;
            }
          l[mt][hf] = l[mt][hf] * c + sum;
          m[mt][hf] = mn;
          cr[hf] = c;
        }
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          acc[mt][i][0] *= cr[0];
          acc[mt][i][1] *= cr[0];
          acc[mt][i][2] *= cr[1];
          acc[mt][i][3] *= cr[1];
        }
      }
      // O += P·V, P rounded to the operand dtype one k16 chunk at a time (keeps registers free).
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        std::uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = pack<F16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack<F16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack<F16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack<F16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          std::uint32_t bb[4];
          ldsm_x4_t(bb, bt_addr<D>(vt, kk * 16, 2 * dp, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma<F16>(acc[mt][2 * dp], pa[mt], bb[0], bb[1]);
            mma<F16>(acc[mt][2 * dp + 1], pa[mt], bb[2], bb[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: l summed over the quad in a fixed order, O = acc / l (+0: no negative zero).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float ls = l[mt][hf] + __shfl_xor_sync(0xffffffffu, l[mt][hf], 1);
      ls = ls + __shfl_xor_sync(0xffffffffu, ls, 2);
      const int t = t0 + wr0 + mt * 16 + (lane >> 2) + hf * 8;
      if (t >= p.seq_q) continue;
      const bool none = row_nk(mt, hf) == 0;
      const float inv = none ? 0.0f : 1.0f / ls;
      const std::int64_t row =
          (static_cast<std::int64_t>(b) * p.seq_q + t) * p.o.rs + head_off(p.o.gs, h, p.o.per_group, D);
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        const int e = i * 8 + 2 * (lane & 3);
        store2(p.o, row + e, acc[mt][i][hf * 2] * inv + 0.0f, acc[mt][i][hf * 2 + 1] * inv + 0.0f);
      }
      if ((lane & 3) == 0) {
        float* st = p.stats + ((static_cast<std::int64_t>(b) * p.seq_q + t) * p.heads + h) * 2;
        st[0] = none ? -INFINITY : m[mt][hf] * p.scale;
        st[1] = none ? 0.0f : ls;
      }
    }
}

// ---- forward on sm_90a: wgmma -----------------------------------------------------------------
// NWG warpgroups of 64 query rows: S = Q·Kᵀ by wgmma m64n64k16 (Q and K k-major in shared memory),
// softmax in registers, O += P·V by wgmma m64nDk16 with P from registers (the same fragments as
// mma.sync's A) and V MN-major in shared memory. Tiles are laid out as the MMA's 128-byte swizzle
// wants: [D/64 column blocks][rows][128 bytes], chunk c of row r at c ^ (r % 8), bases 1024-aligned.
// wgmma with A from registers (the m16n8k16 A-fragment layout, one 16-row slice a warp) and B from
// shared memory: d += a*b; TB: B's transpose immediate (1: MN-major).
template <bool F16, int TB>
__device__ __forceinline__ void wgmma_rs64(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (F16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TB));
  }
#else
  __trap();
#endif
}

template <bool F16, int TB>
__device__ __forceinline__ void wgmma_rs128(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (F16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TB));
  }
#else
  __trap();
#endif
}

// wgmma with A and B k-major in shared memory (S = Q·Kᵀ, 64 keys): d += a*b.
template <bool F16>
__device__ __forceinline__ void wgmma_ss64(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (F16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
  }
#else
  __trap();
#endif
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Registers an in-flight wgmma reads or writes: kept where they are until the wait (the compiler
// sees the asm as their last use/definition, not the hardware's).
template <int N>
__device__ __forceinline__ void keep(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void keep(std::uint32_t (&r)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
template <bool F16, int D>
__device__ __forceinline__ void wgmma_rs(float (&d)[D / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
  if constexpr (D == 128) {
    wgmma_rs128<F16, 1>(d, a, desc_b);
  } else {
    wgmma_rs64<F16, 1>(d, a, desc_b);
  }
}
__device__ __forceinline__ std::uint32_t align1024(const void* p) { return (smem_u32(p) + 1023u) & ~1023u; }
// k-major operand, 128-byte swizzle: 8-row atoms 1024 bytes apart (as det_gemm_tc.cu).
__device__ __forceinline__ std::uint64_t desc_k(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<std::uint64_t>(1) << 16) |
         (static_cast<std::uint64_t>(1024 >> 4) << 32) | (static_cast<std::uint64_t>(1) << 62);
}
// MN-major operand: boxes of 64 MN-contiguous elements x 64 k rows (leading offset one box, 8 KB),
// 8-row atoms 1024 bytes apart, 128-byte swizzle.
__device__ __forceinline__ std::uint64_t desc_mn(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<std::uint64_t>(8192 >> 4) << 16) |
         (static_cast<std::uint64_t>(1024 >> 4) << 32) | (static_cast<std::uint64_t>(1) << 62);
}
template <int R>
__device__ __forceinline__ std::uint32_t wsw(int r, int c) {
  return static_cast<std::uint32_t>((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile_w(std::uint32_t dst, const char* base, std::int64_t rs_bytes, int row0,
                                            int lim, int tid) {
  constexpr int CH = D / 8;
#pragma unroll 4
  for (int i = tid; i < R * CH; i += NT) {
    const int r = i / CH, c = i % CH, row = row0 + r;
    const bool ok = row < lim;
    cp_async16(dst + wsw<R>(r, c), ok ? base + row * rs_bytes + c * 16 : base, ok);
  }
}

// One 64-key block of the wgmma forwards' online softmax, for this thread's two rows (myrow and
// myrow + 8) of its warpgroup: s[4c + r] holds row myrow + 8 (r / 2), key j0 + 8c + 2 (lane % 4) + r % 2.
// Masks keys past each row's visible count (where the block reaches past the warpgroup's first row's),
// updates the running max m and sum l, rescales acc, and packs P (rounded to the dtype) for the PV MMA.
// The default and the pipelined forward share it, so their bits are the same by construction.
template <bool F16, int D>
__device__ __forceinline__ void softmax_block(const Params& p, int klen, int myrow, int lane, int j0, int wgmin,
                                              float (&s)[32], float (&m)[2], float (&l)[2], float (&acc)[D / 2],
                                              std::uint32_t (&pa)[4][4]) {
  float cr[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    if (j0 + kKB > wgmin) {
      const int lim = visible(p, klen, myrow + hf * 8) - j0;
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = c * 8 + 2 * (lane & 3) + e;
          float& x = s[4 * c + 2 * hf + e];
          x = col < lim ? x : -INFINITY;
        }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 8; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * hf], s[4 * c + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mo = m[hf], mn = fmaxf(mo, mx);
    const float mcn = mn == -INFINITY ? 0.0f : (mn * p.scale) * kLog2e;
    const float mco = (mo * p.scale) * kLog2e;
    const float c = mn == mo ? 1.0f : ex2(mco - mcn);
    float sum = 0.0f;
#pragma unroll
    for (int cc = 0; cc < 8; ++cc)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * cc + 2 * hf + e];
        x = ex2(fmaf(x, p.scale_log2, -mcn));
        sum += x;
      }
    l[hf] = l[hf] * c + sum;
    m[hf] = mn;
    cr[hf] = c;
  }
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    acc[4 * i] *= cr[0];
    acc[4 * i + 1] *= cr[0];
    acc[4 * i + 2] *= cr[1];
    acc[4 * i + 3] *= cr[1];
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pack<F16>(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = pack<F16>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack<F16>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack<F16>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

template <bool F16, int D, int NWG, int STAGES>
__global__ void __launch_bounds__(NWG * 128, 1) forward_wg_kernel(Params p) {
  constexpr int NT = NWG * 128, BM = NWG * 64, TILE = 64 * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  // K and V in STAGES buffers: block n in buffer n % STAGES; with 3, one barrier a block suffices
  // (block n + 1's loads go to the buffer block n - 2 used, which every warpgroup left before the
  // barrier of block n - 1), and warpgroups drift up to a block apart.
  const std::uint32_t sQ = (smem_u32(smem) + 1023u) & ~1023u, sK = sQ + NWG * TILE, sV = sK + STAGES * TILE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, g = h / p.group;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const char* qb = static_cast<const char*>(p.q.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * 2;
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * 2;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * 2;
  const std::int64_t krs = p.k.rs * 2, vrs = p.v.rs * 2;
  // Visible keys grow with the row inside [0, qend) and are 0 past it: the warpgroup's (and the
  // CTA's) extremes come from its first and last rows.
  const int r0 = t0 + wg * 64, last = min(r0 + 63, qend - 1), lastc = min(t0 + BM - 1, qend - 1);
  const int wgmax = last >= r0 ? visible(p, klen, last) : 0;
  const int wgmin = r0 + 63 < qend ? visible(p, klen, r0) : 0;
  const int nblk = ((lastc >= t0 ? visible(p, klen, lastc) : 0) + kKB - 1) / kKB;
#pragma unroll
  for (int w = 0; w < NWG; ++w) load_tile_w<64, D, NT>(sQ + w * TILE, qb, p.q.rs * 2, t0 + w * 64, qend, tid);
  if (nblk > 0) {
    load_tile_w<64, D, NT>(sK, kb, krs, 0, klen, tid);
    load_tile_w<64, D, NT>(sV, vb, vrs, 0, klen, tid);
  }
  cp_commit();

  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int myrow = r0 + wq * 16 + (lane >> 2);  // and myrow + 8
  const std::uint32_t qt = sQ + wg * TILE;

  for (int n = 0; n < nblk; ++n) {
    const int buf = n % STAGES, j0 = n * kKB;
    if (n + 1 < nblk) {
      const int nb = (n + 1) % STAGES;
      load_tile_w<64, D, NT>(sK + nb * TILE, kb, krs, j0 + kKB, klen, tid);
      load_tile_w<64, D, NT>(sV + nb * TILE, vb, vrs, j0 + kKB, klen, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async bytes -> the MMA's reads
    __syncthreads();
    if (j0 < wgmax) {  // the warpgroup's rows see some key of this block
      const std::uint32_t kt = sK + buf * TILE, vt = sV + buf * TILE;
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const std::uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
        wgmma_ss64<F16>(s, desc_k(qt + off), desc_k(kt + off));
      }
      wg_commit();
      wg_wait0();
      keep(s);
      std::uint32_t pa[4][4];
      softmax_block<F16, D>(p, klen, myrow, lane, j0, wgmin, s, m, l, acc, pa);
      keep(acc);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_rs<F16, D>(acc, pa[kk], desc_mn(vt + kk * 16 * 128));
      wg_commit();
      wg_wait0();
      keep(acc);
      keep(pa);
    }
    if constexpr (STAGES == 2) __syncthreads();
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float ls = l[hf] + __shfl_xor_sync(0xffffffffu, l[hf], 1);
    ls = ls + __shfl_xor_sync(0xffffffffu, ls, 2);
    const int t = myrow + hf * 8;
    if (t >= p.seq_q) continue;
    const bool none = visible(p, klen, t) == 0;
    const float inv = none ? 0.0f : 1.0f / ls;
    const std::int64_t row =
        (static_cast<std::int64_t>(b) * p.seq_q + t) * p.o.rs + head_off(p.o.gs, h, p.o.per_group, D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int e = i * 8 + 2 * (lane & 3);
      store2(p.o, row + e, acc[4 * i + 2 * hf] * inv + 0.0f, acc[4 * i + 2 * hf + 1] * inv + 0.0f);
    }
    if ((lane & 3) == 0) {
      float* st = p.stats + ((static_cast<std::int64_t>(b) * p.seq_q + t) * p.heads + h) * 2;
      st[0] = none ? -INFINITY : m[hf] * p.scale;
      st[1] = none ? 0.0f : ls;
    }
  }
}

// The same forward with the next block's S = Q·Kᵀ issued before this block's softmax (the tensor
// cores work on it while the warpgroup computes exponentials): s and sn alternate. Same operations
// on every element in the same order: the same bits.
template <bool F16, int D, int NWG>
__global__ void __launch_bounds__(NWG * 128, 1) forward_wgp_kernel(Params p) {
  constexpr int NT = NWG * 128, BM = NWG * 64, TILE = 64 * D * 2, STAGES = 3;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sQ = (smem_u32(smem) + 1023u) & ~1023u, sK = sQ + NWG * TILE, sV = sK + STAGES * TILE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, g = h / p.group;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const char* qb = static_cast<const char*>(p.q.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * 2;
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * 2;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * 2;
  const std::int64_t krs = p.k.rs * 2, vrs = p.v.rs * 2;
  const int r0 = t0 + wg * 64, last = min(r0 + 63, qend - 1), lastc = min(t0 + BM - 1, qend - 1);
  const int wgmax = last >= r0 ? visible(p, klen, last) : 0;
  const int wgmin = r0 + 63 < qend ? visible(p, klen, r0) : 0;
  const int nblk = ((lastc >= t0 ? visible(p, klen, lastc) : 0) + kKB - 1) / kKB;
#pragma unroll
  for (int w = 0; w < NWG; ++w) load_tile_w<64, D, NT>(sQ + w * TILE, qb, p.q.rs * 2, t0 + w * 64, qend, tid);
  if (nblk > 0) {
    load_tile_w<64, D, NT>(sK, kb, krs, 0, klen, tid);
    load_tile_w<64, D, NT>(sV, vb, vrs, 0, klen, tid);
  }
  cp_commit();
  if (nblk > 1) {
    load_tile_w<64, D, NT>(sK + TILE, kb, krs, kKB, klen, tid);
    load_tile_w<64, D, NT>(sV + TILE, vb, vrs, kKB, klen, tid);
  }
  cp_commit();
  cp_wait<1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int myrow = r0 + wq * 16 + (lane >> 2);
  const std::uint32_t qt = sQ + wg * TILE;
  auto issue_s = [&](float (&d)[32], int n) {
    const std::uint32_t kt = sK + (n % STAGES) * TILE;
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
      wgmma_ss64<F16>(d, desc_k(qt + off), desc_k(kt + off));
    }
    wg_commit();
  };
  float s[32], sn[32];
  if (nblk > 0 && 0 < wgmax) {
    issue_s(s, 0);
    wg_wait0();
    keep(s);
  }
  for (int n = 0; n < nblk; ++n) {
    const int j0 = n * kKB;
    cp_wait<0>();  // block n + 1's tiles
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // every warpgroup is past block n - 1: its buffer takes block n + 2
    if (n + 2 < nblk) {
      const int nb = (n + 2) % STAGES;
      load_tile_w<64, D, NT>(sK + nb * TILE, kb, krs, j0 + 2 * kKB, klen, tid);
      load_tile_w<64, D, NT>(sV + nb * TILE, vb, vrs, j0 + 2 * kKB, klen, tid);
    }
    cp_commit();
    if (j0 < wgmax) {
      const bool next = n + 1 < nblk && j0 + kKB < wgmax;
      if (next) issue_s(sn, n + 1);
      const std::uint32_t vt = sV + (n % STAGES) * TILE;
      std::uint32_t pa[4][4];
      softmax_block<F16, D>(p, klen, myrow, lane, j0, wgmin, s, m, l, acc, pa);
      keep(acc);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_rs<F16, D>(acc, pa[kk], desc_mn(vt + kk * 16 * 128));
      wg_commit();
      wg_wait0();
      keep(acc);
      keep(pa);
      keep(sn);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = sn[i];
    }
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float ls = l[hf] + __shfl_xor_sync(0xffffffffu, l[hf], 1);
    ls = ls + __shfl_xor_sync(0xffffffffu, ls, 2);
    const int t = myrow + hf * 8;
    if (t >= p.seq_q) continue;
    const bool none = visible(p, klen, t) == 0;
    const float inv = none ? 0.0f : 1.0f / ls;
    const std::int64_t row =
        (static_cast<std::int64_t>(b) * p.seq_q + t) * p.o.rs + head_off(p.o.gs, h, p.o.per_group, D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int e = i * 8 + 2 * (lane & 3);
      store2(p.o, row + e, acc[4 * i + 2 * hf] * inv + 0.0f, acc[4 * i + 2 * hf + 1] * inv + 0.0f);
    }
    if ((lane & 3) == 0) {
      float* st = p.stats + ((static_cast<std::int64_t>(b) * p.seq_q + t) * p.heads + h) * 2;
      st[0] = none ? -INFINITY : m[hf] * p.scale;
      st[1] = none ? 0.0f : ls;
    }
  }
}

// ---- backward: D and lse ----------------------------------------------------------------------
// One warp per (token, head): D = Σ dO·O (each lane its elements ascending, then a fixed butterfly),
// lse2 = m·log2(e) + log2(l) (+inf for a row that sees no key, with D = 0).
template <int D>
__global__ void __launch_bounds__(256) prep_kernel(Params p) {
  const std::int64_t w = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.seq_q * p.heads;
  if (w >= rows) return;
  const int h = static_cast<int>(w % p.heads);
  const std::int64_t bt = w / p.heads;
  const int t = static_cast<int>(bt % p.seq_q), b = static_cast<int>(bt / p.seq_q);
  const int klen = key_len(p, b);
  const bool none = visible(p, klen, t) == 0;
  const std::int64_t oi = bt * p.o_in.rs + head_off(p.o_in.gs, h, p.o_in.per_group, D);
  const std::int64_t di = bt * p.dout.rs + head_off(p.dout.gs, h, p.dout.per_group, D);
  float acc = 0.0f;
  if (!none) {
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      const int e = lane * (D / 32) + i;
      acc = fmaf(detail::load_elem_rt(p.dout.p, p.dout.dt, di + e), detail::load_elem_rt(p.o_in.p, p.o_in.dt, oi + e), acc);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc = acc + __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    const std::int64_t at = (static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + t;
    const float* st = p.stats + bt * p.heads * 2 + h * 2;
    p.delta_w[at] = none ? 0.0f : acc;
    p.lse2_w[at] = none ? INFINITY : st[0] * kLog2e + __log2f(st[1]);
  }
}

// ---- backward: dQ -----------------------------------------------------------------------------
// grid (batch * heads, query tiles reversed); NW warps of 16 query rows. Shared: Q, dO [BM][D],
// K, V [2][64][D].
template <bool F16, int D, int NW>
__global__ void __launch_bounds__(NW * 32, 1) dq_kernel(Params p) {
  constexpr int NT = NW * 32, BM = NW * 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sQ = smem_u32(smem), sO = sQ + BM * D * 2, sK = sO + BM * D * 2, sV = sK + 2 * kKB * D * 2;
  int& cta_max_s = *reinterpret_cast<int*>(smem + 2 * BM * D * 2 + 4 * kKB * D * 2);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, g = h / p.group;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const char* qb = static_cast<const char*>(p.q.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * 2;
  const char* ob = static_cast<const char*>(p.dout.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.dout.rs + head_off(p.dout.gs, h, p.dout.per_group, D)) * 2;
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * 2;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * 2;
  const std::int64_t krs = p.k.rs * 2, vrs = p.v.rs * 2;

  int nk[2];
  float lse[2], dl[2];
  int wmax = 0, wmin = 1 << 30;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int t = t0 + warp * 16 + (lane >> 2) + hf * 8;
    nk[hf] = visible(p, klen, t);
    wmax = max(wmax, nk[hf]);
    wmin = min(wmin, nk[hf]);
    const std::int64_t at = (static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + (t < p.seq_q ? t : 0);
    lse[hf] = nk[hf] ? p.lse2[at] : INFINITY;
    dl[hf] = nk[hf] ? p.delta[at] : 0.0f;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
    wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
  }
  if (tid == 0) cta_max_s = 0;
  __syncthreads();
  if (lane == 0) atomicMax(&cta_max_s, wmax);
  load_tile<BM, D, NT>(sQ, qb, p.q.rs * 2, t0, qend, tid);
  load_tile<BM, D, NT>(sO, ob, p.dout.rs * 2, t0, qend, tid);
  __syncthreads();
  const int nblk = (cta_max_s + kKB - 1) / kKB;
  if (nblk > 0) {
    load_tile<kKB, D, NT>(sK, kb, krs, 0, klen, tid);
    load_tile<kKB, D, NT>(sV, vb, vrs, 0, klen, tid);
  }
  cp_commit();

  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  const int wr0 = warp * 16;

  for (int n = 0; n < nblk; ++n) {
    const int buf = n & 1, j0 = n * kKB;
    if (n + 1 < nblk) {
      load_tile<kKB, D, NT>(sK + (buf ^ 1) * kKB * D * 2, kb, krs, j0 + kKB, klen, tid);
      load_tile<kKB, D, NT>(sV + (buf ^ 1) * kKB * D * 2, vb, vrs, j0 + kKB, klen, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if (j0 < wmax) {
      const std::uint32_t kt = sK + buf * kKB * D * 2, vt = sV + buf * kKB * D * 2;
      float s[8][4], dp[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t a[4], ao[4];
        ldsm_x4(a, a_addr<D>(sQ, wr0, 2 * kk, lane));
        ldsm_x4(ao, a_addr<D>(sO, wr0, 2 * kk, lane));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          std::uint32_t bb[4], bv[4];
          ldsm_x4(bb, b_addr<D>(kt, np * 16, 2 * kk, lane));
          mma<F16>(s[2 * np], a, bb[0], bb[1]);
          mma<F16>(s[2 * np + 1], a, bb[2], bb[3]);
          ldsm_x4(bv, b_addr<D>(vt, np * 16, 2 * kk, lane));
          mma<F16>(dp[2 * np], ao, bv[0], bv[1]);
          mma<F16>(dp[2 * np + 1], ao, bv[2], bv[3]);
        }
      }
      std::uint32_t da[4][4];
      const bool part = j0 + kKB > wmin;  // some row of the warp does not see the whole block
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int hf = i >> 1, col = nt * 8 + 2 * (lane & 3) + (i & 1);
          const bool vis = !part || j0 + col < nk[hf];
          const float pr = vis ? ex2(fmaf(s[nt][i], p.scale_log2, -lse[hf])) : 0.0f;
          dp[nt][i] = vis ? pr * (dp[nt][i] - dl[hf]) : 0.0f;
        }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        da[kk][0] = pack<F16>(dp[2 * kk][0], dp[2 * kk][1]);
        da[kk][1] = pack<F16>(dp[2 * kk][2], dp[2 * kk][3]);
        da[kk][2] = pack<F16>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
        da[kk][3] = pack<F16>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int dp2 = 0; dp2 < D / 16; ++dp2) {
          std::uint32_t bb[4];
          ldsm_x4_t(bb, bt_addr<D>(kt, kk * 16, 2 * dp2, lane));
          mma<F16>(dq[2 * dp2], da[kk], bb[0], bb[1]);
          mma<F16>(dq[2 * dp2 + 1], da[kk], bb[2], bb[3]);
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int t = t0 + wr0 + (lane >> 2) + hf * 8;
    if (t >= p.seq_q) continue;
    const std::int64_t row =
        (static_cast<std::int64_t>(b) * p.seq_q + t) * p.dq.rs + head_off(p.dq.gs, h, p.dq.per_group, D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int e = i * 8 + 2 * (lane & 3);
      store2(p.dq, row + e, dq[i][hf * 2] * p.scale + 0.0f, dq[i][hf * 2 + 1] * p.scale + 0.0f);
    }
  }
}

// ---- backward: dK, dV -------------------------------------------------------------------------
// grid (batch * kv_heads, key tiles: the first ones, which the most causal queries see, first); NW
// warps of 16 keys. Shared: K, V [BN][D]; Q, dO [2][64][D]; per query block lse2, D, visible keys.
template <bool F16, int D, int NW>
__global__ void __launch_bounds__(NW * 32, 1) dkdv_kernel(Params p) {
  constexpr int NT = NW * 32, BN = NW * 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sK = smem_u32(smem), sV = sK + BN * D * 2, sQ = sV + BN * D * 2, sO = sQ + 2 * kQB * D * 2;
  float* f_lse = reinterpret_cast<float*>(smem + 2 * BN * D * 2 + 4 * kQB * D * 2);  // [2][kQB]
  float* f_d = f_lse + 2 * kQB;                                                       // [2][kQB]
  int* f_nk = reinterpret_cast<int*>(f_d + 2 * kQB);                                  // [2][kQB]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x / p.kv_heads, g = blockIdx.x % p.kv_heads;
  const int j0 = blockIdx.y * BN;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * 2;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * 2;
  // Query blocks [qb0, qb1) of 64 rows from query 0 that may see a key of this tile.
  int qlo = 0;
  if (p.causal) qlo = max(0, j0 - p.q_offset);
  const int qb0 = j0 < klen ? qlo / kQB : 0;
  const int qb1 = j0 < klen && qlo < qend ? (qend + kQB - 1) / kQB : qb0;
  const int per_head = qb1 - qb0, total = per_head * p.group;

  auto issue = [&](int it, int buf) {
    const int h = g * p.group + it / per_head, t0 = (qb0 + it % per_head) * kQB;
    const char* qb = static_cast<const char*>(p.q.p) +
                     (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * 2;
    const char* ob = static_cast<const char*>(p.dout.p) +
                     (static_cast<std::int64_t>(b) * p.seq_q * p.dout.rs + head_off(p.dout.gs, h, p.dout.per_group, D)) * 2;
    load_tile<kQB, D, NT>(sQ + buf * kQB * D * 2, qb, p.q.rs * 2, t0, qend, tid);
    load_tile<kQB, D, NT>(sO + buf * kQB * D * 2, ob, p.dout.rs * 2, t0, qend, tid);
    for (int i = tid; i < kQB; i += NT) {
      const int t = t0 + i, n = visible(p, klen, t);
      const std::int64_t at = (static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + (t < p.seq_q ? t : 0);
      f_nk[buf * kQB + i] = n;
      f_lse[buf * kQB + i] = n ? p.lse2[at] : INFINITY;
      f_d[buf * kQB + i] = n ? p.delta[at] : 0.0f;
    }
  };

  load_tile<BN, D, NT>(sK, kb, p.k.rs * 2, j0, klen, tid);
  load_tile<BN, D, NT>(sV, vb, p.v.rs * 2, j0, klen, tid);
  if (total > 0) issue(0, 0);
  cp_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }
  const int wk0 = warp * 16;  // the warp's first key in the tile
  const int key[2] = {j0 + wk0 + (lane >> 2), j0 + wk0 + (lane >> 2) + 8};

  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    if (it + 1 < total) {
      issue(it + 1, buf ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const std::uint32_t qt = sQ + buf * kQB * D * 2, ot = sO + buf * kQB * D * 2;
    // Every query of the block sees every key of the tile (visible keys grow with t inside qend):
    const int tq0 = (qb0 + it % per_head) * kQB;
    const bool full = tq0 + kQB <= qend && visible(p, klen, tq0) >= j0 + BN;
    const float* lse = f_lse + buf * kQB;
    const float* dl = f_d + buf * kQB;
    const int* nkq = f_nk + buf * kQB;
    float s[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      ldsm_x4(a, a_addr<D>(sK, wk0, 2 * kk, lane));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bb[4];
        ldsm_x4(bb, b_addr<D>(qt, np * 16, 2 * kk, lane));
        mma<F16>(s[2 * np], a, bb[0], bb[1]);
        mma<F16>(s[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    // Pᵀ (rows keys, columns queries), masked by select.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = nt * 8 + 2 * (lane & 3) + (i & 1);
        const bool vis = full || key[i >> 1] < nkq[col];
        s[nt][i] = vis ? ex2(fmaf(s[nt][i], p.scale_log2, -lse[col])) : 0.0f;
      }
    {  // dV += Pᵀ·dO
      std::uint32_t pa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = pack<F16>(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack<F16>(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack<F16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack<F16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int dp2 = 0; dp2 < D / 16; ++dp2) {
          std::uint32_t bb[4];
          ldsm_x4_t(bb, bt_addr<D>(ot, kk * 16, 2 * dp2, lane));
          mma<F16>(dv[2 * dp2], pa[kk], bb[0], bb[1]);
          mma<F16>(dv[2 * dp2 + 1], pa[kk], bb[2], bb[3]);
        }
    }
    float dp[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      ldsm_x4(a, a_addr<D>(sV, wk0, 2 * kk, lane));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bb[4];
        ldsm_x4(bb, b_addr<D>(ot, np * 16, 2 * kk, lane));
        mma<F16>(dp[2 * np], a, bb[0], bb[1]);
        mma<F16>(dp[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    {  // dSᵀ = Pᵀ·(dPᵀ − D); dK += dSᵀ·Q
      std::uint32_t da[4][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = nt * 8 + 2 * (lane & 3) + (i & 1);
          dp[nt][i] = s[nt][i] * (dp[nt][i] - dl[col]);  // P = 0 where invisible, D finite
        }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        da[kk][0] = pack<F16>(dp[2 * kk][0], dp[2 * kk][1]);
        da[kk][1] = pack<F16>(dp[2 * kk][2], dp[2 * kk][3]);
        da[kk][2] = pack<F16>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
        da[kk][3] = pack<F16>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int dp2 = 0; dp2 < D / 16; ++dp2) {
          std::uint32_t bb[4];
          ldsm_x4_t(bb, bt_addr<D>(qt, kk * 16, 2 * dp2, lane));
          mma<F16>(dk[2 * dp2], da[kk], bb[0], bb[1]);
          mma<F16>(dk[2 * dp2 + 1], da[kk], bb[2], bb[3]);
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int j = key[hf];
    if (j >= p.seq_k) continue;
    const std::int64_t rk = (static_cast<std::int64_t>(b) * p.seq_k + j) * p.dk.rs + head_off(p.dk.gs, g, 1, D);
    const std::int64_t rv = (static_cast<std::int64_t>(b) * p.seq_k + j) * p.dv.rs + head_off(p.dv.gs, g, 1, D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int e = i * 8 + 2 * (lane & 3);
      store2(p.dk, rk + e, dk[i][hf * 2] * p.scale + 0.0f, dk[i][hf * 2 + 1] * p.scale + 0.0f);
      store2(p.dv, rv + e, dv[i][hf * 2] + 0.0f, dv[i][hf * 2 + 1] + 0.0f);
    }
  }
}

// ---- backward on sm_90a: wgmma ----------------------------------------------------------------
// dq_wg_kernel: NWG warpgroups of 64 query rows; S = Q·Kᵀ and dP = dO·Vᵀ by SS wgmma (k-major),
// dQ += dS·K by RS wgmma (K MN-major). dkdv_wg_kernel: NWG warpgroups of 64 keys; Sᵀ = K·Qᵀ and
// dPᵀ = V·dOᵀ by SS wgmma, dV += Pᵀ·dO and dK += dSᵀ·Q by RS wgmma (dO, Q MN-major). Same blocks,
// orders, masks and roundings as dq_kernel and dkdv_kernel.
template <bool F16, int D, int NWG, int STAGES>
__global__ void __launch_bounds__(NWG * 128, 1) dq_wg_kernel(Params p) {
  constexpr int NT = NWG * 128, BM = NWG * 64, TILE = 64 * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sQ = align1024(smem), sO = sQ + NWG * TILE, sK = sO + NWG * TILE, sV = sK + STAGES * TILE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, g = h / p.group;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const char* qb = static_cast<const char*>(p.q.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * 2;
  const char* ob = static_cast<const char*>(p.dout.p) +
                   (static_cast<std::int64_t>(b) * p.seq_q * p.dout.rs + head_off(p.dout.gs, h, p.dout.per_group, D)) * 2;
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * 2;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * 2;
  const std::int64_t krs = p.k.rs * 2, vrs = p.v.rs * 2;
  const int r0 = t0 + wg * 64, last = min(r0 + 63, qend - 1), lastc = min(t0 + BM - 1, qend - 1);
  const int wgmax = last >= r0 ? visible(p, klen, last) : 0;
  const int wgmin = r0 + 63 < qend ? visible(p, klen, r0) : 0;
  const int nblk = ((lastc >= t0 ? visible(p, klen, lastc) : 0) + kKB - 1) / kKB;
  const int myrow = r0 + wq * 16 + (lane >> 2);
  int nk[2];
  float lse[2], dl[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int t = myrow + hf * 8;
    nk[hf] = visible(p, klen, t);
    const std::int64_t at = (static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + (t < p.seq_q ? t : 0);
    lse[hf] = nk[hf] ? p.lse2[at] : INFINITY;
    dl[hf] = nk[hf] ? p.delta[at] : 0.0f;
  }
#pragma unroll
  for (int w = 0; w < NWG; ++w) {
    load_tile_w<64, D, NT>(sQ + w * TILE, qb, p.q.rs * 2, t0 + w * 64, qend, tid);
    load_tile_w<64, D, NT>(sO + w * TILE, ob, p.dout.rs * 2, t0 + w * 64, qend, tid);
  }
  if (nblk > 0) {
    load_tile_w<64, D, NT>(sK, kb, krs, 0, klen, tid);
    load_tile_w<64, D, NT>(sV, vb, vrs, 0, klen, tid);
  }
  cp_commit();
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  const std::uint32_t qt = sQ + wg * TILE, ot = sO + wg * TILE;
  for (int n = 0; n < nblk; ++n) {  // K, V in STAGES buffers, as forward_wg_kernel
    const int buf = n % STAGES, j0 = n * kKB;
    if (n + 1 < nblk) {
      const int nb = (n + 1) % STAGES;
      load_tile_w<64, D, NT>(sK + nb * TILE, kb, krs, j0 + kKB, klen, tid);
      load_tile_w<64, D, NT>(sV + nb * TILE, vb, vrs, j0 + kKB, klen, tid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (j0 < wgmax) {
      const std::uint32_t kt = sK + buf * TILE, vt = sV + buf * TILE;
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = dp[i] = 0.0f;
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const std::uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
        wgmma_ss64<F16>(s, desc_k(qt + off), desc_k(kt + off));
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const std::uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
        wgmma_ss64<F16>(dp, desc_k(ot + off), desc_k(vt + off));
      }
      wg_commit();
      wg_wait0();
      keep(s);
      keep(dp);
      const bool part = j0 + kKB > wgmin;
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int hf = i >> 1, col = c * 8 + 2 * (lane & 3) + (i & 1);
          const bool vis = !part || j0 + col < nk[hf];
          const float pr = vis ? ex2(fmaf(s[4 * c + i], p.scale_log2, -lse[hf])) : 0.0f;
          dp[4 * c + i] = vis ? pr * (dp[4 * c + i] - dl[hf]) : 0.0f;
        }
      std::uint32_t da[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) da[kk][i] = pack<F16>(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
      keep(dq);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_rs<F16, D>(dq, da[kk], desc_mn(kt + kk * 16 * 128));
      wg_commit();
      wg_wait0();
      keep(dq);
      keep(da);
    }
    if constexpr (STAGES == 2) __syncthreads();
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int t = myrow + hf * 8;
    if (t >= p.seq_q) continue;
    const std::int64_t row =
        (static_cast<std::int64_t>(b) * p.seq_q + t) * p.dq.rs + head_off(p.dq.gs, h, p.dq.per_group, D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int e = i * 8 + 2 * (lane & 3);
      store2(p.dq, row + e, dq[4 * i + 2 * hf] * p.scale + 0.0f, dq[4 * i + 2 * hf + 1] * p.scale + 0.0f);
    }
  }
}

template <bool F16, int D, int NWG>
__global__ void __launch_bounds__(NWG * 128, 1) dkdv_wg_kernel(Params p) {
  constexpr int NT = NWG * 128, BN = NWG * 64, TILE = 64 * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sK = align1024(smem), sV = sK + NWG * TILE, sQ = sV + NWG * TILE, sO = sQ + 2 * TILE;
  float* f_lse = reinterpret_cast<float*>(smem + (sO + 2 * TILE - smem_u32(smem)));  // [2][kQB]
  float* f_d = f_lse + 2 * kQB;                                                      // [2][kQB]
  int* f_nk = reinterpret_cast<int*>(f_d + 2 * kQB);                                 // [2][kQB]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
  const int b = blockIdx.x / p.kv_heads, g = blockIdx.x % p.kv_heads;
  const int j0 = blockIdx.y * BN;
  const int klen = key_len(p, b), qend = query_end(p, klen);
  const char* kb = static_cast<const char*>(p.k.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.k.rs + head_off(p.k.gs, g, 1, D)) * 2;
  const char* vb = static_cast<const char*>(p.v.p) +
                   (static_cast<std::int64_t>(b) * p.seq_k * p.v.rs + head_off(p.v.gs, g, 1, D)) * 2;
  int qlo = 0;
  if (p.causal) qlo = max(0, j0 - p.q_offset);
  const int qb0 = j0 < klen ? qlo / kQB : 0;
  const int qb1 = j0 < klen && qlo < qend ? (qend + kQB - 1) / kQB : qb0;
  const int per_head = qb1 - qb0, total = per_head * p.group;

  auto issue = [&](int it, int buf) {
    const int h = g * p.group + it / per_head, t0 = (qb0 + it % per_head) * kQB;
    const char* qb = static_cast<const char*>(p.q.p) +
                     (static_cast<std::int64_t>(b) * p.seq_q * p.q.rs + head_off(p.q.gs, h, p.q.per_group, D)) * 2;
    const char* ob = static_cast<const char*>(p.dout.p) +
                     (static_cast<std::int64_t>(b) * p.seq_q * p.dout.rs + head_off(p.dout.gs, h, p.dout.per_group, D)) * 2;
    load_tile_w<kQB, D, NT>(sQ + buf * TILE, qb, p.q.rs * 2, t0, qend, tid);
    load_tile_w<kQB, D, NT>(sO + buf * TILE, ob, p.dout.rs * 2, t0, qend, tid);
    for (int i = tid; i < kQB; i += NT) {
      const int t = t0 + i, n = visible(p, klen, t);
      const std::int64_t at = (static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + (t < p.seq_q ? t : 0);
      f_nk[buf * kQB + i] = n;
      f_lse[buf * kQB + i] = n ? p.lse2[at] : INFINITY;
      f_d[buf * kQB + i] = n ? p.delta[at] : 0.0f;
    }
  };
#pragma unroll
  for (int w = 0; w < NWG; ++w) {
    load_tile_w<64, D, NT>(sK + w * TILE, kb, p.k.rs * 2, j0 + w * 64, klen, tid);
    load_tile_w<64, D, NT>(sV + w * TILE, vb, p.v.rs * 2, j0 + w * 64, klen, tid);
  }
  if (total > 0) issue(0, 0);
  cp_commit();

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;
  const int key0 = j0 + wg * 64 + wq * 16 + (lane >> 2);  // and key0 + 8
  const std::uint32_t kt = sK + wg * TILE, vt = sV + wg * TILE;

  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    if (it + 1 < total) {
      issue(it + 1, buf ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const std::uint32_t qt = sQ + buf * TILE, ot = sO + buf * TILE;
    const int tq0 = (qb0 + it % per_head) * kQB;
    const bool full = tq0 + kQB <= qend && visible(p, klen, tq0) >= j0 + BN;
    const float* lse = f_lse + buf * kQB;
    const float* dl = f_d + buf * kQB;
    const int* nkq = f_nk + buf * kQB;
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = dp[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
      wgmma_ss64<F16>(s, desc_k(kt + off), desc_k(qt + off));
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;
      wgmma_ss64<F16>(dp, desc_k(vt + off), desc_k(ot + off));
    }
    wg_commit();
    wg_wait0();
    keep(s);
    keep(dp);
    // Pᵀ and dSᵀ (rows keys, columns queries), masked by select.
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = c * 8 + 2 * (lane & 3) + (i & 1);
        const bool vis = full || key0 + (i >> 1) * 8 < nkq[col];
        const float pr = vis ? ex2(fmaf(s[4 * c + i], p.scale_log2, -lse[col])) : 0.0f;
        s[4 * c + i] = pr;
        dp[4 * c + i] = pr * (dp[4 * c + i] - dl[col]);  // p = 0 where invisible, D finite
      }
    std::uint32_t pa[4][4], da[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pa[kk][i] = pack<F16>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
        da[kk][i] = pack<F16>(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
      }
    keep(dv);
    keep(dk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<F16, D>(dv, pa[kk], desc_mn(ot + kk * 16 * 128));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<F16, D>(dk, da[kk], desc_mn(qt + kk * 16 * 128));
    wg_commit();
    wg_wait0();
    keep(dv);
    keep(dk);
    keep(pa);
    keep(da);
    __syncthreads();
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int j = key0 + hf * 8;
    if (j >= p.seq_k) continue;
    const std::int64_t rk = (static_cast<std::int64_t>(b) * p.seq_k + j) * p.dk.rs + head_off(p.dk.gs, g, 1, D);
    const std::int64_t rv = (static_cast<std::int64_t>(b) * p.seq_k + j) * p.dv.rs + head_off(p.dv.gs, g, 1, D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int e = i * 8 + 2 * (lane & 3);
      store2(p.dk, rk + e, dk[4 * i + 2 * hf] * p.scale + 0.0f, dk[4 * i + 2 * hf + 1] * p.scale + 0.0f);
      store2(p.dv, rv + e, dv[4 * i + 2 * hf] + 0.0f, dv[4 * i + 2 * hf + 1] + 0.0f);
    }
  }
}

// ---- host side --------------------------------------------------------------------------------

// Variants (warps, rows a warp) chosen per head size; attention_tc_set_variant overrides (bench).
int g_fwd_nw = 0, g_fwd_mt = 0, g_bwd_nw = 0, g_bwd_phases = 3;

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

std::string check_operand(const char* what, kernels::AttentionBuffer b, bool mma_operand, DType want) {
  if (mma_operand && b.dtype != want) {
    return std::string(what) + " is " + std::string(dtype_name(b.dtype)) + ", not " + std::string(dtype_name(want)) +
           " as q (the tensor-core operands share one 16-bit dtype)";
  }
  const std::int64_t es = dtype_size(b.dtype);
  if (!aligned16(b.data) || (b.row_stride * es) % 16 || (b.group_stride * es) % 16) {
    return std::string(what) + ": its base, row stride and group stride must be multiples of 16 bytes";
  }
  return "";
}

Params make_params(const kernels::AttentionShape& a) {
  Params p{};
  p.batch = static_cast<int>(a.batch);
  p.seq_q = static_cast<int>(a.seq_q);
  p.seq_k = static_cast<int>(a.seq_k);
  p.heads = static_cast<int>(a.heads);
  p.kv_heads = static_cast<int>(a.kv_heads);
  p.group = p.heads / p.kv_heads;
  p.q_offset = static_cast<int>(a.query_offset());
  p.causal = a.causal;
  p.scale = a.softmax_scale();
  p.scale_log2 = p.scale * kLog2e;
  return p;
}
In in_of(kernels::AttentionBuffer b, int per_group) { return {b.data, b.row_stride, b.group_stride, per_group, b.dtype}; }
Out out_of(kernels::MutableAttentionBuffer b, int per_group) {
  return {b.data, b.row_stride, b.group_stride, per_group, b.dtype};
}

void set_smem(const void* kernel, std::size_t bytes) {
  CUBESIM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <bool F16, int D, int NW, int MT>
void launch_forward(const Params& p, cudaStream_t st) {
  constexpr int BM = NW * MT * 16;
  const std::size_t smem = static_cast<std::size_t>(BM * D * 2 + 4 * kKB * D * 2 + 16);
  auto* k = forward_kernel<F16, D, NW, MT>;
  set_smem(reinterpret_cast<const void*>(k), smem);
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq_q + BM - 1) / BM));
  k<<<grid, NW * 32, smem, st>>>(p);
  CUBESIM_CUDA_CHECK_LAUNCH("attention tc forward_kernel");
}

template <bool F16, int D, int NWG, int STAGES>
void launch_forward_wg(const Params& p, cudaStream_t st) {
  constexpr int BM = NWG * 64;
  const std::size_t smem = static_cast<std::size_t>((NWG + 2 * STAGES) * 64 * D * 2 + 1024);
  auto* k = forward_wg_kernel<F16, D, NWG, STAGES>;
  set_smem(reinterpret_cast<const void*>(k), smem);
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq_q + BM - 1) / BM));
  k<<<grid, NWG * 128, smem, st>>>(p);
  CUBESIM_CUDA_CHECK_LAUNCH("attention tc forward_wg_kernel");
}

template <bool F16, int D, int NWG>
void launch_forward_wgp(const Params& p, cudaStream_t st) {
  constexpr int BM = NWG * 64;
  const std::size_t smem = static_cast<std::size_t>((NWG + 6) * 64 * D * 2 + 1024);
  auto* k = forward_wgp_kernel<F16, D, NWG>;
  set_smem(reinterpret_cast<const void*>(k), smem);
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq_q + BM - 1) / BM));
  k<<<grid, NWG * 128, smem, st>>>(p);
  CUBESIM_CUDA_CHECK_LAUNCH("attention tc forward_wgp_kernel");
}

template <bool F16, int D>
void forward_d(const Params& p, cudaStream_t st) {
  // wgmma with the next S issued before the softmax: fwd_rows16 5 with 8 or 12 warps.
  if (g_fwd_mt == 5) {
    if (g_fwd_nw == 12) return launch_forward_wgp<F16, D, 3>(p, st);
    return launch_forward_wgp<F16, D, 2>(p, st);
  }
  // wgmma (64 rows a warpgroup; the default, 3 warpgroups): fwd_rows16 4 with 8 or 12 warps.
  if (g_fwd_mt == 4 || g_fwd_mt == 0) {
    if (g_fwd_nw == 8) return launch_forward_wg<F16, D, 2, 3>(p, st);
    if (g_fwd_nw == 13) return launch_forward_wg<F16, D, 3, 2>(p, st);  // two stages (A/B)
    return launch_forward_wg<F16, D, 3, 3>(p, st);
  }
  // Defaults: 8 warps x 16 rows at head_dim 128 (4 x 32 spills there), 4 warps x 32 rows at 64.
  const int nw = g_fwd_nw ? g_fwd_nw : (D == 128 ? 8 : 4), mt = g_fwd_mt ? g_fwd_mt : (D == 128 ? 1 : 2);
  if (nw == 8 && mt == 1) return launch_forward<F16, D, 8, 1>(p, st);
  if (nw == 4 && mt == 1) return launch_forward<F16, D, 4, 1>(p, st);
  return launch_forward<F16, D, 4, 2>(p, st);
}

template <bool F16, int D, int NW>
void launch_backward(const Params& p, cudaStream_t st) {
  if (g_bwd_phases & 1) {
    constexpr int BM = NW * 16;
    const std::size_t smem = static_cast<std::size_t>(2 * BM * D * 2 + 4 * kKB * D * 2 + 16);
    auto* k = dq_kernel<F16, D, NW>;
    set_smem(reinterpret_cast<const void*>(k), smem);
    const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq_q + BM - 1) / BM));
    k<<<grid, NW * 32, smem, st>>>(p);
    CUBESIM_CUDA_CHECK_LAUNCH("attention tc dq_kernel");
  }
  if (g_bwd_phases & 2) {
    constexpr int BN = NW * 16;
    const std::size_t smem = static_cast<std::size_t>(2 * BN * D * 2 + 4 * kQB * D * 2 + 6 * kQB * 4);
    auto* k = dkdv_kernel<F16, D, NW>;
    set_smem(reinterpret_cast<const void*>(k), smem);
    const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>((p.seq_k + BN - 1) / BN));
    k<<<grid, NW * 32, smem, st>>>(p);
    CUBESIM_CUDA_CHECK_LAUNCH("attention tc dkdv_kernel");
  }
}

template <bool F16, int D, int NWG_DKDV>
void launch_backward_wg(const Params& p, cudaStream_t st) {
  constexpr int TILE = 64 * D * 2;
  if (g_bwd_phases & 1) {
    constexpr int NWG = 2, BM = NWG * 64, STAGES = 3;
    const std::size_t smem = static_cast<std::size_t>((2 * NWG + 2 * STAGES) * TILE + 1024);
    auto* k = dq_wg_kernel<F16, D, NWG, STAGES>;
    set_smem(reinterpret_cast<const void*>(k), smem);
    const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq_q + BM - 1) / BM));
    k<<<grid, NWG * 128, smem, st>>>(p);
    CUBESIM_CUDA_CHECK_LAUNCH("attention tc dq_wg_kernel");
  }
  if (g_bwd_phases & 2) {
    constexpr int NWG = NWG_DKDV, BN = NWG * 64;
    const std::size_t smem = static_cast<std::size_t>((2 * NWG + 4) * TILE + 1024 + 6 * kQB * 4);
    auto* k = dkdv_wg_kernel<F16, D, NWG>;
    set_smem(reinterpret_cast<const void*>(k), smem);
    const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>((p.seq_k + BN - 1) / BN));
    k<<<grid, NWG * 128, smem, st>>>(p);
    CUBESIM_CUDA_CHECK_LAUNCH("attention tc dkdv_wg_kernel");
  }
}

template <bool F16, int D>
void backward_d(const Params& p, cudaStream_t st) {
  // wgmma (the default): bwd_warps 0, 1 or 2 (warpgroups a dK/dV tile); mma.sync: 4 or 8 warps.
  if (g_bwd_nw == 2) return launch_backward_wg<F16, D, 2>(p, st);
  if (g_bwd_nw == 0 || g_bwd_nw == 1) return launch_backward_wg<F16, D, 1>(p, st);
  const int nw = g_bwd_nw;
  if (nw == 8) return launch_backward<F16, D, 8>(p, st);
  return launch_backward<F16, D, 4>(p, st);
}

}  // namespace

void attention_tc_set_variant(int fwd_warps, int fwd_rows16, int bwd_warps, int bwd_phases) {
  g_fwd_nw = fwd_warps;
  g_fwd_mt = fwd_rows16;
  g_bwd_nw = bwd_warps;
  g_bwd_phases = bwd_phases;
}

std::string attention_tc_unsupported(const kernels::AttentionShape& s, kernels::AttentionBuffer q,
                                     kernels::AttentionBuffer k, kernels::AttentionBuffer v,
                                     kernels::AttentionBuffer out) {
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim " + std::to_string(s.head_dim) + " is not 64 or 128";
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) {
    return "q is " + std::string(dtype_name(q.dtype)) + ", not bf16 or f16";
  }
  const std::int64_t big = std::int64_t{1} << 31;
  if (s.batch * s.seq_q * s.heads >= big || s.batch * s.seq_k >= big) return "more than 2^31 rows";
  const std::tuple<const char*, kernels::AttentionBuffer, bool> ops[] = {
      {"q", q, true}, {"k", k, true}, {"v", v, true}, {"out", out, false}};
  for (const auto& [what, b, mma_op] : ops) {
    if (std::string why = check_operand(what, b, mma_op, q.dtype); !why.empty()) return why;
  }
  return "";
}

std::string attention_tc_backward_unsupported(const kernels::AttentionShape& s, kernels::AttentionBuffer q,
                                              kernels::AttentionBuffer k, kernels::AttentionBuffer v,
                                              kernels::AttentionBuffer out, kernels::AttentionBuffer dout,
                                              kernels::AttentionBuffer dq, kernels::AttentionBuffer dk,
                                              kernels::AttentionBuffer dv) {
  std::string why = attention_tc_unsupported(s, q, k, v, out);
  const std::tuple<const char*, kernels::AttentionBuffer, bool> grads[] = {
      {"dout", dout, true}, {"dq", dq, false}, {"dk", dk, false}, {"dv", dv, false}};
  for (const auto& [what, b, mma_op] : grads) {
    if (why.empty()) why = check_operand(what, b, mma_op, q.dtype);
  }
  return why;
}

std::size_t attention_tc_backward_workspace_bytes(const kernels::AttentionShape& s) {
  return 2 * sizeof(float) * static_cast<std::size_t>(s.batch * s.seq_q * s.heads);
}

void attention_forward_tc(const kernels::AttentionShape& a, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                          kernels::AttentionBuffer v, kernels::MutableAttentionBuffer out, float* stats,
                          const std::int64_t* kv_valid, cudaStream_t stream) {
  a.validate();
  const int G = static_cast<int>(a.heads / a.kv_heads);
  kernels::check_attention_buffer("q", q, a.heads, G, a.head_dim);
  kernels::check_attention_buffer("k", k, a.kv_heads, 1, a.head_dim);
  kernels::check_attention_buffer("v", v, a.kv_heads, 1, a.head_dim);
  kernels::check_attention_buffer("out", out, a.heads, G, a.head_dim);
  if (std::string why = attention_tc_unsupported(a, q, k, v, out); !why.empty()) {
    throw std::invalid_argument("attention (cuda tensor_core): " + why);
  }
  if (stats == nullptr) throw std::invalid_argument("attention (cuda tensor_core): stats is null");
  if (a.batch * a.seq_q == 0) return;
  Params p = make_params(a);
  p.q = in_of(q, G);
  p.k = in_of(k, 1);
  p.v = in_of(v, 1);
  p.o = out_of(out, G);
  p.stats = stats;
  p.kv_valid = kv_valid;
  const bool f16 = q.dtype == DType::f16;
  if (a.head_dim == 64) {
    f16 ? forward_d<true, 64>(p, stream) : forward_d<false, 64>(p, stream);
  } else {
    f16 ? forward_d<true, 128>(p, stream) : forward_d<false, 128>(p, stream);
  }
}

void attention_backward_tc(const kernels::AttentionShape& a, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                           kernels::AttentionBuffer v, kernels::AttentionBuffer out, const float* stats,
                           kernels::AttentionBuffer dout, kernels::MutableAttentionBuffer dq,
                           kernels::MutableAttentionBuffer dk, kernels::MutableAttentionBuffer dv,
                           const std::int64_t* kv_valid, void* workspace, cudaStream_t stream) {
  a.validate();
  const int G = static_cast<int>(a.heads / a.kv_heads);
  const std::pair<const char*, kernels::AttentionBuffer> qs[] = {{"q", q}, {"out", out}, {"dout", dout}, {"dq", dq}};
  for (const auto& [what, b] : qs) kernels::check_attention_buffer(what, b, a.heads, G, a.head_dim);
  const std::pair<const char*, kernels::AttentionBuffer> ks[] = {{"k", k}, {"v", v}, {"dk", dk}, {"dv", dv}};
  for (const auto& [what, b] : ks) kernels::check_attention_buffer(what, b, a.kv_heads, 1, a.head_dim);
  const std::string why = attention_tc_backward_unsupported(a, q, k, v, out, dout, dq, dk, dv);
  if (!why.empty()) throw std::invalid_argument("attention backward (cuda tensor_core): " + why);
  if (stats == nullptr || workspace == nullptr) {
    throw std::invalid_argument("attention backward (cuda tensor_core): stats and workspace must be device memory");
  }
  if (a.batch * (a.seq_q + a.seq_k) == 0) return;
  Params p = make_params(a);
  p.q = in_of(q, G);
  p.k = in_of(k, 1);
  p.v = in_of(v, 1);
  p.o_in = in_of(out, G);
  p.dout = in_of(dout, G);
  p.dq = out_of(dq, G);
  p.dk = out_of(dk, 1);
  p.dv = out_of(dv, 1);
  p.stats = const_cast<float*>(stats);
  p.kv_valid = kv_valid;
  const std::size_t rows = static_cast<std::size_t>(a.batch * a.seq_q * a.heads);
  p.lse2_w = static_cast<float*>(workspace);
  p.delta_w = p.lse2_w + rows;
  p.lse2 = p.lse2_w;
  p.delta = p.delta_w;
  if (rows > 0) {
    const unsigned blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
    if (a.head_dim == 64) {
      prep_kernel<64><<<blocks, 256, 0, stream>>>(p);
    } else {
      prep_kernel<128><<<blocks, 256, 0, stream>>>(p);
    }
    CUBESIM_CUDA_CHECK_LAUNCH("attention tc prep_kernel");
  }
  const bool f16 = q.dtype == DType::f16;
  if (a.head_dim == 64) {
    f16 ? backward_d<true, 64>(p, stream) : backward_d<false, 64>(p, stream);
  } else {
    f16 ? backward_d<true, 128>(p, stream) : backward_d<false, 128>(p, stream);
  }
}

}  // namespace cubesim::cuda
