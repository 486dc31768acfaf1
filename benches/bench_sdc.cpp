// bench_sdc — the SDC model's checksums: their overhead on the step (with against without, same run)
// and false positives on fault-free runs, on any backend.
//
//   bench_sdc [--backend sim|host|cuda] [--mode fsdp|tp] [--gemm-mode exact|tensor_core] [--ranks N] [--layers N]
//             [--tokens N] [--hidden N] [--ffn N] [--steps N] [--clean-runs K] [--campaign N] [--seed S]
//             [--share-gpus] [--topology NAME] [--json FILE] [--quick]
//
// Overhead: `steps` steps of the model (every layer, fsdp: all_gather of the weight shard, GEMM +
// GELU, 2·(3 + ranks) checksums; tp: the column and row GEMMs and their all-reduce, 2·(5 + ranks +
// 2·(ranks - 1)) checksums) and `steps` without, interleaved (with, without, with,
// ...); the step time is measured on the GPU (cuda: events around the step, the checksums' device
// reductions included, their one read per step after it) or simulated (sim); the overhead is
// median(with) / median(without) - 1 (target on H200: <= 2%). False positives: `clean-runs`
// fault-free runs of a small recipe on fresh data, each checked exactly against the host replay:
// every layer-step whose checksums differ counts (target 0 over 10,000 layer-steps). Campaign
// (`--campaign N`): N seeded faults through the small recipe (sdc/campaign.h; on host and cuda replayed
// at GEMM outputs, reduction steps and collective results in device memory), detected and localised against the truth.
// JSON: {"overhead": {...}, "clean": {...}, "campaign": {...}}.
#include <algorithm>
#include <string>
#include <vector>

#include "bench_util.h"
#include "runtime/backend_registry.h"
#include "runtime/checksum.h"
#include "sdc/campaign.h"
#include "sdc/sdc.h"
#include "sim/hw/topology.h"

using namespace cubesim;
using namespace cubesim::bench;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  BenchArgs args = parse_bench_args(argc, argv, "bench_sdc");
  std::string backend = "sim", topology = "ring4", gemm_mode = "exact";
  int ranks = 0, steps = 20, clean_runs = 40;
  std::uint64_t campaign = 0, seed = 7;
  bool share_gpus = false;  // cuda: more ranks than GPUs (rank r on GPU r % GPUs)
  sdc::Mode mode = sdc::Mode::fsdp;
  sdc::Recipe big;
  big.layers = 8, big.tokens = 8192, big.hidden = 4096, big.ffn = 4096;
  for (std::size_t i = 0; i < args.rest.size(); ++i) {
    const std::string& a = args.rest[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= args.rest.size()) throw std::invalid_argument("bench_sdc: " + a + " needs a value");
      return args.rest[++i];
    };
    if (a == "--backend") backend = next();
    else if (a == "--topology") topology = next();
    else if (a == "--gemm-mode") gemm_mode = next();
    else if (a == "--ranks") ranks = std::stoi(next());
    else if (a == "--layers") big.layers = std::stoi(next());
    else if (a == "--tokens") big.tokens = std::stoll(next());
    else if (a == "--hidden") big.hidden = std::stoll(next());
    else if (a == "--ffn") big.ffn = std::stoll(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--clean-runs") clean_runs = std::stoi(next());
    else if (a == "--campaign") campaign = std::stoull(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--share-gpus") share_gpus = true;
    else if (a == "--mode") {
      const std::string m = next();
      if (m != "fsdp" && m != "tp") {
        fmt::print(stderr, "bench_sdc: --mode {} (valid: fsdp, tp)\n", m);
        return 2;
      }
      mode = m == "tp" ? sdc::Mode::tp : sdc::Mode::fsdp;
    } else {
      fmt::print(stderr, "bench_sdc: unknown argument '{}' (valid: --backend, --mode, --gemm-mode, --topology, --ranks, --layers, "
                         "--tokens, --hidden, --ffn, --steps, --clean-runs, --campaign, --seed, --share-gpus, --json FILE, --quick)\n", a);
      return 2;
    }
  }
  if (args.quick) big.tokens = 256, big.hidden = 256, big.ffn = 512, big.layers = 4, steps = 3, clean_runs = 4;
  big.mode = mode;
  const hw::Topology topo = hw::load_topology(topology);
  auto make = [&](bool for_timing, bool measure = true) {
    rt::ContextOptions o;
    o.world_size = ranks;
    if (backend == "host" && ranks == 0) o.world_size = 4;
    rt::BackendArgs ba;
    if (backend == "sim") ba.topology = &topo;
    if (backend == "sim" && big.tokens * big.ffn > (1 << 22)) ba.options = {{"timing_only", true}};
    // The clean runs compare against the host replay: the exact GEMM, whatever --gemm-mode times.
    if (backend == "cuda" && for_timing) ba.options = {{"gemm_mode", gemm_mode}};
    if (backend == "cuda" && share_gpus) ba.options["share_gpus"] = true;
    if (backend == "cuda" && !measure) ba.options["measure"] = false;  // no events piling up over thousands of runs
    return rt::make_context(backend, o, ba);
  };
  nlohmann::json out = {{"bench", "bench_sdc"}, {"backend", backend}, {"mode", sdc::mode_name(mode)}};

  // ---- overhead ----
  {
    auto ctx = make(true);
    big.ranks = ranks;
    if (ctx->backend().name() != std::string_view("sim")) big.ranks = ctx->world_size();
    // Warm-up: allocations, NCCL communicators, first launches.
    sdc::step_seconds(*ctx, big, 2, true);
    std::vector<double> with, without;
    for (int s = 0; s < steps; ++s) {
      with.push_back(sdc::step_seconds(*ctx, big, 1, true).at(0));
      without.push_back(sdc::step_seconds(*ctx, big, 1, false).at(0));
    }
    const double mw = median(with), mo = median(without);
    Table t({"backend", "gemm", "ranks", "layers", "x", "W", "steps", "step with (ms)", "without (ms)", "overhead"});
    t.row({backend, backend == "cuda" ? gemm_mode : "-", std::to_string(ctx->world_size()), std::to_string(big.layers),
           fmt::format("[{}, {}]", big.tokens, big.hidden), fmt::format("[{}, {}]", big.ffn, big.hidden),
           std::to_string(steps), fmt::format("{:.3f}", mw * 1e3), fmt::format("{:.3f}", mo * 1e3),
           fmt::format("{:+.2f}%", (mw / mo - 1) * 100)});
    t.print();
    out["overhead"] = {{"gemm_mode", gemm_mode}, {"ranks", ctx->world_size()}, {"layers", big.layers}, {"tokens", big.tokens},
                       {"hidden", big.hidden}, {"ffn", big.ffn}, {"steps", steps}, {"with_s", with},
                       {"without_s", without}, {"median_with_s", mw}, {"median_without_s", mo},
                       {"overhead", mw / mo - 1}, {"target", 0.02}, {"measured", ctx->backend().measures_time()}};
  }

  // ---- one checksum pass (word and mix) over a [tokens, hidden] tensor: its rate ----
  if (!args.quick) {
    auto ctx = make(true);
    const int reps = 20;
    double secs = 0;
    const std::int64_t n = big.tokens * big.hidden;
    ctx->spawn(1, [&](int rank) {
      rt::Tensor x = ctx->empty(rank, {n}, big.dtype, "x");
      rt::Checksums warm(rank, 2);
      warm.take_pair(0, 1, x);
      warm.read();
      rt::Checksums cs(rank, 2 * reps);
      const sim::Time t0 = ctx->simulator().now();
      const std::uint64_t region = ctx->backend().begin_region(rank, "checksums");
      for (int k = 0; k < reps; ++k) cs.take_pair(2 * k, 2 * k + 1, x);
      ctx->backend().end_region(region);
      cs.read();
      secs = ctx->backend().measures_time() ? -static_cast<double>(region)
                                            : static_cast<double>(ctx->simulator().now() - t0) * 1e-12;
    });
    if (secs < 0) secs = ctx->backend().measured_seconds(static_cast<std::uint64_t>(-secs));
    const double bytes = static_cast<double>(n) * static_cast<double>(dtype_size(big.dtype)) * reps;
    Table t({"backend", "tensor", "passes", "seconds", "GB/s"});
    t.row({backend, fmt::format("{}[{}]", dtype_name(big.dtype), n), std::to_string(reps), fmt::format("{:.6f}", secs),
           fmt::format("{:.0f}", bytes / secs / 1e9)});
    t.print();
    out["checksum_pass"] = {{"elements", n}, {"passes", reps}, {"seconds", secs}, {"GBps", bytes / secs / 1e9}};
  }

  // ---- false positives ----
  {
    auto ctx = make(false);
    sdc::Recipe small;
    small.mode = mode;
    small.ranks = backend == "sim" ? 0 : ctx->world_size();
    if (ctx->backend().timing_only()) {
      ctx.reset();
      rt::ContextOptions o;
      o.world_size = ranks;
      rt::BackendArgs ba;
      ba.topology = &topo;
      ctx = rt::make_context(backend, o, ba);
    }
    std::uint64_t steps_checked = 0, bad = 0, bad_runs = 0;
    const double t0 = wall_seconds();
    for (int k = 0; k < clean_runs; ++k) {
      sdc::Recipe r = small;
      r.weight_seed = 1000 + static_cast<std::uint64_t>(k);
      r.input_seed = 5000 + static_cast<std::uint64_t>(k);
      const sdc::Result res = sdc::run(*ctx, r);
      // A run is clean when nothing differs from the replay: no checksum, no rank-fill word, no tensor.
      bad_runs += !res.divergences.empty() || !res.changed_tensors.empty();
      for (int l = 0; l < r.layers; ++l)
        for (int rank = 0; rank < res.ranks; ++rank) {
          ++steps_checked;
          bad += std::any_of(res.divergences.begin(), res.divergences.end(),
                             [&](const sdc::Divergence& d) { return d.layer == l && d.rank == rank; });
        }
    }
    Table t({"backend", "clean runs", "layer-steps", "false positives", "runs with any difference", "wall s"});
    t.row({backend, std::to_string(clean_runs), std::to_string(steps_checked), std::to_string(bad), std::to_string(bad_runs),
           fmt::format("{:.1f}", wall_seconds() - t0)});
    t.print();
    out["clean"] = {{"runs", clean_runs}, {"layer_steps", steps_checked}, {"false_positives", bad},
                    {"runs_with_differences", bad_runs}};
  }
  // ---- a fault campaign ----
  if (campaign > 0) {
    sdc::Recipe small;
    small.mode = mode;
    sdc::CampaignOptions o;
    o.faults = campaign;
    o.seed = seed;
    o.clean_runs = 0;
    if (backend != "sim") {
      o.make_context = [&] { return make(false, false); };
      o.sites = {hw::FaultSite::gemm_tile, hw::FaultSite::reduce, hw::FaultSite::link};
      if (backend == "cuda") o.threads = 1;
    }
    if (mode == sdc::Mode::fsdp)
      o.sites.erase(std::remove(o.sites.begin(), o.sites.end(), hw::FaultSite::reduce), o.sites.end());
    const sdc::CampaignResult c = sdc::run_campaign(topo, small, o);
    Table t({"backend", "mode", "faults", "fired", "activated", "detected", "localised", "masked", "silent", "wall s"});
    const sdc::Tally& x = c.total;
    t.row({backend, std::string(sdc::mode_name(mode)), std::to_string(x.injected), std::to_string(x.fired),
           std::to_string(x.activated), std::to_string(x.detected), std::to_string(x.localised), std::to_string(x.masked),
           std::to_string(x.silent), fmt::format("{:.1f}", c.wall_s)});
    t.print();
    out["campaign"] = sdc::campaign_to_json(c, false);
  }
  write_json(args, out);
  return 0;
}
