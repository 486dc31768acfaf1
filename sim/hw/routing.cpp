#include "sim/hw/routing.h"

#include <deque>

#include <fmt/format.h>

#include "sim/hw/errors.h"

namespace cubesim::hw {

Router::Router(const Topology& t) : t_(t), out_(t.cubes.size()), switch_down_(t.cubes.size(), -1) {
  for (std::size_t i = 0; i < t.links.size(); ++i) {
    const LinkSpec& l = t.links[i];
    if (l.from >= 0) out_[static_cast<std::size_t>(l.from)].push_back(static_cast<int>(i));
    if (l.from == kSwitchNode && l.to >= 0) switch_down_[static_cast<std::size_t>(l.to)] = static_cast<int>(i);
  }
  stride_.assign(t.dims.size(), 1);
  for (std::size_t d = 1; d < t.dims.size(); ++d) stride_[d] = stride_[d - 1] * t.dims[d - 1];
}

int Router::link_between(int from, int to) const {
  if (from >= 0) {
    for (int li : out_[static_cast<std::size_t>(from)]) {
      if (t_.links[static_cast<std::size_t>(li)].to == to) return li;
    }
    return -1;
  }
  return t_.find_link(from, to);
}

const std::vector<int>& Router::route(int src, int dst) {
  const int n = static_cast<int>(t_.cubes.size());
  if (src < 0 || src >= n || dst < 0 || dst >= n) {
    throw TransferError(fmt::format("route {} -> {}: cube ids are 0..{} in topology '{}'", src, dst, n - 1, t_.name));
  }
  const std::uint64_t key = (static_cast<std::uint64_t>(src) << 32) | static_cast<std::uint32_t>(dst);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  return cache_.emplace(key, compute(src, dst)).first->second;
}

std::vector<int> Router::compute(int src, int dst) const {
  if (src == dst) return {};
  switch (t_.network) {
    case NetworkKind::kRing:
    case NetworkKind::kMesh:
    case NetworkKind::kTorus: return compute_grid(src, dst);
    case NetworkKind::kFull: return {link_between(src, dst)};
    case NetworkKind::kSwitch: return {link_between(src, kSwitchNode), switch_down_[static_cast<std::size_t>(dst)]};
    case NetworkKind::kExplicit: return compute_bfs(src, dst);
    case NetworkKind::kNone: break;
  }
  throw TransferError(fmt::format("no route from cube {} to cube {} in topology '{}'", src, dst, t_.name));
}

std::vector<int> Router::compute_grid(int src, int dst) const {
  const bool wrap = t_.network != NetworkKind::kMesh;
  std::vector<int> path;
  int cur = src;
  for (std::size_t d = 0; d < t_.dims.size(); ++d) {
    const int size = t_.dims[d];
    int x = (cur / stride_[d]) % size;
    const int goal = (dst / stride_[d]) % size;
    int step = goal > x ? 1 : -1;
    if (wrap) {
      const int fwd = ((goal - x) % size + size) % size;
      step = fwd <= size - fwd ? 1 : -1;  // shorter way round; positive on a tie
    }
    while (x != goal) {
      const int y = ((x + step) % size + size) % size;
      const int next = cur + (y - x) * stride_[d];
      const int li = link_between(cur, next);
      if (li < 0) throw TransferError(fmt::format("internal: no link c{}->c{} on a grid route", cur, next));
      path.push_back(li);
      cur = next;
      x = y;
    }
  }
  return path;
}

std::vector<int> Router::compute_bfs(int src, int dst) const {
  const std::size_t n = t_.cubes.size();
  std::vector<int> via(n, -1);  // link that first reached each cube
  std::vector<char> seen(n, 0);
  std::deque<int> q{src};
  seen[static_cast<std::size_t>(src)] = 1;
  while (!q.empty() && !seen[static_cast<std::size_t>(dst)]) {
    const int v = q.front();
    q.pop_front();
    for (int li : out_[static_cast<std::size_t>(v)]) {
      const int w = t_.links[static_cast<std::size_t>(li)].to;
      if (w < 0 || seen[static_cast<std::size_t>(w)]) continue;
      seen[static_cast<std::size_t>(w)] = 1;
      via[static_cast<std::size_t>(w)] = li;
      q.push_back(w);
    }
  }
  if (!seen[static_cast<std::size_t>(dst)]) {
    throw TransferError(fmt::format("no route from cube {} to cube {} in topology '{}'", src, dst, t_.name));
  }
  std::vector<int> path;
  for (int c = dst; c != src; c = t_.links[static_cast<std::size_t>(via[static_cast<std::size_t>(c)])].from) {
    path.push_back(via[static_cast<std::size_t>(c)]);
  }
  return {path.rbegin(), path.rend()};
}

}  // namespace cubesim::hw
