#include "kernels/sim_pe_gemm.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "kernels/det_gemm.h"
#include "sim/core/event.h"
#include "sim/core/wait.h"

namespace cubesim::kernels {

namespace {

void check_layout(const HbmMatrix& x, const char* name) {
  if (x.memory == nullptr) throw std::invalid_argument(fmt::format("sim_pe_gemm: {} has no memory", name));
  if (x.col_stride != 1 && x.row_stride != 1) {
    throw std::invalid_argument(fmt::format("sim_pe_gemm: {} ({}) must be row-major (col_stride 1) or column-major "
                                            "(row_stride 1); got strides {} and {}",
                                            name, shape_string(x.rows, x.cols), x.row_stride, x.col_stride));
  }
}

// A tile of a matrix in HBM and its packed copy in TCM, in the matrix's own layout.
struct TileXfer {
  hw::Region src, dst;
  std::int64_t view_row_stride, view_col_stride;
};

TileXfer tile_xfer(const HbmMatrix& x, std::int64_t r0, std::int64_t c0, std::int64_t nr, std::int64_t nc,
                   std::uint64_t tcm_addr) {
  const std::uint64_t es = dtype_size(x.dtype);
  const std::uint64_t first = x.addr + static_cast<std::uint64_t>(r0 * x.row_stride + c0 * x.col_stride) * es;
  if (x.col_stride == 1) {
    return {hw::Region{first, static_cast<std::uint64_t>(nr), static_cast<std::uint64_t>(nc) * es,
                       static_cast<std::uint64_t>(x.row_stride) * es},
            hw::Region{tcm_addr, static_cast<std::uint64_t>(nr), static_cast<std::uint64_t>(nc) * es,
                       static_cast<std::uint64_t>(nc) * es},
            nc, 1};
  }
  return {hw::Region{first, static_cast<std::uint64_t>(nc), static_cast<std::uint64_t>(nr) * es,
                     static_cast<std::uint64_t>(x.col_stride) * es},
          hw::Region{tcm_addr, static_cast<std::uint64_t>(nc), static_cast<std::uint64_t>(nr) * es,
                     static_cast<std::uint64_t>(nr) * es},
          1, nr};
}

struct Shared {
  const HbmMatrix *A, *B, *C;
  const HbmVector* bias;
  std::int64_t tm, tn, tk, mtiles, ntiles;
  bool functional;
  std::uint64_t dma_bytes = 0;
};

// One PE's stream of (tile, k-block) steps, double-buffered (see the header).
void run_pe(hw::System& sys, hw::Pe& pe, const std::vector<std::int64_t>& tiles, Shared& sh) {
  const HbmMatrix &A = *sh.A, &B = *sh.B, &C = *sh.C;
  const std::int64_t M = A.rows, N = B.cols, K = A.cols;
  const std::uint64_t ea = dtype_size(A.dtype), eb = dtype_size(B.dtype), ec = dtype_size(C.dtype);
  hw::Memory& tcm = pe.tcm();
  std::uint64_t a_buf[2], b_buf[2], c_buf[2], bias_buf[2];
  for (int i = 0; i < 2; ++i) {
    a_buf[i] = tcm.allocate(static_cast<std::uint64_t>(sh.tm * sh.tk) * ea, 64, "A tile");
    b_buf[i] = tcm.allocate(static_cast<std::uint64_t>(sh.tk * sh.tn) * eb, 64, "B tile");
    c_buf[i] = tcm.allocate(static_cast<std::uint64_t>(sh.tm * sh.tn) * ec, 64, "C tile");
    bias_buf[i] = sh.bias ? tcm.allocate(static_cast<std::uint64_t>(sh.tn) * dtype_size(sh.bias->dtype), 64, "bias") : 0;
  }
  struct Step {
    std::int64_t m0, n0, k0, mt, nt, kt;
    std::size_t tile;  // index into `tiles` (its order on this PE)
  };
  std::vector<Step> steps;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const std::int64_t m0 = tiles[i] / sh.ntiles * sh.tm, n0 = tiles[i] % sh.ntiles * sh.tn;
    for (std::int64_t k0 = 0; k0 < std::max<std::int64_t>(K, 1); k0 += sh.tk) {
      steps.push_back({m0, n0, k0, std::min(sh.tm, M - m0), std::min(sh.tn, N - n0), std::min(sh.tk, K - k0), i});
    }
  }
  hw::TransferHandle loads[2][3];
  hw::TransferHandle writes[2];
  std::vector<float> acc(static_cast<std::size_t>(sh.tm * sh.tn));
  std::vector<std::uint8_t> a_host, b_host, c_host, bias_host;
  auto issue = [&](std::size_t s) {
    const Step& st = steps[s];
    const int slot = static_cast<int>(s % 2);
    if (st.kt > 0) {
      const TileXfer ta = tile_xfer(A, st.m0, st.k0, st.mt, st.kt, a_buf[slot]);
      const TileXfer tb = tile_xfer(B, st.k0, st.n0, st.kt, st.nt, b_buf[slot]);
      loads[slot][0] = sys.start_transfer(*A.memory, ta.src, tcm, ta.dst);
      loads[slot][1] = sys.start_transfer(*B.memory, tb.src, tcm, tb.dst);
      sh.dma_bytes += ta.src.bytes() + tb.src.bytes();
    }
    if (sh.bias && st.k0 == 0) {
      const std::uint64_t be = dtype_size(sh.bias->dtype);
      const hw::Region src = hw::Region::contiguous(sh.bias->addr + static_cast<std::uint64_t>(st.n0) * be,
                                                    static_cast<std::uint64_t>(st.nt) * be);
      loads[slot][2] = sys.start_transfer(*sh.bias->memory, src, tcm,
                                          hw::Region::contiguous(bias_buf[st.tile % 2], src.bytes()));
      sh.dma_bytes += src.bytes();
    }
  };
  if (!steps.empty()) issue(0);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const Step& st = steps[s];
    const int slot = static_cast<int>(s % 2);
    if (s + 1 < steps.size()) issue(s + 1);  // prefetch into the other buffer
    for (auto& h : loads[slot]) h.wait();
    if (st.k0 == 0) std::fill(acc.begin(), acc.end(), 0.0f);
    if (st.kt > 0) {
      if (sh.functional) {
        const TileXfer ta = tile_xfer(A, st.m0, st.k0, st.mt, st.kt, a_buf[slot]);
        const TileXfer tb = tile_xfer(B, st.k0, st.n0, st.kt, st.nt, b_buf[slot]);
        a_host.resize(ta.dst.bytes());
        b_host.resize(tb.dst.bytes());
        tcm.read(ta.dst.addr, std::span<std::byte>(reinterpret_cast<std::byte*>(a_host.data()), a_host.size()));
        tcm.read(tb.dst.addr, std::span<std::byte>(reinterpret_cast<std::byte*>(b_host.data()), b_host.size()));
        const MatrixView av{a_host.data(), A.dtype, st.mt, st.kt, ta.view_row_stride, ta.view_col_stride};
        const MatrixView bv{b_host.data(), B.dtype, st.kt, st.nt, tb.view_row_stride, tb.view_col_stride};
        det_gemm_accumulate(av, bv, acc.data(), sh.tn);
      }
      pe.compute(static_cast<std::uint64_t>(st.mt * st.nt * st.kt), A.dtype, "gemm");
    }
    if (st.k0 + sh.tk >= K) {  // the tile's last k-block: bias, round, write back
      const int oslot = static_cast<int>(st.tile % 2);
      writes[oslot].wait();  // the buffer's previous tile has left
      const TileXfer tc = tile_xfer(C, st.m0, st.n0, st.mt, st.nt, c_buf[oslot]);
      if (sh.functional) {
        c_host.resize(tc.dst.bytes());
        VectorView bv;
        if (sh.bias) {
          bias_host.resize(static_cast<std::size_t>(st.nt) * dtype_size(sh.bias->dtype));
          tcm.read(bias_buf[oslot], std::span<std::byte>(reinterpret_cast<std::byte*>(bias_host.data()), bias_host.size()));
          bv = VectorView::contiguous(bias_host.data(), sh.bias->dtype, st.nt);
        }
        det_gemm_store(acc.data(), sh.tn, sh.bias ? &bv : nullptr,
                       MutableMatrixView{c_host.data(), C.dtype, st.mt, st.nt, tc.view_row_stride, tc.view_col_stride});
        tcm.write(tc.dst.addr, std::span<const std::byte>(reinterpret_cast<const std::byte*>(c_host.data()), c_host.size()));
      }
      pe.vector_op(static_cast<std::uint64_t>(st.mt * st.nt), C.dtype, "bias+round");
      writes[oslot] = sys.start_transfer(tcm, tc.dst, *C.memory, tc.src);
      sh.dma_bytes += tc.src.bytes();
    }
  }
  for (auto& w : writes) w.wait();
  for (int i = 0; i < 2; ++i) {
    tcm.free(a_buf[i]);
    tcm.free(b_buf[i]);
    tcm.free(c_buf[i]);
    if (sh.bias) tcm.free(bias_buf[i]);
  }
}

}  // namespace

SimGemmReport sim_pe_gemm(hw::System& sys, const HbmMatrix& A, const HbmMatrix& B, const HbmVector* bias,
                          const HbmMatrix& C, const SimGemmOptions& opts) {
  check_layout(A, "A");
  check_layout(B, "B");
  check_layout(C, "C");
  if (A.cols != B.rows || C.rows != A.rows || C.cols != B.cols) {
    throw std::invalid_argument(fmt::format("sim_pe_gemm: A {} times B {} does not give C {}", shape_string(A.rows, A.cols),
                                            shape_string(B.rows, B.cols), shape_string(C.rows, C.cols)));
  }
  if (bias && bias->size != C.cols) {
    throw std::invalid_argument(fmt::format("sim_pe_gemm: bias has {} elements; C has {} columns", bias->size, C.cols));
  }
  std::vector<int> cubes = opts.cubes;
  if (cubes.empty()) {
    if (C.memory->cube() < 0) throw std::invalid_argument("sim_pe_gemm: C is not in a cube's memory; name the cubes to run on");
    cubes.push_back(C.memory->cube());
  }
  std::vector<hw::Pe*> pes;
  for (int c : cubes) {
    const int n = sys.cube(c).num_pes();
    for (int p = 0; p < (opts.max_pes > 0 ? std::min(n, opts.max_pes) : n); ++p) pes.push_back(&sys.pe(c, p));
  }
  if (pes.empty()) throw std::invalid_argument("sim_pe_gemm: the chosen cubes have no PEs");
  const auto& tile = pes[0]->spec().tile;
  Shared sh{&A, &B, &C, bias, static_cast<std::int64_t>(tile.m), static_cast<std::int64_t>(tile.n),
            static_cast<std::int64_t>(tile.k), 0, 0, sys.options().functional};
  sh.mtiles = (A.rows + sh.tm - 1) / sh.tm;
  sh.ntiles = (B.cols + sh.tn - 1) / sh.tn;
  const std::uint64_t need = 2 * (static_cast<std::uint64_t>(sh.tm * sh.tk) * dtype_size(A.dtype) +
                                  static_cast<std::uint64_t>(sh.tk * sh.tn) * dtype_size(B.dtype) +
                                  static_cast<std::uint64_t>(sh.tm * sh.tn) * dtype_size(C.dtype) +
                                  (bias ? static_cast<std::uint64_t>(sh.tn) * dtype_size(bias->dtype) : 0));
  if (need > pes[0]->tcm().capacity()) {
    throw std::invalid_argument(fmt::format("sim_pe_gemm: a {}x{}x{} tile needs {} bytes of TCM (double-buffered A, B "
                                            "and C) but {} has {}",
                                            sh.tm, sh.tn, sh.tk, need, pes[0]->name(), pes[0]->tcm().capacity()));
  }
  sim::Simulator& sim = sys.simulator();
  const sim::Time t0 = sim.now();
  const std::int64_t ntiles = sh.mtiles * sh.ntiles;
  std::vector<std::unique_ptr<sim::Event>> done;
  for (std::size_t p = 0; p < pes.size(); ++p) {
    std::vector<std::int64_t> mine;
    for (std::int64_t t = static_cast<std::int64_t>(p); t < ntiles; t += static_cast<std::int64_t>(pes.size())) mine.push_back(t);
    if (mine.empty()) continue;
    done.push_back(std::make_unique<sim::Event>(pes[p]->name() + " " + opts.label + " done"));
    sim::Event* ev = done.back().get();
    hw::Pe* pe = pes[p];
    sim.spawn(fmt::format("{}/{}", pe->name(), opts.label), [&sys, pe, mine = std::move(mine), &sh, ev] {
      run_pe(sys, *pe, mine, sh);
      ev->trigger();
    });
  }
  std::vector<sim::Event*> evs;
  for (auto& e : done) evs.push_back(e.get());
  sim::wait_all(evs);

  SimGemmReport r;
  r.time = sim.now() - t0;
  r.macs = static_cast<std::uint64_t>(A.rows) * static_cast<std::uint64_t>(B.cols) * static_cast<std::uint64_t>(A.cols);
  r.pes = static_cast<int>(pes.size());
  r.tile_m = sh.tm;
  r.tile_n = sh.tn;
  r.tile_k = sh.tk;
  r.compute_bound = pes[0]->mac().time((r.macs + pes.size() - 1) / pes.size(), A.dtype);
  r.min_bytes = static_cast<std::uint64_t>(A.rows * A.cols) * dtype_size(A.dtype) +
                static_cast<std::uint64_t>(B.rows * B.cols) * dtype_size(B.dtype) +
                static_cast<std::uint64_t>(C.rows * C.cols) * dtype_size(C.dtype) +
                (bias ? static_cast<std::uint64_t>(bias->size) * dtype_size(bias->dtype) : 0);
  r.memory_bound = sim::transfer_time(r.min_bytes, C.memory->bandwidth());
  r.bound = r.memory_bound > r.compute_bound ? "memory" : "compute";
  r.efficiency = r.time ? static_cast<double>(std::max(r.compute_bound, r.memory_bound)) / static_cast<double>(r.time) : 1.0;
  r.dma_bytes = sh.dma_bytes;
  return r;
}

}  // namespace cubesim::kernels
