// The reference pipeline scenario: its simulated time and per-stage busy time have a closed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "sim/core/pipeline.h"

namespace cubesim::sim {
namespace {

TEST(Pipeline, TimeIsFillPlusSteadyStateAtTheSlowestStage) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<Duration> service(1 + rng() % 5);
    for (auto& d : service) d = ns(1 + rng() % 50);
    const int items = 1 + static_cast<int>(rng() % 40);
    const PipelineResult r = run_pipeline(service, items);
    const Duration sum = std::accumulate(service.begin(), service.end(), Duration{0});
    const Duration slowest = *std::max_element(service.begin(), service.end());
    EXPECT_EQ(r.sim_time, sum + static_cast<Duration>(items - 1) * slowest);
    ASSERT_EQ(r.tracks.size(), service.size());
    for (std::size_t s = 0; s < service.size(); ++s) EXPECT_EQ(r.tracks[s].busy, service[s] * items);
  }
  EXPECT_THROW(run_pipeline({}, 3), std::invalid_argument);
  EXPECT_THROW(run_pipeline({ns(1)}, 0), std::invalid_argument);
}

}  // namespace
}  // namespace cubesim::sim
