// The tree algorithms: per-rank code over Comm, in the chunking and reduction order tree.h documents.
#include "runtime/algorithms/tree.h"

#include <memory>
#include <vector>

#include <fmt/format.h>

#include "sim/core/event.h"

namespace cubesim::rt::algo {

namespace {
// One binary tree over the member positions `L` (L[i]'s children at 2i+1, 2i+2); `i` is the
// caller's index in L.
void tree_reduce_broadcast(Comm& c, const std::vector<int>& L, int i, const Tensor& part, ReduceOp op,
                           std::uint64_t phase, bool reduce) {
  const int M = static_cast<int>(L.size());
  const int parent = i > 0 ? (i - 1) / 2 : -1;
  const int kids[2] = {2 * i + 1, 2 * i + 2};
  const int S = slices_for(part.nbytes());
  std::vector<Comm::Send> up(static_cast<std::size_t>(S));
  if (reduce) {
    for (int k = 0; k < S; ++k) {
      const Tensor sl = region(part, chunk_range(part.numel(), S, k));
      for (int ch : kids) {
        if (ch < M) c.recv_reduce(L[static_cast<std::size_t>(ch)], sl, op, tag(phase, k, 0));
      }
      if (parent >= 0) up[static_cast<std::size_t>(k)] = c.isend(L[static_cast<std::size_t>(parent)], sl, tag(phase, k, 0));
    }
  }
  for (int k = 0; k < S; ++k) {
    const Tensor sl = region(part, chunk_range(part.numel(), S, k));
    if (parent >= 0) {
      if (reduce) c.wait(up[static_cast<std::size_t>(k)]);
      c.recv(L[static_cast<std::size_t>(parent)], sl, tag(phase, k, 1));
    }
    for (int ch : kids) {
      if (ch < M) c.isend(L[static_cast<std::size_t>(ch)], sl, tag(phase, k, 1));
    }
  }
}
}  // namespace

void tree_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  const int M = m.size();
  if (M == 1) return;
  std::vector<int> L0 = m.order, L1(m.order.rbegin(), m.order.rend());
  const Tensor half0 = region(flat, chunk_range(flat.numel(), 2, 0));
  const Tensor half1 = region(flat, chunk_range(flat.numel(), 2, 1));
  // Tree 1 runs in a helper process of this rank, concurrently with tree 0.
  auto done = std::make_shared<sim::Event>(c.name() + ": tree 1");
  c.context().spawn_for_rank(c.rank(), fmt::format("rank{}/tree1", c.rank()), [&c, L1, M, half1, op, done, &m] {
    tree_reduce_broadcast(c, L1, M - 1 - m.pos, half1, op, m.phase * 4 + 1, true);
    done->trigger();
  });
  tree_reduce_broadcast(c, L0, m.pos, half0, op, m.phase * 4, true);
  done->wait();
  c.wait_all();
}

void tree_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  if (m.size() == 1) return;
  tree_reduce_broadcast(c, m.order, m.pos, flat, ReduceOp::sum, m.phase * 4 + 2, false);
  c.wait_all();
}

}  // namespace cubesim::rt::algo
