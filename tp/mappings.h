// mappings.h — Megatron-LM's tensor-parallel communication pairs, forward and backward.
//
// Tensors are 2-D [tokens, features] on the calling rank; the group is the tensor-parallel group.
// "Last dim" splits features across ranks (each rank's slice is rank-major: slice r is columns
// [r·c, (r+1)·c)); "first dim" splits tokens (sequence parallelism). All-reduces happen in place on
// the argument, as Megatron's do; splits and gathers return new tensors.
//
//   forward                                  backward
//   copy_to_tensor_model_parallel_region     identity            | all-reduce
//   reduce_from_tensor_model_parallel_region all-reduce          | identity
//   scatter_to_tensor_model_parallel_region  split last dim      | all-gather last dim
//   gather_from_tensor_model_parallel_region all-gather last dim | split last dim
//   scatter_to_sequence_parallel_region      split first dim     | all-gather first dim
//   gather_from_sequence_parallel_region     all-gather first    | reduce-scatter first dim
//   reduce_scatter_to_sequence_parallel_region reduce-scatter first | all-gather first dim
#pragma once

#include "runtime/collectives.h"
#include "runtime/tensor.h"

namespace cubesim::tp {

// The primitive operations (on the tensor-parallel group).
rt::Tensor split_last_dim(const rt::Tensor& x);
rt::Tensor gather_last_dim(const rt::Tensor& x);
rt::Tensor split_first_dim(const rt::Tensor& x);
rt::Tensor gather_first_dim(const rt::Tensor& x);
rt::Tensor reduce_scatter_first_dim(const rt::Tensor& x);
rt::Work all_reduce_in_place(const rt::Tensor& x, bool async_op = false);

// The pairs, by name, as Megatron spells them.
struct Mapping {
  rt::Tensor (*forward)(const rt::Tensor&);
  rt::Tensor (*backward)(const rt::Tensor&);
};
extern const Mapping copy_to_tensor_model_parallel_region;
extern const Mapping reduce_from_tensor_model_parallel_region;
extern const Mapping scatter_to_tensor_model_parallel_region;
extern const Mapping gather_from_tensor_model_parallel_region;
extern const Mapping scatter_to_sequence_parallel_region;
extern const Mapping gather_from_sequence_parallel_region;
extern const Mapping reduce_scatter_to_sequence_parallel_region;

}  // namespace cubesim::tp
