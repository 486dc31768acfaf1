// dma.h — a PE's DMA engine: a read channel (into the TCM) and a write channel (out of it).
//
// The two channels run in parallel; each is a unit on the transfer paths between its TCM and any
// other memory. Requests on one channel serialize: a request's first chunk enters the channel only
// after the previous request's last chunk has (plus the per-request overhead); that ordering is
// the channel's `next_inject` cursor, which the transfer engine keeps. Requests are made with
// System::transfer between a TCM and any memory; the engine picks the channel by direction:
//
//   sys.transfer(sys.hbm(0).at(a_addr), pe.tcm().at(0), tile_bytes);   // read channel
//   sys.transfer(pe.tcm().at(c_off), sys.hbm(0).at(c_addr), c_bytes);   // write channel
#pragma once

#include "sim/hw/path_unit.h"
#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class DmaChannel final : public PathUnit {
 public:
  enum class Direction : std::uint8_t { read, write };  // read: into the TCM; write: out of it

  DmaChannel(int cube, int pe, Direction dir, sim::Bandwidth bandwidth)
      : PathUnit(dir == Direction::read ? UnitKind::dma_read : UnitKind::dma_write, UnitPlace{.cube = cube, .pe = pe},
                 Order::local),
        direction(dir) {
    server.bandwidth = bandwidth;
  }

  const Direction direction;
  Server server;
  Time next_inject = 0;  // the earliest a new request's first chunk may enter the channel

  // Books the chunk's bytes in the channel's gaps from the head's arrival on.
  Passage serve(const ChunkVisit& v) override {
    const sim::Duration d = server.duration(v.bytes);
    const auto [start, end] = server.book(v.forget_before, v.head + v.pre, d);
    server.account(v.bytes, d);
    if (v.trace) trace_chunk(v, server, kNoChannel, start, end, v.bytes);
    return {start + v.post, std::max(end, v.tail + v.pre) + v.post};
  }
  StageFigures figures() const override { return StageFigures::of(server.bandwidth); }
  void declare_tracks(sim::Trace& trace) override { trace.track(track_name(), track_group()); }
  std::string track_group() const override { return cube_name(place().cube); }
  std::string track_name() const override { return pe_name(place().pe) + suffix(direction); }

 private:
  static const char* suffix(Direction d) { return d == Direction::read ? ".dma.read" : ".dma.write"; }
  void count(UnitCounters& u) const override { count_server(server, u); }
  Server& flow_server() override { return server; }
};

struct DmaEngine {
  DmaEngine(int cube, int pe, const DmaSpec& s)
      : spec(s), read(cube, pe, DmaChannel::Direction::read, s.read), write(cube, pe, DmaChannel::Direction::write, s.write) {}
  DmaSpec spec;
  DmaChannel read;   // into the TCM
  DmaChannel write;  // out of the TCM
};

}  // namespace cubesim::hw
