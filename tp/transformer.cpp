#include "tp/transformer.h"

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/ops.h"
#include "tp/mappings.h"
#include "tp/parallel_state.h"

namespace cubesim::tp {

const char* norm_kind_name(NormKind k) { return k == NormKind::layer_norm ? "layer_norm" : "rms_norm"; }

NormKind parse_norm_kind(std::string_view s) {
  if (s == "layer_norm" || s == "LayerNorm") return NormKind::layer_norm;
  if (s == "rms_norm" || s == "RMSNorm") return NormKind::rms_norm;
  throw rt::RuntimeError(fmt::format("unknown normalization '{}': valid are layer_norm (LayerNorm) and rms_norm (RMSNorm)", s));
}

namespace {
rt::Tensor parameter(rt::Context& ctx, int rank, std::int64_t n, DType dtype, const std::function<float(std::int64_t)>& f) {
  if (ctx.backend().timing_only()) return ctx.empty(rank, {n}, dtype, "parameter");
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = f(i);
  return ctx.from_host_f32(rank, {n}, dtype, v);
}

rt::Tensor like(rt::Context& ctx, int rank, const rt::Tensor& t, const char* what) {
  return ctx.empty(rank, t.shape(), t.dtype(), what);
}
}  // namespace

// ---------------------------------------------------------------- Norm
Norm::Norm(rt::Context& ctx, NormOptions o) : opts(o), ctx_(ctx), rank_(rt::Context::current_rank("Norm")) {
  if (o.hidden < 1) throw rt::RuntimeError(fmt::format("Norm: hidden {} must be at least 1", o.hidden));
  if (!(o.eps > 0)) throw rt::RuntimeError(fmt::format("Norm: eps {} must be positive", o.eps));
  weight = parameter(ctx, rank_, o.hidden, o.dtype,
                     [&](std::int64_t i) { return 1.0f + master_value(o.seed, o.layer_id, i, 0, 1, 0.1f); });
  if (o.kind == NormKind::layer_norm) {
    bias = parameter(ctx, rank_, o.hidden, o.dtype,
                     [&](std::int64_t i) { return master_value(o.seed, o.layer_id, i, -1, 1, 0.02f); });
  }
}

rt::Tensor Norm::forward(const rt::Tensor& x) {
  const char* name = opts.kind == NormKind::layer_norm ? "LayerNorm.forward" : "RMSNorm.forward";
  if (x.dim() != 2 || x.size(1) != opts.hidden || x.dtype() != opts.dtype) {
    throw rt::RuntimeError(fmt::format("{}: input must be [tokens, {}] of {}, got {}", name, opts.hidden,
                                       dtype_name(opts.dtype), x.describe()));
  }
  input_ = x;
  rt::Tensor y = like(ctx_, rank_, x, "norm output");
  rstd_ = ctx_.empty(rank_, {x.size(0)}, DType::f32, "norm rstd");
  if (opts.kind == NormKind::layer_norm) {
    mean_ = ctx_.empty(rank_, {x.size(0)}, DType::f32, "norm mean");
    rt::layer_norm(x, weight, bias, y, mean_, rstd_, opts.eps);
  } else {
    rt::rms_norm(x, weight, y, rstd_, opts.eps);
  }
  return y;
}

rt::Tensor Norm::backward(const rt::Tensor& dy) {
  if (!input_.defined()) throw rt::RuntimeError("Norm.backward called before forward");
  rt::Tensor dx = like(ctx_, rank_, input_, "norm dgrad");
  weight_grad = ctx_.empty(rank_, {opts.hidden}, opts.dtype, "norm wgrad");
  if (opts.kind == NormKind::layer_norm) {
    bias_grad = ctx_.empty(rank_, {opts.hidden}, opts.dtype, "norm bgrad");
    rt::layer_norm_backward(input_, weight, dy, mean_, rstd_, dx, weight_grad, bias_grad);
  } else {
    rt::rms_norm_backward(input_, weight, dy, rstd_, dx, weight_grad);
  }
  if (opts.sequence_parallel && get_tensor_model_parallel_world_size() > 1) {
    all_reduce_in_place(weight_grad);  // each rank saw its own tokens
    if (bias_grad.defined()) all_reduce_in_place(bias_grad);
  }
  return dx;
}

// ---------------------------------------------------------------- ParallelAttention
namespace {
// The QKV projection's width, after checking the heads split as Megatron requires.
std::int64_t qkv_width(const AttentionOptions& o) {
  const int tp = get_tensor_model_parallel_world_size();
  const std::int64_t groups = o.query_groups();
  if (o.heads < 1 || o.hidden % o.heads != 0) {
    throw rt::RuntimeError(fmt::format("ParallelAttention: hidden {} is not divisible by heads {}; heads must divide "
                                       "hidden (head_dim = hidden / heads)",
                                       o.hidden, o.heads));
  }
  if (groups < 1 || o.heads % groups != 0) {
    throw rt::RuntimeError(fmt::format("ParallelAttention: heads {} are not divisible by kv_heads (query groups) {}; "
                                       "kv_heads must divide heads",
                                       o.heads, groups));
  }
  if (groups % tp != 0) {
    std::string valid;
    for (std::int64_t t = 1; t <= groups; ++t)
      if (groups % t == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(t);
    throw rt::RuntimeError(fmt::format("ParallelAttention: kv_heads (query groups) {} are not divisible by the "
                                       "tensor-parallel size {}; each rank needs whole groups: valid tp sizes {}",
                                       groups, tp, valid));
  }
  if (o.seq < 1) throw rt::RuntimeError(fmt::format("ParallelAttention: seq {} must be at least 1", o.seq));
  if (o.rotary && (o.head_dim() % 2 != 0 || !(o.rotary_base > 1.0))) {
    throw rt::RuntimeError(fmt::format("ParallelAttention: rotary embeddings need an even head_dim (hidden {} / heads "
                                       "{} = {}) and a base above 1 (got {})",
                                       o.hidden, o.heads, o.head_dim(), o.rotary_base));
  }
  return groups * (o.heads / groups + 2) * o.head_dim();
}

LinearOptions qkv_opts(const AttentionOptions& o) {
  return {.bias = o.bias, .sequence_parallel = o.sequence_parallel, .dtype = o.dtype, .seed = o.seed,
          .layer_id = 1 + o.id_offset};
}
LinearOptions proj_opts(const AttentionOptions& o) {
  return {.bias = o.bias, .input_is_parallel = true, .sequence_parallel = o.sequence_parallel, .dtype = o.dtype,
          .seed = o.seed, .layer_id = 2 + o.id_offset};
}
}  // namespace

ParallelAttention::ParallelAttention(rt::Context& ctx, AttentionOptions o)
    : opts(o),
      heads_per_rank(0),
      groups_per_rank(0),
      qkv(ctx, o.hidden, qkv_width(o), qkv_opts(o)),
      proj(ctx, o.hidden, o.hidden, proj_opts(o)),
      ctx_(ctx),
      rank_(rt::Context::current_rank("ParallelAttention")) {
  const int tp = get_tensor_model_parallel_world_size();
  heads_per_rank = o.heads / tp;
  groups_per_rank = o.query_groups() / tp;
}

kernels::AttentionShape ParallelAttention::shape(std::int64_t rows) const {
  if (rows % opts.seq != 0) {
    throw rt::RuntimeError(fmt::format("ParallelAttention: {} token rows are not whole sequences of seq {}; give "
                                       "batch x seq rows",
                                       rows, opts.seq));
  }
  return {.batch = rows / opts.seq, .seq_q = opts.seq, .seq_k = opts.seq, .heads = heads_per_rank,
          .kv_heads = groups_per_rank, .head_dim = opts.head_dim(), .causal = opts.causal};
}

rt::Tensor ParallelAttention::forward(const rt::Tensor& x, std::span<const std::int64_t> lengths) {
  if (!lengths.empty()) {  // before any work: one length in [0, seq] per sequence
    const std::int64_t rows = x.size(0) * (opts.sequence_parallel ? get_tensor_model_parallel_world_size() : 1);
    const std::int64_t batch = rows / opts.seq;
    if (static_cast<std::int64_t>(lengths.size()) != batch) {
      throw rt::RuntimeError(fmt::format("ParallelAttention.forward: {} lengths for a batch of {} sequences of seq {}; "
                                         "give one length (real tokens, right padding) per sequence",
                                         lengths.size(), batch, opts.seq));
    }
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      if (lengths[b] < 0 || lengths[b] > opts.seq) {
        throw rt::RuntimeError(fmt::format("ParallelAttention.forward: sequence {} has length {}; valid lengths are 0 "
                                           "to seq {}",
                                           b, lengths[b], opts.seq));
      }
    }
  }
  lengths_.assign(lengths.begin(), lengths.end());
  qkv_output = qkv.forward(x).output;
  const std::int64_t rows = qkv_output.size(0);
  const kernels::AttentionShape s = shape(rows);
  if (opts.rotary) rt::rotary_qkv(s, qkv_output, opts.rotary_base, false);
  context = ctx_.empty(rank_, {rows, heads_per_rank * opts.head_dim()}, opts.dtype, "attention context");
  stats_ = ctx_.empty(rank_, {rows, 2 * heads_per_rank}, DType::f32, "attention stats");
  rt::attention_qkv(s, qkv_output, context, stats_, lengths_);
  return proj.forward(context).output;
}

rt::Tensor ParallelAttention::backward(const rt::Tensor& dy) {
  if (!context.defined()) throw rt::RuntimeError("ParallelAttention.backward called before forward");
  const rt::Tensor dctx = proj.backward(dy);
  rt::Tensor dqkv = like(ctx_, rank_, qkv_output, "attention dqkv");
  const kernels::AttentionShape s = shape(qkv_output.size(0));
  rt::attention_qkv_backward(s, qkv_output, context, stats_, dctx, dqkv, lengths_);
  if (opts.rotary) rt::rotary_qkv(s, dqkv, opts.rotary_base, true);
  return qkv.backward(dqkv);
}

// ---------------------------------------------------------------- TransformerLayer
namespace {
std::uint64_t base_id(const TransformerLayerOptions& o) { return 100 * (static_cast<std::uint64_t>(o.layer_number) + 1); }

NormOptions norm_opts(const TransformerLayerOptions& o, std::uint64_t which) {
  return {.hidden = o.hidden, .kind = o.norm, .eps = o.norm_eps, .sequence_parallel = o.sequence_parallel,
          .dtype = o.dtype, .seed = o.seed, .layer_id = base_id(o) + which};
}
AttentionOptions attention_opts(const TransformerLayerOptions& o) {
  return {.hidden = o.hidden, .heads = o.heads, .kv_heads = o.kv_heads, .seq = o.seq, .causal = o.causal,
          .bias = o.bias, .sequence_parallel = o.sequence_parallel, .dtype = o.dtype, .seed = o.seed,
          .id_offset = base_id(o), .rotary = o.rotary, .rotary_base = o.rotary_base};
}
MlpOptions mlp_opts(const TransformerLayerOptions& o) {
  return {.hidden = o.hidden, .ffn = o.ffn, .gelu = o.gelu, .bias = o.bias, .sequence_parallel = o.sequence_parallel,
          .dtype = o.dtype, .seed = o.seed, .id_offset = base_id(o) + 2, .swiglu = o.swiglu};
}
}  // namespace

TransformerLayer::TransformerLayer(rt::Context& ctx, TransformerLayerOptions o)
    : opts(o),
      input_norm(ctx, norm_opts(o, 5)),
      attention(ctx, attention_opts(o)),
      post_attention_norm(ctx, norm_opts(o, 6)),
      mlp(ctx, mlp_opts(o)),
      ctx_(ctx),
      rank_(rt::Context::current_rank("TransformerLayer")) {}

rt::Tensor TransformerLayer::forward(const rt::Tensor& x, std::span<const std::int64_t> lengths) {
  const rt::Tensor a = attention.forward(input_norm.forward(x), lengths);
  rt::Tensor h = like(ctx_, rank_, x, "residual");
  rt::add(x, a, h);
  const rt::Tensor m = mlp.forward(post_attention_norm.forward(h));
  rt::Tensor y = like(ctx_, rank_, x, "layer output");
  rt::add(h, m, y);
  return y;
}

rt::Tensor TransformerLayer::backward(const rt::Tensor& dy) {
  const rt::Tensor dn2 = post_attention_norm.backward(mlp.backward(dy));
  rt::Tensor dh = like(ctx_, rank_, dy, "residual grad");
  rt::add(dy, dn2, dh);
  const rt::Tensor dn1 = input_norm.backward(attention.backward(dh));
  rt::Tensor dx = like(ctx_, rank_, dy, "layer input grad");
  rt::add(dh, dn1, dx);
  return dx;
}

}  // namespace cubesim::tp
