// bench_transfer — point-to-point transfers on every shipped topology, checked against the figures
// in the topology file (not against the simulator's own formula), and the simulator's speed.
//
//   latency   64 B from cube 0's HBM to the nearest cube at each hop count (and host -> HBM,
//             HBM -> TCM). Check: exactly  source read latency + sum over hops of (port overhead +
//             wire latency [+ switch latency]) + 64 B at the slowest stage, to the picosecond (64 B
//             sit in one HBM channel, so on the GPU-like files the slowest stage is that channel).
//   bandwidth 256 B .. 1 GiB between neighbours (and host -> HBM; HBM -> TCM up to the TCM's
//             size). Check: every size takes exactly fixed delays + chunks at the slowest stage's
//             pace, never beats the configured bandwidth, and on links the largest reaches >= 99%.
//   speed     wall time per simulated transfer: every cube sends 1 MiB to its next cube, 64 rounds
//             (timing-only), and 20000 back-to-back 64 B transfers; and the traffic of a 1 GiB ring
//             all-reduce over 1024 cubes (ring4 grown), checked against the alpha-beta time.
//
//   bench_transfer [--json FILE] [--quick] [TOPOLOGY...]
// Exits 1 if a check fails.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_util.h"
#include "sim/core/barrier.h"
#include "sim/core/simulator.h"
#include "sim/hw/format.h"
#include "sim/hw/system.h"

using namespace cubesim;
using namespace cubesim::bench;
using hw::Memory;
using hw::System;
using sim::Duration;
using sim::Time;

namespace {

// Simulated time of one transfer on an idle system.
Duration one_transfer(System& sys, Memory& src, Memory& dst, std::uint64_t bytes) {
  Duration d = 0;
  sys.simulator().spawn("bench", [&] {
    const Time t0 = sys.simulator().now();
    sys.transfer(src.at(0), dst.at(0), bytes);
    d = sys.simulator().now() - t0;
  });
  sys.simulator().run();
  return d;
}

hw::SystemOptions timing_only() {
  hw::SystemOptions o;
  o.functional = false;
  o.hazards = hw::HazardMode::kOff;
  return o;
}

// The expected time from the topology's figures alone: the source memory's read latency, every
// hop's overhead and latency (plus the switch's on links leaving it), the DMA request overhead when
// a TCM is involved; then the chunks at the slowest stage's pace, the bytes crossing it once
// (cut-through). A small message is one chunk: fixed delays + its bytes at the slowest stage.
// A memory is `channels` equal channels with blocks of `interleave` bytes dealt round them: an
// access of b bytes (from a channel boundary) takes as long as its busiest channel's share.
struct Expected {
  struct Stage {
    sim::Bandwidth bw;
    std::uint64_t channels = 1, interleave = 1;
    Duration time(std::uint64_t b) const {
      const std::uint64_t busiest = b / (interleave * channels) * interleave + std::min(b % (interleave * channels), interleave);
      return sim::transfer_time(channels == 1 ? b : busiest, sim::Bandwidth{bw.bytes_per_s / channels});
    }
  };
  Duration fixed = 0;
  std::uint64_t chunk = 0;
  std::vector<Stage> stages;
  std::uint64_t slowest_bps = ~0ull;  // for the "of link" column
  Duration slowest(std::uint64_t b) const {
    Duration d = 0;
    for (const Stage& s : stages) d = std::max(d, s.time(b));
    return d;
  }
  Duration time(std::uint64_t bytes) const {
    const std::uint64_t n = (bytes + chunk - 1) / chunk;
    return fixed + (n - 1) * slowest(chunk) + slowest(bytes - (n - 1) * chunk);
  }
  void stage(sim::Bandwidth b) {
    stages.push_back({b});
    slowest_bps = std::min(slowest_bps, b.bytes_per_s);
  }
  void memory(const hw::HbmSpec& m) {
    stages.push_back({m.bandwidth, m.channels, m.interleave_bytes});
    slowest_bps = std::min(slowest_bps, m.bandwidth.bytes_per_s);
  }
};

Expected expect_dma(const hw::Topology& t) {
  const hw::CubeSpec& c = t.cubes[0];
  Expected e;
  e.fixed = c.hbm.latency + c.pe.dma.overhead;  // writes are posted: the TCM adds no latency
  e.chunk = c.pe.dma.chunk_bytes;
  e.memory(c.hbm);
  e.stage(c.pe.dma.read);
  e.stage(c.pe.tcm.bandwidth);
  return e;
}

Expected expect_host(const hw::Topology& t) {
  Expected e;
  e.fixed = t.host.latency + t.host.link.overhead + t.host.link.latency;
  e.chunk = t.chunk_bytes;
  e.stage(t.host.bandwidth);
  e.stage(t.host.link.bandwidth);
  e.memory(t.cubes[0].hbm);
  return e;
}

Expected expect_cube_to_cube(const hw::Topology& t, const std::vector<int>& route, int src, int dst) {
  Expected e;
  e.chunk = t.chunk_bytes;
  e.fixed = t.cubes[static_cast<std::size_t>(src)].hbm.latency;
  e.memory(t.cubes[static_cast<std::size_t>(src)].hbm);
  e.memory(t.cubes[static_cast<std::size_t>(dst)].hbm);
  for (int li : route) {
    const hw::LinkSpec& l = t.links[static_cast<std::size_t>(li)];
    e.fixed += l.figures.overhead + l.figures.latency + (l.from == hw::kSwitchNode ? t.switch_latency : 0);
    e.stage(l.figures.bandwidth);
  }
  return e;
}

struct Row {
  std::string topology, kind, path;
  int hops = 0;
  std::uint64_t bytes = 0;
  Duration sim = 0, expected = 0;
  double gbps = 0, link_gbps = 0;
  bool ok = true;
};

std::string pct(double x) { return fmt::format("{:.2f}%", 100.0 * x); }

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args = parse_bench_args(argc, argv, "bench_transfer");
  std::vector<std::string> names = args.rest.empty() ? hw::list_topologies() : args.rest;
  std::vector<Row> rows;
  nlohmann::json out = {{"bench", "bench_transfer"}, {"topologies", nlohmann::json::array()}};
  bool all_ok = true;
  Table lat({"topology", "path", "hops", "bytes", "simulated", "expected (figures)", "check"});
  Table bw({"topology", "path", "bytes", "simulated", "GB/s", "of link", "check"});
  Table speed({"topology", "scenario", "transfers", "events/transfer", "wall/transfer", "transfers/s"});

  for (const std::string& name : names) {
    const hw::Topology topo = hw::load_topology(name);
    nlohmann::json jt = {{"name", name}, {"cubes", topo.cubes.size()}, {"network", hw::network_kind_name(topo.network)},
                         {"latency", nlohmann::json::array()}, {"bandwidth", nlohmann::json::array()}};
    const int n = static_cast<int>(topo.cubes.size());
    auto record_latency = [&](const std::string& path, int hops, Duration got, const Expected& e) {
      const Duration want = e.time(64);
      const bool ok = got == want;
      all_ok = all_ok && ok;
      lat.row({name, path, std::to_string(hops), "64", sim::format_time(got), sim::format_time(want), ok ? "exact" : "FAIL"});
      jt["latency"].push_back({{"path", path}, {"hops", hops}, {"bytes", 64}, {"sim_ps", got}, {"expected_ps", want}, {"ok", ok}});
    };

    // ---- latency against hop count ----
    {
      sim::Simulator sim;
      System sys(sim, topo, timing_only());
      std::vector<int> seen;
      for (int d = 1; d < n; ++d) {
        const int h = sys.hops(0, d);
        if (std::find(seen.begin(), seen.end(), h) != seen.end()) continue;
        seen.push_back(h);
        const Duration got = one_transfer(sys, sys.hbm(0), sys.hbm(d), 64);
        record_latency(fmt::format("cube0.hbm -> cube{}.hbm", d), h, got, expect_cube_to_cube(topo, sys.route(0, d), 0, d));
      }
      // HBM -> TCM through the PE's DMA read channel (every topology; the only path of single_cube).
      record_latency("cube0.hbm -> cube0.pe0.tcm (DMA)", 0, one_transfer(sys, sys.hbm(0), sys.tcm(0, 0), 64),
                     expect_dma(topo));
      if (sys.has_host()) {
        record_latency("host -> cube0.hbm", 1, one_transfer(sys, sys.host_memory(), sys.hbm(0), 64), expect_host(topo));
      }
    }

    // ---- bandwidth against message size ----
    {
      struct Pair {
        std::string label;
        std::function<Memory&(System&)> src, dst;
        double link_gbps;  // the configured figure
        bool link;         // a link path: the largest message must reach 99% of link_gbps
        Expected expect;
      };
      std::vector<Pair> pairs;
      if (n > 1) {
        const int nb = topo.links[0].to >= 0 ? topo.links[0].to : 1;
        sim::Simulator s0;
        System probe(s0, topo, timing_only());
        const hw::PathFigures f = probe.path_figures(probe.hbm(0), probe.hbm(nb));
        double link = 1e30;
        for (int li : f.links) link = std::min(link, topo.links[static_cast<std::size_t>(li)].figures.bandwidth.gbps());
        pairs.push_back({fmt::format("cube0.hbm -> cube{}.hbm", nb), [](System& s) -> Memory& { return s.hbm(0); },
                         [nb](System& s) -> Memory& { return s.hbm(nb); }, link, true,
                         expect_cube_to_cube(topo, probe.route(0, nb), 0, nb)});
      }
      {
        // HBM -> TCM: at most a TCM's worth, so the request overhead and HBM latency keep it below
        // the DMA channel's rate; checked against the figures, not against 99%.
        const Expected e = expect_dma(topo);
        pairs.push_back({"cube0.hbm -> cube0.pe0.tcm (DMA)", [](System& s) -> Memory& { return s.hbm(0); },
                         [](System& s) -> Memory& { return s.tcm(0, 0); }, static_cast<double>(e.slowest_bps) / 1e9,
                         false, e});
      }
      if (topo.host.present) {
        pairs.push_back({"host -> cube0.hbm", [](System& s) -> Memory& { return s.host_memory(); },
                         [](System& s) -> Memory& { return s.hbm(0); }, topo.host.link.bandwidth.gbps(), true,
                         expect_host(topo)});
      }
      for (const Pair& p : pairs) {
        std::vector<std::uint64_t> sizes = {256, 4096, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1ull << 30};
        sim::Simulator s0;
        System probe(s0, topo, timing_only());
        const std::uint64_t cap = std::min(p.src(probe).capacity(), p.dst(probe).capacity());
        sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](std::uint64_t b) { return b > cap; }), sizes.end());
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const std::uint64_t b = sizes[i];
          sim::Simulator sim;
          System sys(sim, topo, timing_only());
          const Duration got = one_transfer(sys, p.src(sys), p.dst(sys), b);
          const double gbps = static_cast<double>(b) / sim::to_s(got) / 1e9;
          const double frac = gbps / p.link_gbps;
          const bool largest = i + 1 == sizes.size();
          // Every size takes exactly what the figures say; none beats the configured bandwidth; on a
          // link the largest reaches 99% of it.
          const Duration want = p.expect.time(b);
          const bool exact = got == want;
          const bool reaches = !(p.link && largest) || frac >= 0.99;
          const bool ok = exact && frac <= 1.0 + 1e-9 && reaches;
          all_ok = all_ok && ok;
          bw.row({name, p.label, hw::format_bytes(b), sim::format_time(got), fmt::format("{:.1f}", gbps), pct(frac),
                  !ok ? "FAIL" : (p.link && largest ? "exact, >= 99%" : "exact")});
          jt["bandwidth"].push_back({{"path", p.label}, {"bytes", b}, {"sim_ps", got}, {"expected_ps", want},
                                     {"gbps", gbps}, {"link_gbps", p.link_gbps}, {"fraction", frac}, {"ok", ok}});
        }
      }
    }

    // ---- simulator speed ----
    {
      const int rounds = args.quick ? 8 : 64;
      if (n > 1) {
        sim::Simulator sim;
        System sys(sim, topo, timing_only());
        for (int c = 0; c < n; ++c) {
          sim.spawn(fmt::format("rank{}", c), [&, c] {
            for (int r = 0; r < rounds; ++r) sys.transfer(sys.hbm(c).at(0), sys.hbm((c + 1) % n).at(1 << 20), 1 << 20);
          });
        }
        const double t0 = wall_seconds();
        sim.run();
        const double wall = wall_seconds() - t0;
        const double per = wall / static_cast<double>(sys.transfers_completed());
        const double ev = static_cast<double>(sim.events_executed()) / static_cast<double>(sys.transfers_completed());
        speed.row({name, "every cube -> next, 1 MiB", std::to_string(sys.transfers_completed()), fmt::format("{:.1f}", ev),
                   fmt::format("{:.2f} us", per * 1e6), fmt::format("{:.0f}", 1.0 / per)});
        jt["speed_ring_1MiB"] = {{"transfers", sys.transfers_completed()}, {"wall_s", wall}, {"wall_per_transfer_s", per},
                                 {"events_per_transfer", ev}};
      }
      {
        sim::Simulator sim;
        System sys(sim, topo, timing_only());
        const int count = args.quick ? 2000 : 20000;
        const int dst = n > 1 ? n - 1 : 0;
        Memory& to = n > 1 ? sys.hbm(dst) : sys.tcm(0, 0);
        sim.spawn("small", [&] {
          for (int i = 0; i < count; ++i) sys.transfer(sys.hbm(0).at(0), to.at(0), 64);
        });
        const double t0 = wall_seconds();
        sim.run();
        const double per = (wall_seconds() - t0) / count;
        const double ev = static_cast<double>(sim.events_executed()) / count;
        speed.row({name, fmt::format("64 B back to back to {}", to.name()), std::to_string(count), fmt::format("{:.1f}", ev),
                   fmt::format("{:.2f} us", per * 1e6), fmt::format("{:.0f}", 1.0 / per)});
        jt["speed_small"] = {{"transfers", count}, {"wall_per_transfer_s", per}, {"events_per_transfer", ev}};
      }
    }
    out["topologies"].push_back(jt);
  }

  // ---- scale: the traffic of a ring all-reduce of 1 GiB over 1024 cubes ----
  // Each of 2 x 1023 steps, every cube sends 1 MiB to the next and all meet at a barrier: the data
  // movement (not the reduction) of the runtime's 1024-rank timing-only ring all-reduce.
  if (args.rest.empty()) {
    const int n = args.quick ? 128 : 1024;
    sim::Simulator sim;
    System sys(sim, hw::load_topology("ring4", {{"cubes", n}}), timing_only());
    const std::uint64_t chunk = (1ull << 30) / static_cast<std::uint64_t>(n);
    sim::Barrier step(static_cast<std::size_t>(n), "step");
    for (int c = 0; c < n; ++c) {
      sim.spawn(fmt::format("rank{}", c), [&, c] {
        for (int s = 0; s < 2 * (n - 1); ++s) {
          sys.transfer(sys.hbm(c).at(0), sys.hbm((c + 1) % n).at(1ull << 30), chunk);
          step.arrive_and_wait();
        }
      });
    }
    const double t0 = wall_seconds();
    sim.run();
    const double wall = wall_seconds() - t0;
    const Duration ideal = 2 * static_cast<Duration>(n - 1) * sys.path_figures(sys.hbm(0), sys.hbm(1)).time(chunk);
    const bool ok = sim.now() == ideal;
    all_ok = all_ok && ok;
    const double per = wall / static_cast<double>(sys.transfers_completed());
    speed.row({fmt::format("ring4 x{} cubes", n / 4), fmt::format("ring all-reduce traffic, 1 GiB ({} steps)", 2 * (n - 1)),
               std::to_string(sys.transfers_completed()),
               fmt::format("{:.1f}", static_cast<double>(sim.events_executed()) / static_cast<double>(sys.transfers_completed())),
               fmt::format("{:.2f} us", per * 1e6), fmt::format("{:.0f}", 1.0 / per)});
    fmt::print("ring all-reduce traffic on {} cubes: simulated {} (alpha-beta {}: {}), wall {:.2f} s\n\n", n,
               sim::format_time(sim.now()), sim::format_time(ideal), ok ? "exact" : "FAIL", wall);
    out["ring_allreduce_traffic"] = {{"cubes", n}, {"bytes", 1ull << 30}, {"sim_ps", sim.now()}, {"alpha_beta_ps", ideal},
                                     {"ok", ok}, {"wall_s", wall}, {"transfers", sys.transfers_completed()}};
  }

  fmt::print("Latency against hop count (64 B; expected = figures from the topology file)\n");
  lat.print();
  fmt::print("\nBandwidth against message size (the largest must reach >= 99% of the configured link)\n");
  bw.print();
  fmt::print("\nSimulator speed (timing-only; wall time per simulated transfer)\n");
  speed.print();
  fmt::print("\nall checks {}\n", all_ok ? "pass" : "FAIL");
  out["all_checks_pass"] = all_ok;
  write_json(args, out);
  return all_ok ? 0 : 1;
}
