// cubesim_demo — a small simulated scenario on sim/core (issue 2's main job; issue 7 replaces it
// with `cubesim run`). Four PEs stream tiles from one shared HBM port, compute, and meet at a
// barrier each step; a reducer waits for all of them. Prints what ran and the simulated time.
//
//   cubesim_demo [--trace FILE]
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sim/core/barrier.h"
#include "sim/core/event.h"
#include "sim/core/resource.h"
#include "sim/core/simulator.h"

using namespace cubesim::sim;

int main(int argc, char** argv) {
  std::string trace_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--trace" && i + 1 < argc) {
      trace_path = argv[++i];
    } else {
      fmt::print(stderr, "usage: cubesim_demo [--trace FILE]\n(unknown argument '{}')\n", a);
      return 2;
    }
  }
  constexpr int kPes = 4, kSteps = 3;
  constexpr std::uint64_t kTileBytes = 256 * 1024;
  const Bandwidth hbm_bw = Bandwidth::GBps(512);   // one port shared by the PEs: they contend
  const Duration compute = from_ns(400);           // per tile

  SimulatorOptions opts;
  opts.trace = !trace_path.empty();
  Simulator sim(opts);
  Trace& tr = sim.trace();
  Resource hbm_port(1, "hbm.port");
  Barrier step(kPes, "step");
  std::vector<std::unique_ptr<Event>> done;
  for (int p = 0; p < kPes; ++p) done.push_back(std::make_unique<Event>(fmt::format("pe{}.done", p)));

  for (int p = 0; p < kPes; ++p) {
    sim.spawn(fmt::format("pe{}", p), [&, p] {
      const auto dma = tr.track(fmt::format("pe{}.dma", p), "cube0");
      const auto mac = tr.track(fmt::format("pe{}.mac", p), "cube0");
      for (int s = 0; s < kSteps; ++s) {
        hbm_port.acquire();
        const Time t0 = sim.now();
        this_process::sleep(transfer_time(kTileBytes, hbm_bw));
        hbm_port.release();
        tr.span(dma, "load tile", t0, sim.now(), {{"bytes", kTileBytes}, {"step", s}});
        const Time t1 = sim.now();
        this_process::sleep(compute);
        tr.span(mac, "compute", t1, sim.now(), {{"step", s}});
        step.arrive_and_wait();
      }
      done[p]->trigger();
    });
  }
  Time reduced_at = 0;
  sim.spawn("reducer", [&] {
    for (auto& e : done) e->wait();
    reduced_at = sim.now();
  });
  sim.run();

  fmt::print("cubesim demo: {} PEs x {} steps, {} KiB tiles over one shared HBM port at {} GB/s\n", kPes, kSteps,
             kTileBytes / 1024, hbm_bw.gbps());
  fmt::print("{:<10} {:>10} {:>14} {:>14}\n", "track", "spans", "busy", "busy %");
  for (const auto& s : tr.stats()) {
    fmt::print("{:<10} {:>10} {:>14} {:>13.1f}%\n", s.name, s.spans, format_time(s.busy),
               100.0 * static_cast<double>(s.busy) / static_cast<double>(sim.now()));
  }
  fmt::print("reducer saw all PEs done at {}\n", format_time(reduced_at));
  fmt::print("simulated time: {}  ({} events, {} processes)\n", format_time(sim.now()), sim.events_executed(),
             sim.processes_spawned());
  if (!trace_path.empty()) {
    tr.save(trace_path);
    fmt::print("trace: {} (open in ui.perfetto.dev)\n", trace_path);
  }
  return 0;
}
