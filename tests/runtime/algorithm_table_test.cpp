// The algorithm table (runtime/algorithms/table.h): every row is complete and reachable by name,
// every collective has the ring, a collective whose row has no body is refused with the valid
// algorithms, and a body's group need is checked with the same message as before the table.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collective_harness.h"
#include "runtime/algorithms/table.h"
#include "runtime/errors.h"

namespace cubesim::rt::testing {
namespace {

using algo::Collective;

std::string error_of(const CollCase& c) {
  try {
    run_collective(host_context, c);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(AlgorithmTable, EveryRowHasANameASummaryAndParsesBack) {
  ASSERT_FALSE(algo::rows().empty());
  for (std::size_t i = 0; i < algo::rows().size(); ++i) {
    const algo::Row& r = algo::rows()[i];
    EXPECT_EQ(static_cast<std::size_t>(r.id), i) << "rows are in enum order";
    EXPECT_FALSE(r.name.empty()) << i;
    EXPECT_FALSE(r.summary.empty()) << r.name;
    EXPECT_EQ(algorithm_name(r.id), r.name);
    EXPECT_EQ(parse_algorithm(algorithm_name(r.id)), r.id) << r.name;
    EXPECT_EQ(&algo::row(r.id), &r);
    bool any = false;
    for (Collective k : algo::kCollectives) any = any || r.supports(k);
    EXPECT_TRUE(any) << r.name << " does no collective";
  }
}

TEST(AlgorithmTable, UnknownNameListsEveryRow) {
  std::vector<std::string_view> names;
  for (const algo::Row& r : algo::rows()) names.push_back(r.name);
  try {
    parse_algorithm("gossip");
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("unknown collective algorithm 'gossip': valid are {}", fmt::join(names, ", ")));
  }
}

TEST(AlgorithmTable, EveryCollectiveHasTheRingAndSupportedAlgorithmsReadsTheTable) {
  for (Collective k : algo::kCollectives) {
    const std::string coll(collective_kind_name(k));
    EXPECT_TRUE(algo::row(Algorithm::ring).supports(k)) << coll;
    std::vector<Algorithm> expected;
    for (const algo::Row& r : algo::rows()) {
      if (r.supports(k)) expected.push_back(r.id);
    }
    EXPECT_EQ(supported_algorithms(coll), expected) << coll;
  }
  EXPECT_TRUE(supported_algorithms("gossip").empty());
}

// Written out by hand (not read from the table), so that a body dropped from a row fails here.
TEST(AlgorithmTable, EachCollectiveHasTheAlgorithmsItHad) {
  using A = Algorithm;
  EXPECT_EQ(supported_algorithms("all_reduce"),
            (std::vector<A>{A::ring, A::direct, A::tree, A::halving_doubling, A::hierarchical, A::nccl}));
  EXPECT_EQ(supported_algorithms("reduce_scatter"), (std::vector<A>{A::ring, A::direct, A::halving_doubling, A::nccl}));
  EXPECT_EQ(supported_algorithms("all_gather"), (std::vector<A>{A::ring, A::direct, A::halving_doubling, A::nccl}));
  EXPECT_EQ(supported_algorithms("broadcast"), (std::vector<A>{A::ring, A::direct, A::tree, A::nccl}));
  EXPECT_EQ(algo::supported_names(Collective::broadcast), "ring, direct, tree, nccl");
}

TEST(AlgorithmTable, ACollectiveWithoutABodyIsRefusedWithTheValidAlgorithms) {
  int refused = 0;
  for (const algo::Row& r : algo::rows()) {
    for (Collective k : algo::kCollectives) {
      if (r.supports(k)) continue;
      const std::string coll(collective_kind_name(k));
      std::vector<std::string_view> valid;
      for (Algorithm a : supported_algorithms(coll)) valid.push_back(algorithm_name(a));
      const std::string want =
          fmt::format("{}: algorithm '{}' is not available; valid: {}", coll, r.name, fmt::join(valid, ", "));
      const std::string got = error_of({.coll = coll, .algo = r.id, .dtype = DType::f32, .ranks = 2, .n = 8});
      EXPECT_NE(got.find(want), std::string::npos) << got;
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);  // tree and hierarchical do no reduce_scatter
}

TEST(AlgorithmTable, HalvingDoublingNeedsAPowerOfTwoGroupForReduceScatterAndAllGather) {
  const algo::Row& hd = algo::row(Algorithm::halving_doubling);
  EXPECT_EQ(hd.needs(Collective::all_reduce), algo::GroupNeed::any);
  EXPECT_EQ(hd.needs(Collective::reduce_scatter), algo::GroupNeed::power_of_two);
  EXPECT_EQ(hd.needs(Collective::all_gather), algo::GroupNeed::power_of_two);
  for (const char* coll : {"reduce_scatter", "all_gather"}) {
    for (int ranks : {3, 6}) {
      const std::string got =
          error_of({.coll = coll, .algo = Algorithm::halving_doubling, .dtype = DType::f32, .ranks = ranks, .n = 12});
      // Refused by run_collective before any rank runs (issue 13), naming the valid sizes.
      EXPECT_NE(got.find(fmt::format("run_collective {}: halving_doubling {} needs a power-of-two group (1, 2, 4, 8, "
                                     "... ranks), not {} ranks; use ring, direct or nccl",
                                     coll, coll, ranks)),
                std::string::npos)
          << got;
    }
    for (int ranks : {1, 2, 4, 8}) {
      EXPECT_EQ(error_of({.coll = coll, .algo = Algorithm::halving_doubling, .dtype = DType::f32, .ranks = ranks,
                          .n = 12}),
                "")
          << coll << " on " << ranks << " ranks";
    }
  }
  // all_reduce folds the extra ranks away, so any group size does.
  EXPECT_EQ(error_of({.coll = "all_reduce", .algo = Algorithm::halving_doubling, .dtype = DType::f32, .ranks = 3,
                      .n = 12}),
            "");
}

}  // namespace
}  // namespace cubesim::rt::testing
