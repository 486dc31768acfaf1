// mlp_step.h — one owner of "run a ParallelMLP step on tp ranks": spawn the ranks, build the
// model, place the inputs, run forward and backward, read back what the caller asked for.
//
// The equivalence check (tp/equivalence.h), `cubesim.tp.run_mlp`, cubesim-xcheck and bench_tp_mlp
// all run their MLP through run_mlp_step: the data, its placement and what is read back are written
// once.
//
//   auto res = tp::run_mlp_step(*ctx, {.mlp = {.hidden = 1024, .ffn = 4096}, .tokens = 256, .tp = 4,
//                                      .collect = tp::Collect::outputs});
//   fmt::print("{}\n", sim::format_time(res.report.sim_time));
//   const std::vector<std::uint8_t>& y0 = res.tensors[0].at("output");   // rank 0's output, bf16 bytes
//
// Data: x ~ N(0, 1) and dy ~ 0.1·N(0, 1), both [tokens, hidden], drawn in that order from
// std::mt19937_64(data_seed) and rounded to the dtype — or the caller's values. With sequence
// parallelism rank r gets rows [r·tokens/tp, (r+1)·tokens/tp); otherwise every rank gets all rows.
// A timing-only context keeps no values, so none are drawn or read and nothing can be collected.
//
// Placement is part of the result: it decides the HBM addresses of every tensor, and the memory
// model turns addresses into time (channel interleaving), so it changes simulated times and traces. By default dy is placed
// just before the first backward (where a loss gradient appears in training) and, unless tensors
// are collected or held, x and each output are freed as soon as the step is done with them. A
// benchmark that stages its data up front says so (inputs_first), and a loop that reuses its
// tensors holds them (hold_tensors).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "tp/layers.h"

namespace cubesim::tp {

// What to read back from every rank after the last iteration, as bytes in the model's dtype.
//   outputs: "output", "input_grad";
//   all:     those, "fc1.output" (fc1's output plus its bias, this rank's features: pre_activation),
//            "fc1.weight_grad", "fc2.weight_grad" and, with bias, "fc1.bias_grad", "fc2.bias_grad".
enum class Collect { none, outputs, all };

struct MlpStepOptions {
  MlpOptions mlp = {};
  std::int64_t tokens = 64;
  int tp = 1;  // ranks 0..tp-1 of the context; sequence parallelism applies only when tp > 1
  std::uint64_t data_seed = 99;
  // The caller's data, [tokens, hidden] row-major each (rounded to the dtype when placed); empty:
  // drawn from data_seed. Not read on a timing-only context.
  std::vector<float> x = {}, dy = {};
  int iterations = 1;  // forward + backward, repeated on the same inputs
  Collect collect = Collect::none;
  // Brackets each iteration with Backend::begin_region("step"), so a measuring backend (cuda)
  // times whole steps: MlpStepResult::steps holds the tokens for Backend::measured_seconds.
  bool step_regions = false;
  bool inputs_first = false;  // place dy with x, before the first forward
  bool hold_tensors = false;  // keep x and the outputs to the end of the run (collect implies it)
  // Iterations after the first as one recorded graph each rank launches (Backend::graph_begin: CUDA
  // graphs on the cuda backend): iteration 2 is recorded before its region opens, then every
  // iteration from 2 on launches it, on the same tensors. x is held to the end. Where the backend
  // records no graph (sim, host; cuda with several ranks) the iterations run as usual. The same values either way: a graph replays the recorded kernels on the same data.
  bool graph = false;
};

struct MlpStepResult {
  rt::RunReport report;
  // Per rank: tensor name -> bytes (MlpStepOptions::collect); empty maps with Collect::none.
  std::vector<std::map<std::string, std::vector<std::uint8_t>>> tensors;
  // Per rank: the begin_region token of each iteration (with step_regions).
  std::vector<std::vector<std::uint64_t>> steps;
  int graphs = 0;  // ranks that recorded their iterations as a graph and launched it (MlpStepOptions::graph)
};

// Runs the step; throws RuntimeError naming the option for a tp outside 1..world_size, sequence
// parallelism with tokens not divisible by tp, sizes below 1, data of the wrong size, or collect on
// a timing-only context. (An ffn that tp does not divide is the layers' error, raised on every rank
// as they are built; valid_tp_sizes lists the tp values that avoid it.)
MlpStepResult run_mlp_step(rt::Context& ctx, const MlpStepOptions& o);

// The tp values 1..devices that a model allows: tp divides ffn and, with sequence parallelism,
// tokens. (Throws RuntimeError for devices, ffn or tokens below 1.)
std::vector<int> valid_tp_sizes(const MlpOptions& mlp, std::int64_t tokens, int devices);

}  // namespace cubesim::tp
