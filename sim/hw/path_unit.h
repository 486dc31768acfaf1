// path_unit.h — a unit that the chunks of a transfer pass: a memory, a DMA channel, a link.
//
// System cuts a transfer into chunks and sends each down the transfer's path, a chain of stages
// built from the topology (system.cpp, build_path); a stage is a PathUnit plus the fixed delays of
// that use of it (a memory read pays the read latency, a write is posted; a link leaving the switch
// adds the switch latency). The engine calls serve() once per chunk per stage, in the order the
// chunk passes them, and hands the chunk's departure on to the next stage (virtual cut-through:
// the head may move on before the tail has arrived).
//
//   Passage p = unit.serve({.transfer = 7, ..., .bytes = 65536, .head = t, .tail = t, .pre = lat});
//   // the chunk's first byte leaves at p.head, its last at p.tail
//
// Two orders of service (order()):
//   arrival  served by an event at the simulated time the chunk's head arrives: links, where flows
//            from different cubes meet and must be served in true arrival order;
//   local    served arithmetically inside the event that reaches it, possibly before the simulator
//            reaches the chunk's ready time (memories and DMA channels book their work ahead, in the
//            gaps of earlier bookings; see server.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "sim/core/time.h"
#include "sim/core/trace.h"
#include "sim/hw/region.h"
#include "sim/hw/server.h"
#include "sim/hw/transfer.h"
#include "sim/hw/unit.h"

namespace cubesim::hw {

// One chunk at one stage.
struct ChunkVisit {
  std::uint64_t transfer = 0;            // the transfer's id (trace spans are named "t<id>")
  const Unit* from = nullptr;            // the transfer's source and destination memories (trace args)
  const Unit* to = nullptr;
  std::uint64_t chunk = 0;               // the chunk's number in its transfer
  const Region* region = nullptr;        // the transfer's region in this stage's memory (memories)
  std::uint64_t offset = 0;              // the chunk's first byte, from the start of the transfer
  std::uint64_t bytes = 0;
  sim::Time head = 0;                    // when the chunk's first byte reaches the stage
  sim::Time tail = 0;                    // when its last byte does
  sim::Duration pre = 0;                 // the stage's fixed delay before the unit (latency, overhead)
  sim::Duration post = 0;                // and after it (wire latency)
  sim::Time forget_before = 0;           // bookings that end earlier are history: nothing is ready that early
  sim::Trace* trace = nullptr;           // non-null: record a span per piece of work
  bool read = false;                     // a memory stage that reads (the source side); else a write
};

// When the chunk's first and last byte leave the stage (post delay included).
struct Passage {
  sim::Time head = 0;
  sim::Time tail = 0;
};

class PathUnit : public Unit {
 public:
  enum class Order : std::uint8_t { arrival, local };

  PathUnit(UnitKind kind, UnitPlace place, Order order) : Unit(kind, place), order_(order) {}

  Order order() const { return order_; }
  // Serves one chunk (see the header comment). Counters are updated; a span is recorded when
  // v.trace is set.
  virtual Passage serve(const ChunkVisit& v) = 0;
  // The unit's figures for the alpha-beta model of a path (PathFigures): bandwidth of all channels
  // together, channel count and interleave. name and fixed are the stage's and left empty here.
  virtual StageFigures figures() const = 0;
  // Flow level (SystemOptions::timing): counts a whole transfer at once, on the server that stands
  // for the unit (flow_counters()): its bytes, the chunks it stands for, and the time it occupies the
  // unit at full rate (a memory counts it as striped over its channels).
  static void flow_account(Server& s, std::uint64_t bytes, std::uint64_t pieces, sim::Duration busy) {
    s.bytes += bytes;
    s.chunks += pieces;
    s.busy += busy;
  }
  // That server; it lives as long as the unit (the flow level keeps it per stage of a path).
  Server& flow_counters() { return flow_server(); }

 protected:
  virtual Server& flow_server() = 0;
  // Records a chunk's span [start, end) on server s's track (made on first use:
  // track_name_of(channel) in this unit's track group), clipped to start after the track's last
  // span: split bookings can overlap in [first, last], and a track's spans must not.
  void trace_chunk(const ChunkVisit& v, Server& s, std::uint64_t channel, sim::Time start, sim::Time end,
                   std::uint64_t bytes);
  // FIFO service on one server (links, switch ports): a chunk starts once its head has arrived plus
  // v.pre and the server is free, and cannot finish before its tail has arrived plus v.pre
  // (cut-through); it leaves v.post later. Counts it and records its span when tracing.
  Passage serve_fifo(Server& s, const ChunkVisit& v) {
    const sim::Time start = std::max(v.head + v.pre, s.free);
    const sim::Time end = std::max(start + s.duration(v.bytes), v.tail + v.pre);
    s.free = end;
    s.account(v.bytes, end - start);
    if (v.trace) trace_chunk(v, s, kNoChannel, start, end, v.bytes);
    return {start + v.post, end + v.post};
  }
  // The track of a server of the unit (a memory's channel; kNoChannel: the unit's own track).
  static constexpr std::uint64_t kNoChannel = ~std::uint64_t{0};
  virtual std::string track_name_of(std::uint64_t channel) const { return track_name(); }

 private:
  Order order_;
};

}  // namespace cubesim::hw
