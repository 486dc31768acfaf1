#include "tp/gpt.h"

#include <fmt/format.h>

#include "runtime/collectives.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "tp/mappings.h"
#include "tp/parallel_state.h"

namespace cubesim::tp {

namespace {
std::string divisors(std::int64_t n) {
  std::string s;
  for (std::int64_t t = 1; t <= n && t <= 4096; ++t)
    if (n % t == 0) s += (s.empty() ? "" : ", ") + std::to_string(t);
  return s;
}

void check_ids(const char* what, std::span<const std::int64_t> ids, std::int64_t vocab, const char* layer) {
  for (std::size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      throw rt::RuntimeError(fmt::format("{}: {} {} at position {} is outside the vocabulary [0, {})", layer, what,
                                         ids[t], t, vocab));
    }
  }
}
}  // namespace

// ---------------------------------------------------------------- embedding
VocabParallelEmbedding::VocabParallelEmbedding(rt::Context& ctx, EmbeddingOptions o)
    : opts(o), ctx_(ctx), rank_(rt::Context::current_rank("VocabParallelEmbedding")) {
  const int tp = get_tensor_model_parallel_world_size();
  if (o.vocab < 1 || o.hidden < 1) {
    throw rt::RuntimeError(fmt::format("VocabParallelEmbedding: vocab {} and hidden {} must be at least 1", o.vocab,
                                       o.hidden));
  }
  if (o.vocab % tp != 0) {
    throw rt::RuntimeError(fmt::format("VocabParallelEmbedding: vocab {} is not divisible by the tensor-parallel size "
                                       "{}; pad the vocabulary to a multiple of tp (Megatron pads it) or use a tp in {}",
                                       o.vocab, tp, divisors(o.vocab)));
  }
  vocab_per_rank = o.vocab / tp;
  vocab_start = get_tensor_model_parallel_rank() * vocab_per_rank;
  if (ctx.backend().timing_only()) {
    weight = ctx.empty(rank_, {vocab_per_rank, o.hidden}, o.dtype, "parameter");
  } else {
    std::vector<float> v(static_cast<std::size_t>(vocab_per_rank * o.hidden));
    for (std::int64_t i = 0; i < vocab_per_rank; ++i)
      for (std::int64_t j = 0; j < o.hidden; ++j)
        v[static_cast<std::size_t>(i * o.hidden + j)] = master_value(o.seed, o.layer_id, vocab_start + i, j, o.hidden, o.init_std);
    weight = ctx.from_host_f32(rank_, {vocab_per_rank, o.hidden}, o.dtype, v);
  }
}

rt::Tensor VocabParallelEmbedding::forward(std::span<const std::int64_t> ids) {
  check_ids("token id", ids, opts.vocab, "VocabParallelEmbedding.forward");
  const auto tokens = static_cast<std::int64_t>(ids.size());
  const int tp = get_tensor_model_parallel_world_size();
  if (opts.sequence_parallel && tokens % tp != 0) {
    throw rt::RuntimeError(fmt::format("VocabParallelEmbedding.forward: sequence parallel needs the {} tokens "
                                       "divisible by tp {}",
                                       tokens, tp));
  }
  ids_.assign(ids.begin(), ids.end());
  rt::Tensor out = ctx_.empty(rank_, {tokens, opts.hidden}, opts.dtype, "embedding output");
  rt::embedding(weight, vocab_start, ids, out);
  return opts.sequence_parallel ? reduce_scatter_to_sequence_parallel_region.forward(out)
                                : reduce_from_tensor_model_parallel_region.forward(out);
}

void VocabParallelEmbedding::backward(const rt::Tensor& dy) {
  if (ids_.empty()) throw rt::RuntimeError("VocabParallelEmbedding.backward called before forward");
  const rt::Tensor g = opts.sequence_parallel ? reduce_scatter_to_sequence_parallel_region.backward(dy)
                                              : reduce_from_tensor_model_parallel_region.backward(dy);
  weight_grad = ctx_.empty(rank_, weight.shape(), opts.dtype, "embedding wgrad");
  rt::embedding_backward(g, ids_, vocab_start, weight_grad);
}

// ---------------------------------------------------------------- cross-entropy
VocabParallelCrossEntropy::VocabParallelCrossEntropy(rt::Context& ctx)
    : ctx_(ctx), rank_(rt::Context::current_rank("VocabParallelCrossEntropy")) {}

rt::Tensor VocabParallelCrossEntropy::forward(const rt::Tensor& logits, std::int64_t vocab_start, std::int64_t vocab,
                                              std::span<const std::int64_t> targets) {
  check_ids("target", targets, vocab, "VocabParallelCrossEntropy.forward");
  const std::int64_t tokens = logits.size(0);
  logits_ = logits;
  vocab_start_ = vocab_start;
  targets_.assign(targets.begin(), targets.end());
  max_ = ctx_.empty(rank_, {tokens}, DType::f32, "ce max");
  rt::cross_entropy_max(logits, max_);
  const bool parallel = get_tensor_model_parallel_world_size() > 1;
  if (parallel) rt::all_reduce(max_, rt::ReduceOp::max, &get_tensor_model_parallel_group());
  partials_ = ctx_.empty(rank_, {tokens, 2}, DType::f32, "ce partials");
  rt::cross_entropy_partials(logits, max_, targets, vocab_start, partials_);
  if (parallel) rt::all_reduce(partials_, rt::ReduceOp::sum, &get_tensor_model_parallel_group());
  rt::Tensor loss = ctx_.empty(rank_, {tokens}, DType::f32, "loss");
  rt::cross_entropy_loss(partials_, max_, loss);
  return loss;
}

rt::Tensor VocabParallelCrossEntropy::backward(const rt::Tensor& dloss) {
  if (!logits_.defined()) throw rt::RuntimeError("VocabParallelCrossEntropy.backward called before forward");
  rt::Tensor d = ctx_.empty(rank_, logits_.shape(), logits_.dtype(), "dlogits");
  rt::cross_entropy_backward(logits_, max_, partials_, targets_, vocab_start_, dloss, d);
  return d;
}

// ---------------------------------------------------------------- GPT
TransformerLayerOptions GptOptions::layer(int number) const {
  return {.hidden = hidden, .heads = heads, .kv_heads = kv_heads, .ffn = ffn, .seq = seq, .norm = norm,
          .norm_eps = norm_eps, .gelu = gelu, .swiglu = swiglu, .rotary = rotary,
          .rotary_base = rotary_base, .causal = true, .bias = bias, .sequence_parallel = sequence_parallel,
          .dtype = dtype, .seed = seed, .layer_number = number};
}

namespace {
EmbeddingOptions embedding_opts(const GptOptions& o) {
  if (o.layers < 1) throw rt::RuntimeError(fmt::format("GPTModel: layers {} must be at least 1", o.layers));
  return {.vocab = o.vocab, .hidden = o.hidden, .sequence_parallel = o.sequence_parallel, .dtype = o.dtype,
          .seed = o.seed};
}
NormOptions final_norm_opts(const GptOptions& o) {
  return {.hidden = o.hidden, .kind = o.norm, .eps = o.norm_eps, .sequence_parallel = o.sequence_parallel,
          .dtype = o.dtype, .seed = o.seed, .layer_id = 11};
}
LinearOptions lm_head_opts(const GptOptions& o) {
  return {.bias = false, .sequence_parallel = o.sequence_parallel, .dtype = o.dtype, .seed = o.seed, .layer_id = 12};
}
}  // namespace

GPTModel::GPTModel(rt::Context& ctx, GptOptions o)
    : opts(o),
      embedding(ctx, embedding_opts(o)),
      final_norm(ctx, final_norm_opts(o)),
      lm_head(ctx, o.hidden, o.vocab, lm_head_opts(o)),
      loss_fn(ctx),
      ctx_(ctx),
      rank_(rt::Context::current_rank("GPTModel")) {
  for (int i = 0; i < o.layers; ++i) layers.push_back(std::make_unique<TransformerLayer>(ctx, o.layer(i)));
  if (o.tie_embeddings) lm_head.weight = embedding.weight;  // one tensor: [vocab / tp, hidden] both
}

void check_lengths(const char* who, std::span<const std::int64_t> lengths, std::int64_t batch, std::int64_t seq) {
  if (lengths.empty()) return;
  if (static_cast<std::int64_t>(lengths.size()) != batch) {
    throw rt::RuntimeError(fmt::format("{}: {} lengths for a batch of {} sequences; give one length (real tokens, "
                                       "right padding) per sequence",
                                       who, lengths.size(), batch));
  }
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 1 || lengths[b] > seq) {
      throw rt::RuntimeError(fmt::format("{}: sequence {} has length {}; valid lengths are 1 to seq {}", who, b,
                                         lengths[b], seq));
    }
  }
}

std::int64_t real_tokens(std::span<const std::int64_t> lengths, std::int64_t tokens) {
  if (lengths.empty()) return tokens;
  std::int64_t n = 0;
  for (const std::int64_t l : lengths) n += l;
  return n;
}

rt::Tensor GPTModel::forward(std::span<const std::int64_t> ids, std::span<const std::int64_t> targets,
                             std::span<const std::int64_t> lengths) {
  if (ids.size() != targets.size() || ids.empty() || static_cast<std::int64_t>(ids.size()) % opts.seq != 0) {
    throw rt::RuntimeError(fmt::format("GPTModel.forward: {} ids and {} targets; give batch x seq (seq {}) of each",
                                       ids.size(), targets.size(), opts.seq));
  }
  const std::int64_t batch = static_cast<std::int64_t>(ids.size()) / opts.seq;
  check_lengths("GPTModel.forward", lengths, batch, opts.seq);
  lengths_.assign(lengths.begin(), lengths.end());
  rt::Tensor h = embedding.forward(ids);
  for (auto& l : layers) h = l->forward(h, lengths_);
  const rt::Tensor logits = lm_head.forward(final_norm.forward(h)).output;
  loss = loss_fn.forward(logits, embedding.vocab_start, opts.vocab, targets);
  if (!lengths_.empty() && !ctx_.backend().timing_only()) {
    // The loss mask: padding tokens report 0 (their losses were computed like any other token's).
    std::vector<float> v = loss.to_host_f32();
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = lengths_[static_cast<std::size_t>(b)]; t < opts.seq; ++t) v[static_cast<std::size_t>(b * opts.seq + t)] = 0.0f;
    loss.copy_from_host_f32(v.data(), loss.numel());
  }
  return loss;
}

void GPTModel::backward() {
  if (!loss.defined()) throw rt::RuntimeError("GPTModel.backward called before forward");
  const std::int64_t tokens = loss.numel();
  rt::Tensor dloss = ctx_.empty(rank_, {tokens}, DType::f32, "dloss");
  if (!ctx_.backend().timing_only()) {
    // d(mean over the real tokens): 1 / real tokens on each, 0 on padding (no padding: every token).
    std::vector<float> v(static_cast<std::size_t>(tokens), 1.0f / static_cast<float>(real_tokens(lengths_, tokens)));
    for (std::size_t b = 0; b < lengths_.size(); ++b)
      for (std::int64_t t = lengths_[b]; t < opts.seq; ++t) v[b * static_cast<std::size_t>(opts.seq) + static_cast<std::size_t>(t)] = 0.0f;
    dloss.copy_from_host_f32(v.data(), tokens);
  }
  rt::Tensor dh = final_norm.backward(lm_head.backward(loss_fn.backward(dloss)));
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) dh = (*it)->backward(dh);
  embedding.backward(dh);
  if (opts.tie_embeddings) {  // the shared weight's gradient: the lookup's plus the LM head's
    rt::Tensor sum = ctx_.empty(rank_, embedding.weight_grad.shape(), opts.dtype, "embedding wgrad");
    rt::add(embedding.weight_grad, lm_head.weight_grad, sum);
    embedding.weight_grad = sum;
  }
}

}  // namespace cubesim::tp
