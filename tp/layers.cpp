#include "tp/layers.h"

#include <cmath>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/ops.h"
#include "tp/mappings.h"
#include "tp/parallel_state.h"

namespace cubesim::tp {

namespace {
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Host values of a [rows, cols] block of a layer's master weight (or of its bias when cols == 0).
std::vector<float> master_block(const LinearOptions& o, std::int64_t r0, std::int64_t rows, std::int64_t c0,
                                std::int64_t cols, std::int64_t full_cols) {
  std::vector<float> v;
  v.reserve(static_cast<std::size_t>(rows * std::max<std::int64_t>(cols, 1)));
  for (std::int64_t i = r0; i < r0 + rows; ++i) {
    if (cols == 0) {
      v.push_back(master_value(o.seed, o.layer_id, i, -1, full_cols, o.init_std));
      continue;
    }
    for (std::int64_t j = c0; j < c0 + cols; ++j) v.push_back(master_value(o.seed, o.layer_id, i, j, full_cols, o.init_std));
  }
  return v;
}

// A parameter tensor: the master values when the backend keeps values, else just the storage.
template <class Values>
rt::Tensor init(rt::Context& ctx, int rank, rt::Shape shape, DType dtype, Values values) {
  if (ctx.backend().timing_only()) return ctx.empty(rank, std::move(shape), dtype, "parameter");
  return ctx.from_host_f32(rank, std::move(shape), dtype, values());
}

void check_input(const rt::Tensor& x, std::int64_t features, DType dtype, const char* layer, const char* what) {
  const int rank = rt::Context::current_rank(layer);
  if (x.device() != rank) {
    throw rt::RuntimeError(fmt::format("{}: {} {} lives on rank {}, but this rank ({}) holds the layer's shard", layer,
                                       what, x.describe(), x.device(), rank));
  }
  if (x.dim() != 2 || x.size(1) != features) {
    throw rt::RuntimeError(fmt::format("{}: {} must be [tokens, {}], got {}", layer, what, features, x.describe()));
  }
  if (x.dtype() != dtype) {
    throw rt::RuntimeError(fmt::format("{}: {} has dtype {} but the layer is {}", layer, what, dtype_name(x.dtype()),
                                       dtype_name(dtype)));
  }
}

void check_divides(std::int64_t features, int tp, const char* layer, const char* which) {
  if (features % tp != 0) {
    throw rt::RuntimeError(fmt::format("{}: {} features ({}) are not divisible by the tensor-parallel size {}; use a tp "
                                       "size that divides {}",
                                       layer, which, features, tp, features));
  }
}
}  // namespace

float master_value(std::uint64_t seed, std::uint64_t layer_id, std::int64_t i, std::int64_t j, std::int64_t cols,
                   float stddev) {
  const std::uint64_t idx = j < 0 ? (std::uint64_t{1} << 62) + static_cast<std::uint64_t>(i)
                                  : static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(cols) + static_cast<std::uint64_t>(j);
  const std::uint64_t base = mix(seed ^ mix(layer_id + 0x51ed27c3ull));
  const std::uint64_t a = mix(base ^ (2 * idx)), b = mix(base ^ (2 * idx + 1));
  const double u1 = (static_cast<double>(a >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);  // Box-Muller
  return static_cast<float>(stddev * z);
}

// ---------------------------------------------------------------- column
ColumnParallelLinear::ColumnParallelLinear(rt::Context& ctx, std::int64_t in, std::int64_t out, LinearOptions o)
    : in_features(in), out_features(out), opts(o), ctx_(ctx), rank_(rt::Context::current_rank("ColumnParallelLinear")) {
  const int tp = get_tensor_model_parallel_world_size();
  check_divides(out, tp, "ColumnParallelLinear", "output");
  if (o.gather_output && o.sequence_parallel) {
    throw rt::RuntimeError("ColumnParallelLinear: gather_output and sequence_parallel cannot both be set (as in Megatron)");
  }
  out_per_rank = out / tp;
  const std::int64_t r0 = get_tensor_model_parallel_rank() * out_per_rank;
  weight = init(ctx, rank_, {out_per_rank, in}, o.dtype, [&] { return master_block(o, r0, out_per_rank, 0, in, in); });
  if (o.bias) bias = init(ctx, rank_, {out_per_rank}, o.dtype, [&] { return master_block(o, r0, out_per_rank, 0, 0, in); });
}

LinearOutput ColumnParallelLinear::forward(const rt::Tensor& x) {
  check_input(x, in_features, opts.dtype, "ColumnParallelLinear.forward", "input");
  input_ = opts.sequence_parallel ? gather_from_sequence_parallel_region.forward(x)
                                  : copy_to_tensor_model_parallel_region.forward(x);
  rt::Tensor y = ctx_.empty(rank_, {input_.size(0), out_per_rank}, opts.dtype, "column output");
  const bool add = opts.bias && !opts.skip_bias_add;
  rt::matmul(input_, weight.t(), add ? &bias : nullptr, y, "column fprop");
  LinearOutput out;
  out.output = opts.gather_output ? gather_from_tensor_model_parallel_region.forward(y) : y;
  if (opts.bias && opts.skip_bias_add) out.bias = bias;
  return out;
}

rt::Tensor ColumnParallelLinear::backward(const rt::Tensor& dy) {
  if (!input_.defined()) throw rt::RuntimeError("ColumnParallelLinear.backward called before forward");
  const rt::Tensor g = opts.gather_output ? gather_from_tensor_model_parallel_region.backward(dy) : dy;
  if (g.dim() != 2 || g.size(0) != input_.size(0) || g.size(1) != out_per_rank) {
    throw rt::RuntimeError(fmt::format("ColumnParallelLinear.backward: output gradient {} does not match the output "
                                       "[{}, {}]",
                                       dy.describe(), input_.size(0), opts.gather_output ? out_features : out_per_rank));
  }
  rt::Tensor dx = ctx_.empty(rank_, {g.size(0), in_features}, opts.dtype, "column dgrad");
  rt::matmul(g, weight, nullptr, dx, "column dgrad");
  // The input gradient's reduction overlaps the weight gradient (Megatron's async all-reduce).
  rt::Work w;
  if (!opts.sequence_parallel) w = all_reduce_in_place(dx, /*async_op=*/true);
  weight_grad = ctx_.empty(rank_, {out_per_rank, in_features}, opts.dtype, "column wgrad");
  rt::matmul(g.t(), input_, nullptr, weight_grad, "column wgrad");
  if (opts.bias) {
    bias_grad = ctx_.empty(rank_, {out_per_rank}, opts.dtype, "column bgrad");
    rt::bias_grad(g, bias_grad);
  }
  if (opts.sequence_parallel) return gather_from_sequence_parallel_region.backward(dx);
  w.wait();
  return dx;
}

// ---------------------------------------------------------------- row
RowParallelLinear::RowParallelLinear(rt::Context& ctx, std::int64_t in, std::int64_t out, LinearOptions o)
    : in_features(in), out_features(out), opts(o), ctx_(ctx), rank_(rt::Context::current_rank("RowParallelLinear")) {
  const int tp = get_tensor_model_parallel_world_size();
  check_divides(in, tp, "RowParallelLinear", "input");
  if (o.sequence_parallel && !o.input_is_parallel) {
    throw rt::RuntimeError("RowParallelLinear: sequence_parallel needs input_is_parallel (as in Megatron)");
  }
  in_per_rank = in / tp;
  const std::int64_t c0 = get_tensor_model_parallel_rank() * in_per_rank;
  weight = init(ctx, rank_, {out, in_per_rank}, o.dtype, [&] { return master_block(o, 0, out, c0, in_per_rank, in); });
  if (o.bias) bias = init(ctx, rank_, {out}, o.dtype, [&] { return master_block(o, 0, out, 0, 0, in); });
}

LinearOutput RowParallelLinear::forward(const rt::Tensor& x) {
  if (opts.input_is_parallel) {
    check_input(x, in_per_rank, opts.dtype, "RowParallelLinear.forward", "input (already split)");
    input_ = x;
  } else {
    check_input(x, in_features, opts.dtype, "RowParallelLinear.forward", "input");
    input_ = scatter_to_tensor_model_parallel_region.forward(x);
  }
  rt::Tensor partial = ctx_.empty(rank_, {input_.size(0), out_features}, opts.dtype, "row partial");
  rt::matmul(input_, weight.t(), nullptr, partial, "row fprop");
  rt::Tensor y = opts.sequence_parallel ? reduce_scatter_to_sequence_parallel_region.forward(partial)
                                        : reduce_from_tensor_model_parallel_region.forward(partial);
  LinearOutput out;
  if (opts.bias && !opts.skip_bias_add) {
    rt::add_bias(y, bias, y);  // after the reduction: added once, not tp times
  } else if (opts.bias) {
    out.bias = bias;
  }
  out.output = y;
  return out;
}

rt::Tensor RowParallelLinear::backward(const rt::Tensor& dy) {
  if (!input_.defined()) throw rt::RuntimeError("RowParallelLinear.backward called before forward");
  const rt::Tensor g = opts.sequence_parallel ? reduce_scatter_to_sequence_parallel_region.backward(dy)
                                              : reduce_from_tensor_model_parallel_region.backward(dy);
  if (g.dim() != 2 || g.size(0) != input_.size(0) || g.size(1) != out_features) {
    throw rt::RuntimeError(fmt::format("RowParallelLinear.backward: output gradient {} does not match the output", dy.describe()));
  }
  rt::Tensor dx = ctx_.empty(rank_, {g.size(0), in_per_rank}, opts.dtype, "row dgrad");
  rt::matmul(g, weight, nullptr, dx, "row dgrad");
  weight_grad = ctx_.empty(rank_, {out_features, in_per_rank}, opts.dtype, "row wgrad");
  rt::matmul(g.t(), input_, nullptr, weight_grad, "row wgrad");
  if (opts.bias) {
    bias_grad = ctx_.empty(rank_, {out_features}, opts.dtype, "row bgrad");
    rt::bias_grad(g, bias_grad);
  }
  return opts.input_is_parallel ? dx : scatter_to_tensor_model_parallel_region.backward(dx);
}

// ---------------------------------------------------------------- MLP
namespace {
LinearOptions fc1_opts(const MlpOptions& o) {
  LinearOptions l;
  l.bias = o.bias;
  l.skip_bias_add = true;  // bias + GELU, as Megatron fuses them
  l.sequence_parallel = o.sequence_parallel;
  l.dtype = o.dtype;
  l.seed = o.seed;
  l.layer_id = 1 + o.id_offset;
  return l;
}
LinearOptions fc2_opts(const MlpOptions& o) {
  LinearOptions l;
  l.bias = o.bias;
  l.input_is_parallel = true;
  l.sequence_parallel = o.sequence_parallel;
  l.dtype = o.dtype;
  l.seed = o.seed;
  l.layer_id = 2 + o.id_offset;
  return l;
}
}  // namespace

namespace {
// fc1's width, after checking that tp divides ffn (with SwiGLU fc1 is 2 x ffn wide, and fc1's own
// check would name 2 x ffn).
std::int64_t fc1_width(const MlpOptions& o) {
  check_divides(o.ffn, get_tensor_model_parallel_world_size(), "ParallelMLP", o.swiglu ? "ffn (SwiGLU)" : "ffn");
  return o.swiglu ? 2 * o.ffn : o.ffn;
}
}  // namespace

ParallelMLP::ParallelMLP(rt::Context& ctx, MlpOptions o)
    : opts(o), fc1(ctx, o.hidden, fc1_width(o), fc1_opts(o)), fc2(ctx, o.ffn, o.hidden, fc2_opts(o)), ctx_(ctx),
      rank_(rt::Context::current_rank("ParallelMLP")) {}

rt::Tensor ParallelMLP::forward(const rt::Tensor& x) {
  LinearOutput h = fc1.forward(x);
  pre_activation = h.output;
  if (opts.swiglu) {
    if (h.bias.defined()) rt::add_bias(pre_activation, h.bias, pre_activation);
    activation = ctx_.empty(rank_, {pre_activation.size(0), pre_activation.size(1) / 2}, opts.dtype, "activation");
    rt::swiglu(pre_activation, activation);
    return fc2.forward(activation).output;
  }
  activation = ctx_.empty(rank_, pre_activation.shape(), opts.dtype, "activation");
  if (h.bias.defined()) {
    rt::bias_gelu(opts.gelu, pre_activation, h.bias, pre_activation, activation);  // fused, as Megatron's bias-GELU
  } else {
    rt::gelu(opts.gelu, pre_activation, activation);
  }
  return fc2.forward(activation).output;
}

rt::Tensor ParallelMLP::backward(const rt::Tensor& dy) {
  rt::Tensor da = fc2.backward(dy);
  rt::Tensor dpre = ctx_.empty(rank_, pre_activation.shape(), opts.dtype, "activation grad");
  if (opts.swiglu) {
    rt::swiglu_backward(pre_activation, da, dpre);
  } else {
    rt::gelu_backward(opts.gelu, pre_activation, da, dpre);
  }
  return fc1.backward(dpre);
}

}  // namespace cubesim::tp
