// dma.h — a PE's DMA engine: a read channel (into the TCM) and a write channel (out of it).
//
// The two channels run in parallel; requests on one channel serialize: a request's first chunk
// enters the channel only after the previous request's last chunk has (plus the per-request
// overhead). That ordering is the channel's `next_inject` cursor. Requests are made with
// System::transfer between a TCM and any memory; the engine picks the channel by direction:
//
//   sys.transfer(sys.hbm(0).at(a_addr), pe.tcm().at(0), tile_bytes);   // read channel
//   sys.transfer(pe.tcm().at(c_off), sys.hbm(0).at(c_addr), c_bytes);   // write channel
#pragma once

#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

struct DmaChannel {
  Server server;
  Time next_inject = 0;  // the earliest a new request's first chunk may enter the channel
};

struct DmaEngine {
  DmaSpec spec;
  DmaChannel read;   // into the TCM
  DmaChannel write;  // out of the TCM
};

}  // namespace cubesim::hw
