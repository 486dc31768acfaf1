// pipeline.h — a reference scenario whose simulated time has a closed form: stages handing items
// along through one-slot buffers.
//
// `stages` processes pass `items` tokens down a line; stage s holds each token for service[s]
// before handing it on, and a stage blocks while the slot downstream is full. With a sink that
// never blocks, the slowest stage sets the pace:
//     time = sum(service) + (items - 1) * max(service)
// which checks the scheduler (processes, resources, sleeps, the trace's statistics) end to end.
//
//   PipelineResult r = run_pipeline({ns(3), ns(7), ns(2)}, 25);
//   // r.sim_time == 12 ns + 24 * 7 ns; r.tracks[s].busy == service[s] * items
#pragma once

#include <cstdint>
#include <vector>

#include "sim/core/time.h"
#include "sim/core/trace.h"

namespace cubesim::sim {

struct PipelineResult {
  Time sim_time = 0;
  std::uint64_t events = 0;
  std::uint64_t processes = 0;
  std::vector<Trace::TrackStats> tracks;  // one per stage ("stage0", ... in group "pipeline")
};

// Throws std::invalid_argument for no stages or items < 1.
PipelineResult run_pipeline(const std::vector<Duration>& service, int items, bool trace = false);

}  // namespace cubesim::sim
