#include "sim/hw/utilisation.h"

#include <numeric>

#include "sim/hw/topology.h"

namespace cubesim::hw {

Utilisation utilisation(std::span<const UnitUsage> usage, sim::Duration over, int cubes) {
  std::vector<int> ids(static_cast<std::size_t>(std::max(cubes, 0)));
  std::iota(ids.begin(), ids.end(), 0);
  return utilisation(usage, over, ids);
}

Utilisation utilisation(std::span<const UnitUsage> usage, sim::Duration over, std::span<const int> cubes) {
  auto frac = [over](double busy) { return over > 0 ? busy / static_cast<double>(over) : 0.0; };
  struct Sums {
    double mac = 0, vector = 0, dma_read = 0, dma_write = 0, hbm = 0, l2 = 0;
    std::uint64_t l2_hits = 0, l2_misses = 0;
    bool has_l2 = false;
    int pes = 0;
  };
  std::vector<Sums> sums(cubes.size());
  // A cube id's index in `cubes`, or -1.
  std::vector<int> index;
  for (std::size_t i = 0; i < cubes.size(); ++i) {
    if (cubes[i] < 0) continue;
    if (static_cast<std::size_t>(cubes[i]) >= index.size()) index.resize(static_cast<std::size_t>(cubes[i]) + 1, -1);
    index[static_cast<std::size_t>(cubes[i])] = static_cast<int>(i);
  }
  auto slot = [&](int cube) -> int {
    return cube >= 0 && static_cast<std::size_t>(cube) < index.size() ? index[static_cast<std::size_t>(cube)] : -1;
  };
  auto among = [&](int node) { return node == kSwitchNode || (node >= 0 && slot(node) >= 0); };
  Utilisation out;
  struct Busiest {
    const UnitUsage* unit = nullptr;
    double active_busy = 0;
  } link_b, port_b;
  auto directed = [&](const UnitUsage& u, LinkUtilisation& lu, Busiest& b) {
    if (!among(u.place.from) || !among(u.place.to)) return;
    ++lu.directions;
    if (u.busy > 0) {
      ++lu.active;
      b.active_busy += static_cast<double>(u.busy);
      if (!b.unit || u.busy > b.unit->busy) b.unit = &u;
    }
  };
  for (const UnitUsage& u : usage) {
    const auto busy = static_cast<double>(u.busy);
    if (u.kind == UnitKind::link) {
      directed(u, out.links, link_b);
      continue;
    }
    if (u.kind == UnitKind::switch_port) {
      directed(u, out.switch_ports, port_b);
      continue;
    }
    const int at = u.place.cube >= 0 ? slot(u.place.cube) : -1;
    if (at < 0) continue;
    // The kinds the table shows; any other unit of a cube is not in it.
    Sums& s = sums[static_cast<std::size_t>(at)];
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
  for (std::size_t i = 0; i < cubes.size(); ++i) {
    const Sums& s = sums[i];
    const double pes = s.pes > 0 ? s.pes : 1;
    out.cubes.push_back(CubeUtilisation{.cube = cubes[i],
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
  for (auto [lu, b] : {std::pair{&out.links, &link_b}, std::pair{&out.switch_ports, &port_b}}) {
    if (!b->unit) continue;
    lu->busiest = b->unit->name;
    lu->busiest_busy = frac(static_cast<double>(b->unit->busy));
    lu->mean_busy_active = frac(b->active_busy / lu->active);
  }
  return out;
}

}  // namespace cubesim::hw
