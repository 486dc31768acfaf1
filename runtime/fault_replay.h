// fault_replay.h — fault specs (sim/hw/fault.h) replayed at the runtime's logical points, for
// backends without a simulated system (host, cuda): the same model and seed change the same bits of
// the same window of the operation's output, in device memory where the tensor lives.
//
// The points a backend reports (Backend::fault_point): a GEMM wrote its output (spec site
// `gemm_tile`: the whole output is the span, where the simulator corrupts one PE's tile of it), a
// collective's reduction step wrote its result (`reduce`), and a collective's result has arrived on
// a rank (`link`, with `link` -1: the bytes a link would have corrupted in flight, seen where they
// landed; the simulator corrupts one transfer's bytes). A spec's `cube` names a rank (-1: any)
// and `nth` counts that rank's matching operations (with -1: every rank's, together); the other sites (links, DMA, memory at rest)
// (a link by index, DMA, memory at rest) need a simulated system and are refused. A caller may stamp the records with a phase of its own
// per rank (the SDC model: the layer), since these backends keep no simulated time.
//
//   rt::FaultReplay& r = *ctx.backend().fault_replay();   // null on the sim backend (its injector)
//   r.add({.site = hw::FaultSite::gemm_tile, .cube = 1, .nth = 3, .seed = 7}, "fault", ctx.world_size());
//   ... run ...
//   for (const auto& rec : r.log()) fmt::print("{}\n", hw::describe(rec.fault));
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "sim/hw/fault.h"

namespace cubesim::rt {

class Tensor;

// Where a fault may strike in the runtime: after a GEMM wrote its output, after a reduction step,
// when a collective's result is complete on a rank.
enum class FaultPoint { gemm_output, reduce, collective_output };

class FaultReplay {
 public:
  struct Record {
    hw::FaultRecord fault;  // unit "rank1 GEMM output" / "rank1 reduction step" / "rank1 collective output";
                            // memory "rank1"; cube: the rank
    int rank = -1;
    int phase = -1;  // the rank's phase (set_phase) when it fired
  };

  // Checks the spec (site gemm_tile, reduce or link with link -1, cube -1 or a rank below `ranks`, no
  // time, the model's fields): hw::FaultError naming `where`.field and what would be valid.
  void add(const hw::FaultSpec& spec, std::string_view where, int ranks);
  void clear();  // drops every spec, the log and the phases
  bool armed() const { return armed_ > 0; }
  const std::vector<hw::FaultSpec>& specs() const { return specs_; }
  const std::vector<Record>& log() const { return log_; }
  std::vector<std::size_t> pending() const;  // specs that have not fired
  std::uint64_t seen(std::size_t i) const { return state_.at(i).seen; }
  void set_phase(int rank, int phase);

  // The backend's report: `t` (contiguous, on rank t.device()) was just written at point p.
  void on_point(FaultPoint p, const Tensor& t);

 private:
  struct Armed {
    bool fired = false;
    std::uint64_t seen = 0;
  };
  std::vector<hw::FaultSpec> specs_;
  std::vector<Armed> state_;
  std::vector<Record> log_;
  std::vector<int> phase_;
  std::size_t armed_ = 0;
};

}  // namespace cubesim::rt
