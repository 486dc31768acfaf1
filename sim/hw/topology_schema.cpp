// The topology schema tree. The loader (topology.cpp) checks on every read that it asks only for keys
// written here and that it read every key a document has, so an entry added here without a reader
// (or the reverse) fails on the first document that uses it.
#include "sim/hw/topology_schema.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/dtype.h"

namespace cubesim::hw {

const SchemaNode* SchemaNode::field(std::string_view name) const {
  for (const SchemaNode& f : fields) {
    if (f.key == name) return &f;
  }
  return nullptr;
}

const SchemaNode* SchemaNode::item() const { return items.empty() ? nullptr : &items.front(); }

std::vector<std::string> SchemaNode::keys() const {
  std::vector<std::string> k;
  for (const SchemaNode& f : fields) k.push_back(f.key);
  std::sort(k.begin(), k.end());
  return k;
}

namespace {

using Fields = std::vector<SchemaNode>;

SchemaNode leaf(std::string key, std::string description) {
  return SchemaNode{.key = std::move(key), .description = std::move(description), .fields = {}, .items = {}};
}
SchemaNode object(std::string key, std::string description, Fields fields) {
  return SchemaNode{.key = std::move(key), .description = std::move(description), .fields = std::move(fields), .items = {}};
}
// `item` is keyed "*", as list entries are written in paths.
SchemaNode list(std::string key, std::string description, SchemaNode item) {
  return SchemaNode{.key = std::move(key), .description = std::move(description), .fields = {}, .items = {std::move(item)}};
}
Fields concat(Fields a, const Fields& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A memory's size: exactly one of these.
Fields capacity(std::string_view what) {
  Fields f;
  for (const char* unit : {"bytes", "KiB", "MiB", "GiB", "TiB", "GB"}) {
    f.push_back(leaf(fmt::format("capacity_{}", unit), fmt::format("{} capacity in {} (give one capacity field)", what, unit)));
  }
  return f;
}

Fields link_figures(std::string_view which) {
  return {leaf("bandwidth_GBps", fmt::format("{}: bandwidth per direction, GB/s", which)),
          leaf("latency_ns", fmt::format("{}: wire latency per hop, ns", which)),
          leaf("overhead_ns", fmt::format("{}: port overhead per hop, ns", which))};
}

SchemaNode rates(std::string key, std::string description, std::string table, std::string_view unit) {
  Fields per_dtype;
  for (DType d : kAllDTypes) {
    per_dtype.push_back(leaf(std::string(dtype_name(d)), fmt::format("{} in {} (leave out if unsupported)", unit, dtype_name(d))));
  }
  return object(std::move(key), std::move(description),
                {leaf("clock_GHz", "the unit's clock, GHz (default: the PE clock)"),
                 object(std::move(table), fmt::format("{} per dtype", unit), std::move(per_dtype))});
}

// "pe.gemm": the GPU-like GEMM pipeline (kernels/sim_pe_gemm.h).
SchemaNode gemm_pipeline() {
  auto tile = [](std::string key, std::string description) {
    return object(std::move(key), std::move(description),
                  {leaf("m", "tile rows"), leaf("n", "tile columns"), leaf("k", "k-block depth")});
  };
  Fields per_dtype, choices;
  for (DType d : kAllDTypes) {
    per_dtype.push_back(tile(std::string(dtype_name(d)), fmt::format("the tile when A is {}", dtype_name(d))));
    choices.push_back(list(std::string(dtype_name(d)),
                           fmt::format("the tiles a GEMM with A in {} may run; the estimated fastest is chosen", dtype_name(d)),
                           tile("*", "one tile {m, n, k}")));
  }
  return object(
      "gemm", "the GPU-like GEMM pipeline (optional; absent: pe.tile round-robin, double-buffered)",
      {tile("tile", "the output tile {m, n} and k-block depth k (default: pe.tile)"),
       object("tiles", "tile per input dtype, overriding 'tile'", std::move(per_dtype)),
       object("choices", "per input dtype, a list of tiles to choose from per GEMM (overrides tiles and tile)",
              std::move(choices)),
       leaf("stages", "A/B k-block buffers in the TCM (2 = double buffering; default 2), or \"auto\": as many as "
                      "the TCM holds besides the C tile"),
       leaf("launch_ns", "per GEMM, ns before its first tile starts: the GPU's kernel launch (default 0)"),
       leaf("raster", "\"m\" or \"n\": the output dimension the tile walk advances along (default \"n\")"),
       leaf("swizzle", "tiles walk in bands of this many tile rows (raster n) or columns (raster m); default 1"),
       list("cluster", "[cm, cn]: PEs running a cm x cn block of tiles, operand k-blocks multicast (default [1, 1])",
            leaf("*", "tiles along m, then along n")),
       object("mma", "the MAC array's issue figures, in MAC-clock cycles",
              {leaf("issue_cycles_per_k_block", "least cycles a k-block's MMAs take (default 0)"),
               leaf("prologue_cycles", "per tile, before its first MMA (default 0)"),
               leaf("epilogue_cycles", "per tile, after its last MMA, besides the vector unit's bias+round (default 0)"),
               leaf("unaligned_bytes_per_cycle",
                    "operand bytes per cycle a PE loads when an operand is not 16-byte aligned (no TMA); "
                    "default: no limit"),
               leaf("unaligned_macs_per_cycle",
                    "MACs per cycle of the kernel that runs unaligned operands (no wgmma); default: the MAC array's")})});
}

Fields cube_fields() {
  return {
      leaf("pes", "number of PEs"),
      leaf("clock_scale", "factor on every clock of the cube (0.8 = a cube at 80% clock)"),
      object("hbm", "the cube's HBM",
             concat(capacity("HBM"), {leaf("bandwidth_GBps", "HBM bandwidth, all channels together, GB/s"),
                                      leaf("latency_ns", "HBM read latency, ns"),
                                      leaf("channels", "independent HBM channels"),
                                      leaf("interleave_bytes", "bytes per channel before the next"),
                                      leaf("channel_map", "\"interleave\" (default: block b on channel b mod channels) "
                                                          "or \"hash\" (stripes rotated by an address hash, as GPUs)"),
                                      leaf("read_GBps", "read bandwidth of the runtime's elementwise/reduction ops, "
                                                        "GB/s (default bandwidth_GBps)"),
                                      leaf("write_GBps", "their write bandwidth, GB/s (default bandwidth_GBps)"),
                                      leaf("copy_GBps", "bytes moved (read + write) per second when an op reads and "
                                                        "writes alike, GB/s (default bandwidth_GBps)")})),
      object("kernel", "figures of the runtime's elementwise/reduction kernels (optional, default 0)",
             {leaf("launch_gap_ns", "gap between one kernel in a stream and the next, ns"),
              leaf("reduction_ns", "a device-wide reduction's final pass over its partial sums, ns")}),
      object("l2", "the cube's L2 cache, in front of its HBM (optional: without it, accesses go straight to the HBM)",
             concat(capacity("L2"), {leaf("line_bytes", "cache line size in bytes (a power of two)"),
                                     leaf("sector_bytes", "sector size in bytes: a power of two dividing line_bytes, "
                                                          "at most 8 per line; misses fetch whole sectors"),
                                     leaf("ways", "associativity: lines per set (LRU within a set)"),
                                     leaf("bandwidth_GBps", "L2 bandwidth for hits and fills, GB/s"),
                                     leaf("latency_ns", "L2 hit latency, ns (paid by reads)")})),
      object("pe", "the description shared by the cube's PEs",
             {leaf("clock_GHz", "PE clock, GHz"),
              object("tcm", "the PE's tightly coupled memory",
                     concat(capacity("TCM"), {leaf("bandwidth_GBps", "TCM bandwidth, GB/s"),
                                              leaf("latency_ns", "TCM access latency, ns")})),
              object("dma", "the PE's DMA engine",
                     {leaf("read_GBps", "DMA read channel (into the TCM), GB/s"),
                      leaf("write_GBps", "DMA write channel (out of the TCM), GB/s"),
                      leaf("chunk_bytes", "DMA chunk size in bytes"),
                      leaf("overhead_ns", "DMA per-request overhead, ns")}),
              rates("mac", "the MAC array", "macs_per_cycle", "MACs per cycle"),
              rates("vector", "the vector unit", "ops_per_cycle", "ops per cycle"),
              object("tile", "the GEMM tile {m, n, k} the PE runs",
                     {leaf("m", "tile rows"), leaf("n", "tile columns"), leaf("k", "tile depth")}),
              gemm_pipeline()}),
  };
}

// The "nccl" section (runtime/algorithms/nccl.h): every field optional, defaults NCCL's own.
SchemaNode nccl_section() {
  auto per_algo = [](std::string key, std::string what) {
    return object(std::move(key), what + ", ns, per algorithm",
                  {leaf("ring", what + " of the ring, ns"), leaf("tree", what + " of the tree, ns")});
  };
  Fields protocols;
  for (const char* p : {"LL", "LL128", "Simple"}) {
    protocols.push_back(object(
        p, fmt::format("the {} protocol", p),
        {leaf("enabled", "true (default): NCCL may choose it"),
         leaf("data_bytes", "payload bytes per wire_bytes on the link"),
         leaf("wire_bytes", "bytes on the link per data_bytes of payload (LL 16 per 8, LL128 128 per 120)"),
         per_algo("base_latency_ns", "fixed cost per call"), per_algo("hop_latency_ns", "latency per step (per send)"),
         leaf("slice_bytes", "pipelining slice of a channel's piece, bytes"),
         leaf("max_bus_bandwidth_GBps", "the model's cap on the bus bandwidth, GB/s (selection only)"),
         leaf("tree_bandwidth_factor", "the model's factor on the tree's bus bandwidth (selection only)"),
         leaf("fixed_latency_ns", "simulated: fixed cost per call after the launch, ns (default base_latency_ns)"),
         leaf("send_latency_ns", "simulated: latency before every send, ns (default hop_latency_ns)"),
         leaf("send_bandwidth_GBps", "simulated: one channel's send rate in wire bytes, GB/s (default channel_bandwidth_GBps)"),
         leaf("copy_bandwidth_GBps", "simulated: one channel's copy of a received slice into the output, GB/s (default: free)"),
         leaf("chunk_slices", "simulated: slices a ring channel moves per step before its next step, 1..64 (default 1)"),
         leaf("max_threads", "NCCL's threads per channel (maxThreads), for the channel reduction of small calls"),
         leaf("thread_threshold_bytes", "NCCL's bytes per thread (threadThresholds; a ring's are x the rank count) below "
                                        "which a small call drops channels")}));
  }
  return object("nccl", "figures of the nccl collective family (runtime/algorithms/nccl.h)",
                {leaf("launch_latency_ns", "kernel launch, once per call, ns"),
                 leaf("channels", "parallel rings (trees: half each way)"),
                 leaf("channel_bandwidth_GBps", "the model's bus bandwidth per channel, GB/s (selection only)"),
                 list("algorithms", "the algorithms NCCL may choose: ring, tree", leaf("*", "ring or tree")),
                 list("rings", "ring orders over member indices, e.g. \"0 2 1 3\"; channel c of a p-member ring "
                               "uses the (c mod k)-th of the k orders of length p (none: the group order)",
                      leaf("*", "a permutation of 0..p-1, space-separated")),
                 object("protocols", "per protocol: LL, LL128, Simple", std::move(protocols))});
}

SchemaNode build() {
  return object(
      "", "a topology document",
      {leaf("name", "the topology's name"),
       leaf("description", "what this system is"),
       list("sources", "where each figure comes from", leaf("*", "a source")),
       object("calibration", "optional: the machine a calibrated overlay was fitted to (cubesim calibrate)",
              {leaf("gpu", "the GPU's name as the driver reports it, e.g. \"NVIDIA H200\""),
               leaf("gpus", "how many GPUs the measurements used"),
               leaf("driver", "the driver version"),
               leaf("cuda", "the CUDA version"),
               leaf("nccl", "the NCCL version"),
               leaf("date", "when it was measured (YYYY-MM-DD)"),
               leaf("measurements", "the measurement file the figures were fitted to")}),
       object("cube", "the description every cube shares", cube_fields()),
       list("cubes", "how many cubes share 'cube', or a list of cubes (each merged over 'cube')",
            object("*", "one cube: its id and where it differs from 'cube'",
                   concat({leaf("id", "the cube's id, 0..cubes-1")}, cube_fields()))),
       object("network", "how the cubes are connected",
              {leaf("kind", "none, ring, mesh, torus, full, switch or explicit"),
               leaf("chunk_bytes", "messages are cut into chunks of this many bytes"),
               list("dims", "mesh and torus: size of each dimension, e.g. [4, 4]", leaf("*", "cubes along this dimension")),
               object("link", "every link of the network", link_figures("every link")),
               object("switch", "kind 'switch': the switch",
                      {leaf("latency_ns", "latency through the switch, ns"),
                       leaf("links_per_cube", "optional: parallel links of network.link between each cube and the "
                                              "switch, striped (default 1)"),
                       object("port", "optional: the switch's ports, one per link, as units of their own",
                              {leaf("bandwidth_GBps", "bandwidth of one switch port per direction, GB/s")})}),
               list("links", "kind 'explicit': the links",
                    object("*", "one link (both directions unless bidirectional is false)",
                           concat({leaf("from", "cube id"), leaf("to", "cube id"),
                                   leaf("bidirectional", "true (default): one link each way")},
                                  link_figures("this link (default: network.link)"))))}),
       object("host", "host memory and each cube's host link",
              {object("memory", "host memory",
                      concat(capacity("host memory"), {leaf("bandwidth_GBps", "host memory bandwidth, GB/s"),
                                                       leaf("latency_ns", "host memory read latency, ns")})),
               object("link", "each cube's host link (PCIe-like)", link_figures("the host link"))}),
       nccl_section(),
       list("link_overrides", "changes to single links of a generated network",
            object("*", "one link: from, to and what changes",
                   concat({leaf("from", "cube id, \"host\" or \"switch\""), leaf("to", "cube id, \"host\" or \"switch\""),
                           leaf("both_directions", "false (default): only from -> to")},
                          concat(link_figures("the new figure"),
                                 {leaf("bandwidth_scale", "factor on the bandwidth (0.5 = half)")}))))});
}

void collect(const SchemaNode& n, const std::string& prefix, std::vector<std::string>& out) {
  auto visit = [&](const SchemaNode& c) {
    const std::string p = prefix.empty() ? c.key : prefix + "." + c.key;
    out.push_back(p);
    collect(c, p, out);
  };
  for (const SchemaNode& f : n.fields) visit(f);
  for (const SchemaNode& i : n.items) visit(i);
}

}  // namespace

const SchemaNode& topology_schema() {
  static const SchemaNode root = build();
  return root;
}

std::vector<std::string> schema_paths(const SchemaNode& node) {
  std::vector<std::string> out;
  collect(node, "", out);
  return out;
}

}  // namespace cubesim::hw
