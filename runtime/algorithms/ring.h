// ring.h — ring algorithms (as NCCL's ring, without its channel parallelism).
//
// Chunking: the flat buffer of n elements is cut into m = members chunks with chunk_range (the
// first n % m chunks one element longer). Member at ring position j sends to j+1 and receives from
// j-1.
//
// reduce-scatter, m-1 steps: at step s, position j sends chunk (j-s-1) mod m and receives chunk
//   (j-s-2) mod m, combining it into its own copy: own = op(own, incoming). So chunk c is summed in
//   ring order starting after its owner: ((x[c+1] + x[c+2]) + ...) + x[c], and position c ends with
//   chunk c fully reduced. Each step's reduction streams with its receive (no extra time unless
//   slower than the link).
// all-gather, m-1 steps: at step s, position j sends chunk (j-s) mod m and receives chunk (j-s-1)
//   mod m in place.
// all-reduce = reduce-scatter then all-gather: 2(m-1) steps of n/m elements, so on a ring of links
//   of latency a and bandwidth b it takes 2(m-1)(a + (n/m)·size/b) — the alpha-beta formula.
// broadcast: a chain from position 0 (the root) through the ring, in pipelining slices (members.h):
//   each position forwards slice k as soon as it has it.
#pragma once

#include "runtime/algorithms/members.h"

namespace cubesim::rt::algo {

void ring_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void ring_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params& = {});
void ring_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void ring_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params& = {});

}  // namespace cubesim::rt::algo
