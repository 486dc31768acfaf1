// halving_doubling.h — recursive halving (reduce-scatter) and recursive doubling (all-gather):
// Rabenseifner's all-reduce.
//
// For m = 2^q members: reduce-scatter takes q steps. At step i (distance d = m/2, m/4, ..., 1) the
//   member at position v pairs with v XOR d; its current segment is cut in two (chunk_range, 2
//   parts); the lower position keeps the lower half; each sends the half it gives up and combines
//   the partner's copy of the half it keeps: own = op(own, partner's). Position v ends with segment
//   v (of m, nested halves), fully reduced. All-gather runs the steps in reverse (d = 1, 2, ...),
//   exchanging whole segments.
// Other sizes (all-reduce only): with p2 the largest power of two below m and e = m - p2, first
//   each odd position 2i+1 < 2e sends its whole buffer to 2i, which combines it (own = op(own,
//   odd's)); the p2 survivors (even positions below 2e, and every position from 2e) run the
//   power-of-two algorithm; finally each 2i sends the result back to 2i+1.
// Every element is reduced at exactly one member and copied from there, so all members hold bitwise
// the same result.
#pragma once

#include "runtime/algorithms/members.h"

namespace cubesim::rt::algo {

void hd_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
// Power-of-two member counts only: the table (table.h) holds that need and checks it before the
// call, so the error names the collective call and the algorithms that would do.
void hd_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void hd_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params& = {});

}  // namespace cubesim::rt::algo
