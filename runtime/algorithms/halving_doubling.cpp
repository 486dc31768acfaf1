// Halving-doubling: per-rank code over Comm, in the chunking and reduction order halving_doubling.h documents.
#include "runtime/algorithms/halving_doubling.h"

#include <functional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace cubesim::rt::algo {

namespace {
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

// The table's group requirement (table.cpp) refuses other sizes before a body runs; a direct call
// that skipped it would pair the wrong members.
void require_pow2(const char* what, int members) {
  if (members < 1 || (members & (members - 1)) != 0) {
    throw std::logic_error(fmt::format("{} on {} members: needs a power of two (the algorithm table checks this)",
                                       what, members));
  }
}

}  // namespace

void hd_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
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

void hd_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  const int M = m.size();
  require_pow2("hd_reduce_scatter", M);
  if (M == 1) return;
  halving(c, m, flat, op, m.pos, M, [](int v) { return v; }, nullptr);
}

void hd_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  const int M = m.size();
  require_pow2("hd_all_gather", M);
  if (M == 1) return;
  std::vector<Range> h = halving_history(flat.numel(), m.pos, M);
  const Range seg = h.back();
  h.pop_back();
  doubling(c, m, flat, m.pos, M, seg, [](int v) { return v; }, std::move(h));
}

}  // namespace cubesim::rt::algo
