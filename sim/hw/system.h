// system.h — a simulated system built from a Topology: cubes, PEs, memories, links, the host,
// and the transfer engine that moves real bytes between memories at simulated times.
//
// Every piece of hardware is a unit (unit.h) with counters: usage() reads them all, keyed by
// UnitId, whether or not a trace records. A transfer's path is a chain of path units (memory read,
// DMA channel, links, memory write) built from the topology on first use and kept per pair of
// memories.
//
//   sim::Simulator sim;
//   System sys(sim, load_topology("mesh4x4"));
//   sim.spawn("rank0", [&] {
//     Memory& a = sys.hbm(0);
//     std::uint64_t x = a.allocate(1 << 20, 256, "x");
//     a.fill(x, 1 << 20, std::byte{1});
//     sys.transfer(a.at(x), sys.hbm(5).at(0), 1 << 20);   // blocks until the bytes have landed
//   });
//   sim.run();
//
// Timing (transfer.h has the model): every link direction, DMA channel and memory channel is a
// FIFO server computed arithmetically; a chunk costs one simulator event per link it crosses (one
// per chunk for a transfer inside a cube), and a transfer one more when it lands. No process per
// link, no event per byte. The System must outlive the simulation that uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sim/core/event.h"
#include "sim/core/simulator.h"
#include "sim/hw/cube.h"
#include "sim/hw/fault.h"
#include "sim/hw/hazard.h"
#include "sim/hw/link.h"
#include "sim/hw/memory.h"
#include "sim/hw/pe.h"
#include "sim/hw/routing.h"
#include "sim/hw/switch_port.h"
#include "sim/hw/topology.h"
#include "sim/hw/transfer.h"
#include "sim/hw/unit.h"

namespace cubesim::hw {

// How transfers are timed (engine.h): chunk by chunk through every stage (the reference), or as
// flows through the units as FIFO queues of fluid (a congested unit serves each flow in proportion to
// the rate it arrived at), with events where flows start, stop or their rates change at a unit's head
// (faster for large messages; timing-only: values move chunk by chunk).
enum class TimingModel : std::uint8_t { chunk, flow };
// "chunk", "flow"
std::string_view timing_model_name(TimingModel m);
// Parses "chunk" or "flow"; std::invalid_argument naming `what` and the valid values otherwise.
TimingModel parse_timing_model(std::string_view s, std::string_view what = "timing");

struct SystemOptions {
  // false: timing-only. Memories keep no values (reads give zeros, transfers copy nothing); every
  // simulated time is identical to a functional run.
  bool functional = true;
  // Reading bytes nothing ever wrote (Memory::read, or a transfer's source) throws
  // UninitializedReadError. Off: they read as zero.
  bool check_uninitialized = true;
  HazardMode hazards = HazardMode::kThrow;
  // flow needs functional = false (std::invalid_argument otherwise).
  TimingModel timing = TimingModel::chunk;
  // The transfer paths kept for reuse, in stages (about 80 bytes each): past it, the paths no
  // transfer in flight uses are dropped and rebuilt when next used (times are unchanged). A
  // dissemination barrier over p cubes on a ring crosses p stages in all per rank: kept, its paths
  // would grow as p^2.
  std::size_t path_cache_stages = std::size_t{1} << 20;
};

// The transfer engine's internals, visible so the chunk events can be small structs.
struct Stage;
struct Path;
struct TransferRecord;
class FlowEngine;

class System {
 public:
  System(sim::Simulator& sim, Topology topology, SystemOptions options = {});
  ~System();
  System(const System&) = delete;
  System& operator=(const System&) = delete;

  sim::Simulator& simulator() { return *sim_; }
  const Topology& topology() const { return topo_; }
  const SystemOptions& options() const { return opts_; }

  // ---- the hardware ----
  int num_cubes() const { return static_cast<int>(cubes_.size()); }
  Cube& cube(int id);
  Memory& hbm(int cube) { return this->cube(cube).hbm(); }
  Pe& pe(int cube, int pe) { return this->cube(cube).pe(pe); }
  Memory& tcm(int cube, int pe) { return this->pe(cube, pe).tcm(); }
  bool has_host() const { return host_ != nullptr; }
  Memory& host_memory();  // throws TopologyError when the topology has no "host"
  int num_memories() const { return static_cast<int>(memories_.size()); }
  Memory& memory(int id) { return *memories_.at(static_cast<std::size_t>(id)); }
  int num_links() const { return static_cast<int>(links_.size()); }
  Link& link(int id) { return *links_.at(static_cast<std::size_t>(id)); }
  // A switch's ports facing `cube` (network.switch.port): `in` receives from the cube, else sends
  // to it. TopologyError when the topology has none.
  bool has_switch_ports() const { return !switch_ports_.empty(); }
  SwitchPort& switch_port(int cube, bool in);

  // ---- units ----
  int num_units() const { return static_cast<int>(units_.size()); }
  Unit& unit(UnitId id) { return *units_.at(id.value); }
  // Every unit's counters so far, in id order (usage_since() gives an interval's).
  std::vector<UnitUsage> usage() const;
  // The counters alone, and what identifies each unit (made once, shared: a report may outlive
  // the System).
  std::vector<UnitCounters> counters() const;
  std::shared_ptr<const std::vector<UnitInfo>> units() const;
  // Names the trace tracks of the hardware the first `cubes` cubes use (each cube's HBM channels,
  // each PE's MAC array, vector unit and DMA channels, the links among those cubes and the switch),
  // in that order, so that a saved trace shows the whole machine; spans appear only where
  // something ran.
  void declare_tracks(int cubes);
  // The same for the cubes listed (a run whose ranks sit on those cubes), in that order.
  void declare_tracks(std::span<const int> cubes);

  // ---- routes and figures ----
  // Link ids from cube src to cube dst (deterministic; see routing.h).
  const std::vector<int>& route(int src_cube, int dst_cube) { return router_.route(src_cube, dst_cube); }
  int hops(int src_cube, int dst_cube) { return router_.hops(src_cube, dst_cube); }
  // The alpha-beta figures of the path between two memories and its exact uncontended time.
  PathFigures path_figures(Memory& src, Memory& dst);

  // ---- transfers ----
  // Blocks the calling process until `bytes` from src have landed at dst.
  void transfer(MemRef src, MemRef dst, std::uint64_t bytes) { start_transfer(src, dst, bytes).wait(); }
  // Starts a transfer and returns at once (from a process or a callback).
  TransferHandle start_transfer(MemRef src, MemRef dst, std::uint64_t bytes);
  // The same with `wire` bytes on every link per byte of payload (a protocol's flags, transfer.h),
  // calling `landed` once the bytes have landed (a transfer of 0 bytes calls it at once).
  TransferHandle start_transfer(MemRef src, MemRef dst, std::uint64_t bytes, WireScale wire, OnLanded landed = {});
  // Strided: src_region and dst_region hold the same number of bytes, in any row shapes (a tile
  // gathered from a matrix into a contiguous TCM buffer, and back).
  TransferHandle start_transfer(Memory& src, const Region& src_region, Memory& dst, const Region& dst_region) {
    return start_transfer(src, src_region, dst, dst_region, WireScale{}, OnLanded{});
  }
  void transfer(Memory& src, const Region& src_region, Memory& dst, const Region& dst_region) {
    start_transfer(src, src_region, dst, dst_region).wait();
  }

  // ---- faults ----
  // Seeded fault injection at this system's units (fault.h): armed specs corrupt the bytes of
  // transfers, tiles, reductions and memories at rest; log() records each.
  FaultInjector& faults() { return faults_; }
  const FaultInjector& faults() const { return faults_; }

  // ---- checks and statistics ----
  // Reports recorded under HazardMode::kRecord, in the order they happened.
  const std::vector<HazardReport>& hazards() const { return hazard_tracker_.reports(); }
  void clear_hazards() { hazard_tracker_.clear(); }
  std::uint64_t transfers_started() const { return started_; }
  std::uint64_t transfers_completed() const { return completed_; }
  std::uint64_t bytes_transferred() const { return bytes_moved_; }
  std::size_t cached_path_stages() const { return path_stages_; }  // the path cache's size, in stages
  std::uint64_t transfers_in_flight() const { return started_ - completed_; }
  // After a failed run (the simulator unwound its processes and dropped its events): forgets the
  // transfers still in flight, which will never land, so the hazard checker does not hold them
  // against the next run. Their destination bytes stay as they were.
  void abandon_transfers();
  // Host memory held by all simulated memories' pages.
  std::uint64_t resident_bytes() const;

 private:
  friend struct TransferRecord;
  friend struct ChunkStep;
  friend struct ChunkInject;
  friend struct TransferLanded;
  friend struct ChunkTail;
  friend class FlowEngine;

  const Path& path(Memory& src, Memory& dst);
  Path& path_of(Memory& src, Memory& dst);  // from paths_, built on first use
  std::unique_ptr<Path> build_path(Memory& src, Memory& dst);
  TransferRecord* alloc_record();
  void advance(TransferRecord* r, std::uint64_t chunk, std::size_t stage, sim::Time head, sim::Time tail);
  void inject(TransferRecord* r, std::uint64_t chunk);
  void land(TransferRecord* r);
  void land_after(TransferRecord* r, sim::Duration d);  // now (d == 0) or by an event d later
  void inject_tail(TransferRecord* r, sim::Duration after);  // the flow level: the last chunk by the chunk level
  // Every start_transfer ends here.
  TransferHandle start_transfer(Memory& src, const Region& src_region, Memory& dst, const Region& dst_region,
                                WireScale wire, OnLanded landed);
  void register_unit(Unit& u);  // gives u the next UnitId
  // Registers a unit that belongs to no cube, PE or link and keeps it (units a topology adds to
  // a path: the constructor builds them, build_path places them).
  template <class U>
  U& own(std::unique_ptr<U> u) {
    U& r = *u;
    register_unit(r);
    owned_.push_back(std::move(u));
    return r;
  }

  sim::Simulator* sim_;
  Topology topo_;
  SystemOptions opts_;
  HazardTracker hazard_tracker_;
  FaultInjector faults_{*this};
  Router router_;
  std::vector<Unit*> units_;  // every unit, by UnitId
  mutable std::shared_ptr<const std::vector<UnitInfo>> catalog_;  // units(), made on first use
  std::vector<std::unique_ptr<Memory>> memories_;
  std::vector<std::unique_ptr<Cube>> cubes_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<std::unique_ptr<Unit>> owned_;  // see own()
  std::vector<SwitchPort*> switch_ports_;      // per cube: in, out (owned_); empty without ports
  Memory* host_ = nullptr;
  // Built on first use, kept up to SystemOptions::path_cache_stages.
  std::unordered_map<std::uint64_t, std::unique_ptr<Path>> paths_;
  std::size_t path_stages_ = 0;  // stages of the paths in paths_
  std::vector<std::unique_ptr<StageFigures>> unit_figures_;  // by 2 x UnitId (+1: an L2's cold read)
  const StageFigures& unit_figures(PathUnit& u, bool cold_read);
  void evict_paths();
  std::vector<std::unique_ptr<TransferRecord>> records_;
  TransferRecord* free_records_ = nullptr;
  std::uint64_t next_transfer_id_ = 1;
  std::uint64_t started_ = 0, completed_ = 0, bytes_moved_ = 0;
  sim::Duration lookback_ = 0;
  std::unique_ptr<FlowEngine> flows_;  // SystemOptions::timing == flow
};

}  // namespace cubesim::hw
