// cubesim-xcheck — the same tensor-parallel MLP on the simulator and on real GPUs, side by side.
//
// For each tp size it
//   1. (bits) runs ParallelMLP forward + backward at a small size on the simulated topology (real
//      values) and on the cuda backend in two modes: exact GEMM + deterministic ring, whose
//      outputs and gradients must equal the simulator's bit for bit, and tensor-core GEMM + NCCL,
//      which makes no bitwise claim (max error and relative norm against the simulator, within the
//      tp tolerance of tp/equivalence.h);
//   2. (time) runs a training-sized step on the simulator (timing only) and on the GPUs (several
//      steps, the first a warm-up) and prints, per GEMM and per collective of rank 0, the simulated
//      time beside the median measured GPU time (CUDA events on the rank's stream) with the error
//      in percent: (simulated - measured) / measured.
//
//   cubesim-xcheck [--topology h200x4] [--tp N]... [--tokens 4096 --hidden 4096 --ffn 14336]
//                  [--check-tokens 256 --check-hidden 1024 --check-ffn 4096] [--iters 5]
//                  [--json FILE] [--sim-only]
// Without --tp: every power of two up to the smaller of the topology's cubes and the GPUs.
// Exit status: 0 all bitwise claims hold; 1 a claim failed; 2 bad arguments; 3 no usable GPU (the
// simulated side is still printed; --sim-only asks for it alone and exits 0).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "benches/bench_util.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/equivalence.h"
#include "tp/mlp_step.h"
#ifdef CUBESIM_XCHECK_CUDA
#include "runtime/cuda_backend.h"
#endif

using namespace cubesim;
using bench::Table;

namespace {

struct Size {
  std::int64_t tokens, hidden, ffn;
};

struct Args {
  std::string topology = "h200x4";
  std::vector<int> tps;
  Size time{4096, 4096, 14336};
  Size check{256, 1024, 4096};
  int iters = 5;
  std::string json;
  bool sim_only = false;
};

// Per rank: tensor name -> bytes (bf16) of what the rank holds after forward + backward.
using RankTensors = std::vector<std::map<std::string, std::vector<std::uint8_t>>>;

struct MlpRun {
  tp::MlpStepResult step;
  std::vector<rt::OpRecord> ops;  // every rank, every step
};

// forward + backward `iters` times on `tp` ranks, each iteration a measured "step" region, from
// random inputs (never zeros: they run faster than real data on tensor cores); `collect` reads
// every tensor back.
MlpRun run_mlp(rt::Context& ctx, const Size& s, int tp, bool collect, int iters) {
  MlpRun run;
  run.step = tp::run_mlp_step(ctx, {.mlp = {.hidden = s.hidden, .ffn = s.ffn, .dtype = DType::bf16, .seed = 7},
                                    .tokens = s.tokens,
                                    .tp = tp,
                                    .iterations = iters,
                                    .collect = collect ? tp::Collect::all : tp::Collect::none,
                                    .step_regions = true,
                                    .inputs_first = true,
                                    .hold_tensors = true});
  run.ops = ctx.op_records();
  return run;
}

std::vector<float> widen(const std::vector<std::uint8_t>& b) {
  std::vector<float> v(b.size() / 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, b.data() + 2 * i, 2);
    v[i] = bf16_to_f32(h);
  }
  return v;
}

struct Diff {
  bool bitwise = true;
  double max_abs = 0, num = 0, den = 0;
  double rel() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

// Every rank's shard of every tensor, against the simulator's.
std::map<std::string, Diff> compare(const RankTensors& got, const RankTensors& ref) {
  std::map<std::string, Diff> out;
  for (std::size_t r = 0; r < ref.size(); ++r) {
    for (const auto& [name, bytes] : ref[r]) {
      Diff& d = out[name];
      const auto& g = got[r].at(name);
      d.bitwise = d.bitwise && g == bytes;
      const auto a = widen(g), b = widen(bytes);
      for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        const double e = static_cast<double>(a[i]) - b[i];
        d.max_abs = std::max(d.max_abs, std::isfinite(e) ? std::fabs(e) : INFINITY);
        d.num += std::isfinite(e) ? e * e : INFINITY;
        d.den += static_cast<double>(b[i]) * b[i];
      }
    }
  }
  return out;
}

// "all_reduce #12 on group 'tp[0,1]'" -> "all_reduce on group 'tp[0,1]'": the same op in every step.
std::string op_key(const rt::OpRecord& o) {
  static const std::regex seq(" #[0-9]+");
  return std::regex_replace(o.name, seq, "") + " | " + o.detail;
}

// Rank 0's ops of one step, keyed by (name, occurrence).
std::vector<std::pair<std::string, const rt::OpRecord*>> rank0_ops(const std::vector<rt::OpRecord>& ops, std::size_t begin,
                                                                   std::size_t count) {
  std::vector<std::pair<std::string, const rt::OpRecord*>> out;
  std::map<std::string, int> seen;
  std::size_t k = 0;
  for (const auto& o : ops) {
    if (o.rank != 0) continue;
    if (k++ < begin) continue;
    if (out.size() == count) break;
    const std::string key = op_key(o);
    out.emplace_back(fmt::format("{} ({})", key, seen[key]++), &o);
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string pct(double sim, double meas) {
  if (meas <= 0) return "-";
  return fmt::format("{:+.1f}%", 100.0 * (sim - meas) / meas);
}

std::unique_ptr<rt::Context> sim_context(const hw::Topology& topo, int tp, bool timing_only, bool record) {
  rt::ContextOptions o;
  o.world_size = tp;
  o.record_ops = record;
  return rt::make_sim_context(o, topo, {.timing_only = timing_only});
}

int usage(const std::string& msg) {
  fmt::print(stderr,
             "cubesim-xcheck: {}\nusage: cubesim-xcheck [--topology NAME] [--tp N]... [--tokens N] [--hidden N] [--ffn N] "
             "[--check-tokens N] [--check-hidden N] [--check-ffn N] [--iters N] [--json FILE] [--sim-only]\n",
             msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(s + " needs a value");
      return argv[++i];
    };
    try {
      if (s == "--topology") a.topology = next();
      else if (s == "--tp") a.tps.push_back(std::stoi(next()));
      else if (s == "--tokens") a.time.tokens = std::stoll(next());
      else if (s == "--hidden") a.time.hidden = std::stoll(next());
      else if (s == "--ffn") a.time.ffn = std::stoll(next());
      else if (s == "--check-tokens") a.check.tokens = std::stoll(next());
      else if (s == "--check-hidden") a.check.hidden = std::stoll(next());
      else if (s == "--check-ffn") a.check.ffn = std::stoll(next());
      else if (s == "--iters") a.iters = std::stoi(next());
      else if (s == "--json") a.json = next();
      else if (s == "--sim-only") a.sim_only = true;
      else if (s == "-h" || s == "--help") return usage("help"), 0;
      else return usage(fmt::format("unknown argument '{}'", s));
    } catch (const std::exception& e) {
      return usage(fmt::format("{}: {}", s, e.what()));
    }
  }
  if (a.iters < 2) return usage("--iters must be at least 2 (the first step is a warm-up)");

  hw::Topology topo;  // loaded and validated once; every simulated context runs this object
  try {
    topo = hw::load_topology(a.topology);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cubesim-xcheck: {}\n", e.what());
    return 2;
  }
  const int cubes = static_cast<int>(topo.cubes.size());
  int gpus = 0;
  std::string no_gpu = "this build has no CUDA backend";
#ifdef CUBESIM_XCHECK_CUDA
  gpus = rt::cuda_device_count();
  no_gpu = gpus == 0 ? rt::cuda_unavailable_reason() : "";
#endif
  const bool cuda = !a.sim_only && gpus > 0;
  if (a.tps.empty()) {
    const int lim = cuda ? std::min(cubes, gpus) : cubes;
    for (int t = 1; t <= lim; t *= 2) a.tps.push_back(t);
  }
  for (int t : a.tps) {
    if (t < 1 || t > cubes) return usage(fmt::format("--tp {}: topology '{}' has {} cubes", t, a.topology, cubes));
    if (cuda && t > gpus) return usage(fmt::format("--tp {}: {} GPU(s) visible", t, gpus));
  }

  nlohmann::json out = {{"tool", "cubesim-xcheck"}, {"topology", a.topology}, {"iters", a.iters},
                        {"time_size", {{"tokens", a.time.tokens}, {"hidden", a.time.hidden}, {"ffn", a.time.ffn}}},
                        {"check_size", {{"tokens", a.check.tokens}, {"hidden", a.check.hidden}, {"ffn", a.check.ffn}}},
                        {"bits", nlohmann::json::array()}, {"timing", nlohmann::json::array()}};
  std::string gpu_name = "-";
  bool claims_hold = true;

#ifdef CUBESIM_XCHECK_CUDA
  struct Mode {
    const char* label;
    rt::CudaBackendOptions opts;
  };
  const std::vector<Mode> modes = {
      {"exact+ring", {.gemm_mode = cuda::GemmMode::exact, .collectives = rt::CudaCollectives::ring}},
      {"tensor_core+nccl", {.gemm_mode = cuda::GemmMode::tensor_core, .collectives = rt::CudaCollectives::nccl}}};
  auto cuda_context = [](int tp, const rt::CudaBackendOptions& m, bool record) {
    rt::ContextOptions o;
    o.world_size = tp;
    o.record_ops = record;
    return rt::make_cuda_context(o, m);
  };
#endif

  for (int tp : a.tps) {
    fmt::print("\n=== tp {} on '{}' ===\n", tp, a.topology);
    // ---- bits
    {
      auto sctx = sim_context(topo, tp, false, false);
      const MlpRun sim = run_mlp(*sctx, a.check, tp, true, 1);
      fmt::print("bits: MLP {} tokens x {} hidden x {} ffn, bf16, forward + backward; reference: the simulator\n",
                 a.check.tokens, a.check.hidden, a.check.ffn);
      if (!cuda) {
        fmt::print("  cuda: not run ({})\n", a.sim_only ? "--sim-only" : no_gpu);
      }
#ifdef CUBESIM_XCHECK_CUDA
      if (cuda) {
        std::vector<std::map<std::string, Diff>> diffs;
        for (const Mode& m : modes) {
          auto cctx = cuda_context(tp, m.opts, false);
          gpu_name = static_cast<rt::CudaBackend&>(cctx->backend()).device_name(0);
          diffs.push_back(compare(run_mlp(*cctx, a.check, tp, true, 1).step.tensors, sim.step.tensors));
        }
        const double tol = tp::tp_tolerance(DType::bf16, std::max(tp, 2));
        Table t({"tensor", "exact+ring vs sim", "tensor_core+nccl vs sim (max abs, rel norm)"});
        for (const auto& [name, d0] : diffs[0]) {
          const Diff& d1 = diffs[1].at(name);
          const bool ok1 = d1.rel() <= tol;
          claims_hold = claims_hold && d0.bitwise && ok1;
          t.row({name, d0.bitwise ? "bitwise equal" : fmt::format("DIFFERS (max abs {:.3g})", d0.max_abs),
                 fmt::format("{}{:.3g}, {:.3g} ({} tol {:.3g})", d1.bitwise ? "bitwise equal; " : "", d1.max_abs, d1.rel(),
                             ok1 ? "within" : "OUTSIDE", tol)});
          out["bits"].push_back({{"tp", tp}, {"tensor", name}, {"exact_ring_bitwise", d0.bitwise},
                                 {"exact_ring_max_abs", d0.max_abs}, {"tensor_core_nccl_bitwise", d1.bitwise},
                                 {"tensor_core_nccl_max_abs", d1.max_abs}, {"tensor_core_nccl_rel_norm", d1.rel()},
                                 {"tolerance", tol}});
        }
        t.print();
      }
#endif
    }
    // ---- time
    auto sctx = sim_context(topo, tp, true, true);
    const MlpRun sim = run_mlp(*sctx, a.time, tp, false, 1);
    const auto sim_ops = rank0_ops(sim.ops, 0, SIZE_MAX);
    fmt::print("\ntime: MLP step {} tokens x {} hidden x {} ffn, bf16, rank 0; simulated step {:.1f} us\n", a.time.tokens,
               a.time.hidden, a.time.ffn, sim::to_us(sim.step.report.sim_time));
    std::vector<std::string> header = {"op", "sim us"};
    std::map<std::string, std::vector<double>> measured[2];
    std::vector<double> step_us[2];
#ifdef CUBESIM_XCHECK_CUDA
    if (cuda) {
      for (std::size_t mi = 0; mi < modes.size(); ++mi) {
        header.push_back(std::string(modes[mi].label) + " us");
        header.push_back("err");
        auto cctx = cuda_context(tp, modes[mi].opts, true);
        const MlpRun g = run_mlp(*cctx, a.time, tp, false, a.iters);
        rt::Backend& be = cctx->backend();
        for (int it = 1; it < a.iters; ++it) {
          step_us[mi].push_back(1e6 * be.measured_seconds(g.step.steps[0][static_cast<std::size_t>(it)]));
          for (const auto& [key, op] : rank0_ops(g.ops, static_cast<std::size_t>(it) * sim_ops.size(), sim_ops.size())) {
            measured[mi][key].push_back(1e6 * be.measured_seconds(op->region));
          }
        }
      }
    }
#endif
    Table t(header);
    for (const auto& [key, op] : sim_ops) {
      const double s_us = sim::to_us(op->end - op->start);
      std::vector<std::string> row = {key, fmt::format("{:.1f}", s_us)};
      nlohmann::json j = {{"tp", tp}, {"op", key}, {"kind", op->kind}, {"sim_us", s_us}};
      for (int mi = 0; mi < (cuda ? 2 : 0); ++mi) {
        const auto it = measured[mi].find(key);
        const double m = it == measured[mi].end() ? -1 : median(it->second);
        row.push_back(m < 0 ? "missing" : fmt::format("{:.1f}", m));
        row.push_back(pct(s_us, m));
        j[mi == 0 ? "exact_ring_us" : "tensor_core_nccl_us"] = m;
      }
      t.row(row);
      out["timing"].push_back(j);
    }
    {
      const double s_us = sim::to_us(sim.step.report.sim_time);
      std::vector<std::string> row = {"step (forward + backward)", fmt::format("{:.1f}", s_us)};
      nlohmann::json j = {{"tp", tp}, {"op", "step"}, {"kind", "step"}, {"sim_us", s_us}};
      for (int mi = 0; mi < (cuda ? 2 : 0); ++mi) {
        const double m = median(step_us[mi]);
        row.push_back(fmt::format("{:.1f}", m));
        row.push_back(pct(s_us, m));
        j[mi == 0 ? "exact_ring_us" : "tensor_core_nccl_us"] = m;
      }
      t.row(row);
      out["timing"].push_back(j);
    }
    t.print();
  }
  const auto now = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  out["date"] = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", now);
  out["gpu"] = gpu_name;
  out["gpus"] = gpus;
  out["claims_hold"] = claims_hold;
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << out.dump(2) << "\n";
    fmt::print("wrote {}\n", a.json);
  }
  fmt::print("\n{}; GPU: {} x {}; {}\n", cuda ? (claims_hold ? "every claim holds" : "A CLAIM FAILED") : "simulator only",
             gpu_name, gpus, out["date"].get<std::string>());
  if (!cuda && !a.sim_only) return 3;
  return claims_hold ? 0 : 1;
}
