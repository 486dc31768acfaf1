// bench_collectives — collectives on the shipped topologies, in the manner of nccl-tests.
//
// For each topology (every shipped one with at least two cubes), collective, algorithm and size
// (1 KiB to 1 GiB in x4 steps) it reports the simulated time (latest rank's end minus earliest
// rank's start, the ranks starting together after a barrier), algbw = bytes / time, busbw = algbw x
// the nccl-tests factor (all_reduce 2(p-1)/p, reduce_scatter and all_gather (p-1)/p, broadcast 1)
// and the simulator's wall time for the collective. "bytes" is nccl-tests' size: the buffer for
// all_reduce and broadcast, the whole output for all_gather, the whole input for reduce_scatter.
// The sweep runs timing-only: its times equal a functional run's (tests/runtime pins that).
//
// Then the simulator's own speed (issue 4 targets), wall time around the collective alone:
//   functional ring all-reduce, 64 ranks (torus8x8), 64 MiB bf16:          <= 3 s (issue 14)
//   timing-only ring all-reduce, 1024 ranks (ring4 with cubes=1024), 1 GiB: <= 3 s chunk level, <= 1 s flow level
//   the same at 4096 ranks (--big):                                         <= 30 s / <= 10 s, peak RSS <= 1 GiB
// and wall time against ranks (8 to 1024), timing-only ring all-reduce of 1 GiB on a ring.
// Rows of the nccl algorithm show its plan per size ("nccl ring/LL x16"; JSON: nccl_plan and
// nccl_predicted_us, the NCCL model's time), and run on 2 of h200x4's GPUs as well, for the
// comparison with real NCCL's busbw.
//
// With --timing both, every sweep row is run at the flow level too (SystemOptions::timing): its time,
// its error against the chunk level and its wall time, then the largest |error| per topology and
// algorithm from 1 MiB and below (target: <= 2% from 1 MiB). The speed section runs the scaling at
// both levels, each run in a child process of its own (its peak RSS), and fits wall ~ p^k and
// RSS ~ p^k over the larger half; --big adds 2048 and 4096 ranks.
//
//   bench_collectives [--json FILE] [--quick] [--topology NAME] [--no-sweep] [--no-targets]
//                     [--timing chunk|flow|both] [--big] [--max-mib N] [--ranks P,P,...] [--repeat N]
//                     [--rank-code] [--algorithm NAME]
// --timing chunk|flow limits the speed section to that level; --ranks runs only those scaling points
// (and not the functional row), e.g. `--no-sweep --timing flow --ranks 1024` to time or profile one;
// --algorithm runs the scaling points' all-reduce with another algorithm (hierarchical: its sub-rings
// by callbacks too; the targets are the ring's and are not marked then).
// --repeat N runs each speed point N times (each in its own child) and reports the median wall time,
// every run's in the JSON (`wall_runs_s`): on a shared or noisy host one run can be 20% off.
// --rank-code runs timing-only rings by the ranks' per-message code instead of callbacks
// (ContextOptions::callback_collectives = false; the same simulated times), to compare the two.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "runtime/algorithms/nccl.h"
#include "runtime/collectives.h"
#include "runtime/run_collective.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"

using namespace cubesim;
using namespace cubesim::rt;
using namespace cubesim::bench;

namespace {

double bus_factor(const std::string& coll, int p) {
  if (coll == "all_reduce") return 2.0 * (p - 1) / p;
  if (coll == "broadcast") return 1.0;
  return static_cast<double>(p - 1) / p;
}

struct Row {
  std::string topology, collective, algorithm;
  std::string nccl_plan;      // nccl: what it chose ("ring/LL x16")
  double nccl_predicted_us = 0;  // and the NCCL model's time for it
  int ranks = 0;
  std::uint64_t bytes = 0;
  double sim_time_us = 0, algbw = 0, busbw = 0, wall_s = 0;
  bool functional = false;
  bool flow = false;  // timed at the flow level
  double peak_rss_mb = 0;  // the run's own peak (run_isolated), 0 when not measured
  std::uint64_t events = 0;  // simulator events of the run (per message: the model's cost)
  std::vector<double> wall_runs;  // --repeat N: every run's wall time (wall_s is their median)
};

// Least-squares slope of log(y) on log(x): the exponent of y ~ x^k.
double fitted_exponent(const std::vector<double>& x, const std::vector<double>& y) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double lx = std::log(x[i]), ly = std::log(std::max(y[i], 1e-9));
    sx += lx;
    sy += ly;
    sxx += lx * lx;
    sxy += lx * ly;
  }
  const double den = n * sxx - sx * sx;
  return den != 0 ? (n * sxy - sx * sy) / den : 0;
}

// Random finite bf16/f16 bit patterns, cheaply: a splitmix stream per rank.
void random_input(int rank, std::span<std::uint8_t> bytes) {
  std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
  for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
    s += 0x9e3779b97f4a7c15ull;
    const std::uint64_t z = (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9ull;
    const auto b = static_cast<std::uint16_t>(((z >> 40) & 0x807f) | 0x3c00);  // random sign and mantissa, exponent near 1
    std::memcpy(bytes.data() + i, &b, 2);
  }
}

bool g_rank_code = false;  // --rank-code

Row run_one(const std::string& topo, const std::vector<std::pair<std::string, nlohmann::json>>& overrides,
            const std::string& coll, Algorithm a, std::uint64_t bytes, DType d, bool functional,
            hw::TimingModel timing = hw::TimingModel::chunk) {
  ContextOptions o;
  o.stack_size = 64 * 1024;
  o.callback_collectives = !g_rank_code;
  const hw::Topology topology = hw::load_topology(topo, overrides);
  auto ctx = make_sim_context(o, topology, {.timing_only = !functional, .timing = timing});
  const int p = ctx->world_size();
  const std::int64_t elems = std::max<std::int64_t>(1, static_cast<std::int64_t>(bytes / dtype_size(d)));
  const bool whole = coll == "all_reduce" || coll == "broadcast";
  const std::int64_t per = whole ? elems : std::max<std::int64_t>(1, elems / p);
  CollectiveCase c{.collective = parse_collective_kind(coll),
                   .dtype = d,
                   .count = coll == "reduce_scatter" ? per * p : per,
                   .options = {.algorithm = a, .accumulate_f32 = std::nullopt},
                   .ranks = p,
                   .make_input = functional ? random_input : nullptr,  // made on each rank, not held for all
                   .read_outputs = false,
                   .timed = true};
  const CollectiveOutcome res = run_collective(*ctx, c);
  Row row;
  row.topology = topo;
  row.collective = coll;
  row.algorithm = std::string(algorithm_name(a));
  row.ranks = p;
  row.bytes = static_cast<std::uint64_t>(whole ? per : per * p) * dtype_size(d);
  const sim::Duration t =
      *std::max_element(res.end.begin(), res.end.end()) - *std::min_element(res.start.begin(), res.start.end());
  row.sim_time_us = sim::to_us(t);
  row.algbw = t ? static_cast<double>(row.bytes) / sim::to_s(t) / 1e9 : 0;
  row.busbw = row.algbw * bus_factor(coll, p);
  row.wall_s = res.wall_s;
  row.events = res.report.events;
  row.functional = functional;
  row.flow = timing == hw::TimingModel::flow;
  if (a == Algorithm::nccl) {
    const hw::NcclSpec& spec = topology.nccl.present ? topology.nccl : hw::NcclSpec::defaults();
    const algo::NcclPlan plan = algo::nccl_plan(c.collective, p, row.bytes, spec);
    row.nccl_plan = plan.describe();
    row.nccl_predicted_us = plan.predicted_us;
  }
  return row;
}

nlohmann::json to_json(const Row& r) {
  nlohmann::json j = {{"topology", r.topology}, {"collective", r.collective}, {"algorithm", r.algorithm},
                      {"ranks", r.ranks},       {"bytes", r.bytes},           {"sim_time_us", r.sim_time_us},
                      {"algbw_GBps", r.algbw},  {"busbw_GBps", r.busbw},      {"wall_s", r.wall_s},
                      {"functional", r.functional}, {"timing", r.flow ? "flow" : "chunk"},
                      {"events", r.events}};
  if (r.peak_rss_mb > 0) j["peak_rss_MB"] = r.peak_rss_mb;
  if (r.wall_runs.size() > 1) j["wall_runs_s"] = r.wall_runs;
  if (!r.nccl_plan.empty()) {
    j["nccl_plan"] = r.nccl_plan;
    j["nccl_predicted_us"] = r.nccl_predicted_us;
  }
  return j;
}

// The algorithm column: nccl with its plan.
std::string algorithm_cell(const Row& r) { return r.nccl_plan.empty() ? r.algorithm : r.algorithm + " " + r.nccl_plan; }

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{}G", b >> 30);
  if (b >= (1ull << 20)) return fmt::format("{}M", b >> 20);
  if (b >= (1ull << 10)) return fmt::format("{}K", b >> 10);
  return fmt::format("{}", b);
}


// Runs fn in a child process and returns its Row with the child's own peak RSS: each scaling point's
// memory, not the bench process's peak so far.
template <class F>
Row run_isolated(F&& fn) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("bench_collectives: pipe failed");
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("bench_collectives: fork failed");
  if (pid == 0) {
    close(fds[0]);
    // A child starts with its parent's peak RSS: reset it to what is resident now (Linux >= 4.0).
    if (FILE* cr = std::fopen("/proc/self/clear_refs", "w")) {
      std::fputs("5", cr);
      std::fclose(cr);
    }
    int rc = 0;
    std::string msg;
    try {
      msg = to_json(fn()).dump();
    } catch (const std::exception& e) {
      msg = nlohmann::json{{"error", e.what()}}.dump();
      rc = 1;
    }
    for (std::size_t off = 0; off < msg.size();) {
      const ssize_t w = write(fds[1], msg.data() + off, msg.size() - off);
      if (w <= 0) break;
      off += static_cast<std::size_t>(w);
    }
    close(fds[1]);
    _exit(rc);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  rusage u{};
  wait4(pid, &status, 0, &u);
  const nlohmann::json j = msg.empty() ? nlohmann::json{{"error", "the child process died"}} : nlohmann::json::parse(msg);
  if (j.contains("error")) throw std::runtime_error(j["error"].get<std::string>());
  Row r;
  r.topology = j["topology"];
  r.collective = j["collective"];
  r.algorithm = j["algorithm"];
  r.ranks = j["ranks"];
  r.bytes = j["bytes"];
  r.sim_time_us = j["sim_time_us"];
  r.algbw = j["algbw_GBps"];
  r.busbw = j["busbw_GBps"];
  r.wall_s = j["wall_s"];
  r.functional = j["functional"];
  r.flow = j["timing"] == "flow";
  r.events = j["events"];
  r.peak_rss_mb = static_cast<double>(u.ru_maxrss) / 1024.0;
  return r;
}

// run_isolated `n` times: the row of the median wall time (the lower middle one for even n), every
// run's wall time kept, the largest peak RSS. (Simulated results are the same in every run.)
template <class F>
Row run_repeated(int n, F&& fn) {
  std::vector<Row> rows;
  for (int i = 0; i < n; ++i) rows.push_back(run_isolated(fn));
  std::vector<double> walls;
  double rss = 0;
  for (const Row& r : rows) {
    walls.push_back(r.wall_s);
    rss = std::max(rss, r.peak_rss_mb);
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.wall_s < b.wall_s; });
  Row r = rows[(rows.size() - 1) / 2];
  r.peak_rss_mb = rss;
  if (n > 1) r.wall_runs = walls;
  return r;
}

std::string pct(double x) { return fmt::format("{:+.2f}%", x); }

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args = parse_bench_args(argc, argv, "bench_collectives");
  std::vector<std::string> topologies;
  bool sweep = true, targets = true, big = false;
  std::uint64_t max_mib = 0;  // 0: 1 GiB (4 MiB with --quick)
  std::string timing = "chunk";
  Algorithm scale_algorithm = Algorithm::ring;  // --algorithm: the timing-only scaling runs' all-reduce
  bool timing_given = false;  // --timing chunk|flow also limits the speed section to that level
  std::vector<int> ranks_only;  // --ranks: the scaling points to run (default 8..1024, with --big to 4096)
  int repeat = 1;  // --repeat N: each speed run N times, the median reported
  for (std::size_t i = 0; i < args.rest.size(); ++i) {
    if (args.rest[i] == "--topology" && i + 1 < args.rest.size()) topologies.push_back(args.rest[++i]);
    else if (args.rest[i] == "--no-sweep") sweep = false;
    else if (args.rest[i] == "--no-targets") targets = false;
    else if (args.rest[i] == "--big") big = true;
    else if (args.rest[i] == "--rank-code") g_rank_code = true;
    else if (args.rest[i] == "--algorithm" && i + 1 < args.rest.size()) {
      scale_algorithm = parse_algorithm_for(CollectiveRequest::Kind::all_reduce, args.rest[++i]);
    }
    else if (args.rest[i] == "--max-mib" && i + 1 < args.rest.size()) max_mib = std::stoull(args.rest[++i]);
    else if (args.rest[i] == "--repeat" && i + 1 < args.rest.size()) {
      const std::string& v = args.rest[++i];
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), repeat);
      if (ec != std::errc{} || end != v.data() + v.size() || repeat < 1 || repeat > 99) {
        fmt::print(stderr, "bench_collectives: --repeat {}: give a count of runs from 1 to 99\n", v);
        return 2;
      }
    }
    else if (args.rest[i] == "--ranks" && i + 1 < args.rest.size()) {
      std::string list = args.rest[++i];
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        int p = 0;
        const auto [end, ec] = std::from_chars(list.data() + at, list.data() + comma, p);
        if (ec != std::errc{} || end != list.data() + comma || p < 2) {
          fmt::print(stderr, "bench_collectives: --ranks {}: give a comma-separated list of rank counts >= 2\n", list);
          return 2;
        }
        ranks_only.push_back(p);
        at = comma + 1;
      }
    }
    else if (args.rest[i] == "--timing" && i + 1 < args.rest.size()) {
      timing = args.rest[++i];
      timing_given = true;
      if (timing != "chunk" && timing != "flow" && timing != "both") {
        fmt::print(stderr, "bench_collectives: --timing {}: use chunk, flow or both\n", timing);
        return 2;
      }
    } else {
      fmt::print(stderr, "bench_collectives: unknown argument '{}' (valid: --json FILE, --quick, --topology NAME, "
                         "--no-sweep, --no-targets, --timing chunk|flow|both, --big, --max-mib N, --ranks P,P,..., --repeat N, --rank-code, --algorithm NAME)\n",
                 args.rest[i]);
      return 2;
    }
  }
  if (topologies.empty()) topologies = {"ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8"};
  const std::uint64_t max_bytes = max_mib > 0 ? (max_mib << 20) : args.quick ? (4ull << 20) : (1ull << 30);
  nlohmann::json out = {{"bench", "bench_collectives"}, {"rows", nlohmann::json::array()}};
  const hw::TimingModel sweep_timing = timing == "flow" ? hw::TimingModel::flow : hw::TimingModel::chunk;
  const bool compare = timing == "both";

  if (sweep) {
    std::vector<std::string> head = {"topology", "ranks", "collective", "algorithm", "bytes", "sim_time_us",
                                     "algbw_GBps", "busbw_GBps", "wall_s"};
    if (compare) {
      for (const char* h : {"flow_time_us", "flow_error", "flow_wall_s"}) head.emplace_back(h);
    }
    Table t(head);
    // Flow against chunk level: the largest |error| per topology and collective, from 1 MiB up and below.
    struct Worst {
      double large = 0, small = 0;
    };
    std::map<std::pair<std::string, std::string>, Worst> worst;
    double worst_large = 0;
    auto add_row = [&](const Row& r, const Row* f) {
      std::vector<std::string> cells = {r.topology, std::to_string(r.ranks), r.collective, algorithm_cell(r),
                                        human_bytes(r.bytes), fmt::format("{:.2f}", r.sim_time_us),
                                        fmt::format("{:.1f}", r.algbw), fmt::format("{:.1f}", r.busbw),
                                        fmt::format("{:.3f}", r.wall_s)};
      nlohmann::json j = to_json(r);
      if (f) {
        const double err = r.sim_time_us > 0 ? (f->sim_time_us / r.sim_time_us - 1.0) * 100.0 : 0.0;
        cells.push_back(fmt::format("{:.2f}", f->sim_time_us));
        cells.push_back(pct(err));
        cells.push_back(fmt::format("{:.3f}", f->wall_s));
        j["flow_time_us"] = f->sim_time_us;
        j["flow_error_pct"] = err;
        j["flow_wall_s"] = f->wall_s;
        Worst& w = worst[{r.topology + " (" + std::to_string(r.ranks) + ")", r.collective + " " + r.algorithm}];
        if (r.bytes >= (1ull << 20)) {
          w.large = std::max(w.large, std::abs(err));
          worst_large = std::max(worst_large, std::abs(err));
        } else {
          w.small = std::max(w.small, std::abs(err));
        }
      }
      t.row(cells);
      out["rows"].push_back(j);
    };
    auto run_pair = [&](const std::string& topo, const std::vector<std::pair<std::string, nlohmann::json>>& ov,
                        const std::string& coll, Algorithm a, std::uint64_t b) {
      const Row r = run_one(topo, ov, coll, a, b, DType::bf16, false, sweep_timing);
      if (!compare) return add_row(r, nullptr);
      const Row f = run_one(topo, ov, coll, a, b, DType::bf16, false, hw::TimingModel::flow);
      add_row(r, &f);
    };
    for (const auto& topo : topologies) {
      for (const char* coll : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
        for (Algorithm a : supported_algorithms(coll)) {
          for (std::uint64_t b = 1024; b <= max_bytes; b *= 4) {
            try {
              run_pair(topo, {}, coll, a, b);
            } catch (const std::exception& e) {  // e.g. halving_doubling on a non-power-of-two group
              if (b == 1024) fmt::print(stderr, "skip {} {} {}: {}\n", topo, coll, algorithm_name(a), e.what());
              break;
            }
          }
        }
      }
    }
    // nccl on 2 of h200x4's GPUs too: real NCCL's busbw is measured on 2 and 4 GPUs.
    if (std::find(topologies.begin(), topologies.end(), "h200x4") != topologies.end()) {
      for (const char* coll : {"all_reduce", "reduce_scatter", "all_gather"}) {
        for (std::uint64_t b = 1024; b <= max_bytes; b *= 4) run_pair("h200x4", {{"cubes", 2}}, coll, Algorithm::nccl, b);
      }
    }
    t.print();
    if (compare) {
      fmt::print("\nflow level against chunk level: largest |error| of the simulated time (target <= 2% from 1 MiB)\n");
      Table w({"topology", "collective", ">= 1 MiB", "< 1 MiB"});
      for (const auto& [k, v] : worst) w.row({k.first, k.second, fmt::format("{:.2f}%", v.large), fmt::format("{:.2f}%", v.small)});
      w.print();
      fmt::print("largest from 1 MiB: {:.2f}% ({})\n", worst_large, worst_large <= 2.0 ? "met" : "NOT met");
      out["flow_worst_error_pct_from_1MiB"] = worst_large;
    }
  }

  if (targets) {
    fmt::print("\nsimulator speed\n");
    Table t({"run", "timing", "ranks", "bytes", "sim_time_us", "wall_s", "peak_rss_MB", "target", "ok"});
    const std::uint64_t fbytes = args.quick ? (4ull << 20) : (64ull << 20);
    // Every run of this section in a child process of its own: its peak RSS is its own (a child
    // inherits its parent's peak, so the parent itself runs nothing large here).
    if (ranks_only.empty()) {
      Row f = run_repeated(repeat, [&] { return run_one("torus8x8", {}, "all_reduce", Algorithm::ring, fbytes, DType::bf16, true); });
      t.row({"functional ring all_reduce", "chunk", std::to_string(f.ranks), human_bytes(f.bytes),
             fmt::format("{:.1f}", f.sim_time_us), fmt::format("{:.2f}", f.wall_s), fmt::format("{:.0f}", f.peak_rss_mb),
             args.quick ? "(quick)" : "<= 3 s",
             f.wall_s <= 3 ? "yes" : "NO"});
      nlohmann::json jf = to_json(f);
      jf["target"] = "functional_64rank_64MiB";
      out["targets"].push_back(jf);
    }
    std::vector<int> scale = args.quick ? std::vector<int>{8, 64} : std::vector<int>{8, 16, 32, 64, 128, 256, 512, 1024};
    if (big && !args.quick) {
      scale.push_back(2048);
      scale.push_back(4096);
    }
    if (!ranks_only.empty()) scale = ranks_only;
    const std::uint64_t tbytes = args.quick ? (64ull << 20) : (1ull << 30);
    nlohmann::json fits = nlohmann::json::object();
    for (hw::TimingModel tm : {hw::TimingModel::flow, hw::TimingModel::chunk}) {
      if (timing_given && timing != "both" && timing != hw::timing_model_name(tm)) continue;
      const char* tname = tm == hw::TimingModel::flow ? "flow" : "chunk";
      std::vector<double> xs, walls, rss;
      for (int p : scale) {
        Row r = run_repeated(repeat, [&] { return run_one("ring4", {{"cubes", p}}, "all_reduce", scale_algorithm, tbytes, DType::bf16, false, tm); });
        std::string target;
        double limit = 0;
        // (The targets are the ring's.)
        if (p == 1024 && scale_algorithm == Algorithm::ring) limit = tm == hw::TimingModel::flow ? 1 : 3;
        if (p == 4096 && scale_algorithm == Algorithm::ring) limit = tm == hw::TimingModel::flow ? 10 : 30;
        if (limit > 0) target = fmt::format("<= {} s{}", limit, p == 4096 ? ", 1 GiB" : "");
        const bool ok = r.wall_s <= limit && (p != 4096 || r.peak_rss_mb <= 1024);
        t.row({fmt::format("timing-only {} all_reduce", algorithm_name(scale_algorithm)), tname, std::to_string(p), human_bytes(r.bytes), fmt::format("{:.1f}", r.sim_time_us),
               fmt::format("{:.2f}", r.wall_s), fmt::format("{:.0f}", r.peak_rss_mb), target,
               limit > 0 ? (ok ? "yes" : "NO") : ""});
        nlohmann::json j = to_json(r);
        j["target"] = limit > 0 ? fmt::format("timing_only_{}rank_1GiB_{}", p, tname) : "scaling";
        out["targets"].push_back(j);
        xs.push_back(p);
        walls.push_back(r.wall_s);
        rss.push_back(r.peak_rss_mb);
      }
      // Exponents over the larger half, where fixed costs no longer dominate.
      if (xs.size() < 2) continue;
      const std::size_t from = std::min(xs.size() / 2, xs.size() - 2);  // at least two points
      auto tail = [&](const std::vector<double>& v) { return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end()); };
      const double kw = fitted_exponent(tail(xs), tail(walls)), km = fitted_exponent(tail(xs), tail(rss));
      fits[tname] = {{"wall_exponent", kw}, {"rss_exponent", km}, {"from_ranks", xs[from]}};
      t.row({fmt::format("fit over {}..{} ranks", xs[from], xs.back()), tname, "", "", "",
             fmt::format("wall ~ p^{:.2f}", kw), fmt::format("rss ~ p^{:.2f}", km), "", ""});
    }
    out["scaling_fit"] = fits;
    t.print();
  }
  write_json(args, out);
  return 0;
}
