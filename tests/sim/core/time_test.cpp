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

TEST(Time, FormatPicksAUnit) {
  EXPECT_EQ(format_time(999), "999 ps");
  EXPECT_EQ(format_time(ns(12)), "12.000 ns");
  EXPECT_EQ(format_time(us(1) + ns(250)), "1.250 us");
  EXPECT_EQ(format_time(ms(3)), "3.000 ms");
}

}  // namespace
}  // namespace cubesim::sim
