// vocab.h — the vocabulary's kernels, for a slice [vocab_start, vocab_start + rows) of it as Megatron's
// vocab-parallel layers hold one: embedding lookup and its gradient, and the pieces of the
// vocab-parallel cross-entropy (a rank's partial results, combined across ranks by all-reduces).
//
//   embedding_forward(w, 1000, 0, ids, tokens, hidden, out);              // out[t] = w[ids[t]] or 0
//   cross_entropy_max(logits, tokens, vocab, m);                          // then all-reduce max
//   cross_entropy_partials(logits, tokens, vocab, m, targets, 0, part);   // then all-reduce sum
//   loss[t] = cross_entropy_loss(part[2t], m[t], part[2t + 1]);
//   cross_entropy_backward(logits, tokens, vocab, m, part, targets, 0, dloss, dlogits);
//
// The order (arithmetic as kernels/elementwise.h's det_* operations):
//   embedding      out[t] = w[ids[t] - start] when that row is in the slice, else +0 (all-reduced over
//                  the slices: exactly one adds a non-zero row); dw[v] = Σ_t dy[t] over the tokens t
//                  with ids[t] = start + v, t ascending from +0 in f32, rounded once.
//   cross-entropy  m = max_j x_j; S = Σ_j det_exp(x_j − m) (j ascending from +0); x_target (the target's
//                  logit, +0 where the target is not in the slice); loss = log S − (x_target − m);
//                  dx_j = (det_exp(x_j − m) / S − [j = target]) · dloss.
// Logits are f32, bf16 or f16 (widened exactly); m, S and x_target are f32.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/norm.h"

namespace cubesim::kernels {

void embedding_forward(NormBuffer weight, std::int64_t rows, std::int64_t vocab_start, const std::int64_t* ids,
                       std::int64_t tokens, std::int64_t hidden, MutableNormBuffer out);
void embedding_backward(NormBuffer dy, const std::int64_t* ids, std::int64_t tokens, std::int64_t hidden,
                        std::int64_t rows, std::int64_t vocab_start, MutableNormBuffer dweight);

void cross_entropy_max(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, float* max);
// partials[2t] = S (the sum of exponentials), partials[2t + 1] = the target's logit or +0.
void cross_entropy_partials(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const std::int64_t* targets, std::int64_t vocab_start, float* partials);
float cross_entropy_loss(float sum_exp, float max, float target_logit);
void cross_entropy_backward(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const float* partials, const std::int64_t* targets, std::int64_t vocab_start,
                            const float* dloss, MutableNormBuffer dlogits);

}  // namespace cubesim::kernels
