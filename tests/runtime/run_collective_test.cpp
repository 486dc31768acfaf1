// rt::run_collective (runtime/run_collective.h): a group of the first ranks, poisoned outputs,
// the barriers and times of a timed run, output shapes, and the errors a caller can make.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collective_harness.h"
#include "runtime/errors.h"
#include "runtime/run_collective.h"

namespace cubesim::rt::testing {
namespace {

using Kind = CollectiveRequest::Kind;

std::vector<std::uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> floats_of(const std::vector<std::uint8_t>& b) {
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::string error_of(Context& ctx, const CollectiveCase& c) {
  try {
    rt::run_collective(ctx, c);
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return "";
}

TEST(RunCollective, ParsesNamesAndAlgorithms) {
  for (Kind k : {Kind::all_reduce, Kind::all_gather, Kind::reduce_scatter, Kind::broadcast}) {
    EXPECT_EQ(parse_collective_kind(collective_kind_name(k)), k);
  }
  try {
    parse_collective_kind("gossip");
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "'gossip' is not a collective; use one of all_reduce, reduce_scatter, all_gather, broadcast");
  }
  EXPECT_EQ(parse_algorithm_for(Kind::broadcast, "tree"), Algorithm::tree);
  try {
    parse_algorithm_for(Kind::broadcast, "halving_doubling");
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()), "broadcast has no algorithm 'halving_doubling'; valid: ring, direct, tree, nccl");
  }
  EXPECT_THROW(parse_algorithm_for(Kind::all_reduce, "spiral"), RuntimeError);
}

TEST(RunCollective, AGroupOfTheFirstRanksWithTimes) {
  auto ctx = host_context(4);
  std::mt19937_64 rng(3);
  CollectiveCase c{.collective = Kind::all_gather, .dtype = DType::f32, .count = 5, .timed = true};
  std::vector<float> all;
  for (int r = 0; r < 2; ++r) {
    const auto v = random_values(5, DType::f32, rng);
    all.insert(all.end(), v.begin(), v.end());
    c.inputs.push_back(bytes_of(v));
  }
  const CollectiveOutcome o = rt::run_collective(*ctx, c);  // ranks 0 and 1 of 4
  ASSERT_EQ(o.outputs.size(), 2u);
  for (const auto& b : o.outputs) EXPECT_EQ(floats_of(b), all);
  EXPECT_EQ(o.report.ranks.size(), 2u);
  ASSERT_EQ(o.start.size(), 2u);
  ASSERT_EQ(o.end.size(), 2u);
  EXPECT_GE(o.wall_s, 0.0);
  // The same inputs, made on each rank.
  CollectiveCase m = c;
  m.inputs.clear();
  m.ranks = 2;
  m.make_input = [&](int r, std::span<std::uint8_t> b) {
    ASSERT_EQ(b.size(), c.inputs[static_cast<std::size_t>(r)].size());
    std::memcpy(b.data(), c.inputs[static_cast<std::size_t>(r)].data(), b.size());
  };
  EXPECT_EQ(rt::run_collective(*ctx, m).outputs, o.outputs);
  m.inputs = c.inputs;
  EXPECT_NE(error_of(*ctx, m).find("both inputs and make_input given"), std::string::npos);
  c.timed = false;
  c.read_outputs = false;
  const CollectiveOutcome quiet = rt::run_collective(*ctx, c);
  EXPECT_TRUE(quiet.outputs.empty() && quiet.start.empty() && quiet.end.empty());
}

TEST(RunCollective, OutputCountsAndShapes) {
  EXPECT_EQ(collective_output_count(Kind::all_gather, 6, 3), 18);
  EXPECT_EQ(collective_output_count(Kind::reduce_scatter, 6, 3), 2);
  EXPECT_EQ(collective_output_count(Kind::broadcast, 6, 3), 6);
  EXPECT_EQ(collective_output_shape(Kind::all_gather, {8, 5}, 4), (Shape{32, 5}));
  EXPECT_EQ(collective_output_shape(Kind::reduce_scatter, {8, 5}, 4), (Shape{2, 5}));
  EXPECT_EQ(collective_output_shape(Kind::reduce_scatter, {3, 4}, 4), (Shape{3}));  // 12 / 4, flat
  EXPECT_EQ(collective_output_shape(Kind::all_reduce, {}, 2), (Shape{1}));
}

TEST(RunCollective, ErrorsNameTheField) {
  auto ctx = host_context(2);
  const std::vector<std::uint8_t> six(6 * sizeof(float), 0);
  CollectiveCase c{.collective = Kind::all_reduce, .dtype = DType::f32, .count = 6, .inputs = {six, six, six}};
  EXPECT_NE(error_of(*ctx, c).find("3 inputs given; give one array per rank, 1 to 2"), std::string::npos);
  c.inputs = {six, six};
  c.ranks = 3;
  EXPECT_NE(error_of(*ctx, c).find("ranks 3 is not valid; use 1 to 2"), std::string::npos);
  c.ranks = 0;
  c.root = 2;
  EXPECT_NE(error_of(*ctx, c).find("root 2 is not a rank 0..1"), std::string::npos);
  c.root = 0;
  c.inputs = {six, std::vector<std::uint8_t>(5 * sizeof(float))};
  EXPECT_NE(error_of(*ctx, c).find("input 1 has 20 bytes; every rank gives count 6 x f32 = 24 bytes"), std::string::npos);
  c.ranks = 2;
  c.inputs.clear();
  EXPECT_NE(error_of(*ctx, c).find("0 inputs given for 2 ranks; the context keeps values"), std::string::npos);
  const std::vector<std::uint8_t> five(5 * sizeof(float), 0);
  c = {.collective = Kind::reduce_scatter, .dtype = DType::f32, .count = 5, .inputs = {five, five}};
  EXPECT_NE(error_of(*ctx, c).find("reduce_scatter over 2 ranks needs inputs whose size is a multiple of 2; got 5"),
            std::string::npos);
}

}  // namespace
}  // namespace cubesim::rt::testing
