// link.h — one direction of a link between two nodes (cubes, the switch, the host).
//
// A link is a FIFO server (bandwidth per direction) with two fixed delays: `overhead` before a
// chunk enters it (the port/router's per-hop processing; a link leaving the switch adds the switch
// latency here) and `latency` after it leaves (flight time). Neither delay occupies the link, so
// large messages reach the full bandwidth while small ones pay overhead + latency per hop. The
// host link (PCIe-like) is a Link between kHostNode and a cube. A link is a unit on the transfer
// paths that cross it, served in true arrival order (flows from different cubes meet there).
//
//   const Link& l = sys.link(sys.route(0, 5)[0]);
//   fmt::print("{}: {} bytes, busy {}\n", l.name(), l.server().bytes, format_time(l.server().busy));
#pragma once

#include <string>

#include "sim/hw/path_unit.h"
#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class Link final : public PathUnit {
 public:
  Link(int index, const LinkSpec& spec, sim::Duration extra_overhead)
      : PathUnit(UnitKind::link, UnitPlace{.from = spec.from, .to = spec.to}, Order::arrival),
        index_(index),
        spec_(spec),
        pre_(spec.figures.overhead + extra_overhead) {
    server_.bandwidth = spec.figures.bandwidth;
  }
  int index() const { return index_; }  // in Topology::links and System::link(i)
  int from() const { return spec_.from; }  // cube id, kSwitchNode or kHostNode
  int to() const { return spec_.to; }
  const LinkSpec& spec() const { return spec_; }
  sim::Bandwidth bandwidth() const { return spec_.figures.bandwidth; }
  sim::Duration latency() const { return spec_.figures.latency; }
  // Overhead charged before a chunk enters: the port overhead, plus the switch latency on links
  // leaving the switch.
  sim::Duration entry_delay() const { return pre_; }
  Server& server() { return server_; }
  const Server& server() const { return server_; }

  // FIFO: a chunk starts once its head has arrived (plus the entry delay) and the link is free, and
  // cannot finish before its tail has arrived (cut-through).
  Passage serve(const ChunkVisit& v) override {
    return serve_fifo(server_, v);
  }
  StageFigures figures() const override { return StageFigures::of(spec_.figures.bandwidth); }
  void declare_tracks(sim::Trace& trace) override { trace.track(track_name(), track_group()); }
  std::string track_group() const override { return "links"; }
  std::string track_name() const override { return name(); }

 private:
  void count(UnitCounters& u) const override { count_server(server_, u); }
  Server& flow_server() override { return server_; }
  int index_;
  LinkSpec spec_;
  sim::Duration pre_;
  Server server_;
};

}  // namespace cubesim::hw
