// campaign.h — fault campaigns: many seeded faults through the SDC model, and what caught each.
//
// A campaign first runs the recipe once fault-free and counts, per site, the operations a fault could
// strike (on the simulator: transfers over each link; PE DMA transfers, GEMM tiles and reduction steps
// per cube; on host or cuda, make_context: GEMM outputs, reduction steps and collective results per rank).
// Fault i is then drawn from (seed, i) alone: a site (uniformly among `sites` that have operations),
// a unit (link or cube) among those with operations, the n-th of its operations (uniform), and a
// fault model (bit_flip 60%, multi_bit 15%, word_burst 15%, stuck_at 10%; their widths uniform in
// range). Each fault runs the recipe on a fresh simulated system (replayed: on its thread's context,
// disarmed after every run), so the outcome depends on the fault alone: the same seed gives the same
// table on any thread count. `clean_runs` fault-free runs count
// false positives.
//
// Per fault: fired (the injector logged it), activated (some tensor or checksum differs from the
// replay), detected (some checksum or the rank-fill pattern differs; by which), localised (the verdict's kind, layer and rank
// are the fault's truth_of), masked (fired, nothing changed), silent (a value changed and no checksum saw it).
//
//   sdc::CampaignOptions o{.faults = 1000, .seed = 7};
//   auto c = sdc::run_campaign(hw::load_topology("ring4"), sdc::Recipe{}, o);
//   fmt::print("{} of {} activated faults detected\n", c.total.detected, c.total.activated);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sdc/sdc.h"
#include "sim/hw/topology.h"

namespace cubesim::sdc {

struct CampaignOptions {
  std::uint64_t faults = 100;
  std::uint64_t seed = 1;
  std::uint64_t clean_runs = 10;  // fault-free runs, each layers x ranks layer-steps
  int threads = 0;                // 0: the machine's cores
  // Sites to draw from; those without operations in the recipe are skipped (fsdp has no reductions).
  std::vector<hw::FaultSite> sites = {hw::FaultSite::link, hw::FaultSite::dma, hw::FaultSite::gemm_tile,
                                      hw::FaultSite::reduce};
  // Another backend than sim (host, cuda): makes the context each thread runs on (reused from run to
  // run); faults then replay at the runtime's points (sites gemm_tile, reduce and link, per rank), and the
  // topology argument only names the campaign. Null: a fresh simulated system of the topology per run.
  std::function<std::unique_ptr<rt::Context>()> make_context;
  // Called from the campaign's threads (one at a time) after each run: done, total.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

struct Outcome {
  std::uint64_t index = 0;
  RecipeFault fault;
  bool fired = false;
  hw::FaultRecord record;  // when fired
  Truth truth;
  Verdict verdict;
  bool activated = false, detected = false, by_word = false, by_mix = false, by_rank_fill = false, localised = false;
  bool masked = false, silent = false;
  std::string changed;  // the first tensor that changed, if any
};

struct Tally {
  std::uint64_t injected = 0, fired = 0, activated = 0, detected = 0, by_word = 0, by_mix = 0, by_rank_fill = 0, localised = 0,
                masked = 0, silent = 0;
  void add(const Outcome& o);
};

struct CampaignResult {
  std::string topology;
  std::string backend = "sim";
  Recipe recipe;
  std::uint64_t seed = 0;
  int ranks = 0;
  std::map<std::string, std::uint64_t> operations;  // the census: "link 3", "dma cube1", "gemm_tile cube2"
  std::vector<Outcome> outcomes;
  Tally total;
  std::map<std::string, Tally> by_site, by_model;
  std::uint64_t clean_runs = 0, clean_layer_steps = 0, false_positives = 0;
  double wall_s = 0;
};

// RuntimeError for a recipe the topology cannot run or options out of range (naming them).
CampaignResult run_campaign(const hw::Topology& topo, const Recipe& recipe, const CampaignOptions& o);
nlohmann::json campaign_to_json(const CampaignResult& c, bool with_outcomes = true);

}  // namespace cubesim::sdc
