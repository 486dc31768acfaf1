// The sim backend's price of the runtime's elementwise and reduction ops (SimBackend::cost_time) with
// the HBM read/write/copy rates and the kernel figures of the topology (hw::HbmSpec, hw::KernelSpec),
// against times computed by hand; and without them, today's single-rate roofline.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/backend_registry.h"
#include "runtime/ops.h"
#include "runtime/sim_backend.h"

namespace cubesim::rt {
namespace {

// single_cube: 4 PEs, vector 128 bf16 ops/cycle at 1 GHz (512 Gop/s in all), HBM 1024 GB/s.
hw::Topology with_rw_model() {
  return hw::load_topology("single_cube", {{"cube.hbm.read_GBps", 100},
                                           {"cube.hbm.write_GBps", 50},
                                           {"cube.hbm.copy_GBps", 40},
                                           {"cube.kernel.launch_gap_ns", 1000},
                                           {"cube.kernel.reduction_ns", 300}});
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Simulated picoseconds of each op, in order: gelu, gelu_backward, add_bias, bias_grad, copy.
std::vector<sim::Duration> op_times(const hw::Topology& topo, bool timing_only) {
  constexpr std::int64_t rows = 1024, cols = 1024;  // 2 MiB in bf16
  auto ctx = make_sim_context({}, topo, {.timing_only = timing_only});
  std::vector<sim::Duration> t;
  const auto xv = random_values(rows * cols, 1), dv = random_values(rows * cols, 2), bv = random_values(cols, 3);
  ctx->spawn(1, [&](int r) {
    Tensor x = ctx->from_host_f32(r, {rows, cols}, DType::bf16, xv);
    Tensor dy = ctx->from_host_f32(r, {rows, cols}, DType::bf16, dv);
    Tensor b = ctx->from_host_f32(r, {cols}, DType::bf16, bv);
    Tensor y = ctx->empty(r, {rows, cols}, DType::bf16);
    Tensor db = ctx->empty(r, {cols}, DType::bf16);
    auto timed = [&](auto&& f) {
      const sim::Time t0 = ctx->simulator().now();
      f();
      t.push_back(ctx->simulator().now() - t0);
    };
    timed([&] { gelu(kernels::GeluKind::tanh, x, y); });
    timed([&] { gelu_backward(kernels::GeluKind::tanh, x, dy, y); });
    timed([&] { add_bias(x, b, y); });
    timed([&] { bias_grad(dy, db); });
    timed([&] { copy(x, y); });
  });
  return t;
}

TEST(ElementwiseCost, ReadWriteCopyRatesGapAndReductionPassByHand) {
  constexpr std::uint64_t MiB = 1 << 20, gap = 1'000'000, red = 300'000;
  // ps for `bytes` at `gbps`: ceil(bytes * 1e12 / (gbps * 1e9)).
  auto ps = [](std::uint64_t bytes, std::uint64_t gbps) { return (bytes * 1000 + gbps - 1) / gbps; };
  for (bool timing_only : {true, false}) {
    const auto t = op_times(with_rw_model(), timing_only);
    ASSERT_EQ(t.size(), 5u);
    // gelu: reads 2 MiB, writes 2 MiB: 4 MiB at the copy rate (40 GB/s) = 104.8576 us; its vector work
    // (20 ops x 1 Mi elements / 512 Gop/s = 40.96 us) hides under it.
    EXPECT_EQ(t[0], ps(4 * MiB, 40) + gap);
    EXPECT_EQ(t[0], 104'857'600u + gap);
    // gelu_backward: reads 4 MiB, writes 2 MiB: 2 + 2 MiB at the copy rate, the other 2 MiB read at 100 GB/s.
    EXPECT_EQ(t[1], ps(4 * MiB, 40) + ps(2 * MiB, 100) + gap);
    // add_bias: reads x (2 MiB; the bias is not counted), writes 2 MiB: as gelu.
    EXPECT_EQ(t[2], t[0]);
    // bias_grad: reads 2 MiB, writes 2 KiB: 4 KiB at the copy rate, 2 MiB - 2 KiB read at 100 GB/s,
    // then the reduction's final pass.
    EXPECT_EQ(t[3], ps(4096, 40) + ps(2 * MiB - 2048, 100) + gap + red);
    // copy: as gelu (no vector work).
    EXPECT_EQ(t[4], t[0]);
  }
}

TEST(ElementwiseCost, WithoutACopyRateReadsAndWritesTakeTurns) {
  // Only write_GBps: reads at bandwidth_GBps (1024), writes at 64 GB/s, no turnaround.
  const auto t = op_times(hw::load_topology("single_cube", {{"cube.hbm.write_GBps", 64}}), true);
  constexpr std::uint64_t MiB = 1 << 20;
  auto ps = [](std::uint64_t bytes, std::uint64_t gbps) { return (bytes * 1000 + gbps - 1) / gbps; };
  EXPECT_EQ(t[4], ps(2 * MiB, 1024) + ps(2 * MiB, 64));  // copy: 2.048 + 32.768 us
  EXPECT_EQ(t[4], 34'816'000u);
  EXPECT_EQ(t[0], 40'960'000u);  // gelu: its vector work (20 x 2^20 ops / (4 PEs x 128 x 1 GHz)) is longer
  // bias_grad: 2 MiB read at 1024 GB/s and 2 KiB written at 64 GB/s (2.080 us) over 2.048 us of vector
  // work; no kernel section: no gap, no final pass.
  EXPECT_EQ(t[3], ps(2 * MiB, 1024) + ps(2048, 64));
  // A pure write (no op of the runtime writes without reading; cost_time prices any OpCost).
  auto ctx = make_sim_context({}, hw::load_topology("single_cube", {{"cube.hbm.write_GBps", 64}}), {.timing_only = true});
  ctx->spawn(1, [](int) {});
  auto& be = static_cast<SimBackend&>(ctx->backend());
  OpCost fill{OpCost::Kind::elementwise, "fill", 0, 0, 0, DType::bf16, 0, 2 * MiB, 0, true};
  EXPECT_EQ(be.cost_time(0, fill), ps(2 * MiB, 64));
}

TEST(ElementwiseCost, WithoutTheNewFiguresTheRooflineIsUnchanged) {
  // single_cube as shipped: max(bytes read + written at 1024 GB/s, vector time), no gap.
  const auto t = op_times(hw::load_topology("single_cube"), true);
  constexpr std::uint64_t MiB = 1 << 20;
  auto ps = [](std::uint64_t bytes, std::uint64_t gbps) { return (bytes * 1000 + gbps - 1) / gbps; };
  EXPECT_EQ(t[0], 40'960'000u);  // gelu: vector-bound (4 MiB at 1024 GB/s is 4.096 us)
  EXPECT_EQ(t[1], 61'440'000u);  // gelu_backward: 30 ops per element
  EXPECT_EQ(t[2], ps(4 * MiB, 1024));  // add_bias: 1 op per element (2.048 us) under 4.096 us of HBM
  EXPECT_EQ(t[3], ps(2 * MiB + 2048, 1024));
  EXPECT_EQ(t[4], ps(4 * MiB, 1024));
}

TEST(ElementwiseCost, StepsInsideACollectiveNeverPayTheKernelFigures) {
  auto ctx = make_sim_context({}, with_rw_model(), {.timing_only = true});
  ctx->spawn(1, [](int) {});
  auto& be = static_cast<SimBackend&>(ctx->backend());
  // A ring's reduce of one 64 KiB chunk (runtime/comm.cpp): reads 2 chunks, writes one; not a kernel.
  OpCost step{OpCost::Kind::reduce, "reduce", 0, 0, 0, DType::bf16, 2 * 65536, 65536, 32768};
  const sim::Duration bytes_only = (2 * 65536 * 1000 + 39) / 40 + (65536 * 1000 + 99) / 100;
  EXPECT_EQ(be.cost_time(0, step), bytes_only);
  step.kernel = true;  // the same bytes as an op of its own: the gap and the final pass on top
  EXPECT_EQ(be.cost_time(0, step), bytes_only + 1'000'000 + 300'000);
  // More written than read: the surplus writes at the write rate (50 GB/s); an elementwise op pays
  // the gap but no final pass.
  OpCost wide{OpCost::Kind::elementwise, "widen", 0, 0, 0, DType::bf16, 1 << 20, 3 << 20, 0, true};
  EXPECT_EQ(be.cost_time(0, wide), (2ull << 20) * 1000 / 40 + (2ull << 20) * 1000 / 50 + 1'000'000);
}


// The fused bias-GELU (Megatron's) gives add_bias-then-gelu's bits for pre and y, on the host and on
// the simulator with values, and the simulator prices it as one pass: x read once, pre and y written.
TEST(ElementwiseCost, BiasGeluIsAddBiasThenGeluBitForBitInOnePass) {
  constexpr std::int64_t rows = 1024, cols = 1024;
  constexpr std::uint64_t MiB = 1 << 20, gap = 1'000'000;
  auto ps = [](std::uint64_t bytes, std::uint64_t gbps) { return (bytes * 1000 + gbps - 1) / gbps; };
  std::vector<float> xv = random_values(rows * cols, 11), bv = random_values(cols, 12);
  xv[3] = 40.0f;  // GELU's tails, a zero and a signed zero after the bias
  xv[4] = -40.0f;
  xv[5] = -bv[5];
  for (kernels::GeluKind k : {kernels::GeluKind::tanh, kernels::GeluKind::erf}) {
    for (bool sim : {false, true}) {
      auto ctx = sim ? make_sim_context({}, with_rw_model(), {}) : make_context("host", {.world_size = 1});
      std::vector<std::uint8_t> pre_fused, y_fused, pre_ref, y_ref, x_after;
      sim::Duration fused = 0, unfused = 0;
      ctx->spawn(1, [&](int r) {
        Tensor x = ctx->from_host_f32(r, {rows, cols}, DType::bf16, xv);
        Tensor b = ctx->from_host_f32(r, {cols}, DType::bf16, bv);
        Tensor pre = ctx->empty(r, {rows, cols}, DType::bf16), y = ctx->empty(r, {rows, cols}, DType::bf16);
        sim::Time t0 = ctx->simulator().now();
        bias_gelu(k, x, b, pre, y);
        fused = ctx->simulator().now() - t0;
        pre_fused = pre.to_host_bytes();
        y_fused = y.to_host_bytes();
        Tensor p2 = ctx->empty(r, {rows, cols}, DType::bf16), y2 = ctx->empty(r, {rows, cols}, DType::bf16);
        t0 = ctx->simulator().now();
        add_bias(x, b, p2);
        gelu(k, p2, y2);
        unfused = ctx->simulator().now() - t0;
        pre_ref = p2.to_host_bytes();
        y_ref = y2.to_host_bytes();
        bias_gelu(k, x, b, x, y);  // in place: pre is x
        x_after = x.to_host_bytes();
        EXPECT_EQ(y.to_host_bytes(), y_ref);
      });
      EXPECT_EQ(pre_fused, pre_ref) << (sim ? "sim" : "host");
      EXPECT_EQ(y_fused, y_ref) << (sim ? "sim" : "host");
      EXPECT_EQ(x_after, pre_ref) << "in place";
      if (sim) {
        // Reads 2 MiB, writes 4 MiB: 2 + 2 MiB at the copy rate, the other 2 MiB written at 50 GB/s.
        EXPECT_EQ(fused, ps(4 * MiB, 40) + ps(2 * MiB, 50) + gap);
        EXPECT_LT(fused, unfused);
      }
    }
  }
}

}  // namespace
}  // namespace cubesim::rt
