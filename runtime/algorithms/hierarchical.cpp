// The hierarchical all-reduce: per-rank code over Comm, in the chunking and reduction order hierarchical.h documents.
#include "runtime/algorithms/hierarchical.h"

#include <fmt/format.h>

#include "runtime/algorithms/ring.h"
#include "runtime/errors.h"

namespace cubesim::rt::algo {

int default_hierarchy(int members) {
  int best = 1;
  for (int h = 1; h * h <= members; ++h) {
    if (members % h == 0) best = h;
  }
  return best;
}

void hierarchical_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& p) {
  const int M = m.size();
  int h = p.hierarchy;
  if (h <= 0) h = default_hierarchy(M);
  if (M % h != 0) {
    throw RuntimeError(fmt::format("{}: hierarchical needs the group size ({}) to be a multiple of the inner group "
                                   "size ({}); valid inner sizes divide {}",
                                   c.name(), M, h, M));
  }
  const int j = m.pos, g = j / h, a = j % h, G = M / h;
  Members inner, outer;
  for (int i = 0; i < h; ++i) inner.order.push_back(m.order[static_cast<std::size_t>(g * h + i)]);
  inner.pos = a;
  inner.phase = m.phase * 4 + 1;
  for (int i = 0; i < G; ++i) outer.order.push_back(m.order[static_cast<std::size_t>(i * h + a)]);
  outer.pos = g;
  outer.phase = m.phase * 4 + 2;
  ring_reduce_scatter(c, inner, flat, op);
  ring_all_reduce(c, outer, region(flat, chunk_range(flat.numel(), h, a)), op);
  ring_all_gather(c, inner, flat);
}

}  // namespace cubesim::rt::algo
