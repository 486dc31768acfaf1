// Routes: deterministic, dimension-ordered on grids, shortest way round on tori, via the switch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/hw/errors.h"
#include "sim/hw/routing.h"
#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

// The route as "c0->c1 c1->c5" for readable expectations.
std::string names(const Topology& t, const std::vector<int>& route) {
  std::string s;
  for (int li : route) s += (s.empty() ? "" : " ") + t.links[static_cast<std::size_t>(li)].name;
  return s;
}

TEST(Routing, MeshIsDimensionOrderXThenY) {
  const Topology t = load_topology("mesh4x4");
  Router r(t);
  EXPECT_EQ(names(t, r.route(0, 5)), "c0->c1 c1->c5");
  EXPECT_EQ(names(t, r.route(15, 0)), "c15->c14 c14->c13 c13->c12 c12->c8 c8->c4 c4->c0");
  EXPECT_EQ(names(t, r.route(6, 6)), "");
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 16; ++b) {
      EXPECT_EQ(r.hops(a, b), std::abs(a % 4 - b % 4) + std::abs(a / 4 - b / 4));
    }
  }
}

TEST(Routing, TorusAndRingGoTheShorterWayPositiveOnATie) {
  const Topology torus = load_topology("torus8x8");
  Router r(torus);
  EXPECT_EQ(names(torus, r.route(0, 7)), "c0->c7");              // wrap-around: one hop, not seven
  EXPECT_EQ(names(torus, r.route(0, 4)), "c0->c1 c1->c2 c2->c3 c3->c4");  // tie (4 either way): positive
  EXPECT_EQ(names(torus, r.route(0, 56)), "c0->c56");            // wrap in y
  EXPECT_EQ(r.hops(0, 63), 2);
  const Topology ring = load_topology("ring4");
  Router rr(ring);
  EXPECT_EQ(names(ring, rr.route(0, 2)), "c0->c1 c1->c2");
  EXPECT_EQ(names(ring, rr.route(0, 3)), "c0->c3");
  EXPECT_EQ(names(ring, rr.route(3, 1)), "c3->c0 c0->c1");
}

TEST(Routing, SwitchAndFullAndExplicit) {
  const Topology dgx = load_topology("dgx_h100x8");
  Router rs(dgx);
  EXPECT_EQ(names(dgx, rs.route(2, 6)), "c2->sw sw->c6");
  const Topology h200 = load_topology("h200x4");
  Router rf(h200);
  EXPECT_EQ(names(h200, rf.route(3, 1)), "c3->c1");
  auto doc = testing::small_doc();
  doc["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096},
                    {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 1}, {"overhead_ns", 1}}},
                    {"links", {{{"from", 0}, {"to", 1}}, {{"from", 1}, {"to", 3}}, {{"from", 0}, {"to", 2}}, {{"from", 2}, {"to", 3}}}}};
  const Topology ex = topology_from_json(doc, "diamond");
  Router re(ex);
  EXPECT_EQ(names(ex, re.route(0, 3)), "c0->c1 c1->c3");  // two shortest paths: the first in file order
  EXPECT_EQ(names(ex, re.route(3, 0)), "c3->c1 c1->c0");
}

TEST(Routing, RoutesAreDeterministicAcrossRoutersAndSystems) {
  const Topology t = load_topology("torus8x8");
  Router a(t), b(t);
  for (int s = 0; s < 64; s += 7) {
    for (int d = 0; d < 64; d += 5) EXPECT_EQ(a.route(s, d), b.route(s, d));
  }
  EXPECT_EQ(&a.route(3, 9), &a.route(3, 9));  // cached
  sim::Simulator sim;
  System sys(sim, t);
  EXPECT_EQ(sys.route(10, 45), a.route(10, 45));
  EXPECT_THROW(a.route(0, 64), TransferError);
}

}  // namespace
}  // namespace cubesim::hw
