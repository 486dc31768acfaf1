// The backend registry: every backend by name, its options checked by the backend, errors that name
// the valid choices.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "collective_harness.h"
#include "runtime/backend_registry.h"
#include "runtime/collectives.h"
#include "runtime/errors.h"
#include "runtime/sim_backend.h"

namespace cubesim::rt {
namespace {

using testing::error_of;

TEST(BackendRegistry, EveryRowHasANameSummaryAndMaker) {
  std::set<std::string> names;
  for (const BackendInfo* b : backends()) {
    EXPECT_FALSE(b->name.empty());
    EXPECT_FALSE(b->summary.empty()) << b->name;
    EXPECT_FALSE(b->options.empty()) << b->name;
    EXPECT_NE(b->make, nullptr) << b->name;
    EXPECT_EQ(&find_backend(b->name), b);
    EXPECT_TRUE(names.insert(std::string(b->name)).second) << "duplicate " << b->name;
  }
  for (const char* b : {"sim", "host", "cuda"}) EXPECT_TRUE(names.count(b)) << b;
  EXPECT_TRUE(find_backend("sim").unavailable().empty());
  EXPECT_TRUE(find_backend("host").unavailable().empty());
  EXPECT_TRUE(find_backend("sim").simulates);
  EXPECT_FALSE(find_backend("host").simulates);
  EXPECT_EQ(find_backend("host").devices(), -1);
  const std::string e = error_of([] { find_backend("tpu"); });
  EXPECT_NE(e.find("unknown backend 'tpu': valid backends are "), std::string::npos) << e;
  for (const BackendInfo* b : backends()) EXPECT_NE(e.find(std::string(b->name)), std::string::npos) << e;
}

TEST(BackendRegistry, MakesContextsThatRunLikeTheTypedFactories) {
  const hw::Topology topo = hw::load_topology("ring4");
  auto by_name = make_context("sim", {.world_size = 4}, {.topology = &topo, .options = {{"timing_only", true}}});
  auto typed = make_sim_context({.world_size = 4}, topo, {.timing_only = true});
  EXPECT_EQ(by_name->backend().name(), "sim");
  EXPECT_TRUE(by_name->backend().timing_only());
  EXPECT_EQ(by_name->backend().topology()->name, "ring4");
  auto run = [](Context& ctx) {
    return ctx.spawn(4, [&](int r) {
      Tensor t = ctx.empty(r, {1 << 16}, DType::bf16);
      all_reduce(t);
    });
  };
  const RunReport a = run(*by_name), b = run(*typed);
  EXPECT_EQ(a.sim_time, b.sim_time);
  EXPECT_EQ(a.event_hash, b.event_hash);
  auto def = make_context("sim", {}, {});
  EXPECT_EQ(def->backend().topology()->name, kDefaultTopology);
  auto host = make_context("host", {.world_size = 3});
  EXPECT_EQ(host->world_size(), 3);
  EXPECT_TRUE(host->backend().reference());
  EXPECT_EQ(host->backend().topology(), nullptr);
}

TEST(BackendRegistry, OptionsAreTheBackendsOwnAndChecked) {
  const hw::Topology topo = hw::load_topology("ring4");
  std::string e = error_of([&] { make_context("sim", {}, {.topology = &topo, .options = {{"gemm_mode", "exact"}}}); });
  EXPECT_NE(e.find("backend 'sim' has no option 'gemm_mode'; its options: timing_only, timing, check_uninitialized, hazards"),
            std::string::npos)
      << e;
  e = error_of([&] { make_context("sim", {}, {.topology = &topo, .options = {{"hazards", "sometimes"}}}); });
  EXPECT_NE(e.find("hazards: 'sometimes' is not valid; use one of throw, record, off"), std::string::npos) << e;
  e = error_of([&] { make_context("sim", {}, {.topology = &topo, .options = {{"timing_only", 1}}}); });
  EXPECT_NE(e.find("option 'timing_only' is 1; give true or false"), std::string::npos) << e;
  e = error_of([&] { make_context("host", {.world_size = 2}, {.topology = &topo}); });
  EXPECT_NE(e.find("backend 'host' simulates no system and takes no topology (got 'ring4')"), std::string::npos) << e;
  e = error_of([&] { make_context("host", {.world_size = 2}, {.options = {{"timing_only", true}}}); });
  EXPECT_NE(e.find("backend 'host' has no option 'timing_only'; its options: gemm_numerics"), std::string::npos) << e;
  EXPECT_THROW(make_context("host", {.world_size = 0}), RuntimeError);
}

TEST(BackendRegistry, AnUnavailableBackendSaysWhy) {
  const BackendInfo& cuda = find_backend("cuda");
  if (cuda.unavailable().empty()) GTEST_SKIP() << "a GPU is usable here";
  try {
    make_context("cuda", {.world_size = 1});
    FAIL() << "made a cuda context without a usable GPU";
  } catch (const BackendUnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'cuda'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use backend 'sim' or 'host'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cubesim::rt
