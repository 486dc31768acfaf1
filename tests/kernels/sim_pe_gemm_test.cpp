// det_gemm on the simulated PEs: the whole contract table (bitwise equal to the reference,
// invariance, accuracy) with operands moved through simulated HBM and TCM, and the roofline:
// large shapes on single_cube within 10% of the bound.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>

#include "kernels/sim_pe_gemm.h"
#include "tests/kernels/gemm_cases.h"

namespace cubesim::kernels::testing {
namespace {

// Copies a host view into `mem` compactly, keeping its layout class (column-major stays so).
HbmMatrix upload(hw::Memory& mem, const MatrixView& v) {
  const bool colmajor = v.col_stride != 1 && v.row_stride == 1;
  const std::size_t es = dtype_size(v.dtype);
  std::vector<std::byte> bytes(static_cast<std::size_t>(std::max<std::int64_t>(v.rows * v.cols, 1)) * es);
  for (std::int64_t r = 0; r < v.rows; ++r) {
    for (std::int64_t c = 0; c < v.cols; ++c) {
      const std::int64_t at = colmajor ? c * v.rows + r : r * v.cols + c;
      std::memcpy(bytes.data() + at * es, v.element_ptr(r, c), es);
    }
  }
  const std::uint64_t addr = mem.allocate(bytes.size(), 256, "operand");
  mem.write(addr, bytes);
  return HbmMatrix{&mem, addr, v.dtype, v.rows, v.cols, colmajor ? 1 : v.cols, colmajor ? v.rows : 1};
}

void run_on_sim(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C,
                const hw::Topology& topo) {
  sim::Simulator s;
  hw::SystemOptions so;
  so.check_uninitialized = true;  // a tile read before its DMA landed would throw
  hw::System sys(s, topo, so);
  hw::Memory& hbm = sys.hbm(0);
  const HbmMatrix a = upload(hbm, A), b = upload(hbm, B);
  HbmVector bv;
  if (bias) {
    const std::size_t es = dtype_size(bias->dtype);
    std::vector<std::byte> bytes(static_cast<std::size_t>(bias->size) * es);
    for (std::int64_t i = 0; i < bias->size; ++i) {
      std::memcpy(bytes.data() + i * es, static_cast<const std::byte*>(bias->data) + i * bias->stride * es, es);
    }
    bv = HbmVector{&hbm, hbm.allocate(std::max<std::size_t>(bytes.size(), 1), 256, "bias"), bias->dtype, bias->size};
    hbm.write(bv.addr, bytes);
  }
  const std::size_t ec = dtype_size(C.dtype);
  const HbmMatrix c{&hbm, hbm.allocate(std::max<std::int64_t>(C.rows * C.cols, 1) * ec, 256, "C"), C.dtype, C.rows, C.cols, C.cols, 1};
  s.spawn("gemm", [&] { sim_pe_gemm(sys, a, b, bias ? &bv : nullptr, c); });
  s.run();
  std::vector<std::byte> out(static_cast<std::size_t>(C.rows * C.cols) * ec);
  if (!out.empty()) hbm.read(c.addr, out);
  for (std::int64_t r = 0; r < C.rows; ++r) {
    for (std::int64_t col = 0; col < C.cols; ++col) std::memcpy(C.element_ptr(r, col), out.data() + (r * C.cols + col) * ec, ec);
  }
}

GemmBackend sim_pe_backend(std::string name, std::shared_ptr<const hw::Topology> t) {
  return {name,
          [t](const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
            run_on_sim(A, B, bias, C, *t);
          },
          [t](const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
            run_on_sim(dC, B.transposed(), nullptr, dA, *t);  // dA = dC·Bᵀ, ascending n
          },
          [t](const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
            run_on_sim(A.transposed(), dC, nullptr, dB, *t);  // dB = Aᵀ·dC, ascending m
          }};
}

// single_cube with the GPU-like pipeline (kernels/sim_pe_gemm.h): small tiles so the cases' shapes
// cross many tiles, 3 stages, a swizzled column walk and 2x1 multicast clusters.
std::shared_ptr<const hw::Topology> pipeline_topology() {
  nlohmann::json doc = hw::load_topology_json("single_cube");
  doc["cube"]["pe"]["gemm"] = nlohmann::json::parse(R"({"tile": {"m": 16, "n": 32, "k": 16}, "stages": 3,
      "raster": "m", "swizzle": 2, "cluster": [2, 1], "mma": {"issue_cycles_per_k_block": 4, "prologue_cycles": 10}})");
  return std::make_shared<const hw::Topology>(hw::topology_from_json(doc, "single_cube + pe.gemm"));
}

INSTANTIATE_GEMM_CONTRACT(SimPe, ::testing::Values(sim_pe_backend(
                                     "sim_pe", std::make_shared<const hw::Topology>(hw::load_topology("single_cube")))));
INSTANTIATE_GEMM_CONTRACT(SimPePipeline, ::testing::Values(sim_pe_backend("sim_pe_pipeline", pipeline_topology())));

SimGemmReport timed(const std::string& topo, std::int64_t M, std::int64_t N, std::int64_t K, DType d,
                    std::vector<int> cubes = {}) {
  sim::Simulator s;
  hw::SystemOptions so;
  so.functional = false;  // timing only: the times are those of a functional run
  hw::System sys(s, hw::load_topology(topo), so);
  hw::Memory& hbm = sys.hbm(0);
  const std::size_t es = dtype_size(d);
  HbmMatrix a{&hbm, hbm.allocate(M * K * es), d, M, K, K, 1};
  HbmMatrix w{&hbm, hbm.allocate(N * K * es), d, K, N, 1, K};  // Wᵀ of a [N, K] weight
  HbmMatrix c{&hbm, hbm.allocate(M * N * es), d, M, N, N, 1};
  SimGemmReport r;
  s.spawn("gemm", [&] { r = sim_pe_gemm(sys, a, w, nullptr, c, {.cubes = cubes}); });
  s.run();
  return r;
}

TEST(SimPeGemm, LargeShapesWithinTenPercentOfRoofline) {
  for (auto [M, N, K, d] : {std::tuple{2048, 2048, 2048, DType::bf16}, std::tuple{4096, 1024, 2048, DType::bf16},
                            std::tuple{1024, 1024, 1024, DType::f32}, std::tuple{2048, 4096, 512, DType::f16}}) {
    const SimGemmReport r = timed("single_cube", M, N, K, d);
    EXPECT_GE(r.efficiency, 0.9) << M << "x" << N << "x" << K << " " << dtype_name(d) << ": " << sim::format_time(r.time)
                                 << " vs bound " << sim::format_time(std::max(r.compute_bound, r.memory_bound)) << " ("
                                 << r.bound << ")";
    EXPECT_LE(r.efficiency, 1.0 + 1e-9);
    EXPECT_EQ(r.pes, 4);
    EXPECT_EQ(std::string(r.bound), "compute");
  }
}

TEST(SimPeGemm, MemoryBoundShapeIsReportedSo) {
  const SimGemmReport r = timed("single_cube", 1, 4096, 4096, DType::bf16);  // a decode step: GEMV
  EXPECT_EQ(std::string(r.bound), "memory");
  EXPECT_GT(r.memory_bound, r.compute_bound);
}

// Over two cubes of mesh4x4 the second cube's PEs fetch their tiles from the first cube's HBM over
// a 128 GB/s link, which is slower than staying home (the simulator shows it); the bits stay those
// of the host kernel.
TEST(SimPeGemm, SpreadsOverCubesWithTheSameBits) {
  const std::int64_t M = 200, N = 300, K = 150;
  std::mt19937 rng(11);
  std::normal_distribution<float> nrm;
  std::vector<std::uint16_t> a(M * K), w(N * K);
  for (auto& x : a) x = f32_to_bf16(nrm(rng));
  for (auto& x : w) x = f32_to_bf16(nrm(rng));
  std::vector<float> want(M * N), got(M * N, std::numeric_limits<float>::quiet_NaN());
  det_gemm(MatrixView::row_major(a.data(), DType::bf16, M, K), MatrixView::row_major(w.data(), DType::bf16, N, K).transposed(),
           nullptr, MutableMatrixView::row_major(want.data(), DType::f32, M, N));
  sim::Simulator s;
  hw::System sys(s, hw::load_topology("mesh4x4"));
  hw::Memory& hbm = sys.hbm(0);
  HbmMatrix ha{&hbm, hbm.allocate(a.size() * 2), DType::bf16, M, K, K, 1};
  HbmMatrix hw_{&hbm, hbm.allocate(w.size() * 2), DType::bf16, K, N, 1, K};
  HbmMatrix hc{&hbm, hbm.allocate(got.size() * 4), DType::f32, M, N, N, 1};
  hbm.write(ha.addr, std::as_bytes(std::span(a)));
  hbm.write(hw_.addr, std::as_bytes(std::span(w)));
  SimGemmReport one, two;
  s.spawn("g", [&] {
    one = sim_pe_gemm(sys, ha, hw_, nullptr, hc, {.cubes = {0}});
    two = sim_pe_gemm(sys, ha, hw_, nullptr, hc, {.cubes = {0, 1}});
  });
  s.run();
  hbm.read(hc.addr, std::as_writable_bytes(std::span(got)));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  EXPECT_EQ(two.pes, 2 * one.pes);
}

TEST(SimPeGemm, BadLayoutsAndShapesAreClearErrors) {
  sim::Simulator s;
  hw::System sys(s, hw::load_topology("single_cube"));
  hw::Memory& hbm = sys.hbm(0);
  HbmMatrix a{&hbm, 0, DType::bf16, 8, 8, 16, 2};  // neither stride is 1
  HbmMatrix b{&hbm, 0, DType::bf16, 8, 8, 8, 1};
  HbmMatrix c{&hbm, 0, DType::bf16, 8, 9, 9, 1};
  s.spawn("g", [&] {
    EXPECT_THROW(sim_pe_gemm(sys, a, b, nullptr, b), std::invalid_argument);
    EXPECT_THROW(sim_pe_gemm(sys, b, b, nullptr, c), std::invalid_argument);
  });
  s.run();
}

}  // namespace
}  // namespace cubesim::kernels::testing
