// switch_port.h — one direction of a switch's ports facing one cube (network kind "switch" with a
// "port" section): the ports a cube's links land on, as a unit of their own.
//
// A cube with links_per_cube links to the switch meets it on as many switch ports; traffic is
// striped over all of them (NVSwitch spreads a GPU's traffic over every link and every switch chip),
// so the ports act as one FIFO server of links_per_cube x port bandwidth per direction. Each cube
// has an in port group (cube -> switch: everything the cube sends) and an out port group
// (switch -> cube: everything it receives). A transfer c -> d passes link c->sw, c's in ports,
// d's out ports, link sw->d: several senders into one cube share its out ports, several peers of
// one sender share its in ports. The switch latency stays on the link leaving the switch; ports add
// no delay of their own (cut-through: a port as fast as its link costs no time).
//
//   const SwitchPort& p = sys.switch_port(3, /*in=*/false);   // switch -> cube 3
//   fmt::print("{}: {} bytes\n", p.name(), p.server().bytes);  // "switch.port sw->c3: ..."
#pragma once

#include <string>

#include "sim/hw/path_unit.h"
#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class SwitchPort final : public PathUnit {
 public:
  // `in`: the ports that receive from cube `cube`; else those that send to it.
  SwitchPort(int cube, bool in, sim::Bandwidth bandwidth)
      : PathUnit(UnitKind::switch_port,
                 UnitPlace{.from = in ? cube : kSwitchNode, .to = in ? kSwitchNode : cube}, Order::arrival),
        cube_(cube),
        in_(in) {
    server_.bandwidth = bandwidth;
  }
  int cube() const { return cube_; }
  bool in() const { return in_; }
  sim::Bandwidth bandwidth() const { return server_.bandwidth; }
  Server& server() { return server_; }
  const Server& server() const { return server_; }

  // FIFO, cut-through, as a link without delays.
  Passage serve(const ChunkVisit& v) override {
    return serve_fifo(server_, v);
  }
  StageFigures figures() const override { return StageFigures::of(server_.bandwidth); }
  void declare_tracks(sim::Trace& trace) override { trace.track(track_name(), track_group()); }
  std::string track_group() const override { return "switch"; }
  std::string track_name() const override { return name(); }

 private:
  void count(UnitCounters& u) const override { count_server(server_, u); }
  Server& flow_server() override { return server_; }
  int cube_;
  bool in_;
  Server server_;
};

}  // namespace cubesim::hw
