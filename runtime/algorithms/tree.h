// tree.h — double binary tree all-reduce (as NCCL's tree) and binary tree broadcast.
//
// Trees: over a member order L, the binary tree puts L[i]'s children at L[2i+1] and L[2i+2] (root
// L[0]). All-reduce uses two trees: tree 0 over L = (0, 1, ..., m-1) and tree 1 over the reverse,
// so most members that are inner nodes of one tree are leaves of the other.
// Chunking: the flat buffer is cut in two halves (chunk_range, 2 parts); half t goes through tree t.
//   Each half travels in pipelining slices (members.h), and the two trees run concurrently.
// Reduction order, per slice, at each node: acc = own; acc = op(acc, child0's partial); acc =
//   op(acc, child1's partial); then acc goes to the parent. The root's acc is the result, which is
//   then broadcast down the same tree, so every member holds bitwise the same result.
// Broadcast: one tree over L rotated so the root is L[0], in pipelining slices.
#pragma once

#include "runtime/algorithms/members.h"

namespace cubesim::rt::algo {

void tree_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void tree_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params& = {});

}  // namespace cubesim::rt::algo
