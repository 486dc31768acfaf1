// Functional memory: sparse pages, never-written detection, bounds, the allocator, footprint.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "sim/hw/allocator.h"
#include "sim/hw/errors.h"
#include "sim/hw/sparse_store.h"
#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using testing::small_doc;
using testing::small_topology;
using testing::random_bytes;

TEST(SparseStore, PagesAppearOnFirstWriteAndTrackWrittenBytes) {
  SparseStore s;
  EXPECT_EQ(s.pages(), 0u);
  const auto data = random_bytes(100'000, 1);
  const std::uint64_t at = SparseStore::kPageBytes - 1000;  // touches three pages
  s.write(at, data.data(), data.size());
  EXPECT_EQ(s.pages(), 3u);
  std::vector<std::byte> back(data.size());
  s.read(at, back.data(), back.size());
  EXPECT_EQ(back, data);
  EXPECT_FALSE(s.first_unwritten(at, data.size()));
  EXPECT_EQ(s.first_unwritten(at - 10, 20), at - 10);
  EXPECT_EQ(s.first_unwritten(at + data.size() - 5, 10), at + data.size());
  EXPECT_EQ(s.first_unwritten(1ull << 40, 1), 1ull << 40);  // far away: no page at all
  // Never-written bytes read as zero.
  std::byte z{0x55};
  s.read(3, &z, 1);
  EXPECT_EQ(z, std::byte{0});
}

TEST(SparseStore, PartialWritesFillAPageBitByBit) {
  SparseStore s;
  std::vector<std::byte> one(1, std::byte{7});
  for (std::uint64_t i = 0; i < SparseStore::kPageBytes; i += 2) s.write(i, one.data(), 1);
  EXPECT_EQ(s.first_unwritten(0, SparseStore::kPageBytes), 1u);
  for (std::uint64_t i = 1; i < SparseStore::kPageBytes; i += 2) s.write(i, one.data(), 1);
  EXPECT_FALSE(s.first_unwritten(0, SparseStore::kPageBytes));
  EXPECT_EQ(s.resident_bytes(), SparseStore::kPageBytes);  // the bitmap went once the page was full
}

// A write that covers a whole page makes it without zeroing it first or keeping a bitmap; a page
// begun by a partial write reads zeros where nothing wrote, whatever its memory held before (pages
// freed by an earlier store are reused by the allocator).
TEST(SparseStore, WholePageWritesSkipTheBitmapPartialOnesReadZeros) {
  for (int round = 0; round < 2; ++round) {
    SparseStore s;
    const auto page = random_bytes(SparseStore::kPageBytes, 3 + round);
    s.write(0, page.data(), page.size());
    EXPECT_EQ(s.resident_bytes(), SparseStore::kPageBytes);  // no bitmap
    EXPECT_FALSE(s.first_unwritten(0, SparseStore::kPageBytes));
    const auto few = random_bytes(10, 5);
    s.write(3 * SparseStore::kPageBytes + 100, few.data(), few.size());
    std::vector<std::byte> back(SparseStore::kPageBytes);
    s.read(3 * SparseStore::kPageBytes, back.data(), back.size());
    for (std::size_t i = 0; i < back.size(); ++i) {
      const std::byte want = i >= 100 && i < 110 ? few[i - 100] : std::byte{0};
      ASSERT_EQ(back[i], want) << "byte " << i;
    }
    s.fill(5 * SparseStore::kPageBytes, SparseStore::kPageBytes, std::byte{9});
    EXPECT_FALSE(s.first_unwritten(5 * SparseStore::kPageBytes, SparseStore::kPageBytes));
  }
}

TEST(SparseStore, CopyFromAnotherStore) {
  SparseStore a, b;
  const auto data = random_bytes(200'000, 2);
  a.write(12345, data.data(), data.size());
  b.copy_from(a, 12345, 777, data.size());
  std::vector<std::byte> back(data.size());
  b.read(777, back.data(), back.size());
  EXPECT_EQ(back, data);
  EXPECT_FALSE(b.first_unwritten(777, data.size()));
}

// combine_from against a byte-wise reference on random data: ranges that start at different page
// offsets (pieces end at either's boundaries), within one store and across two, a source page
// never written (zeros).
TEST(SparseStore, CombineInPlacePieceByPiece) {
  std::mt19937_64 rng(std::random_device{}());
  auto add = [](std::byte* d, const std::byte* s, std::uint64_t n, void*) {
    for (std::uint64_t i = 0; i < n; ++i) d[i] = static_cast<std::byte>(static_cast<unsigned>(d[i]) + static_cast<unsigned>(s[i]));
  };
  for (int same = 0; same < 2; ++same) {
    SparseStore a, b;
    SparseStore& dst = same ? a : b;
    const std::size_t n = 100'000 + rng() % 200'000;
    const std::uint64_t src_at = rng() % (3 * SparseStore::kPageBytes);
    const std::uint64_t dst_at = 8 * SparseStore::kPageBytes + rng() % (3 * SparseStore::kPageBytes);
    const auto x = random_bytes(n, static_cast<std::uint32_t>(rng()));
    const auto y = random_bytes(n, static_cast<std::uint32_t>(rng()));
    a.write(src_at, x.data(), n / 2);  // the source's second half never written: zeros
    dst.write(dst_at, y.data(), n);
    dst.combine_from(a, src_at, dst_at, n, add, nullptr);
    std::vector<std::byte> got(n);
    dst.read(dst_at, got.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto want = static_cast<std::byte>(static_cast<unsigned>(y[i]) + (i < n / 2 ? static_cast<unsigned>(x[i]) : 0u));
      ASSERT_EQ(got[i], want) << "byte " << i << (same ? " (one store)" : " (two stores)");
    }
    EXPECT_FALSE(dst.first_unwritten(dst_at, n));
  }
}

// Memory::combine checks as a read of both and a write of the destination do: never-written bytes
// and transfers in flight are refused with the same messages.
TEST(Memory, CombineChecksAsReadsAndAWrite) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  Memory& m = sys.hbm(1);
  auto add = [](std::byte* d, const std::byte* s, std::uint64_t n, void*) {
    for (std::uint64_t i = 0; i < n; ++i) d[i] = static_cast<std::byte>(static_cast<unsigned>(d[i]) + static_cast<unsigned>(s[i]));
  };
  m.write_as<std::uint8_t>(0, std::vector<std::uint8_t>{1, 2, 3, 4});
  m.write_as<std::uint8_t>(4096, std::vector<std::uint8_t>{10, 20, 30});
  try {
    m.combine(m, 4096, 0, 4, add, nullptr);  // the source's 4th byte was never written
    ADD_FAILURE() << "expected UninitializedReadError";
  } catch (const UninitializedReadError& e) {
    EXPECT_EQ(e.first_unwritten(), 4099u);
  }
  m.combine(m, 4096, 0, 3, add, nullptr);
  EXPECT_EQ(m.read_as<std::uint8_t>(0, 4), (std::vector<std::uint8_t>{11, 22, 33, 4}));
  EXPECT_THROW(m.combine(m, 0, 1ull << 50, 3, add, nullptr), MemoryError);
}

TEST(Memory, ReadsWhatWasWrittenAndRejectsNeverWrittenBytes) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  Memory& m = sys.hbm(1);
  EXPECT_EQ(m.name(), "cube1.hbm");
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  m.write_as<float>(64, v);
  EXPECT_EQ(m.read_as<float>(64, 3), v);
  try {
    m.read_as<float>(64, 4);
    ADD_FAILURE() << "expected UninitializedReadError";
  } catch (const UninitializedReadError& e) {
    EXPECT_EQ(e.first_unwritten(), 76u);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cube1.hbm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0x40, 0x50)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte 0x4c was never written"), std::string::npos) << msg;
    EXPECT_NE(msg.find("check_uninitialized"), std::string::npos) << msg;
  }
  EXPECT_EQ(m.first_unwritten(60, 20), 60u);
}

TEST(Memory, UncheckedReadsOfNeverWrittenBytesGiveZeros) {
  sim::Simulator sim;
  SystemOptions o;
  o.check_uninitialized = false;
  System sys(sim, small_topology(), o);
  EXPECT_EQ(sys.hbm(0).read_as<std::uint32_t>(4096, 2), (std::vector<std::uint32_t>{0, 0}));
}

TEST(Memory, AccessOutsideTheMemoryNamesRangeAndCapacity) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  Memory& tcm = sys.tcm(0, 1);
  EXPECT_EQ(tcm.capacity(), 256u * 1024);
  try {
    tcm.fill(256 * 1024 - 8, 16, std::byte{1});
    ADD_FAILURE();
  } catch (const MemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cube0.pe1.tcm: fill [0x3fff8, 0x40008) (16 bytes) is outside the memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("capacity 256.00 KiB"), std::string::npos) << msg;
  }
  EXPECT_THROW(tcm.write(~0ull - 2, std::vector<std::byte>(8)), MemoryError);  // no wrap-around
}

TEST(Memory, TimingOnlyKeepsNoValues) {
  sim::Simulator sim;
  SystemOptions o;
  o.functional = false;
  System sys(sim, small_topology(), o);
  Memory& m = sys.hbm(0);
  m.fill(0, 1 << 20, std::byte{9});
  EXPECT_EQ(m.resident_bytes(), 0u);
  EXPECT_EQ(m.read_as<std::uint8_t>(0, 4), (std::vector<std::uint8_t>{0, 0, 0, 0}));
  EXPECT_FALSE(m.first_unwritten(0, 16));
}

TEST(Allocator, FirstFitAlignedWithStatistics) {
  Allocator a("hbm", 1 << 20);
  const std::uint64_t x = a.allocate(1000, 256, "x");
  const std::uint64_t y = a.allocate(5000, 4096, "y");
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 4096u);
  EXPECT_EQ(a.size_of(y), 5000u);
  const std::uint64_t z = a.allocate(2000, 256, "z");  // fits in the gap between x and y
  EXPECT_EQ(z, 1024u);
  a.free(y);
  a.free(x);
  a.free(z);
  const Allocator::Stats s = a.stats();
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.peak, 1000u + 5000u + 2000u);
  EXPECT_EQ(s.free_blocks, 1u);  // coalesced
  EXPECT_EQ(s.largest_free, 1u << 20);
  EXPECT_THROW(a.free(12), MemoryError);
  EXPECT_THROW(a.allocate(8, 3), MemoryError);
}

TEST(Allocator, OutOfMemoryCarriesStatistics) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  Memory& m = sys.hbm(2);
  m.allocate(40 << 20, 256, "weights");
  m.allocate(20 << 20, 256, "activations");
  try {
    m.allocate(8 << 20, 256, "grads");
    ADD_FAILURE();
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    for (const char* part : {"cube2.hbm: out of memory", "cannot allocate 8.00 MiB", "for 'grads'", "capacity 64.00 MiB",
                             "in use 60.00 MiB in 2 allocations", "largest free block 4.00 MiB"}) {
      EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nmissing: " << part;
    }
  }
}

std::uint64_t resident_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

TEST(Memory, TerabyteOfNominalHbmCostsOnlyWhatIsTouched) {
  auto doc = small_doc();
  doc["cube"]["hbm"].erase("capacity_MiB");
  doc["cube"]["hbm"]["capacity_TiB"] = 1;
  const std::uint64_t before = resident_kib();
  {
    sim::Simulator sim;
    System sys(sim, topology_from_json(doc, "1 TiB HBM"));
    Memory& m = sys.hbm(0);
    EXPECT_EQ(m.capacity(), 1ull << 40);
    // 1 MiB touched, in 64 KiB pieces spread over the whole terabyte, half of it moved by transfers.
    const auto piece = random_bytes(64 << 10, 3);
    for (std::uint64_t i = 0; i < 16; ++i) m.write(i * (1ull << 36) + 4096, piece);
    testing::run_process(sim, [&] {
      for (std::uint64_t i = 0; i < 8; ++i) {
        sys.transfer(m.at(i * (1ull << 36) + 4096), sys.hbm(1).at((i + 1) * (1ull << 36)), 64 << 10);
      }
    });
    EXPECT_EQ(m.read_as<std::byte>(7 * (1ull << 36) + 4096, 64 << 10), piece);
    EXPECT_LE(sys.resident_bytes(), 3u << 20);
    const std::uint64_t grown_mib = (resident_kib() - std::min(before, resident_kib())) / 1024;
#ifdef CUBESIM_ASAN
    // ASan shadows every byte and keeps freed memory in quarantine: a looser bound.
    EXPECT_LT(grown_mib, 400u) << "a 1 TiB memory with 1 MiB touched (ASan build)";
#else
    EXPECT_LT(grown_mib, 100u) << "a 1 TiB memory with 1 MiB touched must stay under 100 MB resident";
#endif
  }
}

// "channel_map": "hash": every stripe of `channels` blocks is a permutation of the channels, rotated
// by a hash of its index, so rows at a power-of-two pitch spread where round robin piles them up.
TEST(Memory, HashedChannelsPermuteEachStripeAndSpreadStridedRows) {
  auto doc = small_doc();  // 4 channels of 256-byte blocks: a stripe is 1 KiB
  doc["cube"]["hbm"]["channel_map"] = "hash";
  sim::Simulator sim;
  System sys(sim, topology_from_json(doc, "hashed"));
  Memory& m = sys.hbm(0);
  ASSERT_TRUE(m.hashed());
  std::vector<int> rotations(4, 0);
  for (std::uint64_t q = 0; q < 200; ++q) {
    std::vector<int> seen(4, 0);
    for (std::uint64_t r = 0; r < 4; ++r) ++seen[m.channel_of(q * 1024 + r * 256 + 17)];
    EXPECT_EQ(seen, (std::vector<int>{1, 1, 1, 1})) << "stripe " << q;
    ++rotations[m.channel_of(q * 1024)];
  }
  for (int n : rotations) EXPECT_GT(n, 20) << "every rotation occurs";  // 200 stripes, ~50 each
  // Round robin: rows 1 KiB apart all land on one channel.
  System plain(sim, small_topology());
  for (std::uint64_t row = 0; row < 64; ++row) EXPECT_EQ(plain.hbm(0).channel_of(row * 1024), 0u);
}

// A strided read whose rows sit a stripe apart, through an L2 that misses (it books the HBM per run
// of missed sectors, at their addresses): round robin serves it on one channel, the hash on all of
// them. Both move every byte once (the channels' counters add up to the bytes).
TEST(Memory, HashedChannelsServeStridedRowsInParallel) {
  auto run = [](bool hashed, std::uint64_t* hbm_bytes) {
    auto doc = small_doc();
    doc["cube"]["l2"] = nlohmann::json::parse(R"({"capacity_KiB": 256, "line_bytes": 128, "sector_bytes": 32,
                                                  "ways": 4, "bandwidth_GBps": 4000, "latency_ns": 10})");
    doc["cube"]["pe"]["dma"]["read_GBps"] = 4000;  // faster than the HBM: its channels decide
    doc["cube"]["pe"]["tcm"]["bandwidth_GBps"] = 4000;
    if (hashed) doc["cube"]["hbm"]["channel_map"] = "hash";
    sim::Simulator sim;
    SystemOptions o;
    o.functional = false;
    System sys(sim, topology_from_json(doc, "strided"), o);
    Time t = 0;
    testing::run_process(sim, [&] {
      // 256 rows of 256 bytes, 1 KiB apart: 64 KiB.
      sys.start_transfer(sys.hbm(0), Region{4096, 256, 256, 1024}, sys.tcm(0, 0), Region::contiguous(0, 65536)).wait();
      t = sim.now();
    });
    *hbm_bytes = sys.hbm(0).counters().bytes;
    return t;
  };
  std::uint64_t b0 = 0, b1 = 0;
  const Time plain = run(false, &b0), hashed = run(true, &b1);
  EXPECT_EQ(b0, 65536u);
  EXPECT_EQ(b1, 65536u);
  // One channel at 250 GB/s: 64 KiB take 262 ns; four channels about a quarter of that (plus the
  // 110 ns of latency both pay).
  EXPECT_LT(static_cast<double>(hashed), 0.7 * static_cast<double>(plain))
      << sim::format_time(hashed) << " vs " << sim::format_time(plain);
}

// Chunks of any length and start on a hashed memory book exactly their bytes (the whole stripes in
// the middle of a long chunk are counted in one step, its ends block by block).
TEST(Memory, HashedChannelsBookEveryByteOfOddChunks) {
  auto doc = small_doc();
  doc["cube"]["hbm"]["channel_map"] = "hash";
  std::mt19937 rng(11);
  for (int i = 0; i < 30; ++i) {
    sim::Simulator sim;
    SystemOptions o;
    o.functional = false;
    System sys(sim, topology_from_json(doc, "hashed"), o);
    const std::uint64_t addr = rng() % 100000, len = 1 + rng() % 20000;
    testing::run_process(sim, [&] { sys.transfer(sys.hbm(0).at(addr), sys.hbm(1).at(0), len); });
    EXPECT_EQ(sys.hbm(0).counters().bytes, len) << "addr " << addr << " len " << len;
  }
}

TEST(Memory, ABadChannelMapNamesTheField) {
  auto doc = small_doc();
  doc["cube"]["hbm"]["channel_map"] = "xor";
  try {
    topology_from_json(doc, "bad");
    ADD_FAILURE() << "no error";
  } catch (const TopologyError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cube.hbm.channel_map"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"hash\""), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace cubesim::hw
