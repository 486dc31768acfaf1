// ops.h — compute on tensors, on any backend, under the numerics contract.
//
// Values are computed by the kernels (det_gemm, elementwise) on host copies of the operands, so
// every backend that computes on the host gives the same bits; the backend then charges the
// simulated time (the host charges nothing). A backend that computes where the data lives takes an
// op first through its hook (Backend::gemm, elementwise, attention, rowwise: the cuda backend's
// kernels, the same bits) and the host path runs only when it declines. Each op adds its time to the
// rank's compute timeline and, when tracing, a span on the rank's "compute" track.
//
//   matmul(x, w.t(), &b, y);           // y[M,N] = x[M,K] · wᵀ + b, w stored [N,K] (a view, no copy)
//   matmul(dy, w, nullptr, dx);        // backward, input:  dx = dy · w   (ascending n)
//   matmul(dy.t(), x, nullptr, dw);    // backward, weight: dw = dyᵀ · x  (ascending m)
//   bias_grad(dy, db);                 // db[n] = Σ_m dy[m, n], ascending m
#pragma once

#include <span>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "runtime/tensor.h"

namespace cubesim::rt {

void matmul(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name = "gemm");
void bias_grad(const Tensor& dy, const Tensor& db);
void gelu(kernels::GeluKind k, const Tensor& x, const Tensor& y);                          // y = gelu(x)
void gelu_backward(kernels::GeluKind k, const Tensor& x, const Tensor& dy, const Tensor& dx);
void add_bias(const Tensor& x, const Tensor& bias, const Tensor& y);                       // y = x + bias (per column)
// pre = x + bias (per column; pre may be x), y = gelu(pre): add_bias then gelu, bit for bit, in one
// pass where the backend fuses them (Megatron's bias-GELU): x is read once, pre and y written once.
void bias_gelu(kernels::GeluKind k, const Tensor& x, const Tensor& bias, const Tensor& pre, const Tensor& y);
void add(const Tensor& a, const Tensor& b, const Tensor& y);                               // y = a + b
void copy(const Tensor& src, const Tensor& dst);                                           // same shape and dtype
// SwiGLU on interleaved pairs (kernels/elementwise.h): x [rows, 2f] holds (gate, up) in columns
// (2i, 2i + 1); y [rows, f] = silu(gate)·up; the backward writes dx [rows, 2f] in the same layout.
void swiglu(const Tensor& x, const Tensor& y);
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

// Attention (kernels/attention.h) on 2-D tensors of tokens x (heads x head_dim) as its layout says:
// q, out, dq, dout [batch x seq_q, heads x head_dim]; k, v, dk, dv [batch x seq_k, kv_heads x head_dim];
// rows may be strided (column slices of a fused QKV output), columns contiguous. stats: f32
// [batch x seq_q, 2 x heads], written by the forward for the backward.
void attention(const kernels::AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               const Tensor& stats);
void attention_backward(const kernels::AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& stats, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv);
// Self-attention on Megatron's fused QKV projection output, read in place: qkv [batch x seq,
// kv_heads x (G + 2) x head_dim], per query group its G = heads / kv_heads query heads, then its key
// head, then its value head (seq_q = seq_k = seq). The backward writes dqkv in the same layout: the
// QKV projection's output gradient.
// kv_valid (optional): per sequence, how many of its tokens are real (right padding, kernels/attention.h:
// padding keys are skipped, padding queries give zero rows and gradients).
void attention_qkv(const kernels::AttentionShape& s, const Tensor& qkv, const Tensor& out, const Tensor& stats,
                   std::span<const std::int64_t> kv_valid = {});
void attention_qkv_backward(const kernels::AttentionShape& s, const Tensor& qkv, const Tensor& out,
                            const Tensor& stats, const Tensor& dout, const Tensor& dqkv,
                            std::span<const std::int64_t> kv_valid = {});
// The vocabulary (kernels/vocab.h) on a rank's slice [vocab_start, vocab_start + rows) of it; ids
// and targets are host token ids, one per row of the activations. embedding: weight [rows, hidden],
// out [tokens, hidden] (zero rows for ids outside the slice); embedding_backward writes dweight.
// Cross-entropy pieces on logits [tokens, slice]: max and loss f32 [tokens], partials f32
// [tokens, 2] (sum of exponentials, the target's logit), dloss f32 [tokens].
void embedding(const Tensor& weight, std::int64_t vocab_start, std::span<const std::int64_t> ids, const Tensor& out);
void embedding_backward(const Tensor& dy, std::span<const std::int64_t> ids, std::int64_t vocab_start,
                        const Tensor& dweight);
void cross_entropy_max(const Tensor& logits, const Tensor& max);
void cross_entropy_partials(const Tensor& logits, const Tensor& max, std::span<const std::int64_t> targets,
                            std::int64_t vocab_start, const Tensor& partials);
void cross_entropy_loss(const Tensor& partials, const Tensor& max, const Tensor& loss);
void cross_entropy_backward(const Tensor& logits, const Tensor& max, const Tensor& partials,
                            std::span<const std::int64_t> targets, std::int64_t vocab_start, const Tensor& dloss,
                            const Tensor& dlogits);

// Rotary position embeddings (kernels/rotary.h) in place on the query and key heads of a fused QKV
// (attention_qkv's layout); inverse: the backward, on its gradient.
void rotary_qkv(const kernels::AttentionShape& s, const Tensor& qkv, double base, bool inverse);
// RMSNorm and LayerNorm over the last dimension (kernels/norm.h): x, y, dy, dx [rows, n]; weight,
// bias and their gradients [n]; mean and rstd f32 [rows], written by the forward for the backward.
void rms_norm(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd, float eps);
void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
                const Tensor& rstd, float eps);
void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

}  // namespace cubesim::rt
