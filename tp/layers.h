// layers.h — Megatron-LM's ColumnParallelLinear, RowParallelLinear and ParallelMLP, forward and
// backward, written once against the runtime (they run on sim, host and cuda unchanged).
//
// Y = X·Wᵀ + b with W stored [out, in], as torch.nn.Linear.
//   ColumnParallelLinear: rank r holds rows [r·out/tp, (r+1)·out/tp) of W (shard [out/tp, in]) and
//     of b. Forward: X (gathered along tokens first when sequence_parallel) times its shard gives
//     its slice of Y's features; gather_output all-gathers the slices. Backward: the input
//     gradient's partial sums are all-reduced (reduce-scattered along tokens when
//     sequence_parallel), issued asynchronously so the weight-gradient GEMM overlaps them.
//   RowParallelLinear: rank r holds columns [r·in/tp, (r+1)·in/tp) of W (shard [out, in/tp]) and
//     the whole b. Forward: X's slice (split here unless input_is_parallel) times the shard gives a
//     partial Y, all-reduced (reduce-scattered along tokens when sequence_parallel); b is added
//     after the reduction.
//   ParallelMLP: column (skip_bias_add) -> bias + GELU (or bias, SwiGLU) -> row (input_is_parallel).
// Weights are shards of one master weight drawn from a counter-based generator (seed, layer id,
// element index), so the full weight is the same for every tp size; biases too (non-zero, so bias
// paths are tested; Megatron starts them at zero).
//
//   tp::initialize_model_parallel(4);
//   tp::ParallelMLP mlp(ctx, {.hidden = 4096, .ffn = 14336, .dtype = DType::bf16, .seed = 7});
//   rt::Tensor y = mlp.forward(x);
//   rt::Tensor dx = mlp.backward(dy);     // mlp.fc1.weight_grad, ... now hold the gradients
#pragma once

#include <cstdint>

#include "kernels/elementwise.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace cubesim::tp {

struct LinearOptions {
  bool bias = true;
  bool gather_output = false;      // column only
  bool input_is_parallel = false;  // row only
  bool skip_bias_add = false;      // return the bias instead of adding it
  bool sequence_parallel = false;
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;
  std::uint64_t layer_id = 0;      // selects the master weight's stream
  float init_std = 0.02f;
};

// Element (i, j) of a layer's master weight [out, in] (or, with j = -1, element i of its bias).
float master_value(std::uint64_t seed, std::uint64_t layer_id, std::int64_t i, std::int64_t j, std::int64_t cols,
                   float stddev);

struct LinearOutput {
  rt::Tensor output;
  rt::Tensor bias;  // defined when skip_bias_add
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear(rt::Context& ctx, std::int64_t in, std::int64_t out, LinearOptions o = {});
  LinearOutput forward(const rt::Tensor& x);
  rt::Tensor backward(const rt::Tensor& dy);  // returns dX; sets weight_grad and bias_grad

  std::int64_t in_features, out_features, out_per_rank;
  LinearOptions opts;
  rt::Tensor weight, bias, weight_grad, bias_grad;

 private:
  rt::Context& ctx_;
  int rank_;
  rt::Tensor input_;  // as used in the GEMM (gathered when sequence parallel)
};

class RowParallelLinear {
 public:
  RowParallelLinear(rt::Context& ctx, std::int64_t in, std::int64_t out, LinearOptions o = {});
  LinearOutput forward(const rt::Tensor& x);
  rt::Tensor backward(const rt::Tensor& dy);

  std::int64_t in_features, out_features, in_per_rank;
  LinearOptions opts;
  rt::Tensor weight, bias, weight_grad, bias_grad;

 private:
  rt::Context& ctx_;
  int rank_;
  rt::Tensor input_;  // this rank's slice of X
};

struct MlpOptions {
  std::int64_t hidden = 1024;
  std::int64_t ffn = 4096;
  kernels::GeluKind gelu = kernels::GeluKind::tanh;
  bool bias = true;
  bool sequence_parallel = false;
  DType dtype = DType::bf16;
  std::uint64_t seed = 1234;
  std::uint64_t id_offset = 0;  // fc1 and fc2 draw master weights 1 + id_offset and 2 + id_offset
  // SwiGLU instead of GELU (Megatron's gated_linear_unit with silu, the Llama MLP): fc1 is 2 x ffn wide,
  // its master rows in (gate, up) pairs (rows 2i and 2i + 1 feed feature i), so a rank's shard holds
  // whole pairs for any tp dividing ffn; activation = silu(gate)·up (rt::swiglu). Megatron stores each
  // rank's shard as [gates; ups] instead: the same model up to a permutation of fc1's rows, so its
  // checkpoints need that permutation to load here.
  bool swiglu = false;
};

class ParallelMLP {
 public:
  ParallelMLP(rt::Context& ctx, MlpOptions o);
  rt::Tensor forward(const rt::Tensor& x);
  rt::Tensor backward(const rt::Tensor& dy);

  MlpOptions opts;
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
  rt::Tensor pre_activation;  // fc1's output plus its bias (this rank's features; SwiGLU: (gate, up) pairs)
  rt::Tensor activation;      // GELU (or SwiGLU) of it

 private:
  rt::Context& ctx_;
  int rank_;
};

}  // namespace cubesim::tp
