// utilisation.h — how busy the hardware was over a run, from the units' counters (unit.h).
//
// Fractions of a run's simulated time: per cube, the mean over its PEs of the MAC array, vector
// unit and DMA channels, and its busiest HBM channel; for the links among the first `cubes` cubes
// (and the switch), how many directions there are, how many carried traffic and the busiest.
// Computed from counters, so it needs no trace.
//
//   const auto before = sys.counters();
//   ... run ...
//   Utilisation u = utilisation(usage_since(*sys.units(), sys.counters(), before), sim.now() - t0, 4);
//   fmt::print("cube 0 MAC {:.1%}\n", u.cubes[0].pe_mac);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sim/core/time.h"
#include "sim/hw/unit.h"

namespace cubesim::hw {

struct CubeUtilisation {
  int cube = 0;
  double pe_mac = 0;        // mean over the cube's PEs
  double pe_vector = 0;
  double pe_dma_read = 0;
  double pe_dma_write = 0;
  double hbm_busiest_channel = 0;
  // The cube's L2 cache (has_l2 false: the cube has none, and the rest are 0).
  bool has_l2 = false;
  double l2_busy = 0;
  std::uint64_t l2_hits = 0, l2_misses = 0;  // sectors read (l2_cache.h)
  double l2_hit_rate = 0;                    // hits / (hits + misses); 0 when nothing was read
};

struct LinkUtilisation {
  int directions = 0;          // link directions among the cubes (and the switch)
  int active = 0;              // of those, the ones that carried traffic
  std::string busiest;         // "link c0->c1" ("" when none was active)
  double busiest_busy = 0;
  double mean_busy_active = 0;  // mean over the active ones
};

struct Utilisation {
  std::vector<CubeUtilisation> cubes;
  LinkUtilisation links;
  // A switch's port groups (UnitKind::switch_port) facing the run's cubes, as for links
  // (directions: 0 when the topology has no switch ports).
  LinkUtilisation switch_ports;
};

// `usage`: counters over the interval (usage_since), `over`: its length (0 gives all zeros),
// `cubes`: how many cubes, from 0, the run used.
Utilisation utilisation(std::span<const UnitUsage> usage, sim::Duration over, int cubes);
// The same for the cubes a run's ranks were placed on (rank r on cubes[r]); cubes[] in that order.
Utilisation utilisation(std::span<const UnitUsage> usage, sim::Duration over, std::span<const int> cubes);

}  // namespace cubesim::hw
