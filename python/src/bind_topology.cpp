// Python bindings of the topology loader (sim/hw/topology.h): list, load, override by dotted path,
// validate; a Topology exposes its figures as plain Python values (units in the key names).
#include <set>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common.h"
#include "sim/hw/topology.h"

namespace py = pybind11;
using namespace cubesim;
using namespace cubesim::pyb;

namespace {

double ns_of(sim::Duration d) { return sim::to_ns(d); }

py::dict rate_dict(const hw::RateSpec& r) {
  py::dict per;
  for (DType d : kAllDTypes) {
    if (r.rate(d) > 0) per[py::str(std::string(dtype_name(d)))] = r.rate(d);
  }
  py::dict o;
  o["clock_GHz"] = static_cast<double>(r.clock_hz) / 1e9;
  o["per_cycle"] = per;
  return o;
}

py::dict cube_dict(const hw::CubeSpec& c) {
  py::dict hbm;
  hbm["capacity_bytes"] = c.hbm.capacity_bytes;
  hbm["bandwidth_GBps"] = c.hbm.bandwidth.gbps();
  hbm["latency_ns"] = ns_of(c.hbm.latency);
  hbm["channels"] = c.hbm.channels;
  hbm["interleave_bytes"] = c.hbm.interleave_bytes;
  py::dict tcm;
  tcm["capacity_bytes"] = c.pe.tcm.capacity_bytes;
  tcm["bandwidth_GBps"] = c.pe.tcm.bandwidth.gbps();
  tcm["latency_ns"] = ns_of(c.pe.tcm.latency);
  py::dict dma;
  dma["read_GBps"] = c.pe.dma.read.gbps();
  dma["write_GBps"] = c.pe.dma.write.gbps();
  dma["chunk_bytes"] = c.pe.dma.chunk_bytes;
  dma["overhead_ns"] = ns_of(c.pe.dma.overhead);
  py::dict tile;
  tile["m"] = c.pe.tile.m;
  tile["n"] = c.pe.tile.n;
  tile["k"] = c.pe.tile.k;
  py::dict pe;
  pe["clock_GHz"] = static_cast<double>(c.pe.clock_hz) / 1e9;
  pe["tcm"] = tcm;
  pe["dma"] = dma;
  pe["mac"] = rate_dict(c.pe.mac);
  pe["vector"] = rate_dict(c.pe.vector);
  pe["tile"] = tile;
  if (c.pe.gemm.present) {  // the GPU-like GEMM pipeline (kernels/sim_pe_gemm.h)
    const hw::GemmPipelineSpec& g = c.pe.gemm;
    auto tile_dict = [](const hw::TileSpec& t) {
      py::dict d;
      d["m"] = t.m;
      d["n"] = t.n;
      d["k"] = t.k;
      return d;
    };
    py::dict tiles;
    for (DType d : kAllDTypes) tiles[py::str(std::string(dtype_name(d)))] = tile_dict(g.tile_for(d));
    py::dict mma;
    mma["issue_cycles_per_k_block"] = g.issue_cycles_per_k_block;
    mma["prologue_cycles"] = g.prologue_cycles;
    mma["epilogue_cycles"] = g.epilogue_cycles;
    py::dict gd;
    gd["tile"] = tile_dict(g.tile);
    gd["tiles"] = tiles;
    py::dict choices;
    for (DType d : kAllDTypes) {
      py::list l;
      for (const hw::TileSpec& t : g.tiles_for(d)) l.append(tile_dict(t));
      choices[py::str(std::string(dtype_name(d)))] = l;
    }
    gd["choices"] = choices;  // per dtype: the tiles a GEMM chooses from (one: no choice)
    gd["stages"] = g.auto_stages ? py::object(py::str("auto")) : py::object(py::int_(g.stages));
    gd["launch_ns"] = ns_of(g.launch);
    gd["raster"] = std::string(hw::gemm_raster_name(g.raster));
    gd["swizzle"] = g.swizzle;
    gd["cluster"] = py::make_tuple(g.cluster_m, g.cluster_n);
    gd["mma"] = mma;
    pe["gemm"] = gd;
  } else {
    pe["gemm"] = py::none();
  }
  py::dict o;
  o["id"] = c.id;
  o["pes"] = c.pes;
  o["clock_scale"] = c.clock_scale;
  o["hbm"] = hbm;
  if (c.l2.present) {
    py::dict l2;
    l2["capacity_bytes"] = c.l2.capacity_bytes;
    l2["line_bytes"] = c.l2.line_bytes;
    l2["sector_bytes"] = c.l2.sector_bytes;
    l2["ways"] = c.l2.ways;
    l2["bandwidth_GBps"] = c.l2.bandwidth.gbps();
    l2["latency_ns"] = ns_of(c.l2.latency);
    o["l2"] = l2;
  } else {
    o["l2"] = py::none();
  }
  o["pe"] = pe;
  return o;
}

py::object endpoint(int node) {
  if (node == hw::kSwitchNode) return py::str("switch");
  if (node == hw::kHostNode) return py::str("host");
  return py::int_(node);
}

py::dict link_dict(const hw::LinkSpec& l) {
  py::dict o;
  o["name"] = l.name;
  o["from"] = endpoint(l.from);
  o["to"] = endpoint(l.to);
  o["bandwidth_GBps"] = l.figures.bandwidth.gbps();
  o["latency_ns"] = ns_of(l.figures.latency);
  o["overhead_ns"] = ns_of(l.figures.overhead);
  return o;
}

py::object host_dict(const hw::HostSpec& h) {
  if (!h.present) return py::none();
  py::dict link;
  link["bandwidth_GBps"] = h.link.bandwidth.gbps();
  link["latency_ns"] = ns_of(h.link.latency);
  link["overhead_ns"] = ns_of(h.link.overhead);
  py::dict o;
  o["capacity_bytes"] = h.capacity_bytes;
  o["bandwidth_GBps"] = h.bandwidth.gbps();
  o["latency_ns"] = ns_of(h.latency);
  o["link"] = link;
  return o;
}

hw::Topology load_with_overrides(const std::string& name_or_path, const py::object& overrides) {
  const auto ov = overrides_arg(overrides);
  ReleaseGil nogil;  // reading, merging and validating touch no Python object (threads of a sweep load at once)
  return hw::load_topology(name_or_path, ov);
}

}  // namespace

void bind_topology(py::module_& m) {
  py::class_<hw::Topology>(m, "Topology",
                           "A validated system description: cubes (PEs, HBM, TCM), links, switch and host.\n"
                           "Figures are plain numbers with their unit in the key (bandwidth_GBps, latency_ns, "
                           "capacity_bytes). Made by load_topology() or topology_from_json().")
      .def_readonly("name", &hw::Topology::name)
      .def_readonly("description", &hw::Topology::description)
      .def_readonly("sources", &hw::Topology::sources)
      .def_readonly("origin", &hw::Topology::origin, "The file it came from, or what the caller called it.")
      .def_property_readonly("doc", [](const hw::Topology& t) { return from_json(t.doc); },
                             "The resolved JSON document (extends merged, 'set' applied) as a dict.")
      .def_property_readonly("num_cubes", [](const hw::Topology& t) { return t.cubes.size(); })
      .def_property_readonly("num_links", [](const hw::Topology& t) { return t.links.size(); },
                             "Link directions: len(links), without making a dict per link.")
      .def_property_readonly("pe_counts",
                             [](const hw::Topology& t) {
                               std::set<int> s;
                               for (const auto& c : t.cubes) s.insert(c.pes);
                               return std::vector<int>(s.begin(), s.end());
                             },
                             "The distinct PE counts of the cubes, ascending (one entry when all cubes are alike).")
      .def_property_readonly("network", [](const hw::Topology& t) { return std::string(hw::network_kind_name(t.network)); },
                             "none | ring | mesh | torus | full | switch | explicit")
      .def_readonly("dims", &hw::Topology::dims)
      .def_readonly("chunk_bytes", &hw::Topology::chunk_bytes)
      .def_property_readonly("cubes",
                             [](const hw::Topology& t) {
                               py::list l;
                               for (const auto& c : t.cubes) l.append(cube_dict(c));
                               return l;
                             },
                             "One dict per cube: id, pes, clock_scale, hbm{...}, l2{...} or None, pe{clock_GHz, tcm, dma, mac, "
                             "vector, tile}.")
      .def_property_readonly("links",
                             [](const hw::Topology& t) {
                               py::list l;
                               for (const auto& s : t.links) l.append(link_dict(s));
                               return l;
                             },
                             "One dict per link direction: name, from, to (cube id, 'host' or 'switch'), "
                             "bandwidth_GBps, latency_ns, overhead_ns.")
      .def_property_readonly("host", [](const hw::Topology& t) { return host_dict(t.host); },
                             "Host memory and per-cube host link figures, or None.")
      .def_property_readonly("switch_latency_ns", [](const hw::Topology& t) { return ns_of(t.switch_latency); })
      .def_property_readonly("switch",
                             [](const hw::Topology& t) -> py::object {
                               if (t.network != hw::NetworkKind::kSwitch) return py::none();
                               py::dict d;
                               d["latency_ns"] = ns_of(t.switch_latency);
                               d["links_per_cube"] = t.switch_links_per_cube;
                               d["port_GBps"] = t.has_switch_ports() ? py::object(py::float_(t.switch_port.gbps()))
                                                                     : py::object(py::none());
                               return d;
                             },
                             "A switched network's switch: latency_ns, links_per_cube (striped), port_GBps (one "
                             "port's bandwidth per direction; None: no port units); None for other kinds.")
      .def("__repr__", [](const hw::Topology& t) {
        return "<cubesim.Topology '" + t.name + "': " + std::to_string(t.cubes.size()) + " cube(s), network " +
               std::string(hw::network_kind_name(t.network)) + ", " + std::to_string(t.links.size()) + " links>";
      });

  m.def("list_topologies", &hw::list_topologies, "Names of the shipped topologies (the .json files in topology_dir()).");
  m.def("topology_dir", &hw::topology_dir,
        "The directory shipped names resolve in: $CUBESIM_TOPOLOGY_DIR if set, else the source tree's topologies/.");
  m.def(
      "load_topology_json", [](const std::string& name) { return from_json(hw::load_topology_json(name)); },
      py::arg("name_or_path"),
      "The resolved document of a shipped name or a file ('extends' merged, 'set' applied), as a dict, not yet "
      "validated: the starting point of a sweep (apply_override, then topology_from_json).");
  m.def("load_topology", &load_with_overrides, py::arg("name_or_path"), py::arg("overrides") = py::none(),
        "Loads, resolves and validates a shipped topology ('mesh4x4') or a JSON file.\n\n"
        "overrides: {\"dotted.path\": value} (or a list of (path, value) pairs) applied before validation, e.g.\n"
        "{\"cube.hbm.bandwidth_GBps\": 4096, \"cubes.3.clock_scale\": 0.8}.\n"
        "Raises TopologyError naming the file, the JSON path and what would be valid.");
  m.def(
      "topology_from_json",
      [](const py::object& doc, const std::string& origin) {
        return hw::topology_from_json(to_json(doc, "doc"), origin);
      },
      py::arg("doc"), py::arg("origin") = "<json>",
      "Validates a resolved document (a dict) and builds the Topology; `origin` names it in messages. Raises "
      "TopologyError naming the JSON path.");
  m.def(
      "apply_override",
      [](const py::object& doc, const std::string& path, const py::object& value) {
        nlohmann::json j = to_json(doc, "doc");
        hw::apply_override(j, path, to_json(value, "value"));
        return from_json(j);
      },
      py::arg("doc"), py::arg("path"), py::arg("value"),
      "Returns a copy of `doc` with the field at the dotted path set ('cube.hbm.bandwidth_GBps', "
      "'network.dims.0', 'cubes.3.clock_scale'). A path the schema does not have raises TopologyError listing the "
      "keys that exist there.");
}
