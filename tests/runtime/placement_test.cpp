// Rank placement on the sim backend: rank r on cubes[r] (SimBackendOptions::cubes, the registry's
// option "cubes"): tensors, GEMMs and transfers use those cubes and no others, and a bad placement
// is a clear error.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "collective_harness.h"
#include "runtime/backend_registry.h"
#include "runtime/collectives.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "runtime/sim_backend.h"

namespace cubesim::rt {
namespace {

using testing::error_of;

// Bytes (or operations) each unit served in the run, by name.
std::map<std::string, std::uint64_t> bytes_by_unit(const RunReport& rep) {
  std::map<std::string, std::uint64_t> m;
  for (const hw::UnitUsage& u : rep.usage()) m[u.name] = u.bytes;
  return m;
}

TEST(Placement, RanksRunOnTheCubesGiven) {
  const hw::Topology topo = hw::load_topology("h200x8");
  auto ctx = make_sim_context({}, topo, {.cubes = {4, 6}});
  EXPECT_EQ(ctx->world_size(), 2);
  EXPECT_EQ(ctx->backend().device_of(0), 4);
  EXPECT_EQ(ctx->backend().device_of(1), 6);
  const std::int64_t n = 1 << 20, m = 256, k = 128, cols = 256;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * cols)), v(n);
  for (auto* x : {&a, &b, &v}) {
    for (float& f : *x) f = dist(rng);
  }
  const RunReport rep = ctx->spawn(2, [&](int r) {
    Tensor t = ctx->from_host_f32(r, {n}, DType::bf16, v);
    all_reduce(t);
    Tensor ta = ctx->from_host_f32(r, {m, k}, DType::bf16, a);
    Tensor tb = ctx->from_host_f32(r, {k, cols}, DType::bf16, b);
    Tensor tc = ctx->empty(r, {m, cols}, DType::bf16);
    matmul(ta, tb, nullptr, tc);
  });
  const auto by = bytes_by_unit(rep);
  // The all-reduce crossed the switch between cubes 4 and 6 only: each direction carried half the
  // vector (ring, 2 ranks: reduce-scatter and all-gather of n/2 elements each way).
  const std::uint64_t half = static_cast<std::uint64_t>(n) / 2 * 2;  // bf16
  EXPECT_EQ(by.at("link c4->sw"), 2 * half);
  EXPECT_EQ(by.at("link sw->c6"), 2 * half);
  EXPECT_EQ(by.at("switch.port c4->sw"), 2 * half);
  EXPECT_EQ(by.at("switch.port sw->c6"), 2 * half);
  EXPECT_EQ(by.at("switch.port c6->sw"), 2 * half);
  for (int c : {0, 1, 2, 3, 5, 7}) {
    EXPECT_EQ(by.at("link c" + std::to_string(c) + "->sw"), 0u) << c;
    EXPECT_EQ(by.at("switch.port sw->c" + std::to_string(c)), 0u) << c;
    EXPECT_EQ(by.at("cube" + std::to_string(c) + ".hbm"), 0u) << c;
    EXPECT_EQ(by.at("cube" + std::to_string(c) + ".pe0.mac"), 0u) << c;
  }
  // Each GEMM ran on its rank's cube: m*k*cols MACs over the PEs of cubes 4 and 6.
  std::uint64_t macs4 = 0, macs6 = 0;
  for (const hw::UnitUsage& u : rep.usage()) {
    if (u.kind != hw::UnitKind::mac) continue;
    if (u.place.cube == 4) macs4 += u.bytes;
    if (u.place.cube == 6) macs6 += u.bytes;
  }
  EXPECT_EQ(macs4, static_cast<std::uint64_t>(m * k * cols));
  EXPECT_EQ(macs6, static_cast<std::uint64_t>(m * k * cols));
}

TEST(Placement, IdentityPlacementIsTheDefaultAndTimesAgree) {
  const hw::Topology topo = hw::load_topology("h200x8");
  auto run = [&](std::vector<int> cubes) {
    ContextOptions o;
    o.world_size = 4;
    auto ctx = make_sim_context(o, topo, {.timing_only = true, .cubes = std::move(cubes)});
    return ctx->spawn(4, [&](int r) {
      Tensor t = ctx->empty(r, {1 << 20}, DType::bf16);
      all_reduce(t);
    });
  };
  const RunReport a = run({}), b = run({0, 1, 2, 3}), c = run({7, 5, 3, 1});
  EXPECT_EQ(a.sim_time, b.sim_time);
  EXPECT_EQ(a.event_hash, b.event_hash);
  EXPECT_EQ(a.sim_time, c.sim_time);  // every pair is alike on a switch
}

TEST(Placement, BadPlacementsAreClearErrors) {
  const hw::Topology topo = hw::load_topology("h200x8");
  std::string e = error_of([&] { make_sim_context({}, topo, {.cubes = {0, 3, 3}}); });
  EXPECT_EQ(e, "backend 'sim': option cubes (ranks_on in Python, --cubes in the CLI): cube 3 is named twice (ranks 1 "
               "and 2); each rank needs a cube of its own, 0 to 7 in topology 'h200x8'");
  e = error_of([&] { make_sim_context({}, topo, {.cubes = {0, 8}}); });
  EXPECT_EQ(e, "backend 'sim': option cubes (ranks_on in Python, --cubes in the CLI): cube 8 (for rank 1) does not "
               "exist; topology 'h200x8' has cubes 0 to 7");
  e = error_of([&] { make_sim_context({}, topo, {.cubes = {-1}}); });
  EXPECT_NE(e.find("cube -1 (for rank 0) does not exist; topology 'h200x8' has cubes 0 to 7"), std::string::npos) << e;
  e = error_of([&] { make_context("sim", {}, {.topology = &topo, .options = {{"cubes", "0-3"}}}); });
  EXPECT_EQ(e, "backend 'sim': option 'cubes' is \"0-3\"; give a list of integers, e.g. [0, 1, 2, 3]");
  e = error_of([&] { make_context("sim", {}, {.topology = &topo, .options = {{"cubes", {0, 1.5}}}}); });
  EXPECT_NE(e.find("give a list of integers"), std::string::npos) << e;
  // More ranks than cubes placed.
  e = error_of([&] { make_sim_context({.world_size = 3}, topo, {.cubes = {1, 2}}); });
  EXPECT_NE(e.find("world_size 3 exceeds the 2 devices"), std::string::npos) << e;
  // Through the registry the placement works too.
  auto ctx = make_context("sim", {}, {.topology = &topo, .options = {{"cubes", {5, 2}}}});
  EXPECT_EQ(ctx->world_size(), 2);
  EXPECT_EQ(ctx->backend().device_of(1), 2);
}

}  // namespace
}  // namespace cubesim::rt
