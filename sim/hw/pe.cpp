#include "sim/hw/pe.h"

#include <fmt/format.h>


namespace cubesim::hw {

Pe::Pe(sim::Simulator& sim, int cube, int index, const PeSpec& spec, Memory& tcm)
    : sim_(&sim),
      cube_(cube),
      index_(index),
      name_(cube_pe_name(cube, index, {})),
      spec_(spec),
      tcm_(&tcm),
      dma_(cube, index, spec.dma),
      mac_(UnitKind::mac, spec.mac, cube, index),
      vector_(UnitKind::vector, spec.vector, cube, index) {}

sim::Time Pe::compute(std::uint64_t macs, DType d, std::string_view label) {
  return run_on(mac_, "Pe::compute()", macs, d, label);
}

sim::Time Pe::vector_op(std::uint64_t ops, DType d, std::string_view label) {
  return run_on(vector_, "Pe::vector_op()", ops, d, label);
}

sim::Time Pe::run_on(ComputeUnit& u, const char* call, std::uint64_t n, DType d, std::string_view label) {
  sim::Simulator& sim = *sim_;
  sim::Process& p = sim.require_process(call);
  sim::Trace& tr = sim.trace();
  const auto [start, end] = u.book(sim.now(), n, d, tr.enabled() ? &tr : nullptr, label);
  sim.sleep(p, end - sim.now());
  return end;
}

}  // namespace cubesim::hw
