// The GPU-like GEMM pipeline ("pe.gemm", kernels/sim_pe_gemm.h): bits equal to det_gemm for every
// option (stages, raster, swizzle, clusters incl. partial ones at the edges, odd shapes, bias,
// column-major operands); times against hand-computed expectations on a tiny cube (MAC-bound and
// issue-bound k-blocks, prologue/epilogue, wave quantization); multicast's saving in HBM reads; and
// the topology errors of the section.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>

#include "kernels/det_gemm.h"
#include "kernels/sim_pe_gemm.h"
#include "sim/hw/errors.h"

namespace cubesim::kernels::testing {
namespace {

using json = nlohmann::json;

// single_cube with `pes` PEs and a pe.gemm section.
json topo_doc(int pes, json gemm) {
  json doc = hw::load_topology_json("single_cube");
  doc["cube"]["pes"] = pes;
  doc["cube"]["pe"]["gemm"] = std::move(gemm);
  return doc;
}

hw::Topology topo(int pes, json gemm) { return hw::topology_from_json(topo_doc(pes, std::move(gemm)), "test"); }

struct Case {
  std::int64_t M, N, K;
  bool bias, b_colmajor;
};

// C = A·B (+ bias) on the simulated PEs, bf16 in, f32 out; returns C's bits and the report.
std::vector<float> run(const hw::Topology& t, const Case& c, const std::vector<std::uint16_t>& a,
                       const std::vector<std::uint16_t>& b, const std::vector<float>& bias, SimGemmReport* rep) {
  sim::Simulator s;
  hw::SystemOptions so;
  so.check_uninitialized = true;  // a k-block read before its bytes landed (or were delivered) throws
  hw::System sys(s, t, so);
  hw::Memory& hbm = sys.hbm(0);
  HbmMatrix ha{&hbm, hbm.allocate(a.size() * 2, 256), DType::bf16, c.M, c.K, c.K, 1};
  HbmMatrix hb = c.b_colmajor ? HbmMatrix{&hbm, hbm.allocate(b.size() * 2, 256), DType::bf16, c.K, c.N, 1, c.K}
                              : HbmMatrix{&hbm, hbm.allocate(b.size() * 2, 256), DType::bf16, c.K, c.N, c.N, 1};
  HbmMatrix hc{&hbm, hbm.allocate(static_cast<std::uint64_t>(c.M * c.N) * 4, 256), DType::f32, c.M, c.N, c.N, 1};
  HbmVector hv{&hbm, hbm.allocate(bias.size() * 4 + 4, 256), DType::f32, c.N};
  hbm.write(ha.addr, std::as_bytes(std::span(a)));
  hbm.write(hb.addr, std::as_bytes(std::span(b)));
  if (c.bias) hbm.write(hv.addr, std::as_bytes(std::span(bias)));
  s.spawn("gemm", [&] { *rep = sim_pe_gemm(sys, ha, hb, c.bias ? &hv : nullptr, hc); });
  s.run();
  std::vector<float> out(static_cast<std::size_t>(c.M * c.N));
  hbm.read(hc.addr, std::as_writable_bytes(std::span(out)));
  return out;
}

// Random bf16 A, B and f32 bias for a case, and det_gemm's C on the host (the reference).
struct Operands {
  std::vector<std::uint16_t> a, b;
  std::vector<float> bias, want;
  Operands(const Case& c, std::mt19937& rng)
      : a(static_cast<std::size_t>(c.M * c.K)), b(static_cast<std::size_t>(c.K * c.N)), bias(static_cast<std::size_t>(c.N)),
        want(static_cast<std::size_t>(c.M * c.N)) {
    std::normal_distribution<float> nrm;
    for (auto& x : a) x = f32_to_bf16(nrm(rng));
    for (auto& x : b) x = f32_to_bf16(nrm(rng));
    for (auto& x : bias) x = nrm(rng);
    const MatrixView bv = c.b_colmajor ? MatrixView::col_major(b.data(), DType::bf16, c.K, c.N)
                                       : MatrixView::row_major(b.data(), DType::bf16, c.K, c.N);
    const VectorView biasv = VectorView::contiguous(bias.data(), DType::f32, c.N);
    det_gemm(MatrixView::row_major(a.data(), DType::bf16, c.M, c.K), bv, c.bias ? &biasv : nullptr,
             MutableMatrixView::row_major(want.data(), DType::f32, c.M, c.N));
  }
};

TEST(SimPeGemmPipeline, BitsEqualDetGemmForEveryOption) {
  const std::vector<Case> cases = {{200, 300, 150, true, true}, {64, 96, 32, false, false}, {33, 17, 70, true, false},
                                   {1, 130, 48, false, true}};
  const std::vector<json> options = {
      {{"tile", {{"m", 32}, {"n", 48}, {"k", 16}}}},
      {{"tile", {{"m", 32}, {"n", 48}, {"k", 16}}}, {"stages", 4}, {"raster", "m"}, {"swizzle", 2}},
      {{"tile", {{"m", 32}, {"n", 32}, {"k", 32}}}, {"stages", 3}, {"raster", "n"}, {"swizzle", 3}, {"cluster", {2, 1}}},
      {{"tile", {{"m", 16}, {"n", 64}, {"k", 16}}}, {"stages", 2}, {"raster", "m"}, {"swizzle", 1}, {"cluster", {1, 2}}},
      {{"tile", {{"m", 32}, {"n", 32}, {"k", 16}}}, {"stages", 5}, {"raster", "n"}, {"swizzle", 4}, {"cluster", {2, 2}},
       {"mma", {{"issue_cycles_per_k_block", 40}, {"prologue_cycles", 7}, {"epilogue_cycles", 3}}}},
      {{"tile", {{"m", 16}, {"n", 16}, {"k", 8}}}, {"stages", 3}, {"cluster", {3, 1}}},
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    const Operands x(c, rng);
    const std::vector<float>& want = x.want;
    for (const json& o : options) {
      for (int pes : {4, 7, 9}) {
        SimGemmReport r;
        const std::vector<float> got = run(topo(pes, o), c, x.a, x.b, x.bias, &r);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << c.M << "x" << c.N << "x" << c.K << " on " << pes << " PEs, pe.gemm " << o.dump();
        EXPECT_EQ(r.tiles, ((c.M + r.tile_m - 1) / r.tile_m) * ((c.N + r.tile_n - 1) / r.tile_n));
        EXPECT_EQ(r.clusters, pes / (r.cluster_m * r.cluster_n));
      }
    }
  }
}

// A timing-only C[M,N] = A·B in bf16; A's rows `a_pitch` elements apart (0: K); the HBM's bytes into
// *hbm_bytes when given.
SimGemmReport timed(const hw::Topology& t, std::int64_t M, std::int64_t N, std::int64_t K,
                    std::uint64_t* hbm_bytes = nullptr, std::int64_t a_pitch = 0) {
  if (a_pitch == 0) a_pitch = K;
  sim::Simulator s;
  hw::SystemOptions so;
  so.functional = false;
  hw::System sys(s, t, so);
  hw::Memory& hbm = sys.hbm(0);
  HbmMatrix a{&hbm, hbm.allocate(static_cast<std::uint64_t>(M * a_pitch) * 2, 256), DType::bf16, M, K, a_pitch, 1};
  HbmMatrix b{&hbm, hbm.allocate(static_cast<std::uint64_t>(K * N) * 2, 256), DType::bf16, K, N, N, 1};
  HbmMatrix c{&hbm, hbm.allocate(static_cast<std::uint64_t>(M * N) * 2, 256), DType::bf16, M, N, N, 1};
  SimGemmReport r;
  s.spawn("gemm", [&] { r = sim_pe_gemm(sys, a, b, nullptr, c); });
  s.run();
  if (hbm_bytes) *hbm_bytes = hbm.counters().bytes;
  return r;
}

// A cube of 2 PEs at 1 GHz, 1024 bf16 MACs/cycle, 128 bf16 vector ops/cycle, 64x64x64 tiles: a
// k-block is 64·64·64 / 1024 = 256 cycles = 256 ns of MACs; the bias+round of a tile 4096 / 128 =
// 32 ns. Loads are fast (a 64x64 bf16 k-block is 8 KiB: 32 ns at 256 GB/s), so with 2 stages the
// MAC array never waits after the first k-block: per tile, prologue + nk·max(256, issue) +
// 32 ns + epilogue, and a wave of tiles runs side by side on the 2 PEs. What is left is the
// pipeline's fill (the first A and B k-blocks, about 200 ns) and drain (the last C tile's write),
// under 400 ns together here.
TEST(SimPeGemmPipeline, TimeIsWavesOfTilesFromTheIssueFigures) {
  const json base = {{"tile", {{"m", 64}, {"n", 64}, {"k", 64}}},
                     {"mma", {{"issue_cycles_per_k_block", 0}, {"prologue_cycles", 100}, {"epilogue_cycles", 50}}}};
  const sim::Duration kblock = sim::ns(256), vec = sim::ns(32), pro = sim::ns(100), epi = sim::ns(50);
  const sim::Duration slack = sim::ns(400);
  auto expect_between = [&](const SimGemmReport& r, sim::Duration core, const char* what) {
    EXPECT_GE(r.time, core) << what << ": " << sim::format_time(r.time) << " vs " << sim::format_time(core);
    EXPECT_LE(r.time, core + slack) << what << ": " << sim::format_time(r.time) << " vs " << sim::format_time(core);
  };
  // 2 tiles of 4 k-blocks on 2 PEs: one wave.
  const SimGemmReport one = timed(topo(2, base), 128, 64, 256);
  EXPECT_EQ(one.waves, 1);
  EXPECT_EQ(one.tiles, 2);
  expect_between(one, pro + 4 * kblock + vec + epi, "one wave");
  // P + 1 = 3 tiles: two waves, the second leaves a PE idle for a whole tile.
  const SimGemmReport two = timed(topo(2, base), 192, 64, 256);
  EXPECT_EQ(two.waves, 2);
  expect_between(two, 2 * (pro + 4 * kblock + vec + epi), "two waves");
  // The fill is the same in both runs and the second wave's first k-blocks were loaded during the
  // first wave, so the second wave adds exactly one tile's time, but for the drain: one C write
  // at the end instead of two sharing the HBM (a few ns).
  EXPECT_NEAR(static_cast<double>(two.time - one.time), static_cast<double>(pro + 4 * kblock + vec + epi),
              static_cast<double>(sim::ns(10)));
  ASSERT_EQ(two.pe_idle.size(), 2u);
  const sim::Duration tile_macs = 4 * kblock;
  EXPECT_EQ(two.pe_idle[0], two.time - 2 * tile_macs);  // PE 0 ran tiles 0 and 2
  EXPECT_EQ(two.pe_idle[1], two.time - tile_macs);      // PE 1 only tile 1
  // Issue-bound: 400 cycles per k-block however few MACs it holds.
  json issue = base;
  issue["mma"]["issue_cycles_per_k_block"] = 400;
  expect_between(timed(topo(2, issue), 128, 64, 256), pro + 4 * sim::ns(400) + vec + epi, "issue-bound");
  // Four k-blocks of a 64x64 tile on 2 PEs without the section's figures: no prologue/epilogue.
  json bare = base;
  bare.erase("mma");
  expect_between(timed(topo(2, bare), 128, 64, 256), 4 * kblock + vec, "no mma figures");
}

// With stages 1 a k-block's load cannot overlap the previous k-block's MMAs: slower than 2 stages.
TEST(SimPeGemmPipeline, OneStageExposesTheLoads) {
  json g = {{"tile", {{"m", 64}, {"n", 64}, {"k", 64}}}, {"stages", 1}};
  const SimGemmReport s1 = timed(topo(2, g), 128, 64, 1024);
  g["stages"] = 2;
  const SimGemmReport s2 = timed(topo(2, g), 128, 64, 1024);
  EXPECT_GT(s1.time, s2.time + 16 * sim::ns(20));  // at least the DMA overhead per k-block shows
}

// A 2x1 cluster shares each B k-block between its two PEs: one read from HBM, delivered to both.
TEST(SimPeGemmPipeline, MulticastHalvesTheSharedOperandsReads) {
  const json solo = {{"tile", {{"m", 64}, {"n", 64}, {"k", 64}}}};
  json pair = solo;
  pair["cluster"] = {2, 1};
  const std::int64_t M = 256, N = 128, K = 512;  // 4 x 2 tiles
  const std::uint64_t a_bytes = M * K * 2, b_bytes = K * N * 2, c_bytes = M * N * 2;
  std::uint64_t hbm_solo = 0, hbm_pair = 0;
  const SimGemmReport r1 = timed(topo(4, solo), M, N, K, &hbm_solo);
  const SimGemmReport r2 = timed(topo(4, pair), M, N, K, &hbm_pair);
  // A is read once per tile column (2), B once per tile row (4), or per pair of rows (2) multicast.
  EXPECT_EQ(r1.dma_bytes, 2 * a_bytes + 4 * b_bytes + c_bytes);
  EXPECT_EQ(r2.dma_bytes, 2 * a_bytes + 2 * b_bytes + c_bytes);
  EXPECT_EQ(r1.multicast_bytes, 0u);
  EXPECT_EQ(r2.multicast_bytes, 2 * b_bytes);  // the second PE of each pair got B without reading it
  EXPECT_EQ(hbm_solo, r1.dma_bytes);           // the HBM served every read and write, no more
  EXPECT_EQ(hbm_pair, r2.dma_bytes);
  EXPECT_EQ(r2.clusters, 2);
  EXPECT_EQ(r2.waves, 2);  // 4 blocks of 2x1 tiles on 2 clusters
}

// The tile walk: with one PE, tiles run one after another in the walk's order, so the order shows
// in which PE... instead, with as many PEs as tiles, each PE's single tile is its walk position.
// Checked through timing-free counters: PE p's MAC array did exactly its tile's MACs.
TEST(SimPeGemmPipeline, WalkOrderFollowsRasterAndSwizzle) {
  // 3 x 4 tiles of 16x16 (M = 48, N = 64, K = 16); the last row is 8 rows short, so its tiles hold
  // half the MACs: PE p is on a short tile iff the walk puts a row-2 tile at position p.
  auto short_pes = [](json g) {
    g["tile"] = {{"m", 16}, {"n", 16}, {"k", 16}};
    sim::Simulator s;
    hw::SystemOptions so;
    so.functional = false;
    hw::System sys(s, topo(12, g), so);
    hw::Memory& hbm = sys.hbm(0);
    HbmMatrix a{&hbm, hbm.allocate(40 * 16 * 2, 256), DType::bf16, 40, 16, 16, 1};
    HbmMatrix b{&hbm, hbm.allocate(16 * 64 * 2, 256), DType::bf16, 16, 64, 64, 1};
    HbmMatrix c{&hbm, hbm.allocate(40 * 64 * 2, 256), DType::bf16, 40, 64, 64, 1};
    s.spawn("gemm", [&] { sim_pe_gemm(sys, a, b, nullptr, c); });
    s.run();
    std::vector<int> v;
    for (int p = 0; p < 12; ++p) {
      if (sys.pe(0, p).mac().counters().bytes == 8 * 16 * 16) v.push_back(p);
    }
    return v;
  };
  // raster n, swizzle 1: row-major walk; row 2 is positions 8..11.
  EXPECT_EQ(short_pes({{"raster", "n"}, {"swizzle", 1}}), (std::vector<int>{8, 9, 10, 11}));
  // raster m, swizzle 1: column-major; row 2 is positions 2, 5, 8, 11.
  EXPECT_EQ(short_pes({{"raster", "m"}, {"swizzle", 1}}), (std::vector<int>{2, 5, 8, 11}));
  // raster n, swizzle 2: bands of 2 rows walked column by column ((0,0) (1,0) (0,1) (1,1) ... then
  // the last band of 1 row: (2,0) (2,1) (2,2) (2,3) at positions 8..11.
  EXPECT_EQ(short_pes({{"raster", "n"}, {"swizzle", 2}}), (std::vector<int>{8, 9, 10, 11}));
  // raster m, swizzle 2: bands of 2 columns walked row by row: (0,0) (0,1) (1,0) (1,1) (2,0) (2,1)
  // (0,2) (0,3) (1,2) (1,3) (2,2) (2,3): row 2 at 4, 5, 10, 11.
  EXPECT_EQ(short_pes({{"raster", "m"}, {"swizzle", 2}}), (std::vector<int>{4, 5, 10, 11}));
}

// pe.gemm.choices: a skinny GEMM runs the small tile (more PEs busy, no padded MMAs), a large one
// the big tile (fewer loads and prologues); either way C is det_gemm's bits. "stages": "auto" gives
// each tile what the TCM holds besides its C tile.
TEST(SimPeGemmPipeline, KernelChoicePicksTheTileByShapeAndKeepsTheBits) {
  const json g = {{"choices", {{"bf16", {{{"m", 64}, {"n", 64}, {"k", 32}}, {{"m", 16}, {"n", 16}, {"k", 32}}}}}},
                  {"stages", "auto"},
                  {"mma", {{"prologue_cycles", 200}, {"epilogue_cycles", 100}}}};
  std::mt19937 rng(17);
  // single_cube's TCM is 512 KiB. With bias (f32) and an f32 C: C 64x64x4 = 16 KiB, a stage 64x32x2
  // + 32x64x2 + 64x4 = 8448 bytes: (524288 - 16384) / 8448 = 60 stages; the 16x16 tile: C 1 KiB, a
  // stage 16x32x2 x 2 + 16x4 = 2112 bytes: (524288 - 1024) / 2112 = 247 stages.
  const struct {
    Case c;
    std::int64_t tile;
    int stages;
  } cases[] = {{{16, 64, 256, true, false}, 16, 247}, {{256, 256, 128, true, true}, 64, 60}};
  for (const auto& [c, tile, stages] : cases) {
    const Operands x(c, rng);
    SimGemmReport r;
    const std::vector<float> got = run(topo(8, g), c, x.a, x.b, x.bias, &r);
    EXPECT_EQ(std::memcmp(got.data(), x.want.data(), got.size() * 4), 0) << c.M << "x" << c.N << "x" << c.K;
    EXPECT_EQ(r.tile_m, tile) << c.M << "x" << c.N << "x" << c.K;
    EXPECT_EQ(r.tile_n, tile);
    EXPECT_EQ(r.stages, stages);
    EXPECT_GT(r.estimate, 0.0);
  }
}

// An edge tile's MMAs cost a whole tile's: 16 rows of a 64-row tile take as long as 64.
TEST(SimPeGemmPipeline, AnEdgeTilePaysTheWholeTilesMmas) {
  const json g = {{"tile", {{"m", 64}, {"n", 64}, {"k", 64}}}};
  const SimGemmReport full = timed(topo(1, g), 64, 64, 1024), edge = timed(topo(1, g), 16, 64, 1024);
  // 16 k-blocks of 256 MAC cycles (1 GHz) either way; the edge tile only loads and stores less.
  EXPECT_GE(edge.time, 16 * sim::ns(256));
  // (Unpadded, the edge tile would take 16 x 192 ns less; what differs is the smaller A loads.)
  EXPECT_NEAR(static_cast<double>(edge.time), static_cast<double>(full.time), static_cast<double>(sim::ns(150)));
}

// Unaligned operands (no TMA): a k-block's loads run at unaligned_bytes_per_cycle x alignment / 2,
// and no faster than the fallback's MMA rate. One PE at 1 GHz, 64x64x64 tiles: a k-block's A and B
// are 16 KiB; 4 k-blocks.
TEST(SimPeGemmPipeline, UnalignedLoadsRunAsWideAsTheAlignmentAllows) {
  auto run_pitch = [](const json& g, std::int64_t pitch) { return timed(topo(1, g), 64, 64, 256, nullptr, pitch).time; };
  json g = {{"tile", {{"m", 64}, {"n", 64}, {"k", 64}}}, {"mma", {{"unaligned_bytes_per_cycle", 8}}}};
  const sim::Duration kb2 = sim::ns(2048), kb4 = sim::ns(1024), kb8 = sim::ns(512), slack = sim::ns(400);
  const sim::Duration t2 = run_pitch(g, 257), t4 = run_pitch(g, 258), t8 = run_pitch(g, 260), t16 = run_pitch(g, 264);
  EXPECT_GE(t2, 4 * kb2);  // pitch 514 bytes: 2-byte loads
  EXPECT_LE(t2, 4 * kb2 + slack);
  EXPECT_GE(t4, 4 * kb4);  // 516: 4-byte loads
  EXPECT_LE(t4, 4 * kb4 + slack);
  EXPECT_GE(t8, 4 * kb8);  // 520: 8-byte loads
  EXPECT_LE(t8, 4 * kb8 + slack);
  EXPECT_LE(t16, 4 * sim::ns(256) + slack);  // 528: TMA, MAC-bound (256 cycles a k-block)
  g["mma"]["unaligned_macs_per_cycle"] = 128;  // 64·64·64 / 128 = 2048 cycles a k-block
  const sim::Duration m8 = run_pitch(g, 260), m16 = run_pitch(g, 264);
  EXPECT_GE(m8, 4 * sim::ns(2048));
  EXPECT_LE(m8, 4 * sim::ns(2048) + slack);
  EXPECT_EQ(m16, t16);  // aligned: the fallback's rate does not apply
}

// pe.gemm.launch_ns comes once per GEMM, before any tile.
TEST(SimPeGemmPipeline, LaunchTimeComesOncePerGemm) {
  json g = {{"tile", {{"m", 64}, {"n", 64}, {"k", 64}}}};
  const SimGemmReport r0 = timed(topo(2, g), 256, 128, 256);
  g["launch_ns"] = 1500;
  const SimGemmReport r1 = timed(topo(2, g), 256, 128, 256);
  EXPECT_EQ(r1.time - r0.time, sim::ns(1500));
}

void expect_topology_error(json gemm, int pes, const std::string& path, const std::string& what) {
  try {
    topo(pes, std::move(gemm));
    ADD_FAILURE() << "no error for " << path;
  } catch (const hw::TopologyError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(SimPeGemmPipeline, BadSectionsAreClearTopologyErrors) {
  expect_topology_error({{"cluster", {4, 2}}}, 4, "cube.pe.gemm.cluster", "larger than the cube's 4 PEs");
  expect_topology_error({{"cluster", {2}}}, 4, "cube.pe.gemm.cluster", "expected [cm, cn]");
  expect_topology_error({{"cluster", {0, 1}}}, 4, "cube.pe.gemm.cluster.0", "give an integer from 1");
  expect_topology_error({{"raster", "diagonal"}}, 4, "cube.pe.gemm.raster", "give \"m\"");
  expect_topology_error({{"stages", 0}}, 4, "cube.pe.gemm.stages", "give an integer from 1");
  // single_cube's TCM is 512 KiB: 8 stages of 128x128x64 f32 A and B k-blocks (32 KiB each) do not fit.
  expect_topology_error({{"stages", 8}}, 4, "cube.pe.gemm.stages", "fewer stages or a smaller tile");
  expect_topology_error({{"tiles", {{"f32", {{"m", 256}, {"n", 256}, {"k", 128}}}}}}, 4, "cube.pe.gemm.tiles.f32",
                        "fewer stages or a smaller tile");
  expect_topology_error({{"mma", {{"prologue_cycles", -1}}}}, 4, "cube.pe.gemm.mma.prologue_cycles",
                        "whole number of MAC-clock cycles");
  expect_topology_error({{"swizle", 2}}, 4, "cube.pe.gemm", "did you mean 'swizzle'");
  expect_topology_error({{"stages", "many"}}, 4, "cube.pe.gemm.stages", "\"auto\"");
  expect_topology_error({{"choices", {{"bf16", json::array()}}}}, 4, "cube.pe.gemm.choices.bf16", "non-empty list");
  expect_topology_error({{"choices", {{"bf16", {{{"m", 64}, {"n", 64}, {"k", 64}}, {{"m", 1024}, {"n", 1024}, {"k", 256}}}}}}},
                        4, "cube.pe.gemm.choices.bf16.1", "fewer stages or a smaller tile");
  expect_topology_error({{"choices", {{"bf16", {{{"m", 64}, {"n", 64}}}}}}}, 4, "cube.pe.gemm.choices.bf16.0",
                        "missing required field 'k'");
  expect_topology_error({{"launch_ns", -5}}, 4, "cube.pe.gemm.launch_ns", "time >= 0");
  expect_topology_error({{"mma", {{"unaligned_macs_per_cycle", 0}}}}, 4, "cube.pe.gemm.mma.unaligned_macs_per_cycle",
                        "a number > 0");
  // A cluster that fits the topology but not the PEs a run may use: the kernel runs unclustered.
  sim::Simulator s;
  hw::SystemOptions so;
  so.functional = false;
  hw::System sys(s, topo(4, {{"cluster", {2, 2}}}), so);
  hw::Memory& hbm = sys.hbm(0);
  HbmMatrix m{&hbm, hbm.allocate(64 * 64 * 2, 256), DType::bf16, 64, 64, 64, 1};
  HbmMatrix c{&hbm, hbm.allocate(64 * 64 * 2, 256), DType::bf16, 64, 64, 64, 1};
  SimGemmReport r;
  s.spawn("g", [&] {
    SimGemmOptions o;
    o.max_pes = 2;
    r = sim_pe_gemm(sys, m, m, nullptr, c, o);
  });
  s.run();
  EXPECT_EQ(r.cluster_m * r.cluster_n, 1);
  EXPECT_EQ(r.clusters, 2);
}

}  // namespace
}  // namespace cubesim::kernels::testing
