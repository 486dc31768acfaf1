#include "sim/core/pipeline.h"

#include <memory>
#include <stdexcept>
#include <string>

#include "sim/core/resource.h"
#include "sim/core/simulator.h"

namespace cubesim::sim {

PipelineResult run_pipeline(const std::vector<Duration>& service, int items, bool trace) {
  if (service.empty()) throw std::invalid_argument("run_pipeline: service_ns must name at least one stage");
  if (items < 1) throw std::invalid_argument("run_pipeline: items must be at least 1, got " + std::to_string(items));
  SimulatorOptions opts;
  opts.trace = trace;
  Simulator sim(opts);
  const std::size_t n = service.size();
  std::vector<std::unique_ptr<Resource>> slots;  // slot i: tokens waiting between stage i-1 and i
  std::vector<std::unique_ptr<Resource>> space;  // free places in slot i
  for (std::size_t i = 0; i <= n; ++i) {
    slots.push_back(std::make_unique<Resource>(1, "slot" + std::to_string(i)));
    space.push_back(std::make_unique<Resource>(1, "space" + std::to_string(i)));
  }
  for (std::size_t i = 0; i <= n; ++i) {
    sim.spawn("init", [&, i] { slots[i]->acquire(); });  // slots start empty
  }
  for (std::size_t s = 0; s < n; ++s) {
    sim.spawn("stage" + std::to_string(s), [&, s] {
      const auto track = sim.trace().track("stage" + std::to_string(s), "pipeline");
      for (int k = 0; k < items; ++k) {
        if (s > 0) slots[s]->acquire();  // a token from the previous stage
        if (s > 0) space[s]->release();
        const Time t0 = sim.now();
        this_process::sleep(service[s]);
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
  return PipelineResult{.sim_time = sim.now(),
                        .events = sim.events_executed(),
                        .processes = sim.processes_spawned(),
                        .tracks = sim.trace().stats()};
}

}  // namespace cubesim::sim
