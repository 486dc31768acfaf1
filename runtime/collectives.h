// collectives.h — collectives on process groups, called from inside a rank's function.
//
// The calling rank is the process's own; tensors must live on it and be contiguous. `group`
// defaults to the world. Every rank of the group must make the same calls in the same order:
// mismatched calls (size, dtype, op, algorithm, kind) are a CollectiveError naming both ranks'
// calls, and a rank that never makes a call shows up in spawn()'s error as "ranks ... arrived;
// rank ... did not".
//
//   all_reduce(grad);                                         // sum, world, context's algorithm
//   Work w = all_reduce(grad, ReduceOp::sum, &tp_group, {.algorithm = Algorithm::tree, .async_op = true});
//   ... compute ...
//   w.wait();
//
// Which algorithms do which collective, and what they need of the group, is the table in
// runtime/algorithms/table.h (`cubesim algorithms` prints it); each algorithm's header there
// documents its chunking and reduction order.
// Reductions happen in the tensor's dtype with one rounding per step, as NCCL does; with
// accumulate_f32 the partial sums travel in f32 and are rounded once at the end.
#pragma once

#include "runtime/collective_types.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace cubesim::rt {

Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum, ProcessGroup* group = nullptr, CollectiveOptions o = {});
// out (p·n elements) = the inputs (n elements each) of the members, concatenated in group order.
Work all_gather(const Tensor& out, const Tensor& in, ProcessGroup* group = nullptr, CollectiveOptions o = {});
// out (n elements) = chunk `index` of the reduction of the members' inputs (p·n elements each).
Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum, ProcessGroup* group = nullptr,
                    CollectiveOptions o = {});
// Every member's t becomes the root's (root is a global rank in the group).
Work broadcast(const Tensor& t, int root, ProcessGroup* group = nullptr, CollectiveOptions o = {});
void barrier(ProcessGroup* group = nullptr);

// Point to point: the k-th send from a to b with a tag pairs with the k-th recv at b from a with
// that tag. Both block until the data has landed.
void send(const Tensor& t, int dst, int tag = 0, ProcessGroup* group = nullptr);
void recv(const Tensor& t, int src, int tag = 0, ProcessGroup* group = nullptr);

// Which algorithms a collective supports ("all_reduce", ...), for messages and tests.
std::vector<Algorithm> supported_algorithms(std::string_view collective);

}  // namespace cubesim::rt
