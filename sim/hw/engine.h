// engine.h — the transfer engine's internals, shared by system.cpp (paths, the chunk level) and
// flow.cpp (the flow level). Not part of the API: include system.h.
//
// A transfer is a TransferRecord (pooled by the System) moving along a Path (a chain of Stages,
// built once per pair of memories). Which model times it is SystemOptions::timing:
//   chunk  the message is cut into chunks; each chunk is served by every stage in turn (transfer.h)
//   flow   the message is one flow through the path's units, which share each unit's bandwidth
//          max-min fairly with the other flows on it; rates change only when a flow starts or
//          ends (FlowEngine below)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/core/event.h"
#include "sim/core/time.h"
#include "sim/core/trace.h"
#include "sim/hw/hazard.h"
#include "sim/hw/path_unit.h"
#include "sim/hw/server.h"
#include "sim/hw/transfer.h"

namespace cubesim::hw {

class System;
class L2Cache;
class DmaChannel;
class Memory;
struct FlowResource;

// One stage of a path: a unit, and the fixed delays of this use of it.
struct Stage {
  PathUnit* unit = nullptr;
  sim::Duration pre = 0;   // before the chunk occupies the unit (read latency, port overhead)
  sim::Duration post = 0;  // after it leaves (wire latency)
  bool src_side = false;   // a memory read: addresses come from the source region
  bool arrival = false;    // served at the head's arrival (PathUnit::Order::arrival)
  // Which serve() the chunk level calls: a memory's and a link's without the virtual call (both
  // classes are final; the chunk loop's first touch of the unit is then its own data, not its vtable).
  enum class Serve : std::uint8_t { memory, link, other } serve = Serve::other;
  L2Cache* cache_read = nullptr;  // an L2 read stage: its figures are the cold (all-miss) path's
  const StageFigures* fig = nullptr;  // the unit's figures (an L2 read's: cold), one copy per unit
};
// Its name, as PathFigures::stages shows it: "cube0.hbm (read)", "link c0->c1", "cube0.pe3.dma.read".
std::string stage_label(const Stage& s);

struct Path {
  std::vector<Stage> stages;
  DmaChannel* injector = nullptr;  // requests through it serialize
  sim::Duration injector_overhead = 0;
  std::uint64_t chunk = 0;
  sim::Duration pace = 0;   // a full chunk at the slowest stage
  sim::Duration d_pre = 0;  // fixed delays before the first link (0 without links)
  PathFigures figures;      // without stages and links (System::path_figures lists them from `stages`)
  Memory* dst = nullptr;
  std::uint32_t users = 0;  // transfers in flight on it: a path in use is never evicted
  bool l2 = false;          // an L2 is one of its stages
  // The flow level's stage times for the sizes it last asked (FlowEngine::times): a message's flow
  // needs them when it starts and again for the counters when it ends, and a path's messages are
  // mostly of one size, so they are worked out once per size, not per message.
  struct FlowTimes {
    std::uint64_t chunk = 0, last = 0;  // 0: none yet
    WireScale wire;
    sim::Duration pace = 0, slowest = 0;  // the slowest stage for a full chunk, for the last one
    struct Each {
      sim::Duration chunk = 0, last = 0;  // the stage's time for a full chunk, for the last one
      Server* counters = nullptr;         // where its unit counts flows; null: an L2 (counted by its lookup)
      bool arrival = false;               // a link: counts wire bytes
    };
    std::vector<Each> each;  // per stage
  } flow_times;
};

// A flow's use of one unit: the share of the unit's time one byte per picosecond of the flow takes
// (wire bytes per payload byte over the unit's bandwidth), and where the flow sits in the unit's list.
struct FlowLeg {
  FlowResource* res = nullptr;
  double weight = 0;
  std::uint32_t slot = 0;
};

struct TransferRecord : TransferInfo {
  System* sys = nullptr;
  Memory* src = nullptr;
  Memory* dst = nullptr;
  Path* path = nullptr;
  std::uint64_t bytes = 0, chunk = 0;
  WireScale wire;  // on the links (arrival-ordered stages)
  OnLanded landed_cb;
  sim::Time first_inject = 0;
  bool done = true;
  std::optional<sim::Event> event;
  TransferRecord* next_free = nullptr;

  // ---- flow level (flow.cpp) ----
  std::vector<FlowLeg> legs;     // one per distinct unit of the path
  double cap = 0;                // bytes per ps on an idle path: bytes / full
  double rate = 0;               // bytes per ps now (0 until the flow starts)
  double remaining = 0;          // bytes not yet through at `updated`
  double fill = 0;               // scratch of the max-min computation
  sim::Duration full = 0;        // the flow's time through an idle path, fixed delays aside
  sim::Duration delays = 0;      // the path's fixed delays paid after the last byte (alpha less the DMA
                                 // request overhead, less the HBM's latency where the L2 holds the source)
  bool l2_hit = false;           // the source is all in its L2 (a read stage at the L2's figures)
  bool split = false;            // the flow is all chunks but the last (its idle time: tail)
  bool throttled = false;        // a unit held it below its cap at some time: the chunk level times its last chunk
  bool tailing = false;          // its last chunk is at the chunk level: it keeps its rate on its units until released
  bool l2_path = false;          // an L2 on its path: the chunk level times a split flow's last chunk
  sim::Duration tail = 0;        // a split flow's last chunk at its slowest stage
  sim::Time started = 0, updated = 0;
  std::uint32_t generation = 0;  // its end event is current only while this matches (never reset)
  std::uint32_t mark = 0;        // visit stamp of the max-min computation
  bool frozen = false;           // scratch: its rate is settled
};

// The flow level's view of a unit: its flows and the figures the max-min computation needs.
struct FlowResource {
  PathUnit* unit = nullptr;
  double ps_per_byte = 0;  // 1 / the unit's bandwidth (all channels together)
  struct Entry {
    TransferRecord* flow;
    double weight;
    double cap;         // the flow's (kept here: the demand and fill level read no record)
    FlowLeg* leg;       // the flow's leg on this unit (its legs do not move while it runs)
  };
  std::vector<Entry> flows;
  double demand = 0;        // sum of weight x cap over its flows: > 1 means it can limit them
  double used = 0, wsum = 0;  // scratch of the max-min computation
  bool saturated = false;
  bool changed = false;  // in FlowEngine::changed_
  std::uint32_t mark = 0;
  std::uint32_t leg_mark = 0, leg = 0;  // scratch of FlowEngine::start: the flow's leg on it, if marked
  sim::Trace::TrackId track = Server::kNoTrack;
  sim::Time traced_until = 0;
};

// Flow-level timing (SystemOptions::timing = flow). A transfer occupies its path's units from the
// time the chunk level would inject its first chunk for `full` at its idle rate; while other flows
// share a unit, each unit's bandwidth is shared max-min fairly (progressive filling: every flow's
// rate grows alike until a unit it crosses is full or it reaches its idle rate). Rates are
// recomputed when flows start or end (once for all that do at one time, by an event after every
// other at that time), only for the flows that can be affected: those on the changed flows' units
// and, transitively, on units whose flows could together exceed them (units with less demand than
// bandwidth limit nobody). One event per rate change of a flow (its new end;
// the old one is ignored), one when it lands, the path's fixed delays after its end.
//
// A message of one chunk is no flow: the chunk level times it (System::start_transfer asks
// by_chunks). Queued with others at a link, FIFO finishes such messages one after another where fair
// sharing would finish them all together at the end; NCCL's plans are made of them (slices of a
// chunk or less forwarded hop by hop), and they cost the chunk level one event per link, as a flow.
// Likewise the last chunk of a longer message: its flow is the other chunks. If a unit ever held the
// flow below its cap (or an L2 is on its path), the last chunk goes by the chunk level once they are
// through (System::inject_tail), after waiting for what the flows still running on its units leave
// it, at least a fair turn (start_tail); otherwise it lands the last chunk's idle time later. Equal contenders on a link then end a
// chunk time apart in the order they started, as the chunk level's round robin of their chunks ends
// them, not all together a round later (which a message forwarded hop by hop would pay at every
// hop). Otherwise the two levels do not see each other's load on a unit they share.
//
// A latency-bound flow, one through an idle path in at most kLatencyBound (a barrier's token, a
// flag: bytes, not kilobytes), takes no part in the sharing: it runs at its idle rate and takes
// nothing from the others. Sharing could lengthen it by at most its own time per flow it meets, which
// is below what the chunk level's FIFO adds to such a message anyway (it waits behind whole chunks of
// the others), and its bytes could slow the others by less; in return the many-hop tokens of a
// dissemination barrier no longer join every link's flows into one computation.
class FlowEngine {
 public:
  static constexpr sim::Duration kLatencyBound = 1000;  // ps
  explicit FlowEngine(System& sys);
  // Whether r goes through the chunk level instead: a message of one chunk that is not latency-bound.
  bool by_chunks(const TransferRecord* r);
  // Starts r's flow now (the record is set up, r->first_inject <= now).
  void start(TransferRecord* r);
  // r's end event: current when `generation` matches.
  void end(TransferRecord* r, std::uint32_t generation);
  // A split flow's last chunk, once the flows ending with it have ended (its own event).
  void start_tail(TransferRecord* r);
  // A tailing flow leaves its units (its last chunk has passed its slowest stage, or it landed).
  void release(TransferRecord* r);
  // After a failed run: forgets every flow (their events are gone).
  void abandon();
  // System::evict_paths dropped paths: a new one may take an evicted one's address, so the memo of
  // the last long path's times is forgotten.
  void paths_evicted() { scratch_path_ = nullptr; }
  // Recomputes the rates around the units changed since the last time (its own event, changed()).
  void reshare();

 private:
  FlowResource& resource(PathUnit& u);
  // Takes r off its units; whether one of them could limit (the rates around it may change).
  bool leave(TransferRecord* r);
  // r's path's stage times for r's chunk, last chunk and wire scale (without an L2 hit): memoized on
  // a path of up to kMemoStages stages, worked out each time for a longer one (a barrier's many-hop
  // tokens: only the last one asked is kept, which a message's start asks again right after its
  // by_chunks()), so the memo adds at most 32 x kMemoStages bytes to a cached path. Valid until the next call.
  static constexpr std::size_t kMemoStages = 16;
  const Path::FlowTimes& times(const TransferRecord* r);
  // Notes that the flows on r's units changed; the rates are recomputed once, by an event after
  // every other at this time (flows starting and ending together cost one recomputation).
  void changed(const TransferRecord* r);

  void reschedule(TransferRecord* f);
  static void refresh_demand(FlowResource& e);
  double fill_level(const FlowResource& e);  // the rate at which e is full when its flows rise alike
  void trace_flow(TransferRecord* r, std::uint64_t bytes);

  System* sys_;
  std::vector<FlowResource> res_;  // by UnitId, made on first use
  std::uint32_t stamp_ = 0;
  std::uint32_t leg_stamp_ = 0;  // start's: marks the resources of the flow being set up
  std::vector<TransferRecord*> comp_flows_;  // scratch
  std::vector<FlowResource*> comp_res_;      // scratch
  std::vector<std::pair<double, double>> level_scratch_;  // (cap, weight), fill_level's
  std::vector<FlowResource*> changed_;  // units whose flows changed since the last reshare
  Path::FlowTimes times_scratch_;       // times() of a path too long to memoize: the last one asked
  const Path* scratch_path_ = nullptr;  // (a message's start asks right after its by_chunks())
  bool reshare_due_ = false;            // its event is scheduled
};

}  // namespace cubesim::hw
