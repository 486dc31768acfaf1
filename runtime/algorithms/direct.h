// direct.h — direct (one-shot, all-to-all) algorithms.
//
// Chunking: m chunks with chunk_range, chunk j owned by member j.
// reduce-scatter: every member sends chunk j straight to member j (all at once); member j then
//   combines the m contributions of chunk j in member order 0, 1, ..., m-1 (acc = x0; acc = op(acc,
//   x1); ...), whatever order they arrived in.
// all-gather: every member sends its chunk to every other, straight into place.
// all-reduce = reduce-scatter then all-gather, so every member holds bitwise the same result.
// broadcast: the root sends the whole buffer to every other member at once.
// The reductions wait for all contributions (they are not streamed) and are charged in full.
#pragma once

#include "runtime/algorithms/members.h"

namespace cubesim::rt::algo {

void direct_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void direct_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params& = {});
void direct_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void direct_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params& = {});

}  // namespace cubesim::rt::algo
