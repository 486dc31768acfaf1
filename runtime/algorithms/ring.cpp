// The ring algorithms: per-rank code over Comm, in the chunking and reduction order ring.h documents.
#include "runtime/algorithms/ring.h"

#include "runtime/algorithms/ring_callbacks.h"

namespace cubesim::rt::algo {

void ring_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  const int M = m.size();
  if (M == 1 || ring_by_callbacks(c, m, flat, op, RingPhases::reduce_scatter)) return;
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  const int next = m.at(j + 1), prev = m.at(j - 1);
  Tensor out, in;  // the step's chunks, views rewritten in place (no allocation per step)
  for (int s = 0; s < M - 1; ++s) {
    c.isend(next, region(out, flat, chunk_range(n, M, Members::mod(j - s - 1, M))), tag(m.phase * 4, s));
    c.recv_reduce(prev, region(in, flat, chunk_range(n, M, Members::mod(j - s - 2, M))), op, tag(m.phase * 4, s));
  }
  c.wait_all();
}

void ring_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  const int M = m.size();
  if (M == 1 || ring_by_callbacks(c, m, flat, ReduceOp::sum, RingPhases::all_gather)) return;
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  const int next = m.at(j + 1), prev = m.at(j - 1);
  Tensor out, in;
  for (int s = 0; s < M - 1; ++s) {
    c.isend(next, region(out, flat, chunk_range(n, M, Members::mod(j - s, M))), tag(m.phase * 4 + 1, s));
    c.recv(prev, region(in, flat, chunk_range(n, M, Members::mod(j - s - 1, M))), tag(m.phase * 4 + 1, s));
  }
  c.wait_all();
}

void ring_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  if (m.size() > 1 && ring_by_callbacks(c, m, flat, op, RingPhases::all_reduce)) return;
  ring_reduce_scatter(c, m, flat, op);
  ring_all_gather(c, m, flat);
}

void ring_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  const int M = m.size();
  if (M == 1) return;
  const int j = m.pos;
  const int S = slices_for(flat.nbytes());
  for (int k = 0; k < S; ++k) {
    const Tensor sl = region(flat, chunk_range(flat.numel(), S, k));
    if (j > 0) c.recv(m.at(j - 1), sl, tag(m.phase * 4 + 2, k));
    if (j < M - 1) c.isend(m.at(j + 1), sl, tag(m.phase * 4 + 2, k));
  }
  c.wait_all();
}

}  // namespace cubesim::rt::algo
