#include "tp/mlp_step.h"

#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"
#include "tp/parallel_state.h"

namespace cubesim::tp {

namespace {

void check_at_least_one(std::int64_t v, const char* what, const char* fn) {
  if (v < 1) throw rt::RuntimeError(fmt::format("{}: {} {} is not valid; it must be at least 1", fn, what, v));
}

void check_options(const rt::Context& ctx, const MlpStepOptions& o, bool values) {
  const char* fn = "run_mlp_step";
  check_at_least_one(o.mlp.hidden, "hidden", fn);
  check_at_least_one(o.mlp.ffn, "ffn", fn);
  check_at_least_one(o.tokens, "tokens", fn);
  check_at_least_one(o.iterations, "iterations", fn);
  if (o.tp < 1 || o.tp > ctx.world_size()) {
    throw rt::RuntimeError(fmt::format("{}: tp {} needs 1 to {} ranks (the context's world); use a tp in 1..{}", fn,
                                       o.tp, ctx.world_size(), ctx.world_size()));
  }
  if (o.mlp.sequence_parallel && o.tp > 1 && o.tokens % o.tp != 0) {
    throw rt::RuntimeError(fmt::format("{}: sequence parallel needs tokens ({}) divisible by tp ({}); valid tp for "
                                       "these tokens and ffn: {}",
                                       fn, o.tokens, o.tp,
                                       fmt::join(valid_tp_sizes(o.mlp, o.tokens, ctx.world_size()), ", ")));
  }
  const auto n = static_cast<std::size_t>(o.tokens * o.mlp.hidden);
  for (const auto& [v, name] : {std::pair{&o.x, "x"}, std::pair{&o.dy, "dy"}}) {
    if (!v->empty() && v->size() != n) {
      throw rt::RuntimeError(fmt::format("{}: {} has {} values; give tokens x hidden = {} x {} = {} (or none, to draw "
                                         "them from data_seed)",
                                         fn, name, v->size(), o.tokens, o.mlp.hidden, n));
    }
  }
  if (!values && o.collect != Collect::none) {
    throw rt::RuntimeError(fmt::format("{}: collect asks for tensors but the context is timing-only (it keeps no "
                                       "values); collect none, or use a context with values",
                                       fn));
  }
}

// x ~ N(0, 1) then dy ~ 0.1·N(0, 1), one stream, rounded to the dtype: the data every tp run of a
// check sees, whatever its tp.
void draw(const MlpStepOptions& o, std::vector<float>& x, std::vector<float>& dy) {
  const DType d = o.mlp.dtype;
  std::mt19937_64 rng(o.data_seed);
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  x.resize(static_cast<std::size_t>(o.tokens * o.mlp.hidden));
  dy.resize(x.size());
  for (auto& v : x) v = round_to(d, nrm(rng));
  for (auto& v : dy) v = round_to(d, 0.1f * nrm(rng));
}

}  // namespace

std::vector<int> valid_tp_sizes(const MlpOptions& mlp, std::int64_t tokens, int devices) {
  const char* fn = "valid_tp_sizes";
  check_at_least_one(devices, "devices", fn);
  check_at_least_one(mlp.ffn, "ffn", fn);
  check_at_least_one(tokens, "tokens", fn);
  std::vector<int> out;
  for (int p = 1; p <= devices; ++p) {
    if (mlp.ffn % p == 0 && (!mlp.sequence_parallel || tokens % p == 0)) out.push_back(p);
  }
  return out;
}

MlpStepResult run_mlp_step(rt::Context& ctx, const MlpStepOptions& o) {
  const bool values = !ctx.backend().timing_only();
  check_options(ctx, o, values);
  const int tp = o.tp;
  const std::int64_t H = o.mlp.hidden;
  MlpOptions mo = o.mlp;
  mo.sequence_parallel = o.mlp.sequence_parallel && tp > 1;
  const std::int64_t rows = mo.sequence_parallel ? o.tokens / tp : o.tokens;

  std::vector<float> drawn_x, drawn_dy;
  if (values && (o.x.empty() || o.dy.empty())) draw(o, drawn_x, drawn_dy);
  const std::vector<float>& x = values && !o.x.empty() ? o.x : drawn_x;
  const std::vector<float>& dy = values && !o.dy.empty() ? o.dy : drawn_dy;

  MlpStepResult res;
  res.tensors.resize(static_cast<std::size_t>(tp));
  res.steps.resize(static_cast<std::size_t>(tp));
  const bool keep = o.hold_tensors || o.collect != Collect::none;
  res.report = ctx.spawn(tp, [&](int rank) {
    initialize_model_parallel(tp);
    ParallelMLP mlp(ctx, mo);
    rt::Backend& be = ctx.backend();
    const std::int64_t r0 = mo.sequence_parallel ? rank * rows : 0;
    // This rank's rows of a [tokens, hidden] input, placed on the rank.
    auto place = [&](const std::vector<float>& v, const char* what) {
      rt::Tensor t = ctx.empty(rank, {rows, H}, mo.dtype, what);
      if (values) t.copy_from_host_f32(v.data() + r0 * H, rows * H);
      return t;
    };
    rt::Tensor xt = place(x, "x"), dyt, y, dx;
    if (o.inputs_first) dyt = place(dy, "dy");
    std::uint64_t graph = 0;  // the recorded iteration (o.graph), launched from iteration 2 on
    auto iteration = [&](bool last) {
      if (keep) {
        y = mlp.forward(xt);
      } else {
        mlp.forward(xt);
        if (last && !o.graph) xt = rt::Tensor();  // the layers keep what backward needs; a graph reads x
      }
      if (!dyt.defined()) dyt = place(dy, "dy");
      if (keep) dx = mlp.backward(dyt);
      else mlp.backward(dyt);
    };
    for (int it = 0; it < o.iterations; ++it) {
      const bool last = it + 1 == o.iterations;
      // The first iteration runs as it is (it places dy, loads kernels, makes communicators); the
      // second is recorded, outside its region, so that every launch is timed alike.
      if (o.graph && it == 1 && (graph = be.graph_begin(rank)) != 0) {
        iteration(last);
        be.graph_end(graph);
      }
      const std::uint64_t region = o.step_regions ? be.begin_region(rank, "step") : 0;
      if (graph) be.graph_launch(graph);
      else iteration(last);
      if (o.step_regions) {
        be.end_region(region);
        res.steps[static_cast<std::size_t>(rank)].push_back(region);
      }
    }
    if (graph) ++res.graphs;
    if (o.collect != Collect::none) {
      auto& m = res.tensors[static_cast<std::size_t>(rank)];
      m["output"] = y.to_host_bytes();
      m["input_grad"] = dx.to_host_bytes();
      if (o.collect == Collect::all) {
        m["fc1.output"] = mlp.pre_activation.to_host_bytes();
        m["fc1.weight_grad"] = mlp.fc1.weight_grad.to_host_bytes();
        m["fc2.weight_grad"] = mlp.fc2.weight_grad.to_host_bytes();
        if (mo.bias) {
          m["fc1.bias_grad"] = mlp.fc1.bias_grad.to_host_bytes();
          m["fc2.bias_grad"] = mlp.fc2.bias_grad.to_host_bytes();
        }
      }
    }
    destroy_model_parallel();
  });
  return res;
}

}  // namespace cubesim::tp
