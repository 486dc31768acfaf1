// topology.h — a system description: cubes, their PEs and memories, links, switch, host; and the
// loader that reads it from JSON under topologies/ and validates every field.
//
// A Topology is plain data (figures in exact units: bytes, bytes/s, picoseconds, Hz); System builds
// the simulated hardware from it. Files may `extend` another file and `set` fields by dotted path;
// see topologies/README.md for the schema.
//
//   Topology t = load_topology("mesh4x4");                // a shipped name, or a path to a .json
//   Topology s = load_topology("ring4", {{"network.link.bandwidth_GBps", 64}});  // with overrides
//   nlohmann::json doc = load_topology_json("mesh4x4");   // the resolved document, for sweeps:
//   apply_override(doc, "cube.hbm.bandwidth_GBps", 4096);
//   apply_override(doc, "cubes.3.clock_scale", 0.8);     // one straggler cube
//   Topology t2 = topology_from_json(doc, "mesh4x4 (HBM 4 TB/s, cube 3 at 0.8x clock)");
//
// Every error is a TopologyError naming the file, the JSON path and what would be valid.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/time.h"
#include "base/dtype.h"

namespace cubesim::hw {

using sim::Bandwidth;
using sim::Duration;

struct HbmSpec {
  std::uint64_t capacity_bytes = 0;
  Bandwidth bandwidth;                 // total, over all channels
  Duration latency = 0;                // paid by reads
  std::uint32_t channels = 1;          // independent servers of bandwidth / channels each
  std::uint64_t interleave_bytes = 0;  // consecutive blocks of this size go to consecutive channels
  // "channel_map": "interleave" (false: block b on channel b % channels) or "hash" (true: each
  // stripe of `channels` blocks is rotated by a hash of its index, as GPUs hash addresses over their
  // DRAM channels; memory.h).
  bool channel_hash = false;
  // What the runtime's elementwise/reduction kernels see (SimBackend::cost_time; optional, 0: absent).
  // Without any of them such an op moves bytes_read + bytes_written at `bandwidth`. With them: reads
  // at `read`, writes at `write` (a missing one: `bandwidth`), one after the other; with `copy` (bytes
  // moved, read + write, per second when an op reads and writes alike), the bytes an op both reads
  // and writes move at `copy` (the bus turning around between them), the surplus of one direction at
  // that direction's rate.
  Bandwidth read, write, copy;
  bool rw_model() const { return read.bytes_per_s || write.bytes_per_s || copy.bytes_per_s; }
};

// A cube's kernel figures ("kernel", optional): paid by each op of the runtime that runs as a kernel
// of its own (OpCost::kernel), never by the steps inside a collective.
struct KernelSpec {
  Duration launch_gap = 0;  // between one kernel in a stream and the next
  Duration reduction = 0;   // a device-wide reduction's final pass over its partial sums (OpCost reduce)
};

// A cube's L2 cache (optional; `present` false: accesses go straight to the HBM, as without one).
// A memory-side cache shared by the cube's PEs: every transfer stage that reads or writes the
// cube's HBM passes it (l2_cache.h has the model).
struct L2Spec {
  bool present = false;
  std::uint64_t capacity_bytes = 0;  // a multiple of line_bytes * ways (sets = capacity / (line * ways))
  std::uint32_t line_bytes = 0;      // a power of two; a tag per line
  std::uint32_t sector_bytes = 0;    // a power of two dividing line_bytes, at most 8 per line; the unit of fills
  std::uint32_t ways = 0;            // associativity (LRU within a set)
  Bandwidth bandwidth;               // hits and fills pass it at this rate
  Duration latency = 0;              // hit latency, paid by reads
};

struct TcmSpec {
  std::uint64_t capacity_bytes = 0;
  Bandwidth bandwidth;
  Duration latency = 0;
};

struct DmaSpec {
  Bandwidth read;                  // into the TCM (the PE reads from outside)
  Bandwidth write;                 // out of the TCM
  std::uint64_t chunk_bytes = 0;   // DMA transfers are cut into chunks of this size
  Duration overhead = 0;           // per request, before its first byte moves
};

// A rate per dtype and a clock: the MAC array (MACs per cycle) or the vector unit (ops per cycle).
struct RateSpec {
  std::uint64_t clock_hz = 0;
  std::array<double, kNumDTypes> per_cycle{};  // 0: the unit does not support that dtype
  double rate(DType d) const { return per_cycle[static_cast<std::size_t>(d)]; }
};

struct TileSpec {
  std::uint32_t m = 0, n = 0, k = 0;
};

// The GPU-like GEMM pipeline ("pe.gemm", optional; kernels/sim_pe_gemm.h has the model). Absent
// (present == false): sim_pe_gemm deals pe.tile round-robin, double-buffered, as it always did.
enum class GemmRaster { m, n };  // the output dimension the tile walk advances along
std::string_view gemm_raster_name(GemmRaster r);
struct GemmPipelineSpec {
  bool present = false;
  TileSpec tile;                                    // default: pe.tile
  std::array<TileSpec, kNumDTypes> tile_by_dtype{}; // "tiles": per input dtype; m == 0: `tile`
  std::uint32_t stages = 2;                         // A/B k-block buffers in the TCM (see auto_stages)
  GemmRaster raster = GemmRaster::n;
  std::uint32_t swizzle = 1;                        // tiles walk in bands of this many rows (cols)
  std::uint32_t cluster_m = 1, cluster_n = 1;       // PEs sharing operand loads by multicast
  Duration launch = 0;  // "launch_ns": per GEMM, before its first tile starts (a GPU's kernel launch)
  // MAC-clock cycles: the least a k-block's MMAs take (issue-bound), and fixed per-tile costs
  // before the first MMA and after the last one.
  std::uint64_t issue_cycles_per_k_block = 0, prologue_cycles = 0, epilogue_cycles = 0;
  // Bytes per MAC-clock cycle a PE loads operands at when an operand is not 16-byte aligned (no
  // TMA; sim_pe_gemm.h); 0: no such limit.
  double unaligned_bytes_per_cycle = 0;  // at 2-byte alignment; a-byte aligned operands load a/2 times as fast
  double unaligned_macs_per_cycle = 0;   // the fallback kernel's MMA rate (0: the MAC array's)
  // "choices": per input dtype, the tiles a kernel library has for it; each GEMM runs the one that
  // sim_pe_gemm's estimate says is fastest for its shape (kernels/sim_pe_gemm.h). Empty: tile_for().
  std::array<std::vector<TileSpec>, kNumDTypes> choices{};
  // "stages": "auto": each tile gets as many k-block buffers as the TCM holds besides its C tile.
  bool auto_stages = false;
  const TileSpec& tile_for(DType d) const {
    const TileSpec& t = tile_by_dtype[static_cast<std::size_t>(d)];
    return t.m ? t : tile;
  }
  std::vector<TileSpec> tiles_for(DType d) const {
    const auto& c = choices[static_cast<std::size_t>(d)];
    return c.empty() ? std::vector<TileSpec>{tile_for(d)} : c;
  }
  // The k-block buffers a tile gets in a TCM of `tcm` bytes (element sizes of A, B, C and the bias,
  // 0 without one): `stages`, or with auto_stages (tcm - C tile) / (A + B k-block + bias slice).
  std::uint64_t stages_for(const TileSpec& t, std::uint64_t ea, std::uint64_t eb, std::uint64_t ec,
                           std::uint64_t ebias, std::uint64_t tcm) const {
    if (!auto_stages) return stages;
    const std::uint64_t c = std::uint64_t{t.m} * t.n * ec;
    const std::uint64_t per = std::uint64_t{t.m} * t.k * ea + std::uint64_t{t.k} * t.n * eb + std::uint64_t{t.n} * ebias;
    return tcm > c ? (tcm - c) / per : 0;
  }
};

struct PeSpec {
  std::uint64_t clock_hz = 0;
  TcmSpec tcm;
  DmaSpec dma;
  RateSpec mac;     // macs per cycle
  RateSpec vector;  // element ops per cycle
  TileSpec tile;    // the GEMM tile a PE runs (double-buffered A and B, one C)
  GemmPipelineSpec gemm;  // "gemm": the GPU-like pipeline, when present
};

struct CubeSpec {
  int id = 0;
  int pes = 0;
  HbmSpec hbm;
  L2Spec l2;  // absent unless the document has cube.l2 (or cubes.<i>.l2)
  KernelSpec kernel;  // zeros unless the document has cube.kernel
  PeSpec pe;
  double clock_scale = 1.0;  // already applied to pe.clock_hz, pe.mac and pe.vector clocks
};

// Endpoints of a link that are not cubes.
inline constexpr int kSwitchNode = -1;
inline constexpr int kHostNode = -2;
// "c3", "sw", "host": how link names ("c3->sw") and link units ("link c3->sw") name a node.
std::string node_name(int node);

struct LinkFigures {
  Bandwidth bandwidth;   // per direction
  Duration latency = 0;  // wire/flight time, after a chunk leaves the port
  Duration overhead = 0; // per hop, before a chunk enters the link (port/router processing)
};

// One direction of a link.
struct LinkSpec {
  int from = 0;  // cube id, kSwitchNode or kHostNode
  int to = 0;
  LinkFigures figures;
  std::string name;  // "c0->c1", "c3->sw", "host->c0"
};

enum class NetworkKind { kNone, kRing, kMesh, kTorus, kFull, kSwitch, kExplicit };
std::string_view network_kind_name(NetworkKind k);

struct HostSpec {
  bool present = false;
  std::uint64_t capacity_bytes = 0;
  Bandwidth bandwidth;
  Duration latency = 0;
  LinkFigures link;  // each cube's host link, per direction (PCIe-like)
};

// The "nccl" section: the figures of the `nccl` collective family (runtime/algorithms/nccl.h). A
// topology without it plans with defaults() — NCCL's own tuning constants for Hopper over NVLink.
enum class NcclProtocol { ll, ll128, simple };
inline constexpr NcclProtocol kNcclProtocols[] = {NcclProtocol::ll, NcclProtocol::ll128, NcclProtocol::simple};
std::string_view nccl_protocol_name(NcclProtocol p);  // "LL", "LL128", "Simple"

struct NcclProtocolSpec {
  bool enabled = true;
  std::uint32_t data_bytes = 1, wire_bytes = 1;  // a link carries wire_bytes per data_bytes of payload
  Duration base_latency[2] = {0, 0};             // ring, tree: once per call
  Duration hop_latency[2] = {0, 0};              // ring, tree: per step (per send)
  std::uint64_t slice_bytes = 1 << 20;           // pipelining slice of a channel's piece
  double max_bus_GBps = 0;                       // the model's cap on the bus bandwidth (0: none)
  double tree_bandwidth_factor = 1;              // the model's factor on the tree's bus bandwidth
  // What a call of this protocol does on the hardware (simulated time only; NCCL's choice never
  // reads them). Each is optional: absent, the simulation runs with the tuning figures above
  // (fixed: base_latency, send latency: hop_latency, send bandwidth: NcclSpec::channel_bandwidth_GBps,
  // no receive copy, one slice per chunk), as before these fields existed.
  bool has_fixed_latency = false, has_send_latency = false;
  Duration fixed_latency = 0;   // once per call, after the launch (both algorithms)
  Duration send_latency = 0;    // before every send: the step's handshake (both algorithms)
  double send_GBps = 0;         // one channel's send loop, wire bytes per second (0: channel_bandwidth)
  double copy_GBps = 0;         // one channel's local copy of a received slice into the output (0: free)
  int chunk_slices = 1;         // slices a ring channel moves per step before the next step (NCCL's chunk)
  // NCCL's channel reduction for small calls (enqueue.cc): a call uses the largest channel count
  // nc <= channels with bytes >= nc x max_threads x thread_threshold (ring: x the rank count), at
  // least 1. NCCL's maxThreads and threadThresholds; 0 threshold: always every channel.
  int max_threads = 512;
  std::uint64_t thread_threshold = 0;
};

struct NcclSpec {
  bool present = false;               // the topology has an "nccl" section
  Duration launch_latency = 0;        // once per call, before any data moves
  int channels = 16;
  double channel_bandwidth_GBps = 20.6;  // a channel's bandwidth: selection, and each ring channel's send rate
  bool ring = true, tree = true;      // algorithms allowed
  // Ring orders: channel c of a ring over p members uses the (c mod k)-th of the k orders of
  // length p (member indices); none of that length: the group order.
  std::vector<std::vector<int>> rings;
  const std::vector<int>* ring_order(int p, int channel) const;
  NcclProtocolSpec protocols[3];      // by NcclProtocol
  const NcclProtocolSpec& protocol(NcclProtocol p) const { return protocols[static_cast<int>(p)]; }
  static const NcclSpec& defaults();
};

struct Topology {
  std::string name;
  std::string description;
  std::vector<std::string> sources;
  // "calibration": what a calibrated overlay was fitted to (cubesim calibrate); empty when absent.
  struct Calibration {
    std::string gpu, driver, cuda, nccl, date, measurements;
    int gpus = 0;
  } calibration;
  std::string origin;    // the file it came from, or what the caller called it
  nlohmann::json doc;    // the resolved document: extends merged, "set" applied

  std::vector<CubeSpec> cubes;  // cubes[i].id == i
  NetworkKind network = NetworkKind::kNone;
  std::vector<int> dims;        // mesh/torus: size of each dimension, dimension 0 varies fastest
  std::uint64_t chunk_bytes = 0;
  Duration switch_latency = 0;  // kSwitch: added to every pass through the switch
  // kSwitch: each cube's parallel links to the switch (network.switch.links_per_cube); the link
  // specs already carry their summed bandwidth (traffic is striped over every link).
  int switch_links_per_cube = 1;
  // kSwitch: bandwidth of one switch port per direction (network.switch.port); zero: no port units.
  // Each cube has an in port group (cube -> switch) and an out port group (switch -> cube) of
  // switch_links_per_cube ports each (SwitchPort, switch_port.h).
  Bandwidth switch_port;
  bool has_switch_ports() const { return network == NetworkKind::kSwitch && switch_port.bytes_per_s > 0; }
  std::vector<LinkSpec> links;  // directed; both directions of a cable are two entries
  HostSpec host;
  NcclSpec nccl;  // the "nccl" section, or defaults() with present = false

  // Index into links of the link from -> to, or -1.
  int find_link(int from, int to) const;
};

// Limits of the loader, each checked before the work it bounds, the limit named in the error
// (topologies/README.md, "Limits"):
inline constexpr std::uint64_t kMaxTopologyFileBytes = 16ull << 20;  // one file (16 MiB); a regular file
inline constexpr int kMaxJsonDepth = 64;                              // nested arrays/objects in a document
inline constexpr std::size_t kMaxCubes = 1u << 16;                    // cubes in one topology (65536)
inline constexpr std::size_t kMaxLinks = 1u << 21;                    // link directions, host links included
inline constexpr std::size_t kMaxExtendsChain = 32;                   // files in one chain of "extends"
inline constexpr std::size_t kMaxTopologyPathBytes = 4096;            // a name or path given to "extends"
// The smallest figures the loader accepts: 1 byte/s and 1 Hz (below them a figure rounds to 0), and
// 2^-20 operations (or bytes) per cycle (an operation of 2^44 then still counts < 2^64 cycles; a
// larger count saturates in ComputeUnit::cycles and its time overflows with an error).
inline constexpr double kMinBandwidthGBps = 1e-9;
inline constexpr double kMinClockGHz = 1e-9;
inline constexpr double kMinPerCycle = 1.0 / (1 << 20);

// Throws TopologyError, its message starting with `what` ("topology 'x'"), when `doc` nests arrays
// and objects deeper than kMaxJsonDepth (iteratively: safe on any depth). topology_from_json and
// apply_override call it first; a binding that builds documents can call it too.
void check_json_depth(const nlohmann::json& doc, const std::string& what);

// The directory shipped names resolve in: $CUBESIM_TOPOLOGY_DIR if set, else the source tree's
// topologies/ (a compile-time path).
std::string topology_dir();
// Names of the shipped topologies (the .json files in topology_dir()), sorted.
std::vector<std::string> list_topologies();

// Loads, resolves and validates. `name_or_path` is a shipped name ("mesh4x4") or a path to a file.
Topology load_topology(const std::string& name_or_path);
// The same with dotted-path overrides (apply_override, in order) applied before validation: the one
// way a topology is loaded with changes (sweeps, `cubesim run --set`, Python's load_topology). An
// error names the override path or the JSON path. `origin` is the file without overrides, else
// name_or_path.
Topology load_topology(const std::string& name_or_path,
                       const std::vector<std::pair<std::string, nlohmann::json>>& overrides);
// Loads and resolves ("extends" merged, "set" applied) without validating the figures.
nlohmann::json load_topology_json(const std::string& name_or_path);
// Validates a resolved document and builds the topology. `origin` names it in messages.
Topology topology_from_json(const nlohmann::json& doc, const std::string& origin = "<json>");

// Sets the field at a dotted path ("cube.hbm.bandwidth_GBps", "network.dims.0", "cubes.3.clock_scale").
// The path must name a field the schema has (topology_schema.h); a typo is an error naming the path and
// the keys that exist there. "cubes.<i>.<field>" on a document whose "cubes" is a count turns it into a list of
// per-cube overrides first, so one cube can differ from the template.
void apply_override(nlohmann::json& doc, std::string_view dotted_path, const nlohmann::json& value);

// Typos: the Levenshtein distance, the candidate closest to s when it is close enough to be a typo
// of it (else ""), and " (did you mean 'x'?)" for that candidate (else ""). Every reader of user
// documents (topologies, SDC recipes) suggests keys with these.
std::size_t edit_distance(std::string_view a, std::string_view b);
std::string closest(std::string_view s, const std::vector<std::string>& candidates);
std::string did_you_mean(std::string_view s, const std::vector<std::string>& candidates);

}  // namespace cubesim::hw
