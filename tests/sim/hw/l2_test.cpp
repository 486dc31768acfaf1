// The L2 cache unit: hand-computed hit and miss times, LRU eviction within a set, write-back,
// strided regions, counters that add up, timing-only = functional, the topology's L2 section and
// every error it can give, and a printout of the lookup rate.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <ctime>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sim/hw/errors.h"
#include "sim/hw/l2_cache.h"
#include "sim/hw/system.h"
#include "sim/hw/utilisation.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using json = nlohmann::json;
using sim::Duration;
using sim::Time;
using testing::random_bytes;
using testing::run_process;

// small_doc with one HBM channel (hand-computable bookings) and an L2 of 64 KiB: 128-byte lines of
// four 32-byte sectors, 4 ways, so 128 sets; 2000 GB/s, 20 ns hit latency.
json l2_doc() {
  json d = testing::small_doc();
  d["cube"]["hbm"]["channels"] = 1;
  d["cube"]["l2"] = json::parse(R"({"capacity_KiB": 64, "line_bytes": 128, "sector_bytes": 32, "ways": 4,
                                    "bandwidth_GBps": 2000, "latency_ns": 20})");
  return d;
}
Topology l2_topology() { return topology_from_json(l2_doc(), "small+l2"); }

SystemOptions timing_only() {
  SystemOptions o;
  o.functional = false;
  return o;
}

// Runs one transfer at the current time and returns how long it took.
Duration timed(System& sys, Memory& src, const Region& sr, Memory& dst, const Region& dr) {
  const Time t0 = sys.simulator().now();
  sys.transfer(src, sr, dst, dr);
  return sys.simulator().now() - t0;
}
Duration timed(System& sys, MemRef src, MemRef dst, std::uint64_t bytes) {
  return timed(sys, *src.memory, Region::contiguous(src.addr, bytes), *dst.memory, Region::contiguous(dst.addr, bytes));
}

TEST(L2, ACubeWithoutAnL2HasNoneAndTheTopologyReadsTheSection) {
  const Topology plain = testing::small_topology();
  EXPECT_FALSE(plain.cubes[0].l2.present);
  sim::Simulator sim;
  System sys(sim, plain);
  EXPECT_EQ(sys.cube(0).l2(), nullptr);
  for (const UnitUsage& u : sys.usage()) EXPECT_NE(u.kind, UnitKind::l2) << u.name;

  const Topology t = l2_topology();
  const L2Spec& s = t.cubes[2].l2;
  EXPECT_TRUE(s.present);
  EXPECT_EQ(s.capacity_bytes, 65536u);
  EXPECT_EQ(s.line_bytes, 128u);
  EXPECT_EQ(s.sector_bytes, 32u);
  EXPECT_EQ(s.ways, 4u);
  EXPECT_EQ(s.bandwidth, sim::Bandwidth::GBps(2000));
  EXPECT_EQ(s.latency, sim::ns(20));
  sim::Simulator sim2;
  System sys2(sim2, t);
  L2Cache* l2 = sys2.cube(2).l2();
  ASSERT_NE(l2, nullptr);
  EXPECT_EQ(l2->sets(), 128u);
  EXPECT_EQ(l2->sectors_per_line(), 4u);
  EXPECT_EQ(l2->name(), "cube2.l2");
  EXPECT_EQ(&l2->memory(), &sys2.hbm(2));
  EXPECT_EQ(sys2.unit(l2->id()).kind(), UnitKind::l2);
  // The HBM stages of paths are the L2's.
  const PathFigures f = sys2.path_figures(sys2.hbm(2), sys2.tcm(2, 0));
  EXPECT_EQ(f.stage_names().front(), "cube2.l2 (read)");
  EXPECT_EQ(sys2.path_figures(sys2.tcm(2, 0), sys2.hbm(2)).stage_names().back(), "cube2.l2 (write)");
  EXPECT_EQ(sys2.path_figures(sys2.hbm(0), sys2.hbm(1)).stage_names().front(), "cube0.l2 (read)");
  EXPECT_EQ(sys2.path_figures(sys2.hbm(0), sys2.hbm(1)).stage_names().back(), "cube1.l2 (write)");
}

// A read of N bytes HBM -> TCM, twice. Path: L2 (read, 20 ns), DMA read channel 250 GB/s (the
// slowest stage: 4096-byte chunks take 16.384 ns), TCM write; DMA request overhead 10 ns.
//   second read, all hits: 10 + 20 + chunks x 16.384 ns.
//   first read, all misses: each chunk's HBM booking starts 20 ns (tag lookup) + 100 ns (HBM
//     latency) after its head reaches the L2, the L2 passes it from then (2000 GB/s, faster than the
//     HBM's 1000 GB/s but the chunk waits for its tail from the HBM), and the DMA channel from then:
//     the hit time plus the HBM latency, as the DMA channel stays the bottleneck: exactly the path's
//     figures, which are the cold path's.
TEST(L2, ReadTwiceFirstMissesThenHitsAtL2BandwidthAndLatency) {
  for (std::uint64_t n : {4096ull, 16384ull}) {
    SCOPED_TRACE(n);
    for (bool functional : {true, false}) {
      sim::Simulator sim;
      SystemOptions o;
      o.functional = functional;
      System sys(sim, l2_topology(), o);
      Memory& hbm = sys.hbm(0);
      const std::uint64_t a = hbm.allocate(n, 256, "x");
      hbm.write(a, random_bytes(n, 7));
      Duration cold = 0, warm = 0;
      run_process(sim, [&] {
        cold = timed(sys, hbm.at(a), sys.tcm(0, 0).at(0), n);
        warm = timed(sys, hbm.at(a), sys.tcm(0, 1).at(0), n);
      });
      const std::uint64_t chunks = n / 4096;
      const Duration hit = sim::ns(10) + sim::ns(20) + static_cast<Duration>(chunks) * sim::ps(16384);
      EXPECT_EQ(warm, hit);
      EXPECT_EQ(cold, hit + sim::ns(100));
      // The path's figures are the cold path's: alpha 10 + 20 + 100 ns, the DMA channel the slowest.
      const PathFigures f = sys.path_figures(hbm, sys.tcm(0, 1));
      EXPECT_EQ(f.alpha, sim::ns(130));
      EXPECT_EQ(cold, f.time(n));
      const UnitCounters c = sys.cube(0).l2()->counters();
      EXPECT_EQ(c.misses, n / 32);  // sectors
      EXPECT_EQ(c.hits, n / 32);
      EXPECT_EQ(c.fill_bytes, n);
      EXPECT_EQ(c.writeback_bytes, 0u);
      EXPECT_EQ(c.bytes, 2 * n);       // both reads passed the L2
      EXPECT_EQ(c.pieces, 2 * chunks);
      EXPECT_EQ(c.busy, static_cast<Duration>(2 * n / 2));  // 2000 GB/s = 2 bytes per ps
      EXPECT_EQ(hbm.counters().bytes, n) << "only the misses reach the HBM";
      if (functional) {
        EXPECT_EQ(sys.tcm(0, 1).read_as<std::byte>(0, n), random_bytes(n, 7));
      }
    }
  }
}

// One chunk of 128 bytes read cold, by hand: head at 10 ns (DMA overhead), tags looked up by 30 ns,
// HBM busy [130, 130.128) ns, the L2 passes it [130, 130.064), the DMA channel [130, 130.512).
TEST(L2, OneColdLineByHand) {
  sim::Simulator sim;
  System sys(sim, l2_topology(), timing_only());
  Duration d = 0;
  run_process(sim, [&] { d = timed(sys, sys.hbm(0).at(4096), sys.tcm(0, 0).at(0), 128); });
  EXPECT_EQ(d, sim::ns(130) + sim::ps(512));
}

// Set indexing: consecutive lines fill consecutive sets (wrapping), and a line written back comes
// from the set and tag it was kept under; checked against the definition with a real division, for
// one set, a power of two and 25600 sets (H100-like), over addresses up to the HBM's end.
TEST(L2, SetIndexMatchesItsDefinition) {
  for (const char* capacity : {"capacity_bytes", "capacity_KiB", "capacity_MiB"}) {
    json d = l2_doc();
    d["cube"]["l2"].erase("capacity_KiB");
    d["cube"]["hbm"].erase("capacity_MiB");
    d["cube"]["hbm"]["capacity_GiB"] = 141;
    d["cube"]["l2"]["ways"] = 16;
    const std::string c = capacity;
    d["cube"]["l2"][c] = c == "capacity_bytes" ? 2048 : c == "capacity_KiB" ? 512 : 50;  // 1, 256, 25600 sets
    sim::Simulator sim;
    System sys(sim, topology_from_json(d, "sets"), timing_only());
    const L2Cache& l2 = *sys.cube(0).l2();
    const std::uint64_t sets = l2.sets();
    std::mt19937_64 rng(11);
    for (int i = 0; i < 20000; ++i) {
      const std::uint64_t line = i < 10000 ? static_cast<std::uint64_t>(i) : rng() % ((141ull << 30) / 128);
      const std::uint64_t q = line / sets, r = line % sets;
      std::uint64_t x = q;  // MurmurHash3's finalizer, as l2_cache.h defines h
      x ^= x >> 33;
      x *= 0xff51afd7ed558ccdULL;
      x ^= x >> 33;
      x *= 0xc4ceb9fe1a85ec53ULL;
      x ^= x >> 33;
      const std::uint64_t h = static_cast<std::uint64_t>((static_cast<unsigned __int128>(x) * sets) >> 64);
      ASSERT_EQ(l2.set_of(line * 128 + 5), (r + h) % sets) << "line " << line << ", " << sets << " sets";
    }
  }
}

// Five lines of one set (4 ways): reading them in order evicts the first (LRU); touching a line
// keeps it; dirty lines are written back to the HBM when evicted, clean ones are not.
TEST(L2, LruEvictsWithinASetAndWritesBackDirtyLines) {
  sim::Simulator sim;
  System sys(sim, l2_topology(), timing_only());
  L2Cache& l2 = *sys.cube(0).l2();
  Memory& hbm = sys.hbm(0);
  std::vector<std::uint64_t> lines;  // addresses of lines in the set of address 0
  for (std::uint64_t a = 0; lines.size() < 6; a += 128) {
    if (l2.set_of(a) == l2.set_of(0)) lines.push_back(a);
  }
  Memory& tcm = sys.tcm(0, 0);
  auto read = [&](std::uint64_t a) { sys.transfer(hbm.at(a), tcm.at(0), 128); };
  auto write = [&](std::uint64_t a) { sys.transfer(tcm.at(0), hbm.at(a), 128); };
  run_process(sim, [&] {
    for (int i = 0; i < 4; ++i) read(lines[i]);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(l2.holds(lines[i], 128)) << i;
    read(lines[4]);  // evicts lines[0], the least recently used
    EXPECT_FALSE(l2.holds(lines[0], 128));
    for (int i = 1; i < 5; ++i) EXPECT_TRUE(l2.holds(lines[i], 128)) << i;
    read(lines[1]);  // a hit: lines[1] becomes the most recent
    read(lines[0]);  // evicts lines[2] now
    EXPECT_TRUE(l2.holds(lines[1], 128));
    EXPECT_FALSE(l2.holds(lines[2], 128));
    EXPECT_EQ(l2.counters().writeback_bytes, 0u) << "clean lines are dropped";
    // Write a new line (allocated dirty, nothing fetched), then push it out with reads.
    write(lines[5]);  // evicts lines[3]
    EXPECT_TRUE(l2.holds(lines[5], 128));
    EXPECT_EQ(l2.counters().fill_bytes, 6u * 128);
    for (int i : {2, 3, 4}) read(lines[i]);
  });
  // Reads: 4 cold + 1 cold + 1 hit + 1 cold (lines[0]) + 3 cold (2, 3, 4: each was evicted) = 9
  // cold lines of 4 sectors, 1 hit line.
  const UnitCounters c = l2.counters();
  EXPECT_EQ(c.hits, 4u);
  EXPECT_EQ(c.misses, 9u * 4);
  EXPECT_EQ(c.hits + c.misses, 10u * 4) << "every read sector is a hit or a miss";
  EXPECT_EQ(c.fill_bytes, 9u * 128);
  // After write(lines[5]) the set held, least recent first, 4, 1, 0, 5: reading 2 evicts 4, reading
  // 3 evicts 1, reading 4 evicts 0. lines[5], the dirty one, stays: nothing written back yet.
  EXPECT_EQ(c.writeback_bytes, 0u);
  EXPECT_TRUE(l2.holds(lines[5], 128));
  sim.spawn("more", [&] { read(lines[1]); });  // evicts lines[5], the least recent now: written back
  sim.run();
  EXPECT_FALSE(l2.holds(lines[5], 128));
  EXPECT_EQ(l2.counters().writeback_bytes, 128u);
  // The HBM served every fill and the write-back, and nothing else.
  EXPECT_EQ(hbm.counters().bytes, 10u * 128 + 128);
  EXPECT_EQ(l2.counters().bytes, 12u * 128);  // 11 reads and 1 write passed the L2
}

// A strided tile: 4 rows of 64 bytes at byte 32 of lines 4096 bytes apart touch sectors 1 and 2 of
// four lines; reading those four lines whole then hits 2 sectors and misses 2 in each.
TEST(L2, StridedRegionsLookUpTheirRowSegments) {
  sim::Simulator sim;
  System sys(sim, l2_topology(), timing_only());
  L2Cache& l2 = *sys.cube(0).l2();
  Memory& hbm = sys.hbm(0);
  run_process(sim, [&] {
    sys.transfer(hbm, Region{32, 4, 64, 4096}, sys.tcm(0, 0), Region::contiguous(0, 256));
    EXPECT_EQ(l2.counters().misses, 8u);
    EXPECT_EQ(l2.counters().fill_bytes, 256u);
    for (std::uint64_t r = 0; r < 4; ++r) {
      EXPECT_TRUE(l2.holds(32 + r * 4096, 64));
      EXPECT_FALSE(l2.holds(r * 4096, 128));
    }
    sys.transfer(hbm, Region{0, 4, 128, 4096}, sys.tcm(0, 0), Region::contiguous(0, 512));
  });
  const UnitCounters c = l2.counters();
  EXPECT_EQ(c.hits, 8u);
  EXPECT_EQ(c.misses, 16u);
  EXPECT_EQ(c.fill_bytes, 16u * 32);
  EXPECT_EQ(hbm.counters().bytes, 16u * 32) << "misses in runs of whole sectors";
}

// Link traffic to and from a cube's HBM passes its L2: a remote read of data the remote cube just
// wrote hits there; a write lands in the destination's L2.
TEST(L2, LinkTransfersPassBothCubesL2s) {
  sim::Simulator sim;
  System sys(sim, l2_topology(), timing_only());
  const std::uint64_t n = 8192;  // 64 lines: they fit in 128 sets of 4 ways
  run_process(sim, [&] {
    sys.transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), n);  // cold read on cube 0, write into cube 1's L2
    sys.transfer(sys.hbm(1).at(0), sys.hbm(0).at(n), n);  // hits in cube 1's L2
  });
  const UnitCounters c0 = sys.cube(0).l2()->counters(), c1 = sys.cube(1).l2()->counters();
  EXPECT_EQ(c0.misses, n / 32);
  EXPECT_EQ(c0.hits, 0u);
  EXPECT_EQ(c0.bytes, 2 * n);
  EXPECT_EQ(c1.hits, n / 32);
  EXPECT_EQ(c1.misses, 0u);
  EXPECT_EQ(c1.fill_bytes, 0u);
  EXPECT_EQ(sys.hbm(1).counters().bytes, 0u) << "written, read back from the L2: never reached the HBM";
}

// The same mixed work in functional and timing-only mode: identical times, counters and values.
TEST(L2, TimingOnlyEqualsFunctional) {
  struct Out {
    std::vector<Time> ends;
    std::vector<UnitCounters> counters;
  };
  auto run = [](bool functional) {
    sim::Simulator sim;
    SystemOptions o;
    o.functional = functional;
    o.check_uninitialized = false;
    System sys(sim, l2_topology(), o);
    Out out;
    for (int p = 0; p < 2; ++p) {
      sim.spawn(fmt::format("p{}", p), [&, p] {
        for (int i = 0; i < 6; ++i) {
          const std::uint64_t base = static_cast<std::uint64_t>(p) * 400000 + static_cast<std::uint64_t>(i % 3) * 12288;
          sys.transfer(sys.hbm(0), Region{base + 96, 16, 200, 1000}, sys.tcm(0, p), Region::contiguous(0, 3200));
          sys.transfer(sys.tcm(0, p), Region::contiguous(0, 3200), sys.hbm(0), Region{base + 70000, 8, 400, 4096});
          sys.transfer(sys.hbm(0).at(base), sys.hbm(1 + p).at(base), 20000);
          out.ends.push_back(sim.now());
        }
      });
    }
    sim.run();
    out.counters = sys.counters();
    return out;
  };
  const Out f = run(true), t = run(false);
  EXPECT_EQ(f.ends, t.ends);
  ASSERT_EQ(f.counters.size(), t.counters.size());
  for (std::size_t i = 0; i < f.counters.size(); ++i) {
    EXPECT_EQ(f.counters[i].bytes, t.counters[i].bytes) << i;
    EXPECT_EQ(f.counters[i].busy, t.counters[i].busy) << i;
    EXPECT_EQ(f.counters[i].hits, t.counters[i].hits) << i;
    EXPECT_EQ(f.counters[i].misses, t.counters[i].misses) << i;
    EXPECT_EQ(f.counters[i].fill_bytes, t.counters[i].fill_bytes) << i;
    EXPECT_EQ(f.counters[i].writeback_bytes, t.counters[i].writeback_bytes) << i;
  }
}

// An independent model of the documented L2 semantics, sector by sector: per set a list of lines,
// most recent first; a read counts each touched sector as a hit or a miss (and fills the misses);
// a write makes its sectors valid and dirty; a miss takes an empty way, else evicts the last line,
// writing back its dirty sectors. The set of a line comes from set_of() (SetIndexMatchesItsDefinition
// checks it against the definition).
struct RefL2 {
  struct Line {
    std::uint64_t line;
    std::uint32_t valid, dirty;
  };
  const L2Cache* l2;
  std::uint64_t line_bytes, sector_bytes;
  std::uint32_t ways;
  std::vector<std::vector<Line>> sets;
  std::uint64_t hits = 0, misses = 0, fill_bytes = 0, writeback_bytes = 0;

  explicit RefL2(const L2Cache& c)
      : l2(&c), line_bytes(c.spec().line_bytes), sector_bytes(c.spec().sector_bytes), ways(c.ways()), sets(c.sets()) {}
  std::vector<Line>& set_of(std::uint64_t line) { return sets[l2->set_of(line * line_bytes)]; }
  std::uint32_t sectors(std::uint64_t a, std::uint64_t end, std::uint64_t line) const {
    std::uint32_t m = 0;
    for (std::uint64_t s = 0; s < line_bytes / sector_bytes; ++s) {
      const std::uint64_t lo = line * line_bytes + s * sector_bytes;
      if (lo < end && lo + sector_bytes > a) m |= 1u << s;
    }
    return m;
  }
  static std::uint64_t count(std::uint32_t m) { return static_cast<std::uint64_t>(std::popcount(m)); }
  void access(std::uint64_t line, std::uint32_t mask, bool write) {
    std::vector<Line>& set = set_of(line);
    auto it = std::find_if(set.begin(), set.end(), [&](const Line& l) { return l.line == line; });
    Line l{line, 0, 0};
    if (it != set.end()) {
      l = *it;
      set.erase(it);
    } else if (set.size() == ways) {
      writeback_bytes += count(set.back().dirty) * sector_bytes;
      set.pop_back();
    }
    if (write) {
      l.valid |= mask;
      l.dirty |= mask;
    } else {
      hits += count(mask & l.valid);
      misses += count(mask & ~l.valid);
      fill_bytes += count(mask & ~l.valid) * sector_bytes;
      l.valid |= mask;
    }
    set.insert(set.begin(), l);
  }
  // One row segment [a, a + n).
  void segment(std::uint64_t a, std::uint64_t n, bool write) {
    for (std::uint64_t line = a / line_bytes; line * line_bytes < a + n; ++line) access(line, sectors(a, a + n, line), write);
  }
  // A transfer of region r cut into chunks of `chunk` bytes, each looked up row segment by row segment.
  void transfer(const Region& r, std::uint64_t chunk, bool write) {
    for (std::uint64_t off = 0; off < r.bytes(); off += chunk) {
      std::uint64_t left = std::min(chunk, r.bytes() - off);
      if (r.rows == 1 || r.pitch == r.row_bytes) {
        segment(r.addr + off, left, write);
        continue;
      }
      std::uint64_t row = off / r.row_bytes, in = off % r.row_bytes;
      while (left > 0) {
        const std::uint64_t n = std::min(r.row_bytes - in, left);
        segment(r.row_addr(row) + in, n, write);
        left -= n;
        in = 0;
        ++row;
      }
    }
  }
  bool holds(std::uint64_t a, std::uint64_t n) {
    for (std::uint64_t line = a / line_bytes; line * line_bytes < a + n; ++line) {
      const std::uint32_t m = sectors(a, a + n, line);
      const std::vector<Line>& set = set_of(line);
      auto it = std::find_if(set.begin(), set.end(), [&](const Line& l) { return l.line == line; });
      if (it == set.end() || (it->valid & m) != m) return false;
    }
    return true;
  }
};

// The cache (its 16- and 32-bit tag entries, way counts that do and do not fill its 16-byte compare
// steps) agrees with RefL2 on random streams of strided reads and writes, counter by counter, and on
// which bytes it holds.
TEST(L2, AgreesWithAPerSectorReferenceOnRandomStreams) {
  struct Case {
    std::uint32_t ways, tag_bits;
  };
  for (const Case k : {Case{4, 16}, Case{6, 16}, Case{16, 16}, Case{4, 32}, Case{3, 32}, Case{16, 32}}) {
    SCOPED_TRACE(fmt::format("{} ways, {}-bit tags", k.ways, k.tag_bits));
    json d = l2_doc();
    d["cube"]["l2"].erase("capacity_KiB");
    d["cube"]["l2"]["capacity_bytes"] = 128 * 128 * k.ways;  // 128 sets
    d["cube"]["l2"]["ways"] = k.ways;
    // 32-bit tags once the HBM holds 65535 or more lines per set.
    if (k.tag_bits == 32) d["cube"]["hbm"]["capacity_MiB"] = 2048;
    sim::Simulator sim;
    System sys(sim, topology_from_json(d, "small+l2"), timing_only());
    L2Cache& l2 = *sys.cube(0).l2();
    ASSERT_EQ(l2.tag_bits(), k.tag_bits);
    RefL2 ref(l2);
    const std::uint64_t chunk = sys.topology().cubes[0].pe.dma.chunk_bytes;
    // Addresses in two windows of 512 KiB (8 times the L2), the second near the top of the HBM.
    const std::uint64_t windows[2] = {0, sys.hbm(0).capacity() - (1u << 20)};
    std::mt19937_64 rng(1234 + k.ways + k.tag_bits);
    auto uniform = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
    run_process(sim, [&] {
      for (int i = 0; i < 400; ++i) {
        const std::uint64_t rows = uniform(1, 8), row_bytes = uniform(1, 3000);
        // Pitches of any size, of whole lines (rows step through the sets), some past `sets` lines.
        std::uint64_t pitch = row_bytes + uniform(0, 1) * uniform(0, 5000);
        if (uniform(0, 1)) pitch = (row_bytes + 127) / 128 * 128 + 128 * uniform(0, 1) * uniform(0, 300);
        if (rows == 1) pitch = row_bytes;
        const Region r{windows[uniform(0, 1)] + uniform(0, 512u << 10), rows, row_bytes, pitch};
        const bool write = uniform(0, 2) == 0;
        const Region t = Region::contiguous(0, r.bytes());
        if (write) {
          sys.transfer(sys.tcm(0, 0), t, sys.hbm(0), r);
        } else {
          sys.transfer(sys.hbm(0), r, sys.tcm(0, 0), t);
        }
        ref.transfer(r, chunk, write);
        const UnitCounters c = l2.counters();
        ASSERT_EQ(c.hits, ref.hits) << "transfer " << i;
        ASSERT_EQ(c.misses, ref.misses) << "transfer " << i;
        ASSERT_EQ(c.fill_bytes, ref.fill_bytes) << "transfer " << i;
        ASSERT_EQ(c.writeback_bytes, ref.writeback_bytes) << "transfer " << i;
        for (int j = 0; j < 8; ++j) {
          const std::uint64_t a = windows[uniform(0, 1)] + uniform(0, 512u << 10), n = uniform(1, 600);
          ASSERT_EQ(l2.holds(a, n), ref.holds(a, n)) << "transfer " << i << ", bytes " << a << " + " << n;
        }
      }
    });
    // The stream exercised every path: hits, misses, and evictions of dirty lines.
    EXPECT_GT(ref.hits, 1000u);
    EXPECT_GT(ref.misses, 1000u);
    EXPECT_GT(ref.writeback_bytes, 1000u);
  }
}

// Counters over an interval subtract, and the utilisation table reports the L2's hit rate.
TEST(L2, CountersSinceAndUtilisation) {
  sim::Simulator sim;
  System sys(sim, l2_topology(), timing_only());
  std::vector<UnitCounters> before;
  run_process(sim, [&] {
    sys.transfer(sys.hbm(0).at(0), sys.tcm(0, 0).at(0), 8192);  // 256 misses
    before = sys.counters();
    sys.transfer(sys.hbm(0).at(0), sys.tcm(0, 0).at(0), 8192);     // 256 hits
    sys.transfer(sys.hbm(0).at(8192), sys.tcm(0, 0).at(0), 4096);  // 128 misses
  });
  const auto usage = usage_since(*sys.units(), sys.counters(), before);
  const UnitUsage& u = usage[sys.cube(0).l2()->id().value];
  EXPECT_EQ(u.name, "cube0.l2");
  EXPECT_EQ(u.hits, 256u);
  EXPECT_EQ(u.misses, 128u);
  EXPECT_EQ(u.fill_bytes, 4096u);
  EXPECT_EQ(u.bytes, 12288u);
  const Utilisation ut = utilisation(usage, sim.now(), 2);
  EXPECT_TRUE(ut.cubes[0].has_l2);
  EXPECT_EQ(ut.cubes[0].l2_hits, 256u);
  EXPECT_DOUBLE_EQ(ut.cubes[0].l2_hit_rate, 256.0 / 384.0);
  EXPECT_GT(ut.cubes[0].l2_busy, 0.0);
  EXPECT_TRUE(ut.cubes[1].has_l2);
  EXPECT_EQ(ut.cubes[1].l2_hit_rate, 0.0);
  const Utilisation plain = utilisation(usage_of(*sys.units(), sys.counters()), 0, 1);
  EXPECT_TRUE(plain.cubes[0].has_l2);
}

TEST(L2, TraceHasAnL2TrackWithSpansPerChunk) {
  sim::Simulator sim;
  sim.trace().set_enabled(true);
  System sys(sim, l2_topology(), timing_only());
  sys.declare_tracks(1);
  run_process(sim, [&] { sys.transfer(sys.hbm(0).at(0), sys.tcm(0, 0).at(0), 8192); });
  bool found = false;
  for (const auto& t : sim.trace().stats()) {
    if (t.group == "cube0" && t.name == "l2") {
      found = true;
      EXPECT_EQ(t.spans, 2u);  // two DMA chunks
    }
  }
  EXPECT_TRUE(found);
}

// ---------------------------------------------------------------- topology

void expect_topology_error(const json& doc, const std::vector<std::string>& parts) {
  try {
    topology_from_json(doc, "t");
    ADD_FAILURE() << "no TopologyError; expected one containing '" << parts.front() << "'";
  } catch (const TopologyError& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
    }
  }
}

TEST(L2, EveryBadL2FieldIsAClearError) {
  auto with = [](const char* key, json v) {
    json d = l2_doc();
    d["cube"]["l2"][key] = std::move(v);
    return d;
  };
  expect_topology_error(with("line_bytes", 96), {"cube.l2.line_bytes", "96 is not a power of two", "1 to 65536"});
  expect_topology_error(with("sector_bytes", 24), {"cube.l2.sector_bytes", "24 is not a power of two"});
  expect_topology_error(with("sector_bytes", 256), {"cube.l2.line_bytes", "128 is not a multiple of sector_bytes 256"});
  expect_topology_error(with("sector_bytes", 8), {"cube.l2.sector_bytes", "16 sectors per 128-byte line", "at most 8",
                                                  "at least 16"});
  expect_topology_error(with("ways", 0), {"cube.l2.ways", "0 is not valid", "1 to 256"});
  expect_topology_error(with("ways", 3), {"cube.l2", "not divisible into sets of 3 ways x 128-byte lines",
                                          "multiple of 384 bytes"});
  expect_topology_error(with("bandwidth_GBps", 0), {"cube.l2.bandwidth_GBps", "bandwidth > 0"});
  expect_topology_error(with("latency_ns", -1), {"cube.l2.latency_ns", "time >= 0"});
  expect_topology_error(with("colour", 1), {"cube.l2: unknown key 'colour'", "line_bytes"});
  {
    json d = l2_doc();
    d["cube"]["l2"].erase("ways");
    expect_topology_error(d, {"cube.l2", "missing required field 'ways'"});
  }
  {
    json d = l2_doc();
    d["cube"]["l2"].erase("capacity_KiB");
    expect_topology_error(d, {"cube.l2", "the L2 capacity", "capacity_MiB"});
  }
  {
    json d = l2_doc();
    d["cube"]["l2"].erase("capacity_KiB");
    d["cube"]["l2"]["capacity_MiB"] = 128;  // the HBM has 64 MiB
    expect_topology_error(d, {"cube.l2", "larger than the cube's HBM", "no larger than the memory behind it"});
  }
  {
    json d = l2_doc();
    d["cube"]["hbm"].erase("capacity_MiB");
    d["cube"]["hbm"]["capacity_GiB"] = 64;
    d["cube"]["l2"].erase("capacity_KiB");
    d["cube"]["l2"]["capacity_GiB"] = 4;
    d["cube"]["l2"]["line_bytes"] = 128;
    expect_topology_error(d, {"cube.l2", "33554432 lines", "at most 16777216 lines"});
  }
  expect_topology_error(with("line_bytes", json("x")), {"cube.l2.line_bytes", "\"x\" is not valid"});
  {
    json d = l2_doc();
    d["cube"]["hbm"].erase("capacity_MiB");
    d["cube"]["hbm"]["capacity_TiB"] = 1024;  // 2^43 lines of 128 bytes
    d["cube"]["l2"].erase("capacity_KiB");
    d["cube"]["l2"]["capacity_bytes"] = 512;  // one set of 4 ways
    expect_topology_error(d, {"cube.l2", "8796093022208 lines of 128 bytes for 1 L2 sets", "32-bit tags"});
  }
  {
    json d = testing::small_doc();
    d["cube"]["l2"] = 5;
    expect_topology_error(d, {"cube.l2", "expected an object"});
  }
}

TEST(L2, OverridesReachTheL2PerCubeToo) {
  const Topology t = load_topology("h200x4", {{"cube.l2.capacity_MiB", 40}, {"cubes.1.l2.ways", 8}});
  EXPECT_EQ(t.cubes[0].l2.capacity_bytes, 40u << 20);
  EXPECT_EQ(t.cubes[0].l2.ways, 16u);
  EXPECT_EQ(t.cubes[1].l2.ways, 8u);
  EXPECT_EQ(t.cubes[1].l2.capacity_bytes, 40u << 20);
  // A per-cube null removes the cube's L2 (JSON merge patch).
  json doc = load_topology_json("h200x4");
  apply_override(doc, "cubes.2.pes", 132);
  doc["cubes"][2]["l2"] = nullptr;
  const Topology u = topology_from_json(doc, "h200x4, cube 2 without L2");
  EXPECT_TRUE(u.cubes[1].l2.present);
  EXPECT_FALSE(u.cubes[2].l2.present);
  // The shipped GPU topologies have the H100/H200 L2: 50 MiB, 128-byte lines, 32-byte sectors.
  for (const char* name : {"h200x4", "dgx_h100x8"}) {
    const Topology g = load_topology(name);
    EXPECT_EQ(g.cubes[0].l2.capacity_bytes, 50u << 20) << name;
    EXPECT_EQ(g.cubes[0].l2.line_bytes, 128u) << name;
    EXPECT_EQ(g.cubes[0].l2.sector_bytes, 32u) << name;
  }
  for (const char* name : {"single_cube", "ring4", "mesh4x4", "torus8x8"}) {
    EXPECT_FALSE(load_topology(name).cubes[0].l2.present) << name;
  }
  try {
    load_topology("h200x4", {{"cube.l2.line_bytes", 100}});
    ADD_FAILURE() << "no error";
  } catch (const TopologyError& e) {
    EXPECT_NE(std::string(e.what()).find("cube.l2.line_bytes"), std::string::npos) << e.what();
  }
}

// Not a timing assertion: prints how many line lookups per second of CPU time the L2 sustains on
// a GEMM-like stream (64 KiB chunks between two cubes' HBMs, reread), against the same run without
// the L2, for the report.
TEST(L2, LookupRatePrintout) {
  auto run = [](const Topology& t, std::uint64_t* lookups, UnitCounters* c0) {
    sim::Simulator sim;
    System sys(sim, t, timing_only());
    const std::uint64_t n = 256ull << 20;  // 256 MiB: 5x the L2
    const std::clock_t t0 = std::clock();
    run_process(sim, [&] {
      for (int i = 0; i < 2; ++i) sys.transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), n);
      for (int i = 0; i < 2; ++i) sys.transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), 16u << 20);
    });
    const double s = static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC;  // CPU time: the machine may be shared
    if (L2Cache* l2 = sys.cube(0).l2()) {
      *lookups = l2->lines_looked_up() + sys.cube(1).l2()->lines_looked_up();
      *c0 = l2->counters();
    }
    return s;
  };
  std::uint64_t lookups = 0;
  UnitCounters c;
  const double with = run(load_topology("h200x4"), &lookups, &c);
  json doc = load_topology_json("h200x4");
  doc["cube"].erase("l2");
  const double without = run(topology_from_json(doc, "h200x4 without L2"), nullptr, nullptr);
  EXPECT_EQ(lookups, 2 * (2 * (256ull << 20) + 2 * (16u << 20)) / 128);
  EXPECT_GT(c.hits, 0u);  // the 16 MiB rereads hit
  fmt::print("L2 lookups: {} line lookups; {:.3f} s CPU with the L2, {:.3f} s without: {:.1f} M lookups/s of the "
             "extra time ({:.1f} M/s overall)\n",
             lookups, with, without, static_cast<double>(lookups) / std::max(with - without, 1e-9) / 1e6,
             static_cast<double>(lookups) / with / 1e6);
}

}  // namespace
}  // namespace cubesim::hw
