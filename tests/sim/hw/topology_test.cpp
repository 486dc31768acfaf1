// The topology loader: shipped files, extends/set, dotted overrides, and every validator error.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <typeinfo>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/hw/compute_unit.h"
#include "sim/hw/errors.h"
#include "sim/hw/topology.h"
#include "sim/hw/topology_schema.h"
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
  for (const char* n : {"single_cube", "ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8", "h200x8", "h100x8"}) {
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

TEST(Topology, HbmReadWriteCopyRatesAndKernelFiguresAreOptional) {
  const Topology plain = load_topology("single_cube");  // neither: today's single HBM rate, no kernel costs
  EXPECT_FALSE(plain.cubes[0].hbm.rw_model());
  EXPECT_EQ(plain.cubes[0].kernel.launch_gap, 0u);
  EXPECT_EQ(plain.cubes[0].kernel.reduction, 0u);
  const Topology h200 = load_topology("h200x8");
  EXPECT_TRUE(h200.cubes[7].hbm.rw_model());
  EXPECT_EQ(h200.cubes[7].hbm.read, sim::Bandwidth::GBps(4383.1));
  EXPECT_EQ(h200.cubes[7].hbm.write, sim::Bandwidth::GBps(3393.7));
  EXPECT_EQ(h200.cubes[7].hbm.copy.bytes_per_s, 0u);  // no turnaround: reads and writes take turns
  EXPECT_EQ(h200.cubes[7].hbm.bandwidth, sim::Bandwidth::GBps(4800));  // the DMA path's figure is unchanged
  EXPECT_EQ(h200.cubes[7].kernel.launch_gap, sim::ns(2960));
  EXPECT_EQ(h200.cubes[7].kernel.reduction, sim::ns(6848));
  const Topology h100 = load_topology("h100x8");  // its own figures, not h200x8's
  EXPECT_EQ(h100.cubes[0].hbm.write, sim::Bandwidth::GBps(3281.0));
  EXPECT_EQ(h100.cubes[0].kernel.launch_gap, sim::ns(1264));
  // One of the three alone turns the model on; the others stay 0 (cost_time uses bandwidth for them).
  const Topology one = load_topology("single_cube", {{"cube.hbm.write_GBps", 512}});
  EXPECT_TRUE(one.cubes[0].hbm.rw_model());
  EXPECT_EQ(one.cubes[0].hbm.read.bytes_per_s, 0u);
  EXPECT_EQ(one.cubes[0].hbm.write, sim::Bandwidth::GBps(512));
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
      {"zero HBM write rate", [](json& j) { j["cube"]["hbm"]["write_GBps"] = 0; },
       {"cube.hbm.write_GBps: 0 is not valid; give a bandwidth > 0 in GB/s"}},
      {"negative HBM copy rate", [](json& j) { j["cube"]["hbm"]["copy_GBps"] = -2771.9; },
       {"cube.hbm.copy_GBps: -2771.9 is not valid; give a bandwidth > 0 in GB/s"}},
      {"HBM read rate not a number", [](json& j) { j["cube"]["hbm"]["read_GBps"] = "4.4 TB/s"; },
       {"cube.hbm.read_GBps: expected a number, got a string (\"4.4 TB/s\")"}},
      {"negative launch gap", [](json& j) { j["cube"]["kernel"] = {{"launch_gap_ns", -1}}; },
       {"cube.kernel.launch_gap_ns: -1 is not valid; give a time >= 0 in ns"}},
      {"reduction pass not a number", [](json& j) { j["cube"]["kernel"] = {{"reduction_ns", "7 us"}}; },
       {"cube.kernel.reduction_ns: expected a number, got a string (\"7 us\")"}},
      {"unknown kernel key (typo)", [](json& j) { j["cube"]["kernel"] = {{"launch_ns", 1000}}; },
       {"cube.kernel: unknown key 'launch_ns'", "launch_gap_ns", "reduction_ns"}},
      {"per-cube HBM write rate", [](json& j) { j["cubes"] = json::array({{{"id", 0}}, {{"id", 1}, {"hbm", {{"write_GBps", 0}}}}}); },
       {"cubes.1.hbm.write_GBps: 0 is not valid"}},
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


// ---- one schema: the tree apply_override walks is the tree the loader reads by

// The schema path of every key in `j` ("cubes.*.pe.clock_GHz"), "_comment" left out.
void key_paths(const json& j, const std::string& path, std::set<std::string>& out) {
  auto visit = [&](const std::string& key, const json& v) {
    const std::string p = path.empty() ? key : path + "." + key;
    out.insert(p);
    key_paths(v, p, out);
  };
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() != "_comment") visit(it.key(), it.value());
    }
  } else if (j.is_array()) {
    for (const json& e : j) visit("*", e);
  }
}

std::set<std::string> all_schema_paths() {
  const std::vector<std::string> v = schema_paths();
  return {v.begin(), v.end()};
}

TEST(TopologySchema, EveryKeyOfAShippedDocumentIsASchemaPath) {
  const std::set<std::string> schema = all_schema_paths();
  EXPECT_EQ(schema.size(), schema_paths().size()) << "a path is listed twice";
  for (const std::string& n : list_topologies()) {
    SCOPED_TRACE(n);
    for (const json& doc : {load_topology_json(n), load_topology(n).doc}) {
      std::set<std::string> keys;
      key_paths(doc, "", keys);
      for (const std::string& k : keys) EXPECT_TRUE(schema.count(k)) << k;
    }
  }
}

// A path of the schema with "*" as index 0, or "" when a list on the way is absent from `doc` (only
// "cubes" is made on the way: a count becomes per-cube entries).
std::string concrete_path(const std::string& schema_path, const json& doc) {
  std::string out, ptr;
  const json* cur = &doc;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = schema_path.find('.', start);
    std::string seg = schema_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (seg == "*") {
      if (out != "cubes" && !(cur && cur->is_array() && !cur->empty())) return "";
      seg = "0";
    }
    out = out.empty() ? seg : out + "." + seg;
    ptr += "/" + seg;
    cur = doc.contains(json::json_pointer(ptr)) ? &doc.at(json::json_pointer(ptr)) : nullptr;
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

TEST(TopologySchema, ApplyOverrideAcceptsEverySchemaLeafOfAShippedDocument) {
  std::vector<std::string> leaves;
  for (const std::string& p : schema_paths()) {
    const SchemaNode* n = &topology_schema();
    for (std::size_t start = 0;;) {
      const std::size_t dot = p.find('.', start);
      const std::string seg = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      n = seg == "*" ? n->item() : n->field(seg);
      ASSERT_NE(n, nullptr) << p;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (n->is_leaf()) leaves.push_back(p);
  }
  EXPECT_GT(leaves.size(), 100u);
  for (const std::string& name : list_topologies()) {
    SCOPED_TRACE(name);
    const json doc = load_topology_json(name);
    int applied = 0;
    for (const std::string& leaf : leaves) {
      const std::string path = concrete_path(leaf, doc);
      if (path.empty()) continue;
      std::string ptr = "/" + path;
      std::replace(ptr.begin(), ptr.end(), '.', '/');
      const bool present = doc.contains(json::json_pointer(ptr));
      json d = doc;
      EXPECT_NO_THROW(apply_override(d, path, present ? doc.at(json::json_pointer(ptr)) : json(1))) << path;
      // Setting a field to the value it has changes nothing (a per-cube path makes per-cube entries).
      if (present && !leaf.starts_with("cubes.")) {
        EXPECT_EQ(d, doc) << path;
      }
      ++applied;
    }
    EXPECT_GT(applied, 60) << "most leaves apply to every shipped document";
  }
}

// Documents that between them have every key of the schema; each must load. The loader checks on
// every object that it read each key the document has and asked only for keys the schema has
// (std::logic_error otherwise), so loading these shows the reader reads the whole schema.
std::vector<json> documents_with_every_schema_key() {
  json full = small_doc();
  full["_comment"] = "every optional key";
  full["cube"]["clock_scale"] = 1.0;
  full["cube"]["hbm"]["channel_map"] = "hash";
  full["cube"]["pe"]["mac"]["clock_GHz"] = 1.0;
  full["cube"]["pe"]["mac"]["macs_per_cycle"]["f16"] = 1024;
  full["cube"]["pe"]["vector"]["clock_GHz"] = 1.0;
  full["cube"]["pe"]["vector"]["ops_per_cycle"]["bf16"] = 64;
  full["cube"]["pe"]["vector"]["ops_per_cycle"]["f16"] = 64;
  full["cube"]["pe"]["gemm"] = json::parse(R"({"tile": {"m": 16, "n": 32, "k": 16},
      "tiles": {"f32": {"m": 16, "n": 16, "k": 8}, "bf16": {"m": 32, "n": 32, "k": 16}, "f16": {"m": 32, "n": 32, "k": 16}},
      "choices": {"f32": [{"m": 16, "n": 16, "k": 8}], "bf16": [{"m": 32, "n": 32, "k": 16}, {"m": 16, "n": 16, "k": 16}],
                  "f16": [{"m": 32, "n": 32, "k": 16}]},
      "stages": 3, "launch_ns": 1000, "raster": "m", "swizzle": 2, "cluster": [2, 1],
      "mma": {"issue_cycles_per_k_block": 8, "prologue_cycles": 100, "epilogue_cycles": 50,
              "unaligned_bytes_per_cycle": 64, "unaligned_macs_per_cycle": 256}})");
  full["calibration"] = json::parse(R"({"gpu": "NVIDIA H200", "gpus": 2, "driver": "580.159.04", "cuda": "13.0",
                                        "nccl": "2.28.9", "date": "2026-11-22", "measurements": "m.json"})");
  full["cube"]["hbm"]["read_GBps"] = 900;
  full["cube"]["hbm"]["write_GBps"] = 700;
  full["cube"]["hbm"]["copy_GBps"] = 600;
  full["cube"]["kernel"] = json::parse(R"({"launch_gap_ns": 2000, "reduction_ns": 5000})");
  full["cube"]["l2"] = json::parse(R"({"capacity_KiB": 64, "line_bytes": 128, "sector_bytes": 32, "ways": 4,
                                       "bandwidth_GBps": 2000, "latency_ns": 20})");
  full["host"] = json::parse(R"({"memory": {"capacity_GiB": 1, "bandwidth_GBps": 10, "latency_ns": 100},
                                 "link": {"bandwidth_GBps": 16, "latency_ns": 500, "overhead_ns": 100}})");
  full["link_overrides"] = json::parse(R"([
      {"from": 0, "to": 1, "both_directions": true, "bandwidth_GBps": 50, "latency_ns": 30, "overhead_ns": 6},
      {"from": "host", "to": 2, "bandwidth_scale": 0.5}])");
  full["nccl"] = json::parse(R"({"launch_latency_ns": 100, "channels": 4, "channel_bandwidth_GBps": 20,
                                 "algorithms": ["ring", "tree"], "rings": ["0 2 1 3"], "protocols": {}})");
  for (const char* p : {"LL", "LL128", "Simple"}) {
    full["nccl"]["protocols"][p] = json::parse(R"({"enabled": true, "data_bytes": 8, "wire_bytes": 16,
        "base_latency_ns": {"ring": 6600, "tree": 6800}, "hop_latency_ns": {"ring": 600, "tree": 600},
        "slice_bytes": 32768, "max_bus_bandwidth_GBps": 141, "tree_bandwidth_factor": 0.25,
        "fixed_latency_ns": 5000, "send_latency_ns": 400, "send_bandwidth_GBps": 12, "copy_bandwidth_GBps": 30,
        "chunk_slices": 2, "max_threads": 256, "thread_threshold_bytes": 16})");
  }
  std::vector<json> docs;
  // Every capacity unit, in the template and in a per-cube entry.
  const std::vector<std::pair<std::string, double>> units = {{"capacity_bytes", 1 << 20}, {"capacity_KiB", 1024},
                                                             {"capacity_MiB", 1}, {"capacity_GiB", 1},
                                                             {"capacity_TiB", 1}, {"capacity_GB", 1}};
  for (const auto& [unit, amount] : units) {
    json d = full;
    for (const char* mem : {"/cube/hbm", "/cube/pe/tcm", "/host/memory", "/cube/l2"}) {
      json& m = d[json::json_pointer(mem)];
      for (const auto& u : units) m.erase(u.first);
      // 1 TiB of L2 would be more lines than the simulator keeps: the L2 has 1/1024 TiB (1 GiB).
      m[unit] = std::string(mem) == "/cube/l2" && unit == "capacity_TiB" ? amount / 1024 : amount;
    }
    json one = d["cube"];
    one["id"] = 1;
    d["cubes"] = json::array({{{"id", 0}}, one, {{"id", 2}, {"_comment", "as the template"}}, {{"id", 3}}});
    docs.push_back(d);
  }
  json mesh = full;
  mesh["network"] = json::parse(R"({"kind": "mesh", "dims": [2, 2], "chunk_bytes": 4096,
                                    "link": {"bandwidth_GBps": 10, "latency_ns": 1, "overhead_ns": 1}})");
  docs.push_back(mesh);
  json sw = full;
  sw["network"] = json::parse(R"({"kind": "switch", "chunk_bytes": 4096, "switch": {"latency_ns": 3,
                                  "links_per_cube": 2, "port": {"bandwidth_GBps": 10}},
                                  "link": {"bandwidth_GBps": 10, "latency_ns": 1, "overhead_ns": 1}})");
  sw["link_overrides"] = json::parse(R"([{"from": 0, "to": "switch", "bandwidth_scale": 0.5}])");
  docs.push_back(sw);
  json ex = full;
  ex["network"] = json::parse(R"({"kind": "explicit", "chunk_bytes": 4096,
      "link": {"bandwidth_GBps": 10, "latency_ns": 1, "overhead_ns": 1},
      "links": [{"from": 0, "to": 1, "bidirectional": true, "bandwidth_GBps": 5, "latency_ns": 2, "overhead_ns": 3},
                {"from": 1, "to": 2}, {"from": 2, "to": 3}, {"from": 3, "to": 0}]})");
  docs.push_back(ex);
  return docs;
}

TEST(TopologySchema, TheLoaderReadsEveryKeyOfTheSchema) {
  std::set<std::string> seen;
  for (const json& d : documents_with_every_schema_key()) {
    EXPECT_NO_THROW(topology_from_json(d, "coverage")) << d.dump();
    key_paths(d, "", seen);
  }
  const std::set<std::string> schema = all_schema_paths();
  for (const std::string& p : schema) EXPECT_TRUE(seen.count(p)) << "no document here has " << p;
  for (const std::string& p : seen) EXPECT_TRUE(schema.count(p)) << p << " is not in the schema";
}

TEST(TopologySchema, UnknownKeysListTheSchemaNodesKeys) {
  json doc = small_doc();
  doc["cubes"] = json::array({{{"id", 0}, {"pess", 3}}, {{"id", 1}}, {{"id", 2}}, {{"id", 3}}});
  // A per-cube entry has the cube's fields and its id; the template has no id.
  expect_error_contains([&] { topology_from_json(doc, "t"); },
                        {"cubes.0: unknown key 'pess' (did you mean 'pes'?); valid keys here: clock_scale, hbm, id, kernel, l2, pe, "
                         "pes"});
  json tmpl = small_doc();
  tmpl["cube"]["id"] = 0;
  expect_error_contains([&] { topology_from_json(tmpl, "t"); },
                        {"cube: unknown key 'id'", "valid keys here: clock_scale, hbm, kernel, l2, pe, pes"});
  EXPECT_EQ(topology_schema().field("cube")->keys(),
            (std::vector<std::string>{"clock_scale", "hbm", "kernel", "l2", "pe", "pes"}));
  EXPECT_EQ(topology_schema().field("cubes")->item()->keys(),
            (std::vector<std::string>{"clock_scale", "hbm", "id", "kernel", "l2", "pe", "pes"}));
}

TEST(Topology, LoadWithOverridesIsLoadThenApplyThenValidate) {
  const std::vector<std::pair<std::string, json>> ov = {{"network.link.bandwidth_GBps", 64}, {"cubes.2.clock_scale", 0.5}};
  const Topology t = load_topology("ring4", ov);
  json doc = load_topology_json("ring4");
  for (const auto& [path, value] : ov) apply_override(doc, path, value);
  const Topology u = topology_from_json(doc, "ring4");
  EXPECT_EQ(t.doc, u.doc);
  EXPECT_EQ(t.origin, "ring4");
  EXPECT_EQ(t.links[0].figures.bandwidth, sim::Bandwidth::GBps(64));
  EXPECT_EQ(t.cubes[2].clock_scale, 0.5);
  EXPECT_EQ(t.cubes[2].pe.clock_hz, load_topology("ring4").cubes[2].pe.clock_hz / 2);
  // Without overrides it is load_topology: the origin is the file.
  const Topology plain = load_topology("ring4", {});
  EXPECT_EQ(plain.doc, load_topology("ring4").doc);
  EXPECT_EQ(plain.origin, load_topology("ring4").origin);
}

TEST(Topology, LoadWithOverridesErrorsNameTheOverridePath) {
  expect_error_contains([] { load_topology("ring4", {{"network.link.bandwdith_GBps", 64}}); },
                        {"override path 'network.link.bandwdith_GBps'", "network.link has no field 'bandwdith_GBps'",
                         "did you mean 'bandwidth_GBps'?", "fields there: bandwidth_GBps, latency_ns, overhead_ns"});
  expect_error_contains([] { load_topology("ring4", {{"network.link.bandwidth_GBps", 0}}); },
                        {"topology 'ring4' (ring4): network.link.bandwidth_GBps: 0 is not valid"});
  expect_error_contains([] { load_topology("mesh4x4", {{"cubes.16.clock_scale", 0.5}}); },
                        {"override path 'cubes.16.clock_scale'", "index 16 is out of range: cubes has 16 entries"});
  expect_error_contains([] { load_topology("ring4", {{"cube.id", 1}}); },
                        {"override path 'cube.id'", "cube has no field 'id'"});
}


// ---------------------------------------------------------------- hardening (issue 13)

// A file whose text is small_doc() with `field` (a JSON text) added at the top level.
std::string small_text_with(const std::string& extra) {
  std::string text = small_doc().dump();
  text.insert(text.size() - 1, "," + extra);
  return text;
}

TEST(TopologyHardening, DeepNestingIsRefusedBeforeParsingNamingFileAndLimit) {
  TempDir dir;
  // Deep enough to overflow the stack of a recursive parser or destructor (issue 13 crashed here).
  for (const std::string open_close : {"[]", "{}"}) {
    std::string deep;
    const int n = 200000;
    for (int i = 0; i < n; ++i) deep += open_close[0] == '[' ? "[" : "{\"a\":";
    deep += "1";
    for (int i = 0; i < n; ++i) deep += open_close[1];
    const std::string f = dir.write("deep.json", small_text_with("\"_comment\": " + deep));
    expect_error_contains([&] { load_topology(f); }, {f, "deeper than 64 levels", "line 1, column"});
  }
  // At the limit it parses (and fails for what it is, not for depth).
  std::string ok = "1";
  for (int i = 0; i < kMaxJsonDepth - 2; ++i) ok = "[" + ok + "]";
  const std::string f = dir.write("ok.json", small_text_with("\"_comment\": " + ok));
  EXPECT_NO_THROW(load_topology(f));
  // A document built in code (the Python API's way in) is checked too.
  json d = 1;
  for (int i = 0; i < 100; ++i) d = json::array({d});
  json doc = small_doc();
  doc["cube"]["_comment"] = d;
  expect_error_contains([&] { topology_from_json(doc, "built"); }, {"topology 'built'", "deeper than 64 levels"});
  expect_error_contains([&] { apply_override(doc, "cube.pes", d); }, {"cube.pes", "the limit is 64 levels"});
}

TEST(TopologyHardening, OutOfRangeNumbersAndLongExtendsNamesNameFileAndPath) {
  TempDir dir;
  json doc = small_doc();
  std::string text = doc.dump();
  const std::string from = "\"bandwidth_GBps\":1000";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"bandwidth_GBps\":1e999");
  const std::string f = dir.write("huge.json", text);
  expect_error_contains([&] { load_topology(f); }, {f, "cube.hbm.bandwidth_GBps", "out of range", "give a finite number"});
  // A 300-character name (longer than a file name may be) and a NUL in it.
  const std::string g = dir.write("long.json", R"({"extends": ")" + std::string(300, 'x') + R"("})");
  expect_error_contains([&] { load_topology(g); }, {g, "extends", "300 bytes", "each part at most 255 bytes"});
  const std::string h = dir.write("nul.json", R"({"extends": "ring\u00004"})");
  expect_error_contains([&] { load_topology(h); }, {h, "extends", "control characters"});
}

TEST(TopologyHardening, NonUtf8BytesNameFileAndOffset) {
  TempDir dir;
  std::string text = small_text_with("\"_comment\": \"caf\xE9\"");
  const std::size_t at = text.find('\xE9');
  const std::string f = dir.write("latin1.json", text);
  try {
    load_topology(f);
    ADD_FAILURE() << "no error";
  } catch (const TopologyError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(f), std::string::npos) << m;
    EXPECT_NE(m.find(fmt::format("byte offset {}", at)), std::string::npos) << m;
    EXPECT_NE(m.find("0xE9"), std::string::npos) << m;
    EXPECT_EQ(m.find('\xE9'), std::string::npos) << "the message itself must be valid UTF-8";
  }
  // A truncated sequence at the end, an overlong encoding, a surrogate.
  for (const std::string& bad : {std::string("\xC3"), std::string("\xC0\xAF"), std::string("\xED\xA0\x80")}) {
    const std::string g = dir.write("bad.json", small_text_with("\"_comment\": \"" + bad + "\""));
    expect_error_contains([&] { load_topology(g); }, {g, "is not valid UTF-8", "byte offset"});
  }
  // Valid multi-byte text passes.
  const std::string ok = dir.write("utf8.json", small_text_with("\"_comment\": \"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\""));
  EXPECT_NO_THROW(load_topology(ok));
}

TEST(TopologyHardening, FileSizeLimitAndNonRegularFiles) {
  TempDir dir;
  const std::string z = dir.write("zero.json", R"({"extends": "/dev/zero"})");
  expect_error_contains([&] { load_topology(z); }, {"/dev/zero", "not a regular file", "16777216 bytes"});
  expect_error_contains([&] { load_topology(dir.path.string() + "/"); }, {"not a regular file"});
  // A file over the limit is refused from its size, before it is read.
  std::string big = small_text_with("\"_comment\": \"" + std::string(kMaxTopologyFileBytes, 'x') + "\"");
  const std::string b = dir.write("big.json", big);
  expect_error_contains([&] { load_topology(b); }, {b, "the limit is 16777216 bytes"});
}

TEST(TopologyHardening, AMisspeltRequiredKeyIsNamedAsTheTypo) {
  json d = small_doc();
  d["network"]["link"].erase("bandwidth_GBps");
  d["network"]["link"]["bandwdith_GBps"] = 100;
  expect_error_contains([&] { topology_from_json(d, "t"); },
                        {"network.link: missing required field 'bandwidth_GBps'", "unknown key 'bandwdith_GBps'",
                         "did you mean 'bandwidth_GBps'?"});
  d = small_doc();
  d["cube"]["pe"]["tcm"].erase("latency_ns");
  d["cube"]["pe"]["tcm"]["latncy_ns"] = 2;
  expect_error_contains([&] { topology_from_json(d, "t"); },
                        {"cube.pe.tcm: missing required field 'latency_ns'", "'latncy_ns'", "did you mean 'latency_ns'?"});
  d = small_doc();
  d["cube"]["hbm"].erase("capacity_MiB");
  d["cube"]["hbm"]["capacity_MB"] = 64;
  expect_error_contains([&] { topology_from_json(d, "t"); },
                        {"cube.hbm: missing required field", "'capacity_MB'", "did you mean 'capacity_"});
  d = small_doc();
  d["netwrok"] = d["network"];
  d.erase("network");
  expect_error_contains([&] { topology_from_json(d, "t"); },
                        {"missing required field 'network'", "'netwrok'", "did you mean 'network'?"});
  // No hint when no unknown key is close.
  d = small_doc();
  d["cube"].erase("pes");
  try {
    topology_from_json(d, "t");
    ADD_FAILURE();
  } catch (const TopologyError& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
}

TEST(TopologyHardening, FiguresThatRoundToZeroOrOverflowAreRefusedAtLoad) {
  const std::vector<std::pair<std::string, json>> bad = {
      {"network.link.bandwidth_GBps", 1e-30},     {"cube.hbm.bandwidth_GBps", 4e-10},
      {"cube.pe.dma.read_GBps", 1e-12},           {"cube.pe.clock_GHz", 1e-30},
      {"cube.pe.mac.clock_GHz", 4e-10},           {"cube.pe.mac.macs_per_cycle.bf16", 1e-30},
      {"cube.pe.vector.ops_per_cycle.f32", 1e-7}, {"cube.clock_scale", 1e-30}};
  for (const auto& [path, value] : bad) {
    SCOPED_TRACE(path);
    json d = small_doc();
    apply_override(d, path, value);
    expect_error_contains([&] { topology_from_json(d, "t"); }, {path, "is not valid"});
  }
  json d = small_doc();
  apply_override(d, "network.link.bandwidth_GBps", 1e-30);
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"from 1e-09 (1 byte/s)"});
  d = small_doc();
  apply_override(d, "cube.pe.mac.macs_per_cycle.bf16", 1e-30);
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"from 9.53674e-07 (2^-20)"});
  d = small_doc();
  d["link_overrides"] = json::parse(R"([{"from": 0, "to": 1, "bandwidth_scale": 1e-12}])");
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"link_overrides.0.bandwidth_scale", "1e-09 GB/s (1 byte/s)"});
  // The smallest figures load.
  d = small_doc();
  apply_override(d, "network.link.bandwidth_GBps", kMinBandwidthGBps);
  apply_override(d, "cube.pe.clock_GHz", kMinClockGHz);
  apply_override(d, "cube.pe.mac.macs_per_cycle.bf16", kMinPerCycle);
  const Topology t = topology_from_json(d, "t");
  EXPECT_EQ(t.links[0].figures.bandwidth.bytes_per_s, 1u);
  EXPECT_EQ(t.cubes[0].pe.clock_hz, 1u);
}

// A slower MAC rate never gives a shorter time: the cycle count saturates (and the time then
// overflows with an error) instead of wrapping, even for a rate the loader would refuse.
TEST(TopologyHardening, ASlowerUnitIsNeverFaster) {
  const std::uint64_t n = 1ull << 40;
  sim::Duration last = 0;
  for (double r : {1024.0, 1.0, 1.0 / 1024, kMinPerCycle, 1e-9, 1e-30, 1e-300}) {
    SCOPED_TRACE(r);
    RateSpec spec;
    spec.clock_hz = 1'000'000'000;
    spec.per_cycle[static_cast<std::size_t>(DType::bf16)] = r;
    ComputeUnit mac(UnitKind::mac, spec, 0, 0);
    EXPECT_GE(mac.cycles(n, DType::bf16), static_cast<std::uint64_t>(std::min(1.8e19, static_cast<double>(n) / r)) / 2);
    try {
      const sim::Duration t = mac.time(n, DType::bf16);
      EXPECT_GE(t, last);
      last = t;
    } catch (const std::exception&) {
      last = sim::kTimeMax;  // too long to represent: an error, never a shorter time
    }
  }
  EXPECT_EQ(last, sim::kTimeMax) << "the slowest rates overflow the time";
}

TEST(TopologyHardening, ExtendsResolvesAgainstTheExtendingFilesDirectoryFirst) {
  TempDir dir;
  fs::create_directories(dir.path / "here" / "sub");
  fs::create_directories(dir.path / "there" / "sub");
  json base = small_doc();
  base["description"] = "right";
  dir.write("there/sub/base.json", base.dump());
  dir.write("there/plain.json", base.dump());
  base["description"] = "decoy";
  dir.write("here/sub/base.json", base.dump());
  dir.write("here/plain.json", base.dump());
  const std::string child = dir.write("there/child.json", R"({"extends": "sub/base.json"})");
  const std::string child2 = dir.write("there/child2.json", R"({"extends": "plain.json"})");
  // The current directory for a scope (the decoys are relative to it), restored however it ends.
  struct InDirectory {
    fs::path old = fs::current_path();
    explicit InDirectory(const fs::path& p) { fs::current_path(p); }
    ~InDirectory() { fs::current_path(old); }
  };
  Topology t, t2;
  {
    InDirectory here(dir.path / "here");
    t = load_topology(child);
    t2 = load_topology(child2);
  }
  EXPECT_EQ(t.description, "right");
  EXPECT_EQ(t2.description, "right");
  // Not next to the extending file: the current directory is the fallback.
  fs::remove(dir.path / "there" / "plain.json");
  {
    InDirectory here(dir.path / "here");
    t2 = load_topology(child2);
  }
  EXPECT_EQ(t2.description, "decoy");
}

TEST(TopologyHardening, DuplicateLinkOverridesAreRefusedNamingBothEntries) {
  json d = small_doc();
  d["link_overrides"] = json::parse(R"([{"from": 0, "to": 1, "bandwidth_scale": 0.5},
                                        {"from": 2, "to": 3, "latency_ns": 50},
                                        {"from": 0, "to": 1, "bandwidth_scale": 0.5}])");
  expect_error_contains([&] { topology_from_json(d, "t"); },
                        {"link_overrides.2", "link c0->c1", "link_overrides.0", "give each link direction once"});
  // both_directions covers the reverse direction too.
  d["link_overrides"] = json::parse(R"([{"from": 0, "to": 1, "latency_ns": 30, "both_directions": true},
                                        {"from": 1, "to": 0, "latency_ns": 50}])");
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"link_overrides.1", "link c1->c0", "link_overrides.0"});
  // Distinct links are fine.
  d["link_overrides"] = json::parse(R"([{"from": 0, "to": 1, "bandwidth_scale": 0.5}, {"from": 1, "to": 0, "latency_ns": 50}])");
  const Topology t = topology_from_json(d, "t");
  EXPECT_EQ(t.links[static_cast<std::size_t>(t.find_link(0, 1))].figures.bandwidth, sim::Bandwidth::GBps(50));
}

TEST(TopologyHardening, CubeAndLinkLimitsAreEnforcedBeforeAnyWork) {
  // 2^20 cubes used to be built (and run out of memory in Python); refused from the count.
  for (const std::string count : {"131072", "1048576", "18446744073709551615"}) {
    json d = small_doc();
    d["cubes"] = json::parse(count);
    expect_error_contains([&] { topology_from_json(d, "t"); }, {"cubes", "65536"});
  }
  json d = small_doc();
  d.erase("cubes");
  d["network"] = json::parse(R"({"kind": "torus", "dims": [1024, 1024, 1024], "chunk_bytes": 65536,
                                 "link": {"bandwidth_GBps": 100, "latency_ns": 20, "overhead_ns": 5}})");
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"network.dims", "the limit is 65536 cubes"});
  d["network"]["dims"] = json::array({512, 256});
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"network.dims", "the limit is 65536 cubes"});
  d["network"]["dims"] = json::array({256, 256});  // exactly the limit: loads
  EXPECT_EQ(topology_from_json(d, "t").cubes.size(), kMaxCubes);
  // A per-cube override on a count beyond the limit is refused before the list is made.
  d = small_doc();
  d["cubes"] = 1ull << 40;
  expect_error_contains([&] { apply_override(d, "cubes.3.clock_scale", 0.5); }, {"cubes.3.clock_scale", "65536"});
  d = small_doc();
  d.erase("cubes");
  d["network"] = json::parse(R"({"kind": "mesh", "dims": [1000000, 1000000], "chunk_bytes": 65536,
                                 "link": {"bandwidth_GBps": 100, "latency_ns": 20, "overhead_ns": 5}})");
  expect_error_contains([&] { apply_override(d, "cubes.3.clock_scale", 0.5); }, {"cubes.3.clock_scale", "65536"});
  // Links: a full network of 2048 cubes has 2048 x 2047 link directions.
  d = small_doc();
  d["cubes"] = 2048;
  d["network"]["kind"] = "full";
  expect_error_contains([&] { topology_from_json(d, "t"); },
                        {"network: a full network of 2048 cubes", "4192256 link directions", "the limit is 2097152"});
  d["cubes"] = 1024;  // 1024 x 1023 = 1047552: loads
  EXPECT_EQ(topology_from_json(d, "t").links.size(), 1024u * 1023);
  // A list of cubes longer than the limit.
  d = small_doc();
  d["cubes"] = json::array();
  for (std::size_t i = 0; i <= kMaxCubes; ++i) d["cubes"].push_back(json::object());
  expect_error_contains([&] { topology_from_json(d, "t"); }, {"cubes: a list of 65537 cubes; the limit is 65536"});
}

// ---------------------------------------------------------------- fuzzing (issue 13, Deliver 2)
//
// A seeded mutation fuzzer: mutants of the shipped topologies/*.json, as bytes (flips, deletions,
// duplications, splices, deep nesting, huge numbers) loaded from a file, and as documents (a random
// field replaced by a random value, the Python API's way in) given to topology_from_json. Each must
// load or throw a TopologyError whose message is non-empty, valid UTF-8 and names the origin; any
// other exception type fails the test (a crash or a hang fails the run). CUBESIM_FUZZ_ITERS sets the
// mutants per kind (default 300: a second or two, also under ASan), CUBESIM_FUZZ_SEED the seed
// (default 13); a failure prints both and the mutant's iteration so it can be replayed.

std::uint64_t env_u64(const char* name, std::uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

std::string mutate_bytes(std::string text, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  static const std::vector<std::string> kTokens = {
      "{", "}", "[", "]", ",", ":", "\"", "null", "true", "-", "0", "1e999", "-1e999", "1e-30", "-1", "1e308",
      "18446744073709551616", "9223372036854775807", "4294967297", "65537", "0.0", "NaN", "\\u0000", "\\ud800",
      "\xff", "\xc3", "\xe2\x82", "\"extends\": \"/dev/zero\", ", "\"extends\": \"ring4\", ", "\"extends\": \"..\", ",
      "\"set\": {\"cubes.3.clock_scale\": 0.5}, ", "\"cubes\": 1000000, ", "\"link_overrides\": [{\"from\": 0, \"to\": 1, \"latency_ns\": 1}], "};
  auto pos = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % (n + 1)); };
  const int mutations = 1 + static_cast<int>(rng() % 3);
  for (int m = 0; m < mutations; ++m) {
    const std::size_t at = pos(text.size());
    switch (rng() % 7) {
      case 0:  // flip a byte
        if (!text.empty()) text[std::min(at, text.size() - 1)] = static_cast<char>(rng() % 256);
        break;
      case 1:  // delete a range
        text.erase(at, 1 + rng() % 64);
        break;
      case 2: {  // duplicate a range
        const std::string piece = text.substr(at, 1 + rng() % 256);
        text.insert(pos(text.size()), piece);
        break;
      }
      case 3: {  // deep nesting, around the limit or far past it
        const std::size_t k = rng() % 2 ? 60 + rng() % 10 : 1000 + rng() % 100000;
        const bool arr = rng() % 2;
        std::string deep;
        for (std::size_t i = 0; i < k; ++i) deep += arr ? "[" : "{\"_comment\":";
        deep += "0";
        deep += std::string(k, arr ? ']' : '}');
        text.insert(at, deep);
        break;
      }
      case 4: {  // a number replaced by an extreme one
        const std::size_t d = text.find_first_of("0123456789", at);
        if (d == std::string::npos) break;
        const std::size_t e = text.find_first_not_of("0123456789.eE+-", d);
        static const std::vector<std::string> kNums = {"1e999", "1e-30", "-1", "0", "1e308", "18446744073709551616",
                                                       "4294967296", "65537", "2147483648", "1e-320", "131072", "0.5"};
        text.replace(d, (e == std::string::npos ? text.size() : e) - d, kNums[rng() % kNums.size()]);
        break;
      }
      case 5:  // a token
        text.insert(at, kTokens[rng() % kTokens.size()]);
        break;
      case 6: {  // a splice from another file
        const std::string& other = corpus[rng() % corpus.size()];
        const std::size_t from = pos(other.size());
        text.insert(at, other.substr(from, 1 + rng() % 512));
        break;
      }
    }
  }
  return text;
}

// A random value of a random kind, for a document mutant.
json random_value(std::mt19937_64& rng) {
  switch (rng() % 12) {
    case 0: return nullptr;
    case 1: return -1;
    case 2: return 0;
    case 3: return std::numeric_limits<double>::max();
    case 4: return 1e-30;
    case 5: return std::numeric_limits<std::uint64_t>::max();
    case 6: return static_cast<std::int64_t>(rng() % 200000) - 1000;
    case 7: return "ring4";
    case 8: return std::string(1 + rng() % 300, 'x');
    case 9: return json::array({1, "a", nullptr});
    case 10: return json::object({{"from", 0}, {"to", 1}, {"latency_ns", 5}});
    default: {
      json d = 0;
      for (std::uint64_t i = 0, n = rng() % 100; i < n; ++i) d = json::array({d});
      return d;
    }
  }
}

// Replaces (or adds, or deletes) a random field somewhere in doc.
void mutate_doc(json& doc, std::mt19937_64& rng) {
  json* cur = &doc;
  for (int depth = 0; depth < 8; ++depth) {
    if (!cur->is_structured() || cur->empty() || rng() % 4 == 0) break;
    auto it = cur->begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % cur->size()));
    if (!it->is_structured() || rng() % 3 == 0) {
      if (cur->is_object() && rng() % 5 == 0) {
        cur->erase(it.key());
      } else {
        *it = random_value(rng);
      }
      return;
    }
    cur = &*it;
  }
  if (cur->is_object()) (*cur)[rng() % 2 ? "_comment" : "extra_key"] = random_value(rng);
  else if (cur->is_array()) cur->push_back(random_value(rng));
}

void expect_clean_outcome(const std::function<void()>& load, const std::string& origin, const std::string& what) {
  try {
    load();
  } catch (const TopologyError& e) {
    const std::string m = e.what();
    EXPECT_FALSE(m.empty()) << what;
    EXPECT_TRUE(valid_utf8(m)) << what << ": the message is not UTF-8";
    EXPECT_NE(m.find(origin), std::string::npos) << what << ": the message does not name " << origin << ": " << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << typeid(e).name() << " instead of a TopologyError: " << e.what();
  }
}

TEST(TopologyFuzz, MutantsOfTheShippedFilesLoadOrFailWithATopologyError) {
  const std::uint64_t iters = env_u64("CUBESIM_FUZZ_ITERS", 300);
  const std::uint64_t seed = env_u64("CUBESIM_FUZZ_SEED", 13);
  std::vector<std::string> names = list_topologies(), corpus;
  ASSERT_FALSE(names.empty());
  for (const std::string& n : names) {
    std::ifstream f(fs::path(topology_dir()) / (n + ".json"), std::ios::binary);
    corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  TempDir dir;
  std::mt19937_64 rng(seed);
  int loaded = 0;
  for (std::uint64_t i = 0; i < iters && !HasFailure(); ++i) {
    const std::string what = fmt::format("byte mutant {} (CUBESIM_FUZZ_SEED={})", i, seed);
    const std::string path = dir.write("mutant.json", mutate_bytes(corpus[rng() % corpus.size()], corpus, rng));
    expect_clean_outcome([&] { load_topology(path); ++loaded; }, path, what);
  }
  std::vector<json> docs;
  for (const std::string& n : names) docs.push_back(load_topology_json(n));
  for (std::uint64_t i = 0; i < iters && !HasFailure(); ++i) {
    const std::string what = fmt::format("document mutant {} (CUBESIM_FUZZ_SEED={})", i, seed);
    json doc = docs[rng() % docs.size()];
    for (std::uint64_t m = 0, n = 1 + rng() % 3; m < n; ++m) mutate_doc(doc, rng);
    expect_clean_outcome([&] { topology_from_json(doc, "fuzz-doc"); ++loaded; }, "fuzz-doc", what);
  }
  std::printf("fuzz: %d of %llu mutants loaded\n", loaded, static_cast<unsigned long long>(2 * iters));
  EXPECT_GT(loaded, 0) << "no mutant loaded: the mutations are too destructive to test the validator";
}

}  // namespace
}  // namespace cubesim::hw

namespace cubesim::hw {
namespace {
// A user's long string is cut in a message (the Python API fuzzer found 5000-character ones).
TEST(TopologyHardening, LongUserStringsAreCutInMessages) {
  const std::string kind(5000, 'a');
  json doc = load_topology_json("ring4");
  doc["network"]["kind"] = kind;
  try {
    topology_from_json(doc, "long");
    FAIL() << "an unknown kind must be refused";
  } catch (const TopologyError& e) {
    const std::string m = e.what();
    EXPECT_LT(m.size(), 400u) << m.substr(0, 300);
    EXPECT_NE(m.find("(5000 characters)"), std::string::npos) << m.substr(0, 300);
    EXPECT_NE(m.find("valid kinds: "), std::string::npos);
  }
  json other = load_topology_json("ring4");
  try {
    apply_override(other, "cube." + kind, 1);
    FAIL() << "an unknown path must be refused";
  } catch (const TopologyError& e) {
    EXPECT_LT(std::string(e.what()).size(), 600u);
  }
}
}  // namespace
}  // namespace cubesim::hw
