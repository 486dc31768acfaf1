#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "collective_harness.h"
#include "runtime/backend_registry.h"
#include "runtime/context.h"
#include "runtime/collectives.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"

namespace cubesim::rt {
namespace {

TEST(Tensor, ViewsShareStorageAndRoundTripEveryDtype) {
  ContextOptions o;
  o.world_size = 1;
  Context ctx(o);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3, 3);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<float> v(6 * 8);
    for (auto& x : v) x = u(rng);
    Tensor t = ctx.from_host_f32(0, {6, 8}, d, v);
    const auto back = t.to_host_f32();
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(back[i], round_to(d, v[i]));
    }
    auto cols = t.chunk(4, 1);  // strided views along the last dimension
    ASSERT_EQ(cols.size(), 4u);
    EXPECT_FALSE(cols[1].is_contiguous());
    const auto c1 = cols[1].to_host_f32();
    ASSERT_EQ(c1.size(), 12u);
    for (int r = 0; r < 6; ++r) {
      EXPECT_EQ(c1[static_cast<std::size_t>(r * 2)], back[static_cast<std::size_t>(r * 8 + 2)]);
      EXPECT_EQ(c1[static_cast<std::size_t>(r * 2 + 1)], back[static_cast<std::size_t>(r * 8 + 3)]);
    }
    // Writing through the view lands in the parent.
    std::vector<float> w(12, 1.5f);
    cols[3].copy_from_host_f32(w.data(), 12);
    EXPECT_EQ(t.to_host_f32()[7], 1.5f);
    auto rows = t.chunk(3, 0);
    EXPECT_TRUE(rows[2].is_contiguous());
    EXPECT_EQ(rows[2].to_host_f32()[0], t.to_host_f32()[32]);
  }
}

TEST(Tensor, NarrowIntoRewritesAViewInPlace) {
  ContextOptions o;
  o.world_size = 1;
  Context ctx(o);
  std::vector<float> v(6 * 8);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor t = ctx.from_host_f32(0, {6, 8}, DType::f32, v);
  const Tensor other = ctx.zeros(0, {3}, DType::bf16);
  Tensor view = other;  // another storage, dtype and rank: all replaced
  for (std::int64_t d : {0, 1, -1})
    for (std::int64_t start = 0; start < 3; ++start) {
      t.narrow_into(view, d, start, 2);
      const Tensor want = t.narrow(d, start, 2);
      EXPECT_EQ(view.shape(), want.shape());
      EXPECT_EQ(view.strides(), want.strides());
      EXPECT_EQ(view.offset(), want.offset());
      EXPECT_EQ(view.dtype(), DType::f32);
      EXPECT_EQ(view.storage_ptr(), t.storage_ptr());
      EXPECT_EQ(view.to_host_f32(), want.to_host_f32());
    }
  EXPECT_THROW(t.narrow_into(view, 0, 5, 2), RuntimeError);
  Tensor self = t;
  EXPECT_THROW(self.narrow_into(self, 0, 0, 1), RuntimeError);
}

TEST(Tensor, BadShapesAndRanksAreClearErrors) {
  ContextOptions o;
  o.world_size = 2;
  Context ctx(o);
  Tensor t = ctx.zeros(0, {6, 8}, DType::f32);
  EXPECT_THROW(t.chunk(5, 1), RuntimeError);
  EXPECT_THROW(t.narrow(0, 4, 3), RuntimeError);
  EXPECT_THROW(t.reshape({7, 7}), RuntimeError);
  try {
    ctx.zeros(2, {4}, DType::f32);
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 does not exist; valid ranks are 0 to 1"), std::string::npos);
  }
  EXPECT_THROW(parse_backend("tpu"), RuntimeError);
  EXPECT_THROW(ctx.spawn(3, [](int) {}), RuntimeError);
}

using testing::error_of;

// Issue 13: a shape whose bytes wrap 64 bits used to allocate 0 bytes and corrupt the next tensor.
TEST(Tensor, ShapesPastTheByteLimitAreRefusedBeforeAllocating) {
  ContextOptions o;
  o.world_size = 1;
  Context ctx(o);
  const std::int64_t big = std::int64_t{1} << 32;
  for (const Shape& s : {Shape{big, big, 4}, Shape{std::int64_t{1} << 62, 4}, Shape{0, std::int64_t{1} << 62, 1 << 20},
                         Shape{(std::int64_t{1} << 46) + 1}}) {
    const std::string e = error_of([&] { ctx.empty(0, s, DType::f32, "weights"); });
    EXPECT_NE(e.find(fmt::format("weights: shape {} of f32 is too large: the largest tensor holds 281474976710656 "
                                 "bytes (2^48)",
                                 shape_str(s))),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(checked_numel({std::int64_t{1} << 46}, DType::f32, "x"), std::int64_t{1} << 46);  // exactly the limit
  EXPECT_EQ(checked_numel({std::int64_t{1} << 47}, DType::bf16, "x"), std::int64_t{1} << 47);
  EXPECT_EQ(checked_numel({0, 5}, DType::f32, "x"), 0);
  Tensor t = ctx.zeros(0, {3, 4}, DType::f32);
  EXPECT_NE(error_of([&] { (void)t.reshape({big, big, 4}); }).find("reshape: shape"), std::string::npos);
}

// Issue 13: new_group sorts its ranks as torch.distributed does.
TEST(Context, NewGroupSortsItsRanks) {
  ContextOptions o;
  o.world_size = 4;
  Context ctx(o);
  ProcessGroup& g = ctx.new_group({3, 1});
  EXPECT_EQ(g.ranks(), (std::vector<int>{1, 3}));
  EXPECT_EQ(&ctx.new_group({1, 3}), &g);
  EXPECT_EQ(g.index_of(1), 0);
  EXPECT_EQ(g.index_of(3), 1);
}

// Issue 13: a tensor of one context used in another's spawn crashed (host tensors in a sim spawn)
// or silently worked (sim tensors in a host spawn).
TEST(Context, TensorsOfAnotherContextAreRefused) {
  ContextOptions o;
  o.world_size = 2;
  Context host(o);
  auto sim = make_sim_context(o, hw::load_topology("ring4"));
  Tensor h = host.zeros(0, {4, 4}, DType::f32);
  Tensor s = sim->zeros(0, {4, 4}, DType::f32);
  const std::string e1 = error_of([&] {
    sim->spawn(1, [&](int r) {
      matmul(h, sim->zeros(r, {4, 4}, DType::f32), nullptr, sim->zeros(r, {4, 4}, DType::f32));
    });
  });
  EXPECT_NE(e1.find("gemm: tensor f32[4, 4] on rank 0 belongs to a context on the host reference backend, 2 ranks, but "
                    "the calling rank runs in a context on the simulated 'ring4'"),
            std::string::npos)
      << e1;
  const std::string e2 = error_of([&] { host.spawn(1, [&](int) { all_reduce(s); }); });
  EXPECT_NE(e2.find("all_reduce: tensor f32[4, 4] on rank 0 belongs to a context on the simulated 'ring4'"),
            std::string::npos)
      << e2;
}

// Issue 13: a sim run that failed with transfers in flight failed the next run with a hazard.
TEST(Context, AFailedSimRunLeavesAUsableContext) {
  ContextOptions o;
  o.world_size = 4;
  auto ctx = make_sim_context(o, hw::load_topology("ring4"));
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-2, 2);
  const std::int64_t n = 1 << 14;
  std::vector<std::vector<float>> xs(4, std::vector<float>(n));
  for (auto& x : xs) {
    for (auto& v : x) v = u(rng);
  }
  std::vector<Tensor> ts;
  for (int r = 0; r < 4; ++r) ts.push_back(ctx->from_host_f32(r, {n}, DType::f32, xs[static_cast<std::size_t>(r)]));
  const std::string e = error_of([&] {
    ctx->spawn(4, [&](int r) {
      Work w = all_reduce(ts[static_cast<std::size_t>(r)], ReduceOp::sum, nullptr, {.async_op = true});
      if (r == 0) throw std::runtime_error("boom");
      w.wait();
    });
  });
  EXPECT_NE(e.find("rank 0: boom"), std::string::npos) << e;
  for (std::size_t r = 0; r < 4; ++r) ts[r].copy_from_host_f32(xs[r].data(), n);
  ctx->spawn(4, [&](int r) { all_reduce(ts[static_cast<std::size_t>(r)]); });
  // The host reference gives the same bits.
  Context host(o);
  std::vector<Tensor> hs;
  for (int r = 0; r < 4; ++r) hs.push_back(host.from_host_f32(r, {n}, DType::f32, xs[static_cast<std::size_t>(r)]));
  host.spawn(4, [&](int r) { all_reduce(hs[static_cast<std::size_t>(r)]); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ts[static_cast<std::size_t>(r)].to_host_bytes(), hs[static_cast<std::size_t>(r)].to_host_bytes()) << r;
  }
}

// Issue 13: a failure in a PE helper process of a simulated GEMM was reported as "rank -1".
TEST(Context, AFailureInAPeHelperNamesItsRank) {
  ContextOptions o;
  o.world_size = 4;
  auto ctx = make_sim_context(o, hw::load_topology("ring4"),
                              SimBackendOptions{.check_uninitialized = true, .cubes = {2, 3, 0, 1}});
  try {
    ctx->spawn(4, [&](int r) {
      Tensor a = ctx->empty(r, {32, 32}, DType::f32);  // never written: the PE's DMA reads unwritten bytes
      if (r == 3) matmul(a, ctx->zeros(r, {32, 32}, DType::f32), nullptr, ctx->zeros(r, {32, 32}, DType::f32));
    });
    FAIL();
  } catch (const RankError& e) {
    ASSERT_EQ(e.failures().size(), 1u) << e.what();
    EXPECT_EQ(e.failures()[0].rank, 3) << e.what();  // rank 3 runs on cube 1
    EXPECT_NE(e.failures()[0].message.find("in its helper process 'cube1.pe"), std::string::npos) << e.what();
  }
}

// Limits are refused before any work, with the limit and the memory the ranks would need.
TEST(Context, RankCountsBeyondTheLimitsAreRefusedUpFront) {
  ContextOptions o;
  o.world_size = kMaxRanks + 1;
  try {
    Context ctx(o);
    FAIL() << "a context of " << o.world_size << " ranks was built";
  } catch (const RuntimeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("65537 ranks: the limit is 65536 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("would need about 16.0 GiB"), std::string::npos) << m;
  }
  // Guarded stacks need two memory maps each: more than vm.max_map_count allows is refused, naming it.
  try {
    check_rank_count(kMaxRanks, 256 * 1024, true);
    std::ifstream f("/proc/sys/vm/max_map_count");
    long maps = 0;
    if (f >> maps) {
      EXPECT_GE(maps, 2L * kMaxRanks + 4096) << "refused nothing though the kernel allows too few maps";
    }
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("vm.max_map_count"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_rank_count(1024, 256 * 1024, true));
}

}  // namespace
}  // namespace cubesim::rt
