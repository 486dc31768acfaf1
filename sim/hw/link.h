// link.h — one direction of a link between two nodes (cubes, the switch, the host).
//
// A link is a FIFO server (bandwidth per direction) with two fixed delays: `overhead` before a
// chunk enters it (the port/router's per-hop processing; a link leaving the switch adds the switch
// latency here) and `latency` after it leaves (flight time). Neither delay occupies the link, so
// large messages reach the full bandwidth while small ones pay overhead + latency per hop. The
// host link (PCIe-like) is a Link between kHostNode and a cube.
//
//   const Link& l = sys.link(sys.route(0, 5)[0]);
//   fmt::print("{}: {} bytes, busy {}\n", l.name(), l.server().bytes, format_time(l.server().busy));
#pragma once

#include <string>

#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class Link {
 public:
  Link(int id, const LinkSpec& spec, sim::Duration extra_overhead)
      : id_(id), spec_(spec), pre_(spec.figures.overhead + extra_overhead) {
    server_.bandwidth = spec.figures.bandwidth;
  }
  int id() const { return id_; }
  int from() const { return spec_.from; }  // cube id, kSwitchNode or kHostNode
  int to() const { return spec_.to; }
  const std::string& name() const { return spec_.name; }  // "c0->c1"
  const LinkFigures& figures() const { return spec_.figures; }
  sim::Bandwidth bandwidth() const { return spec_.figures.bandwidth; }
  sim::Duration latency() const { return spec_.figures.latency; }
  // Overhead charged before a chunk enters: the port overhead, plus the switch latency on links
  // leaving the switch.
  sim::Duration entry_delay() const { return pre_; }
  Server& server() { return server_; }
  const Server& server() const { return server_; }

 private:
  int id_;
  LinkSpec spec_;
  sim::Duration pre_;
  Server server_;
};

}  // namespace cubesim::hw
