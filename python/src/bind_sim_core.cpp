// Python bindings of sim/core: simulated time helpers and the reference pipeline scenario.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common.h"
#include "sim/core/pipeline.h"
#include "sim/core/time.h"

namespace py = pybind11;
using namespace cubesim::sim;

namespace {

py::dict pipeline(const std::vector<double>& service_ns, int items, bool trace) {
  std::vector<Duration> service;
  for (double ns : service_ns) service.push_back(from_ns(ns));
  PipelineResult r;
  {
    py::gil_scoped_release release;  // the simulator never touches Python objects
    r = run_pipeline(service, items, trace);
  }
  py::dict out;
  out["sim_time_ps"] = r.sim_time;
  out["events"] = r.events;
  out["processes"] = r.processes;
  py::list tracks;
  for (const auto& s : r.tracks) tracks.append(cubesim::pyb::track_stats_dict(s));
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
  core.def("run_pipeline", &pipeline, py::arg("service_ns"), py::arg("items"), py::arg("trace") = false,
           "Simulates a pipeline of stages with one-slot buffers; returns simulated time, event count and "
           "per-track statistics. The GIL is released while it runs.");
}
