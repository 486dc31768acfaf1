// server.h — a FIFO server: one direction of a link, one DMA channel, one channel of a memory.
//
// A server is a bandwidth and a "busy until" time, nothing more: chunks are served in the order
// they reach it, each occupying it for bytes / bandwidth, and the next starts when it is free.
// Serving is arithmetic done inside the transfer engine's events, so a link costs no process and
// no event of its own. The statistics are kept whether or not tracing is on.
//
//   Server s{Bandwidth::GBps(128)};
//   Time start = std::max(arrival, s.free);  s.free = start + transfer_time(bytes, s.bandwidth);
#pragma once

#include <cstdint>
#include <limits>

#include "sim/core/time.h"
#include "sim/core/trace.h"

namespace cubesim::hw {

using sim::Time;

struct Server {
  static constexpr sim::Trace::TrackId kNoTrack = std::numeric_limits<sim::Trace::TrackId>::max();

  sim::Bandwidth bandwidth;
  Time free = 0;  // busy until

  // Statistics: bytes served, chunks served, time occupied.
  std::uint64_t bytes = 0;
  std::uint64_t chunks = 0;
  sim::Duration busy = 0;

  // Where spans go when tracing (created on the first traced span).
  sim::Trace::TrackId track = kNoTrack;

  void account(std::uint64_t b, Time start, Time end) {
    bytes += b;
    ++chunks;
    busy += end - start;
  }
  void reset_stats() {
    bytes = chunks = 0;
    busy = 0;
  }
};

}  // namespace cubesim::hw
