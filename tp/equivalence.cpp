#include "tp/equivalence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "tp/parallel_state.h"

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

Run run_mlp(rt::Context& ctx, const MlpCheckOptions& o, int tp, const std::vector<float>& x,
            const std::vector<float>& dy) {
  const std::int64_t T = o.tokens, H = o.mlp.hidden;
  const bool sp = o.mlp.sequence_parallel && tp > 1;
  if (sp && T % tp != 0) {
    throw rt::RuntimeError(fmt::format("sequence parallel needs tokens ({}) divisible by tp ({})", T, tp));
  }
  const std::int64_t rows = sp ? T / tp : T;
  std::vector<std::map<std::string, std::vector<float>>> got(static_cast<std::size_t>(tp));
  std::vector<std::map<std::string, std::vector<std::uint8_t>>> bits(static_cast<std::size_t>(tp));
  Run run;
  MlpOptions mo = o.mlp;
  mo.sequence_parallel = sp;
  run.report = ctx.spawn(tp, [&](int rank) {
    initialize_model_parallel(tp);
    ParallelMLP mlp(ctx, mo);
    const std::int64_t r0 = sp ? rank * rows : 0;
    const std::vector<float> xs(x.begin() + r0 * H, x.begin() + (r0 + rows) * H);
    const std::vector<float> dys(dy.begin() + r0 * H, dy.begin() + (r0 + rows) * H);
    rt::Tensor xt = ctx.from_host_f32(rank, {rows, H}, mo.dtype, xs);
    rt::Tensor y = mlp.forward(xt);
    rt::Tensor dyt = ctx.from_host_f32(rank, {rows, H}, mo.dtype, dys);
    rt::Tensor dx = mlp.backward(dyt);
    auto& g = got[static_cast<std::size_t>(rank)];
    g["output"] = y.to_host_f32();
    g["input_grad"] = dx.to_host_f32();
    g["fc1.output"] = mlp.pre_activation.to_host_f32();
    g["fc1.weight_grad"] = mlp.fc1.weight_grad.to_host_f32();
    g["fc2.weight_grad"] = mlp.fc2.weight_grad.to_host_f32();
    if (mo.bias) {
      g["fc1.bias_grad"] = mlp.fc1.bias_grad.to_host_f32();
      g["fc2.bias_grad"] = mlp.fc2.bias_grad.to_host_f32();
    }
    bits[static_cast<std::size_t>(rank)]["output"] = y.to_host_bytes();
    bits[static_cast<std::size_t>(rank)]["input_grad"] = dx.to_host_bytes();
    destroy_model_parallel();
  });
  auto collect = [&](const std::string& name) {
    std::vector<std::vector<float>> parts;
    for (auto& g : got) parts.push_back(g[name]);
    return parts;
  };
  // Outputs and input grads: replicated unless sequence parallel (then row shards).
  for (const char* name : {"output", "input_grad"}) {
    run.full[name] = sp ? concat_rows(collect(name)) : got[0][name];
    if (!sp) {
      for (auto& b : bits) run.per_rank[name].push_back(b[name]);
    }
  }
  run.full["fc1.output"] = concat_cols(collect("fc1.output"), T);           // feature shards
  run.full["fc1.weight_grad"] = concat_rows(collect("fc1.weight_grad"));    // [ffn/tp, H] row shards
  run.full["fc2.weight_grad"] = concat_cols(collect("fc2.weight_grad"), H); // [H, ffn/tp] column shards
  if (mo.bias) {
    run.full["fc1.bias_grad"] = concat_rows(collect("fc1.bias_grad"));
    run.full["fc2.bias_grad"] = got[0]["fc2.bias_grad"];
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

}  // namespace

double tp_tolerance(DType d, int tp) {
  const double u = d == DType::f32 ? std::ldexp(1.0, -24) : d == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  return std::max(1e-6, 2.0 * tp * u);
}

EquivalenceReport check_mlp_equivalence(rt::Context& ctx, const MlpCheckOptions& o) {
  if (o.tp < 1 || o.tp > ctx.world_size()) {
    throw rt::RuntimeError(fmt::format("check_mlp_equivalence: tp {} needs 1 to {} ranks (the context's world)", o.tp,
                                       ctx.world_size()));
  }
  const std::int64_t T = o.tokens, H = o.mlp.hidden;
  std::mt19937_64 rng(o.data_seed);
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(T * H)), dy(static_cast<std::size_t>(T * H));
  for (auto& v : x) v = round_to(o.mlp.dtype, nrm(rng));
  for (auto& v : dy) v = round_to(o.mlp.dtype, 0.1f * nrm(rng));

  EquivalenceReport rep;
  Run tpr = run_mlp(ctx, o, o.tp, x, dy);
  rep.run = tpr.report;

  rt::ContextOptions ho;
  ho.world_size = 1;
  rt::Context host1(ho);
  MlpCheckOptions ro = o;
  ro.mlp.sequence_parallel = false;
  Run ref = run_mlp(host1, ro, 1, x, dy);

  const double tol = tp_tolerance(o.mlp.dtype, o.tp);
  for (const auto& [name, values] : tpr.full) {
    const bool sums_partials = (name == "output" || name == "input_grad") && o.tp > 1;
    rep.checks.push_back(compare(name, "unsharded", values, ref.full.at(name), !sums_partials, tol));
  }
  if (!ctx.backend().reference()) {
    rt::ContextOptions hp;
    hp.world_size = o.tp;
    rt::Context hostp(hp);
    Run replay = run_mlp(hostp, o, o.tp, x, dy);
    for (const auto& [name, values] : tpr.full) {
      rep.checks.push_back(compare(name, "host replay", values, replay.full.at(name), true, 0));
    }
  }
  for (const auto& [name, ranks] : tpr.per_rank) {
    TensorCheck c;
    c.tensor = name;
    c.against = "ranks";
    c.bitwise = true;
    for (const auto& b : ranks) c.bitwise = c.bitwise && b == ranks[0];
    c.pass = c.bitwise;
    rep.checks.push_back(c);
  }
  rep.pass = true;
  for (const auto& c : rep.checks) rep.pass = rep.pass && c.pass;
  return rep;
}

}  // namespace cubesim::tp
