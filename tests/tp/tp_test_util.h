// tp_test_util.h — the contexts the tp tests run on: the host, or mesh4x4 on the simulator with the
// uninitialized-read check on (a rank reading memory no one wrote fails the test).
#pragma once

#include <memory>

#include "runtime/context.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"

namespace cubesim::tp::tptest {

inline std::unique_ptr<rt::Context> make(bool sim, int world) {
  rt::ContextOptions o;
  o.world_size = world;
  o.stack_size = 128 * 1024;
  if (!sim) return std::make_unique<rt::Context>(o);
  return rt::make_sim_context(o, hw::load_topology("mesh4x4"), {.check_uninitialized = true});
}

}  // namespace cubesim::tp::tptest
