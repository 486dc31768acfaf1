// Python bindings of sim/core: simulated time helpers and a small scenario runner.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common.h"
#include "sim/core/barrier.h"
#include "sim/core/event.h"
#include "sim/core/resource.h"
#include "sim/core/simulator.h"
#include "sim/core/time.h"

namespace py = pybind11;
using namespace cubesim::sim;

namespace {

// A pipeline of `stages` processes handing `items` tokens along through one-slot buffers, each
// stage holding a token for its service time: a scenario whose simulated time has a closed form
// (fill + steady state), used to check the module end to end.
py::dict run_pipeline(std::vector<double> service_ns, int items, bool trace) {
  if (service_ns.empty()) throw std::invalid_argument("run_pipeline: service_ns must name at least one stage");
  if (items < 1) throw std::invalid_argument("run_pipeline: items must be at least 1, got " + std::to_string(items));
  SimulatorOptions opts;
  opts.trace = trace;
  Simulator sim(opts);
  const std::size_t n = service_ns.size();
  std::vector<std::unique_ptr<Resource>> slots;  // slot i: tokens waiting between stage i-1 and i
  std::vector<std::unique_ptr<Resource>> space;  // free places in slot i
  for (std::size_t i = 0; i <= n; ++i) {
    slots.push_back(std::make_unique<Resource>(1, "slot" + std::to_string(i)));
    space.push_back(std::make_unique<Resource>(1, "space" + std::to_string(i)));
  }
  {
    py::gil_scoped_release release;  // the simulator never touches Python objects
    for (std::size_t i = 0; i <= n; ++i) {
      sim.spawn("init", [&, i] { slots[i]->acquire(); });  // slots start empty
    }
    for (std::size_t s = 0; s < n; ++s) {
      sim.spawn("stage" + std::to_string(s), [&, s] {
        const auto track = sim.trace().track("stage" + std::to_string(s), "pipeline");
        const Duration d = from_ns(service_ns[s]);
        for (int k = 0; k < items; ++k) {
          if (s > 0) slots[s]->acquire();  // a token from the previous stage
          if (s > 0) space[s]->release();
          const Time t0 = sim.now();
          this_process::sleep(d);
          sim.trace().span(track, "item", t0, sim.now(), {{"item", k}});
          space[s + 1]->acquire();  // room downstream
          slots[s + 1]->release();
        }
      });
    }
    sim.spawn("sink", [&] {
      for (int k = 0; k < items; ++k) {
        slots[n]->acquire();
        space[n]->release();
      }
    });
    sim.run();
  }
  py::dict out;
  out["sim_time_ps"] = sim.now();
  out["events"] = sim.events_executed();
  out["processes"] = sim.processes_spawned();
  py::list tracks;
  for (const auto& s : sim.trace().stats()) tracks.append(cubesim::pyb::track_stats_dict(s));
  out["tracks"] = tracks;
  return out;
}

}  // namespace

void bind_sim_core(py::module_& m) {
  auto core = m.def_submodule("core", "sim/core: simulated time (integer picoseconds) and scheduling");
  core.def("format_time", &format_time, py::arg("ps"), "Formats picoseconds as '1.250 us'.");
  core.def(
      "transfer_time_ps",
      [](std::uint64_t bytes, double gbps) { return transfer_time(bytes, Bandwidth::GBps(gbps)); },
      py::arg("bytes"), py::arg("bandwidth_GBps"),
      "Picoseconds to move `bytes` at `bandwidth_GBps` (1 GB/s = 1e9 B/s): ceil(bytes * 1e12 / B/s).");
  core.def("from_ns", &from_ns, py::arg("ns"), "Nanoseconds (float) to integer picoseconds, rounded.");
  core.def("run_pipeline", &run_pipeline, py::arg("service_ns"), py::arg("items"), py::arg("trace") = false,
           "Simulates a pipeline of stages with one-slot buffers; returns simulated time, event count and "
           "per-track statistics. The GIL is released while it runs.");
}
