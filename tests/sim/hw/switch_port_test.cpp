// A switch with ports of its own (network.switch.port, links_per_cube): the schema, the path
// through the ports, exact times on a small case, contention at a port, the ports' counters, and
// the HGX topologies built on it.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sim/hw/errors.h"
#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using testing::small_doc;

// small_doc's cubes on a switch: 4 links of 10 GB/s per cube (40 GB/s striped), overhead 5 ns,
// wire 20 ns, switch latency 30 ns, ports of `port_GBps` each (one per link).
nlohmann::json switch_doc(double port_GBps) {
  auto doc = small_doc();
  doc["network"] = {{"kind", "switch"},
                    {"chunk_bytes", 65536},
                    {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 20}, {"overhead_ns", 5}}},
                    {"switch", {{"latency_ns", 30}, {"links_per_cube", 4}, {"port", {{"bandwidth_GBps", port_GBps}}}}}};
  return doc;
}

// Runs the transfers (src cube, dst cube, bytes) together from time 0, HBM to HBM, each into its
// own destination range; returns when each finished.
std::vector<Time> run_flows(System& sys, const std::vector<std::pair<int, int>>& flows, std::uint64_t bytes) {
  std::vector<Time> done(flows.size());
  for (std::size_t i = 0; i < flows.size(); ++i) {
    sys.simulator().spawn(fmt::format("flow{}", i), [&, i] {
      sys.transfer(sys.hbm(flows[i].first).at(0), sys.hbm(flows[i].second).at(i * bytes), bytes);
      done[i] = sys.simulator().now();
    });
  }
  sys.simulator().run();
  return done;
}

SystemOptions timing_only() {
  SystemOptions o;
  o.functional = false;
  return o;
}

TEST(SwitchPorts, SchemaStripesLinksAndMakesAPortGroupPerCubeAndDirection) {
  const Topology t = topology_from_json(switch_doc(10), "sw");
  EXPECT_EQ(t.switch_links_per_cube, 4);
  EXPECT_EQ(t.switch_port, sim::Bandwidth::GBps(10));
  EXPECT_TRUE(t.has_switch_ports());
  ASSERT_GE(t.find_link(0, kSwitchNode), 0);
  EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(0, kSwitchNode))].figures.bandwidth, sim::Bandwidth::GBps(40));
  EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(kSwitchNode, 3))].figures.bandwidth, sim::Bandwidth::GBps(40));

  sim::Simulator sim;
  System sys(sim, t, timing_only());
  std::map<std::string, sim::Bandwidth> ports;
  for (const UnitUsage& u : sys.usage()) {
    if (u.kind == UnitKind::switch_port) ports[u.name] = sys.switch_port(u.place.from >= 0 ? u.place.from : u.place.to, u.place.from >= 0).bandwidth();
  }
  ASSERT_EQ(ports.size(), 8u);  // in and out for each of 4 cubes
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(ports.at(fmt::format("switch.port c{}->sw", c)), sim::Bandwidth::GBps(40));
    EXPECT_EQ(ports.at(fmt::format("switch.port sw->c{}", c)), sim::Bandwidth::GBps(40));
  }
  EXPECT_EQ(sys.switch_port(2, true).name(), "switch.port c2->sw");
  EXPECT_EQ(sys.switch_port(2, false).track_group(), "switch");
  EXPECT_EQ(unit_kind_name(UnitKind::switch_port), "switch_port");
  // The path: up the sender's links, its in ports, the receiver's out ports, down its links.
  const PathFigures f = sys.path_figures(sys.hbm(1), sys.hbm(2));
  EXPECT_EQ(f.stage_names(), (std::vector<std::string>{"cube1.hbm (read)", "link c1->sw", "switch.port c1->sw",
                                                       "switch.port sw->c2", "link sw->c2", "cube2.hbm (write)"}));
  EXPECT_EQ(f.hops, 2);
}

TEST(SwitchPorts, OnePairReachesTheAggregateOfAllItsLinksExactly) {
  sim::Simulator sim;
  System sys(sim, topology_from_json(switch_doc(10), "sw"), timing_only());
  // 64 B: HBM read latency 100 ns, up 5 + 20 ns, down 5 + 30 (switch) + 20 ns, and 64 B at the
  // 40 GB/s of four striped links once (cut-through): 1.6 ns. (One link alone would take 6.4 ns.)
  {
    const auto t = run_flows(sys, {{0, 2}}, 64);
    EXPECT_EQ(t[0], sim::ns(180) + sim::ps(1600));
  }
  // 64 MiB = 1024 chunks of 64 KiB, each 1638.4 ns at 40 GB/s, after the same 180 ns of delays.
  sim::Simulator sim2;
  System sys2(sim2, topology_from_json(switch_doc(10), "sw"), timing_only());
  const std::uint64_t bytes = 64ull << 20;
  const auto t = run_flows(sys2, {{0, 2}}, bytes);
  EXPECT_EQ(t[0], sim::ns(180) + 1024 * sim::ps(1638400));
  EXPECT_EQ(t[0], sys2.path_figures(sys2.hbm(0), sys2.hbm(2)).time(bytes));
  // Counters: the sender's in ports and the receiver's out ports carried every byte in 1024
  // chunks, busy for the bytes at 40 GB/s; the other ports nothing.
  for (int c = 0; c < 4; ++c) {
    for (bool in : {true, false}) {
      const UnitCounters u = sys2.switch_port(c, in).counters();
      const bool used = (in && c == 0) || (!in && c == 2);
      EXPECT_EQ(u.bytes, used ? bytes : 0) << c << in;
      EXPECT_EQ(u.pieces, used ? 1024u : 0u) << c << in;
      EXPECT_EQ(u.busy, used ? 1024 * sim::ps(1638400) : 0) << c << in;
    }
  }
}

TEST(SwitchPorts, TwoSendersIntoOneReceiverShareItsOutPorts) {
  // Ports of 5 GB/s: a cube's port group (20 GB/s) is slower than its links (40 GB/s), so the
  // ports, not the links, set the pace.
  const std::uint64_t bytes = 16ull << 20;
  Time alone = 0;
  {
    sim::Simulator sim;
    System sys(sim, topology_from_json(switch_doc(5), "sw"), timing_only());
    EXPECT_EQ(sys.path_figures(sys.hbm(1), sys.hbm(0)).bandwidth, sim::Bandwidth::GBps(20));
    alone = run_flows(sys, {{1, 0}}, bytes)[0];
    // 256 chunks of 64 KiB at 20 GB/s (3276.8 ns each) after 180 ns of delays.
    EXPECT_EQ(alone, sim::ns(180) + 256 * sim::ps(3276800));
  }
  {
    sim::Simulator sim;
    System sys(sim, topology_from_json(switch_doc(5), "sw"), timing_only());
    const auto t = run_flows(sys, {{1, 0}, {2, 0}}, bytes);
    // Cube 0's out ports move both flows: 2 x 16 MiB at 20 GB/s, after the delays.
    const Time both = std::max(t[0], t[1]);
    EXPECT_NEAR(static_cast<double>(both) / static_cast<double>(sim::ns(180) + 512 * sim::ps(3276800)), 1.0, 0.01);
    EXPECT_NEAR(static_cast<double>(both) / static_cast<double>(alone), 2.0, 0.02);
    const UnitCounters out0 = sys.switch_port(0, false).counters();
    EXPECT_EQ(out0.bytes, 2 * bytes);
    EXPECT_EQ(out0.busy, 512 * sim::ps(3276800));
    EXPECT_EQ(sys.switch_port(1, true).counters().bytes, bytes);
    EXPECT_EQ(sys.switch_port(2, true).counters().bytes, bytes);
    EXPECT_EQ(sys.switch_port(0, true).counters().bytes, 0u);
  }
  {
    // One sender to two peers shares its in ports the same way.
    sim::Simulator sim;
    System sys(sim, topology_from_json(switch_doc(5), "sw"), timing_only());
    const auto t = run_flows(sys, {{0, 1}, {0, 2}}, bytes);
    EXPECT_NEAR(static_cast<double>(std::max(t[0], t[1])) / static_cast<double>(alone), 2.0, 0.02);
    EXPECT_EQ(sys.switch_port(0, true).counters().bytes, 2 * bytes);
  }
}

TEST(SwitchPorts, WithoutAPortSectionTheSwitchIsAsBefore) {
  auto doc = switch_doc(10);
  doc["network"]["switch"].erase("port");
  doc["network"]["switch"].erase("links_per_cube");
  const Topology t = topology_from_json(doc, "sw");
  EXPECT_FALSE(t.has_switch_ports());
  EXPECT_EQ(t.switch_links_per_cube, 1);
  sim::Simulator sim;
  System sys(sim, t, timing_only());
  EXPECT_FALSE(sys.has_switch_ports());
  EXPECT_THROW(sys.switch_port(0, true), TopologyError);
  EXPECT_EQ(sys.path_figures(sys.hbm(1), sys.hbm(2)).stage_names(),
            (std::vector<std::string>{"cube1.hbm (read)", "link c1->sw", "link sw->c2", "cube2.hbm (write)"}));
  // One 10 GB/s link: 64 B take 6.4 ns on it.
  EXPECT_EQ(run_flows(sys, {{0, 2}}, 64)[0], sim::ns(180) + sim::ps(6400));
}

// The message of loading `doc`.
std::string error_of(const nlohmann::json& doc) {
  try {
    topology_from_json(doc, "t");
  } catch (const TopologyError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SwitchPorts, BadFieldsAreClearErrors) {
  auto d = switch_doc(10);
  d["network"]["switch"]["links_per_cube"] = 0;
  EXPECT_EQ(error_of(d), "topology 'small' (t): network.switch.links_per_cube: 0 is not valid; give an integer from 1 "
                         "to 1024 (parallel links between each cube and the switch)");
  d = switch_doc(10);
  d["network"]["switch"]["port"]["bandwidth_GBps"] = 0;
  EXPECT_EQ(error_of(d), "topology 'small' (t): network.switch.port.bandwidth_GBps: 0 is not valid; give a bandwidth > "
                         "0 in GB/s (1 GB/s = 1e9 bytes/s)");
  d = switch_doc(10);
  d["network"]["switch"]["port"] = nlohmann::json::object();
  EXPECT_EQ(error_of(d), "topology 'small' (t): network.switch.port: missing required field 'bandwidth_GBps' (bandwidth "
                         "of one switch port per direction, GB/s)");
  d = switch_doc(10);
  d["network"]["switch"]["port"]["latency_ns"] = 3;
  EXPECT_EQ(error_of(d), "topology 'small' (t): network.switch.port: unknown key 'latency_ns'; valid keys here: "
                         "bandwidth_GBps");
  d = switch_doc(10);
  d["network"]["switch"]["links_per_cub"] = 3;
  EXPECT_NE(error_of(d).find("unknown key 'links_per_cub' (did you mean 'links_per_cube'?)"), std::string::npos)
      << error_of(d);
}

TEST(SwitchPorts, HgxTopologies) {
  for (const char* name : {"h200x8", "h100x8"}) {
    SCOPED_TRACE(name);
    const Topology t = load_topology(name);
    EXPECT_EQ(t.cubes.size(), 8u);
    EXPECT_EQ(t.network, NetworkKind::kSwitch);
    EXPECT_EQ(t.switch_links_per_cube, 18);
    EXPECT_EQ(t.switch_port, sim::Bandwidth::GBps(25));
    EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(5, kSwitchNode))].figures.bandwidth, sim::Bandwidth::GBps(450));
    EXPECT_EQ(t.cubes[0].pes, 132);
    EXPECT_FALSE(t.sources.empty());
    // One pair of GPUs moves 1 GiB at the full 450 GB/s of its 18 links.
    sim::Simulator sim;
    System sys(sim, t, timing_only());
    const std::uint64_t bytes = 1ull << 30;
    const Time got = run_flows(sys, {{4, 6}}, bytes)[0];
    const PathFigures f = sys.path_figures(sys.hbm(4), sys.hbm(6));
    EXPECT_EQ(f.bandwidth, sim::Bandwidth::GBps(450));
    EXPECT_EQ(got, f.time(bytes));
    EXPECT_GT(static_cast<double>(bytes) / sim::to_s(got), 0.99 * 450e9);
  }
  EXPECT_EQ(load_topology("h200x8").cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(4800));
  EXPECT_EQ(load_topology("h100x8").cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(3350));
  EXPECT_EQ(load_topology("h100x8").cubes[0].hbm.capacity_bytes, 80'000'000'000ull);
}

}  // namespace
}  // namespace cubesim::hw
