// PEs: MAC array and vector unit timing, FIFO per unit, stragglers, dtype errors.
#include <gtest/gtest.h>

#include <string>

#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

TEST(Pe, MacTimeIsCyclesAtTheClock) {
  sim::Simulator sim;
  System sys(sim, load_topology("mesh4x4"));  // 1.5 GHz, 2048 bf16 MACs per cycle
  Pe& pe = sys.pe(2, 3);
  EXPECT_EQ(pe.name(), "cube2.pe3");
  EXPECT_EQ(pe.spec().tile.m, 128u);
  EXPECT_EQ(pe.mac().cycles(2048, DType::bf16), 1u);
  EXPECT_EQ(pe.mac().cycles(2049, DType::bf16), 2u);
  // 128x128x128 MACs = 1024 cycles at 1.5 GHz = 682.667 ns, rounded up to the picosecond.
  EXPECT_EQ(pe.mac().time(128 * 128 * 128, DType::bf16), sim::ps(682667));
  EXPECT_EQ(pe.vector().time(128, DType::f32), sim::ps(667));
}

TEST(Pe, WorkOnOneUnitQueuesAndUnitsRunInParallel) {
  sim::Simulator sim;
  System sys(sim, testing::small_topology());  // 1 GHz, 1024 bf16 MACs per cycle, 64 f32 vector ops
  Pe& pe = sys.pe(0, 0);
  sim::Time a = 0, b = 0, v = 0;
  sim.spawn("a", [&] { a = pe.compute(1024 * 100, DType::bf16); });  // 100 cycles = 100 ns
  sim.spawn("b", [&] { b = pe.compute(1024 * 50, DType::bf16); });   // queued behind a
  sim.spawn("v", [&] { v = pe.vector_op(64 * 30, DType::f32); });     // its own unit
  sim.run();
  EXPECT_EQ(a, sim::ns(100));
  EXPECT_EQ(b, sim::ns(150));
  EXPECT_EQ(v, sim::ns(30));
}

TEST(Pe, StragglerCubeRunsAtItsScaledClock) {
  auto doc = load_topology_json("mesh4x4");
  apply_override(doc, "cubes.3.clock_scale", 0.8);
  sim::Simulator sim;
  System sys(sim, topology_from_json(doc, "mesh4x4 straggler"));
  const auto fast = sys.pe(2, 0).mac().time(1 << 24, DType::bf16);
  const auto slow = sys.pe(3, 0).mac().time(1 << 24, DType::bf16);
  EXPECT_NEAR(static_cast<double>(slow) / static_cast<double>(fast), 1.25, 1e-6);
}

TEST(Pe, UnsupportedDtypeAndComputeOutsideAProcessAreErrors) {
  sim::Simulator sim;
  System sys(sim, testing::small_topology());  // no f16 MAC rate, vector unit f32 only
  Pe& pe = sys.pe(1, 1);
  try {
    pe.mac().time(10, DType::f16);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cube1.pe1.mac: no rate for dtype f16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("supports f32, bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pe.compute(10, DType::bf16), sim::NotInProcessError);
}

}  // namespace
}  // namespace cubesim::hw
