// gpt_step.h — one owner of "run a GPTModel step on tp ranks" (as mlp_step.h is for the MLP): spawn
// the ranks, build the model, draw the tokens, run forward and backward, read back what was asked.
//
//   auto res = tp::run_gpt_step(*ctx, {.model = {.vocab = 1024, .hidden = 256, .heads = 8, .ffn = 1024,
//                                                .seq = 128, .layers = 2},
//                                      .batch = 2, .tp = 4, .collect = tp::Collect::all});
//   res.mean_loss;                              // the step's loss (rank 0's, every rank holds it)
//
// Data: per sequence seq + 1 token ids uniform in [0, vocab) from std::mt19937_64(data_seed): the
// first seq are the inputs, the last seq the targets (the next tokens).
// Collected per rank (Collect::outputs): "loss" (f32 per token); (Collect::all) also
// "embedding.weight_grad" (rows: this rank's vocabulary slice; with tied embeddings it includes the LM
// head's), "lm_head.weight_grad" (untied only, rows), "final_norm.weight_grad" (and bias) and
// "layers.I.NAME" for every gradient run_transformer_step collects of layer I (same splits).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "tp/gpt.h"
#include "tp/mlp_step.h"

namespace cubesim::tp {

struct GptStepOptions {
  GptOptions model = {};
  std::int64_t batch = 1;
  int tp = 1;
  std::uint64_t data_seed = 99;
  Collect collect = Collect::none;
  // Right padding: each sequence's real tokens (GPTModel::forward's lengths, the loss mask); empty:
  // none padded. mean_loss is then over the real tokens.
  std::vector<std::int64_t> lengths = {};
};

struct GptStepResult {
  rt::RunReport report;
  std::vector<std::map<std::string, std::vector<std::uint8_t>>> tensors;  // per rank
  double mean_loss = 0;  // NaN on a timing-only context
};

// Throws RuntimeError naming the option for a tp outside 1..world_size, batch below 1, or collect on a
// timing-only context; the layers refuse their own sizes (vocab, heads, kv_heads, ffn against tp).
GptStepResult run_gpt_step(rt::Context& ctx, const GptStepOptions& o);

}  // namespace cubesim::tp
