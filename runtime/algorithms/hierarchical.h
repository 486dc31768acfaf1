// hierarchical.h — two-level all-reduce: inside groups of h consecutive members, then across.
//
// With m members and inner size h (m % h == 0; h from CollectiveOptions::hierarchy, else the
// context's, else the largest divisor of m not above sqrt(m)), inner group g holds positions
// [g·h, (g+1)·h). Chunking: the flat buffer is cut into h chunks (chunk_range).
//   1. ring reduce-scatter inside each inner group: inner position a ends with chunk a summed over
//      its group (ring order, see ring.h);
//   2. for each a, the members at inner position a of every group form an outer ring and run a
//      ring all-reduce of chunk a (that chunk cut into m/h parts);
//   3. ring all-gather inside each inner group.
// So each element is summed first within its group in ring order, then across groups in ring
// order; every member holds bitwise the same result. On a two-level machine (GPUs of a node, then
// nodes) the outer step crosses the slow links with 1/h of the data.
#pragma once

#include "runtime/algorithms/members.h"

namespace cubesim::rt::algo {

void hierarchical_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& p = {});
int default_hierarchy(int members);

}  // namespace cubesim::rt::algo
