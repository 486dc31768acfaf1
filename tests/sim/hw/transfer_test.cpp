// Transfers: exact latency, bandwidth, sharing, contention, landing time, determinism.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sim/core/wait.h"
#include "sim/hw/errors.h"
#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using sim::Duration;
using sim::Time;
using testing::run_process;
using testing::small_topology;
using testing::random_bytes;

// The time one transfer takes on an otherwise idle system.
Duration time_one(System& sys, MemRef src, MemRef dst, std::uint64_t bytes) {
  Duration d = 0;
  sys.simulator().spawn("one", [&] {
    const Time t0 = sys.simulator().now();
    sys.transfer(src, dst, bytes);
    d = sys.simulator().now() - t0;
  });
  sys.simulator().run();
  return d;
}

TEST(Transfer, SmallMessageTakesExactlyTheSumOfPerHopDelays) {
  const Topology t = load_topology("mesh4x4");
  // Destinations 1..6 hops from cube 0 along x then y.
  const std::vector<std::pair<int, int>> dst_hops = {{1, 1}, {2, 2}, {3, 3}, {7, 4}, {11, 5}, {15, 6}};
  Duration previous = 0;
  for (auto [dst, hops] : dst_hops) {
    sim::Simulator sim;
    SystemOptions o;
    o.functional = false;
    System sys(sim, t, o);
    ASSERT_EQ(sys.hops(0, dst), hops);
    const Duration got = time_one(sys, sys.hbm(0).at(0), sys.hbm(dst).at(0), 64);
    // HBM read latency, then per hop: port overhead 8 ns + wire 20 ns; 64 B at 128 GB/s = 500 ps once
    // (cut-through: the serialization is not repeated per hop).
    const Duration expect = sim::ns(120) + hops * (sim::ns(8) + sim::ns(20)) + sim::ps(500);
    EXPECT_EQ(got, expect) << hops << " hops";
    EXPECT_EQ(got, sys.path_figures(sys.hbm(0), sys.hbm(dst)).time(64));
    EXPECT_GT(got, previous) << "latency grows with hops";
    previous = got;
  }
}

TEST(Transfer, LargeMessagesReachLinkBandwidth) {
  for (const char* name : {"ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8", "h200x8", "h100x8"}) {
    SCOPED_TRACE(name);
    sim::Simulator sim;
    SystemOptions o;
    o.functional = false;
    System sys(sim, load_topology(name), o);
    const std::uint64_t bytes = 256ull << 20;
    const Duration got = time_one(sys, sys.hbm(0).at(0), sys.hbm(1).at(0), bytes);
    const PathFigures f = sys.path_figures(sys.hbm(0), sys.hbm(1));
    EXPECT_EQ(got, f.time(bytes));
    const double achieved = static_cast<double>(bytes) / sim::to_s(got);
    EXPECT_GT(achieved, 0.99 * static_cast<double>(f.bandwidth.bytes_per_s));
    EXPECT_LE(achieved, static_cast<double>(f.bandwidth.bytes_per_s));
    EXPECT_EQ(f.bandwidth, sys.link(f.links[0]).bandwidth());
  }
}

// A wire scale (a protocol's flags, transfer.h) makes the links carry wire/data bytes per byte of
// payload: a large message takes that many times the link time; {1, 1} is a plain transfer.
TEST(Transfer, AWireScaleStretchesTheLinksOnly) {
  for (const char* name : {"ring4", "h200x4"}) {
    SCOPED_TRACE(name);
    const std::uint64_t bytes = 64ull << 20;
    Duration t[3] = {};
    const WireScale scales[3] = {{1, 1}, {2, 1}, {128, 120}};
    for (int i = 0; i < 3; ++i) {
      sim::Simulator sim;
      SystemOptions o;
      o.functional = false;
      System sys(sim, load_topology(name), o);
      sim.spawn("one", [&] {
        const Time t0 = sim.now();
        sys.start_transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), bytes, scales[i]).wait();
        t[i] = sim.now() - t0;
      });
      sim.run();
      if (i == 0) {
        EXPECT_EQ(t[0], sys.path_figures(sys.hbm(0), sys.hbm(1)).time(bytes));
      }
    }
    const double link_s = static_cast<double>(bytes) / static_cast<double>(load_topology(name).links[0].figures.bandwidth.bytes_per_s);
    EXPECT_NEAR(sim::to_s(t[1] - t[0]), link_s, 0.01 * link_s);            // 2x: one more payload time
    EXPECT_NEAR(sim::to_s(t[2] - t[0]), link_s * 8 / 120, 0.01 * link_s);  // 128/120: 8/120 more
  }
  sim::Simulator sim;
  System sys(sim, load_topology("ring4"));
  EXPECT_THROW(sys.start_transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), 64, WireScale{1, 2}), TransferError);
}

TEST(Transfer, TwoFlowsOnOneLinkEachGetHalfTheBandwidth) {
  // ring4: 0 -> 2 goes 0 -> 1 -> 2 (a tie, taken the positive way); 1 -> 2 shares link c1->c2.
  const std::uint64_t bytes = 16ull << 20;
  Duration alone = 0;
  {
    sim::Simulator sim;
    System sys(sim, small_topology(), SystemOptions{false, true, HazardMode::kThrow});
    alone = time_one(sys, sys.hbm(1).at(0), sys.hbm(2).at(0), bytes);
  }
  for (int second_src : {0, 1}) {  // a flow from the next cube over, and one from the same cube
    SCOPED_TRACE(second_src);
    sim::Simulator sim;
    System sys(sim, small_topology(), SystemOptions{false, true, HazardMode::kThrow});
    ASSERT_EQ(sys.route(0, 2), (std::vector<int>{sys.route(0, 1)[0], sys.route(1, 2)[0]}));
    Duration t_a = 0, t_b = 0;
    sim.spawn("a", [&] {
      sys.transfer(sys.hbm(second_src == 0 ? 0 : 1).at(0), sys.hbm(2).at(0), bytes);
      t_a = sim.now();
    });
    sim.spawn("b", [&] {
      sys.transfer(sys.hbm(1).at(32 << 20), sys.hbm(2).at(32 << 20), bytes);
      t_b = sim.now();
    });
    sim.run();
    // Each flow's throughput is half the link's: both finish at about twice the time alone.
    EXPECT_NEAR(static_cast<double>(t_a) / static_cast<double>(alone), 2.0, 0.02);
    EXPECT_NEAR(static_cast<double>(t_b) / static_cast<double>(alone), 2.0, 0.02);
    const Link& shared = sys.link(sys.route(1, 2)[0]);
    EXPECT_EQ(shared.server().bytes, 2 * bytes);
  }
}

TEST(Transfer, PesOfOneCubeContendForHbm) {
  // mesh4x4: HBM 2048 GB/s shared by 8 PEs whose DMA read channels run at 512 GB/s each.
  const std::uint64_t bytes = 2ull << 20;
  PathFigures f;
  auto run = [&](int pes) {
    sim::Simulator sim;
    SystemOptions o;
    o.functional = false;
    System sys(sim, load_topology("mesh4x4"), o);
    f = sys.path_figures(sys.hbm(0), sys.tcm(0, 0));
    Time last = 0;
    for (int p = 0; p < pes; ++p) {
      sim.spawn(fmt::format("pe{}", p), [&, p] {
        sys.transfer(sys.hbm(0).at(static_cast<std::uint64_t>(p) * bytes), sys.tcm(0, p).at(0), bytes);
        last = std::max(last, sim.now());
      });
    }
    sim.run();
    return last;
  };
  const Time one = run(1), four = run(4), eight = run(8);
  EXPECT_EQ(one, f.time(bytes));
  EXPECT_EQ(f.bandwidth, sim::Bandwidth::GBps(512));
  // 4 x 512 GB/s = 2048 GB/s: the HBM just keeps up.
  EXPECT_NEAR(static_cast<double>(four) / static_cast<double>(one), 1.0, 0.01);
  // 8 x 512 GB/s is twice what the HBM gives: all 16 MiB come out at 2048 GB/s.
  const double hbm_bound = static_cast<double>(f.alpha) + 8.0 * bytes / 2048e9 * 1e12;
  EXPECT_NEAR(static_cast<double>(eight) / hbm_bound, 1.0, 0.01);
}

TEST(Transfer, DmaReadAndWriteChannelsRunInParallelButRequestsOnOneSerialize) {
  sim::Simulator sim;
  SystemOptions o;
  o.functional = false;
  System sys(sim, small_topology(), o);
  Memory& hbm = sys.hbm(0);
  Memory& tcm = sys.tcm(0, 0);
  const std::uint64_t bytes = 64 << 10;
  const Duration in = sys.path_figures(hbm, tcm).time(bytes);
  const Duration out = sys.path_figures(tcm, hbm).time(bytes);
  std::vector<Time> done(4);
  tcm.fill(128 << 10, bytes, std::byte{1});
  hbm.fill(0, 4 << 20, std::byte{2});
  // One read and one write at once: parallel channels, each as fast as alone.
  sim.spawn("reader", [&] { done[0] = sys.start_transfer(hbm.at(0), tcm.at(0), bytes).wait(); });
  sim.spawn("writer", [&] { done[1] = sys.start_transfer(tcm.at(128 << 10), hbm.at(1 << 20), bytes).wait(); });
  sim.run();
  run_process(sim, [&] {
    // Two reads at once: the second starts when the first has gone through.
    const Time t0 = sim.now();
    TransferHandle a = sys.start_transfer(hbm.at(2 << 20), tcm.at(0), bytes);
    TransferHandle b = sys.start_transfer(hbm.at(3 << 20), tcm.at(64 << 10), bytes);
    done[2] = a.wait() - t0;
    done[3] = b.wait() - t0;
  });
  // The two channels share the TCM (500 GB/s, exactly twice a channel's 250): each runs at full
  // speed, give or take one chunk's turn at the TCM (serialized, the second would take `in` longer).
  const PathFigures f = sys.path_figures(hbm, tcm);
  EXPECT_GE(done[0], in);
  EXPECT_LE(done[0], in + f.chunk_time);
  EXPECT_GE(done[1], out);
  EXPECT_LE(done[1], out + f.chunk_time);
  EXPECT_EQ(done[2], in);
  EXPECT_EQ(done[3], in + (bytes / f.chunk_bytes) * f.chunk_time + sys.pe(0, 0).spec().dma.overhead);
}

// A request shorter than a chunk holds the DMA channel for its own bytes, not a whole chunk's time:
// the next request on the channel starts its overhead right after.
TEST(Transfer, AShortRequestHoldsTheDmaChannelForItsOwnBytes) {
  sim::Simulator sim;
  SystemOptions o;
  o.functional = false;
  System sys(sim, small_topology(), o);  // 4 KiB DMA chunks at 250 GB/s, 10 ns overhead per request
  Memory& hbm = sys.hbm(0);
  Memory& tcm = sys.tcm(0, 0);
  const std::uint64_t bytes = 1000;
  const PathFigures f = sys.path_figures(hbm, tcm);
  Duration slowest = 0;
  for (const StageFigures& s : f.stages) slowest = std::max(slowest, s.time(bytes));
  ASSERT_LT(slowest, f.chunk_time);  // 1000 bytes pass faster than a 4 KiB chunk
  Time a = 0, b = 0;
  testing::run_process(sim, [&] {
    TransferHandle ha = sys.start_transfer(hbm.at(0), tcm.at(0), bytes);
    TransferHandle hb = sys.start_transfer(hbm.at(1 << 20), tcm.at(4096), bytes);
    a = ha.wait();
    b = hb.wait();
  });
  EXPECT_EQ(b - a, sys.pe(0, 0).spec().dma.overhead + slowest);
}

TEST(Transfer, BytesLandWhenTheTransferCompletesNotBefore) {
  sim::Simulator sim;
  SystemOptions o;
  o.hazards = HazardMode::kOff;  // this test peeks on purpose
  System sys(sim, small_topology(), o);
  const auto data = random_bytes(1 << 20, 7);
  const std::vector<std::byte> old(1 << 20, std::byte{0xaa});
  sys.hbm(0).write(0, data);
  sys.hbm(3).write(4096, old);
  Time landed = 0;
  sim.spawn("mover", [&] { landed = sys.start_transfer(sys.hbm(0).at(0), sys.hbm(3).at(4096), 1 << 20).wait(); });
  const Duration expect = sys.path_figures(sys.hbm(0), sys.hbm(3)).time(1 << 20);
  sim.spawn("peeker", [&] {
    sim::this_process::sleep(expect - 1);
    EXPECT_EQ(sys.hbm(3).read_as<std::byte>(4096, 1 << 20), old) << "bytes visible before the transfer completed";
    sim::this_process::sleep(1);
    sim::this_process::yield();
    EXPECT_EQ(sys.hbm(3).read_as<std::byte>(4096, 1 << 20), data);
  });
  sim.run();
  EXPECT_EQ(landed, expect);
}

TEST(Transfer, TileGatherAndScatterWithStridedRegions) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  Memory& hbm = sys.hbm(0);
  Memory& tcm = sys.tcm(0, 1);
  // A 64 x 512 float matrix in HBM; move the 16 x 32 tile at (8, 64) into a packed TCM buffer and back
  // to another matrix.
  const std::uint64_t cols = 512, rows = 64, elt = 4;
  std::vector<float> a(rows * cols);
  std::mt19937 rng(11);
  for (float& x : a) x = static_cast<float>(rng() % 1000) / 7.0f;
  hbm.write_as<float>(0, a);
  const Region tile{(8 * cols + 64) * elt, 16, 32 * elt, cols * elt};
  run_process(sim, [&] {
    sys.transfer(hbm, tile, tcm, Region::contiguous(0, 16 * 32 * elt));
    sys.transfer(tcm, Region::contiguous(0, 16 * 32 * elt), hbm, Region{(1 << 20) + tile.addr, 16, 32 * elt, cols * elt});
  });
  const auto packed = tcm.read_as<float>(0, 16 * 32);
  for (std::uint64_t r = 0; r < 16; ++r) {
    for (std::uint64_t c = 0; c < 32; ++c) {
      ASSERT_EQ(packed[r * 32 + c], a[(8 + r) * cols + 64 + c]);
      ASSERT_EQ(hbm.read_as<float>((1 << 20) + ((8 + r) * cols + 64 + c) * elt, 1)[0], a[(8 + r) * cols + 64 + c]);
    }
  }
}

TEST(Transfer, HostLinkAndSwitchPaths) {
  {
    sim::Simulator sim;
    System sys(sim, load_topology("mesh4x4"));
    const PathFigures f = sys.path_figures(sys.host_memory(), sys.hbm(5));
    EXPECT_EQ(f.hops, 1);
    EXPECT_EQ(f.stage_names(), (std::vector<std::string>{"host (read)", "link host->c5", "cube5.hbm (write)"}));
    EXPECT_EQ(f.bandwidth, sim::Bandwidth::GBps(64));
    const auto data = random_bytes(100'000, 5);
    sys.host_memory().write(0, data);
    run_process(sim, [&] { sys.transfer(sys.host_memory().at(0), sys.hbm(5).at(0), data.size()); });
    EXPECT_EQ(sys.hbm(5).read_as<std::byte>(0, data.size()), data);
  }
  {
    // Seven GPUs send to GPU 0 through the switch: they share its one down port.
    sim::Simulator sim;
    SystemOptions o;
    o.functional = false;
    System sys(sim, load_topology("dgx_h100x8"), o);
    const PathFigures f = sys.path_figures(sys.hbm(3), sys.hbm(0));
    // The GPUs' HBM is reached through their L2 (dgx_h100x8 has one).
    EXPECT_EQ(f.stage_names(), (std::vector<std::string>{"cube3.l2 (read)", "link c3->sw", "link sw->c0", "cube0.l2 (write)"}));
    // Switch latency is charged on the way out of the switch; a cold read pays the L2's hit latency
    // (130 ns) and the HBM's (500 ns).
    EXPECT_EQ(f.alpha, sim::ns(130) + sim::ns(500) + 2 * (sim::ns(100) + sim::ns(500)) + sim::ns(300));
    const std::uint64_t bytes = 64ull << 20;
    const Duration alone = f.time(bytes);
    Time last = 0;
    for (int g = 1; g < 8; ++g) {
      sim.spawn(fmt::format("gpu{}", g), [&, g] {
        sys.transfer(sys.hbm(g).at(0), sys.hbm(0).at(static_cast<std::uint64_t>(g) * bytes), bytes);
        last = std::max(last, sim.now());
      });
    }
    sim.run();
    // The shared down port moves 7 x 64 MiB at 450 GB/s.
    const double bound = static_cast<double>(f.alpha) + 7.0 * bytes / 450e9 * 1e12;
    EXPECT_NEAR(static_cast<double>(last) / bound, 1.0, 0.01);
    EXPECT_GT(last, 6 * alone);
  }
}

TEST(Transfer, TimingOnlyRunsTakeIdenticalTimeAndEventOrder) {
  auto scenario = [](bool functional) {
    sim::Simulator sim;
    SystemOptions o;
    o.functional = functional;
    System sys(sim, load_topology("ring4"), o);
    for (int c = 0; c < 4; ++c) sys.hbm(c).fill(0, 8 << 20, std::byte{static_cast<unsigned char>(c)});
    std::vector<Time> ends(4);
    for (int c = 0; c < 4; ++c) {
      sim.spawn(fmt::format("rank{}", c), [&, c] {
        for (int step = 0; step < 3; ++step) {
          TransferHandle h[2] = {sys.start_transfer(sys.hbm(c).at(0), sys.hbm((c + 1) % 4).at(16 << 20), 4 << 20),
                                 sys.start_transfer(sys.hbm(c).at(4 << 20), sys.tcm(c, step % 4).at(0), 256 << 10)};
          wait_all(h);
        }
        ends[static_cast<std::size_t>(c)] = sim.now();
      });
    }
    sim.run();
    return std::make_pair(ends, sim.event_order_hash());
  };
  const auto functional = scenario(true);
  EXPECT_EQ(functional, scenario(false));
  EXPECT_EQ(functional, scenario(true)) << "same input, same events";
}

TEST(Transfer, BadTransfersAreClearErrors) {
  sim::Simulator sim;
  System sys(sim, small_topology());
  Memory& hbm = sys.hbm(0);
  hbm.fill(0, 1 << 20, std::byte{1});
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { sys.start_transfer(hbm.at(0), hbm.at(100), 1000); }).find("overlap"), std::string::npos);
  EXPECT_NE(message([&] { sys.start_transfer(hbm.at(64 << 20), sys.hbm(1).at(0), 16); }).find("transfer source"),
            std::string::npos);
  EXPECT_NE(message([&] {
              sys.start_transfer(hbm, Region::contiguous(0, 100), sys.hbm(1), Region::contiguous(0, 90));
            }).find("the same number"),
            std::string::npos);
  const std::string uninit = message([&] { sys.start_transfer(hbm.at(2 << 20), sys.hbm(1).at(0), 64); });
  EXPECT_NE(uninit.find("byte 0x200000 was never written"), std::string::npos) << uninit;
  EXPECT_TRUE(sys.start_transfer(hbm.at(0), sys.hbm(1).at(0), 0).done());  // nothing to move
  EXPECT_EQ(sys.transfers_in_flight(), 0u);
}

TEST(Transfer, TraceTracksAreGroupedByCubeAndLink) {
  sim::SimulatorOptions so;
  so.trace = true;
  sim::Simulator sim(so);
  sim.trace().set_enabled(true);
  System sys(sim, small_topology());
  sys.hbm(0).fill(0, 1 << 20, std::byte{3});
  run_process(sim, [&] {
    sys.transfer(sys.hbm(0).at(0), sys.hbm(1).at(0), 256 << 10);
    sys.transfer(sys.hbm(1).at(0), sys.tcm(1, 1).at(0), 64 << 10);
    sys.pe(1, 1).compute(1 << 20, DType::bf16);
  });
  std::vector<std::string> tracks;
  for (const auto& s : sim.trace().stats()) tracks.push_back(s.group + "/" + s.name);
  for (const char* want : {"links/link c0->c1", "cube0/hbm", "cube1/hbm", "cube1/pe1.dma.read", "cube1/pe1.tcm",
                           "cube1/pe1.mac"}) {
    EXPECT_NE(std::find(tracks.begin(), tracks.end(), want), tracks.end()) << want;
  }
  EXPECT_GT(sim.trace().size(), 0u);
}

}  // namespace
}  // namespace cubesim::hw
