#include "sim/core/trace.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

namespace cubesim::sim {
namespace {

TEST(Trace, ChromeJsonHasTracksSpansAndArgs) {
  Trace tr;
  tr.set_enabled(true);
  auto dma = tr.track("pe0.dma", "cube0");
  auto link = tr.track("link 0->1", "links");
  tr.span(dma, "load \"A\" tile", ns(1), ns(3) + 5, {{"bytes", 4096}, {"src", "hbm"}});
  tr.instant(link, "credit", ns(2));
  tr.span(link, "xfer", ns(2), ns(4));
  std::stringstream ss;
  tr.write_chrome_json(ss);
  const auto j = nlohmann::json::parse(ss.str());
  std::map<std::string, int> tids;
  std::vector<nlohmann::json> spans;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tids[e["args"]["name"]] = e["tid"];
    if (e["ph"] == "X") spans.push_back(e);
  }
  EXPECT_EQ(tids.size(), 2u);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0]["name"], "load \"A\" tile");
  EXPECT_EQ(spans[0]["tid"], tids["pe0.dma"]);
  EXPECT_DOUBLE_EQ(spans[0]["ts"].get<double>(), 0.001);
  EXPECT_DOUBLE_EQ(spans[0]["dur"].get<double>(), 0.002005);  // picosecond resolution kept
  EXPECT_EQ(spans[0]["args"]["bytes"], 4096);
  EXPECT_EQ(spans[0]["args"]["src"], "hbm");
  EXPECT_EQ(tr.stats(dma).busy, ns(2) + 5);
}

TEST(Trace, DisabledRecordsNothingButKeepsStatistics) {
  Trace tr;
  auto t = tr.track("x");
  tr.span(t, "a", 0, 10);
  tr.span(t, "b", 20, 25);
  EXPECT_EQ(tr.size(), 0u);
  EXPECT_EQ(tr.stats(t).spans, 2u);
  EXPECT_EQ(tr.stats(t).busy, 15u);
  EXPECT_EQ(tr.stats(t).last, 25u);
}

TEST(Trace, SameTrackNameInTwoGroupsIsTwoTracks) {
  Trace tr;
  EXPECT_NE(tr.track("pe0", "cube0"), tr.track("pe0", "cube1"));
  EXPECT_EQ(tr.track("pe0", "cube0"), tr.track("pe0", "cube0"));
}

TEST(Trace, SaveToBadPathNamesThePath) {
  Trace tr;
  try {
    tr.save("/nonexistent-dir/x.json");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace cubesim::sim
