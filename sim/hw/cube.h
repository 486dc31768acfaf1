// cube.h — a cube (one chip): its PEs, its HBM shared by them (behind an optional L2 cache), and its
// router's ports.
//
// The HBM is one memory whose channels every PE's DMA and every link transfer contend for. The
// router forwards by the topology's routing (routing.h); its ports are the cube's outgoing links.
//
//   Cube& c = sys.cube(3);
//   for (int p = 0; p < c.num_pes(); ++p) c.pe(p).compute(...);
//   for (int li : c.ports()) fmt::print("{}\n", sys.link(li).name());
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "sim/hw/l2_cache.h"
#include "sim/hw/memory.h"
#include "sim/hw/pe.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class Cube {
 public:
  Cube(const CubeSpec& spec, Memory& hbm) : spec_(spec), hbm_(&hbm) {}
  Cube(const Cube&) = delete;
  Cube& operator=(const Cube&) = delete;

  int id() const { return spec_.id; }
  const CubeSpec& spec() const { return spec_; }
  Memory& hbm() { return *hbm_; }
  // The cube's L2 cache in front of its HBM, or null when the topology gives the cube none.
  L2Cache* l2() { return l2_; }
  int num_pes() const { return static_cast<int>(pes_.size()); }
  Pe& pe(int i) { return *pes_.at(static_cast<std::size_t>(i)); }
  // Outgoing links (ids), in topology order: network ports first, then the host link.
  std::span<const int> ports() const { return ports_; }

 private:
  friend class System;
  CubeSpec spec_;
  Memory* hbm_;
  L2Cache* l2_ = nullptr;  // owned by the System
  std::vector<std::unique_ptr<Pe>> pes_;
  std::vector<int> ports_;
};

}  // namespace cubesim::hw
