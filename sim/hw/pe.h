// pe.h — a processing element: its TCM, a DMA engine, a MAC array and a vector unit (each a unit,
// unit.h).
//
// Data moves in and out of the TCM by System::transfer (the DMA engine's channels time it);
// compute() and vector_op() block the calling process for the time the units take, queued behind
// work already submitted to the same unit. Figures come from the cube's "pe" description.
//
//   Pe& pe = sys.pe(0, 3);
//   sys.transfer(sys.hbm(0).at(a), pe.tcm().at(0), a_tile_bytes);      // DMA read channel
//   pe.compute(uint64_t{128} * 128 * 64, DType::bf16);                 // MAC array
//   std::uint32_t m = pe.spec().tile.m;
#pragma once

#include <string>
#include <string_view>

#include "sim/core/simulator.h"
#include "sim/hw/compute_unit.h"
#include "sim/hw/dma.h"
#include "sim/hw/memory.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class Pe {
 public:
  // `sim` is the simulator whose processes compute() blocks.
  Pe(sim::Simulator& sim, int cube, int index, const PeSpec& spec, Memory& tcm);
  Pe(const Pe&) = delete;
  Pe& operator=(const Pe&) = delete;

  int cube() const { return cube_; }
  int index() const { return index_; }
  const std::string& name() const { return name_; }  // "cube3.pe5"
  const PeSpec& spec() const { return spec_; }
  Memory& tcm() { return *tcm_; }
  DmaEngine& dma() { return dma_; }
  ComputeUnit& mac() { return mac_; }
  ComputeUnit& vector() { return vector_; }

  // Blocks the calling process while the MAC array performs `macs` multiply-accumulates in dtype
  // d, after the work already queued on it. Returns the end time (now, on return).
  sim::Time compute(std::uint64_t macs, DType d, std::string_view label = "mac");
  // The same on the vector unit, for `ops` element operations.
  sim::Time vector_op(std::uint64_t ops, DType d, std::string_view label = "vector");

 private:
  sim::Time run_on(ComputeUnit& u, const char* call, std::uint64_t n, DType d, std::string_view label);
  sim::Simulator* sim_;
  int cube_, index_;
  std::string name_;
  PeSpec spec_;
  Memory* tcm_;
  DmaEngine dma_;
  ComputeUnit mac_;
  ComputeUnit vector_;
};

}  // namespace cubesim::hw
