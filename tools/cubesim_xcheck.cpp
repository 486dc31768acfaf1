// cubesim-xcheck — the same tensor-parallel MLP on the simulator and on real GPUs, side by side.
//
// For each tp size it
//   1. (bits) runs ParallelMLP forward + backward at a small size on the simulated topology (real
//      values) and on the cuda backend in three modes: exact GEMM + deterministic ring, whose
//      outputs and gradients must equal the simulator's bit for bit; tensor-core GEMM + the
//      deterministic ring, which must equal bit for bit the simulator with its PEs in the hopper_tc
//      accumulator model (kernels/accumulator.h: the Hopper tensor core's published arithmetic); and
//      tensor-core GEMM + NCCL, which makes no bitwise claim (NCCL's reduction order is its own: max
//      error and relative norm against the simulator, within the tp tolerance of tp/equivalence.h);
//   2. (time) runs a training-sized step on the simulator (timing only) and on the GPUs (several
//      steps, the first a warm-up) and prints, per GEMM and per collective of rank 0, the simulated
//      time beside the median measured GPU time (CUDA events on the rank's stream) with the error
//      in percent: (simulated - measured) / measured.
//
//   3. (PyTorch) when GPUs are present and `python3` has PyTorch (or with --torch), times the same
//      step written in plain PyTorch with NCCL (python/cubesim/gpu_measure.py, its `mlp` section:
//      Megatron's ParallelMLP, the column layer's all-reduce overlapping its weight-gradient GEMM)
//      and reports the simulator's error against it too; --torch-json FILE reads such a measurement
//      instead (also with --sim-only, so a saved PyTorch run can be compared anywhere).
// The time table lists rank 0's GEMMs and collectives, then three sums: GEMMs, blocking collectives
// (the row layer's forward all-reduce) and everything else (the step minus both: elementwise ops,
// launch gaps and the exposed tail of the overlapped all-reduce).
//
//   cubesim-xcheck [--topology h200x4] [--tp N]... [--tokens 4096 --hidden 4096 --ffn 14336]
//                  [--check-tokens 256 --check-hidden 1024 --check-ffn 4096] [--iters 5]
//                  [--json FILE] [--sim-only] [--share-gpus] [--graph] [--torch | --no-torch] [--torch-json FILE]
// Without --tp: every power of two up to the smaller of the topology's cubes and the GPUs.
// --share-gpus: a --tp above the GPUs places its ranks on them in turn (rank r on GPU r % GPUs, each its
// own stream); only the bits are checked then, in the modes the runtime's ring serves (exact+ring,
// tensor_core+ring; NCCL wants a GPU per rank), and the timed section runs on the simulator alone.
// (Without --tp the sizes stop at the GPUs' count, so name the larger ones.)
// --graph: also times the tensor_core+nccl step recorded once as a CUDA graph and launched each
// iteration (tp::MlpStepOptions::graph), against its step run op by op and PyTorch's (tp 1: the cuda
// backend records graphs on one rank only; above, the step runs without them and the note says why).
// Exit status: 0 all bitwise claims hold; 1 a claim failed; 2 bad arguments; 3 no usable GPU (the
// simulated side is still printed; --sim-only asks for it alone and exits 0).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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
  bool share_gpus = false;  // bits at a tp above the GPUs: ranks share them (r % GPUs); no timing then
  bool graph = false;       // also time the tensor_core+nccl step as a CUDA graph (tp::MlpStepOptions::graph)
  enum class Torch { automatic, on, off } torch = Torch::automatic;
  std::string torch_json;
};

// ---- the PyTorch reference (gpu_measure.py's `mlp` section) ----

// Per tp: the step's median seconds and each op's ({"fc1.fwd": s, ...}).
struct TorchStep {
  double step = -1;
  std::map<std::string, double> ops;
};
using TorchRef = std::map<int, TorchStep>;

TorchRef read_torch(const std::string& path, const Size& s) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(fmt::format("--torch-json {}: cannot read it", path));
  nlohmann::json doc;
  try {
    f >> doc;
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("--torch-json {}: not JSON: {}", path, e.what()));
  }
  TorchRef out;
  for (const auto& r : doc.value("mlp", nlohmann::json::array())) {
    if (r.at("tokens") != s.tokens || r.at("hidden") != s.hidden || r.at("ffn") != s.ffn) continue;
    TorchStep& t = out[r.at("tp").get<int>()];
    t.step = r.at("step").get<double>();
    for (const auto& o : r.at("ops")) t.ops[o.at("name").get<std::string>()] = o.at("time").get<double>();
  }
  return out;
}

std::string gpu_measure_script() {
  if (const char* e = std::getenv("CUBESIM_GPU_MEASURE")) return e;
  if (std::filesystem::exists(CUBESIM_GPU_MEASURE)) return CUBESIM_GPU_MEASURE;
  return "python/cubesim/gpu_measure.py";  // a source tree carried to another machine
}

// Runs the PyTorch step for every tp; an empty result (and a reason) when PyTorch cannot run here.
TorchRef run_torch(const std::vector<int>& tps, const Size& s, bool required, std::string& why) {
  const std::string script = gpu_measure_script();
  if (!std::filesystem::exists(script)) {
    why = fmt::format("{} not found (set CUBESIM_GPU_MEASURE)", script);
    return {};
  }
  if (!required && std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    why = "python3 has no PyTorch";
    return {};
  }
  std::string ranks;
  for (int t : tps) ranks += fmt::format("{}{}", ranks.empty() ? "" : ",", t);
  const std::string out = (std::filesystem::temp_directory_path() / fmt::format("xcheck_torch_{}.json", ::getpid())).string();
  const std::string cmd = fmt::format("python3 '{}' --sections env,mlp --ranks {} --mlp-shape {},{},{} --out '{}' 2>&1 | "
                                      "grep -E '^mlp|failed|rror' >&2",
                                      script, ranks, s.tokens, s.hidden, s.ffn, out);
  fmt::print("pytorch: {}\n", cmd);
  std::fflush(stdout);
  (void)std::system(cmd.c_str());
  if (!std::filesystem::exists(out)) {
    why = "the PyTorch run wrote nothing (see the messages above)";
    return {};
  }
  TorchRef r = read_torch(out, s);
  std::filesystem::remove(out);
  if (r.empty()) why = "the PyTorch run measured no step (see the messages above)";
  return r;
}

// The PyTorch op that a simulated op of rank 0 corresponds to ("" for the overlapped all-reduce,
// whose exposed tail PyTorch records as fc1.all_reduce_wait).
std::string torch_op(const std::string& key) {
  static const std::pair<const char*, const char*> names[] = {
      {"column fprop", "fc1.fwd"}, {"row fprop", "fc2.fwd"},     {"row dgrad", "fc2.dgrad"},
      {"row wgrad", "fc2.wgrad"},  {"column dgrad", "fc1.dgrad"}, {"column wgrad", "fc1.wgrad"}};
  for (const auto& [sim, torch] : names) {
    if (key.rfind(sim, 0) == 0) return torch;
  }
  if (key.rfind("all_reduce", 0) == 0 && key.find("(0)") != std::string::npos) return "fc2.all_reduce";
  return "";
}

// Per rank: tensor name -> bytes (bf16) of what the rank holds after forward + backward.
using RankTensors = std::vector<std::map<std::string, std::vector<std::uint8_t>>>;

struct MlpRun {
  tp::MlpStepResult step;
  std::vector<rt::OpRecord> ops;  // every rank, every step
};

// forward + backward `iters` times on `tp` ranks, each iteration a measured "step" region, from
// random inputs (never zeros: they run faster than real data on tensor cores); `collect` reads
// every tensor back.
MlpRun run_mlp(rt::Context& ctx, const Size& s, int tp, bool collect, int iters, bool graph = false) {
  MlpRun run;
  run.step = tp::run_mlp_step(ctx, {.mlp = {.hidden = s.hidden, .ffn = s.ffn, .dtype = DType::bf16, .seed = 7},
                                    .tokens = s.tokens,
                                    .tp = tp,
                                    .iterations = iters,
                                    .collect = collect ? tp::Collect::all : tp::Collect::none,
                                    .step_regions = true,
                                    .inputs_first = true,
                                    .hold_tensors = true,
                                    .graph = graph});
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

// The bits run the deterministic ring (what the cuda backend's exact mode runs); the timing run
// collectives as NCCL does (the `nccl` family), which is what the GPUs' NCCL and PyTorch run.
std::unique_ptr<rt::Context> sim_context(const hw::Topology& topo, int tp, bool timing_only, bool record,
                                         rt::Algorithm algorithm = rt::Algorithm::ring) {
  rt::ContextOptions o;
  o.world_size = tp;
  o.record_ops = record;
  o.algorithm = algorithm;
  return rt::make_sim_context(o, topo, {.timing_only = timing_only});
}

int usage(const std::string& msg) {
  fmt::print(stderr,
             "cubesim-xcheck: {}\nusage: cubesim-xcheck [--topology NAME] [--tp N]... [--tokens N] [--hidden N] [--ffn N] "
             "[--check-tokens N] [--check-hidden N] [--check-ffn N] [--iters N] [--json FILE] [--sim-only] [--share-gpus] [--graph] "
             "[--torch | --no-torch] [--torch-json FILE]\n",
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
      else if (s == "--share-gpus") a.share_gpus = true;
      else if (s == "--graph") a.graph = true;
      else if (s == "--torch") a.torch = Args::Torch::on;
      else if (s == "--no-torch") a.torch = Args::Torch::off;
      else if (s == "--torch-json") a.torch_json = next();
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
    if (cuda && t > gpus && !a.share_gpus)
      return usage(fmt::format("--tp {}: {} GPU(s) visible (--share-gpus puts several ranks on a GPU, bits only)", t, gpus));
  }

  nlohmann::json out = {{"tool", "cubesim-xcheck"}, {"topology", a.topology}, {"iters", a.iters},
                        {"time_size", {{"tokens", a.time.tokens}, {"hidden", a.time.hidden}, {"ffn", a.time.ffn}}},
                        {"check_size", {{"tokens", a.check.tokens}, {"hidden", a.check.hidden}, {"ffn", a.check.ffn}}},
                        {"bits", nlohmann::json::array()}, {"timing", nlohmann::json::array()}};
  std::string gpu_name = "-";
  bool claims_hold = true;

  TorchRef torch;
  std::string torch_why;
  if (!a.torch_json.empty()) {
    try {
      torch = read_torch(a.torch_json, a.time);
    } catch (const std::exception& e) {
      fmt::print(stderr, "cubesim-xcheck: {}\n", e.what());
      return 2;
    }
    if (torch.empty()) {
      torch_why = fmt::format("{} has no MLP step of {} tokens x {} hidden x {} ffn", a.torch_json, a.time.tokens,
                              a.time.hidden, a.time.ffn);
    }
  } else if (a.torch == Args::Torch::on || (a.torch == Args::Torch::automatic && cuda)) {
    // PyTorch times the step with a GPU per rank: only the tp sizes that have as many GPUs.
    std::vector<int> timed_tps;
    for (int t : a.tps)
      if (!cuda || t <= gpus) timed_tps.push_back(t);
    if (!timed_tps.empty()) torch = run_torch(timed_tps, a.time, a.torch == Args::Torch::on, torch_why);
    else torch_why = "every --tp shares GPUs (--share-gpus): no timing";
  } else {
    torch_why = a.torch == Args::Torch::off ? "--no-torch" : "no GPU here (--torch-json FILE compares a saved run)";
  }
  if (torch.empty()) fmt::print("pytorch: not compared ({})\n", torch_why);
  out["pytorch"] = torch.empty() ? nlohmann::json(torch_why) : nlohmann::json(a.torch_json.empty() ? "measured" : a.torch_json);

#ifdef CUBESIM_XCHECK_CUDA
  struct Mode {
    const char* label;
    rt::CudaBackendOptions opts;
  };
  const std::vector<Mode> modes = {
      {"exact+ring", {.gemm_mode = cuda::GemmMode::exact, .collectives = rt::CudaCollectives::ring}},
      {"tensor_core+nccl", {.gemm_mode = cuda::GemmMode::tensor_core, .collectives = rt::CudaCollectives::nccl}},
      {"tensor_core+ring", {.gemm_mode = cuda::GemmMode::tensor_core, .collectives = rt::CudaCollectives::ring}}};
  auto cuda_context = [&](int tp, rt::CudaBackendOptions m, bool record) {
    rt::ContextOptions o;
    o.world_size = tp;
    o.record_ops = record;
    m.share_gpus = tp > gpus;
    return rt::make_cuda_context(o, m);
  };
#endif

  for (int tp : a.tps) {
    fmt::print("\n=== tp {} on '{}' ===\n", tp, a.topology);
    // ---- bits
    {
      auto sctx = sim_context(topo, tp, false, false);
      const MlpRun sim = run_mlp(*sctx, a.check, tp, true, 1);
      // The same on PEs that add as the Hopper tensor core does (for the tensor_core+ring claim).
      auto hctx = sim_context(topo, tp, false, false);
      hctx->backend().set_gemm_numerics(kernels::AccumulatorModel::hopper_tc);
      const MlpRun sim_tc = run_mlp(*hctx, a.check, tp, true, 1);
      fmt::print("bits: MLP {} tokens x {} hidden x {} ffn, bf16, forward + backward; reference: the simulator\n",
                 a.check.tokens, a.check.hidden, a.check.ffn);
      if (!cuda) {
        fmt::print("  cuda: not run ({})\n", a.sim_only ? "--sim-only" : no_gpu);
      }
#ifdef CUBESIM_XCHECK_CUDA
      if (cuda) {
        std::vector<std::map<std::string, Diff>> diffs;
        const bool shared = tp > gpus;
        for (const Mode& m : modes) {
          if (shared && m.opts.collectives == rt::CudaCollectives::nccl) {
            diffs.emplace_back();  // not run: NCCL wants a GPU per rank
            continue;
          }
          auto cctx = cuda_context(tp, m.opts, false);
          gpu_name = static_cast<rt::CudaBackend&>(cctx->backend()).device_name(0);
          const bool hopper = std::string(m.label) == "tensor_core+ring";
          diffs.push_back(compare(run_mlp(*cctx, a.check, tp, true, 1).step.tensors, (hopper ? sim_tc : sim).step.tensors));
        }
        const double tol = tp::tp_tolerance(DType::bf16, std::max(tp, 2));
        Table t({"tensor", "exact+ring vs sim", "tensor_core+ring vs sim in hopper_tc",
                 "tensor_core+nccl vs sim (max abs, rel norm)"});
        for (const auto& [name, d0] : diffs[0]) {
          const Diff& d2 = diffs[2].at(name);
          claims_hold = claims_hold && d0.bitwise && d2.bitwise;
          nlohmann::json j = {{"tp", tp}, {"tensor", name}, {"exact_ring_bitwise", d0.bitwise},
                              {"exact_ring_max_abs", d0.max_abs}, {"tensor_core_ring_vs_hopper_tc_bitwise", d2.bitwise},
                              {"tensor_core_ring_vs_hopper_tc_max_abs", d2.max_abs}, {"shared_gpus", shared}};
          std::string nccl_cell = "not run (ranks share GPUs)";
          if (!shared) {
            const Diff& d1 = diffs[1].at(name);
            const bool ok1 = d1.rel() <= tol;
            claims_hold = claims_hold && ok1;
            nccl_cell = fmt::format("{}{:.3g}, {:.3g} ({} tol {:.3g})", d1.bitwise ? "bitwise equal; " : "", d1.max_abs,
                                    d1.rel(), ok1 ? "within" : "OUTSIDE", tol);
            j.update({{"tensor_core_nccl_bitwise", d1.bitwise}, {"tensor_core_nccl_max_abs", d1.max_abs},
                      {"tensor_core_nccl_rel_norm", d1.rel()}, {"tolerance", tol}});
          }
          t.row({name, d0.bitwise ? "bitwise equal" : fmt::format("DIFFERS (max abs {:.3g})", d0.max_abs),
                 d2.bitwise ? "bitwise equal" : fmt::format("DIFFERS (max abs {:.3g})", d2.max_abs), nccl_cell});
          out["bits"].push_back(j);
        }
        t.print();
      }
#endif
    }
    // ---- time
    auto sctx = sim_context(topo, tp, true, true, rt::Algorithm::nccl);
    const MlpRun sim = run_mlp(*sctx, a.time, tp, false, 1);
    const auto sim_ops = rank0_ops(sim.ops, 0, SIZE_MAX);
    fmt::print("\ntime: MLP step {} tokens x {} hidden x {} ffn, bf16, rank 0; simulated step {:.1f} us\n", a.time.tokens,
               a.time.hidden, a.time.ffn, sim::to_us(sim.step.report.sim_time));
    std::vector<std::string> header = {"op", "sim us"};
    std::map<std::string, std::vector<double>> measured[2];
    std::vector<double> step_us[2], graph_us;
    int graph_ranks = 0;
    const bool timed = cuda && tp <= gpus;  // a timing with ranks sharing a GPU would say nothing
#ifdef CUBESIM_XCHECK_CUDA
    if (cuda && !timed) fmt::print("  cuda: not timed (tp {} on {} GPU(s): --share-gpus checks the bits only)\n", tp, gpus);
    if (timed) {
      for (std::size_t mi = 0; mi < 2; ++mi) {  // timed: exact+ring and tensor_core+nccl (the bits-only third mode is not)
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
      if (a.graph) {  // the step alone: its ops ran inside the graph, once recorded
        auto cctx = cuda_context(tp, modes[1].opts, true);
        const MlpRun g = run_mlp(*cctx, a.time, tp, false, a.iters, true);
        graph_ranks = g.step.graphs;
        for (int it = 1; it < a.iters; ++it)
          graph_us.push_back(1e6 * cctx->backend().measured_seconds(g.step.steps[0][static_cast<std::size_t>(it)]));
        for (const auto& n : g.step.report.notes) fmt::print("  note: {}\n", n);
      }
    }
#endif
    const auto tt = torch.find(tp);
    const TorchStep* tref = tt == torch.end() ? nullptr : &tt->second;
    if (tref) {
      header.push_back("pytorch us");
      header.push_back("err");
    }
    // Columns: 0 the simulator, 1-2 the cuda modes, 3 PyTorch; sums of GEMMs and blocking collectives.
    constexpr int kCols = 4;
    double gemm_sum[kCols] = {}, coll_sum[kCols] = {};
    bool have[kCols] = {true, timed, timed, tref != nullptr};
    auto add = [&](int col, const std::string& kind, double us, const std::string& torch_name) {
      if (us < 0) return;
      if (kind == "gemm") gemm_sum[col] += us;
      else if (torch_name == "fc2.all_reduce") coll_sum[col] += us;
    };
    Table t(header);
    for (const auto& [key, op] : sim_ops) {
      const double s_us = sim::to_us(op->end - op->start);
      const std::string tname = torch_op(key);
      add(0, op->kind, s_us, tname);
      std::vector<std::string> row = {key, fmt::format("{:.1f}", s_us)};
      nlohmann::json j = {{"tp", tp}, {"op", key}, {"kind", op->kind}, {"sim_us", s_us}};
      for (int mi = 0; mi < (timed ? 2 : 0); ++mi) {
        const auto it = measured[mi].find(key);
        const double m = it == measured[mi].end() ? -1 : median(it->second);
        add(1 + mi, op->kind, m, tname);
        row.push_back(m < 0 ? "missing" : fmt::format("{:.1f}", m));
        row.push_back(pct(s_us, m));
        j[mi == 0 ? "exact_ring_us" : "tensor_core_nccl_us"] = m;
      }
      if (tref) {
        const auto it = tref->ops.find(tname);
        const double m = tname.empty() || it == tref->ops.end() ? -1 : 1e6 * it->second;
        add(3, op->kind, m, tname);
        row.push_back(m < 0 ? "(overlapped)" : fmt::format("{:.1f}", m));
        row.push_back(pct(s_us, m));
        j["pytorch_us"] = m;
      }
      t.row(row);
      out["timing"].push_back(j);
    }
    double step[kCols] = {sim::to_us(sim.step.report.sim_time), median(step_us[0]), median(step_us[1]),
                          tref ? 1e6 * tref->step : -1};
    const std::pair<const char*, int> sums[] = {{"GEMMs", 0}, {"blocking collectives", 1}, {"everything else", 2},
                                                {"step (forward + backward)", 3}};
    for (const auto& [label, which] : sums) {
      auto value = [&](int c) {
        if (!have[c] || step[c] < 0) return -1.0;
        switch (which) {
          case 0: return gemm_sum[c];
          case 1: return coll_sum[c];
          case 2: return step[c] - gemm_sum[c] - coll_sum[c];
          case 3: return step[c];
        }
        return -1.0;
      };
      const double s_us = value(0);
      std::vector<std::string> row = {label, fmt::format("{:.1f}", s_us)};
      nlohmann::json j = {{"tp", tp}, {"op", which == 3 ? std::string("step") : std::string(label)},
                          {"kind", which == 3 ? "step" : "sum"}, {"sim_us", s_us}};
      for (int c = 1; c < kCols; ++c) {
        if (!have[c]) continue;
        const double m = value(c);
        row.push_back(fmt::format("{:.1f}", m));
        row.push_back(pct(s_us, m));
        j[c == 1 ? "exact_ring_us" : c == 2 ? "tensor_core_nccl_us" : "pytorch_us"] = m;
      }
      t.row(row);
      out["timing"].push_back(j);
    }
    t.print();
    // Issue 18's target: the tensor-core step no slower than PyTorch's on as many GPUs.
    if (have[2] && have[3] && step[2] > 0 && step[3] > 0) {
      const double r = step[2] / step[3];
      fmt::print("tensor_core+nccl step / PyTorch step at tp {}: {:.3f} (target <= 1.0: {})\n", tp, r,
                 r <= 1.0 ? "met" : "NOT met");
      out["vs_pytorch"].push_back({{"tp", tp}, {"tensor_core_nccl_us", step[2]}, {"pytorch_us", step[3]}, {"ratio", r},
                                   {"target", 1.0}});
    }
    if (!graph_us.empty()) {
      const double gs = median(graph_us);
      fmt::print("tensor_core+nccl step as a CUDA graph at tp {}: {:.1f} us ({} of {} ranks recorded one); / the step run "
                 "op by op: {:.3f}{}\n",
                 tp, gs, graph_ranks, tp, step[2] > 0 ? gs / step[2] : -1.0,
                 step[3] > 0 ? fmt::format("; / PyTorch: {:.3f}", gs / step[3]) : std::string());
      out["graph"].push_back({{"tp", tp}, {"graph_us", gs}, {"ranks_recorded", graph_ranks}, {"tensor_core_nccl_us", step[2]},
                              {"pytorch_us", step[3] > 0 ? step[3] : -1.0}});
    }
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
