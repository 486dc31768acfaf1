// transformer.h — Megatron-LM's transformer layer, tensor-parallel, forward and backward: the norms,
// ParallelAttention (self-attention with grouped-query heads) and TransformerLayer (pre-norm,
// residuals, attention, ParallelMLP), written once against the runtime like layers.h.
//
//   ParallelAttention: the fused QKV projection is a ColumnParallelLinear whose master weight
//     [kv_heads x (G + 2) x head_dim, hidden] is ordered query group by query group (G = heads /
//     kv_heads query heads, then the group's key head, then its value head; Megatron's layout), so
//     rank r's rows are whole groups [r·kv_heads/tp, (r+1)·kv_heads/tp) for every tp dividing
//     kv_heads; core attention runs on the rank's heads (rt::attention_qkv, kernels/attention.h,
//     reading the projection's output in place); the output projection is a RowParallelLinear
//     (input_is_parallel) whose columns are the same heads.
//   Norm: RMSNorm or LayerNorm over hidden, the same weights on every rank; with sequence
//     parallelism each rank normalises its own tokens and the weight gradients are all-reduced over
//     the tensor-parallel group (Megatron does it before the optimizer step).
//   TransformerLayer: h = x + attention(norm1(x)); y = h + mlp(norm2(h)).
// Tokens are rows, batch-major: row b·seq + t is token t of sequence b (with sequence parallelism
// rank r holds rows [r·rows/tp, (r+1)·rows/tp) of them, and the column layers gather them first). So
// sequence parallelism needs batch x seq divisible by tp, where Megatron's [s, b, h] layout splits
// along s and needs seq divisible by tp; the layers compute the same either way. Megatron reduces
// the sequence-parallel norms' gradients in f32 main-gradient buffers; here each rank's gradient is
// rounded to the model's dtype before the all-reduce.
//
//   tp::initialize_model_parallel(2);
//   tp::TransformerLayer layer(ctx, {.hidden = 1024, .heads = 16, .kv_heads = 4, .ffn = 4096, .seq = 256});
//   rt::Tensor y = layer.forward(x);        // x [batch x 256, 1024]
//   rt::Tensor dx = layer.backward(dy);     // every weight_grad and bias_grad set
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "runtime/context.h"
#include "runtime/tensor.h"
#include "tp/layers.h"

namespace cubesim::tp {

enum class NormKind { layer_norm, rms_norm };
const char* norm_kind_name(NormKind k);       // "layer_norm", "rms_norm"
NormKind parse_norm_kind(std::string_view s);  // throws RuntimeError naming the valid kinds

struct NormOptions {
  std::int64_t hidden = 1024;
  NormKind kind = NormKind::layer_norm;
  float eps = 1e-5f;
  bool sequence_parallel = false;
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;
  std::uint64_t layer_id = 0;  // master values: weight 1 + 0.1·N(0, 1), bias 0.02·N(0, 1)
};

class Norm {
 public:
  Norm(rt::Context& ctx, NormOptions o);
  rt::Tensor forward(const rt::Tensor& x);
  rt::Tensor backward(const rt::Tensor& dy);

  NormOptions opts;
  rt::Tensor weight, bias, weight_grad, bias_grad;  // bias: LayerNorm only

 private:
  rt::Context& ctx_;
  int rank_;
  rt::Tensor input_, mean_, rstd_;
};

struct AttentionOptions {
  std::int64_t hidden = 1024;
  std::int64_t heads = 16;
  std::int64_t kv_heads = 0;  // query groups; 0: heads (multi-head attention)
  std::int64_t seq = 256;     // tokens per sequence: rows = batch x seq
  bool causal = true;
  bool bias = true;
  bool sequence_parallel = false;
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;
  std::uint64_t id_offset = 0;  // the QKV and output projections draw master weights 1 + and 2 + id_offset
  bool rotary = false;          // rotary position embeddings on the query and key heads (kernels/rotary.h)
  double rotary_base = 10000.0;

  std::int64_t query_groups() const { return kv_heads ? kv_heads : heads; }
  std::int64_t head_dim() const { return hidden / heads; }
};

// Right padding: forward(x, lengths) takes each sequence's real tokens (one length in [0, seq] per
// sequence; empty: none padded). Padding keys are never attended to and padding queries' context rows
// are 0 (kernels/attention.h's kv_valid), so a sequence's real rows are bitwise those it gives alone;
// backward uses the same lengths.
class ParallelAttention {
 public:
  ParallelAttention(rt::Context& ctx, AttentionOptions o);
  rt::Tensor forward(const rt::Tensor& x, std::span<const std::int64_t> lengths = {});
  rt::Tensor backward(const rt::Tensor& dy);

  AttentionOptions opts;
  std::int64_t heads_per_rank, groups_per_rank;
  ColumnParallelLinear qkv;
  RowParallelLinear proj;
  rt::Tensor qkv_output;  // the projection's output (bias added): this rank's groups
  rt::Tensor context;     // core attention's output: this rank's heads [rows, heads_per_rank x head_dim]

 private:
  kernels::AttentionShape shape(std::int64_t rows) const;
  rt::Context& ctx_;
  int rank_;
  rt::Tensor stats_;
  std::vector<std::int64_t> lengths_;  // the forward's right padding (empty: none)
};

struct TransformerLayerOptions {
  std::int64_t hidden = 1024;
  std::int64_t heads = 16;
  std::int64_t kv_heads = 0;
  std::int64_t ffn = 4096;
  std::int64_t seq = 256;
  NormKind norm = NormKind::layer_norm;
  float norm_eps = 1e-5f;
  kernels::GeluKind gelu = kernels::GeluKind::tanh;
  bool swiglu = false;  // the MLP's activation: SwiGLU instead of GELU (MlpOptions::swiglu)
  bool rotary = false;  // rotary position embeddings (AttentionOptions::rotary)
  double rotary_base = 10000.0;
  bool causal = true;
  bool bias = true;
  bool sequence_parallel = false;
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;
  int layer_number = 0;  // selects the layer's master weights (ids 100·(layer_number + 1) + 1..6)
};

class TransformerLayer {
 public:
  TransformerLayer(rt::Context& ctx, TransformerLayerOptions o);
  // lengths: each sequence's real tokens (right padding, ParallelAttention); empty: none padded.
  rt::Tensor forward(const rt::Tensor& x, std::span<const std::int64_t> lengths = {});
  rt::Tensor backward(const rt::Tensor& dy);

  TransformerLayerOptions opts;
  Norm input_norm;
  ParallelAttention attention;
  Norm post_attention_norm;
  ParallelMLP mlp;

 private:
  rt::Context& ctx_;
  int rank_;
};

}  // namespace cubesim::tp
