// The topology loader: files -> resolved JSON (extends, set) -> validated Topology.
//
// Validation reads every object through a reader bound to its node of the schema tree
// (topology_schema.h): a key the node lacks is an unknown key, so a typo is never silently ignored.
// The reader may ask only for keys its node has, and must ask for every key of the node that the
// document has (std::logic_error otherwise), so the schema that apply_override walks is exactly what
// is read. Every user error names the dotted path and what would be valid.
#include "sim/hw/topology.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "sim/hw/errors.h"
#include "sim/hw/format.h"
#include "sim/hw/topology_schema.h"

#ifndef CUBESIM_TOPOLOGY_DIR
#define CUBESIM_TOPOLOGY_DIR "topologies"
#endif

namespace cubesim::hw {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string_view network_kind_name(NetworkKind k) {
  switch (k) {
    case NetworkKind::kNone: return "none";
    case NetworkKind::kRing: return "ring";
    case NetworkKind::kMesh: return "mesh";
    case NetworkKind::kTorus: return "torus";
    case NetworkKind::kFull: return "full";
    case NetworkKind::kSwitch: return "switch";
    case NetworkKind::kExplicit: return "explicit";
  }
  return "?";
}

std::string_view gemm_raster_name(GemmRaster r) {
  switch (r) {
    case GemmRaster::m: return "m";
    case GemmRaster::n: return "n";
  }
  return "?";
}

std::string node_name(int node) {
  if (node == kSwitchNode) return "sw";
  if (node == kHostNode) return "host";
  return "c" + std::to_string(node);
}

int Topology::find_link(int from, int to) const {
  for (std::size_t i = 0; i < links.size(); ++i) {
    if (links[i].from == from && links[i].to == to) return static_cast<int>(i);
  }
  return -1;
}

// ---------------------------------------------------------------- small helpers

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate closest to s when it is close (a typo of it), else "".
std::string closest(std::string_view s, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(s, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (best.empty() || best_d > std::max<std::size_t>(2, s.size() / 3)) return "";
  return best;
}

// " (did you mean 'x'?)" when one candidate is close, else "".
std::string did_you_mean(std::string_view s, const std::vector<std::string>& candidates) {
  const std::string best = closest(s, candidates);
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

namespace {

std::string join(const std::vector<std::string>& v, std::string_view sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += v[i];
  }
  return s;
}

std::string child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}
std::string child(const std::string& path, std::size_t index) { return child(path, std::to_string(index)); }

std::string short_dump(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A user's string inside a message, cut to 80 characters (a 5000-character name must not make a
// 5000-character error).
std::string clip(std::string_view s) {
  if (s.size() <= 80) return std::string(s);
  return fmt::format("{}... ({} characters)", s.substr(0, 77), s.size());
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

// ---------------------------------------------------------------- validation context and reader

// The schema node at a dotted path ("network.links.*"); a path the schema lacks is a bug in this file.
const SchemaNode& schema_at(std::string_view dotted) {
  const SchemaNode* n = &topology_schema();
  for (std::size_t start = 0; n;) {
    const std::size_t dot = dotted.find('.', start);
    const std::string_view key = dotted.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    n = key == "*" ? n->item() : n->field(key);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (!n) throw std::logic_error(fmt::format("topology reader: the schema has no path '{}' (topology_schema.cpp)", dotted));
  return *n;
}

struct Ctx {
  std::string name;
  std::string origin;
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw TopologyError(fmt::format("topology '{}' ({}): {}{}{}", clip(name), origin, path, path.empty() ? "" : ": ", msg));
  }
};

// Reads one JSON object against its schema node; finish() rejects the keys the node does not have.
class Obj {
 public:
  Obj(const Ctx& ctx, const SchemaNode& node, const json& j, std::string path)
      : ctx_(ctx), node_(node), j_(j), path_(std::move(path)) {
    if (!j.is_object()) ctx.fail(path_, fmt::format("expected an object, got {} ({})", type_name(j), short_dump(j)));
  }
  const std::string& path() const { return path_; }
  const Ctx& ctx() const { return ctx_; }
  std::string at(std::string_view key) const { return child(path_, key); }
  [[noreturn]] void fail(std::string_view key, const std::string& msg) const { ctx_.fail(at(key), msg); }

  // The schema node of `key`; asking for a key the schema lacks is a bug in this file.
  const SchemaNode& schema(std::string_view key) const {
    const SchemaNode* n = node_.field(key);
    if (!n) {
      throw std::logic_error(fmt::format("topology reader: {} asks for '{}', which its schema node has not (keys: {}); "
                                         "add it to topology_schema.cpp or stop reading it",
                                         path_.empty() ? "the document" : path_, key, join(node_.keys())));
    }
    return *n;
  }
  // The object at `key` (required), read against its node.
  Obj object(std::string_view key, std::string_view what) {
    const SchemaNode& n = schema(key);
    return Obj(ctx_, n, need(key, what), at(key));
  }
  // The object `v` (the value at `key`), read against its node.
  Obj object_at(std::string_view key, const json& v) const { return Obj(ctx_, schema(key), v, at(key)); }

  bool has(std::string_view key) {
    schema(key);
    known_.emplace(key);
    return j_.contains(key);
  }
  // The value at key, or nullptr when absent. Marks the key as known.
  const json* get(std::string_view key) {
    schema(key);
    known_.emplace(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  const json& need(std::string_view key, std::string_view what) {
    const json* v = get(key);
    if (!v) missing(key, what);
    return *v;
  }
  // "missing required field", naming an unknown key of this object that is a typo of it.
  [[noreturn]] void missing(std::string_view key, std::string_view what) const {
    ctx_.fail(path_, fmt::format("missing required field '{}' ({}){}", key, what, typo_of({std::string(key)})));
  }
  // "; the unknown key 'x' looks like a misspelling of 'y'" when a key of this object that the
  // schema lacks is close to one of `wanted`, else "".
  std::string typo_of(const std::vector<std::string>& wanted) const {
    if (!j_.is_object()) return "";
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (it.key() == "_comment" || node_.field(it.key())) continue;
      const std::string c = closest(it.key(), wanted);
      if (!c.empty()) {
        return fmt::format("; the unknown key '{}' here looks like a misspelling of it (did you mean '{}'?)",
                           it.key().substr(0, 80), c);
      }
    }
    return "";
  }

  double number(std::string_view key, std::string_view what) { return as_number(key, need(key, what)); }
  std::optional<double> opt_number(std::string_view key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return as_number(key, *v);
  }
  double as_number(std::string_view key, const json& v) const {
    if (!v.is_number()) fail(key, fmt::format("expected a number, got {} ({})", type_name(v), short_dump(v)));
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(key, fmt::format("{} is not a finite number", short_dump(v)));
    return d;
  }
  std::uint64_t positive_int(std::string_view key, std::string_view what, std::uint64_t max = 1ull << 48) {
    return as_positive_int(key, need(key, what), what, max);
  }
  std::uint64_t as_positive_int(std::string_view key, const json& v, std::string_view what, std::uint64_t max) const {
    bool ok = v.is_number_integer() && (v.is_number_unsigned() || v.get<std::int64_t>() >= 1);
    if (ok) ok = v.get<std::uint64_t>() >= 1 && v.get<std::uint64_t>() <= max;
    if (!ok) {
      fail(key, fmt::format("{} is not valid; give an integer from 1 to {} ({})", short_dump(v), max, what));
    }
    return v.get<std::uint64_t>();
  }
  sim::Bandwidth bandwidth(std::string_view key, std::string_view what) {
    return as_bandwidth(key, need(key, fmt::format("{}, GB/s", what)));
  }
  sim::Bandwidth as_bandwidth(std::string_view key, const json& v) const {
    const double d = as_number(key, v);
    // Below kMinBandwidthGBps a figure rounds to 0 bytes/s (and fails at the first transfer).
    if (!(d > 0) || d > 1e9) {
      fail(key, fmt::format("{} is not valid; give a bandwidth > 0 in GB/s (1 GB/s = 1e9 bytes/s)", short_dump(v)));
    }
    if (std::llround(d * 1e9) < 1) {
      fail(key, fmt::format("{} is not valid: it rounds to 0 bytes/s; give a bandwidth from {:g} (1 byte/s) to 1e+09 GB/s",
                            short_dump(v), kMinBandwidthGBps));
    }
    return sim::Bandwidth::GBps(d);
  }
  Duration duration_ns(std::string_view key, std::string_view what) {
    return as_duration(key, need(key, fmt::format("{}, ns", what)));
  }
  Duration as_duration(std::string_view key, const json& v) const {
    const double d = as_number(key, v);
    if (!(d >= 0) || d > 1e12) fail(key, fmt::format("{} is not valid; give a time >= 0 in ns", short_dump(v)));
    return sim::from_ns(d);
  }
  std::uint64_t clock_hz(std::string_view key, std::string_view what) {
    const json& v = need(key, fmt::format("{}, GHz", what));
    return as_clock(key, v);
  }
  std::uint64_t as_clock(std::string_view key, const json& v) const {
    const double d = as_number(key, v);
    if (!(d > 0) || d > 1e3 || std::llround(d * 1e9) < 1) {
      fail(key, fmt::format("{} is not valid; give a clock > 0 in GHz, from {:g} (1 Hz) to 1000", short_dump(v), kMinClockGHz));
    }
    return static_cast<std::uint64_t>(std::llround(d * 1e9));
  }
  // Exactly one of capacity_bytes, capacity_KiB, capacity_MiB, capacity_GiB, capacity_TiB, capacity_GB.
  std::uint64_t capacity(std::string_view what) {
    static const std::vector<std::pair<std::string, double>> kUnits = {
        {"capacity_bytes", 1.0},          {"capacity_KiB", 1024.0},
        {"capacity_MiB", 1048576.0},      {"capacity_GiB", 1073741824.0},
        {"capacity_TiB", 1099511627776.0}, {"capacity_GB", 1e9}};
    std::vector<std::string> found, names;
    std::uint64_t bytes = 0;
    for (const auto& [key, unit] : kUnits) {
      names.push_back(key);
      if (const json* v = get(key)) {
        found.push_back(key);
        const double d = as_number(key, *v);
        const double b = std::round(d * unit);
        if (!(d > 0) || b < 1 || b > 9.2e18) {
          fail(key, fmt::format("{} is not valid; give a capacity > 0 ({})", short_dump(*v), what));
        }
        bytes = static_cast<std::uint64_t>(b);
      }
    }
    if (found.empty()) {
      ctx_.fail(path_, fmt::format("missing required field: the {} capacity; give one of {}{}", what, join(names),
                                   typo_of(names)));
    }
    if (found.size() > 1) {
      ctx_.fail(path_, fmt::format("give exactly one capacity field, found {}", join(found)));
    }
    return bytes;
  }
  std::string string(std::string_view key, std::string_view what) {
    const json& v = need(key, what);
    if (!v.is_string()) fail(key, fmt::format("expected a string ({}), got {} ({})", what, type_name(v), short_dump(v)));
    return v.get<std::string>();
  }
  bool opt_bool(std::string_view key, bool dflt) {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(key, fmt::format("expected true or false, got {}", short_dump(*v)));
    return v->get<bool>();
  }
  // Every key present must be in the schema node ("_comment" is always allowed), and the reader must
  // have asked for it.
  void finish() const {
    const std::vector<std::string> valid = node_.keys();
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (it.key() == "_comment" || node_.field(it.key())) continue;
      ctx_.fail(path_, fmt::format("unknown key '{}'{}; valid keys here: {}", clip(it.key()), did_you_mean(it.key(), valid),
                                   join(valid)));
    }
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (it.key() == "_comment" || known_.count(it.key())) continue;
      throw std::logic_error(fmt::format("topology reader: {} has '{}', which the schema allows but the reader never "
                                         "read; read it in topology.cpp or remove it from topology_schema.cpp",
                                         path_.empty() ? "the document" : path_, it.key()));
    }
  }
  // A key that this object may not have in this configuration.
  void forbid(std::string_view key, const std::string& why) {
    schema(key);
    if (j_.contains(key)) fail(key, why);
    known_.emplace(key);
  }

 private:
  const Ctx& ctx_;
  const SchemaNode& node_;
  const json& j_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
};

// ---------------------------------------------------------------- cubes

RateSpec read_rates(Obj o, std::string_view table, std::string_view unit, std::uint64_t default_clock) {
  RateSpec r;
  r.clock_hz = default_clock;
  if (const json* c = o.get("clock_GHz")) r.clock_hz = o.as_clock("clock_GHz", *c);
  Obj t = o.object(table, fmt::format("{} per dtype, e.g. {{\"bf16\": 1024}}", unit));
  bool any = false;
  for (DType d : kAllDTypes) {
    const std::string key(dtype_name(d));
    if (const json* v = t.get(key)) {
      const double x = t.as_number(key, *v);
      // Below kMinPerCycle the cycle count of a large operation passes 2^64.
      if (!(x >= kMinPerCycle) || x > 1e12) {
        t.fail(key, fmt::format("{} is not valid; give {} from {:g} (2^-20) to 1e+12 (leave the dtype out if unsupported)",
                                short_dump(*v), unit, kMinPerCycle));
      }
      r.per_cycle[static_cast<std::size_t>(d)] = x;
      any = true;
    }
  }
  t.finish();
  if (!any) o.fail(table, "needs at least one dtype: f32, bf16 or f16");
  o.finish();
  return r;
}

// "pe.gemm" (kernels/sim_pe_gemm.h). The cluster's fit in the cube's PE count is checked by read_cube.
GemmPipelineSpec read_gemm_pipeline(Obj o, const PeSpec& pe) {
  GemmPipelineSpec g;
  g.present = true;
  auto read_tile = [](Obj t) {
    TileSpec x;
    x.m = static_cast<std::uint32_t>(t.positive_int("m", "tile rows", 1u << 20));
    x.n = static_cast<std::uint32_t>(t.positive_int("n", "tile columns", 1u << 20));
    x.k = static_cast<std::uint32_t>(t.positive_int("k", "k-block depth", 1u << 20));
    t.finish();
    return x;
  };
  g.tile = pe.tile;
  if (const json* t = o.get("tile")) g.tile = read_tile(o.object_at("tile", *t));
  if (const json* ts = o.get("tiles")) {
    Obj t = o.object_at("tiles", *ts);
    for (DType d : kAllDTypes) {
      const std::string key(dtype_name(d));
      if (const json* v = t.get(key)) g.tile_by_dtype[static_cast<std::size_t>(d)] = read_tile(t.object_at(key, *v));
    }
    t.finish();
  }
  if (const json* cs = o.get("choices")) {
    Obj c = o.object_at("choices", *cs);
    for (DType d : kAllDTypes) {
      const std::string key(dtype_name(d));
      const json* v = c.get(key);
      if (!v) continue;
      if (!v->is_array() || v->empty()) {
        c.fail(key, fmt::format("expected a non-empty list of tiles [{{\"m\": .., \"n\": .., \"k\": ..}}, ...], got {}",
                                short_dump(*v)));
      }
      for (std::size_t i = 0; i < v->size(); ++i) {
        g.choices[static_cast<std::size_t>(d)].push_back(read_tile(Obj(o.ctx(), *c.schema(key).item(), (*v)[i],
                                                                       child(c.at(key), std::to_string(i)))));
      }
    }
    c.finish();
  }
  if (const json* v = o.get("stages")) {
    if (v->is_string() && v->get<std::string>() == "auto") {
      g.auto_stages = true;
    } else if (v->is_string()) {
      o.fail("stages", fmt::format("{} is not valid; give a number of k-block buffers (1 to 64) or \"auto\" (as many "
                                   "as the TCM holds besides the C tile)", short_dump(*v)));
    } else {
      g.stages = static_cast<std::uint32_t>(o.as_positive_int("stages", *v, "A/B k-block buffers in the TCM, or \"auto\"", 64));
    }
  }
  if (const json* v = o.get("launch_ns")) g.launch = o.as_duration("launch_ns", *v);
  if (const json* v = o.get("raster")) {
    const std::string r = v->is_string() ? v->get<std::string>() : "";
    if (r == "m") g.raster = GemmRaster::m;
    else if (r == "n") g.raster = GemmRaster::n;
    else o.fail("raster", fmt::format("{} is not valid; give \"m\" (m varies fastest) or \"n\" (n varies fastest)", short_dump(*v)));
  }
  if (const json* v = o.get("swizzle")) {
    g.swizzle = static_cast<std::uint32_t>(o.as_positive_int("swizzle", *v, "tile rows (columns) per band of the walk", 1u << 16));
  }
  if (const json* v = o.get("cluster")) {
    if (!v->is_array() || v->size() != 2) {
      o.fail("cluster", fmt::format("expected [cm, cn] (tiles along m, along n; each >= 1), got {}", short_dump(*v)));
    }
    g.cluster_m = static_cast<std::uint32_t>(o.as_positive_int("cluster.0", (*v)[0], "cluster tiles along m", 1u << 16));
    g.cluster_n = static_cast<std::uint32_t>(o.as_positive_int("cluster.1", (*v)[1], "cluster tiles along n", 1u << 16));
  }
  if (const json* m = o.get("mma")) {
    Obj x = o.object_at("mma", *m);
    auto cycles = [&](std::string_view key, std::uint64_t& out) {
      if (const json* c = x.get(key)) {
        const bool ok = c->is_number_integer() && (c->is_number_unsigned() || c->get<std::int64_t>() >= 0) &&
                        c->get<std::uint64_t>() <= (1ull << 40);
        if (!ok) x.fail(key, fmt::format("{} is not valid; give a whole number of MAC-clock cycles >= 0", short_dump(*c)));
        out = c->get<std::uint64_t>();
      }
    };
    cycles("issue_cycles_per_k_block", g.issue_cycles_per_k_block);
    cycles("prologue_cycles", g.prologue_cycles);
    cycles("epilogue_cycles", g.epilogue_cycles);
    // An optional rate per MAC-clock cycle (> 0); `what` says what it is and what leaving it out means.
    auto per_cycle = [&](std::string_view key, double& out, std::string_view what) {
      if (const json* u = x.get(key)) {
        if (!u->is_number() || !(u->get<double>() >= kMinPerCycle) || !std::isfinite(u->get<double>()) ||
            u->get<double>() > 1e9) {
          x.fail(key, fmt::format("{} is not valid; give {}, from {:g} (2^-20) to 1e+09", short_dump(*u), what, kMinPerCycle));
        }
        out = u->get<double>();
      }
    };
    per_cycle("unaligned_bytes_per_cycle", g.unaligned_bytes_per_cycle,
              "the bytes per MAC-clock cycle a PE loads unaligned operands at (a number > 0), or leave it out for no "
              "such limit");
    per_cycle("unaligned_macs_per_cycle", g.unaligned_macs_per_cycle,
              "the MACs per MAC-clock cycle of the kernel that runs unaligned operands (a number > 0), or leave it out "
              "for the MAC array's own rate");
    x.finish();
  }
  o.finish();
  // Every dtype the MAC array runs must fit (A, B, C and bias in that dtype): `stages` x (A k-block +
  // B k-block + bias slice) and the C tile.
  // With "stages": "auto", at least 2 (double buffering) must fit.
  for (DType d : kAllDTypes) {
    if (!(pe.mac.rate(d) > 0)) continue;
    const auto tiles = g.tiles_for(d);
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      const TileSpec& t = tiles[i];
      const std::uint64_t es = dtype_size(d), m = t.m, n = t.n, k = t.k;
      const std::uint64_t stages = g.auto_stages ? 2 : g.stages;
      const std::uint64_t need = stages * (m * k + k * n + n) * es + m * n * es;
      if (pe.tcm.capacity_bytes < need) {
        const std::string where = !g.choices[static_cast<std::size_t>(d)].empty()
                                      ? fmt::format("choices.{}.{}", dtype_name(d), i)
                                  : g.tile_by_dtype[static_cast<std::size_t>(d)].m ? fmt::format("tiles.{}", dtype_name(d))
                                                                                   : std::string("stages");
        o.fail(where, fmt::format("{} stages{} of {}x{}x{} {} tiles need {} ({} bytes: {} x (A {}x{} + B {}x{} + bias {}) "
                                  "+ C {}x{}) but the TCM holds {}; give fewer stages or a smaller tile (pe.gemm.tile, "
                                  "pe.gemm.tiles.{} or pe.gemm.choices.{})",
                                  stages, g.auto_stages ? " (the least \"auto\" allows)" : "", m, n, k, dtype_name(d),
                                  format_bytes(need), need, stages, m, k, k, n, n, m, n,
                                  format_bytes(pe.tcm.capacity_bytes), dtype_name(d), dtype_name(d)));
      }
    }
  }
  return g;
}

PeSpec read_pe(Obj o) {
  PeSpec pe;
  pe.clock_hz = o.clock_hz("clock_GHz", "PE clock");
  {
    Obj t = o.object("tcm", "the PE's tightly coupled memory");
    pe.tcm.capacity_bytes = t.capacity("TCM");
    pe.tcm.bandwidth = t.bandwidth("bandwidth_GBps", "TCM bandwidth");
    pe.tcm.latency = t.duration_ns("latency_ns", "TCM access latency");
    t.finish();
  }
  {
    Obj d = o.object("dma", "the PE's DMA engine");
    pe.dma.read = d.bandwidth("read_GBps", "DMA read channel (into the TCM)");
    pe.dma.write = d.bandwidth("write_GBps", "DMA write channel (out of the TCM)");
    pe.dma.chunk_bytes = d.positive_int("chunk_bytes", "DMA chunk size in bytes", 1ull << 40);
    pe.dma.overhead = d.duration_ns("overhead_ns", "DMA per-request overhead");
    d.finish();
  }
  pe.mac = read_rates(o.object("mac", "the MAC array"), "macs_per_cycle", "MACs per cycle", pe.clock_hz);
  pe.vector = read_rates(o.object("vector", "the vector unit"), "ops_per_cycle", "ops per cycle", pe.clock_hz);
  {
    Obj t = o.object("tile", "the GEMM tile {m, n, k} the PE runs");
    pe.tile.m = static_cast<std::uint32_t>(t.positive_int("m", "tile rows", 1u << 20));
    pe.tile.n = static_cast<std::uint32_t>(t.positive_int("n", "tile columns", 1u << 20));
    pe.tile.k = static_cast<std::uint32_t>(t.positive_int("k", "tile depth", 1u << 20));
    t.finish();
  }
  if (const json* g = o.get("gemm")) pe.gemm = read_gemm_pipeline(o.object_at("gemm", *g), pe);
  o.finish();
  // The smallest tile the PE can run: A and B double-buffered in its narrowest input dtype, C in f32.
  std::uint32_t in_bytes = 4;
  std::string in_name = "f32";
  for (DType d : kAllDTypes) {
    if (pe.mac.rate(d) > 0 && dtype_size(d) < in_bytes) {
      in_bytes = dtype_size(d);
      in_name = std::string(dtype_name(d));
    }
  }
  const std::uint64_t m = pe.tile.m, n = pe.tile.n, k = pe.tile.k;
  const std::uint64_t need = 2 * (m * k + k * n) * in_bytes + m * n * 4;
  if (pe.tcm.capacity_bytes < need) {
    o.ctx().fail(child(o.path(), "tcm"),
                 fmt::format("TCM of {} is smaller than the smallest tile: double-buffered A ({}x{}) and B ({}x{}) "
                             "tiles in {} plus the f32 C tile ({}x{}) need {} ({} bytes); give a capacity of at least "
                             "that or a smaller {}",
                             format_bytes(pe.tcm.capacity_bytes), m, k, k, n, in_name, m, n, format_bytes(need), need,
                             child(o.path(), "tile")));
  }
  return pe;
}

// The cube's L2 cache: sizes that index (powers of two, whole sets) and fit in front of the HBM.
L2Spec read_l2(Obj o, std::uint64_t hbm_capacity) {
  L2Spec l2;
  l2.present = true;
  l2.capacity_bytes = o.capacity("L2");
  auto power_of_two = [&](std::string_view key, std::string_view what, std::uint64_t max) {
    const std::uint64_t v = o.positive_int(key, what, max);
    if ((v & (v - 1)) != 0) {
      o.fail(key, fmt::format("{} is not a power of two; give a power of two from 1 to {} ({})", v, max, what));
    }
    return static_cast<std::uint32_t>(v);
  };
  l2.line_bytes = power_of_two("line_bytes", "cache line size in bytes", 1u << 16);
  l2.sector_bytes = power_of_two("sector_bytes", "sector size in bytes", 1u << 16);
  l2.ways = static_cast<std::uint32_t>(o.positive_int("ways", "associativity: lines per set", 256));
  l2.bandwidth = o.bandwidth("bandwidth_GBps", "L2 bandwidth for hits and fills");
  l2.latency = o.duration_ns("latency_ns", "L2 hit latency");
  o.finish();
  if (l2.line_bytes % l2.sector_bytes != 0) {
    o.fail("line_bytes", fmt::format("{} is not a multiple of sector_bytes {}; a line holds whole sectors: give "
                                     "line_bytes = sector_bytes x 1, 2, 4 or 8",
                                     l2.line_bytes, l2.sector_bytes));
  }
  if (l2.line_bytes / l2.sector_bytes > 8) {
    o.fail("sector_bytes", fmt::format("{} gives {} sectors per {}-byte line; at most 8 are supported: give "
                                       "sector_bytes of at least {}",
                                       l2.sector_bytes, l2.line_bytes / l2.sector_bytes, l2.line_bytes,
                                       l2.line_bytes / 8));
  }
  if (l2.capacity_bytes > hbm_capacity) {
    o.ctx().fail(o.path(), fmt::format("the L2 capacity {} ({} bytes) is larger than the cube's HBM of {} ({} bytes); "
                                       "give a cache no larger than the memory behind it",
                                       format_bytes(l2.capacity_bytes), l2.capacity_bytes, format_bytes(hbm_capacity),
                                       hbm_capacity));
  }
  const std::uint64_t set_bytes = std::uint64_t{l2.line_bytes} * l2.ways;
  if (l2.capacity_bytes % set_bytes != 0) {
    o.ctx().fail(o.path(), fmt::format("the L2 capacity {} bytes is not divisible into sets of {} ways x {}-byte "
                                       "lines ({} bytes): give a capacity that is a multiple of {} bytes, or other "
                                       "ways or line_bytes",
                                       l2.capacity_bytes, l2.ways, l2.line_bytes, set_bytes, set_bytes));
  }
  constexpr std::uint64_t kMaxLines = 1ull << 24;
  if (l2.capacity_bytes / l2.line_bytes > kMaxLines) {
    o.ctx().fail(o.path(), fmt::format("the L2 has {} lines ({} bytes / {}-byte lines); the simulator keeps a tag per "
                                       "line and allows at most {} lines: give a smaller capacity or longer lines",
                                       l2.capacity_bytes / l2.line_bytes, l2.capacity_bytes, l2.line_bytes,
                                       kMaxLines));
  }
  const std::uint64_t sets = l2.capacity_bytes / set_bytes;
  if ((hbm_capacity / l2.line_bytes) / sets >= 0xffffffffull) {
    o.ctx().fail(o.path(), fmt::format("the cube's HBM of {} holds {} lines of {} bytes for {} L2 sets: the simulator's "
                                       "32-bit tags allow fewer than 2^32 lines per set; give longer lines, more sets "
                                       "or less HBM",
                                       format_bytes(hbm_capacity), hbm_capacity / l2.line_bytes, l2.line_bytes, sets));
  }
  return l2;
}

CubeSpec read_cube(Obj o, bool allow_id) {
  CubeSpec c;
  if (allow_id) o.get("id");
  c.pes = static_cast<int>(o.positive_int("pes", "number of PEs", 1u << 16));
  if (const json* s = o.get("clock_scale")) {
    c.clock_scale = o.as_number("clock_scale", *s);
    if (!(c.clock_scale > 0) || c.clock_scale > 100) {
      o.fail("clock_scale", fmt::format("{} is not valid; give a factor > 0 (0.8 = a cube at 80% clock)", short_dump(*s)));
    }
  }
  {
    Obj h = o.object("hbm", "the cube's HBM");
    c.hbm.capacity_bytes = h.capacity("HBM");
    c.hbm.bandwidth = h.bandwidth("bandwidth_GBps", "HBM bandwidth, all channels together");
    c.hbm.latency = h.duration_ns("latency_ns", "HBM read latency");
    c.hbm.channels = static_cast<std::uint32_t>(h.positive_int("channels", "independent HBM channels", 4096));
    c.hbm.interleave_bytes = h.positive_int("interleave_bytes", "bytes per channel before the next", 1ull << 40);
    if (const json* v = h.get("channel_map")) {
      const std::string m = v->is_string() ? v->get<std::string>() : "";
      if (m == "hash") c.hbm.channel_hash = true;
      else if (m != "interleave") {
        h.fail("channel_map", fmt::format("{} is not valid; give \"interleave\" (block b on channel b mod channels) or "
                                          "\"hash\" (each stripe of blocks rotated by a hash of its address)",
                                          short_dump(*v)));
      }
    }
    if (const json* v = h.get("read_GBps")) c.hbm.read = h.as_bandwidth("read_GBps", *v);
    if (const json* v = h.get("write_GBps")) c.hbm.write = h.as_bandwidth("write_GBps", *v);
    if (const json* v = h.get("copy_GBps")) c.hbm.copy = h.as_bandwidth("copy_GBps", *v);
    h.finish();
  }
  if (const json* k = o.get("kernel")) {
    Obj x = o.object_at("kernel", *k);
    if (const json* v = x.get("launch_gap_ns")) c.kernel.launch_gap = x.as_duration("launch_gap_ns", *v);
    if (const json* v = x.get("reduction_ns")) c.kernel.reduction = x.as_duration("reduction_ns", *v);
    x.finish();
  }
  if (const json* l = o.get("l2")) c.l2 = read_l2(o.object_at("l2", *l), c.hbm.capacity_bytes);
  c.pe = read_pe(o.object("pe", "the description shared by the cube's PEs"));
  o.finish();
  if (c.pe.gemm.present && static_cast<std::uint64_t>(c.pe.gemm.cluster_m) * c.pe.gemm.cluster_n > static_cast<std::uint64_t>(c.pes)) {
    o.ctx().fail(child(o.at("pe"), "gemm.cluster"),
                 fmt::format("a cluster of {} x {} = {} PEs is larger than the cube's {} PEs ({}); give cm x cn <= {}",
                             c.pe.gemm.cluster_m, c.pe.gemm.cluster_n, c.pe.gemm.cluster_m * c.pe.gemm.cluster_n, c.pes,
                             o.at("pes"), c.pes));
  }
  if (c.clock_scale != 1.0) {
    auto scale = [&](std::uint64_t hz) { return static_cast<std::uint64_t>(std::llround(static_cast<double>(hz) * c.clock_scale)); };
    c.pe.clock_hz = scale(c.pe.clock_hz);
    c.pe.mac.clock_hz = scale(c.pe.mac.clock_hz);
    c.pe.vector.clock_hz = scale(c.pe.vector.clock_hz);
    const std::uint64_t slowest = std::min({c.pe.clock_hz, c.pe.mac.clock_hz, c.pe.vector.clock_hz});
    if (slowest < 1) {
      o.fail("clock_scale", fmt::format("{:g} is not valid: it scales a clock of the cube to 0 Hz (below 1 Hz); give a factor that leaves "
                                        "every clock at least {:g} GHz (1 Hz)", c.clock_scale, kMinClockGHz));
    }
  }
  return c;
}

LinkFigures read_link_figures(Obj& o, const LinkFigures* dflt) {
  LinkFigures f;
  auto bw = o.get("bandwidth_GBps");
  auto lat = o.get("latency_ns");
  auto ovh = o.get("overhead_ns");
  if (!dflt) {
    if (!bw) o.missing("bandwidth_GBps", "per direction, GB/s");
    if (!lat) o.missing("latency_ns", "wire latency per hop, ns");
    if (!ovh) o.missing("overhead_ns", "port overhead per hop, ns");
  } else {
    f = *dflt;
  }
  if (bw) f.bandwidth = o.as_bandwidth("bandwidth_GBps", *bw);
  if (lat) f.latency = o.as_duration("latency_ns", *lat);
  if (ovh) f.overhead = o.as_duration("overhead_ns", *ovh);
  return f;
}

// A cube id or "switch"/"host" in link lists.
int read_node(const Obj& o, std::string_view key, const json& v, int cubes, bool allow_special) {
  if (v.is_string() && allow_special) {
    if (v == "switch") return kSwitchNode;
    if (v == "host") return kHostNode;
  }
  if (!v.is_number_integer()) {
    o.fail(key, fmt::format("expected a cube id{}, got {}", allow_special ? " (or \"host\", \"switch\")" : "", short_dump(v)));
  }
  const std::int64_t id = v.get<std::int64_t>();
  if (id < 0 || id >= cubes) {
    o.fail(key, fmt::format("cube {} does not exist; cube ids are 0..{}", id, cubes - 1));
  }
  return static_cast<int>(id);
}

// ---------------------------------------------------------------- network

void add_link(Topology& t, int from, int to, const LinkFigures& f) {
  t.links.push_back(LinkSpec{from, to, f, fmt::format("{}->{}", node_name(from), node_name(to))});
}

void generate_grid(Topology& t, bool wrap) {
  const int n = static_cast<int>(t.cubes.size());
  std::vector<int> stride(t.dims.size(), 1);
  for (std::size_t d = 1; d < t.dims.size(); ++d) stride[d] = stride[d - 1] * t.dims[d - 1];
  std::vector<std::pair<int, int>> pairs;
  for (int c = 0; c < n; ++c) {
    for (std::size_t d = 0; d < t.dims.size(); ++d) {
      const int size = t.dims[d];
      const int x = (c / stride[d]) % size;
      for (int step : {+1, -1}) {
        int y = x + step;
        if (y < 0 || y >= size) {
          if (!wrap || size < 3) continue;  // size 2: the wrap is the direct link again
          y = (y + size) % size;
        }
        pairs.emplace_back(c, c + (y - x) * stride[d]);
      }
    }
  }
  for (auto [a, b] : pairs) t.links.push_back(LinkSpec{a, b, {}, fmt::format("c{}->c{}", a, b)});
}

void read_network(const Ctx& ctx, const json& doc, Topology& t) {
  Obj o(ctx, schema_at("network"), doc.at("network"), "network");
  const std::string kind = o.string("kind", "none, ring, mesh, torus, full, switch or explicit");
  static const std::map<std::string, NetworkKind> kKinds = {
      {"none", NetworkKind::kNone},   {"ring", NetworkKind::kRing},     {"mesh", NetworkKind::kMesh},
      {"torus", NetworkKind::kTorus}, {"full", NetworkKind::kFull},     {"switch", NetworkKind::kSwitch},
      {"explicit", NetworkKind::kExplicit}};
  auto k = kKinds.find(kind);
  if (k == kKinds.end()) {
    std::vector<std::string> names;
    for (const auto& [n, v] : kKinds) names.push_back(n);
    o.fail("kind", fmt::format("'{}' is not a network kind{}; valid kinds: {}", clip(kind), did_you_mean(kind, names), join(names)));
  }
  t.network = k->second;
  t.chunk_bytes = o.positive_int("chunk_bytes", "messages are cut into chunks of this many bytes", 1ull << 40);
  const bool grid = t.network == NetworkKind::kMesh || t.network == NetworkKind::kTorus;
  if (grid) {
    const json& d = o.need("dims", "size of each dimension, e.g. [4, 4]");
    if (!d.is_array() || d.empty() || d.size() > 8) o.fail("dims", fmt::format("expected 1 to 8 dimension sizes, got {}", short_dump(d)));
    std::uint64_t total = 1;
    for (std::size_t i = 0; i < d.size(); ++i) {
      const std::uint64_t s = Obj(ctx, o.schema("dims"), json::object(), o.at("dims")).as_positive_int(std::to_string(i), d[i], "cubes along this dimension", 1u << 16);
      t.dims.push_back(static_cast<int>(s));
      total *= s;
      if (total > kMaxCubes) {
        o.fail("dims", fmt::format("{} gives more than {} cubes; the limit is {} cubes", short_dump(d), kMaxCubes, kMaxCubes));
      }
    }
  } else {
    o.forbid("dims", fmt::format("only mesh and torus networks have dims; this network is '{}'", kind));
  }
  const int n = static_cast<int>(t.cubes.size());
  if (grid) {
    std::uint64_t total = 1;
    for (int s : t.dims) total *= static_cast<std::uint64_t>(s);
    if (total != static_cast<std::uint64_t>(n)) {
      ctx.fail("cubes", fmt::format("{} cubes do not match network.dims {} ({} cubes); leave 'cubes' out of a mesh or "
                                    "torus to take the count from dims",
                                    n, short_dump(doc["network"]["dims"]), total));
    }
  }

  // The links this network and the host will have, bounded before any is made.
  {
    const auto cubes = static_cast<std::uint64_t>(n);
    std::uint64_t count = doc.contains("host") ? 2 * cubes : 0;
    switch (t.network) {
      case NetworkKind::kNone: break;
      case NetworkKind::kRing: count += 2 * cubes; break;
      case NetworkKind::kMesh:
      case NetworkKind::kTorus: count += 2 * t.dims.size() * cubes; break;
      case NetworkKind::kFull: count += cubes * (cubes - 1); break;
      case NetworkKind::kSwitch: count += 2 * cubes; break;
      case NetworkKind::kExplicit: {
        const json* ls = doc["network"].contains("links") ? &doc["network"]["links"] : nullptr;
        if (ls && ls->is_array()) count += 2 * ls->size();
        break;
      }
    }
    if (count > kMaxLinks) {
      ctx.fail("network", fmt::format("a {} network of {} cubes has up to {} link directions (host links included); the "
                                      "limit is {}", kind, n, count, kMaxLinks));
    }
  }

  std::optional<LinkFigures> link;
  const bool needs_link = t.network != NetworkKind::kNone && t.network != NetworkKind::kExplicit;
  if (const json* l = o.get("link")) {
    if (t.network == NetworkKind::kNone) o.fail("link", "a network of kind 'none' has no links; remove it or pick a kind");
    Obj lo = o.object_at("link", *l);
    link = read_link_figures(lo, nullptr);
    lo.finish();
  } else if (needs_link) {
    o.missing("link", fmt::format("bandwidth_GBps, latency_ns, overhead_ns of every link of the {} network", kind));
  }
  if (t.network == NetworkKind::kSwitch) {
    Obj s = o.object("switch", "the switch: {\"latency_ns\": ...}");
    t.switch_latency = s.duration_ns("latency_ns", "latency through the switch");
    // Optional: each cube's parallel links to the switch (striped: their bandwidths add) and the
    // switch's own ports, one per link, as units of their own (topologies/README.md).
    if (const json* v = s.get("links_per_cube")) {
      t.switch_links_per_cube = static_cast<int>(s.as_positive_int("links_per_cube", *v,
                                                                   "parallel links between each cube and the switch", 1024));
    }
    if (const json* p = s.get("port")) {
      Obj po = s.object_at("port", *p);
      t.switch_port = po.bandwidth("bandwidth_GBps", "bandwidth of one switch port per direction");
      po.finish();
    }
    s.finish();
  } else {
    o.forbid("switch", fmt::format("only a network of kind 'switch' has a switch; this one is '{}'", kind));
  }
  if (t.network == NetworkKind::kExplicit) {
    o.get("links");
  } else {
    o.forbid("links", fmt::format("a list of links is for kind 'explicit'; a '{}' network generates its links "
                                  "(change one with link_overrides)", kind));
  }
  o.finish();

  switch (t.network) {
    case NetworkKind::kNone:
      if (n > 1) {
        ctx.fail("network.kind", fmt::format("'none' connects nothing but there are {} cubes: the system is disconnected; "
                                             "use ring, mesh, torus, full, switch or explicit links", n));
      }
      break;
    case NetworkKind::kRing:
      if (n < 2) ctx.fail("cubes", fmt::format("a ring needs at least 2 cubes, got {}", n));
      t.dims = {n};
      generate_grid(t, true);
      break;
    case NetworkKind::kMesh: generate_grid(t, false); break;
    case NetworkKind::kTorus: generate_grid(t, true); break;
    case NetworkKind::kFull:
      if (n < 2) ctx.fail("cubes", fmt::format("a full (all-to-all) network needs at least 2 cubes, got {}", n));
      for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
          if (a != b) add_link(t, a, b, {});
        }
      }
      break;
    case NetworkKind::kSwitch:
      for (int a = 0; a < n; ++a) {
        add_link(t, a, kSwitchNode, {});
        add_link(t, kSwitchNode, a, {});
      }
      break;
    case NetworkKind::kExplicit: {
      const json& ls = doc["network"].contains("links") ? doc["network"]["links"] : json();
      if (!ls.is_array() || ls.empty()) {
        ctx.fail("network.links", fmt::format("an explicit network needs a non-empty list of links "
                                              "[{{\"from\": 0, \"to\": 1}}, ...], got {}", short_dump(ls)));
      }
      std::map<std::pair<int, int>, std::size_t> seen;
      for (std::size_t i = 0; i < ls.size(); ++i) {
        Obj e(ctx, schema_at("network.links.*"), ls[i], child("network.links", i));
        const int from = read_node(e, "from", e.need("from", "cube id"), n, false);
        const int to = read_node(e, "to", e.need("to", "cube id"), n, false);
        if (from == to) ctx.fail(e.path(), fmt::format("a link from cube {} to itself is not valid", from));
        const bool both = e.opt_bool("bidirectional", true);
        const LinkFigures f = read_link_figures(e, link ? &*link : nullptr);
        e.finish();
        for (auto [a, b] : both ? std::vector<std::pair<int, int>>{{from, to}, {to, from}}
                                : std::vector<std::pair<int, int>>{{from, to}}) {
          auto [it, inserted] = seen.emplace(std::make_pair(a, b), i);
          if (!inserted) {
            ctx.fail(e.path(), fmt::format("duplicate link c{}->c{} (network.links.{} already has it); each direction "
                                           "of a pair of cubes may be given once", a, b, it->second));
          }
          add_link(t, a, b, f);
        }
      }
      break;
    }
  }
  if (link && t.network != NetworkKind::kExplicit) {
    for (LinkSpec& l : t.links) l.figures = *link;
  }
  if (t.network == NetworkKind::kSwitch && t.switch_links_per_cube > 1) {
    // The cube's links to the switch carry its traffic together (striped over every link): one
    // link direction of their summed bandwidth.
    const auto lpc = static_cast<std::uint64_t>(t.switch_links_per_cube);
    for (LinkSpec& l : t.links) {
      if (l.figures.bandwidth.bytes_per_s > static_cast<std::uint64_t>(1e18) / lpc) {
        ctx.fail("network.switch.links_per_cube",
                 fmt::format("{} links of {:g} GB/s sum to more than 1e+09 GB/s; give fewer or slower links",
                             lpc, l.figures.bandwidth.gbps()));
      }
      l.figures.bandwidth.bytes_per_s *= lpc;
    }
  }
}

// Every cube must reach every other (through the switch where there is one).
void check_connected(const Ctx& ctx, const Topology& t) {
  const int n = static_cast<int>(t.cubes.size());
  if (n <= 1) return;
  auto index = [&](int node) { return node == kSwitchNode ? n : node; };
  std::vector<std::vector<int>> fwd(n + 1), rev(n + 1);
  for (const LinkSpec& l : t.links) {
    if (l.from == kHostNode || l.to == kHostNode) continue;
    fwd[index(l.from)].push_back(index(l.to));
    rev[index(l.to)].push_back(index(l.from));
  }
  for (int pass = 0; pass < 2; ++pass) {
    const auto& g = pass == 0 ? fwd : rev;
    std::vector<char> seen(n + 1, 0);
    std::vector<int> stack{0};
    seen[0] = 1;
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      for (int w : g[v]) {
        if (!seen[w]) {
          seen[w] = 1;
          stack.push_back(w);
        }
      }
    }
    for (int c = 0; c < n; ++c) {
      if (!seen[c]) {
        ctx.fail("network", fmt::format("the system is disconnected: {} (no path of links); every cube must reach every "
                                        "other: add links",
                                        pass == 0 ? fmt::format("cube 0 cannot reach cube {}", c)
                                                  : fmt::format("cube {} cannot reach cube 0", c)));
      }
    }
  }
}

void read_host(const Ctx& ctx, const json& doc, Topology& t) {
  auto it = doc.find("host");
  if (it == doc.end()) return;
  Obj o(ctx, schema_at("host"), *it, "host");
  t.host.present = true;
  {
    Obj m = o.object("memory", "host memory");
    t.host.capacity_bytes = m.capacity("host memory");
    t.host.bandwidth = m.bandwidth("bandwidth_GBps", "host memory bandwidth");
    t.host.latency = m.duration_ns("latency_ns", "host memory read latency");
    m.finish();
  }
  {
    Obj l = o.object("link", "each cube's host link (PCIe-like)");
    t.host.link = read_link_figures(l, nullptr);
    l.finish();
  }
  o.finish();
  for (int c = 0; c < static_cast<int>(t.cubes.size()); ++c) {
    add_link(t, kHostNode, c, t.host.link);
    add_link(t, c, kHostNode, t.host.link);
  }
}

void read_link_overrides(const Ctx& ctx, const json& doc, Topology& t) {
  auto it = doc.find("link_overrides");
  if (it == doc.end()) return;
  if (!it->is_array()) ctx.fail("link_overrides", fmt::format("expected a list of {{\"from\", \"to\", ...}}, got {}", short_dump(*it)));
  const int n = static_cast<int>(t.cubes.size());
  std::map<std::pair<int, int>, std::size_t> changed;  // link direction -> the entry that changes it
  for (std::size_t i = 0; i < it->size(); ++i) {
    Obj e(ctx, schema_at("link_overrides.*"), (*it)[i], child("link_overrides", i));
    const int from = read_node(e, "from", e.need("from", "cube id, \"host\" or \"switch\""), n, true);
    const int to = read_node(e, "to", e.need("to", "cube id, \"host\" or \"switch\""), n, true);
    const bool both = e.opt_bool("both_directions", false);
    const json* bw = e.get("bandwidth_GBps");
    const json* lat = e.get("latency_ns");
    const json* ovh = e.get("overhead_ns");
    const json* scale = e.get("bandwidth_scale");
    if (!bw && !lat && !ovh && !scale) {
      ctx.fail(e.path(), "changes nothing; give bandwidth_GBps, latency_ns, overhead_ns or bandwidth_scale");
    }
    if (bw && scale) ctx.fail(e.path(), "give bandwidth_GBps or bandwidth_scale, not both");
    double factor = 1.0;
    if (scale) {
      factor = e.as_number("bandwidth_scale", *scale);
      if (!(factor > 0) || factor > 1e3) e.fail("bandwidth_scale", fmt::format("{} is not valid; give a factor > 0 (0.5 = half bandwidth)", short_dump(*scale)));
    }
    for (auto [a, b] : both ? std::vector<std::pair<int, int>>{{from, to}, {to, from}}
                            : std::vector<std::pair<int, int>>{{from, to}}) {
      const int li = t.find_link(a, b);
      if (li < 0) {
        std::vector<std::string> out;
        for (const LinkSpec& l : t.links) {
          if (l.from == a) out.push_back(l.name);
        }
        ctx.fail(e.path(), fmt::format("there is no link {}->{} in this {} network; links from {}: {}", node_name(a),
                                       node_name(b), network_kind_name(t.network), node_name(a),
                                       out.empty() ? "none" : join(out)));
      }
      if (auto [w, fresh] = changed.emplace(std::make_pair(a, b), i); !fresh) {
        ctx.fail(e.path(), fmt::format("link {}->{} is changed by link_overrides.{} too (two entries would compound); "
                                       "give each link direction once: merge the entries", node_name(a), node_name(b),
                                       w->second));
      }
      LinkFigures& f = t.links[static_cast<std::size_t>(li)].figures;
      if (bw) f.bandwidth = e.as_bandwidth("bandwidth_GBps", *bw);
      if (scale) {
        f.bandwidth = f.bandwidth.scaled(factor);
        if (f.bandwidth.bytes_per_s < 1) {
          e.fail("bandwidth_scale", fmt::format("{} scales the link's bandwidth below {:g} GB/s (1 byte/s), to 0; give a "
                                                "larger factor", short_dump(*scale), kMinBandwidthGBps));
        }
      }
      if (lat) f.latency = e.as_duration("latency_ns", *lat);
      if (ovh) f.overhead = e.as_duration("overhead_ns", *ovh);
    }
    e.finish();
  }
}

// ---------------------------------------------------------------- the "nccl" section

}  // namespace

std::string_view nccl_protocol_name(NcclProtocol p) {
  switch (p) {
    case NcclProtocol::ll: return "LL";
    case NcclProtocol::ll128: return "LL128";
    case NcclProtocol::simple: return "Simple";
  }
  return "?";
}

const std::vector<int>* NcclSpec::ring_order(int p, int channel) const {
  int k = 0;
  for (const auto& r : rings) k += static_cast<int>(r.size()) == p;
  if (k == 0) return nullptr;
  int want = channel % k;
  for (const auto& r : rings) {
    if (static_cast<int>(r.size()) == p && want-- == 0) return &r;
  }
  return nullptr;
}

const NcclSpec& NcclSpec::defaults() {
  // NCCL's tuning constants for Hopper over NVLink (topologies/README.md lists the sources).
  static const NcclSpec d = [] {
    NcclSpec s;
    auto us = [](double v) { return sim::from_ns(v * 1000.0); };
    NcclProtocolSpec& ll = s.protocols[static_cast<int>(NcclProtocol::ll)];
    ll.data_bytes = 8, ll.wire_bytes = 16;
    ll.base_latency[0] = us(6.6), ll.base_latency[1] = us(6.8);
    ll.hop_latency[0] = us(0.6), ll.hop_latency[1] = us(0.6);
    ll.slice_bytes = 32768;  // one step of the 512 KiB LL buffer (8 steps), half of it flags
    ll.max_bus_GBps = 141.0;
    ll.tree_bandwidth_factor = 0.92 / 3.8;
    ll.max_threads = 512, ll.thread_threshold = 8;  // NCCL_LL_MAX_NTHREADS, NCCL_LL_THREAD_THRESHOLD
    NcclProtocolSpec& l128 = s.protocols[static_cast<int>(NcclProtocol::ll128)];
    l128.data_bytes = 120, l128.wire_bytes = 128;
    l128.base_latency[0] = us(14.0), l128.base_latency[1] = us(14.0);
    l128.hop_latency[0] = us(1.9), l128.hop_latency[1] = us(1.25);
    l128.slice_bytes = 576000;
    l128.tree_bandwidth_factor = 0.92 * 7.0 / 9.0;  // one step of the LL128 buffer (120 x 640 x 8 steps x 8 B), 120/128 of it data
    l128.max_threads = 640, l128.thread_threshold = 8;  // NCCL_LL128_MAX_NTHREADS, NCCL_LL128_THREAD_THRESHOLD
    NcclProtocolSpec& sp = s.protocols[static_cast<int>(NcclProtocol::simple)];
    sp.base_latency[0] = us(8.4), sp.base_latency[1] = us(8.4);
    sp.hop_latency[0] = us(3.4), sp.hop_latency[1] = us(4.0);
    sp.slice_bytes = 1 << 20;
    sp.tree_bandwidth_factor = 0.92;  // 2 steps (ALLREDUCE_SLICESTEPS) of the 4 MiB Simple buffer's 8
    sp.max_threads = 512, sp.thread_threshold = 64;  // NCCL_SIMPLE_MAX_NTHREADS, NCCL_SIMPLE_THREAD_THRESHOLD
    return s;
  }();
  return d;
}

namespace {

void read_nccl(const Ctx& ctx, const json& doc, Topology& t) {
  t.nccl = NcclSpec::defaults();
  auto it = doc.find("nccl");
  if (it == doc.end()) return;
  NcclSpec& s = t.nccl;
  s.present = true;
  Obj o(ctx, schema_at("nccl"), *it, "nccl");
  if (const json* v = o.get("launch_latency_ns")) s.launch_latency = o.as_duration("launch_latency_ns", *v);
  if (const json* v = o.get("channels")) {
    s.channels = static_cast<int>(o.as_positive_int("channels", *v, "parallel rings", 64));
  }
  if (const json* v = o.get("channel_bandwidth_GBps")) {
    s.channel_bandwidth_GBps = o.as_bandwidth("channel_bandwidth_GBps", *v).gbps();
  }
  if (const json* v = o.get("algorithms")) {
    if (!v->is_array() || v->empty()) {
      o.fail("algorithms", fmt::format("{} is not valid; give a non-empty list of ring, tree", short_dump(*v)));
    }
    s.ring = s.tree = false;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& a = (*v)[i];
      if (a == "ring") {
        s.ring = true;
      } else if (a == "tree") {
        s.tree = true;
      } else {
        ctx.fail(child(o.at("algorithms"), i), fmt::format("unknown algorithm {}; valid: ring, tree", short_dump(a)));
      }
    }
  }
  if (const json* v = o.get("rings")) {
    if (!v->is_array()) o.fail("rings", fmt::format("{} is not valid; give a list of ring orders like \"0 2 1 3\"", short_dump(*v)));
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      std::vector<int> order;
      bool ok = e.is_string();
      if (ok) {
        std::istringstream in(e.get<std::string>());
        std::string tok;
        while (ok && in >> tok) {
          char* end = nullptr;
          const long x = std::strtol(tok.c_str(), &end, 10);
          ok = *end == '\0' && x >= 0 && x < 4096;
          order.push_back(static_cast<int>(x));
        }
        std::vector<int> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        for (std::size_t k = 0; ok && k < sorted.size(); ++k) ok = sorted[k] == static_cast<int>(k);
        ok = ok && order.size() >= 2;
      }
      if (!ok) {
        ctx.fail(child(o.at("rings"), i), fmt::format("{} is not valid; give a permutation of 0..p-1 (p >= 2) as "
                                                      "space-separated member indices, e.g. \"0 2 1 3\"",
                                                      short_dump(e)));
      }
      s.rings.push_back(std::move(order));
    }
  }
  if (o.has("protocols")) {
    Obj ps = o.object("protocols", "per protocol");
    for (NcclProtocol p : kNcclProtocols) {
      const std::string name(nccl_protocol_name(p));
      if (!ps.has(name)) continue;
      Obj po = ps.object(name, "the protocol's figures");
      NcclProtocolSpec& f = s.protocols[static_cast<int>(p)];
      f.enabled = po.opt_bool("enabled", f.enabled);
      if (const json* v = po.get("data_bytes")) f.data_bytes = static_cast<std::uint32_t>(po.as_positive_int("data_bytes", *v, "payload bytes", 1u << 20));
      if (const json* v = po.get("wire_bytes")) f.wire_bytes = static_cast<std::uint32_t>(po.as_positive_int("wire_bytes", *v, "wire bytes", 1u << 20));
      if (f.wire_bytes < f.data_bytes) {
        po.fail("wire_bytes", fmt::format("{} is less than data_bytes {}: a protocol cannot carry more payload than "
                                          "it puts on the wire; give wire_bytes >= data_bytes",
                                          f.wire_bytes, f.data_bytes));
      }
      for (const char* key : {"base_latency_ns", "hop_latency_ns"}) {
        if (!po.has(key)) continue;
        Obj l = po.object(key, "per algorithm: ring, tree");
        Duration* d = std::string_view(key) == "base_latency_ns" ? f.base_latency : f.hop_latency;
        if (const json* v = l.get("ring")) d[0] = l.as_duration("ring", *v);
        if (const json* v = l.get("tree")) d[1] = l.as_duration("tree", *v);
        l.finish();
      }
      if (const json* v = po.get("slice_bytes")) f.slice_bytes = po.as_positive_int("slice_bytes", *v, "slice bytes", 1ull << 40);
      if (const json* v = po.get("max_bus_bandwidth_GBps")) f.max_bus_GBps = po.as_bandwidth("max_bus_bandwidth_GBps", *v).gbps();
      if (const json* v = po.get("tree_bandwidth_factor")) {
        f.tree_bandwidth_factor = po.as_number("tree_bandwidth_factor", *v);
        if (!(f.tree_bandwidth_factor > 0) || f.tree_bandwidth_factor > 1) {
          po.fail("tree_bandwidth_factor", fmt::format("{} is not valid; give a factor in (0, 1]", short_dump(*v)));
        }
      }
      // The physical figures (simulated time only; topologies/README.md).
      if (const json* v = po.get("fixed_latency_ns")) f.fixed_latency = po.as_duration("fixed_latency_ns", *v), f.has_fixed_latency = true;
      if (const json* v = po.get("send_latency_ns")) f.send_latency = po.as_duration("send_latency_ns", *v), f.has_send_latency = true;
      if (const json* v = po.get("send_bandwidth_GBps")) f.send_GBps = po.as_bandwidth("send_bandwidth_GBps", *v).gbps();
      if (const json* v = po.get("copy_bandwidth_GBps")) f.copy_GBps = po.as_bandwidth("copy_bandwidth_GBps", *v).gbps();
      if (const json* v = po.get("chunk_slices")) {
        f.chunk_slices = static_cast<int>(po.as_positive_int("chunk_slices", *v, "slices per chunk", 64));
      }
      if (const json* v = po.get("max_threads")) {
        f.max_threads = static_cast<int>(po.as_positive_int("max_threads", *v, "threads per channel", 1024));
      }
      if (const json* v = po.get("thread_threshold_bytes")) {
        f.thread_threshold = po.as_positive_int("thread_threshold_bytes", *v, "bytes per thread", 1u << 20);
      }
      po.finish();
    }
    ps.finish();
  }
  o.finish();
  bool any = false;
  for (const NcclProtocolSpec& f : s.protocols) any = any || f.enabled;
  if (!any) ctx.fail("nccl.protocols", "every protocol is disabled; enable at least one of LL, LL128, Simple");
}

// ---------------------------------------------------------------- files

std::string env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(dflt);
}

// Reads a topology file: a regular file of at most kMaxTopologyFileBytes (a device such as /dev/zero,
// a FIFO or a directory is refused before anything is read).
std::string read_file(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec || !fs::exists(st)) throw TopologyError(fmt::format("cannot open topology file '{}'", p.string()));
  if (!fs::is_regular_file(st)) {
    throw TopologyError(fmt::format("topology file '{}' is not a regular file (a device, pipe or directory); give a "
                                    ".json file of at most {} bytes", p.string(), kMaxTopologyFileBytes));
  }
  const std::uintmax_t size = fs::file_size(p, ec);
  if (ec || size > kMaxTopologyFileBytes) {
    throw TopologyError(fmt::format("topology file '{}' has {} bytes; the limit is {} bytes (16 MiB)", p.string(),
                                    ec ? std::string("an unknown number of") : std::to_string(size), kMaxTopologyFileBytes));
  }
  std::ifstream f(p, std::ios::binary);
  if (!f) throw TopologyError(fmt::format("cannot open topology file '{}'", p.string()));
  std::string text;
  text.reserve(static_cast<std::size_t>(size));
  char buf[65536];
  while (text.size() <= kMaxTopologyFileBytes && f.read(buf, sizeof buf).gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(f.gcount()));
  }
  if (text.size() > kMaxTopologyFileBytes) {  // it grew since file_size
    throw TopologyError(fmt::format("topology file '{}' has more than {} bytes; the limit is {} bytes (16 MiB)", p.string(),
                                    kMaxTopologyFileBytes, kMaxTopologyFileBytes));
  }
  return text;
}

// "line L, column C (byte B)" of a byte offset in text.
std::string text_position(const std::string& text, std::size_t offset) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return fmt::format("line {}, column {} (byte offset {})", line, col, offset);
}

// Before parsing: every byte is UTF-8 and arrays/objects nest at most kMaxJsonDepth deep (the
// parser and every later walk of the document stay within that depth).
void scan_text(const std::string& text, const std::string& origin) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  bool in_string = false;
  int depth = 0;
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    std::size_t len = 1;
    if (c >= 0x80) {
      unsigned char lo = 0x80, hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) len = 2;
      else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      } else {
        len = 0;
      }
      bool ok = len != 0 && i + len <= n;
      for (std::size_t k = 1; ok && k < len; ++k) {
        const unsigned char x = b[i + k];
        ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
      }
      if (!ok) {
        throw TopologyError(fmt::format("topology file '{}': byte 0x{:02X} at {} is not valid UTF-8; save the file as "
                                        "UTF-8", origin, c, text_position(text, i)));
      }
    } else if (in_string) {
      if (c == '\\' && i + 1 < n && b[i + 1] < 0x80) len = 2;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw TopologyError(fmt::format("topology file '{}': arrays and objects nest deeper than {} levels at {}; the "
                                        "limit is {} levels", origin, kMaxJsonDepth, text_position(text, i), kMaxJsonDepth));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
    i += len;
  }
}

// Parses strict JSON, rejecting duplicate keys (with nlohmann the later one would silently win).
json parse_json(const std::string& text, const std::string& origin) {
  struct Frame {
    bool array;
    std::set<std::string> keys;
    std::string key;
    std::size_t index = 0;
  };
  std::vector<Frame> stack;
  std::string dup;
  auto path = [&] {
    std::string p;
    for (const Frame& f : stack) {
      const std::string part = f.array ? std::to_string(f.index) : f.key;
      if (!part.empty()) p = child(p, part);
    }
    return p;
  };
  auto element_done = [&] {
    if (!stack.empty() && stack.back().array) ++stack.back().index;
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: stack.push_back({false, {}, {}, 0}); break;
      case json::parse_event_t::array_start: stack.push_back({true, {}, {}, 0}); break;
      case json::parse_event_t::key: {
        Frame& f = stack.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second && dup.empty()) dup = path();
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        element_done();
        break;
      case json::parse_event_t::value: element_done(); break;
    }
    return true;
  };
  scan_text(text, origin);
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::out_of_range& e) {  // 406: a number beyond a double (1e999)
    const std::string at = path();
    throw TopologyError(fmt::format("topology file '{}': {}{}a number is out of range ({}); give a finite number, at most "
                                    "{:g} in magnitude", origin, at, at.empty() ? "" : ": ", e.what(),
                                    std::numeric_limits<double>::max()));
  } catch (const json::parse_error& e) {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw TopologyError(fmt::format("topology file '{}': invalid JSON at line {}, column {}: {} (JSON has no comments: "
                                    "put notes in \"_comment\", \"description\" or \"sources\")",
                                    origin, line, col, e.what()));
  } catch (const json::exception& e) {
    throw TopologyError(fmt::format("topology file '{}': {}{}invalid JSON: {}", origin, path(), path().empty() ? "" : ": ",
                                    e.what()));
  }
  if (!dup.empty()) {
    throw TopologyError(fmt::format("topology file '{}': {}: duplicate key (the later value would silently win); give "
                                    "each key once", origin, dup));
  }
  if (!j.is_object()) {
    throw TopologyError(fmt::format("topology file '{}': expected a JSON object at the top, got {}", origin, type_name(j)));
  }
  return j;
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec) && !ec;
}

// A shipped name, or a path. A relative path that `extends` gives is looked up in the extending
// file's directory (`relative_to`; for a document without a file, the topology directory) first,
// then in the current directory.
fs::path resolve_name(const std::string& name_or_path, const fs::path& relative_to) {
  bool bad = name_or_path.empty() || name_or_path.size() > kMaxTopologyPathBytes;
  std::size_t component = 0;
  for (char ch : name_or_path) {
    if (static_cast<unsigned char>(ch) < 0x20) bad = true;
    component = ch == '/' ? 0 : component + 1;
    if (component > 255) bad = true;
  }
  if (bad) {
    std::string shown = name_or_path.substr(0, 40);
    for (char& ch : shown) {
      if (static_cast<unsigned char>(ch) < 0x20) ch = '?';
    }
    throw TopologyError(fmt::format("'{}{}' ({} bytes) is not a topology name or path; give a name of the topology "
                                    "directory or a path of at most {} bytes, each part at most 255 bytes, without "
                                    "control characters",
                                    shown, name_or_path.size() > 40 ? "..." : "", name_or_path.size(), kMaxTopologyPathBytes));
  }
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  if (looks_like_path) {
    fs::path p(name_or_path);
    if (p.is_relative() && !relative_to.empty() && path_exists(relative_to / p)) p = relative_to / p;
    if (!path_exists(p)) throw TopologyError(fmt::format("topology file '{}' does not exist", p.string()));
    return p;
  }
  const fs::path p = fs::path(topology_dir()) / (name_or_path + ".json");
  if (!path_exists(p)) {
    const std::vector<std::string> names = list_topologies();
    throw TopologyError(fmt::format("unknown topology '{}'{}: there is no {} (set CUBESIM_TOPOLOGY_DIR to use another "
                                    "directory, or give a path to a .json file); shipped topologies: {}",
                                    name_or_path, did_you_mean(name_or_path, names), p.string(),
                                    names.empty() ? "none" : join(names)));
  }
  return p;
}

void resolve_into(json& doc, const fs::path& dir, std::vector<std::string>& chain, const std::string& origin);

// Loads a file with its "extends" merged in and its "set" applied.
json load_resolved(const fs::path& p, std::vector<std::string>& chain) {
  const std::string key = fs::weakly_canonical(p).string();
  if (std::find(chain.begin(), chain.end(), key) != chain.end()) {
    chain.push_back(key);
    throw TopologyError(fmt::format("topology file '{}': 'extends' forms a cycle: {}", p.string(), join(chain, " -> ")));
  }
  if (chain.size() >= kMaxExtendsChain) {
    throw TopologyError(fmt::format("topology file '{}': 'extends' chains more than {} files (the limit): {}", p.string(),
                                    kMaxExtendsChain, join(chain, " -> ")));
  }
  chain.push_back(key);
  json doc = parse_json(read_file(p), p.string());
  if (!doc.contains("name")) doc["name"] = p.stem().string();
  resolve_into(doc, p.parent_path(), chain, p.string());
  chain.pop_back();
  return doc;
}

void resolve_into(json& doc, const fs::path& dir, std::vector<std::string>& chain, const std::string& origin) {
  if (auto e = doc.find("extends"); e != doc.end()) {
    if (!e->is_string()) {
      throw TopologyError(fmt::format("topology '{}': extends: expected a topology name or path, got {}", origin, short_dump(*e)));
    }
    const std::string base_name = e->get<std::string>();
    fs::path base_path;
    try {
      base_path = resolve_name(base_name, dir);
    } catch (const TopologyError& err) {
      throw TopologyError(fmt::format("topology '{}': extends: {}", origin, err.what()));
    }
    json base = load_resolved(base_path, chain);
    json mine = doc;
    mine.erase("extends");
    mine.erase("set");
    base.merge_patch(mine);  // RFC 7396: objects merge, null deletes, anything else replaces
    json set = doc.contains("set") ? doc["set"] : json();
    doc = std::move(base);
    if (!set.is_null()) doc["set"] = set;
  }
  if (auto s = doc.find("set"); s != doc.end()) {
    const json set = *s;
    doc.erase("set");
    if (!set.is_object()) {
      throw TopologyError(fmt::format("topology '{}': set: expected an object {{\"dotted.path\": value}}, got {}", origin,
                                      short_dump(set)));
    }
    for (auto it = set.begin(); it != set.end(); ++it) {
      try {
        apply_override(doc, it.key(), it.value());
      } catch (const TopologyError& err) {
        throw TopologyError(fmt::format("topology '{}': set: {}", origin, err.what()));
      }
    }
  }
}

// ---------------------------------------------------------------- override paths

bool is_index(std::string_view s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

// ---------------------------------------------------------------- public API

void check_json_depth(const json& doc, const std::string& origin) {
  std::vector<std::pair<const json*, int>> todo{{&doc, 1}};
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (depth > kMaxJsonDepth) {
      throw TopologyError(fmt::format("{}: arrays and objects nest deeper than {} levels; the limit is {} levels", origin,
                                      kMaxJsonDepth, kMaxJsonDepth));
    }
    for (const json& c : *v) {
      if (c.is_structured()) todo.emplace_back(&c, depth + 1);
    }
  }
}

std::string topology_dir() { return env_or("CUBESIM_TOPOLOGY_DIR", CUBESIM_TOPOLOGY_DIR); }

std::vector<std::string> list_topologies() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(topology_dir(), ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

json load_topology_json(const std::string& name_or_path) {
  std::vector<std::string> chain;
  return load_resolved(resolve_name(name_or_path, {}), chain);
}

Topology load_topology(const std::string& name_or_path) {
  const fs::path p = resolve_name(name_or_path, {});
  std::vector<std::string> chain;
  return topology_from_json(load_resolved(p, chain), p.string());
}

Topology load_topology(const std::string& name_or_path, const std::vector<std::pair<std::string, json>>& overrides) {
  if (overrides.empty()) return load_topology(name_or_path);
  json doc = load_topology_json(name_or_path);
  for (const auto& [path, value] : overrides) apply_override(doc, path, value);
  return topology_from_json(doc, name_or_path);
}

void apply_override(json& doc, std::string_view dotted_path, const json& value) {
  check_json_depth(value, fmt::format("override path '{}'", std::string(dotted_path.substr(0, 200))));
  std::vector<std::string> seg;
  for (std::size_t start = 0;;) {
    const std::size_t dot = dotted_path.find('.', start);
    seg.emplace_back(dotted_path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  const std::string full = clip(dotted_path);
  for (const std::string& s : seg) {
    if (s.empty()) throw TopologyError(fmt::format("override path '{}': empty component; write fields as a.b.c", full));
  }
  if (!doc.is_object()) throw TopologyError(fmt::format("override path '{}': the document is not an object", full));
  // The schema node of the prefix walked so far; null once the path follows a key the document has
  // but the schema does not (such a key is the reader's to reject, and nothing below it is known).
  const SchemaNode* const root = &topology_schema();
  const SchemaNode* const cubes_node = root->field("cubes");
  const SchemaNode* schema = root;
  json* cur = &doc;
  std::string walked;
  for (std::size_t i = 0; i < seg.size(); ++i) {
    const std::string& s = seg[i];
    const bool last = i + 1 == seg.size();
    // A per-cube path on a document whose cube count is implicit (mesh/torus dims) or a number:
    // make the count explicit, then turn it into per-cube override objects.
    if (schema == root && s == "cubes" && !cur->contains("cubes") && i + 1 < seg.size() && is_index(seg[i + 1])) {
      std::int64_t n = 1;
      if (cur->contains("network") && (*cur)["network"].is_object() && (*cur)["network"].contains("dims") &&
          (*cur)["network"]["dims"].is_array()) {
        for (const json& d : (*cur)["network"]["dims"]) {
          const std::int64_t x = d.is_number_integer() ? d.get<std::int64_t>() : 1;
          n = x < 1 ? n : x > static_cast<std::int64_t>(kMaxCubes) ? static_cast<std::int64_t>(kMaxCubes) + 1 : n * x;
          n = std::min<std::int64_t>(n, static_cast<std::int64_t>(kMaxCubes) + 1);
        }
      }
      (*cur)["cubes"] = n;
    }
    if (schema == cubes_node && cur->is_number_integer() && is_index(s)) {
      const std::int64_t n = cur->get<std::int64_t>();
      if (n < 1 || n > static_cast<std::int64_t>(kMaxCubes)) {
        throw TopologyError(fmt::format("override path '{}': cubes is {}; give a count from 1 to {} (the limit) before "
                                        "overriding one cube", full, n, kMaxCubes));
      }
      json arr = json::array();
      for (std::int64_t c = 0; c < n; ++c) arr.push_back(json{{"id", c}});
      *cur = std::move(arr);
    }
    const bool entry = cur->is_array() && is_index(s);
    const SchemaNode* next_schema = !schema ? nullptr : entry ? schema->item() : schema->field(s);
    if (cur->is_array()) {
      if (!is_index(s)) {
        throw TopologyError(fmt::format("override path '{}': {} is a list; '{}' is not an index (0..{})", full, clip(walked), clip(s),
                                        cur->size() == 0 ? 0 : cur->size() - 1));
      }
      const std::size_t idx = std::stoul(s);
      if (idx >= cur->size()) {
        throw TopologyError(fmt::format("override path '{}': index {} is out of range: {} has {} entries", full, idx,
                                        walked, cur->size()));
      }
      cur = &(*cur)[idx];
    } else if (cur->is_object()) {
      if (!cur->contains(s)) {
        if (!next_schema) {
          std::vector<std::string> keys;
          for (auto it = cur->begin(); it != cur->end(); ++it) keys.push_back(it.key());
          for (const std::string& k : schema ? schema->keys() : std::vector<std::string>{}) {
            if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
          }
          std::sort(keys.begin(), keys.end());
          throw TopologyError(fmt::format("override path '{}': {} has no field '{}'{}; fields there: {}", full,
                                          walked.empty() ? "the document" : clip(walked), clip(s), did_you_mean(s, keys),
                                          keys.empty() ? "none" : join(keys)));
        }
        (*cur)[s] = last ? json() : json::object();
      }
      cur = &(*cur)[s];
    } else {
      throw TopologyError(fmt::format("override path '{}': {} is {} ({}), it has no field '{}'", full, clip(walked),
                                      type_name(*cur), short_dump(*cur), clip(s)));
    }
    schema = next_schema;
    walked = child(walked, s);
  }
  *cur = value;
}

Topology topology_from_json(const json& input, const std::string& origin) {
  check_json_depth(input, fmt::format("topology '{}'", origin));
  json doc = input;
  if (doc.is_object() && (doc.contains("extends") || doc.contains("set"))) {
    std::vector<std::string> chain;
    resolve_into(doc, fs::path(topology_dir()), chain, origin);
  }
  Ctx ctx{"?", origin};
  if (!doc.is_object()) ctx.fail("", fmt::format("expected a JSON object, got {}", type_name(doc)));
  Topology t;
  t.origin = origin;
  Obj top(ctx, topology_schema(), doc, "");
  t.name = top.has("name") ? top.string("name", "the topology's name") : std::string("unnamed");
  ctx.name = t.name;
  if (top.has("description")) t.description = top.string("description", "what this system is");
  if (const json* s = top.get("sources")) {
    if (!s->is_array()) top.fail("sources", fmt::format("expected a list of strings (where each figure comes from), got {}", short_dump(*s)));
    for (std::size_t i = 0; i < s->size(); ++i) {
      if (!(*s)[i].is_string()) ctx.fail(child("sources", i), fmt::format("expected a string, got {}", short_dump((*s)[i])));
      t.sources.push_back((*s)[i].get<std::string>());
    }
  }
  if (const json* c = top.get("calibration")) {
    Obj cal = top.object_at("calibration", *c);
    auto text = [&](std::string_view key, std::string& out) {
      if (cal.has(key)) out = cal.string(key, "text");
    };
    text("gpu", t.calibration.gpu);
    text("driver", t.calibration.driver);
    text("cuda", t.calibration.cuda);
    text("nccl", t.calibration.nccl);
    text("date", t.calibration.date);
    text("measurements", t.calibration.measurements);
    if (const json* g = cal.get("gpus")) {
      t.calibration.gpus = static_cast<int>(cal.as_positive_int("gpus", *g, "GPUs measured", 1 << 20));
    }
    cal.finish();
  }

  // Cubes: a template ("cube") and a count, or a list of cubes (each merged over the template).
  const json* tmpl = top.get("cube");
  const json* cubes = top.get("cubes");
  const json* net = top.get("network");
  if (!net) top.missing("network", "{\"kind\": \"none\", \"chunk_bytes\": ...} for one cube");
  const bool grid = net->is_object() && net->contains("kind") &&
                    ((*net)["kind"] == "mesh" || (*net)["kind"] == "torus");
  if (cubes && cubes->is_array()) {
    if (cubes->empty()) ctx.fail("cubes", "an empty list; give at least one cube");
    if (cubes->size() > kMaxCubes) {
      ctx.fail("cubes", fmt::format("a list of {} cubes; the limit is {} cubes", cubes->size(), kMaxCubes));
    }
    if (tmpl && !tmpl->is_object()) ctx.fail("cube", fmt::format("expected an object, got {}", short_dump(*tmpl)));
    std::vector<std::string> where(cubes->size());
    t.cubes.resize(cubes->size());
    for (std::size_t i = 0; i < cubes->size(); ++i) {
      const std::string path = child("cubes", i);
      const json& e = (*cubes)[i];
      if (!e.is_object()) ctx.fail(path, fmt::format("expected an object (a cube, or the fields where it differs from 'cube'), got {}", short_dump(e)));
      std::size_t id = i;
      if (auto it = e.find("id"); it != e.end()) {
        if (!it->is_number_integer() || it->get<std::int64_t>() < 0 ||
            it->get<std::int64_t>() >= static_cast<std::int64_t>(cubes->size())) {
          ctx.fail(child(path, "id"), fmt::format("{} is not valid; ids are 0..{} (one per cube)", short_dump(*it), cubes->size() - 1));
        }
        id = it->get<std::size_t>();
      }
      if (!where[id].empty()) {
        ctx.fail(child(path, "id"), fmt::format("duplicate id {} ({} has it too); each cube needs its own id 0..{}", id,
                                                where[id], cubes->size() - 1));
      }
      where[id] = path;
      json merged = tmpl ? *tmpl : json::object();
      merged.merge_patch(e);
      CubeSpec c = read_cube(Obj(ctx, schema_at("cubes.*"), merged, path), true);
      c.id = static_cast<int>(id);
      t.cubes[id] = c;
    }
  } else {
    if (!tmpl) top.missing("cube", "the description every cube shares");
    std::uint64_t n = 1;
    if (cubes) {
      n = top.as_positive_int("cubes", *cubes, "number of cubes, or a list of cubes; the limit is 65536", kMaxCubes);
    } else if (grid) {
      n = 0;  // from dims, below
    } else if (!(net->is_object() && net->contains("kind") && (*net)["kind"] == "none")) {
      top.missing("cubes", "how many cubes share the 'cube' template");
    }
    const CubeSpec c = read_cube(top.object_at("cube", *tmpl), false);
    if (n == 0) {
      std::uint64_t prod = 1;
      if (net->contains("dims") && (*net)["dims"].is_array()) {
        for (const json& d : (*net)["dims"]) {
          if (d.is_number_integer() && d.get<std::int64_t>() > 0) {
            prod = d.get<std::uint64_t>() > kMaxCubes ? kMaxCubes + 1 : prod * d.get<std::uint64_t>();
          }
          prod = std::min<std::uint64_t>(prod, kMaxCubes + 1);
        }
      }
      if (prod > kMaxCubes) {
        ctx.fail("network.dims", fmt::format("{} gives more than {} cubes; the limit is {} cubes",
                                             short_dump((*net)["dims"]), kMaxCubes, kMaxCubes));
      }
      n = prod;
    }
    t.cubes.assign(n, c);
    for (std::size_t i = 0; i < t.cubes.size(); ++i) t.cubes[i].id = static_cast<int>(i);
  }
  top.get("link_overrides");
  top.get("host");
  top.get("nccl");
  top.finish();

  read_network(ctx, doc, t);
  read_host(ctx, doc, t);
  read_link_overrides(ctx, doc, t);
  read_nccl(ctx, doc, t);
  check_connected(ctx, t);
  t.doc = std::move(doc);
  return t;
}

}  // namespace cubesim::hw
