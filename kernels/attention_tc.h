// attention_tc.h — the attention contract's tensor_core mode: the numerics of the GPU's fast attention
// (kernels/cuda/attention_cuda.h: attention_forward_tc, attention_backward_tc). Like det_gemm's
// tensor_core mode it is its own named mode: batch-invariant and deterministic, compared to the f64
// definition within tolerance, never passed off as the exact mode (kernels/attention.h).
//
//   if (cuda::attention_tc_unsupported(s, q, k, v, out).empty())
//     cuda::attention_forward_tc(s, q, k, v, out, stats, kv_valid, stream);
//
// Same shapes, layout, visibility rule (causal, kv_valid right padding, q_offset), grouped-query heads
// and group_stride as attention.h. What it takes: head_dim 64 or 128; q, k, v (and dout) all bf16 or
// all f16; outputs (out, dq, dk, dv) f32, bf16 or f16; every buffer's base, row stride and group
// stride multiples of 16 bytes.
//
// The numerics (sums are the tensor cores' MMA, k16 steps: each step's internal order is the
// hardware's, the steps in ascending k on one f32 accumulator starting from +0; wgmma on sm_90a and
// mma.sync m16n8k16 give the same bits, pinned by a test, so the instruction and the tile shape are
// not part of the definition):
// - Scores s_j = dot(q, k_j) over the head dimension in k16 steps ascending. c = scale·log2(e)
//   rounded to f32; exponentials are ex2.approx (2^x).
// - Forward: online softmax over FIXED blocks of kAttentionTcKeyBlock = 64 keys from key 0, ascending;
//   never split over keys. Per block and row: m' = max(m, visible s_j) (invisible keys masked to
//   -inf by select); mc = (m'·scale)·log2(e); c = m' == m ? 1 : 2^(mc_old − mc);
//   p_j = 2^(s_j·c − mc) in f32; l = l·c + Σ p_j (each of the row's 4 threads sums its 16 columns
//   of the block in a fixed order, l is kept per thread and the 4 partial sums are added once at the
//   end as (l0 + l1) + (l2 + l3)); acc = acc·c + P·V where P is ROUNDED TO THE OPERAND DTYPE (bf16 or
//   f16) before the MMA, as FlashAttention does (l sums the unrounded p).
//   out = acc · (1 / l) + 0 (no negative zero); stats: m = max(s)·scale and l, as attention.h.
// - Backward, with D = Σ_e dO·O in f32 (each of 32 lanes its head_dim/32 elements ascending, then a
//   butterfly) and lse2 = m·log2(e) + log2(l) per (token, head):
//     p = 2^(s·c − lse2); dp = dot(dO_t, v_j) (k16 steps); ds = p·(dp − D)
//   dQ_t = scale · Σ_j ds·k_j over key blocks of 64 ascending (ds rounded to the operand dtype);
//   dV_j = Σ_(h, t) p·dO_t, dK_j = scale · Σ_(h, t) ds·q_t: the group's heads ascending, then query
//   blocks of 64 from query 0 ascending, p and ds rounded to the operand dtype. No atomics: one
//   kernel per key tile for dK, dV, one per query tile for dQ.
// - Blocks nobody sees are skipped; a block that some rows of a tile see and others do not is applied
//   to the others as exact zeros (p = 0, c = 1). Invisible rows and keys are zero-filled on load and
//   masked by select: padding may hold NaN or inf.
// Consequences (tests/kernels/attention_cases.h, attention_tc_cases): a sequence's outputs and
// statistics are bitwise the same alone or in any batch, at any batch position, with padding of any
// value and chunked (q_offset), and run to run; accuracy against f64 within attn_tc_tolerance.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace cubesim::kernels {

inline constexpr std::int64_t kAttentionTcKeyBlock = 64;

}  // namespace cubesim::kernels
