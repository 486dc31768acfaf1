#include "sim/hw/utilisation.h"

#include "sim/hw/topology.h"

namespace cubesim::hw {

Utilisation utilisation(std::span<const UnitUsage> usage, sim::Duration over, int cubes) {
  auto frac = [over](double busy) { return over > 0 ? busy / static_cast<double>(over) : 0.0; };
  struct Sums {
    double mac = 0, vector = 0, dma_read = 0, dma_write = 0, hbm = 0, l2 = 0;
    std::uint64_t l2_hits = 0, l2_misses = 0;
    bool has_l2 = false;
    int pes = 0;
  };
  std::vector<Sums> sums(static_cast<std::size_t>(std::max(cubes, 0)));
  auto in_run = [cubes](int cube) { return cube >= 0 && cube < cubes; };
  auto among = [&](int node) { return node == kSwitchNode || in_run(node); };
  Utilisation out;
  const UnitUsage* busiest = nullptr;
  double active_busy = 0;
  for (const UnitUsage& u : usage) {
    const auto busy = static_cast<double>(u.busy);
    if (u.kind == UnitKind::link) {
      if (!among(u.place.from) || !among(u.place.to)) continue;
      ++out.links.directions;
      if (u.busy > 0) {
        ++out.links.active;
        active_busy += busy;
        if (!busiest || u.busy > busiest->busy) busiest = &u;
      }
      continue;
    }
    if (!in_run(u.place.cube)) continue;
    // The kinds the table shows; any other unit of a cube is not in it.
    Sums& s = sums[static_cast<std::size_t>(u.place.cube)];
    if (u.kind == UnitKind::mac) {
      s.mac += busy;
      ++s.pes;
    } else if (u.kind == UnitKind::vector) {
      s.vector += busy;
    } else if (u.kind == UnitKind::dma_read) {
      s.dma_read += busy;
    } else if (u.kind == UnitKind::dma_write) {
      s.dma_write += busy;
    } else if (u.kind == UnitKind::memory && u.place.pe < 0) {
      s.hbm = std::max(s.hbm, busy);  // the cube's HBM, not a PE's TCM
    } else if (u.kind == UnitKind::l2) {
      s.has_l2 = true;
      s.l2 += busy;
      s.l2_hits += u.hits;
      s.l2_misses += u.misses;
    }
  }
  for (int c = 0; c < cubes; ++c) {
    const Sums& s = sums[static_cast<std::size_t>(c)];
    const double pes = s.pes > 0 ? s.pes : 1;
    out.cubes.push_back(CubeUtilisation{.cube = c,
                                        .pe_mac = frac(s.mac / pes),
                                        .pe_vector = frac(s.vector / pes),
                                        .pe_dma_read = frac(s.dma_read / pes),
                                        .pe_dma_write = frac(s.dma_write / pes),
                                        .hbm_busiest_channel = frac(s.hbm),
                                        .has_l2 = s.has_l2,
                                        .l2_busy = frac(s.l2),
                                        .l2_hits = s.l2_hits,
                                        .l2_misses = s.l2_misses,
                                        .l2_hit_rate = s.l2_hits + s.l2_misses > 0
                                                           ? static_cast<double>(s.l2_hits) /
                                                                 static_cast<double>(s.l2_hits + s.l2_misses)
                                                           : 0.0});
  }
  if (busiest) {
    out.links.busiest = busiest->name;
    out.links.busiest_busy = frac(static_cast<double>(busiest->busy));
    out.links.mean_busy_active = frac(active_busy / out.links.active);
  }
  return out;
}

}  // namespace cubesim::hw
