#include "sdc/campaign.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/sim_backend.h"
#include "sim/hw/address_hash.h"

namespace cubesim::sdc {

using nlohmann::json;

void Tally::add(const Outcome& o) {
  ++injected;
  fired += o.fired, activated += o.activated, detected += o.detected, by_word += o.by_word, by_mix += o.by_mix;
  by_rank_fill += o.by_rank_fill;
  localised += o.localised, masked += o.masked, silent += o.silent;
}

namespace {

constexpr std::uint64_t kNever = std::uint64_t{1} << 62;  // a census spec's nth: counts, never fires

std::string unit_label(const hw::FaultSpec& s) {
  if (s.site == hw::FaultSite::link && s.link >= 0) return fmt::format("link {}", s.link);
  // Replayed (host, cuda): a rank's GEMM outputs, reduction steps or collective results.
  if (s.link < 0 && s.site == hw::FaultSite::link) return fmt::format("link rank{}", s.cube);
  return fmt::format("{} cube{}", hw::fault_site_name(s.site), s.cube);
}

// Fault i of a campaign, from (seed, i) alone.
RecipeFault draw(std::uint64_t seed, std::uint64_t i, const std::vector<std::vector<std::pair<RecipeFault, std::uint64_t>>>& by_site,
                 int word_bytes) {
  std::mt19937_64 rng(hw::mix64(seed ^ hw::mix64(i + 1)));
  std::vector<std::size_t> live;
  for (std::size_t s = 0; s < by_site.size(); ++s)
    if (!by_site[s].empty()) live.push_back(s);
  const auto& cands = by_site[live[rng() % live.size()]];
  const auto& [tmpl, count] = cands[rng() % cands.size()];
  RecipeFault f = tmpl;
  hw::FaultSpec& s = f.spec;
  s.nth = 1 + rng() % count;
  s.word_bytes = word_bytes;
  const std::uint64_t u = rng() % 100;
  s.model = u < 60 ? hw::FaultModel::bit_flip
            : u < 75 ? hw::FaultModel::multi_bit
            : u < 90 ? hw::FaultModel::word_burst
                     : hw::FaultModel::stuck_at;
  s.bits = 2 + static_cast<int>(rng() % static_cast<std::uint64_t>(8 * word_bytes - 1));
  s.words = 2 + static_cast<int>(rng() % 7);
  s.stuck_value = static_cast<int>(rng() & 1);
  s.seed = rng();
  return f;
}

Outcome judge_outcome(std::uint64_t index, const RecipeFault& f, const Result& res) {
  Outcome o;
  o.index = index;
  o.fault = f;
  o.fired = !res.faults.empty();
  if (o.fired) o.record = res.faults.front();
  o.verdict = res.verdict;
  o.detected = !res.divergences.empty();
  for (const auto& d : res.divergences) o.by_word |= d.word, o.by_mix |= d.mix, o.by_rank_fill |= d.layer < 0;
  o.activated = o.detected || !res.changed_tensors.empty();
  if (!res.changed_tensors.empty()) o.changed = res.changed_tensors.front();
  if (o.fired) {
    o.truth = truth_of(res, 0);
    o.localised = o.detected && o.verdict.kind == o.truth.kind && o.verdict.layer == o.truth.layer &&
                  o.verdict.rank == o.truth.rank;
  }
  o.masked = o.fired && !o.activated;
  o.silent = o.activated && !o.detected;
  return o;
}

}  // namespace

CampaignResult run_campaign(const hw::Topology& topo, const Recipe& recipe, const CampaignOptions& o) {
  if (o.faults > 10'000'000)
    throw rt::RuntimeError(fmt::format("sdc campaign: faults = {} (valid: 0 to 10000000)", o.faults));
  if (o.clean_runs > 1'000'000)
    throw rt::RuntimeError(fmt::format("sdc campaign: clean_runs = {} (valid: 0 to 1000000)", o.clean_runs));
  if (o.threads < 0 || o.threads > 1024)
    throw rt::RuntimeError(fmt::format("sdc campaign: threads = {} (valid: 0 for every core, or 1 to 1024)", o.threads));
  if (!recipe.faults.empty())
    throw rt::RuntimeError(fmt::format("sdc campaign: the recipe lists {} fault(s); a campaign draws its own (remove "
                                       "\"faults\" from the recipe, or use `cubesim sdc run` for those)",
                                       recipe.faults.size()));
  if (o.sites.empty()) throw rt::RuntimeError("sdc campaign: no fault sites (valid: link, dma, gemm_tile, reduce)");
  for (hw::FaultSite s : o.sites)
    if (s != hw::FaultSite::link && s != hw::FaultSite::dma && s != hw::FaultSite::gemm_tile && s != hw::FaultSite::reduce)
      throw rt::RuntimeError(fmt::format("sdc campaign: site '{}' is not drawn by campaigns (valid: link, dma, "
                                         "gemm_tile, reduce; faults at rest are given one by one in a recipe's "
                                         "\"faults\")",
                                         hw::fault_site_name(s)));
  // Without a simulated system (host, cuda) faults replay at the runtime's points: GEMM outputs and
  // reduction steps, per rank.
  const bool replayed = static_cast<bool>(o.make_context);
  if (replayed)
    for (hw::FaultSite s : o.sites)
      if (s != hw::FaultSite::gemm_tile && s != hw::FaultSite::reduce && s != hw::FaultSite::link)
        throw rt::RuntimeError(fmt::format("sdc campaign: site '{}' needs the sim backend; a campaign on another "
                                           "backend replays faults at the runtime's points (valid: gemm_tile, reduce, "
                                           "link: a collective's result where it landed)",
                                           hw::fault_site_name(s)));
  auto fresh_context = [&]() -> std::unique_ptr<rt::Context> {
    return replayed ? o.make_context() : rt::make_sim_context({}, topo);
  };
  const auto t_start = std::chrono::steady_clock::now();
  CampaignResult c;
  c.topology = topo.name;
  c.recipe = recipe;
  c.seed = o.seed;

  // The census: every candidate unit's operations in a fault-free run.
  Recipe census = recipe;
  auto ctx0 = fresh_context();
  if (replayed && !ctx0->backend().fault_replay())
    throw rt::RuntimeError(fmt::format("sdc campaign: make_context gave a {} context, which injects faults into a "
                                       "simulated system of its own: leave make_context empty for the sim backend",
                                       ctx0->backend().name()));
  if (replayed) {
    const int ranks = recipe.ranks > 0 ? recipe.ranks : ctx0->world_size();
    c.backend = std::string(ctx0->backend().name());
    for (hw::FaultSite site : o.sites)
      for (int rank = 0; rank < ranks; ++rank) {
        RecipeFault f;
        f.spec = {.site = site, .cube = rank, .nth = kNever};
        census.faults.push_back(f);
      }
  } else {
    sim::Simulator s;
    hw::System sys(s, topo);
    for (hw::FaultSite site : o.sites) {
      if (site == hw::FaultSite::link) {
        for (int l = 0; l < sys.num_links(); ++l) {
          RecipeFault f;
          f.spec = {.site = site, .link = l, .nth = kNever};
          census.faults.push_back(f);
        }
      } else {
        for (int cube = 0; cube < sys.num_cubes(); ++cube) {
          RecipeFault f;
          f.spec = {.site = site, .cube = cube, .nth = kNever};
          census.faults.push_back(f);
        }
      }
    }
  }
  const Result cr = run(*ctx0, census);
  ctx0.reset();
  c.ranks = cr.ranks;
  std::vector<std::vector<std::pair<RecipeFault, std::uint64_t>>> by_site(o.sites.size());
  for (std::size_t i = 0; i < census.faults.size(); ++i) {
    const std::uint64_t n = cr.fault_operations[i];
    c.operations[unit_label(census.faults[i].spec)] = n;
    if (n == 0) continue;
    const auto si = static_cast<std::size_t>(std::find(o.sites.begin(), o.sites.end(), census.faults[i].spec.site) -
                                             o.sites.begin());
    RecipeFault f = census.faults[i];
    by_site[si].emplace_back(f, n);
  }
  const bool any = std::any_of(by_site.begin(), by_site.end(), [](const auto& v) { return !v.empty(); });
  if (!any && o.faults > 0)
    throw rt::RuntimeError(fmt::format("sdc campaign: the {} model on {} has no operation at the sites asked for{}",
                                       mode_name(recipe.mode),
                                       replayed ? fmt::format("the {} backend", c.backend) : fmt::format("'{}'", topo.name),
                                       recipe.mode == Mode::fsdp ? " (fsdp has no reduction steps)" : ""));
  const Golden ref = golden(recipe, cr.ranks, replayed ? nullptr : &topo.nccl);
  const int word_bytes = static_cast<int>(dtype_size(recipe.dtype));

  std::vector<RecipeFault> faults(static_cast<std::size_t>(o.faults));
  for (std::uint64_t i = 0; i < o.faults; ++i) faults[static_cast<std::size_t>(i)] = draw(o.seed, i, by_site, word_bytes);
  c.outcomes.resize(faults.size());
  std::vector<char> clean_bad(static_cast<std::size_t>(o.clean_runs), 0);

  const std::uint64_t total = o.faults + o.clean_runs;
  std::atomic<std::uint64_t> next{0}, done{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto worker = [&] {
    try {
      std::unique_ptr<rt::Context> kept;  // replayed: one context per thread, reused (run() disarms after each)
      while (true) {
        const std::uint64_t k = next.fetch_add(1);
        if (k >= total) break;
        std::unique_ptr<rt::Context> made;
        if (!replayed) made = fresh_context();
        else if (!kept) kept = fresh_context();
        rt::Context* ctx = replayed ? kept.get() : made.get();
        if (k < o.faults) {
          Recipe r = recipe;
          r.faults = {faults[static_cast<std::size_t>(k)]};
          const Result res = run(*ctx, r, &ref);
          c.outcomes[static_cast<std::size_t>(k)] = judge_outcome(k, faults[static_cast<std::size_t>(k)], res);
        } else {
          // Fault-free, on fresh data each time (so the layer-steps are not one run repeated).
          const std::uint64_t j = k - o.faults;
          Recipe r = recipe;
          r.weight_seed = recipe.weight_seed + 0x9E3779B97F4A7C15ull * (j + 1);
          r.input_seed = recipe.input_seed + 0xC2B2AE3D27D4EB4Full * (j + 1);
          const Result res = run(*ctx, r);
          clean_bad[static_cast<std::size_t>(j)] = !res.divergences.empty() || !res.changed_tensors.empty();
        }
        if (o.progress) {
          std::lock_guard lock(mu);  // counted under the lock: the callback sees done rise by one each time
          o.progress(++done, total);
        } else {
          ++done;
        }
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!failure) failure = std::current_exception();
      next.store(total);
    }
  };
  const int threads = std::max(1, std::min<int>(o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency()),
                                                static_cast<int>(std::max<std::uint64_t>(total, 1))));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);

  for (const Outcome& out : c.outcomes) {
    c.total.add(out);
    c.by_site[std::string(hw::fault_site_name(out.fault.spec.site))].add(out);
    c.by_model[std::string(hw::fault_model_name(out.fault.spec.model))].add(out);
  }
  c.clean_runs = o.clean_runs;
  c.clean_layer_steps = o.clean_runs * static_cast<std::uint64_t>(recipe.layers) * static_cast<std::uint64_t>(c.ranks);
  c.false_positives = static_cast<std::uint64_t>(std::count(clean_bad.begin(), clean_bad.end(), 1));
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return c;
}

namespace {
json tally_json(const Tally& t) {
  return json{{"injected", t.injected}, {"fired", t.fired},       {"activated", t.activated},
              {"detected", t.detected}, {"by_word", t.by_word},   {"by_mix", t.by_mix}, {"by_rank_fill", t.by_rank_fill},
              {"localised", t.localised}, {"masked", t.masked}, {"silent", t.silent}};
}
}  // namespace

json campaign_to_json(const CampaignResult& c, bool with_outcomes) {
  json sites = json::object(), models = json::object();
  for (const auto& [k, t] : c.by_site) sites[k] = tally_json(t);
  for (const auto& [k, t] : c.by_model) models[k] = tally_json(t);
  json j{{"topology", c.topology},
         {"backend", c.backend},
         {"recipe", recipe_to_json(c.recipe)},
         {"seed", c.seed},
         {"ranks", c.ranks},
         {"operations", c.operations},
         {"total", tally_json(c.total)},
         {"by_site", sites},
         {"by_model", models},
         {"clean", {{"runs", c.clean_runs}, {"layer_steps", c.clean_layer_steps}, {"false_positives", c.false_positives}}},
         {"wall_s", c.wall_s}};
  if (with_outcomes) {
    json rows = json::array();
    for (const Outcome& o : c.outcomes) {
      rows.push_back({{"index", o.index},
                      {"fault", recipe_to_json(Recipe{.faults = {o.fault}})["faults"][0]},
                      {"fired", o.fired},
                      {"record", o.fired ? hw::describe(o.record) : std::string()},
                      {"truth", {{"kind", verdict_kind_name(o.truth.kind)}, {"layer", o.truth.layer}, {"rank", o.truth.rank}}},
                      {"verdict", o.verdict.text},
                      {"activated", o.activated},
                      {"detected", o.detected},
                      {"by_word", o.by_word},
                      {"by_mix", o.by_mix},
                      {"by_rank_fill", o.by_rank_fill},
                      {"localised", o.localised},
                      {"masked", o.masked},
                      {"silent", o.silent}});
    }
    j["outcomes"] = rows;
  }
  return j;
}

}  // namespace cubesim::sdc
