// The direct algorithms: per-rank code over Comm, in the chunking and reduction order direct.h documents.
#include "runtime/algorithms/direct.h"

#include <vector>

namespace cubesim::rt::algo {

void direct_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  const int M = m.size();
  if (M == 1) return;
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  for (int k = 0; k < M; ++k) {
    if (k != j) c.isend(m.at(k), region(flat, chunk_range(n, M, k)), tag(m.phase * 4, 0));
  }
  const Tensor mine = region(flat, chunk_range(n, M, j));
  std::vector<Tensor> contrib(static_cast<std::size_t>(M));
  for (int k = 0; k < M; ++k) {
    if (k == j) {
      contrib[static_cast<std::size_t>(k)] = mine;
      continue;
    }
    Tensor staged = c.scratch(mine.numel(), mine.dtype());
    c.recv(m.at(k), staged, tag(m.phase * 4, 0));
    contrib[static_cast<std::size_t>(k)] = staged;
  }
  // Member order, whatever the arrival order: acc = x0; acc = op(acc, x1); ...
  Tensor acc = contrib[0];
  if (j == 0) {
    acc = c.scratch(mine.numel(), mine.dtype());
    c.copy_local(acc, mine);
  }
  for (int k = 1; k < M; ++k) c.reduce_local(acc, contrib[static_cast<std::size_t>(k)], op);
  c.copy_local(mine, acc);
  c.wait_all();
}

void direct_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  const int M = m.size();
  if (M == 1) return;
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  for (int k = 0; k < M; ++k) {
    if (k != j) c.isend(m.at(k), region(flat, chunk_range(n, M, j)), tag(m.phase * 4 + 1, 0));
  }
  for (int k = 0; k < M; ++k) {
    if (k != j) c.recv(m.at(k), region(flat, chunk_range(n, M, k)), tag(m.phase * 4 + 1, 0));
  }
  c.wait_all();
}

void direct_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  direct_reduce_scatter(c, m, flat, op);
  direct_all_gather(c, m, flat);
}

void direct_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  const int M = m.size();
  if (M == 1) return;
  if (m.pos == 0) {
    for (int k = 1; k < M; ++k) c.isend(m.at(k), flat, tag(m.phase * 4 + 2, 0));
    c.wait_all();
  } else {
    c.recv(m.at(0), flat, tag(m.phase * 4 + 2, 0));
  }
}

}  // namespace cubesim::rt::algo
