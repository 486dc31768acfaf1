// attention.h — deterministic, batch-invariant scaled dot-product attention, forward and backward.
//
// softmax(Q·Kᵀ·scale, causal) · V for every (sequence, head), with grouped-query attention (a group
// of heads / kv_heads query heads shares one key and value head), under a contract as det_gemm's:
// the order of every sum is fixed by the sequence's own data, never by the batch, the chunking of the
// queries, the padding of the keys or the backend. The host functions here are the definition; a
// backend that claims the exact mode computes these bits.
//
//   AttentionShape s{.batch = 2, .seq_q = 128, .seq_k = 128, .heads = 8, .kv_heads = 2, .head_dim = 64};
//   attention_forward(s, q, k, v, o, stats);          // AttentionBuffer views; stats: f32 [tokens, heads, 2]
//   attention_backward(s, q, k, v, o, stats, dout, dq, dk, dv);
//
// Layout: element (b, t, h, e) of a buffer is data[(b * seq + t) * row_stride + h * head_dim + e]:
// tokens in sequence order, one row per token, heads side by side (Q, O, dQ, dO: `heads`; K, V, dK,
// dV: `kv_heads`), so Q, K and V may be column slices of one fused QKV row. Inputs f32, bf16 or
// f16 (widened exactly); outputs rounded once to nearest even to their dtype.
//
// The contract (arithmetic is det_add/det_mul/det_fma/det_div/det_exp, kernels/elementwise.h):
// - Visible keys of query row t (position pos = q_offset + t): j < kv_valid[b] (all seq_k without
//   kv_valid), and j <= pos when causal. Invisible keys are skipped, as if absent: padding keys may
//   hold anything, even NaN. kv_valid describes right padding of self-attention: a query at a
//   position >= kv_valid[b] is padding too and sees no key. A row that sees no key gives 0 (stats
//   m = -inf, l = 0) and, in the backward, a zero dQ row and nothing to dK and dV.
// - Score s_j = det_mul(dot(q, k_j), scale), dot = fma over e ascending from +0.
// - Forward, online softmax over key blocks of kAttentionKeyBlock keys from key 0 (the same blocks
//   whatever the query rows or the batch): m, l, acc[e] start at -inf, 0, +0; per block,
//     m' = max(m, max of the block's visible s_j);  c = m == -inf ? 0 : det_exp(m - m')
//     l = l·c;  acc[e] = acc[e]·c;  then for each visible j ascending:
//       p = det_exp(s_j - m');  l = l + p;  acc[e] = fma(p, v_j[e], acc[e])
//     m = m'
//   out[e] = acc[e] / l. The statistics (m, l) are kept per (token, head) for the backward.
// - Backward, with D = dot(dO, O) (fma over e ascending, O as stored), for every visible (t, j):
//     p = det_exp(s_j - m) / l;  dp = dot(dO_t, v_j);  ds = p · (dp - D)
//   dQ_t[e] = scale · Σ_j ds·k_j[e]             (j ascending)
//   dK_j[e] = scale · Σ_(h, t) ds·q_t[e]        (the group's heads ascending, then t ascending)
//   dV_j[e] = Σ_(h, t) p·dO_t[e]                (same order)
//   each sum by fma from +0, the scale applied once at the end.
// Consequences the tests pin (tests/kernels/attention_cases.h): a sequence's outputs are bitwise the
// same alone or in any batch, at any batch position, with padding keys of any value, and its queries
// computed in chunks (chunked prefill, q_offset) equal the whole; the backward is the same for a
// sequence alone or in a batch.
// A faster mode with its own numerics (the GPU's tensor cores, within tolerance of f64, still
// batch-invariant and deterministic) is attention_tc.h.
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "kernels/elementwise.h"  // CUBESIM_HD

namespace cubesim::kernels {

inline constexpr std::int64_t kAttentionKeyBlock = 64;

struct AttentionShape {
  std::int64_t batch = 1;
  std::int64_t seq_q = 0;  // query rows per sequence
  std::int64_t seq_k = 0;  // key (and value) rows per sequence
  std::int64_t heads = 1;
  std::int64_t kv_heads = 1;  // divides heads (heads / kv_heads query heads per group)
  std::int64_t head_dim = 0;
  bool causal = true;
  std::int64_t q_offset = -1;  // position of query row 0 among the keys; -1: seq_k - seq_q
  float scale = 0;             // 0: 1 / sqrt(head_dim), rounded to f32

  std::int64_t query_offset() const { return q_offset < 0 ? seq_k - seq_q : q_offset; }
  float softmax_scale() const;
  // Throws std::invalid_argument naming the field and what would be valid.
  void validate() const;
};

// One operand: rows of `row_stride` elements of `dtype` (see the layout above). With group_stride,
// a query group's heads start group_stride elements after the previous group's (Megatron's fused
// QKV row: per group its heads/kv_heads query heads, then its key head, then its value head, so
// q, k and v point at columns 0, G·head_dim and (G+1)·head_dim of a row with group_stride
// (G+2)·head_dim, G = heads / kv_heads).
struct AttentionBuffer {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t row_stride = 0;    // elements between consecutive tokens (>= heads * head_dim)
  std::int64_t group_stride = 0;  // 0: heads side by side
};
struct MutableAttentionBuffer {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t row_stride = 0;
  std::int64_t group_stride = 0;
  operator AttentionBuffer() const { return {data, dtype, row_stride, group_stride}; }
};

// Head h's first element in a token's row (per_group heads to a query group in this operand: q-like
// heads / kv_heads, k-like 1): side by side without group_stride, in query groups with it. Host and
// device code (CUDA, the simulator, rotary) all address heads through this.
CUBESIM_HD std::int64_t attention_head_offset(std::int64_t group_stride, std::int64_t h, std::int64_t per_group,
                                              std::int64_t d) {
  return group_stride ? (h / per_group) * group_stride + (h % per_group) * d : h * d;
}

// The keys [0, n) query row t of sequence b sees (position q_offset + t); a padding query (at or past
// kv_valid[b]) sees none. The contract's visibility rule, host and device.
CUBESIM_HD std::int64_t attention_visible_keys(std::int64_t seq_k, std::int64_t q_offset, bool causal, std::int64_t b,
                                               std::int64_t t, const std::int64_t* kv_valid) {
  const std::int64_t pos = q_offset + t;
  std::int64_t n = seq_k;
  if (kv_valid) {
    n = kv_valid[b] < 0 ? 0 : (kv_valid[b] > seq_k ? seq_k : kv_valid[b]);
    if (pos >= n) return 0;
  }
  if (causal && pos + 1 < n) n = pos + 1;
  return n < 0 ? 0 : n;
}

// Throws std::invalid_argument naming `what` for a null buffer, a negative or too small group_stride,
// or a row_stride shorter than its heads' extent (every backend checks its buffers with it).
void check_attention_buffer(const char* what, AttentionBuffer b, std::int64_t heads, std::int64_t per_group,
                            std::int64_t d);

// kv_valid: per sequence, how many of its keys are real (the rest padding); null: all seq_k.
// stats: f32, 2 per (token, head): stats[((b * seq_q + t) * heads + h) * 2 + {0: m, 1: l}].
void attention_forward(const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                       MutableAttentionBuffer out, float* stats, const std::int64_t* kv_valid = nullptr);

void attention_backward(const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                        AttentionBuffer out, const float* stats, AttentionBuffer dout, MutableAttentionBuffer dq,
                        MutableAttentionBuffer dk, MutableAttentionBuffer dv, const std::int64_t* kv_valid = nullptr);

// Arithmetic of one forward without padding, for cost models: 4 x head_dim + 5 per visible score
// (the two dot products, the exponential, the max and the sum).
double attention_forward_flops(const AttentionShape& s);

}  // namespace cubesim::kernels
