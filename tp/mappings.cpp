#include "tp/mappings.h"

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/ops.h"
#include "tp/parallel_state.h"

namespace cubesim::tp {

namespace {
rt::Context& ctx(const char* what) { return rt::Context::current(what); }
int me(const char* what) { return rt::Context::current_rank(what); }

void check_2d(const rt::Tensor& x, const char* what) {
  if (x.dim() != 2) throw rt::RuntimeError(fmt::format("{}: expected a 2-D [tokens, features] tensor, got {}", what, x.describe()));
}

void check_divisible(std::int64_t size, int p, const char* what, const rt::Tensor& x, const char* dim) {
  if (size % p != 0) {
    throw rt::RuntimeError(fmt::format("{}: the {} dimension of {} ({}) is not divisible by the tensor-parallel size {}",
                                       what, dim, x.describe(), size, p));
  }
}
}  // namespace

rt::Tensor split_last_dim(const rt::Tensor& x) {
  check_2d(x, "split_last_dim");
  const int p = get_tensor_model_parallel_world_size();
  if (p == 1) return x;
  check_divisible(x.size(1), p, "split_last_dim", x, "feature");
  const rt::Tensor view = x.chunk(p, 1)[static_cast<std::size_t>(get_tensor_model_parallel_rank())];
  rt::Tensor out = ctx("split_last_dim").empty(me("split_last_dim"), view.shape(), x.dtype(), "split");
  rt::copy(view, out);
  return out;
}

rt::Tensor gather_last_dim(const rt::Tensor& x) {
  check_2d(x, "gather_last_dim");
  const int p = get_tensor_model_parallel_world_size();
  if (p == 1) return x;
  rt::Context& c = ctx("gather_last_dim");
  const int rank = me("gather_last_dim");
  rt::Tensor src = x;
  if (!x.is_contiguous()) {
    src = c.empty(rank, x.shape(), x.dtype(), "gather input");
    rt::copy(x, src);
  }
  rt::Tensor stacked = c.empty(rank, {p * x.size(0), x.size(1)}, x.dtype(), "gathered");
  rt::all_gather(stacked, src, &get_tensor_model_parallel_group());
  rt::Tensor out = c.empty(rank, {x.size(0), p * x.size(1)}, x.dtype(), "gather output");
  const auto blocks = stacked.chunk(p, 0);
  const auto cols = out.chunk(p, 1);
  for (int i = 0; i < p; ++i) rt::copy(blocks[static_cast<std::size_t>(i)], cols[static_cast<std::size_t>(i)]);
  return out;
}

rt::Tensor split_first_dim(const rt::Tensor& x) {
  check_2d(x, "split_first_dim");
  const int p = get_tensor_model_parallel_world_size();
  if (p == 1) return x;
  check_divisible(x.size(0), p, "split_first_dim", x, "token");
  return x.chunk(p, 0)[static_cast<std::size_t>(get_tensor_model_parallel_rank())];
}

rt::Tensor gather_first_dim(const rt::Tensor& x) {
  check_2d(x, "gather_first_dim");
  const int p = get_tensor_model_parallel_world_size();
  if (p == 1) return x;
  rt::Tensor out = ctx("gather_first_dim").empty(me("gather_first_dim"), {p * x.size(0), x.size(1)}, x.dtype(), "gathered");
  rt::all_gather(out, x, &get_tensor_model_parallel_group());
  return out;
}

rt::Tensor reduce_scatter_first_dim(const rt::Tensor& x) {
  check_2d(x, "reduce_scatter_first_dim");
  const int p = get_tensor_model_parallel_world_size();
  if (p == 1) return x;
  check_divisible(x.size(0), p, "reduce_scatter_first_dim", x, "token");
  rt::Tensor out = ctx("reduce_scatter_first_dim").empty(me("reduce_scatter_first_dim"), {x.size(0) / p, x.size(1)},
                                                          x.dtype(), "reduce-scattered");
  rt::reduce_scatter(out, x, rt::ReduceOp::sum, &get_tensor_model_parallel_group());
  return out;
}

rt::Work all_reduce_in_place(const rt::Tensor& x, bool async_op) {
  if (get_tensor_model_parallel_world_size() == 1) return rt::Work();
  return rt::all_reduce(x, rt::ReduceOp::sum, &get_tensor_model_parallel_group(), {.async_op = async_op});
}

namespace {
rt::Tensor identity(const rt::Tensor& x) { return x; }
rt::Tensor reduce(const rt::Tensor& x) {
  all_reduce_in_place(x);
  return x;
}
}  // namespace

const Mapping copy_to_tensor_model_parallel_region{identity, reduce};
const Mapping reduce_from_tensor_model_parallel_region{reduce, identity};
const Mapping scatter_to_tensor_model_parallel_region{split_last_dim, gather_last_dim};
const Mapping gather_from_tensor_model_parallel_region{gather_last_dim, split_last_dim};
const Mapping scatter_to_sequence_parallel_region{split_first_dim, gather_first_dim};
const Mapping gather_from_sequence_parallel_region{gather_first_dim, reduce_scatter_first_dim};
const Mapping reduce_scatter_to_sequence_parallel_region{reduce_scatter_first_dim, gather_first_dim};

}  // namespace cubesim::tp
