// compute_unit.h — a MAC array or a vector unit: a rate per dtype at a clock, serving in FIFO order.
//
// Time for n operations is ceil(n / rate) cycles at the unit's clock, rounded up to a picosecond.
// Work submitted to one unit runs one piece after another in submission order (the unit is busy
// until the previous piece ends); Pe::compute() blocks the calling process until its piece is done.
//
//   ComputeUnit mac(spec.pe.mac, "cube0.pe3.mac");
//   Duration d = mac.time(128 * 128 * 64, DType::bf16);   // one tile's MACs
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "sim/core/time.h"
#include "base/dtype.h"
#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class ComputeUnit {
 public:
  ComputeUnit(RateSpec spec, std::string name) : spec_(spec), name_(std::move(name)) {}

  const RateSpec& spec() const { return spec_; }
  const std::string& name() const { return name_; }
  bool supports(DType d) const { return spec_.rate(d) > 0; }

  // Cycles for n operations; throws std::invalid_argument if the unit has no rate for d.
  std::uint64_t cycles(std::uint64_t n, DType d) const {
    const double r = spec_.rate(d);
    if (!(r > 0)) {
      std::string have;
      for (DType x : kAllDTypes) {
        if (supports(x)) have += fmt::format("{}{}", have.empty() ? "" : ", ", dtype_name(x));
      }
      throw std::invalid_argument(fmt::format("{}: no rate for dtype {} in the topology; this unit supports {}", name_,
                                              dtype_name(d), have));
    }
    if (r == std::floor(r) && r < 9e15) {
      const auto ri = static_cast<std::uint64_t>(r);
      return n / ri + (n % ri != 0);
    }
    return static_cast<std::uint64_t>(std::ceil(static_cast<double>(n) / r));
  }
  sim::Duration time(std::uint64_t n, DType d) const {
    return sim::transfer_time(cycles(n, d), sim::Bandwidth{spec_.clock_hz});  // cycles at clock_hz per second
  }

  // Books n operations starting no earlier than `now`; returns {start, end}.
  std::pair<Time, Time> book(Time now, std::uint64_t n, DType d) {
    const Time start = std::max(now, server_.free);
    const Time end = start + time(n, d);
    server_.free = end;
    server_.account(n, end - start);
    return {start, end};
  }
  Server& server() { return server_; }
  const Server& server() const { return server_; }

 private:
  RateSpec spec_;
  std::string name_;
  Server server_;  // bytes field counts operations here
};

}  // namespace cubesim::hw
