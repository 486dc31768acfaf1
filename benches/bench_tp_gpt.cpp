// bench_tp_gpt — simulated time of a tensor-parallel transformer layer step (forward + backward) on the
// shipped topologies: a Llama-like layer (hidden 4096, 32 heads, 8 KV heads, ffn 14336, RMSNorm, no
// bias, rotary embeddings, SwiGLU MLP, sequence 4096, bf16; --gelu for a GELU MLP), tp in {1, 2, 4, 8} where the
// topology has that many cubes, with the compute/communication split and the simulator's wall time.
// Timing-only (no values; the simulated times equal a functional run's, which the tests pin);
// --functional moves real values (use small sizes). Attention runs as tiles on the PEs
// (kernels/sim_pe_attention.h), as the GEMMs do.
//
//   bench_tp_gpt [--json FILE] [--quick] [--topology NAME] [--functional] [--gelu] [--ops] [--seq N] [--batch N]
//                [--hidden N] [--heads N] [--kv-heads N] [--ffn N]
// JSON rows: topology, tp, sim_time_us, compute_us, comm_us, wall_s, events (+ the sizes), ops: rank 0's
// compute per op name in us (--ops also prints them: GEMMs by layer role, attention, norms, ...).
#include <algorithm>
#include <string>
#include <vector>

#include "bench_util.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/transformer_step.h"

using namespace cubesim;
using namespace cubesim::bench;

int main(int argc, char** argv) {
  BenchArgs args = parse_bench_args(argc, argv, "bench_tp_gpt");
  std::vector<std::string> topologies;
  bool functional = false, swiglu = true, ops = false;
  std::int64_t seq = 4096, batch = 1, hidden = 4096, heads = 32, kv_heads = 8, ffn = 14336;
  try {
    for (std::size_t i = 0; i < args.rest.size(); ++i) {
      const std::string& a = args.rest[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= args.rest.size()) throw std::invalid_argument(a + " needs a value");
        return args.rest[++i];
      };
      if (a == "--topology") topologies.push_back(next());
      else if (a == "--functional") functional = true;
      else if (a == "--gelu") swiglu = false;
      else if (a == "--ops") ops = true;
      else if (a == "--seq") seq = std::stoll(next());
      else if (a == "--batch") batch = std::stoll(next());
      else if (a == "--hidden") hidden = std::stoll(next());
      else if (a == "--heads") heads = std::stoll(next());
      else if (a == "--kv-heads") kv_heads = std::stoll(next());
      else if (a == "--ffn") ffn = std::stoll(next());
      else throw std::invalid_argument("unknown argument '" + a + "'");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_tp_gpt: {} (valid: --json FILE, --quick, --topology NAME, --functional, --gelu, --ops, --seq N, "
                       "--batch N, --hidden N, --heads N, --kv-heads N, --ffn N)\n", e.what());
    return 2;
  }
  if (args.quick) seq = std::min<std::int64_t>(seq, 512);
  if (topologies.empty()) topologies = {"single_cube", "ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8"};
  Table t({"topology", "tp", "sim_time_us", "compute_us", "comm_us", "comm %", "events", "wall_s"});
  nlohmann::json out = {{"bench", "bench_tp_gpt"}, {"functional", functional}, {"rows", nlohmann::json::array()}};
  for (const auto& topo : topologies) {
    for (int tp : {1, 2, 4, 8}) {
      if (kv_heads % tp != 0) continue;
      hw::Topology system = hw::load_topology(topo);
      if (static_cast<int>(system.cubes.size()) < tp) continue;  // one rank per cube
      rt::ContextOptions o;
      o.world_size = tp;
      auto ctx = rt::make_sim_context(o, std::move(system), {.timing_only = !functional});
      const tp::TransformerStepOptions so{
          .layer = {.hidden = hidden, .heads = heads, .kv_heads = kv_heads, .ffn = ffn, .seq = seq,
                    .norm = tp::NormKind::rms_norm, .swiglu = swiglu, .rotary = true, .bias = false,
                    .dtype = DType::bf16, .seed = 7},
          .batch = batch,
          .tp = tp};
      const rt::RunReport rep = tp::run_transformer_step(*ctx, so).report;
      const auto& r0 = rep.ranks.at(0);
      const double sim_us = sim::to_us(rep.sim_time), comp = sim::to_us(r0.compute), comm = sim::to_us(r0.comm);
      t.row({topo, std::to_string(tp), fmt::format("{:.1f}", sim_us), fmt::format("{:.1f}", comp),
             fmt::format("{:.1f}", comm), fmt::format("{:.1f}", sim_us > 0 ? 100 * comm / sim_us : 0),
             std::to_string(rep.events), fmt::format("{:.3f}", rep.wall_s)});
      nlohmann::json by_op = nlohmann::json::object();
      for (const auto& [name, d] : r0.compute_by_op) by_op[name] = sim::to_us(d);
      if (ops) {
        std::vector<std::pair<double, std::string>> sorted;
        for (const auto& [name, d] : r0.compute_by_op) sorted.push_back({sim::to_us(d), name});
        std::sort(sorted.rbegin(), sorted.rend());
        fmt::print("{} tp {}, rank 0's compute by op:\n", topo, tp);
        for (const auto& [us, name] : sorted) fmt::print("  {:<24} {:>10.1f} us  {:5.1f}%\n", name, us, 100 * us / comp);
      }
      out["rows"].push_back({{"topology", topo}, {"tp", tp}, {"ops", by_op}, {"sim_time_us", sim_us}, {"compute_us", comp},
                             {"comm_us", comm}, {"wall_s", rep.wall_s}, {"events", rep.events}, {"seq", seq},
                             {"batch", batch}, {"hidden", hidden}, {"heads", heads}, {"kv_heads", kv_heads},
                             {"ffn", ffn}, {"mlp", swiglu ? "swiglu" : "gelu"}});
    }
  }
  t.print();
  write_json(args, out);
  return 0;
}
