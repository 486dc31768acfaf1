// equivalence.h — does the tensor-parallel MLP compute what the unsharded one does?
//
// check_mlp_equivalence runs ParallelMLP forward and backward with tp ranks on a context (any
// backend), the unsharded model (tp 1) on the host, and, when the context is not the host, the same
// tp program on the host with the context's collective settings (algorithm, accumulate_f32,
// hierarchy): the replay of the same reduction order. Every run is a tp::run_mlp_step
// (tp/mlp_step.h) on the same seeded data. Per tensor it reports max abs
// error and relative norm ‖got − ref‖ / ‖ref‖ against each reference, and whether the claim holds:
//   vs unsharded: bitwise where the contract fixes the order — fc1's output (column-parallel
//     forward) and every weight and bias gradient — and within tolerance(dtype, tp) for the
//     row-parallel output and the input gradient, which sum tp partials;
//   vs host replay: bitwise, every tensor;
//   across ranks: bitwise, every tensor all ranks hold after an all-reduce.
//
//   auto rep = tp::check_mlp_equivalence(*ctx, {.mlp = {.hidden = 512, .ffn = 2048}, .tokens = 64, .tp = 4});
//   for (auto& c : rep.checks) fmt::print("{} vs {}: {} (max abs {})\n", c.tensor, c.against, c.pass, c.max_abs);
#pragma once

#include <string>
#include <vector>

#include "runtime/context.h"
#include "tp/gpt.h"
#include "tp/layers.h"

namespace cubesim::tp {

struct MlpCheckOptions {
  MlpOptions mlp;
  std::int64_t tokens = 64;
  int tp = 1;
  std::uint64_t data_seed = 99;  // inputs and output gradients
};

struct TensorCheck {
  std::string tensor;   // "output", "input_grad", "fc1.weight_grad", ...
  std::string against;  // "unsharded", "host replay", "ranks"
  bool bitwise_claim = true;
  bool bitwise = false;
  double max_abs = 0;
  double rel_norm = 0;
  double tolerance = 0;  // for a tolerance claim
  bool pass = false;
};

struct EquivalenceReport {
  std::vector<TensorCheck> checks;
  bool pass = false;
  rt::RunReport run;  // of the tp run on the given context
  double mean_loss = 0;  // check_gpt_equivalence: the tp run's mean per-token loss
};

// Relative-norm tolerance for results that sum tp partials, each rounded to dtype.
double tp_tolerance(DType d, int tp);

EquivalenceReport check_mlp_equivalence(rt::Context& ctx, const MlpCheckOptions& o);

// The same for GPTModel (tp/gpt_step.h): vs unsharded bitwise at tp 1 and within gpt_tolerance
// above it (every tensor is downstream of a reduction of tp partials: the attention and MLP outputs,
// the loss's sums); vs host replay bitwise; across ranks bitwise for the loss and every replicated
// gradient.
struct GptCheckOptions {
  GptOptions model;
  std::int64_t batch = 1;
  int tp = 1;
  std::uint64_t data_seed = 99;
  std::vector<std::int64_t> lengths = {};  // right padding per sequence (GptStepOptions::lengths); empty: none
};
double gpt_tolerance(DType d, int tp, int layers);  // layers x tp_tolerance (bf16 tp 4, 2 layers: 0.0625; measured <= 0.008)
EquivalenceReport check_gpt_equivalence(rt::Context& ctx, const GptCheckOptions& o);

}  // namespace cubesim::tp
