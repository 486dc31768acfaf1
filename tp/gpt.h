// gpt.h — Megatron-LM's GPT model, tensor-parallel, forward and backward: VocabParallelEmbedding,
// the vocab-parallel cross-entropy, and GPTModel (embedding, L TransformerLayers, the final norm, the
// LM head tied to the embedding or not, the loss), written once against the runtime.
//
//   VocabParallelEmbedding: rank r holds rows [r·vocab/tp, (r+1)·vocab/tp) of the embedding; each
//     rank looks up the ids in its slice (zero rows elsewhere) and the slices are all-reduced
//     (reduce-scattered along tokens with sequence parallelism), as Megatron does.
//   VocabParallelCrossEntropy: on the LM head's logits [tokens, vocab/tp]: the row max all-reduced
//     (max), then each rank's sum of exponentials and the target's logit (zero where the target is
//     not in its slice) all-reduced (sum) together; loss = log S − (x_target − max) per token
//     (kernels/vocab.h). The backward needs no communication.
//   GPTModel: loss = mean over tokens of the per-token losses; backward from d(loss) = 1/tokens.
//     With right padding (forward's lengths: each sequence's real tokens), Megatron's loss mask: the
//     mean is over the real tokens only, padding tokens' losses are reported as 0 and give no
//     gradient, and every layer's attention ignores padding keys; a sequence's real tokens' losses
//     are then bitwise those it gives alone (unpadded, at its own length). A sequence of length n has
//     n loss positions, targets[0..n) (the targets are the next tokens, given beside the ids; in
//     Megatron, where the labels are the ids shifted, n ids give n - 1).
//
//   tp::GPTModel gpt(ctx, {.vocab = 1024, .hidden = 256, .heads = 8, .kv_heads = 2, .ffn = 1024,
//                          .seq = 128, .layers = 2});
//   rt::Tensor loss = gpt.forward(ids, targets);   // f32 [tokens], the same on every rank
//   gpt.backward();                                  // every weight_grad set
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/context.h"
#include "runtime/tensor.h"
#include "tp/transformer.h"

namespace cubesim::tp {

struct EmbeddingOptions {
  std::int64_t vocab = 1024;
  std::int64_t hidden = 1024;
  bool sequence_parallel = false;
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;
  std::uint64_t layer_id = 10;
  float init_std = 0.02f;
};

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(rt::Context& ctx, EmbeddingOptions o);
  // ids: every token of the batch (all ranks pass the same); out [tokens, hidden] (tokens / tp rows
  // of it with sequence parallelism). Throws naming the first id outside [0, vocab).
  rt::Tensor forward(std::span<const std::int64_t> ids);
  void backward(const rt::Tensor& dy);  // sets weight_grad

  EmbeddingOptions opts;
  std::int64_t vocab_per_rank, vocab_start;
  rt::Tensor weight, weight_grad;

 private:
  rt::Context& ctx_;
  int rank_;
  std::vector<std::int64_t> ids_;
};

class VocabParallelCrossEntropy {
 public:
  explicit VocabParallelCrossEntropy(rt::Context& ctx);
  // logits [tokens, vocab / tp] (this rank's slice, starting at vocab_start); one target per token.
  rt::Tensor forward(const rt::Tensor& logits, std::int64_t vocab_start, std::int64_t vocab,
                     std::span<const std::int64_t> targets);  // f32 [tokens]
  rt::Tensor backward(const rt::Tensor& dloss);                 // f32 [tokens] -> dlogits

 private:
  rt::Context& ctx_;
  int rank_;
  rt::Tensor logits_, max_, partials_;
  std::int64_t vocab_start_ = 0;
  std::vector<std::int64_t> targets_;
};

struct GptOptions {
  std::int64_t vocab = 1024;
  std::int64_t hidden = 1024;
  std::int64_t heads = 16;
  std::int64_t kv_heads = 0;
  std::int64_t ffn = 4096;
  std::int64_t seq = 256;
  int layers = 2;
  NormKind norm = NormKind::layer_norm;
  float norm_eps = 1e-5f;
  kernels::GeluKind gelu = kernels::GeluKind::tanh;
  bool swiglu = false;
  bool rotary = false;  // rotary position embeddings in every layer's attention
  double rotary_base = 10000.0;
  bool bias = true;
  bool sequence_parallel = false;
  bool tie_embeddings = true;  // the LM head is the embedding's weight (Megatron's default)
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;

  TransformerLayerOptions layer(int number) const;
};

// Right padding's checks and count, one owner for the model, the step job and the equivalence check.
// check_lengths: RuntimeError naming `who`, unless lengths is empty or has one length in [1, seq] per
// sequence of a batch of `batch`. real_tokens: the tokens the loss is the mean over (every token of
// batch x seq when lengths is empty).
void check_lengths(const char* who, std::span<const std::int64_t> lengths, std::int64_t batch, std::int64_t seq);
std::int64_t real_tokens(std::span<const std::int64_t> lengths, std::int64_t tokens);

class GPTModel {
 public:
  GPTModel(rt::Context& ctx, GptOptions o);
  // ids, targets: batch x seq token ids each (targets: the next tokens). The per-token losses.
  // lengths: each sequence's real tokens, in [1, seq] (right padding: the ids and targets after them
  // are padding, any valid id); empty: none padded.
  rt::Tensor forward(std::span<const std::int64_t> ids, std::span<const std::int64_t> targets,
                     std::span<const std::int64_t> lengths = {});
  void backward();  // from d(mean loss); sets every weight_grad (embedding: + the LM head's when tied)

  GptOptions opts;
  VocabParallelEmbedding embedding;
  std::vector<std::unique_ptr<TransformerLayer>> layers;
  Norm final_norm;
  ColumnParallelLinear lm_head;  // its weight is the embedding's when tied
  VocabParallelCrossEntropy loss_fn;
  rt::Tensor loss;

 private:
  rt::Context& ctx_;
  int rank_;
  std::vector<std::int64_t> lengths_;  // the forward's right padding (empty: none)
};

}  // namespace cubesim::tp
