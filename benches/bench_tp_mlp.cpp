// bench_tp_mlp — simulated time of a tensor-parallel ParallelMLP step (forward + backward) on the
// shipped topologies: hidden 4096, ffn 14336, 4096 tokens, bf16, tp in {1, 2, 4, 8} (where the
// topology has that many cubes), with the compute/communication split and the simulator's wall
// time. Runs timing-only (no values: the simulated times equal a functional run's, which
// tests/runtime pins); --functional moves real values (use small sizes: --tokens/--hidden/--ffn).
//
//   bench_tp_mlp [--json FILE] [--quick] [--topology NAME] [--functional]
//                [--tokens N] [--hidden N] [--ffn N]
// JSON rows: topology, tp, sim_time_us, compute_us, comm_us, wall_s (+ tokens, hidden, ffn).
// compute_us and comm_us are rank 0's (collectives run async overlap compute, so they can sum to
// more than sim_time_us).
#include <string>
#include <vector>

#include "bench_util.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/mlp_step.h"

using namespace cubesim;
using namespace cubesim::bench;

int main(int argc, char** argv) {
  BenchArgs args = parse_bench_args(argc, argv, "bench_tp_mlp");
  std::vector<std::string> topologies;
  bool functional = false;
  std::int64_t tokens = 4096, hidden = 4096, ffn = 14336;
  for (std::size_t i = 0; i < args.rest.size(); ++i) {
    const std::string& a = args.rest[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= args.rest.size()) throw std::invalid_argument("bench_tp_mlp: " + a + " needs a value");
      return args.rest[++i];
    };
    if (a == "--topology") topologies.push_back(next());
    else if (a == "--functional") functional = true;
    else if (a == "--tokens") tokens = std::stoll(next());
    else if (a == "--hidden") hidden = std::stoll(next());
    else if (a == "--ffn") ffn = std::stoll(next());
    else {
      fmt::print(stderr, "bench_tp_mlp: unknown argument '{}' (valid: --json FILE, --quick, --topology NAME, "
                         "--functional, --tokens N, --hidden N, --ffn N)\n", a);
      return 2;
    }
  }
  if (args.quick) tokens = std::min<std::int64_t>(tokens, 512);
  if (topologies.empty()) topologies = {"single_cube", "ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8"};
  Table t({"topology", "tp", "sim_time_us", "compute_us", "comm_us", "comm %", "wall_s"});
  nlohmann::json out = {{"bench", "bench_tp_mlp"}, {"functional", functional}, {"rows", nlohmann::json::array()}};
  for (const auto& topo : topologies) {
    for (int tp : {1, 2, 4, 8}) {
      rt::ContextOptions o;
      o.world_size = tp;
      std::unique_ptr<rt::Context> ctx;
      try {
        ctx = rt::make_sim_context(o, hw::load_topology(topo), {.timing_only = !functional});
      } catch (const std::exception& e) {  // fewer cubes than tp
        continue;
      }
      tp::MlpStepOptions so{
          .mlp = {.hidden = hidden, .ffn = ffn, .dtype = DType::bf16, .seed = 7},
          .tokens = tokens,
          .tp = tp,
          .inputs_first = true};
      if (functional) {  // the same cheap pattern for x and dy: this bench measures time, not numerics
        so.x.resize(static_cast<std::size_t>(tokens * hidden));
        for (std::size_t i = 0; i < so.x.size(); ++i) so.x[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        so.dy = so.x;
      }
      const rt::RunReport rep = tp::run_mlp_step(*ctx, so).report;
      const auto& r0 = rep.ranks.at(0);
      const double sim_us = sim::to_us(rep.sim_time), comp = sim::to_us(r0.compute), comm = sim::to_us(r0.comm);
      t.row({topo, std::to_string(tp), fmt::format("{:.1f}", sim_us), fmt::format("{:.1f}", comp), fmt::format("{:.1f}", comm),
             fmt::format("{:.1f}", sim_us > 0 ? 100 * comm / sim_us : 0), fmt::format("{:.3f}", rep.wall_s)});
      out["rows"].push_back({{"topology", topo}, {"tp", tp}, {"sim_time_us", sim_us}, {"compute_us", comp}, {"comm_us", comm},
                             {"wall_s", rep.wall_s}, {"tokens", tokens}, {"hidden", hidden}, {"ffn", ffn}});
    }
  }
  t.print();
  write_json(args, out);
  return 0;
}
