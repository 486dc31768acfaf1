// compute_unit.h — a MAC array or a vector unit: a rate per dtype at a clock, serving in FIFO order.
//
// Time for n operations is ceil(n / rate) cycles at the unit's clock, rounded up to a picosecond.
// Work submitted to one unit runs one piece after another in submission order (the unit is busy
// until the previous piece ends); Pe::compute() blocks the calling process until its piece is done.
// A compute unit is a Unit: it counts operations, pieces and busy time (System::usage()).
//
//   ComputeUnit mac(UnitKind::mac, spec.pe.mac, 0, 3);      // cube 0, PE 3: "cube0.pe3.mac"
//   Duration d = mac.time(128 * 128 * 64, DType::bf16);     // one tile's MACs
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "base/dtype.h"
#include "sim/core/time.h"
#include "sim/hw/server.h"
#include "sim/hw/topology.h"
#include "sim/hw/unit.h"

namespace cubesim::hw {

class ComputeUnit final : public Unit {
 public:
  // kind: UnitKind::mac or UnitKind::vector.
  ComputeUnit(UnitKind kind, RateSpec spec, int cube, int pe)
      : Unit(kind, UnitPlace{.cube = cube, .pe = pe}), spec_(spec) {}

  const RateSpec& spec() const { return spec_; }
  bool supports(DType d) const { return spec_.rate(d) > 0; }

  // Cycles for n operations; throws std::invalid_argument if the unit has no rate for d.
  std::uint64_t cycles(std::uint64_t n, DType d) const {
    const double r = spec_.rate(d);
    if (!(r > 0)) {
      std::string have;
      for (DType x : kAllDTypes) {
        if (supports(x)) have += fmt::format("{}{}", have.empty() ? "" : ", ", dtype_name(x));
      }
      throw std::invalid_argument(fmt::format("{}: no rate for dtype {} in the topology; this unit supports {}", name(),
                                              dtype_name(d), have));
    }
    if (r == std::floor(r) && r < 9e15) {
      const auto ri = static_cast<std::uint64_t>(r);
      return n / ri + (n % ri != 0);
    }
    // Saturate: a count past 2^64 (a rate below what the loader accepts, kMinPerCycle) becomes the
    // largest count, whose time overflows loudly in transfer_time; never a wrapped, shorter count.
    const double q = std::ceil(static_cast<double>(n) / r);
    if (!(q < 18446744073709551616.0)) return std::numeric_limits<std::uint64_t>::max();
    return static_cast<std::uint64_t>(q);
  }
  sim::Duration time(std::uint64_t n, DType d) const {
    return sim::transfer_time(cycles(n, d), sim::Bandwidth{spec_.clock_hz});  // cycles at clock_hz per second
  }

  // Books n operations starting no earlier than `now`; returns {start, end}. With a trace, records
  // the piece as a span named `label`.
  std::pair<Time, Time> book(Time now, std::uint64_t n, DType d, sim::Trace* trace = nullptr,
                             std::string_view label = {}) {
    return book_cycles(now, n, d, cycles(n, d), trace, label);
  }
  // The same for a piece that occupies the unit `cycles` cycles (a pipeline whose issue figures make
  // it slower than n / rate: kernels/sim_pe_gemm.h).
  std::pair<Time, Time> book_cycles(Time now, std::uint64_t n, DType d, std::uint64_t cycles, sim::Trace* trace = nullptr,
                                    std::string_view label = {}) {
    const Time start = std::max(now, server_.free);
    const Time end = start + sim::transfer_time(cycles, sim::Bandwidth{spec_.clock_hz});
    server_.free = end;
    server_.account(n, end - start);
    if (trace) {
      if (server_.track == Server::kNoTrack) server_.track = trace->track(track_name(), track_group());
      trace->span(server_.track, label, start, end, {{"ops", n}, {"dtype", std::string(dtype_name(d))}});
    }
    return {start, end};
  }
  Server& server() { return server_; }
  const Server& server() const { return server_; }
  void declare_tracks(sim::Trace& trace) override { trace.track(track_name(), track_group()); }
  std::string track_group() const override { return cube_name(place().cube); }
  std::string track_name() const override { return pe_name(place().pe) + "." + std::string(unit_kind_name(kind())); }

 private:
  void count(UnitCounters& u) const override { count_server(server_, u); }
  RateSpec spec_;
  Server server_;  // bytes field counts operations here
};

}  // namespace cubesim::hw
