// The topology loader: shipped files, extends/set, dotted overrides, and every validator error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "sim/hw/errors.h"
#include "sim/hw/topology.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using json = nlohmann::json;
using testing::small_doc;
namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("cubesim_topo_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path / name;
    std::ofstream(p) << text;
    return p.string();
  }
};

void expect_error_contains(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no TopologyError; expected one containing '" << parts.front() << "'";
  } catch (const TopologyError& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
    }
  }
}

TEST(Topology, EveryShippedTopologyLoadsAndIsSourced) {
  const std::vector<std::string> names = list_topologies();
  for (const char* n : {"single_cube", "ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  for (const std::string& n : names) {
    SCOPED_TRACE(n);
    const Topology t = load_topology(n);
    EXPECT_EQ(t.name, n);
    EXPECT_FALSE(t.sources.empty()) << "every shipped figure needs a source";
    EXPECT_FALSE(t.description.empty());
    EXPECT_GT(t.chunk_bytes, 0u);
    for (std::size_t i = 0; i < t.cubes.size(); ++i) EXPECT_EQ(t.cubes[i].id, static_cast<int>(i));
  }
}

TEST(Topology, ShippedFiguresMatchTheirDescriptions) {
  const Topology mesh = load_topology("mesh4x4");
  ASSERT_EQ(mesh.cubes.size(), 16u);
  EXPECT_EQ(mesh.cubes[5].pes, 8);
  EXPECT_EQ(mesh.cubes[5].hbm.bandwidth, sim::Bandwidth::GBps(2048));
  EXPECT_EQ(mesh.cubes[5].hbm.capacity_bytes, 48'000'000'000ull);
  EXPECT_EQ(mesh.links.size(), 2u * 2 * 4 * 3 + 2 * 16);  // 24 cables * 2 directions + host links
  EXPECT_EQ(mesh.links[0].figures.bandwidth, sim::Bandwidth::GBps(128));
  EXPECT_EQ(mesh.links[0].figures.overhead, sim::ns(8));

  const Topology torus = load_topology("torus8x8");
  EXPECT_EQ(torus.cubes.size(), 64u);
  EXPECT_EQ(torus.network, NetworkKind::kTorus);
  EXPECT_EQ(torus.cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(2048));  // inherited from mesh4x4

  const Topology h200 = load_topology("h200x4");
  EXPECT_EQ(h200.cubes[0].pes, 132);
  EXPECT_EQ(h200.cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(4800));
  EXPECT_EQ(h200.cubes[0].hbm.capacity_bytes, 141'000'000'000ull);
  // 3 peers x 150 GB/s = 450 GB/s per direction per GPU.
  std::uint64_t out = 0;
  for (const LinkSpec& l : h200.links) {
    if (l.from == 0 && l.to >= 0) out += l.figures.bandwidth.bytes_per_s;
  }
  EXPECT_EQ(out, 450'000'000'000ull);

  const Topology dgx = load_topology("dgx_h100x8");
  EXPECT_EQ(dgx.cubes.size(), 8u);
  EXPECT_EQ(dgx.network, NetworkKind::kSwitch);
  EXPECT_EQ(dgx.cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(3350));
  EXPECT_EQ(dgx.cubes[0].hbm.capacity_bytes, 80'000'000'000ull);
  EXPECT_EQ(dgx.cubes[0].pes, 132);  // inherited from h200x4
  EXPECT_EQ(dgx.links[static_cast<std::size_t>(dgx.find_link(0, kSwitchNode))].figures.bandwidth,
            sim::Bandwidth::GBps(450));
}

TEST(Topology, DottedOverridesAreTheSweepMechanism) {
  json doc = load_topology_json("mesh4x4");
  apply_override(doc, "cube.hbm.bandwidth_GBps", 4096);
  apply_override(doc, "network.link.latency_ns", 50);
  apply_override(doc, "cubes.3.clock_scale", 0.8);  // "cubes" is a count here: becomes per-cube entries
  apply_override(doc, "cubes.5.pe.clock_GHz", 1.0);
  const Topology t = topology_from_json(doc, "sweep");
  EXPECT_EQ(t.cubes.size(), 16u);
  EXPECT_EQ(t.cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(4096));
  EXPECT_EQ(t.links[0].figures.latency, sim::ns(50));
  EXPECT_EQ(t.cubes[3].pe.clock_hz, 1'200'000'000u);  // 1.5 GHz * 0.8
  EXPECT_EQ(t.cubes[3].pe.mac.clock_hz, 1'200'000'000u);
  EXPECT_EQ(t.cubes[5].pe.clock_hz, 1'000'000'000u);
  EXPECT_EQ(t.cubes[4].pe.clock_hz, 1'500'000'000u);

  json ring = load_topology_json("ring4");
  apply_override(ring, "cubes", 1024);
  EXPECT_EQ(topology_from_json(ring, "ring1024").cubes.size(), 1024u);
  json grid = load_topology_json("torus8x8");
  apply_override(grid, "network.dims", json::array({4, 2}));
  EXPECT_EQ(topology_from_json(grid, "torus4x2").cubes.size(), 8u);
  apply_override(grid, "network.dims.0", 2);
  EXPECT_EQ(topology_from_json(grid, "torus2x2").cubes.size(), 4u);
}

TEST(Topology, OverridePathErrorsNameThePath) {
  json doc = load_topology_json("mesh4x4");
  expect_error_contains([&] { apply_override(doc, "cube.hbm.bandwdith_GBps", 1); },
                        {"'cube.hbm.bandwdith_GBps'", "cube.hbm has no field 'bandwdith_GBps'",
                         "did you mean 'bandwidth_GBps'?", "channels"});
  expect_error_contains([&] { apply_override(doc, "network.dims.7", 1); }, {"index 7 is out of range", "network.dims has 2"});
  expect_error_contains([&] { apply_override(doc, "network.kind.x", 1); }, {"network.kind is a string", "no field 'x'"});
  expect_error_contains([&] { apply_override(doc, "cubes.3.pe.colck_GHz", 1); }, {"cubes.3.pe has no field 'colck_GHz'"});
  expect_error_contains([&] { apply_override(doc, "cube..pes", 1); }, {"empty component"});
}

TEST(Topology, ExtendsAndSetInFiles) {
  TempDir d;
  d.write("base.json", small_doc().dump());
  d.write("child.json", R"({"extends": "base.json", "name": "child", "cubes": 6,
                            "set": {"cube.hbm.bandwidth_GBps": 2000, "cubes.2.clock_scale": 0.5},
                            "link_overrides": [{"from": 0, "to": 1, "bandwidth_scale": 0.5, "both_directions": true}]})");
  const Topology t = load_topology((d.path / "child.json").string());
  EXPECT_EQ(t.name, "child");
  EXPECT_EQ(t.cubes.size(), 6u);
  EXPECT_EQ(t.cubes[0].hbm.bandwidth, sim::Bandwidth::GBps(2000));
  EXPECT_EQ(t.cubes[2].pe.clock_hz, 500'000'000u);
  EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(0, 1))].figures.bandwidth, sim::Bandwidth::GBps(50));
  EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(1, 0))].figures.bandwidth, sim::Bandwidth::GBps(50));
  EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(1, 2))].figures.bandwidth, sim::Bandwidth::GBps(100));
  // A document in memory may extend a shipped topology too.
  const Topology u = topology_from_json(json{{"extends", "ring4"}, {"set", {{"cubes", 8}}}}, "ring8");
  EXPECT_EQ(u.cubes.size(), 8u);
}

TEST(Topology, EnvironmentVariableChoosesTheDirectory) {
  TempDir d;
  d.write("only_one.json", small_doc().dump());
  const char* old = std::getenv("CUBESIM_TOPOLOGY_DIR");
  const std::string saved = old ? old : "";
  ::setenv("CUBESIM_TOPOLOGY_DIR", d.path.c_str(), 1);
  EXPECT_EQ(list_topologies(), std::vector<std::string>{"only_one"});
  EXPECT_EQ(load_topology("only_one").cubes.size(), 4u);
  if (old) ::setenv("CUBESIM_TOPOLOGY_DIR", saved.c_str(), 1); else ::unsetenv("CUBESIM_TOPOLOGY_DIR");
  EXPECT_GE(list_topologies().size(), 6u);
}

// Every validator error path: (what is wrong, how to break the document, what the message says).
struct BadCase {
  const char* what;
  std::function<void(json&)> mutate;
  std::vector<std::string> message;
};

TEST(Topology, EveryValidatorErrorNamesPathAndRemedy) {
  const std::vector<BadCase> cases = {
      {"missing field", [](json& j) { j["cube"]["hbm"].erase("bandwidth_GBps"); },
       {"topology 'small' (t)", "cube.hbm: missing required field 'bandwidth_GBps'", "GB/s"}},
      {"missing section", [](json& j) { j.erase("network"); }, {"missing required field 'network'"}},
      {"zero bandwidth", [](json& j) { j["network"]["link"]["bandwidth_GBps"] = 0; },
       {"network.link.bandwidth_GBps: 0 is not valid", "give a bandwidth > 0 in GB/s"}},
      {"negative bandwidth", [](json& j) { j["cube"]["pe"]["dma"]["read_GBps"] = -5; },
       {"cube.pe.dma.read_GBps: -5 is not valid", "> 0"}},
      {"negative latency", [](json& j) { j["cube"]["hbm"]["latency_ns"] = -1; },
       {"cube.hbm.latency_ns: -1 is not valid; give a time >= 0 in ns"}},
      {"wrong type", [](json& j) { j["cube"]["hbm"]["bandwidth_GBps"] = "fast"; },
       {"cube.hbm.bandwidth_GBps: expected a number, got a string (\"fast\")"}},
      {"unknown key (typo)", [](json& j) { j["network"]["link"]["bandwdith_GBps"] = 1; },
       {"network.link: unknown key 'bandwdith_GBps' (did you mean 'bandwidth_GBps'?)", "valid keys here:"}},
      {"unknown top-level key", [](json& j) { j["netwrok"] = json::object(); },
       {"unknown key 'netwrok' (did you mean 'network'?)"}},
      {"unknown dtype", [](json& j) { j["cube"]["pe"]["mac"]["macs_per_cycle"]["fp8"] = 4096; },
       {"cube.pe.mac.macs_per_cycle: unknown key 'fp8'", "bf16", "f16", "f32"}},
      {"unknown network kind", [](json& j) { j["network"]["kind"] = "tours"; },
       {"network.kind: 'tours' is not a network kind (did you mean 'torus'?)", "valid kinds"}},
      {"dims on a ring", [](json& j) { j["network"]["dims"] = {2, 2}; }, {"network.dims: only mesh and torus"}},
      {"dims do not match cubes", [](json& j) { j["network"]["kind"] = "mesh"; j["network"]["dims"] = {3, 3}; },
       {"cubes: 4 cubes do not match network.dims [3,3] (9 cubes)"}},
      {"bad dims", [](json& j) { j["network"]["kind"] = "mesh"; j["network"]["dims"] = {2, 0}; j.erase("cubes"); },
       {"network.dims.1: 0 is not valid"}},
      {"two capacities", [](json& j) { j["cube"]["hbm"]["capacity_GiB"] = 1; },
       {"cube.hbm: give exactly one capacity field, found capacity_MiB, capacity_GiB"}},
      {"no capacity", [](json& j) { j["cube"]["pe"]["tcm"].erase("capacity_KiB"); },
       {"cube.pe.tcm: missing required field: the TCM capacity; give one of capacity_bytes"}},
      {"TCM smaller than the smallest tile", [](json& j) { j["cube"]["pe"]["tcm"]["capacity_KiB"] = 16; },
       {"cube.pe.tcm: TCM of 16.00 KiB is smaller than the smallest tile", "(64x64)", "bf16", "need 48.00 KiB",
        "cube.pe.tile"}},
      {"zero PEs", [](json& j) { j["cube"]["pes"] = 0; }, {"cube.pes: 0 is not valid; give an integer from 1"}},
      {"zero clock", [](json& j) { j["cube"]["pe"]["clock_GHz"] = 0; }, {"cube.pe.clock_GHz: 0 is not valid"}},
      {"bad clock scale", [](json& j) { j["cubes"] = json::array({{{"id", 0}, {"clock_scale", 0}}, {{"id", 1}}}); },
       {"cubes.0.clock_scale: 0 is not valid"}},
      {"no rates", [](json& j) { j["cube"]["pe"]["vector"]["ops_per_cycle"] = json::object(); },
       {"cube.pe.vector.ops_per_cycle: needs at least one dtype"}},
      {"duplicate cube id", [](json& j) { j["cubes"] = json::array({{{"id", 0}}, {{"id", 0}}}); },
       {"cubes.1.id: duplicate id 0 (cubes.0 has it too)"}},
      {"cube id out of range", [](json& j) { j["cubes"] = json::array({{{"id", 0}}, {{"id", 5}}}); },
       {"cubes.1.id: 5 is not valid; ids are 0..1"}},
      {"link to an unknown cube",
       [](json& j) {
         j["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096},
                         {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 1}, {"overhead_ns", 1}}},
                         {"links", json::array({{{"from", 0}, {"to", 1}}, {{"from", 1}, {"to", 7}}})}};
       },
       {"network.links.1.to: cube 7 does not exist; cube ids are 0..3"}},
      {"duplicate link",
       [](json& j) {
         j["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096},
                         {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 1}, {"overhead_ns", 1}}},
                         {"links", json::array({{{"from", 0}, {"to", 1}}, {{"from", 1}, {"to", 0}}})}};
       },
       {"network.links.1: duplicate link c1->c0 (network.links.0 already has it)"}},
      {"self link",
       [](json& j) {
         j["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096},
                         {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 1}, {"overhead_ns", 1}}},
                         {"links", json::array({{{"from", 2}, {"to", 2}}})}};
       },
       {"network.links.0: a link from cube 2 to itself"}},
      {"explicit link without figures",
       [](json& j) {
         j["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096}, {"links", json::array({{{"from", 0}, {"to", 1}}})}};
       },
       {"network.links.0: missing required field 'bandwidth_GBps'"}},
      {"disconnected system",
       [](json& j) {
         j["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096},
                         {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 1}, {"overhead_ns", 1}}},
                         {"links", json::array({{{"from", 0}, {"to", 1}}, {{"from", 2}, {"to", 3}}})}};
       },
       {"network: the system is disconnected: cube 0 cannot reach cube 2"}},
      {"one-way link", [](json& j) {
         j["network"] = {{"kind", "explicit"}, {"chunk_bytes", 4096},
                         {"link", {{"bandwidth_GBps", 10}, {"latency_ns", 1}, {"overhead_ns", 1}}},
                         {"links", json::array({{{"from", 0}, {"to", 1}, {"bidirectional", false}},
                                                {{"from", 1}, {"to", 2}}, {{"from", 2}, {"to", 3}}})}};
       },
       {"the system is disconnected: cube 1 cannot reach cube 0"}},
      {"no network for many cubes", [](json& j) { j["network"] = {{"kind", "none"}, {"chunk_bytes", 4096}}; },
       {"network.kind: 'none' connects nothing but there are 4 cubes: the system is disconnected"}},
      {"missing link figures", [](json& j) { j["network"].erase("link"); }, {"network: missing required field 'link'"}},
      {"switch without switch", [](json& j) { j["network"]["kind"] = "switch"; },
       {"network: missing required field 'switch'"}},
      {"link override of a missing link", [](json& j) { j["link_overrides"] = {{{"from", 0}, {"to", 2}, {"latency_ns", 5}}}; },
       {"link_overrides.0: there is no link c0->c2 in this ring network; links from c0: c0->c1, c0->c3"}},
      {"link override to an unknown cube", [](json& j) { j["link_overrides"] = {{{"from", 0}, {"to", 9}, {"latency_ns", 5}}}; },
       {"link_overrides.0.to: cube 9 does not exist"}},
      {"link override that changes nothing", [](json& j) { j["link_overrides"] = {{{"from", 0}, {"to", 1}}}; },
       {"link_overrides.0: changes nothing"}},
      {"zero chunk", [](json& j) { j["network"]["chunk_bytes"] = 0; }, {"network.chunk_bytes: 0 is not valid"}},
      {"ring of one", [](json& j) { j["cubes"] = 1; }, {"cubes: a ring needs at least 2 cubes, got 1"}},
      {"bad set path", [](json& j) { j["set"] = {{"cube.hbm.bandwith_GBps", 5}}; },
       {"set: override path 'cube.hbm.bandwith_GBps'", "did you mean 'bandwidth_GBps'?"}},
      {"sources not strings", [](json& j) { j["sources"] = json::array({1}); }, {"sources.0: expected a string"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    json doc = small_doc();
    c.mutate(doc);
    expect_error_contains([&] { topology_from_json(doc, "t"); }, c.message);
  }
}

TEST(Topology, FileErrorsNameTheFile) {
  TempDir d;
  const std::string bad = d.write("bad.json", "{\n  \"name\": \"bad\",\n  \"cube\": {,}\n}\n");
  expect_error_contains([&] { load_topology(bad); }, {bad, "invalid JSON at line 3", "_comment"});
  const std::string dup = d.write("dup.json", R"({"name": "dup", "cube": {"pes": 1, "pes": 2}})");
  expect_error_contains([&] { load_topology(dup); }, {dup, "cube.pes: duplicate key"});
  d.write("a.json", R"({"extends": "b.json"})");
  d.write("b.json", R"({"extends": "a.json"})");
  expect_error_contains([&] { load_topology((d.path / "a.json").string()); }, {"'extends' forms a cycle", "a.json -> "});
  expect_error_contains([&] { load_topology("mesh44"); }, {"unknown topology 'mesh44' (did you mean 'mesh4x4'?)",
                                                            "shipped topologies:", "CUBESIM_TOPOLOGY_DIR"});
  expect_error_contains([&] { load_topology((d.path / "nope.json").string()); }, {"nope.json", "does not exist"});
  const std::string arr = d.write("arr.json", "[1, 2]");
  expect_error_contains([&] { load_topology(arr); }, {"expected a JSON object at the top"});
}

}  // namespace
}  // namespace cubesim::hw
