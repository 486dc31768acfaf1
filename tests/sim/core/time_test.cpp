#include "sim/core/time.h"

#include <gtest/gtest.h>

namespace cubesim::sim {
namespace {

TEST(Time, UnitsAreExactIntegers) {
  EXPECT_EQ(ps(7), 7u);
  EXPECT_EQ(ns(3), 3000u);
  EXPECT_EQ(us(2), 2'000'000u);
  EXPECT_EQ(ms(1), 1'000'000'000u);
  EXPECT_EQ(from_ns(8.5), 8500u);
  EXPECT_EQ(from_us(0.25), 250'000u);
}

TEST(Time, NegativeAndNanAreErrors) {
  EXPECT_THROW(ns(-1), TimeError);
  EXPECT_THROW(from_ns(-0.5), TimeError);
  EXPECT_THROW(from_ns(std::nan("")), TimeError);
  EXPECT_THROW(sub(ns(1), ns(2)), TimeError);
}

TEST(Time, OverflowIsAnErrorNotAWrap) {
  EXPECT_THROW(add(kTimeMax - 5, 6), TimeError);
  EXPECT_EQ(add(kTimeMax - 5, 5), kTimeMax);
  EXPECT_THROW(ms(std::uint64_t{1} << 60), TimeError);
  EXPECT_THROW(mul(kTimeMax / 2 + 1, 2), TimeError);
  EXPECT_THROW(from_s(1e30), TimeError);
}

TEST(Time, TransferTimeIsCeilOfBytesOverBandwidth) {
  const Bandwidth bw = Bandwidth::GBps(128);  // 128 bytes/ns
  EXPECT_EQ(transfer_time(128, bw), 1000u);
  EXPECT_EQ(transfer_time(129, bw), 1008u);  // ceil(129000/128) = 1007.8 -> 1008
  EXPECT_EQ(transfer_time(0, bw), 0u);
  // 1 GiB at 450 GB/s: exact rational, rounded up.
  const std::uint64_t gib = std::uint64_t{1} << 30;
  const Duration t = transfer_time(gib, Bandwidth::GBps(450));
  EXPECT_EQ(t, (gib * 1000 + 449) / 450);
  EXPECT_THROW(Bandwidth::GBps(0), TimeError);
  EXPECT_THROW(Bandwidth::GBps(-3), TimeError);
}

// Sizes whose byte count times 10^12 fits 64 bits take a 64-bit division, larger ones the 128-bit
// one: the same ceiling either side of the boundary, on random sizes and bandwidths.
TEST(Time, TransferTimeIsExactEitherSideOfThe64BitBoundary) {
  auto reference = [](std::uint64_t bytes, std::uint64_t bw) {
    const unsigned __int128 num = static_cast<unsigned __int128>(bytes) * kPsPerS;
    return static_cast<Duration>((num + bw - 1) / bw);
  };
  const std::uint64_t edge = UINT64_MAX / kPsPerS;
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t bw = 1 + next() % (std::uint64_t{1} << (1 + next() % 50));
    const std::uint64_t r = next();
    const std::uint64_t bytes = i % 4 == 0 ? edge - 2 + r % 5 : (i % 4 == 1 ? r % (edge + 1) : r % (edge * 8));
    if (static_cast<unsigned __int128>(bytes) * kPsPerS / bw > kTimeMax) continue;
    ASSERT_EQ(transfer_time(bytes, Bandwidth{bw}), reference(bytes, bw)) << bytes << " bytes at " << bw << " B/s";
  }
}

TEST(Time, FormatPicksAUnit) {
  EXPECT_EQ(format_time(999), "999 ps");
  EXPECT_EQ(format_time(ns(12)), "12.000 ns");
  EXPECT_EQ(format_time(us(1) + ns(250)), "1.250 us");
  EXPECT_EQ(format_time(ms(3)), "3.000 ms");
}

}  // namespace
}  // namespace cubesim::sim
