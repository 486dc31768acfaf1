// routing.h — deterministic routes between cubes: the list of links a message crosses.
//
//   mesh, torus, ring: dimension order (dimension 0 first); on a torus or ring each dimension
//                      goes the shorter way round, the positive way on a tie;
//   full:              the direct link;
//   switch:            up to the switch, down to the destination (two hops);
//   explicit:          a shortest path by breadth-first search that tries links in file order.
// Same topology, same routes, every run. Routes are computed once per pair and cached.
//
//   Router r(topology);
//   const std::vector<int>& links = r.route(0, 5);   // indices into topology.links
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "sim/hw/topology.h"

namespace cubesim::hw {

class Router {
 public:
  explicit Router(const Topology& t);

  // Links from cube src to cube dst (empty when src == dst). Throws TransferError for a cube id
  // out of range. The reference stays valid for the Router's lifetime.
  const std::vector<int>& route(int src, int dst);
  int hops(int src, int dst) { return static_cast<int>(route(src, dst).size()); }
  // The link from -> to (host and switch included), or -1.
  int link_between(int from, int to) const;

 private:
  std::vector<int> compute(int src, int dst) const;
  std::vector<int> compute_grid(int src, int dst) const;
  std::vector<int> compute_bfs(int src, int dst) const;

  const Topology& t_;
  std::vector<std::vector<int>> out_;  // per cube: outgoing link ids in file order
  std::vector<int> switch_down_;       // per cube: link sw -> cube
  std::vector<int> stride_;
  std::unordered_map<std::uint64_t, std::vector<int>> cache_;
};

}  // namespace cubesim::hw
