// barrier.h — a reusable barrier for n processes.
//
// The n-th arrival releases all waiters (in arrival order) and the barrier resets for the next
// round. The last arriver does not block.
//
//   Barrier step(4, "step");
//   for (int r = 0; r < 4; ++r) sim.spawn(fmt::format("rank{}", r), [&] { ...; step.arrive_and_wait(); });
#pragma once

#include <cstdint>
#include <string>

#include "sim/core/waiter.h"

namespace cubesim::sim {

class Barrier {
 public:
  explicit Barrier(std::size_t n, std::string name = "barrier");
  Barrier(const Barrier&) = delete;
  Barrier& operator=(const Barrier&) = delete;

  void arrive_and_wait();
  std::size_t parties() const { return n_; }
  std::size_t arrived() const { return arrived_; }
  std::uint64_t generation() const { return generation_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::size_t n_;
  std::size_t arrived_ = 0;
  std::uint64_t generation_ = 0;
  WaiterList waiters_;
};

}  // namespace cubesim::sim
