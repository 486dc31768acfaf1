#include "sim/hw/pe.h"

#include <fmt/format.h>

#include "sim/hw/system.h"

namespace cubesim::hw {

Pe::Pe(System& sys, int cube, int index, const PeSpec& spec, Memory& tcm)
    : sys_(&sys),
      cube_(cube),
      index_(index),
      name_(fmt::format("cube{}.pe{}", cube, index)),
      spec_(spec),
      tcm_(&tcm),
      mac_(spec.mac, name_ + ".mac"),
      vector_(spec.vector, name_ + ".vector") {
  dma_.spec = spec.dma;
  dma_.read.server.bandwidth = spec.dma.read;
  dma_.write.server.bandwidth = spec.dma.write;
}

sim::Time Pe::compute(std::uint64_t macs, DType d, std::string_view label) {
  return run_on(mac_, "mac", macs, d, label);
}

sim::Time Pe::vector_op(std::uint64_t ops, DType d, std::string_view label) {
  return run_on(vector_, "vector", ops, d, label);
}

sim::Time Pe::run_on(ComputeUnit& u, const char* track, std::uint64_t n, DType d, std::string_view label) {
  sim::Simulator& sim = sys_->simulator();
  sim::Process& p = sim.require_process(track[0] == 'm' ? "Pe::compute()" : "Pe::vector_op()");
  const auto [start, end] = u.book(sim.now(), n, d);
  sim::Trace& tr = sim.trace();
  if (tr.enabled()) {
    Server& s = u.server();
    if (s.track == Server::kNoTrack) s.track = tr.track(fmt::format("pe{}.{}", index_, track), fmt::format("cube{}", cube_));
    tr.span(s.track, label, start, end, {{"ops", n}, {"dtype", std::string(dtype_name(d))}});
  }
  sim.sleep(p, end - sim.now());
  return end;
}

}  // namespace cubesim::hw
