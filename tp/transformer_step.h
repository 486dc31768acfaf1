// transformer_step.h — one owner of "run a TransformerLayer step on tp ranks" (as mlp_step.h is
// for the MLP): spawn the ranks, build the layer, place the data, run forward and backward, read
// back what the caller asked for.
//
//   auto res = tp::run_transformer_step(*ctx, {.layer = {.hidden = 512, .heads = 8, .kv_heads = 2,
//                                                        .ffn = 2048, .seq = 128},
//                                             .batch = 2, .tp = 4, .collect = tp::Collect::all});
//   const auto& y0 = res.tensors[0].at("output");   // rank 0's output rows, bytes in the dtype
//
// Data: x ~ N(0, 1) and dy ~ 0.1·N(0, 1), both [batch x seq, hidden], drawn in that order from
// std::mt19937_64(data_seed) and rounded to the dtype. With sequence parallelism rank r gets rows
// [r·rows/tp, (r+1)·rows/tp); otherwise every rank gets all rows.
// Collected per rank (Collect::outputs): "output", "input_grad"; (Collect::all) also
// "attention.qkv_output", "attention.context" (this rank's groups and heads), the weight gradients
// "attention.qkv.weight_grad" (rows: this rank's groups), "attention.proj.weight_grad" (columns: its
// heads), "mlp.fc1.weight_grad" (rows), "mlp.fc2.weight_grad" (columns), "input_norm.weight_grad",
// "post_attention_norm.weight_grad" (whole), and with bias the matching ".bias_grad"s.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "tp/mlp_step.h"
#include "tp/transformer.h"

namespace cubesim::tp {

struct TransformerStepOptions {
  TransformerLayerOptions layer = {};
  std::int64_t batch = 1;  // sequences of layer.seq tokens
  int tp = 1;
  std::uint64_t data_seed = 99;
  Collect collect = Collect::none;
};

struct TransformerStepResult {
  rt::RunReport report;
  std::vector<std::map<std::string, std::vector<std::uint8_t>>> tensors;  // per rank
};

// Throws RuntimeError naming the option for a tp outside 1..world_size, batch below 1, sequence
// parallelism with rows not divisible by tp, or collect on a timing-only context; the layers refuse
// their own invalid sizes (heads, kv_heads, ffn against tp).
TransformerStepResult run_transformer_step(rt::Context& ctx, const TransformerStepOptions& o);

// Every gradient a layer holds after its backward, as bytes under prefix + its name (the names above).
void collect_layer_grads(const TransformerLayer& layer, const std::string& prefix,
                         std::map<std::string, std::vector<std::uint8_t>>& out);

}  // namespace cubesim::tp
