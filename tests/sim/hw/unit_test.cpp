// Units: ids, names, counters (usage) against what moved, intervals, utilisation, declared tracks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sim/hw/system.h"
#include "sim/hw/utilisation.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using testing::random_bytes;
using testing::run_process;
using testing::small_topology;

const UnitUsage& find(const std::vector<UnitUsage>& v, const std::string& name) {
  auto it = std::find_if(v.begin(), v.end(), [&](const UnitUsage& u) { return u.name == name; });
  if (it == v.end()) throw std::runtime_error("no unit " + name);
  return *it;
}

TEST(Units, EveryPieceOfHardwareIsAUnitWithItsOwnIdAndName) {
  sim::Simulator sim;
  System sys(sim, small_topology());  // 4 cubes x 2 PEs, a ring, no host
  const auto u = sys.usage();
  ASSERT_EQ(static_cast<int>(u.size()), sys.num_units());
  std::set<std::string> names;
  std::map<UnitKind, int> kinds;
  for (std::size_t i = 0; i < u.size(); ++i) {
    EXPECT_EQ(u[i].id.value, i);
    EXPECT_EQ(sys.unit(u[i].id).name(), u[i].name);
    EXPECT_TRUE(names.insert(u[i].name).second) << u[i].name;
    ++kinds[u[i].kind];
  }
  EXPECT_EQ(kinds[UnitKind::memory], 4 * (1 + 2));  // an HBM and a TCM per PE
  EXPECT_EQ(kinds[UnitKind::dma_read], 4 * 2);
  EXPECT_EQ(kinds[UnitKind::dma_write], 4 * 2);
  EXPECT_EQ(kinds[UnitKind::mac], 4 * 2);
  EXPECT_EQ(kinds[UnitKind::vector], 4 * 2);
  EXPECT_EQ(kinds[UnitKind::link], 8);
  for (int i = 0; i < sys.num_links(); ++i) {
    EXPECT_EQ(sys.link(i).name(), "link " + sys.topology().links[static_cast<std::size_t>(i)].name);
  }
  EXPECT_EQ(sys.hbm(2).name(), "cube2.hbm");
  EXPECT_EQ(sys.tcm(3, 1).name(), "cube3.pe1.tcm");
  EXPECT_EQ(sys.pe(1, 0).mac().name(), "cube1.pe0.mac");
  EXPECT_EQ(unit_name(UnitKind::link, UnitPlace{.from = kHostNode, .to = 2}), "link host->c2");
  EXPECT_EQ(unit_name(UnitKind::link, UnitPlace{.from = 2, .to = kSwitchNode}), "link c2->sw");
  const UnitUsage& l = find(u, "link c1->c2");
  EXPECT_EQ(l.place.from, 1);
  EXPECT_EQ(l.place.to, 2);
  const UnitUsage& d = find(u, "cube3.pe1.dma.write");
  EXPECT_EQ(d.place.cube, 3);
  EXPECT_EQ(d.place.pe, 1);
  EXPECT_EQ(find(u, "cube2.hbm").channel_busy, std::vector<sim::Duration>(4, 0));
  EXPECT_EQ(find(u, "cube2.pe0.mac").bytes, 0u);
}

TEST(Units, CountersAgreeWithWhatMovedWithOrWithoutATrace) {
  for (bool trace : {false, true}) {
    SCOPED_TRACE(trace ? "traced" : "untraced");
    sim::Simulator sim(sim::SimulatorOptions{.trace = trace});
    System sys(sim, small_topology());
    const std::uint64_t bytes = 3 * 65536 + 1000;  // four chunks, the last one short
    const auto data = random_bytes(bytes, 7);
    run_process(sim, [&] {
      sys.hbm(0).write(0, data);
      sys.transfer(sys.hbm(0).at(0), sys.hbm(2).at(4096), bytes);   // two hops
      sys.transfer(sys.hbm(2).at(4096), sys.tcm(2, 1).at(0), 8192);  // into a TCM by DMA
      sys.pe(2, 1).compute(1 << 20, DType::bf16);
    });
    const auto u = sys.usage();
    const std::vector<int> route = sys.route(0, 2);
    ASSERT_EQ(route.size(), 2u);
    std::uint64_t link_bytes = 0;
    for (const UnitUsage& x : u) {
      if (x.kind == UnitKind::link) link_bytes += x.bytes;
    }
    EXPECT_EQ(link_bytes, 2 * bytes) << "two hops, nothing else on the links";
    Link& first = sys.link(route[0]);
    const UnitUsage& hop = u.at(first.id().value);
    EXPECT_EQ(hop.name, first.name());
    EXPECT_EQ(hop.bytes, bytes);
    EXPECT_EQ(u.at(sys.link(route[1]).id().value).bytes, bytes);
    EXPECT_EQ(hop.pieces, 4u);
    EXPECT_EQ(hop.busy, first.server().busy);
    // Uncontended: each chunk occupies the link for its bytes at the link's bandwidth.
    const sim::Bandwidth bw = first.bandwidth();
    EXPECT_EQ(hop.busy, 3 * sim::transfer_time(65536, bw) + sim::transfer_time(1000, bw));
    EXPECT_EQ(find(u, "cube0.hbm").bytes, bytes);                 // read
    EXPECT_EQ(find(u, "cube2.hbm").bytes, bytes + 8192);          // written, then read
    EXPECT_EQ(find(u, "cube2.pe1.dma.read").bytes, 8192u);
    EXPECT_EQ(find(u, "cube2.pe1.dma.write").bytes, 0u);
    EXPECT_EQ(find(u, "cube2.pe1.tcm").bytes, 8192u);
    const UnitUsage& mac = find(u, "cube2.pe1.mac");
    EXPECT_EQ(mac.bytes, 1u << 20) << "a compute unit counts operations";
    EXPECT_EQ(mac.busy, sys.pe(2, 1).mac().time(1 << 20, DType::bf16));
    const UnitUsage& hbm = find(u, "cube2.hbm");
    ASSERT_EQ(hbm.channel_busy.size(), 4u);
    EXPECT_EQ(hbm.busy, *std::max_element(hbm.channel_busy.begin(), hbm.channel_busy.end()));
    EXPECT_GT(hbm.busy, 0u);
  }
}

TEST(Units, UsageSinceGivesAnIntervalsCounters) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  const auto data = random_bytes(1 << 20, 3);
  std::vector<UnitCounters> mid;
  run_process(sim, [&] {
    sys.hbm(1).write(0, data);
    sys.transfer(sys.hbm(1).at(0), sys.hbm(2).at(0), 1 << 20);
    mid = sys.counters();
    sys.transfer(sys.hbm(1).at(0), sys.hbm(0).at(0), 1 << 19);
  });
  const auto delta = usage_since(*sys.units(), sys.counters(), mid);
  EXPECT_EQ(find(delta, "link c1->c2").bytes, 0u);
  EXPECT_EQ(find(delta, "link c1->c0").bytes, 1u << 19);
  EXPECT_EQ(find(delta, "cube1.hbm").bytes, 1u << 19);
  EXPECT_EQ(find(delta, "link c1->c0").busy, find(sys.usage(), "link c1->c0").busy);
  EXPECT_THROW(counters_since(sys.counters(), std::vector<UnitCounters>(3)), std::logic_error);
  EXPECT_EQ(sys.units().get(), sys.units().get()) << "made once";
}

TEST(Units, UtilisationIsTheShareOfTheIntervalEachUnitWasBusy) {
  auto unit = [](UnitKind k, int cube, int pe, sim::Duration busy, int from = -1, int to = -1) {
    UnitUsage u;
    u.kind = k;
    u.name = std::string(unit_kind_name(k)) + std::to_string(cube) + "." + std::to_string(pe) + "." +
             std::to_string(from) + "-" + std::to_string(to);
    u.place = UnitPlace{.cube = cube, .pe = pe, .from = from, .to = to};
    u.busy = busy;
    return u;
  };
  const std::vector<UnitUsage> usage = {
      unit(UnitKind::mac, 0, 0, 100), unit(UnitKind::mac, 0, 1, 300), unit(UnitKind::vector, 0, 0, 40),
      unit(UnitKind::dma_read, 0, 0, 200), unit(UnitKind::dma_write, 0, 1, 80),
      unit(UnitKind::memory, 0, -1, 500),   // cube 0's HBM
      unit(UnitKind::memory, 0, 0, 900),    // a TCM: not the HBM column
      unit(UnitKind::mac, 1, 0, 1000),
      unit(UnitKind::mac, 2, 0, 1000),      // beyond the run's cubes
      unit(UnitKind::link, -1, -1, 250, 0, 1), unit(UnitKind::link, -1, -1, 0, 1, 0),
      unit(UnitKind::link, -1, -1, 750, 1, kSwitchNode), unit(UnitKind::link, -1, -1, 999, 1, 2),
      unit(UnitKind::link, -1, -1, 999, kHostNode, 0)};
  const Utilisation u = utilisation(usage, 1000, 2);
  ASSERT_EQ(u.cubes.size(), 2u);
  EXPECT_DOUBLE_EQ(u.cubes[0].pe_mac, 0.2);  // (100 + 300) / 2 PEs / 1000
  EXPECT_DOUBLE_EQ(u.cubes[0].pe_vector, 0.02);
  EXPECT_DOUBLE_EQ(u.cubes[0].pe_dma_read, 0.1);
  EXPECT_DOUBLE_EQ(u.cubes[0].pe_dma_write, 0.04);
  EXPECT_DOUBLE_EQ(u.cubes[0].hbm_busiest_channel, 0.5);
  EXPECT_DOUBLE_EQ(u.cubes[1].pe_mac, 1.0);
  EXPECT_EQ(u.links.directions, 3);  // c0->c1, c1->c0, c1->sw; not to cube 2 or from the host
  EXPECT_EQ(u.links.active, 2);
  EXPECT_EQ(u.links.busiest, usage[11].name);
  EXPECT_DOUBLE_EQ(u.links.busiest_busy, 0.75);
  EXPECT_DOUBLE_EQ(u.links.mean_busy_active, 0.5);
  const Utilisation none = utilisation(usage, 0, 2);
  EXPECT_EQ(none.cubes[0].pe_mac, 0.0);
}

TEST(Units, DeclareTracksNamesTheRunsHardwareInOrder) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  sys.declare_tracks(2);
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& t : sim.trace().stats()) got.emplace_back(t.group, t.name);
  std::vector<std::pair<std::string, std::string>> want;
  for (int c = 0; c < 2; ++c) {
    const std::string g = "cube" + std::to_string(c);
    for (int ch = 0; ch < 4; ++ch) want.emplace_back(g, "hbm.ch" + std::to_string(ch));
    for (int p = 0; p < 2; ++p) {
      for (const char* unit : {"mac", "vector", "dma.read", "dma.write"}) {
        want.emplace_back(g, "pe" + std::to_string(p) + "." + unit);
      }
    }
  }
  want.emplace_back("links", "link c0->c1");
  want.emplace_back("links", "link c1->c0");
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace cubesim::hw
