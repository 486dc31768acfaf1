// parallel_state.h — Megatron-LM's model-parallel state: which ranks form a tensor-parallel group.
//
// Every rank calls initialize_model_parallel(tp) inside Context::spawn (as each Megatron process
// does). Tensor-parallel groups are contiguous ranks: with world 8 and tp 4, {0,1,2,3} and
// {4,5,6,7}; the remaining dimension (world / tp) is data parallel, which is where more parallel
// dimensions will go. The state belongs to the Context, one entry per rank.
//
//   ctx.spawn(8, [&](int rank) {
//     tp::initialize_model_parallel(4);
//     int r = tp::get_tensor_model_parallel_rank();      // 0..3
//     rt::ProcessGroup& g = tp::get_tensor_model_parallel_group();
//     ...
//     tp::destroy_model_parallel();
//   });
#pragma once

#include "runtime/context.h"

namespace cubesim::tp {

void initialize_model_parallel(int tensor_model_parallel_size);
bool model_parallel_is_initialized();
void destroy_model_parallel();

int get_tensor_model_parallel_rank();
int get_tensor_model_parallel_world_size();
rt::ProcessGroup& get_tensor_model_parallel_group();
int get_data_parallel_rank();
int get_data_parallel_world_size();
rt::ProcessGroup& get_data_parallel_group();

}  // namespace cubesim::tp
