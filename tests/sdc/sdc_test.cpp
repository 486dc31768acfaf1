// The SDC model (sdc/sdc.h): clean runs match the host replay on every layer and rank; a fault at
// each site is detected and localised to where it entered; recipes and overrides refuse bad input
// naming the path.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <tuple>
#include <cstring>
#include <cmath>
#include <random>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/dtype.h"
#include "runtime/backend_registry.h"
#include "runtime/checksum.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "runtime/sim_backend.h"
#include "sdc/campaign.h"
#include "sdc/sdc.h"
#include "sim/hw/topology.h"

namespace cubesim::sdc {
namespace {

Recipe small_recipe() {
  Recipe r;
  r.layers = 4;
  r.tokens = 8;
  r.hidden = 64;
  r.ffn = 128;
  return r;
}

std::unique_ptr<rt::Context> ring4() { return rt::make_sim_context({}, hw::load_topology("ring4")); }

TEST(Sdc, ACleanRunMatchesTheReplayOnEveryLayer) {
  const Recipe r = small_recipe();
  auto ctx = ring4();
  const Result res = run(*ctx, r);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::clean) << res.verdict.text;
  EXPECT_TRUE(res.divergences.empty());
  EXPECT_TRUE(res.rank_fill_errors.empty());
  EXPECT_TRUE(res.changed_tensors.empty());
  ASSERT_EQ(res.checks.size(), 4u);
  for (int l = 1; l < 4; ++l)
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(res.checks[l][rank].word, res.checks[0][rank].word);
      EXPECT_EQ(res.checks[l][rank].mix, res.checks[0][rank].mix);
    }
  // Every rank gathers the same weight; the inputs (one seed per rank) differ.
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(res.checks[0][rank].mix[1], res.checks[0][0].mix[1]);
    EXPECT_NE(res.checks[0][rank].mix[2], res.checks[0][0].mix[2]);
  }
  // The checksums are charged on the vector units: a step takes longer with them.
  auto timing = ring4();
  const double with = step_seconds(*timing, r, 1, true).at(0), without = step_seconds(*timing, r, 1, false).at(0);
  EXPECT_GT(with, without);
  EXPECT_LT(with, 2 * without);
  // The host runs it too and agrees bit for bit.
  rt::Context host(rt::ContextOptions{.world_size = 4});
  const Result h = run(host, r);
  EXPECT_EQ(h.verdict.kind, Verdict::Kind::clean);
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(h.checks[2][rank].mix, res.checks[2][rank].mix);
}

// A layer-`layer` moment: every rank has begun that layer (from a clean run's timeline), in us
// from the run's start.
double layer_moment(const Recipe& r, int layer) {
  auto ctx = ring4();
  const sim::Time t0 = ctx->simulator().now();
  const Result clean = run(*ctx, r);
  sim::Time t = 0;
  for (const auto& s : clean.starts) t = std::max(t, s[static_cast<std::size_t>(layer + 1)]);
  return static_cast<double>(t - t0) / 1e6;
}

Result with_fault(Recipe r, RecipeFault f) {
  r.faults = {f};
  auto ctx = ring4();
  return run(*ctx, r);
}

void expect_found(const Result& res, Verdict::Kind kind, int layer, int rank) {
  ASSERT_EQ(res.faults.size(), 1u) << res.verdict.text;
  const Truth t = truth_of(res, 0);
  EXPECT_EQ(t.kind, kind);
  EXPECT_EQ(t.layer, layer);
  EXPECT_EQ(t.rank, rank);
  EXPECT_EQ(res.verdict.kind, kind) << res.verdict.text << " / " << hw::describe(res.faults[0]);
  EXPECT_EQ(res.verdict.layer, layer) << res.verdict.text;
  EXPECT_EQ(res.verdict.rank, rank) << res.verdict.text;
}

TEST(Sdc, ALinkFaultIsCorruptionInCommWhereItEntered) {
  const Recipe r = small_recipe();
  sim::Simulator s;
  hw::System sys(s, hw::load_topology("ring4"));
  const int link = sys.route(1, 2).at(0);
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::link, .model = hw::FaultModel::multi_bit, .link = link, .nth = 1, .bits = 3, .seed = 5};
  f.at_us = layer_moment(r, 2);
  const Result res = with_fault(r, f);
  expect_found(res, Verdict::Kind::comm, 2, 2);
  EXPECT_FALSE(res.changed_tensors.empty());
  // Only layer 2 differs: the later layers gather afresh.
  for (const auto& d : res.divergences) EXPECT_EQ(d.layer, 2);
}

TEST(Sdc, AFaultInTheRankFillCheckIsFoundThere) {
  sim::Simulator s;
  hw::System sys(s, hw::load_topology("ring4"));
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::link, .link = sys.route(3, 0).at(0), .nth = 1, .seed = 9};
  const Result res = with_fault(small_recipe(), f);
  expect_found(res, Verdict::Kind::comm, -1, 0);
  ASSERT_FALSE(res.rank_fill_errors.empty());
  EXPECT_NE(res.rank_fill_errors[0].find("rank 0, chunk 3"), std::string::npos) << res.rank_fill_errors[0];
}

TEST(Sdc, AGemmTileFaultIsCorruptionInCompute) {
  const Recipe r = small_recipe();
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::gemm_tile, .model = hw::FaultModel::word_burst, .cube = 3, .nth = 1, .words = 4, .seed = 2};
  f.at_us = layer_moment(r, 1);
  const Result res = with_fault(r, f);
  expect_found(res, Verdict::Kind::compute, 1, 3);
}

TEST(Sdc, AnInputCorruptedAtRestIsMemory) {
  const Recipe r = small_recipe();
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::hbm, .model = hw::FaultModel::stuck_at, .stuck_value = 1, .seed = 4};
  f.tensor = "input";
  f.layer = 3;
  f.rank = 1;
  f.at_us = layer_moment(r, 1);  // long before layer 3 reads it
  const Result res = with_fault(r, f);
  ASSERT_EQ(res.faults.size(), 1u);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::memory) << res.verdict.text;
  EXPECT_EQ(res.verdict.layer, 3);
  EXPECT_EQ(res.verdict.rank, 1);
  EXPECT_NE(res.verdict.text.find("compute_input"), std::string::npos) << res.verdict.text;
}

TEST(Sdc, DirectAllGatherLocalisesToTheReceivingRank) {
  Recipe r = small_recipe();
  r.algorithm = rt::Algorithm::direct;
  sim::Simulator s;
  hw::System sys(s, hw::load_topology("ring4"));
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::link, .link = sys.route(2, 3).at(0), .nth = 1, .seed = 6};
  f.at_us = layer_moment(r, 1);
  const Result res = with_fault(r, f);
  ASSERT_EQ(res.faults.size(), 1u);
  const Truth t = truth_of(res, 0);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::comm) << res.verdict.text;
  EXPECT_EQ(res.verdict.rank, t.rank) << res.verdict.text << " / " << hw::describe(res.faults[0]);
  EXPECT_EQ(res.verdict.layer, t.layer) << res.verdict.text;
}

TEST(Sdc, AimedFaultsOutsideTheirTensorAreRefusedAndLateOnesReported) {
  Recipe r = small_recipe();
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::hbm, .address = 1 << 20, .seed = 1};
  f.tensor = "input";
  f.at_us = 5;
  r.faults = {f};
  const hw::Topology topo = hw::load_topology("ring4");
  for (bool dry : {true, false}) {
    try {
      auto ctx = ring4();
      if (dry) validate(r, 4, &topo);
      else run(*ctx, r);
      ADD_FAILURE() << "accepted";
    } catch (const rt::RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("faults.0: address 1048576 and bytes 0 are not inside the input (1024 bytes"),
                std::string::npos)
          << e.what();
    }
  }
  // At rest, after the last rank finished: reported, not counted as injected.
  f.spec.address = 0;
  f.at_us = 1e6;
  const Result late = with_fault(small_recipe(), f);
  EXPECT_TRUE(late.faults.empty());
  ASSERT_EQ(late.faults_not_fired.size(), 1u);
  EXPECT_NE(late.faults_not_fired[0].find("it struck after the last rank finished"), std::string::npos)
      << late.faults_not_fired[0];
  // A context whose run failed keeps nothing armed.
  auto ctx = ring4();
  Recipe bad = small_recipe();
  RecipeFault early = f;
  early.at_us = 0.01;  // before the rank places the tensor
  bad.faults = {early};
  EXPECT_THROW(run(*ctx, bad), rt::RankError);
  auto* sim = dynamic_cast<rt::SimBackend*>(&ctx->backend());
  EXPECT_FALSE(sim->system().faults().armed());
  EXPECT_EQ(run(*ctx, small_recipe()).verdict.kind, Verdict::Kind::clean);
}

TEST(Sdc, SameFaultSameResult) {
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::dma, .cube = 2, .nth = 7, .seed = 3};
  const Result a = with_fault(small_recipe(), f), b = with_fault(small_recipe(), f);
  EXPECT_EQ(result_to_json(a).dump(), result_to_json(b).dump());
  EXPECT_EQ(a.report.event_hash, b.report.event_hash);
}

TEST(Sdc, AMomentPastTheEndIsReported) {
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::link, .link = 0, .seed = 3};
  f.at_us = 1e9;
  const Result res = with_fault(small_recipe(), f);
  EXPECT_TRUE(res.faults.empty());
  ASSERT_EQ(res.faults_not_fired.size(), 1u);
  EXPECT_NE(res.faults_not_fired[0].find("faults.0 (link, at 1000000000 us): never fired"), std::string::npos) << res.faults_not_fired[0];
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::clean);
}

void expect_bad(const nlohmann::json& doc, const std::string& needle, const std::vector<std::string>& sets = {}) {
  try {
    nlohmann::json d = doc;
    apply_overrides(d, sets, "r.json");
    parse_recipe(d, "r.json");
    ADD_FAILURE() << "accepted " << d.dump();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Sdc, RecipesRefuseBadInputNamingThePath) {
  using nlohmann::json;
  expect_bad(json{{"layer", 3}}, "r.json: layer: unknown key (did you mean 'layers'?)");
  expect_bad(json{{"layers", 0}}, "r.json: layers: 0 is out of range");
  expect_bad(json{{"dtype", "fp8"}}, "r.json: dtype:");
  expect_bad(json{{"algorithm", "tree"}}, "r.json: algorithm: 'tree' is not supported by the SDC model (valid: ring, direct");
  expect_bad(json{{"algorithm", "halving_doubling"}}, "'halving_doubling' is not supported by the SDC model");
  expect_bad(json{{"ffn", 1 << 20}, {"hidden", 1 << 20}}, "ffn x hidden (the weight) = 1099511627776 elements");
  expect_bad(json::object(), "'99999999999999999999' is not an entry of the list", {"faults.99999999999999999999.nth=1"});
  expect_bad(json{{"faults", {{{"site", "pe"}}}}}, "r.json: faults.0.site: site: unknown fault site 'pe'");
  expect_bad(json{{"faults", {{{"model", "flip"}}}}}, "faults.0.model");
  expect_bad(json{{"faults", {{{"nht", 2}}}}}, "faults.0.nht: unknown key (did you mean 'nth'?)");
  expect_bad(json{{"faults", {{{"site", "hbm"}}}}}, "faults.0.at_us: a fault at rest strikes at a time");
  expect_bad(json{{"faults", {{{"tensor", "weights"}, {"site", "hbm"}, {"at_us", 1}}}}}, "'weights' is not a tensor");
  expect_bad(json::object(), "the recipe has no key 'layres' (did you mean 'layers'?)", {"layres=3"});
  expect_bad(json::object(), "'0' is not an entry of the list: it has 0", {"faults.0.nth=3"});
  expect_bad(json::object(), "expected path=value", {"layers"});
  // Overrides that exist apply.
  json d = json{{"faults", {{{"site", "link"}, {"link", 1}}}}};
  apply_overrides(d, {"layers=3", "faults.0.nth=4", "dtype=f16"}, "r.json");
  const Recipe r = parse_recipe(d, "r.json");
  EXPECT_EQ(r.layers, 3);
  EXPECT_EQ(r.faults.at(0).spec.nth, 4u);
  EXPECT_EQ(r.dtype, DType::f16);
  EXPECT_EQ(parse_recipe(recipe_to_json(r), "again").faults.at(0).spec.link, 1);
}

TEST(Sdc, FaultsOutsideTheTopologyAreRefusedBeforeTheRun) {
  Recipe r = small_recipe();
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::gemm_tile, .cube = 0, .pe = 200};
  r.faults = {f};
  auto ctx = ring4();
  try {
    run(*ctx, r);
    FAIL();
  } catch (const rt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("faults.0.pe = 200: a cube of 'ring4' has PEs 0.."), std::string::npos) << e.what();
  }
  // The same context runs a clean recipe afterwards.
  EXPECT_EQ(run(*ctx, small_recipe()).verdict.kind, Verdict::Kind::clean);
  rt::Context host(rt::ContextOptions{.world_size = 4});
  try {
    run(host, r);
    FAIL();
  } catch (const rt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("faults.0.pe: 200: this backend has no simulated PEs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cubesim::sdc

namespace cubesim::sdc {
namespace {

TEST(SdcCampaign, EveryActivatedFaultIsDetectedAndLocalised) {
  Recipe r = small_recipe();
  CampaignOptions o;
  o.faults = 150;
  o.seed = 21;
  o.clean_runs = 4;
  o.threads = 2;
  std::uint64_t calls = 0;
  o.progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, 154u);
    EXPECT_LE(done, total);
    ++calls;
  };
  const CampaignResult c = run_campaign(hw::load_topology("ring4"), r, o);
  EXPECT_EQ(calls, 154u);
  EXPECT_EQ(c.total.injected, 150u);
  EXPECT_EQ(c.total.fired, 150u);
  EXPECT_GT(c.total.activated, 100u);
  EXPECT_EQ(c.total.detected, c.total.activated) << campaign_to_json(c, false).dump(1);
  EXPECT_EQ(c.total.silent, 0u);
  EXPECT_EQ(c.total.localised, c.total.detected) << campaign_to_json(c).dump(1);
  EXPECT_EQ(c.total.masked + c.total.activated, c.total.fired);
  EXPECT_EQ(c.false_positives, 0u);
  EXPECT_EQ(c.clean_layer_steps, 4u * 4 * 4);
  for (const char* site : {"link", "dma", "gemm_tile"}) EXPECT_GT(c.by_site.at(site).injected, 20u) << site;
  // One thread, same table.
  o.threads = 1;
  o.progress = nullptr;
  const CampaignResult one = run_campaign(hw::load_topology("ring4"), r, o);
  auto a = campaign_to_json(c), b = campaign_to_json(one);
  a.erase("wall_s"), b.erase("wall_s");
  EXPECT_EQ(a.dump(), b.dump());
}

// ---- tensor-parallel mode ----------------------------------------------------------------------------

Recipe tp_recipe() {
  Recipe r = small_recipe();
  r.mode = Mode::tp;
  return r;
}

TEST(SdcTp, ACleanRunIsTheMlpAndMatchesTheReplayAtEveryReductionStep) {
  const Recipe r = tp_recipe();
  auto ctx = ring4();
  const Result res = run(*ctx, r);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::clean) << res.verdict.text;
  EXPECT_TRUE(res.divergences.empty());
  EXPECT_TRUE(res.changed_tensors.empty());
  ASSERT_EQ(res.checks.size(), 4u);
  for (int l = 0; l < 4; ++l)
    for (int rank = 0; rank < 4; ++rank) {
      const Checks& c = res.checks[l][rank];
      EXPECT_EQ(c.word, res.checks[0][rank].word);
      EXPECT_EQ(c.mix, res.checks[0][rank].mix);
      // Three reduction steps of the ring on each rank, each with what arrived and the result.
      ASSERT_EQ(c.step_mix.size(), 6u);
      EXPECT_EQ(c.step_mix, res.checks[0][rank].step_mix);
      // After the all-reduce every rank holds the same bits; before it, each its own partial sum.
      EXPECT_EQ(c.mix[static_cast<int>(Point::comm_output)], res.checks[l][0].mix[static_cast<int>(Point::comm_output)]);
      if (rank > 0) EXPECT_NE(c.mix[static_cast<int>(Point::comm_input)], res.checks[l][0].mix[static_cast<int>(Point::comm_input)]);
    }
  // The host runs it too and agrees bit for bit, reduction steps included.
  rt::Context host(rt::ContextOptions{.world_size = 4});
  const Result h = run(host, r);
  EXPECT_EQ(h.verdict.kind, Verdict::Kind::clean);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(h.checks[1][rank].mix, res.checks[1][rank].mix);
    EXPECT_EQ(h.checks[1][rank].step_word, res.checks[1][rank].step_word);
  }
  // The model is Megatron's MLP: y = sum over ranks of gelu(x · W1_rᵀ) · W2_rᵀ, against a double
  // reference from the shards each rank held (bf16 intermediates: a relative norm, not bits).
  const Golden g = golden(r, 4);
  const auto& x = g.tensors[0][0];
  const std::int64_t T = r.tokens, H = r.hidden, R = r.ffn / 4;
  std::vector<double> want(static_cast<std::size_t>(T * H), 0.0);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(g.tensors[rank][0], x);  // the same input on every rank
    const auto& w1 = g.tensors[rank][1];
    const auto& w2 = g.tensors[rank][2];
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < R; ++j) {
        double a = 0;
        for (std::int64_t k = 0; k < H; ++k) a += double(load_f32(x.data(), r.dtype, t * H + k)) * load_f32(w1.data(), r.dtype, j * H + k);
        const double hj = 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
        for (std::int64_t i = 0; i < H; ++i) want[static_cast<std::size_t>(t * H + i)] += hj * load_f32(w2.data(), r.dtype, i * R + j);
      }
  }
  double err = 0, norm = 0;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(g.tensors[rank][4], g.tensors[0][4]);
    for (std::int64_t e = 0; e < T * H; ++e) {
      const double d = load_f32(g.tensors[rank][4].data(), r.dtype, e) - want[static_cast<std::size_t>(e)];
      err += d * d, norm += want[static_cast<std::size_t>(e)] * want[static_cast<std::size_t>(e)];
    }
  }
  EXPECT_GT(norm, 0.1 * 4 * T * H * 0.01);
  EXPECT_LT(std::sqrt(err / norm), 2e-2);
}

TEST(SdcTp, AReductionStepFaultIsCommOnItsRank) {
  const Recipe r = tp_recipe();
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::reduce, .cube = 2, .nth = 2, .seed = 3};
  f.at_us = layer_moment(r, 1);
  const Result res = with_fault(r, f);
  expect_found(res, Verdict::Kind::comm, 1, 2);
  ASSERT_FALSE(res.divergences.empty());
  // Seen at the step it struck: what arrived matched, the step's result did not.
  EXPECT_EQ(res.divergences.front().rank, 2);
  EXPECT_EQ(res.divergences.front().step, 1);
  EXPECT_TRUE(res.divergences.front().reduced);
}

TEST(SdcTp, ALinkFaultIsFoundWhereItEnteredInEitherPhaseOfTheAllReduce) {
  const Recipe r = tp_recipe();
  sim::Simulator s;
  hw::System sys(s, hw::load_topology("ring4"));
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::link, .link = sys.route(1, 2).at(0), .seed = 5};
  f.at_us = layer_moment(r, 2);
  // From layer 2's start the link carries the reduce-scatter's three steps, then the all-gather's.
  for (std::uint64_t nth = 1; nth <= 6; ++nth) {
    f.spec.nth = nth;
    const Result res = with_fault(r, f);
    expect_found(res, Verdict::Kind::comm, 2, 2);
    const bool in_steps = std::any_of(res.divergences.begin(), res.divergences.end(), [](const Divergence& d) { return d.step >= 0; });
    EXPECT_EQ(in_steps, nth <= 3) << "nth " << nth << ": " << res.verdict.text;
    if (nth <= 3) {
      EXPECT_EQ(res.divergences.front().step, static_cast<int>(nth) - 1);
      EXPECT_FALSE(res.divergences.front().reduced);  // it arrived corrupted
    }
  }
}

TEST(SdcTp, ComputeAndAtRestFaultsAreFoundToo) {
  const Recipe r = tp_recipe();
  RecipeFault f;
  f.spec = {.site = hw::FaultSite::gemm_tile, .model = hw::FaultModel::word_burst, .cube = 3, .nth = 2, .words = 3, .seed = 2};
  f.at_us = layer_moment(r, 1);
  expect_found(with_fault(r, f), Verdict::Kind::compute, 1, 3);
  RecipeFault m;
  m.spec = {.site = hw::FaultSite::hbm, .model = hw::FaultModel::bit_flip, .seed = 6};
  m.tensor = "w2";
  m.layer = 3;
  m.rank = 1;
  m.at_us = layer_moment(r, 1);
  const Result res = with_fault(r, m);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::memory) << res.verdict.text;
  EXPECT_EQ(res.verdict.layer, 3);
  EXPECT_EQ(res.verdict.rank, 1);
  // fsdp's tensor names are not tp's.
  nlohmann::json doc = recipe_to_json(r);
  doc["faults"] = nlohmann::json::array({{{"site", "hbm"}, {"tensor", "shard"}, {"at_us", 1}}});
  try {
    parse_recipe(doc, "tp.json");
    ADD_FAILURE() << "a tensor of the other mode was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("faults.0.tensor: 'shard' is not a tensor of the tp model (valid: input, w1, w2, hidden, output)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SdcTp, ACampaignDetectsAndLocalisesEveryActivatedFault) {
  CampaignOptions o;
  o.faults = 120;
  o.seed = 5;
  o.clean_runs = 4;
  o.threads = 2;
  for (rt::Algorithm a : {rt::Algorithm::ring, rt::Algorithm::direct}) {
    SCOPED_TRACE(std::string(rt::algorithm_name(a)));
    Recipe r = tp_recipe();
    r.algorithm = a;
    const CampaignResult c = run_campaign(hw::load_topology("ring4"), r, o);
    EXPECT_EQ(c.total.fired, 120u);
    EXPECT_GT(c.total.activated, 100u);
    EXPECT_EQ(c.total.detected, c.total.activated) << campaign_to_json(c, false).dump(1);
    EXPECT_EQ(c.total.localised, c.total.detected) << campaign_to_json(c).dump(1);
    EXPECT_EQ(c.total.silent, 0u);
    EXPECT_EQ(c.false_positives, 0u);
    for (const char* site : {"link", "dma", "gemm_tile", "reduce"}) EXPECT_GT(c.by_site.at(site).injected, 15u) << site;
  }
}

// ---- faults replayed without a simulated system (host here; cuda below) ------------------------------

TEST(SdcReplay, GemmAndReductionFaultsAreFoundOnTheHostAsOnSim) {
  rt::Context host(rt::ContextOptions{.world_size = 4});
  Recipe r = tp_recipe();
  RecipeFault red;
  red.spec = {.site = hw::FaultSite::reduce, .model = hw::FaultModel::multi_bit, .cube = 2, .nth = 5, .bits = 4, .seed = 3};
  r.faults = {red};
  Result res = run(host, r);
  ASSERT_EQ(res.faults.size(), 1u) << res.verdict.text;
  ASSERT_EQ(res.fault_layers.size(), 1u);
  EXPECT_EQ(res.fault_layers[0], 1);  // three reduction steps a layer: the fifth is layer 1's second
  const Truth t = truth_of(res, 0);
  EXPECT_EQ(t.kind, Verdict::Kind::comm);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::comm) << res.verdict.text;
  EXPECT_EQ(res.verdict.layer, 1);
  EXPECT_EQ(res.verdict.rank, 2);
  EXPECT_EQ(res.divergences.front().step, 1);
  EXPECT_TRUE(res.divergences.front().reduced);
  RecipeFault gemm;
  gemm.spec = {.site = hw::FaultSite::gemm_tile, .model = hw::FaultModel::word_burst, .cube = 3, .nth = 6, .words = 3, .seed = 8};
  for (Mode m : {Mode::tp, Mode::fsdp}) {
    r.mode = m;
    gemm.spec.nth = m == Mode::tp ? 6 : 3;
    r.faults = {gemm};
    res = run(host, r);
    ASSERT_EQ(res.faults.size(), 1u) << res.verdict.text << " " << fmt::format("{}", res.faults_not_fired);
    // tp: two GEMMs a layer (the sixth is layer 2's row GEMM); fsdp: one (the third is layer 2's).
    const int layer = 2;
    EXPECT_EQ(truth_of(res, 0).layer, layer);
    EXPECT_EQ(res.verdict.kind, Verdict::Kind::compute) << res.verdict.text;
    EXPECT_EQ(res.verdict.layer, layer);
    EXPECT_EQ(res.verdict.rank, 3);
  }
  // A link fault strikes a collective's result where it landed: fsdp's all_gather of layer 1 (the
  // rank-fill check's is the first), seen by comm_output on that rank alone.
  RecipeFault link;
  link.spec = {.site = hw::FaultSite::link, .model = hw::FaultModel::multi_bit, .cube = 1, .nth = 3, .bits = 3, .seed = 2};
  r.mode = Mode::fsdp;
  r.faults = {link};
  res = run(host, r);
  ASSERT_EQ(res.faults.size(), 1u) << res.verdict.text;
  EXPECT_EQ(truth_of(res, 0).kind, Verdict::Kind::comm);
  EXPECT_EQ(res.verdict.kind, Verdict::Kind::comm) << res.verdict.text;
  EXPECT_EQ(res.verdict.layer, 1);
  EXPECT_EQ(res.verdict.rank, 1);
  for (const auto& d : res.divergences) EXPECT_EQ(d.rank, 1);
  // The next run on the same context starts disarmed.
  r.faults.clear();
  EXPECT_EQ(run(host, r).verdict.kind, Verdict::Kind::clean);
  // What needs a simulated system is refused, naming the field.
  for (const auto& [spec, at, field] : std::vector<std::tuple<hw::FaultSpec, double, std::string>>{
           {{.site = hw::FaultSite::link, .link = 0}, -1, "faults.0.link: 0: this backend has no simulated links"},
           {{.site = hw::FaultSite::dma}, -1, "faults.0.site: 'dma' needs a simulated system"},
           {{.site = hw::FaultSite::reduce, .cube = 4}, -1, "faults.0.cube: 4 is not a rank (valid: -1 for any, or 0..3)"},
           {{.site = hw::FaultSite::gemm_tile, .pe = 1}, -1, "faults.0.pe: 1"},
           {{.site = hw::FaultSite::gemm_tile}, 3.0, "faults.0.at: this backend keeps no simulated time"}}) {
    RecipeFault f;
    f.spec = spec;
    f.at_us = at;
    r.faults = {f};
    try {
      run(host, r);
      ADD_FAILURE() << field;
    } catch (const rt::RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_THROW(validate(r, 4, nullptr), rt::RuntimeError);
  }
}

TEST(SdcReplay, ReplayedBitsAreTheModelsOnTheWholeOutput) {
  // The replay reads only the model's window, but changes the bits apply_fault_model changes on the
  // whole span: check against a host copy of a GEMM output.
  rt::Context host(rt::ContextOptions{.world_size = 1});
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    hw::FaultSpec s{.site = hw::FaultSite::gemm_tile, .model = hw::kFaultModels[trial % 4], .nth = 1,
                    .bits = 2 + trial % 7, .words = 2 + trial % 5, .word_bytes = 2, .stuck_value = trial & 1, .seed = rng()};
    std::vector<std::uint8_t> before, after;
    host.spawn(1, [&](int rank) {
      std::vector<float> a(64 * 32), b(32 * 48);
      for (auto& v : a) v = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5);
      for (auto& v : b) v = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5);
      rt::Tensor ta = host.from_host_f32(rank, {64, 32}, DType::bf16, a);
      rt::Tensor tb = host.from_host_f32(rank, {32, 48}, DType::bf16, b);
      rt::Tensor c = host.empty(rank, {64, 48}, DType::bf16, "c");
      rt::matmul(ta, tb, nullptr, c, "clean");
      before = c.to_host_bytes();
      host.backend().fault_replay()->add(s, "fault", 1);
      rt::matmul(ta, tb, nullptr, c, "replayed");
      after = c.to_host_bytes();
    });
    auto* rp = host.backend().fault_replay();
    ASSERT_EQ(rp->log().size(), 1u);
    std::vector<std::byte> want(before.size());
    std::memcpy(want.data(), before.data(), before.size());
    const hw::FaultRecord w = hw::apply_fault_model(s, std::span(want));
    EXPECT_EQ(std::memcmp(want.data(), after.data(), after.size()), 0) << "trial " << trial;
    EXPECT_EQ(rp->log()[0].fault.bits_changed, w.bits_changed);
    EXPECT_EQ(rp->log()[0].fault.offset, w.offset);
    rp->clear();
  }
}

TEST(SdcReplay, AHostCampaignDetectsAndLocalisesEveryActivatedFault) {
  CampaignOptions o;
  o.faults = 200;
  o.seed = 9;
  o.clean_runs = 4;
  o.threads = 2;
  o.sites = {hw::FaultSite::gemm_tile, hw::FaultSite::reduce, hw::FaultSite::link};
  o.make_context = [] { return std::make_unique<rt::Context>(rt::ContextOptions{.world_size = 4}); };
  const CampaignResult c = run_campaign(hw::load_topology("ring4"), tp_recipe(), o);
  EXPECT_EQ(c.backend, "host");
  EXPECT_EQ(c.total.fired, 200u);
  EXPECT_GT(c.total.activated, 180u);
  EXPECT_EQ(c.total.detected, c.total.activated);
  EXPECT_EQ(c.total.localised, c.total.detected) << campaign_to_json(c).dump(1);
  EXPECT_EQ(c.false_positives, 0u);
  EXPECT_GT(c.by_site.at("reduce").injected, 40u);
  EXPECT_GT(c.by_site.at("link").injected, 40u);
  o.sites = {hw::FaultSite::dma};
  EXPECT_THROW(run_campaign(hw::load_topology("ring4"), tp_recipe(), o), rt::RuntimeError);
}

TEST(SdcCampaign, BadOptionsAreRefused) {
  Recipe r = small_recipe();
  CampaignOptions o;
  o.sites = {hw::FaultSite::reduce};
  EXPECT_THROW(run_campaign(hw::load_topology("ring4"), r, o), rt::RuntimeError);
  o = {};
  r.faults = {RecipeFault{}};
  EXPECT_THROW(run_campaign(hw::load_topology("ring4"), r, o), rt::RuntimeError);
}

}  // namespace
}  // namespace cubesim::sdc

namespace cubesim::sdc {
namespace {

// On GPUs: the device checksum (16-byte vectors, scalar head and tail) against the host's, on views at
// every alignment and length round the vector width, f32 and bf16 (skips where no GPU can run).
TEST(SdcCuda, DeviceChecksumsMatchTheHostAtEveryAlignment) {
  std::unique_ptr<rt::Context> ctx;
  try {
    ctx = rt::make_context("cuda", {});
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  std::vector<std::string> bad;
  ctx->spawn(1, [&](int rank) {
    std::mt19937 rng(3);
    for (DType t : {DType::bf16, DType::f32}) {
      std::vector<std::uint8_t> bytes(4096 * dtype_size(t));
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
      rt::Tensor whole = ctx->from_host_bytes(rank, {4096}, t, bytes.data(), bytes.size());
      int case_no = 0;
      for (std::int64_t off : {0, 1, 3, 7, 8, 9}) {
        for (std::int64_t len : {0, 1, 5, 8, 15, 16, 17, 1000, 4000}) {
          if (off + len > 4096) continue;
          rt::Checksums cs(rank, 2);
          cs.take_pair(0, 1, whole.narrow(0, off, len), 77);
          const auto got = cs.read();
          const auto want = kernels::checksum_pair(bytes.data() + off * dtype_size(t), t, len, 77);
          if (got[0] != want.word || got[1] != want.mix)
            bad.push_back(fmt::format("{} off {} len {}", dtype_name(t), off, len));
          ++case_no;
        }
      }
      EXPECT_GT(case_no, 40);
    }
  });
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "; "));
}

// On GPUs: the checksums are device reductions; a clean run must match the host replay bit for bit on
// every layer and rank (skips where no GPU can run).
TEST(SdcCuda, CleanRunsMatchTheHostReplay) {
  std::unique_ptr<rt::Context> ctx;
  try {
    ctx = rt::make_context("cuda", {});
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    Recipe r = small_recipe();
    r.ranks = ctx->world_size();
    r.ffn = 128 * ctx->world_size();
    r.weight_seed = seed;
    const Result res = run(*ctx, r);
    EXPECT_EQ(res.verdict.kind, Verdict::Kind::clean) << res.verdict.text;
    EXPECT_TRUE(res.changed_tensors.empty());
  }
}

TEST(SdcCuda, ReplayedFaultsChangeTheSameBitsAsOnTheHost) {
  // Four ranks, on as many GPUs as there are (sharing them when fewer), so reductions have steps.
  std::unique_ptr<rt::Context> ctx;
  try {
    rt::BackendArgs args;
    args.options = {{"share_gpus", true}};
    ctx = rt::make_context("cuda", {.world_size = 4}, args);
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  const int p = ctx->world_size();
  rt::Context host(rt::ContextOptions{.world_size = p});
  std::mt19937_64 rng(17);
  for (Mode m : {Mode::tp, Mode::fsdp}) {
    Recipe r = small_recipe();
    r.mode = m;
    r.ranks = p;
    r.ffn = 128 * p;
    for (int trial = 0; trial < 12; ++trial) {
      RecipeFault f;
      const bool reduce = m == Mode::tp && p > 1 && trial % 2 == 1;
      f.spec = {.site = reduce ? hw::FaultSite::reduce : hw::FaultSite::gemm_tile, .model = hw::kFaultModels[trial % 4],
                .cube = static_cast<int>(rng() % static_cast<std::uint64_t>(p)),
                // within the run: reduction steps (p - 1 a layer) or GEMMs (tp: two a layer; fsdp: one)
                .nth = 1 + rng() % static_cast<std::uint64_t>(reduce ? r.layers * (p - 1) : r.layers * (m == Mode::tp ? 2 : 1)),
                .bits = 3, .words = 3,
                .stuck_value = trial & 1, .seed = rng()};
      r.faults = {f};
      const Result on_gpu = run(*ctx, r);
      const Result on_host = run(host, r);
      ASSERT_EQ(on_gpu.faults.size(), 1u) << on_gpu.verdict.text;
      EXPECT_EQ(on_gpu.verdict.text, on_host.verdict.text);
      EXPECT_EQ(on_gpu.changed_tensors, on_host.changed_tensors);
      for (int l = 0; l < r.layers; ++l)
        for (int rank = 0; rank < p; ++rank) EXPECT_EQ(on_gpu.checks[l][rank].mix, on_host.checks[l][rank].mix);
      if (!on_gpu.divergences.empty()) {
        const Truth t = truth_of(on_gpu, 0);
        EXPECT_EQ(on_gpu.verdict.kind, t.kind) << on_gpu.verdict.text;
        EXPECT_EQ(on_gpu.verdict.layer, t.layer) << on_gpu.verdict.text;
        EXPECT_EQ(on_gpu.verdict.rank, t.rank) << on_gpu.verdict.text;
      }
    }
  }
}

}  // namespace
}  // namespace cubesim::sdc
