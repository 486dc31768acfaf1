#include "tp/transformer_step.h"

#include <random>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "tp/parallel_state.h"

namespace cubesim::tp {

void collect_layer_grads(const TransformerLayer& l, const std::string& prefix,
                         std::map<std::string, std::vector<std::uint8_t>>& out) {
  const std::pair<const char*, const rt::Tensor*> grads[] = {
      {"attention.qkv.weight_grad", &l.attention.qkv.weight_grad},
      {"attention.proj.weight_grad", &l.attention.proj.weight_grad},
      {"mlp.fc1.weight_grad", &l.mlp.fc1.weight_grad},
      {"mlp.fc2.weight_grad", &l.mlp.fc2.weight_grad},
      {"input_norm.weight_grad", &l.input_norm.weight_grad},
      {"post_attention_norm.weight_grad", &l.post_attention_norm.weight_grad},
      {"attention.qkv.bias_grad", &l.attention.qkv.bias_grad},
      {"attention.proj.bias_grad", &l.attention.proj.bias_grad},
      {"mlp.fc1.bias_grad", &l.mlp.fc1.bias_grad},
      {"mlp.fc2.bias_grad", &l.mlp.fc2.bias_grad},
      {"input_norm.bias_grad", &l.input_norm.bias_grad},
      {"post_attention_norm.bias_grad", &l.post_attention_norm.bias_grad}};
  for (const auto& [name, t] : grads) {
    if (t->defined()) out[prefix + name] = t->to_host_bytes();
  }
}

TransformerStepResult run_transformer_step(rt::Context& ctx, const TransformerStepOptions& o) {
  const char* fn = "run_transformer_step";
  const bool values = !ctx.backend().timing_only();
  if (o.tp < 1 || o.tp > ctx.world_size()) {
    throw rt::RuntimeError(fmt::format("{}: tp {} needs 1 to {} ranks (the context's world); use a tp in 1..{}", fn,
                                       o.tp, ctx.world_size(), ctx.world_size()));
  }
  if (o.batch < 1) throw rt::RuntimeError(fmt::format("{}: batch {} must be at least 1", fn, o.batch));
  if (o.layer.hidden < 1 || o.layer.seq < 1 || o.layer.ffn < 1) {
    throw rt::RuntimeError(fmt::format("{}: hidden {}, seq {} and ffn {} must be at least 1", fn, o.layer.hidden,
                                       o.layer.seq, o.layer.ffn));
  }
  const int tp = o.tp;
  TransformerLayerOptions lo = o.layer;
  lo.sequence_parallel = lo.sequence_parallel && tp > 1;
  const std::int64_t tokens = o.batch * lo.seq, H = lo.hidden;
  if (lo.sequence_parallel && tokens % tp != 0) {
    throw rt::RuntimeError(fmt::format("{}: sequence parallel needs batch x seq = {} rows divisible by tp {}", fn,
                                       tokens, tp));
  }
  if (!values && o.collect != Collect::none) {
    throw rt::RuntimeError(fmt::format("{}: collect asks for tensors but the context is timing-only (it keeps no "
                                       "values); collect none, or use a context with values",
                                       fn));
  }
  const std::int64_t rows = lo.sequence_parallel ? tokens / tp : tokens;
  std::vector<float> x, dy;
  if (values) {
    std::mt19937_64 rng(o.data_seed);
    std::normal_distribution<float> nrm(0.0f, 1.0f);
    x.resize(static_cast<std::size_t>(tokens * H));
    dy.resize(x.size());
    for (auto& v : x) v = round_to(lo.dtype, nrm(rng));
    for (auto& v : dy) v = round_to(lo.dtype, 0.1f * nrm(rng));
  }
  TransformerStepResult res;
  res.tensors.resize(static_cast<std::size_t>(tp));
  res.report = ctx.spawn(tp, [&](int rank) {
    initialize_model_parallel(tp);
    TransformerLayer layer(ctx, lo);
    const std::int64_t r0 = lo.sequence_parallel ? rank * rows : 0;
    auto place = [&](const std::vector<float>& v, const char* what) {
      rt::Tensor t = ctx.empty(rank, {rows, H}, lo.dtype, what);
      if (values) t.copy_from_host_f32(v.data() + r0 * H, rows * H);
      return t;
    };
    const rt::Tensor y = layer.forward(place(x, "x"));
    const rt::Tensor dx = layer.backward(place(dy, "dy"));
    if (o.collect != Collect::none) {
      auto& m = res.tensors[static_cast<std::size_t>(rank)];
      m["output"] = y.to_host_bytes();
      m["input_grad"] = dx.to_host_bytes();
      if (o.collect == Collect::all) {
        m["attention.qkv_output"] = layer.attention.qkv_output.to_host_bytes();
        m["attention.context"] = layer.attention.context.to_host_bytes();
        collect_layer_grads(layer, "", m);
      }
    }
    destroy_model_parallel();
  });
  return res;
}

}  // namespace cubesim::tp
