// The collective algorithms, as per-rank code over Comm. Each header in this directory documents
// the chunking and reduction order implemented here.
#include <cmath>

#include <fmt/format.h>

#include "runtime/algorithms/direct.h"
#include "runtime/algorithms/halving_doubling.h"
#include "runtime/algorithms/hierarchical.h"
#include "runtime/algorithms/ring.h"
#include "runtime/algorithms/tree.h"
#include "runtime/errors.h"
#include "sim/core/event.h"

namespace cubesim::rt::algo {

namespace {
int mod(int a, int m) { return ((a % m) + m) % m; }
}  // namespace

Members Members::whole(const Comm& c, std::uint64_t phase) {
  Members m;
  m.order.resize(static_cast<std::size_t>(c.size()));
  for (int i = 0; i < c.size(); ++i) m.order[static_cast<std::size_t>(i)] = i;
  m.pos = c.me();
  m.phase = phase;
  return m;
}

int slices_for(std::uint64_t bytes) {
  const std::uint64_t s = (bytes + kSliceBytes - 1) / kSliceBytes;
  return static_cast<int>(std::clamp<std::uint64_t>(s, 1, kMaxSlices));
}

// ---------------------------------------------------------------- ring
void ring_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
  const int M = m.size();
  if (M == 1) return;
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  const int next = m.at(j + 1), prev = m.at(j - 1);
  for (int s = 0; s < M - 1; ++s) {
    c.isend(next, region(flat, chunk_range(n, M, mod(j - s - 1, M))), tag(m.phase * 4, s));
    c.recv_reduce(prev, region(flat, chunk_range(n, M, mod(j - s - 2, M))), op, tag(m.phase * 4, s));
  }
  c.wait_all();
}

void ring_all_gather(Comm& c, const Members& m, const Tensor& flat) {
  const int M = m.size();
  if (M == 1) return;
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  const int next = m.at(j + 1), prev = m.at(j - 1);
  for (int s = 0; s < M - 1; ++s) {
    c.isend(next, region(flat, chunk_range(n, M, mod(j - s, M))), tag(m.phase * 4 + 1, s));
    c.recv(prev, region(flat, chunk_range(n, M, mod(j - s - 1, M))), tag(m.phase * 4 + 1, s));
  }
  c.wait_all();
}

void ring_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
  ring_reduce_scatter(c, m, flat, op);
  ring_all_gather(c, m, flat);
}

void ring_broadcast(Comm& c, const Members& m, const Tensor& flat) {
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

// ---------------------------------------------------------------- direct
void direct_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
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

void direct_all_gather(Comm& c, const Members& m, const Tensor& flat) {
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

void direct_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
  direct_reduce_scatter(c, m, flat, op);
  direct_all_gather(c, m, flat);
}

void direct_broadcast(Comm& c, const Members& m, const Tensor& flat) {
  const int M = m.size();
  if (M == 1) return;
  if (m.pos == 0) {
    for (int k = 1; k < M; ++k) c.isend(m.at(k), flat, tag(m.phase * 4 + 2, 0));
    c.wait_all();
  } else {
    c.recv(m.at(0), flat, tag(m.phase * 4 + 2, 0));
  }
}

// ---------------------------------------------------------------- trees
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

void tree_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
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

void tree_broadcast(Comm& c, const Members& m, const Tensor& flat) {
  if (m.size() == 1) return;
  tree_reduce_broadcast(c, m.order, m.pos, flat, ReduceOp::sum, m.phase * 4 + 2, false);
  c.wait_all();
}

// ---------------------------------------------------------------- halving-doubling
namespace {
bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

// Recursive halving over `p2` virtual positions; returns the final segment and records the
// segments it came from (for the doubling that undoes it).
Range halving(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, int v, int p2,
              const std::function<int(int)>& member_of_virtual, std::vector<Range>* history) {
  Range seg{0, flat.numel()};
  for (int d = p2 / 2; d >= 1; d /= 2) {
    const int partner = v ^ d;
    const Range lo = chunk_range(seg.count, 2, 0), hi = chunk_range(seg.count, 2, 1);
    const Range lower{seg.begin + lo.begin, lo.count}, upper{seg.begin + hi.begin, hi.count};
    const Range keep = v < partner ? lower : upper, give = v < partner ? upper : lower;
    const int peer = m.at(member_of_virtual(partner));
    c.isend(peer, region(flat, give), tag(m.phase * 4 + 1, static_cast<std::uint64_t>(d)));
    c.recv_reduce(peer, region(flat, keep), op, tag(m.phase * 4 + 1, static_cast<std::uint64_t>(d)));
    if (history) history->push_back(seg);
    seg = keep;
  }
  c.wait_all();
  return seg;
}

void doubling(Comm& c, const Members& m, const Tensor& flat, int v, int p2, Range seg,
              const std::function<int(int)>& member_of_virtual, std::vector<Range> history) {
  for (int d = 1; d < p2; d *= 2) {
    const Range parent = history.back();
    history.pop_back();
    const Range other = seg.begin == parent.begin ? Range{seg.begin + seg.count, parent.count - seg.count}
                                                  : Range{parent.begin, parent.count - seg.count};
    const int peer = m.at(member_of_virtual(v ^ d));
    c.isend(peer, region(flat, seg), tag(m.phase * 4 + 2, static_cast<std::uint64_t>(d)));
    c.recv(peer, region(flat, other), tag(m.phase * 4 + 2, static_cast<std::uint64_t>(d)));
    seg = parent;
  }
  c.wait_all();
}

// The segments recursive halving would pass through for virtual position v (no communication).
std::vector<Range> halving_history(std::int64_t n, int v, int p2) {
  std::vector<Range> h;
  Range seg{0, n};
  for (int d = p2 / 2; d >= 1; d /= 2) {
    const int partner = v ^ d;
    const Range lo = chunk_range(seg.count, 2, 0), hi = chunk_range(seg.count, 2, 1);
    h.push_back(seg);
    seg = v < partner ? Range{seg.begin + lo.begin, lo.count} : Range{seg.begin + hi.begin, hi.count};
  }
  h.push_back(seg);  // the final segment last
  return h;
}
}  // namespace

void hd_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
  const int M = m.size();
  if (M == 1) return;
  int p2 = 1;
  while (p2 * 2 <= M) p2 *= 2;
  const int e = M - p2, j = m.pos;
  const std::uint64_t fold = tag(m.phase * 4, 0), unfold = tag(m.phase * 4 + 3, 0);
  if (j < 2 * e && (j % 2) == 1) {  // folded away: hand over the data, get the result back
    c.isend(m.at(j - 1), flat, fold);
    c.wait_all();
    c.recv(m.at(j - 1), flat, unfold);
    return;
  }
  if (j < 2 * e) c.recv_reduce(m.at(j + 1), flat, op, fold);
  const int v = j < 2 * e ? j / 2 : j - e;
  auto member_of = [e](int vv) { return vv < e ? 2 * vv : vv + e; };
  std::vector<Range> history;
  const Range seg = halving(c, m, flat, op, v, p2, member_of, &history);
  doubling(c, m, flat, v, p2, seg, member_of, std::move(history));
  if (j < 2 * e) {
    c.isend(m.at(j + 1), flat, unfold);
    c.wait_all();
  }
}

void hd_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op) {
  const int M = m.size();
  if (!is_pow2(M)) {
    throw RuntimeError(fmt::format("{}: halving_doubling reduce_scatter needs a power-of-two group, not {} ranks; "
                                   "use ring or direct",
                                   c.name(), M));
  }
  if (M == 1) return;
  halving(c, m, flat, op, m.pos, M, [](int v) { return v; }, nullptr);
}

void hd_all_gather(Comm& c, const Members& m, const Tensor& flat) {
  const int M = m.size();
  if (!is_pow2(M)) {
    throw RuntimeError(fmt::format("{}: halving_doubling all_gather needs a power-of-two group, not {} ranks; "
                                   "use ring or direct",
                                   c.name(), M));
  }
  if (M == 1) return;
  std::vector<Range> h = halving_history(flat.numel(), m.pos, M);
  const Range seg = h.back();
  h.pop_back();
  doubling(c, m, flat, m.pos, M, seg, [](int v) { return v; }, std::move(h));
}

// ---------------------------------------------------------------- hierarchical
int default_hierarchy(int members) {
  int best = 1;
  for (int h = 1; h * h <= members; ++h) {
    if (members % h == 0) best = h;
  }
  return best;
}

void hierarchical_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, int h) {
  const int M = m.size();
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
