#include "tp/gpt_step.h"

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "tp/parallel_state.h"
#include "tp/transformer_step.h"

namespace cubesim::tp {

GptStepResult run_gpt_step(rt::Context& ctx, const GptStepOptions& o) {
  const char* fn = "run_gpt_step";
  const bool values = !ctx.backend().timing_only();
  if (o.tp < 1 || o.tp > ctx.world_size()) {
    throw rt::RuntimeError(fmt::format("{}: tp {} needs 1 to {} ranks (the context's world); use a tp in 1..{}", fn,
                                       o.tp, ctx.world_size(), ctx.world_size()));
  }
  if (o.batch < 1 || o.model.seq < 1 || o.model.vocab < 1) {
    throw rt::RuntimeError(fmt::format("{}: batch {}, seq {} and vocab {} must be at least 1", fn, o.batch, o.model.seq,
                                       o.model.vocab));
  }
  if (!values && o.collect != Collect::none) {
    throw rt::RuntimeError(fmt::format("{}: collect asks for tensors but the context is timing-only (it keeps no "
                                       "values); collect none, or use a context with values",
                                       fn));
  }
  check_lengths(fn, o.lengths, o.batch, o.model.seq);  // before any rank starts
  GptOptions mo = o.model;
  mo.sequence_parallel = mo.sequence_parallel && o.tp > 1;
  const std::int64_t S = mo.seq;
  std::vector<std::int64_t> ids, targets;
  std::mt19937_64 rng(o.data_seed);
  std::uniform_int_distribution<std::int64_t> tok(0, mo.vocab - 1);
  for (std::int64_t b = 0; b < o.batch; ++b) {
    std::vector<std::int64_t> seq(static_cast<std::size_t>(S + 1));
    for (auto& t : seq) t = tok(rng);
    ids.insert(ids.end(), seq.begin(), seq.end() - 1);
    targets.insert(targets.end(), seq.begin() + 1, seq.end());
  }
  GptStepResult res;
  res.tensors.resize(static_cast<std::size_t>(o.tp));
  res.mean_loss = NAN;
  res.report = ctx.spawn(o.tp, [&](int rank) {
    initialize_model_parallel(o.tp);
    GPTModel gpt(ctx, mo);
    const rt::Tensor loss = gpt.forward(ids, targets, o.lengths);
    gpt.backward();
    if (values && rank == 0) {
      double sum = 0;
      for (float l : loss.to_host_f32()) sum += l;  // padding tokens report 0
      res.mean_loss = sum / static_cast<double>(real_tokens(o.lengths, loss.numel()));
    }
    if (o.collect != Collect::none) {
      auto& m = res.tensors[static_cast<std::size_t>(rank)];
      m["loss"] = loss.to_host_bytes();
      if (o.collect == Collect::all) {
        m["embedding.weight_grad"] = gpt.embedding.weight_grad.to_host_bytes();
        if (!mo.tie_embeddings) m["lm_head.weight_grad"] = gpt.lm_head.weight_grad.to_host_bytes();
        m["final_norm.weight_grad"] = gpt.final_norm.weight_grad.to_host_bytes();
        if (gpt.final_norm.bias_grad.defined()) m["final_norm.bias_grad"] = gpt.final_norm.bias_grad.to_host_bytes();
        for (std::size_t i = 0; i < gpt.layers.size(); ++i) {
          collect_layer_grads(*gpt.layers[i], fmt::format("layers.{}.", i), m);
        }
      }
    }
    destroy_model_parallel();
  });
  return res;
}

}  // namespace cubesim::tp
