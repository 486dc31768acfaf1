// engine.h — the transfer engine's internals, shared by system.cpp (paths, the chunk level) and
// flow.cpp (the flow level). Not part of the API: include system.h.
//
// A transfer is a TransferRecord (pooled by the System) moving along a Path (a chain of Stages,
// built once per pair of memories). Which model times it is SystemOptions::timing:
//   chunk  the message is cut into chunks; each chunk is served by every stage in turn (transfer.h)
//   flow   the message is one flow of fluid through the path's units, each a FIFO queue as the
//          chunk level's are: rates change only where flows start or end and where such a change
//          reaches the head of a unit's backlog (FlowEngine below)
#pragma once

#include <cstdint>
#include <memory>

#include <boost/container/small_vector.hpp>
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

// The fields every message reads come first (two cache lines with flow_times), the figures last.
struct Path {
  std::vector<Stage> stages;
  DmaChannel* injector = nullptr;  // requests through it serialize
  sim::Duration injector_overhead = 0;
  std::uint64_t chunk = 0;
  sim::Duration pace = 0;   // a full chunk at the slowest stage
  sim::Duration d_pre = 0;  // fixed delays before the first link (0 without links)
  Memory* dst = nullptr;
  std::uint32_t users = 0;  // transfers in flight on it: a path in use is never evicted
  bool l2 = false;          // an L2 is one of its stages
  sim::Duration flow_delays = 0;  // figures.alpha less the injector's overhead (a flow's fixed delays)
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
      FlowResource* res = nullptr;        // its unit's state in the flow engine (FlowEngine::resource)
      bool arrival = false;               // a link: counts wire bytes
    };
    boost::container::small_vector<Each, 5> each;  // per stage (inline up to five: no buffer of its own)
  } flow_times;
  PathFigures figures;      // without stages and links (System::path_figures lists them from `stages`)
};

// A flow's use of one unit: the share of the unit's time one byte per picosecond of the flow takes
// (wire bytes per payload byte over the unit's bandwidth), and where the flow sits in the unit's list.
// A flow's legs are in path order (a unit twice on the path, a copy within one memory: one leg of
// twice the weight, at its first place).
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
  std::unique_ptr<sim::Event> event;  // made when someone waits on its handle (TransferHandle::wait)
  TransferRecord* next_free = nullptr;

  // ---- flow level (flow.cpp) ----
  boost::container::small_vector<FlowLeg, 4> legs;  // one per distinct unit of the path, in path order; then the HBMs
                                 // behind its L2s (fills and write-backs: fluid, not hops of the last chunk)
  std::uint32_t hops = 0;        // the legs on the path: those the last chunk passes (FlowEngine::hop)
  double cap = 0;                // bytes per ps its source injects at (every byte of the flow in `full`)
  sim::Duration full = 0;        // the flow's time through an idle path, fixed delays aside
  sim::Duration delays = 0;      // the path's fixed delays paid after the last byte (alpha less the DMA
                                 // request overhead, less the HBM's latency where the L2 holds the source)
  bool l2_hit = false;           // the source is all in its L2 (a read stage at the L2's figures)
  bool path_l2 = false;          // its path has an L2 (Path::l2, here to spare the path a visit at the stop)
  bool split = false;            // its last chunk goes to the chunk level (a path through an L2, idle)
  bool packet = false;           // its last chunk goes through the queues as one piece (FlowEngine::hop)
  bool body_done = false;        // the fluid's last byte has left its last unit
  bool packet_done = false;      // the last chunk has left its last unit
  sim::Duration tail = 0;        // the last chunk at its slowest stage (its time on an idle path)
  sim::Time started = 0;
  std::uint32_t generation = 0;  // its source's stop event is current only while this matches (never reset)
  std::uint64_t quiet = 0;       // FlowEngine::marks_ when it started on the fast path (else never matches)
};

// The flow level's view of a unit: a FIFO queue of fluid, as the chunk level's links are (and,
// nearly, its memories and DMA channels, which book chunks in the order they come). Its capacity is
// 1 (time per time); a flow at r bytes per ps offers weight x r of it.
struct alignas(64) FlowResource {
  struct Entry {
    TransferRecord* flow;
    double weight;
    FlowLeg* leg;     // the flow's leg on this unit (its legs do not move while it runs)
    std::uint32_t index;  // that leg's place in the flow's legs
    double in = 0;    // bytes per ps arriving now
    double head = 0;  // bytes per ps arriving when the bytes now at the head of the backlog arrived
    double out = 0;   // bytes per ps leaving now: head, or head / load_head while there is a backlog;
                      // 0 while the unit serves a last chunk (paused) and once its last byte has passed
    bool ended = false;  // the flow's last byte has reached the head (its `last` change)
    bool passed = false;  // and that was handed on to the next unit (or the flow is through)
  };
  // A change of a flow's arrival rate that has not reached the head of the backlog yet: it does at
  // `depart`, when every byte that arrived before it has left (FIFO).
  struct Change {
    sim::Time depart;
    TransferRecord* flow;
    std::uint32_t index;  // the flow's leg
    double rate;
    bool last = false;    // the flow's last byte comes with it (rate 0 from then on)
  };
  // (The fields a flow on the fast path reads and writes come first, in the first two cache lines:
  // a ring step touches every rank's units once, each cold.)
  PathUnit* unit = nullptr;
  double ps_per_byte = 0;  // 1 / the unit's bandwidth (all channels together)
  double load_in = 0;    // sum of weight x in: above 1 the backlog grows
  double load_head = 0;  // sum of weight x head
  double backlog = 0;    // ps of work queued at `backlog_at`
  // Inline for the usual one or two flows (a ring's link, a memory read by one and written by
  // another): no separate buffer, one cache line fewer per unit a message passes.
  boost::container::small_vector<Entry, 2> flows;
  std::vector<Change> pending;  // [pending_head, size): in departure order
  std::size_t pending_head = 0;
  std::uint32_t leg_mark = 0, leg = 0;  // scratch of FlowEngine::start: the flow's leg on it, if marked
  bool dirty = false;            // in FlowEngine::dirty_
  std::uint32_t drain_gen = 0;   // the drain event is current only while this matches
  bool drain_pending = false;    // a drain (its own event, or a departure's wake-up) is due at drain_at
  sim::Time drain_at = 0;
  sim::Time backlog_at = 0;
  std::vector<Change> inbox;    // arrival rates changed at this time, not yet taken in (dirty)
  // Last chunks in its backlog, [start, end) in time order from pause_head: the unit serves them,
  // not its fluid, then (what leaves meanwhile is the last chunk, not fluid for the next unit).
  std::vector<std::pair<sim::Time, sim::Time>> pauses;
  std::size_t pause_head = 0;
  sim::Time wake_at = 0;         // the last departure a wake-up is scheduled for
  sim::Trace::TrackId track = Server::kNoTrack;
  sim::Time traced_until = 0;
  // A backlog of at least kNoBacklog ps, or changes still on their way to its head.
  static constexpr double kNoBacklog = 1.0;
  bool queued() const { return backlog >= kNoBacklog || pending_head < pending.size(); }
};

// Flow-level timing (SystemOptions::timing = flow): the chunk level's FIFO queues as a fluid.
//
// At the chunk level a source injects its chunks at its idle pace whatever happens downstream
// (buffers are unbounded), and every unit serves what reaches it in arrival order; a congested unit
// builds a backlog. Here a transfer is a flow whose source injects `cap` bytes per ps for `full` (the
// chunks but the last at the chunk level's pace), and every unit is a FIFO queue of fluid of
// capacity 1: while the flows arriving there offer it at most 1 and nothing is queued, each leaves at
// the rate it arrives; otherwise a backlog of `backlog` ps of work builds (or drains) and the unit
// serves at full rate, each flow in proportion to its rate at the time the bytes now at the head
// arrived (FIFO: a flow throttled upstream gets less, and a flow that starts behind a backlog waits
// for it). A change of a flow's arrival rate reaches the head after the work queued before it (an
// event then), and a flow's new leaving rate is the next unit's new arrival rate, at once (no time
// between units: the fixed delays are paid at the end). The source's stop carries a mark (`last`)
// unit to unit: when it leaves the last unit the fluid is through. Everything that happens at one
// simulated time is settled by one event after every other at that time (flows starting together
// cost one settlement).
//
// The last chunk goes through the queues as one piece (hop): behind each unit's backlog (and, at a
// link, the rest of the chunks its path's other transfers injected before it), cut-through to the
// next unit; a congested unit adds its work to the backlog and passes no fluid while serving it.
// Equal contenders then end a chunk apart in the order they started, as at the chunk level. The
// transfer lands the path's fixed delays after its last chunk leaves the last unit.
//
// Fast path: a flow whose units are all without backlog and stay at or below capacity with it
// starts without touching anyone and, if its path is still so when its source stops, lands the last
// chunk's idle time later (ring steps: one event at the stop, one at the landing, as on an idle path;
// through an L2 the chunk level times that last chunk).
//
// A message of one or two chunks is no flow: the chunk level times it (System::start_transfer asks
// by_chunks). Queued with others at a link, FIFO finishes such messages one after another; NCCL's
// plans are made of them; and one chunk of fluid beside a last chunk in one piece is where the fluid's
// spreading of a chunk over its chunk time misleads most (halving-doubling's and tree's small
// exchanges on torus8x8 were 15-25% off). They cost the chunk level one event per chunk per link.
// The two levels do not see each other's load.
//
// A latency-bound flow, one through an idle path in at most kLatencyBound (a barrier's token, a
// flag: bytes, not kilobytes), takes no part: it lands at its idle time and takes nothing from the
// others (the many-hop tokens of a dissemination barrier would otherwise touch every link).
class FlowEngine {
 public:
  static constexpr sim::Duration kLatencyBound = 1000;  // ps
  // Messages of at most this many chunks go through the chunk level (by_chunks).
  static constexpr std::uint64_t kByChunks = 2;
  explicit FlowEngine(System& sys);
  // Whether r goes through the chunk level instead: a message of at most kByChunks chunks that is not
  // latency-bound.
  bool by_chunks(const TransferRecord* r);
  // Starts r's flow now (the record is set up, r->first_inject <= now).
  void start(TransferRecord* r);
  // r's source has injected its last byte (current when `generation` matches).
  void stop(TransferRecord* r, std::uint32_t generation);
  // A latency-bound flow is through.
  void finish_unshared(TransferRecord* r);
  // r's last chunk reaches its leg `index` (an event at its head's arrival there).
  void hop_due(TransferRecord* r, std::uint32_t index, sim::Time tail);
  // r's last chunk has left its last unit.
  void packet_out(TransferRecord* r);
  // Unit e's backlog has a change at its head, or has drained: settle it at this time.
  void wake(FlowResource* e, std::uint32_t drain_gen, bool drain);
  // After a failed run: forgets every flow (their events are gone).
  void abandon();
  // System::evict_paths dropped paths: a new one may take an evicted one's address, so the memo of
  // the last long path's times is forgotten.
  void paths_evicted() { scratch_path_ = nullptr; }
  // Settles every unit whose arrivals or backlog head changed at this time (its own event, after
  // every other at this time).
  void settle();

 private:
  FlowResource& resource(PathUnit& u);
  // r's path's stage times for r's chunk, last chunk and wire scale (without an L2 hit): memoized on
  // a path of up to kMemoStages stages, worked out each time for a longer one (a barrier's many-hop
  // tokens: only the last one asked is kept, which a message's start asks again right after its
  // by_chunks()), so the memo adds at most 32 x kMemoStages bytes to a cached path. Valid until the next call.
  static constexpr std::size_t kMemoStages = 16;
  const Path::FlowTimes& times(const TransferRecord* r);
  // Flow r's arrival rate at its leg `index` is now `rate` (`last`: its last byte arrives, rate 0
  // from then on): taken in at this time's settlement.
  void arrive(TransferRecord* r, std::uint32_t index, double rate, bool last = false);
  void mark(FlowResource& e);
  // Takes e's arrivals and backlog to now and works out its flows' leaving rates.
  void settle_unit(FlowResource& e);
  // The fluid's last byte has left r's last unit: r leaves its units.
  void body_out(TransferRecord* r);
  // r is through (fluid and last chunk): it counts and lands (or hands its last chunk to the chunk level).
  void complete(TransferRecord* r);
  void settle_soon();
  // The last chunk at leg h.index now: it queues behind the unit's backlog (FIFO), adds its work to
  // it, and goes on to the next unit when it starts there (cut-through).
  struct Hop {
    TransferRecord* r;
    std::uint32_t index;
    sim::Time tail;  // when its last byte reaches the unit
  };
  void hop(const Hop& h);
  // The work of the chunks of r's path's other transfers whose heads reached link e before r's last
  // chunk's but whose fluid is still arriving (hop).
  double in_round(const FlowResource& e, const TransferRecord* r) const;
  // A last chunk going through the queues on a path through an L2: the L2 looks it up now.
  void look_up_last(TransferRecord* r);
  void add_leg(TransferRecord* r, FlowResource& e, double w);  // (merged where e already is one)
  void trace_flow(TransferRecord* r, std::uint64_t bytes);

  System* sys_;
  std::vector<FlowResource> res_;  // by UnitId, made on first use
  std::uint32_t leg_stamp_ = 0;    // start's: marks the resources of the flow being set up
  std::vector<FlowResource*> dirty_;  // units to settle at this time, in the order they changed
  std::vector<TransferRecord*> done_;  // flows whose fluid's last byte left at this settlement
  std::vector<Hop> hops_, hop_scratch_;  // last chunks reaching a unit at this time
  Path::FlowTimes times_scratch_;       // times() of a path too long to memoize: the last one asked
  const Path* scratch_path_ = nullptr;  // (a message's start asks right after its by_chunks())
  bool settle_due_ = false;             // its event is scheduled
  // Units marked for settling so far (odd: never a flow's `quiet`): a flow that started on the fast
  // path stops on it if none was marked since, with no look at its units.
  std::uint64_t marks_ = 1;
  double slack_ = 0;                    // settle_unit's margin for a changed rate (kSlack, or looser late in a settlement)
};

}  // namespace cubesim::hw
