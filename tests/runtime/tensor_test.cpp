#include <gtest/gtest.h>

#include <random>

#include "runtime/backend_registry.h"
#include "runtime/context.h"
#include "runtime/errors.h"

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

}  // namespace
}  // namespace cubesim::rt
