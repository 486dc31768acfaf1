// The hazard checker: it fires on planted races and stays quiet on correct double buffering.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/core/errors.h"
#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using testing::small_topology;

TEST(Hazard, ReadWhileATransferWritesNamesBothActorsAddressesAndTime) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  sys.hbm(0).fill(0, 64 << 10, std::byte{1});
  sys.hbm(1).fill(0, 1 << 20, std::byte{2});
  sim.spawn("writer", [&] { sys.start_transfer(sys.hbm(0).at(0), sys.hbm(1).at(0x1000), 64 << 10); });
  sim.spawn("reader", [&] {
    sim::this_process::sleep(sim::ns(10));
    sys.hbm(1).read_as<std::uint8_t>(0x1064, 16);  // inside the region still being written
  });
  try {
    sim.run();
    FAIL() << "the race went unreported";
  } catch (const sim::ProcessError& e) {
    ASSERT_EQ(e.failures().size(), 1u);
    EXPECT_EQ(e.failures()[0].process, "reader");
    try {
      std::rethrow_exception(e.failures()[0].error);
    } catch (const HazardError& h) {
      const HazardReport& r = h.report();
      EXPECT_EQ(r.kind, HazardKind::kReadDuringWrite);
      EXPECT_EQ(r.time, sim::ns(10));
      EXPECT_EQ(r.memory, "cube1.hbm");
      EXPECT_EQ(r.actor, "'reader'");
      EXPECT_EQ(r.region, Region::contiguous(0x1064, 16));
      EXPECT_EQ(r.other_region, Region::contiguous(0x1000, 64 << 10));
      const std::string msg = h.what();
      for (const std::string& part : std::vector<std::string>{"hazard (read during write) at " + sim::format_time(sim::ns(10)), "in cube1.hbm",
                                     "'reader' reads [0x1064, 0x1074)",
                                     "transfer 1 issued by 'writer' at " + sim::format_time(0),
                                     "cube0.hbm [0x0, 0x10000) -> cube1.hbm [0x1000, 0x11000)",
                                     "still writing [0x1000, 0x11000)"}) {
        EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nmissing: " << part;
      }
    }
  }
}

TEST(Hazard, RecordModeCollectsEveryKind) {
  sim::Simulator sim;
  SystemOptions o;
  o.hazards = HazardMode::kRecord;
  System sys(sim, small_topology(), o);
  sys.hbm(0).fill(0, 1 << 20, std::byte{1});
  testing::run_process(sim, [&] {
    TransferHandle t = sys.start_transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), 256 << 10);
    sys.hbm(0).fill(128 << 10, 16, std::byte{5});                               // overwrites the source
    sys.start_transfer(sys.hbm(0).at(512 << 10), sys.hbm(1).at(64 << 10), 4096);  // second writer
    t.wait();
  }, "rank0");
  ASSERT_EQ(sys.hazards().size(), 2u);
  EXPECT_EQ(sys.hazards()[0].kind, HazardKind::kWriteDuringRead);
  EXPECT_EQ(sys.hazards()[0].actor, "'rank0'");
  EXPECT_EQ(sys.hazards()[1].kind, HazardKind::kWriteDuringWrite);
  EXPECT_EQ(sys.hazards()[1].actor, "transfer 2 issued by 'rank0'");
  EXPECT_EQ(sys.hazards()[1].other_transfer, 1u);
}

// A write is checked against every read and write in flight in the order they were issued (a
// transfer within one memory: its read, then its write), and transfers that landed, in any order,
// are forgotten: many transfers in flight on one HBM, landing out of order.
TEST(Hazard, ReportsComeInIssueOrderAndLandedTransfersAreForgotten) {
  sim::Simulator sim;
  SystemOptions o;
  o.hazards = HazardMode::kRecord;
  o.functional = false;
  System sys(sim, small_topology(), o);
  Memory& hbm = sys.hbm(0);
  std::vector<std::uint64_t> ids;
  testing::run_process(sim, [&] {
    // Transfer i + 1 reads from i * 64 KiB in cube 0's HBM: even i 200000 bytes over the link to
    // cube 1 (2 us each, one after the other), odd i 1 KiB into PE 0's TCM (landing within 1 us).
    std::vector<TransferHandle> reads;
    for (std::uint64_t i = 0; i < 40; ++i) {
      reads.push_back(i % 2 ? sys.start_transfer(hbm.at(i << 16), sys.tcm(0, 0).at(i << 10), 1024)
                            : sys.start_transfer(hbm.at(i << 16), sys.hbm(1).at(i << 18), 200000));
    }
    ASSERT_TRUE(sys.hazards().empty());
    // Transfer 41: within cube 0's HBM, reading [3 MiB, +4 KiB) and writing [4 MiB, +4 KiB).
    sys.start_transfer(hbm.at(3 << 20), hbm.at(4 << 20), 4096);
    // Transfer 42: writes [3 MiB + 8 KiB, +4 KiB) from cube 1.
    sys.start_transfer(sys.hbm(1).at(20 << 20), hbm.at((3 << 20) + 8192), 4096);
    // A write across all of them reports each in issue order: 40 reads, 41's read, 41's write, 42.
    hbm.fill(0, 5 << 20, std::byte{0});
    ASSERT_EQ(sys.hazards().size(), 43u);
    for (std::size_t i = 0; i < 40; ++i) {
      EXPECT_EQ(sys.hazards()[i].other_transfer, i + 1) << i;
      EXPECT_EQ(sys.hazards()[i].kind, HazardKind::kWriteDuringRead) << i;
    }
    EXPECT_EQ(sys.hazards()[40].other_transfer, 41u);
    EXPECT_EQ(sys.hazards()[40].kind, HazardKind::kWriteDuringRead);
    EXPECT_EQ(sys.hazards()[41].other_transfer, 41u);
    EXPECT_EQ(sys.hazards()[41].kind, HazardKind::kWriteDuringWrite);
    EXPECT_EQ(sys.hazards()[42].other_transfer, 42u);
    // A read races with the writes alone.
    sys.clear_hazards();
    hbm.read_as<std::uint8_t>(0, 5 << 20);
    ASSERT_EQ(sys.hazards().size(), 2u);
    EXPECT_EQ(sys.hazards()[0].other_transfer, 41u);
    EXPECT_EQ(sys.hazards()[1].other_transfer, 42u);
    // The short reads land first; then only the long ones are still in flight there.
    sys.clear_hazards();
    for (std::size_t i = 1; i < 40; i += 2) reads[i].wait();
    for (std::size_t i = 0; i < 40; ++i) {
      ASSERT_EQ(reads[i].done(), i % 2 == 1) << i;
    }
    hbm.fill(0, 40 << 16, std::byte{0});
    for (const HazardReport& h : sys.hazards()) ids.push_back(h.other_transfer);
    sys.clear_hazards();
    wait_all(reads);
    sim::this_process::sleep(sim::us(100));
    hbm.fill(0, 5 << 20, std::byte{0});
    EXPECT_TRUE(sys.hazards().empty()) << sys.hazards().size() << " reports after everything landed";
  });
  std::vector<std::uint64_t> want;
  for (std::uint64_t i = 0; i < 40; i += 2) want.push_back(i + 1);
  EXPECT_EQ(ids, want);
}

// A PE streams K tiles through two TCM buffers: load tile k+1 while computing on tile k, and write
// results back through a third buffer. `wait_before_use` false plants the classic race.
std::vector<HazardReport> double_buffered(bool wait_before_use) {
  sim::Simulator sim;
  SystemOptions o;
  o.hazards = HazardMode::kRecord;
  o.check_uninitialized = false;  // the racy version reads a buffer before its bytes arrive
  System sys(sim, small_topology(), o);
  Memory& hbm = sys.hbm(0);
  Pe& pe = sys.pe(0, 0);
  Memory& tcm = pe.tcm();
  constexpr int kTiles = 6;
  constexpr std::uint64_t kTile = 16 << 10;
  const std::uint64_t buf[2] = {0, kTile};
  const std::uint64_t out = 2 * kTile;
  hbm.fill(0, kTiles * kTile, std::byte{7});
  testing::run_process(sim, [&] {
    TransferHandle load[2], store;
    load[0] = sys.start_transfer(hbm.at(0), tcm.at(buf[0]), kTile);
    for (int k = 0; k < kTiles; ++k) {
      if (wait_before_use) load[k % 2].wait();
      if (k + 1 < kTiles) {
        load[(k + 1) % 2] = sys.start_transfer(hbm.at((k + 1) * kTile), tcm.at(buf[(k + 1) % 2]), kTile);
      }
      std::vector<std::byte> tile(kTile);
      tcm.read(buf[k % 2], tile);  // the PE computes on tile k
      pe.compute(64 * 64 * 64, DType::bf16);
      if (wait_before_use) store.wait();  // the output buffer is free again
      tcm.write(out, std::span<const std::byte>(tile).first(4096));
      store = sys.start_transfer(tcm.at(out), hbm.at((1 << 20) + k * 4096), 4096);
    }
    store.wait();
    load[0].wait();
    load[1].wait();
  }, "pe0");
  return sys.hazards();
}

TEST(Hazard, QuietOnCorrectDoubleBufferingAndFiresWithoutTheWaits) {
  EXPECT_TRUE(double_buffered(true).empty());
  const std::vector<HazardReport> races = double_buffered(false);
  ASSERT_FALSE(races.empty());
  EXPECT_EQ(races[0].kind, HazardKind::kReadDuringWrite);
  EXPECT_EQ(races[0].memory, "cube0.pe0.tcm");
  EXPECT_EQ(races[0].actor, "'pe0'");
}

TEST(Hazard, NeighbouringTilesOfOneMatrixDoNotConflict) {
  sim::Simulator sim;
  System sys(sim, small_topology());  // HazardMode::kThrow
  Memory& hbm = sys.hbm(0);
  Memory& tcm = sys.tcm(0, 1);
  tcm.fill(0, 64 << 10, std::byte{3});
  const std::uint64_t pitch = 1024 * 4;  // a row-major f32 matrix with 1024 columns
  testing::run_process(sim, [&] {
    // Two 32x32 tiles side by side: their bounding ranges overlap, their bytes do not.
    TransferHandle a = sys.start_transfer(tcm, Region::contiguous(0, 32 * 128), hbm, Region{0, 32, 128, pitch});
    TransferHandle b = sys.start_transfer(tcm, Region::contiguous(8192, 32 * 128), hbm, Region{128, 32, 128, pitch});
    a.wait();
    b.wait();
  });
  EXPECT_TRUE(Region({0, 32, 128, pitch}).overlaps(Region{100, 2, 64, pitch}));
  EXPECT_FALSE(Region({0, 32, 128, pitch}).overlaps(Region{128, 32, 128, pitch}));
  EXPECT_TRUE(sys.hazards().empty());
}

}  // namespace
}  // namespace cubesim::hw
