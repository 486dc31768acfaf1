#include "tp/equivalence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "tp/gpt_step.h"
#include "tp/mlp_step.h"

namespace cubesim::tp {

namespace {

// Everything a run produces, as full tensors (shards concatenated), plus each rank's copy of what
// every rank holds.
struct Run {
  std::map<std::string, std::vector<float>> full;
  std::map<std::string, std::vector<std::vector<std::uint8_t>>> per_rank;  // replicated tensors
  rt::RunReport report;
};

std::vector<float> concat_rows(const std::vector<std::vector<float>>& parts) {
  std::vector<float> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

// Shards [rows, cols_i] side by side -> [rows, sum cols_i].
std::vector<float> concat_cols(const std::vector<std::vector<float>>& parts, std::int64_t rows) {
  std::vector<float> v;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (const auto& p : parts) {
      const std::int64_t c = static_cast<std::int64_t>(p.size()) / rows;
      v.insert(v.end(), p.begin() + r * c, p.begin() + (r + 1) * c);
    }
  }
  return v;
}

// The MLP step on `tp` ranks of ctx with every tensor collected, reassembled into full tensors.
Run run_mlp(rt::Context& ctx, const MlpCheckOptions& o, int tp) {
  const std::int64_t T = o.tokens, H = o.mlp.hidden;
  const bool sp = o.mlp.sequence_parallel && tp > 1;
  const MlpStepResult step = run_mlp_step(
      ctx, {.mlp = o.mlp, .tokens = T, .tp = tp, .data_seed = o.data_seed, .collect = Collect::all});
  const DType d = o.mlp.dtype;
  auto collect = [&](const std::string& name) {
    std::vector<std::vector<float>> parts;
    for (const auto& m : step.tensors) {
      const auto& b = m.at(name);
      std::vector<float> v(b.size() / dtype_size(d));
      convert_to_f32(b.data(), d, v.data(), v.size());
      parts.push_back(std::move(v));
    }
    return parts;
  };
  Run run;
  run.report = step.report;
  // Outputs and input grads: replicated unless sequence parallel (then row shards).
  for (const char* name : {"output", "input_grad"}) {
    run.full[name] = sp ? concat_rows(collect(name)) : collect(name)[0];
    if (!sp) {
      for (const auto& m : step.tensors) run.per_rank[name].push_back(m.at(name));
    }
  }
  run.full["fc1.output"] = concat_cols(collect("fc1.output"), T);           // feature shards
  run.full["fc1.weight_grad"] = concat_rows(collect("fc1.weight_grad"));    // [ffn/tp, H] row shards
  run.full["fc2.weight_grad"] = concat_cols(collect("fc2.weight_grad"), H); // [H, ffn/tp] column shards
  if (o.mlp.bias) {
    run.full["fc1.bias_grad"] = concat_rows(collect("fc1.bias_grad"));
    run.full["fc2.bias_grad"] = collect("fc2.bias_grad")[0];
  }
  return run;
}

TensorCheck compare(const std::string& name, const std::string& against, const std::vector<float>& got,
                    const std::vector<float>& ref, bool bitwise_claim, double tol) {
  TensorCheck c;
  c.tensor = name;
  c.against = against;
  c.bitwise_claim = bitwise_claim;
  c.tolerance = bitwise_claim ? 0 : tol;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double e = static_cast<double>(got[i]) - ref[i];
    num += std::isfinite(e) ? e * e : INFINITY;
    den += static_cast<double>(ref[i]) * ref[i];
    c.max_abs = std::max(c.max_abs, std::isfinite(e) ? std::fabs(e) : INFINITY);
  }
  const bool same = got.size() == ref.size() && std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0;
  c.bitwise = same;
  c.rel_norm = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  c.pass = bitwise_claim ? same : (got.size() == ref.size() && c.rel_norm <= tol);
  return c;
}

// A host context that runs the collectives as ctx does (algorithm, f32 accumulation, hierarchy, and
// the nccl algorithm's figures, runtime/algorithms/nccl.h, which choose ring or tree): they fix the
// reduction order, hence the bits of a replay.
std::unique_ptr<rt::Context> replay_context(const rt::Context& ctx, int tp) {
  const rt::ContextOptions& co = ctx.options();
  const hw::Topology* topo = const_cast<rt::Context&>(ctx).backend().topology();
  return std::make_unique<rt::Context>(rt::ContextOptions{
      .world_size = tp,
      .algorithm = co.algorithm,
      .accumulate_f32 = co.accumulate_f32,
      .hierarchy = co.hierarchy,
      .nccl = topo && topo->nccl.present ? std::optional(topo->nccl) : co.nccl});
}

TensorCheck ranks_check(const std::string& name, const std::vector<std::vector<std::uint8_t>>& ranks) {
  TensorCheck c;
  c.tensor = name;
  c.against = "ranks";
  c.bitwise = true;
  for (const auto& b : ranks) c.bitwise = c.bitwise && b == ranks[0];
  c.pass = c.bitwise;
  return c;
}

// How a GPT step's tensor is split over the ranks (tp/gpt_step.h names), and the rows of a
// column-split one.
enum class Split { whole, rows, cols };
Split gpt_split(std::string name) {
  if (name.rfind("layers.", 0) == 0) name = name.substr(name.find('.', 7) + 1);
  if (name == "embedding.weight_grad" || name == "lm_head.weight_grad" || name == "attention.qkv.weight_grad" ||
      name == "mlp.fc1.weight_grad" || name == "attention.qkv.bias_grad" || name == "mlp.fc1.bias_grad")
    return Split::rows;
  if (name == "attention.proj.weight_grad" || name == "mlp.fc2.weight_grad") return Split::cols;
  return Split::whole;  // the loss, the row layers' biases, the norms: the same on every rank
}

Run run_gpt(rt::Context& ctx, const GptCheckOptions& o, int tp) {
  GptStepOptions so{.model = o.model, .batch = o.batch, .tp = tp, .data_seed = o.data_seed, .collect = Collect::all,
                    .lengths = o.lengths};
  const GptStepResult step = run_gpt_step(ctx, so);
  Run run;
  run.report = step.report;
  for (const auto& [name, bytes] : step.tensors[0]) {
    const DType d = name == "loss" ? DType::f32 : o.model.dtype;
    std::vector<std::vector<float>> parts;
    for (const auto& m : step.tensors) {
      const auto& b = m.at(name);
      std::vector<float> v(b.size() / dtype_size(d));
      convert_to_f32(b.data(), d, v.data(), v.size());
      parts.push_back(std::move(v));
    }
    switch (gpt_split(name)) {
      case Split::whole:
        run.full[name] = parts[0];
        for (const auto& m : step.tensors) run.per_rank[name].push_back(m.at(name));
        break;
      case Split::rows: run.full[name] = concat_rows(parts); break;
      case Split::cols: run.full[name] = concat_cols(parts, o.model.hidden); break;
    }
  }
  return run;
}

// The checks every equivalence report ends with: against the host replay of the same tp program
// (bitwise, unless ctx is the host), every rank's copy of a replicated tensor (bitwise), the verdict.
void finish(EquivalenceReport& rep, rt::Context& ctx, const Run& tpr, int tp,
            const std::function<Run(rt::Context&)>& run_on) {
  if (!ctx.backend().reference()) {
    auto hostp = replay_context(ctx, tp);
    const Run replay = run_on(*hostp);
    for (const auto& [name, values] : tpr.full) {
      rep.checks.push_back(compare(name, "host replay", values, replay.full.at(name), true, 0));
    }
  }
  for (const auto& [name, ranks] : tpr.per_rank) rep.checks.push_back(ranks_check(name, ranks));
  rep.pass = true;
  for (const auto& c : rep.checks) rep.pass = rep.pass && c.pass;
}

}  // namespace

double tp_tolerance(DType d, int tp) {
  const double u = d == DType::f32 ? std::ldexp(1.0, -24) : d == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  return std::max(1e-6, 2.0 * tp * u);
}

EquivalenceReport check_mlp_equivalence(rt::Context& ctx, const MlpCheckOptions& o) {
  if (ctx.backend().timing_only()) {
    throw rt::RuntimeError("check_mlp_equivalence: the context is timing-only (it keeps no values to compare); "
                           "use run_mlp_step (cubesim.tp.run_mlp) for timing, or a context with values "
                           "(timing_only=False)");
  }
  EquivalenceReport rep;
  Run tpr = run_mlp(ctx, o, o.tp);  // checks the options
  rep.run = tpr.report;

  rt::Context host1(rt::ContextOptions{.world_size = 1});
  MlpCheckOptions ro = o;
  ro.mlp.sequence_parallel = false;
  Run ref = run_mlp(host1, ro, 1);

  const double tol = tp_tolerance(o.mlp.dtype, o.tp);
  for (const auto& [name, values] : tpr.full) {
    const bool sums_partials = (name == "output" || name == "input_grad") && o.tp > 1;
    rep.checks.push_back(compare(name, "unsharded", values, ref.full.at(name), !sums_partials, tol));
  }
  finish(rep, ctx, tpr, o.tp, [&](rt::Context& host) { return run_mlp(host, o, o.tp); });
  return rep;
}

double gpt_tolerance(DType d, int tp, int layers) { return std::max(1, layers) * tp_tolerance(d, tp); }

EquivalenceReport check_gpt_equivalence(rt::Context& ctx, const GptCheckOptions& o) {
  if (ctx.backend().timing_only()) {
    throw rt::RuntimeError("check_gpt_equivalence: the context is timing-only (it keeps no values to compare); "
                           "use run_gpt_step (cubesim.tp.run_gpt) for timing, or a context with values");
  }
  EquivalenceReport rep;
  Run tpr = run_gpt(ctx, o, o.tp);
  rep.run = tpr.report;
  double sum = 0;
  for (float l : tpr.full.at("loss")) sum += l;  // padding tokens report 0
  rep.mean_loss = sum / static_cast<double>(real_tokens(o.lengths, static_cast<std::int64_t>(tpr.full.at("loss").size())));
  rt::Context host1(rt::ContextOptions{.world_size = 1});
  GptCheckOptions ro = o;
  ro.model.sequence_parallel = false;
  Run ref = run_gpt(host1, ro, 1);
  const double tol = gpt_tolerance(o.model.dtype, o.tp, o.model.layers);
  for (const auto& [name, values] : tpr.full) {
    rep.checks.push_back(compare(name, "unsharded", values, ref.full.at(name), o.tp == 1, tol));
  }
  finish(rep, ctx, tpr, o.tp, [&](rt::Context& host) { return run_gpt(host, o, o.tp); });
  return rep;
}

}  // namespace cubesim::tp
