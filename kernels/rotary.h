// rotary.h — rotary position embeddings (RoPE, Su et al. 2021; Megatron's non-interleaved form, as
// GPT-NeoX and Llama), applied in place to the query and key heads of a fused QKV row.
//
//   RotaryTable t = rotary_table(seq, head_dim, 10000.0);       // cos, sin [seq, head_dim / 2]
//   rotary_apply(s, q_buffer, s.heads, group, t, false);        // in place, rows of batch x seq tokens
//
// Element e < head_dim/2 of a head pairs with e + head_dim/2: at position p, angle p·base^(-2e/head_dim),
//   forward    y1 = fma(x1, cos, -x2·sin),  y2 = fma(x2, cos, x1·sin)
//   inverse    x1 = fma(y1, cos, y2·sin),   x2 = fma(y2, cos, -y1·sin)    (the backward: the transpose)
// in f32 (det_* operations), rounded once to the buffer's dtype. The table is data: cos and sin
// computed in f64 and rounded to f32 on the host, the same values for every backend, so the bits
// agree wherever the arithmetic above runs. Positions are the token's index in its sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace cubesim::kernels {

struct RotaryTable {
  std::int64_t positions = 0, half = 0;  // half = head_dim / 2
  std::vector<float> cos, sin;           // [positions][half]
};

// Throws std::invalid_argument for an odd or non-positive head_dim, positions < 1 or base <= 1.
RotaryTable rotary_table(std::int64_t positions, std::int64_t head_dim, double base = 10000.0);

// Rotates `heads` heads of every row of `b` (rows = s.batch x s.seq_q, per_group heads to a query
// group in b's layout: AttentionBuffer's group_stride) in place; inverse: the backward.
void rotary_apply(const AttentionShape& s, MutableAttentionBuffer b, std::int64_t heads, std::int64_t per_group,
                  const RotaryTable& t, bool inverse);

}  // namespace cubesim::kernels
