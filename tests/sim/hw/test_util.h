// test_util.h — helpers shared by the sim/hw tests: small topologies, running one process, random
// bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/core/simulator.h"
#include "sim/hw/system.h"
#include "sim/hw/topology.h"

namespace cubesim::hw::testing {

// n random bytes from a seeded generator (never a constant fill).
inline std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

// A complete, valid document with round figures, for tests to mutate.
inline nlohmann::json small_doc() {
  return nlohmann::json::parse(R"({
    "name": "small",
    "description": "test system",
    "sources": ["test figures"],
    "cube": {
      "pes": 2,
      "hbm": {"capacity_MiB": 64, "bandwidth_GBps": 1000, "latency_ns": 100, "channels": 4, "interleave_bytes": 256},
      "pe": {
        "clock_GHz": 1.0,
        "tcm": {"capacity_KiB": 256, "bandwidth_GBps": 500, "latency_ns": 2},
        "dma": {"read_GBps": 250, "write_GBps": 250, "chunk_bytes": 4096, "overhead_ns": 10},
        "mac": {"macs_per_cycle": {"f32": 256, "bf16": 1024}},
        "vector": {"ops_per_cycle": {"f32": 64}},
        "tile": {"m": 64, "n": 64, "k": 64}
      }
    },
    "cubes": 4,
    "network": {"kind": "ring", "chunk_bytes": 65536,
                "link": {"bandwidth_GBps": 100, "latency_ns": 20, "overhead_ns": 5}}
  })");
}

inline Topology small_topology() { return topology_from_json(small_doc(), "small"); }

// Runs fn as one process to the end of the simulation.
inline void run_process(sim::Simulator& sim, std::function<void()> fn, std::string name = "test") {
  sim.spawn(std::move(name), std::move(fn));
  sim.run();
}

}  // namespace cubesim::hw::testing
