#include "kernels/sim_pe_gemm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernels/det_gemm.h"
#include "sim/core/event.h"
#include "sim/core/wait.h"
#include "sim/hw/cube.h"

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
  AccumulatorModel numerics = AccumulatorModel::f32_fma_seq;
};

// Before any work: a model the tile's k-blocks (or the operands' dtypes) cannot run.
void check_numerics(AccumulatorModel m, std::int64_t tile_k, const HbmMatrix& A, const HbmMatrix& B) {
  if (m == AccumulatorModel::f32_fma_seq) return;
  const int g = accumulator_group(m);
  if (A.cols > tile_k && tile_k % g != 0)
    throw std::invalid_argument(fmt::format("sim_pe_gemm: gemm_numerics {} sums groups of {} products, but the PE's "
                                            "tile k is {} (K = {}): give the topology's pe tile a k that is a multiple "
                                            "of {}",
                                            accumulator_model_name(m), g, tile_k, A.cols, g));
  if (m == AccumulatorModel::hopper_tc && (A.dtype == DType::f32 || B.dtype == DType::f32))
    throw std::invalid_argument(fmt::format("sim_pe_gemm: gemm_numerics hopper_tc models bf16/f16 tensor-core MMAs; "
                                            "this GEMM's operands are {} and {}",
                                            dtype_name(A.dtype), dtype_name(B.dtype)));
}

// A k-block continued from the running accumulator: the contract's kernel, or the model's.
void pe_accumulate(AccumulatorModel m, const MatrixView& a, const MatrixView& b, float* acc, std::int64_t ld, bool last) {
  if (m == AccumulatorModel::f32_fma_seq) det_gemm_accumulate(a, b, acc, ld);
  else accumulate_model(m, a, b, acc, ld, last);
}

// The roofline figures of a finished run (r.time set).
void roofline(SimGemmReport& r, const HbmMatrix& A, const HbmMatrix& B, const HbmVector* bias, const HbmMatrix& C,
              hw::Pe& pe, std::size_t npes) {
  r.macs = static_cast<std::uint64_t>(A.rows) * static_cast<std::uint64_t>(B.cols) * static_cast<std::uint64_t>(A.cols);
  r.compute_bound = pe.mac().time((r.macs + npes - 1) / npes, A.dtype);
  r.min_bytes = static_cast<std::uint64_t>(A.rows * A.cols) * dtype_size(A.dtype) +
                static_cast<std::uint64_t>(B.rows * B.cols) * dtype_size(B.dtype) +
                static_cast<std::uint64_t>(C.rows * C.cols) * dtype_size(C.dtype) +
                (bias ? static_cast<std::uint64_t>(bias->size) * dtype_size(bias->dtype) : 0);
  r.memory_bound = sim::transfer_time(r.min_bytes, C.memory->bandwidth());
  r.bound = r.memory_bound > r.compute_bound ? "memory" : "compute";
  r.efficiency = r.time ? static_cast<double>(std::max(r.compute_bound, r.memory_bound)) / static_cast<double>(r.time) : 1.0;
}

// TCM buffers of one run, freed when it ends, also when a failed or interrupted spawn unwinds the
// run's processes: the next run finds the TCM as it was.
class TcmLease {
 public:
  TcmLease() = default;
  TcmLease(const TcmLease&) = delete;
  TcmLease& operator=(const TcmLease&) = delete;
  ~TcmLease() {
    for (auto it = held_.rbegin(); it != held_.rend(); ++it) it->first->free(it->second);
  }
  std::uint64_t allocate(hw::Memory& tcm, std::uint64_t bytes, std::string_view what) {
    held_.reserve(held_.size() + 1);  // the pair below cannot fail to go in once allocated
    const std::uint64_t a = tcm.allocate(bytes, 64, what);
    held_.emplace_back(&tcm, a);
    return a;
  }

 private:
  std::vector<std::pair<hw::Memory*, std::uint64_t>> held_;
};

// One PE's stream of (tile, k-block) steps, double-buffered (see the header).
void run_pe(hw::System& sys, hw::Pe& pe, const std::vector<std::int64_t>& tiles, Shared& sh) {
  const HbmMatrix &A = *sh.A, &B = *sh.B, &C = *sh.C;
  const std::int64_t M = A.rows, N = B.cols, K = A.cols;
  const std::uint64_t ea = dtype_size(A.dtype), eb = dtype_size(B.dtype), ec = dtype_size(C.dtype);
  hw::Memory& tcm = pe.tcm();
  TcmLease lease;
  std::uint64_t a_buf[2], b_buf[2], c_buf[2], bias_buf[2];
  for (int i = 0; i < 2; ++i) {
    a_buf[i] = lease.allocate(tcm, static_cast<std::uint64_t>(sh.tm * sh.tk) * ea, "A tile");
    b_buf[i] = lease.allocate(tcm, static_cast<std::uint64_t>(sh.tk * sh.tn) * eb, "B tile");
    c_buf[i] = lease.allocate(tcm, static_cast<std::uint64_t>(sh.tm * sh.tn) * ec, "C tile");
    bias_buf[i] = sh.bias ? lease.allocate(tcm, static_cast<std::uint64_t>(sh.tn) * dtype_size(sh.bias->dtype), "bias") : 0;
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
  // Values only in a functional run: a timing-only one keeps nothing per tile (8 PEs x 1024 cubes
  // of 16 KiB accumulators would be most of a large sweep's memory).
  std::vector<float> acc(sh.functional ? static_cast<std::size_t>(sh.tm * sh.tn) : 0);
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
    if (st.k0 == 0 && sh.functional) std::fill(acc.begin(), acc.end(), 0.0f);
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
        pe_accumulate(sh.numerics, av, bv, acc.data(), sh.tn, st.k0 + sh.tk >= K);
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
        if (sys.faults().armed()) sys.faults().on_gemm_tile(pe.cube(), pe.index(), tcm, tc.dst.addr, tc.dst.bytes());
      }
      pe.vector_op(static_cast<std::uint64_t>(st.mt * st.nt), C.dtype, "bias+round");
      writes[oslot] = sys.start_transfer(tcm, tc.dst, *C.memory, tc.src);
      sh.dma_bytes += tc.src.bytes();
    }
  }
  for (auto& w : writes) w.wait();
}

// ---------------------------------------------------------------- the GPU-like pipeline ("pe.gemm")

// The b-th cluster block of the walk (see the header): bands of `swz` block rows (raster n) or
// columns (raster m), the band walked along the raster dimension, each step down the band first.
std::pair<std::int64_t, std::int64_t> walk(std::int64_t b, std::int64_t mb, std::int64_t nb, hw::GemmRaster raster,
                                           std::int64_t swz) {
  const bool along_n = raster == hw::GemmRaster::n;
  const std::int64_t across = along_n ? mb : nb, along = along_n ? nb : mb;
  const std::int64_t band = b / (swz * along), first = band * swz;
  const std::int64_t h = std::min(swz, across - first), within = b - band * swz * along;
  const std::int64_t a = first + within % h, l = within / h;
  return along_n ? std::pair{a, l} : std::pair{l, a};
}

std::span<std::byte> writable_bytes(std::vector<std::uint8_t>& v) {
  return {reinterpret_cast<std::byte*>(v.data()), v.size()};
}
std::span<const std::byte> bytes(const std::vector<std::uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

// The processes a GEMM runs on (one per PE, or per cluster): spawn() each, then wait() for all.
struct Workers {
  sim::Simulator& sim;
  std::vector<std::unique_ptr<sim::Event>> done = {};
  template <class Fn>
  void spawn(std::string name, std::string event, Fn fn) {
    done.push_back(std::make_unique<sim::Event>(std::move(event)));
    sim::Event* ev = done.back().get();
    sim.spawn(std::move(name), [fn = std::move(fn), ev]() mutable {
      fn();
      ev->trigger();
    });
  }
  void wait() {
    std::vector<sim::Event*> evs;
    for (auto& e : done) evs.push_back(e.get());
    sim::wait_all(evs);
  }
};

struct Member {
  hw::Pe* pe = nullptr;
  std::vector<std::uint64_t> a_buf, b_buf, bias_buf;  // one per stage
  std::uint64_t c_buf = 0;
  sim::Time ready = 0;  // the earliest its next MMA may start (tile prologue)
  hw::TransferHandle write;
  std::vector<float> acc;
  std::vector<std::uint8_t> bias_host;
};

struct Pipe {
  const HbmMatrix *A, *B, *C;
  const HbmVector* bias;
  const hw::GemmPipelineSpec* g;
  std::int64_t tm, tn, tk, mtiles, ntiles, nk, cm, cn, mblocks, nblocks, clusters;
  std::size_t stages;
  bool functional;
  AccumulatorModel numerics = AccumulatorModel::f32_fma_seq;
  std::uint64_t dma_bytes = 0, multicast_bytes = 0;
  bool unaligned = false;  // an operand or C breaks TMA's 16-byte alignment (the header's [unaligned])
  std::uint64_t align = 16;  // the least alignment of A, B and C (alignment())
};

// The largest power of two up to 16 that divides x's address and row pitch in bytes. TMA copies
// need 16: 16-byte aligned global addresses and strides.
std::uint64_t alignment(const HbmMatrix& x) {
  const std::uint64_t pitch = static_cast<std::uint64_t>(x.col_stride == 1 ? x.row_stride : x.col_stride) * dtype_size(x.dtype);
  const bool one_row = x.col_stride == 1 ? x.rows <= 1 : x.cols <= 1;
  std::uint64_t a = 16;
  while (a > 1 && (x.addr % a != 0 || (!one_row && pitch % a != 0))) a /= 2;
  return a;
}

// A k-block's cycles on the load path of an unaligned GEMM (the header's [unaligned]): the fallback
// kernel's MMA rate, and its loads at unaligned_bytes_per_cycle x (alignment / 2).
double unaligned_cycles(const hw::GemmPipelineSpec& g, double macs, double bytes, std::uint64_t align) {
  double c = std::ceil(bytes / (g.unaligned_bytes_per_cycle * static_cast<double>(std::max<std::uint64_t>(align, 2)) / 2.0));
  if (g.unaligned_macs_per_cycle > 0) c = std::max(c, std::ceil(macs / g.unaligned_macs_per_cycle));
  return c;
}

// One cluster's process: its blocks g, g + G, ... (G clusters), every member in lockstep over the
// k-blocks, `stages` steps of loads in flight (see the header).
void run_cluster(hw::System& sys, std::vector<hw::Pe*> pes, std::int64_t g, Pipe& P) {
  const HbmMatrix &A = *P.A, &B = *P.B, &C = *P.C;
  const std::int64_t M = A.rows, N = B.cols, K = A.cols;
  const std::uint64_t ea = dtype_size(A.dtype), eb = dtype_size(B.dtype), ec = dtype_size(C.dtype);
  const std::uint64_t ebias = P.bias ? dtype_size(P.bias->dtype) : 0;
  const std::size_t S = P.stages;
  const std::int64_t cm = P.cm, cn = P.cn;
  sim::Simulator& sim = sys.simulator();
  sim::Trace& tr = sim.trace();
  std::vector<Member> mem(pes.size());
  TcmLease lease;
  for (std::size_t i = 0; i < pes.size(); ++i) {
    Member& x = mem[i];
    x.pe = pes[i];
    hw::Memory& tcm = x.pe->tcm();
    for (std::size_t st = 0; st < S; ++st) {
      x.a_buf.push_back(lease.allocate(tcm, static_cast<std::uint64_t>(P.tm * P.tk) * ea, "A k-block"));
      x.b_buf.push_back(lease.allocate(tcm, static_cast<std::uint64_t>(P.tk * P.tn) * eb, "B k-block"));
      if (P.bias) x.bias_buf.push_back(lease.allocate(tcm, static_cast<std::uint64_t>(P.tn) * ebias, "bias"));
    }
    x.c_buf = lease.allocate(tcm, static_cast<std::uint64_t>(P.tm * P.tn) * ec, "C tile");
    x.ready = sim.now() + sim::transfer_time(P.g->prologue_cycles, sim::Bandwidth{x.pe->mac().spec().clock_hz});
    if (P.functional) x.acc.resize(static_cast<std::size_t>(P.tm * P.tn));
  }
  const std::int64_t nblocks_total = P.mblocks * P.nblocks;
  std::int64_t nmine = 0;
  for (std::int64_t b = g; b < nblocks_total; b += P.clusters) ++nmine;
  const std::int64_t nsteps = nmine * P.nk;
  // A step's loads, per slot: A per block row (issuer member), B and bias per block column.
  struct Load {
    hw::TransferHandle h;
    int issuer = -1;
  };
  const std::size_t per_slot = static_cast<std::size_t>(cm + 2 * cn);
  std::vector<Load> loads(S * per_slot);
  struct Where {
    std::int64_t bm, bn, kb, rows, cols;  // rows, cols: members of the block that have a tile
  };
  auto where = [&](std::int64_t s) {
    const std::int64_t b = g + (s / P.nk) * P.clusters;
    const auto [bm, bn] = walk(b, P.mblocks, P.nblocks, P.g->raster, P.g->swizzle);
    return Where{bm, bn, s % P.nk, std::min(cm, P.mtiles - bm * cm), std::min(cn, P.ntiles - bn * cn)};
  };
  auto issue = [&](std::int64_t s) {
    const Where w = where(s);
    const std::size_t slot = static_cast<std::size_t>(s) % S;
    Load* l = &loads[slot * per_slot];
    const std::int64_t k0 = w.kb * P.tk, kt = std::min(P.tk, K - k0);
    for (std::int64_t r = 0; r < w.rows; ++r) {  // A(row, kb): to every member of the row
      const int who = static_cast<int>(r * cn + w.kb % w.cols);
      l[r].issuer = who;
      if (kt <= 0) continue;
      const std::int64_t m0 = (w.bm * cm + r) * P.tm;
      Member& x = mem[static_cast<std::size_t>(who)];
      const TileXfer ta = tile_xfer(A, m0, k0, std::min(P.tm, M - m0), kt, x.a_buf[slot]);
      l[r].h = sys.start_transfer(*A.memory, ta.src, x.pe->tcm(), ta.dst);
      P.dma_bytes += ta.src.bytes();
      P.multicast_bytes += ta.src.bytes() * static_cast<std::uint64_t>(w.cols - 1);
    }
    for (std::int64_t c = 0; c < w.cols; ++c) {  // B(kb, col) and the bias slice: to every member of the column
      const int who = static_cast<int>((w.kb % w.rows) * cn + c);
      Load& lb = l[cm + c];
      Load& lv = l[cm + cn + c];
      lb.issuer = lv.issuer = who;
      Member& x = mem[static_cast<std::size_t>(who)];
      const std::int64_t n0 = (w.bn * cn + c) * P.tn, nt = std::min(P.tn, N - n0);
      if (kt > 0) {
        const TileXfer tb = tile_xfer(B, k0, n0, kt, nt, x.b_buf[slot]);
        lb.h = sys.start_transfer(*B.memory, tb.src, x.pe->tcm(), tb.dst);
        P.dma_bytes += tb.src.bytes();
        P.multicast_bytes += tb.src.bytes() * static_cast<std::uint64_t>(w.rows - 1);
      }
      if (P.bias && w.kb == 0) {
        const hw::Region src = hw::Region::contiguous(P.bias->addr + static_cast<std::uint64_t>(n0) * ebias,
                                                      static_cast<std::uint64_t>(nt) * ebias);
        const hw::Region dst = hw::Region::contiguous(x.bias_buf[slot], src.bytes());
        lv.h = sys.start_transfer(*P.bias->memory, src, x.pe->tcm(), dst);
        P.dma_bytes += src.bytes();
        P.multicast_bytes += src.bytes() * static_cast<std::uint64_t>(w.rows - 1);
      }
    }
  };
  // A multicast's delivery: the bytes that landed in the issuer's TCM are in every receiver's too.
  std::vector<std::byte> bounce;
  auto deliver = [&](const Member& from, std::uint64_t from_addr, Member& to, std::uint64_t to_addr, std::uint64_t n) {
    if (&from == &to || n == 0) return;
    bounce.resize(n);
    from.pe->tcm().read(from_addr, bounce);
    to.pe->tcm().write(to_addr, bounce);
  };
  std::vector<std::uint8_t> a_host, b_host, c_host;
  for (std::int64_t s = 0; s < std::min<std::int64_t>(nsteps, static_cast<std::int64_t>(S)); ++s) issue(s);
  for (std::int64_t s = 0; s < nsteps; ++s) {
    const Where w = where(s);
    const std::size_t slot = static_cast<std::size_t>(s) % S;
    Load* l = &loads[slot * per_slot];
    for (std::size_t i = 0; i < per_slot; ++i) l[i].h.wait();
    const std::int64_t k0 = w.kb * P.tk, kt = std::min(P.tk, K - k0);
    sim::Time end = sim.now();
    for (std::int64_t r = 0; r < w.rows; ++r) {
      for (std::int64_t c = 0; c < w.cols; ++c) {
        Member& x = mem[static_cast<std::size_t>(r * cn + c)];
        const std::int64_t m0 = (w.bm * cm + r) * P.tm, n0 = (w.bn * cn + c) * P.tn;
        const std::int64_t mt = std::min(P.tm, M - m0), nt = std::min(P.tn, N - n0);
        const Member& ia = mem[static_cast<std::size_t>(l[r].issuer)];
        const Member& ib = mem[static_cast<std::size_t>(l[cm + c].issuer)];
        if (P.functional) {
          if (w.kb == 0) {
            std::fill(x.acc.begin(), x.acc.end(), 0.0f);
            if (P.bias) {
              deliver(ib, ib.bias_buf[slot], x, x.bias_buf[slot], static_cast<std::uint64_t>(nt) * ebias);
              x.bias_host.resize(static_cast<std::size_t>(nt) * ebias);
              x.pe->tcm().read(x.bias_buf[slot], writable_bytes(x.bias_host));
            }
          }
          if (kt > 0) {
            const TileXfer ta = tile_xfer(A, m0, k0, mt, kt, x.a_buf[slot]);
            const TileXfer tb = tile_xfer(B, k0, n0, kt, nt, x.b_buf[slot]);
            deliver(ia, ia.a_buf[slot], x, x.a_buf[slot], ta.dst.bytes());
            deliver(ib, ib.b_buf[slot], x, x.b_buf[slot], tb.dst.bytes());
            a_host.resize(ta.dst.bytes());
            b_host.resize(tb.dst.bytes());
            x.pe->tcm().read(ta.dst.addr, writable_bytes(a_host));
            x.pe->tcm().read(tb.dst.addr, writable_bytes(b_host));
            pe_accumulate(P.numerics, MatrixView{a_host.data(), A.dtype, mt, kt, ta.view_row_stride, ta.view_col_stride},
                          MatrixView{b_host.data(), B.dtype, kt, nt, tb.view_row_stride, tb.view_col_stride},
                          x.acc.data(), P.tn, w.kb + 1 >= P.nk);
          }
        }
        if (kt > 0) {
          // A k-block occupies the MAC array max(MACs / rate, issue figure) cycles; an edge tile's
          // MMAs are a whole tile's (the instruction shape does not shrink with the rows left).
          hw::ComputeUnit& mac = x.pe->mac();
          const std::uint64_t macs = static_cast<std::uint64_t>(mt * nt * kt);
          std::uint64_t cyc = std::max(mac.cycles(static_cast<std::uint64_t>(P.tm * P.tn * kt), A.dtype),
                                       P.g->issue_cycles_per_k_block);
          if (P.unaligned) {
            const double b = static_cast<double>(static_cast<std::uint64_t>(mt * kt) * ea + static_cast<std::uint64_t>(kt * nt) * eb);
            cyc = std::max(cyc, static_cast<std::uint64_t>(unaligned_cycles(*P.g, static_cast<double>(P.tm * P.tn * kt), b, P.align)));
          }
          const auto [b0, e0] = mac.book_cycles(std::max(sim.now(), x.ready), macs, A.dtype, cyc,
                                                tr.enabled() ? &tr : nullptr, "gemm");
          end = std::max(end, e0);
        } else {
          end = std::max(end, x.ready);
        }
      }
    }
    if (end > sim.now()) sim::this_process::sleep(end - sim.now());
    if (s + static_cast<std::int64_t>(S) < nsteps) issue(s + static_cast<std::int64_t>(S));  // the slot is free again
    if (w.kb + 1 < P.nk) continue;
    // The tile's last k-block: bias + round on the vector unit, the epilogue's fixed cycles, write back.
    sim::Time epi = sim.now();
    for (std::int64_t r = 0; r < w.rows; ++r) {
      for (std::int64_t c = 0; c < w.cols; ++c) {
        Member& x = mem[static_cast<std::size_t>(r * cn + c)];
        const std::int64_t m0 = (w.bm * cm + r) * P.tm, n0 = (w.bn * cn + c) * P.tn;
        const std::uint64_t ops = static_cast<std::uint64_t>(std::min(P.tm, M - m0) * std::min(P.tn, N - n0));
        const auto [v0, v1] = x.pe->vector().book(sim.now(), ops, C.dtype, tr.enabled() ? &tr : nullptr, "bias+round");
        epi = std::max(epi, v1 + sim::transfer_time(P.g->epilogue_cycles, sim::Bandwidth{x.pe->mac().spec().clock_hz}));
      }
    }
    if (epi > sim.now()) sim::this_process::sleep(epi - sim.now());
    for (std::int64_t r = 0; r < w.rows; ++r) {
      for (std::int64_t c = 0; c < w.cols; ++c) {
        Member& x = mem[static_cast<std::size_t>(r * cn + c)];
        const std::int64_t m0 = (w.bm * cm + r) * P.tm, n0 = (w.bn * cn + c) * P.tn;
        const std::int64_t mt = std::min(P.tm, M - m0), nt = std::min(P.tn, N - n0);
        x.write.wait();  // the C buffer's previous tile has left
        const TileXfer tc = tile_xfer(C, m0, n0, mt, nt, x.c_buf);
        if (P.functional) {
          c_host.resize(tc.dst.bytes());
          VectorView bv;
          if (P.bias) bv = VectorView::contiguous(x.bias_host.data(), P.bias->dtype, nt);
          det_gemm_store(x.acc.data(), P.tn, P.bias ? &bv : nullptr,
                         MutableMatrixView{c_host.data(), C.dtype, mt, nt, tc.view_row_stride, tc.view_col_stride});
          x.pe->tcm().write(tc.dst.addr, bytes(c_host));
          if (sys.faults().armed())
            sys.faults().on_gemm_tile(x.pe->cube(), x.pe->index(), x.pe->tcm(), tc.dst.addr, tc.dst.bytes());
        }
        x.write = sys.start_transfer(x.pe->tcm(), tc.dst, *C.memory, tc.src);
        P.dma_bytes += tc.src.bytes();
        x.ready = sim.now() + sim::transfer_time(P.g->prologue_cycles, sim::Bandwidth{x.pe->mac().spec().clock_hz});
      }
    }
  }
  for (Member& x : mem) x.write.wait();
}

// The kernel a GEMM runs: a tile of pe.gemm.choices (or the one tile), with or without the
// cluster, and its stages; `estimate` is the header's estimate of its time, in seconds.
struct Kernel {
  hw::TileSpec tile;
  std::int64_t cm = 1, cn = 1;
  std::uint64_t stages = 0;
  double estimate = 0;
};

// Picks the kernel as a GPU library's heuristic does: the one whose estimated time (the header's
// "Kernel choice") is least; ties go to the earlier tile, the cluster before none.
Kernel choose_kernel(hw::System& sys, const HbmMatrix& A, const HbmMatrix& B, const HbmVector* bias, const HbmMatrix& C,
                     const std::vector<int>& cubes, const std::vector<hw::Pe*>& pes, bool unaligned, std::uint64_t align) {
  const hw::PeSpec& pe = pes[0]->spec();
  const hw::GemmPipelineSpec& g = pe.gemm;
  const std::int64_t M = A.rows, N = B.cols, K = A.cols;
  const double ea = static_cast<double>(dtype_size(A.dtype)), eb = static_cast<double>(dtype_size(B.dtype));
  const double f = static_cast<double>(pe.mac.clock_hz), macs = pe.mac.rate(A.dtype);
  const double dma = static_cast<double>(pe.dma.read.bytes_per_s);
  hw::Cube& cube = sys.cube(cubes[0]);
  const double hbm_bw = static_cast<double>(cube.hbm().bandwidth().bytes_per_s) * static_cast<double>(cubes.size());
  double latency = static_cast<double>(cube.hbm().latency()) * 1e-12, l2_bw = hbm_bw;
  if (const hw::L2Cache* l2 = cube.l2()) {
    latency += static_cast<double>(l2->latency()) * 1e-12;
    l2_bw = static_cast<double>(l2->spec().bandwidth.bytes_per_s) * static_cast<double>(cubes.size());
  }
  const double unique = static_cast<double>(M * K) * ea + static_cast<double>(K * N) * eb +
                        static_cast<double>(M * N * static_cast<std::int64_t>(dtype_size(C.dtype)));
  const std::int64_t per_cube = static_cast<std::int64_t>(pes.size() / cubes.size());
  const double launch = static_cast<double>(g.launch) * 1e-12;
  std::vector<std::pair<std::int64_t, std::int64_t>> clusters{{g.cluster_m, g.cluster_n}};
  if (g.cluster_m * g.cluster_n > 1) clusters.emplace_back(1, 1);
  Kernel best;
  bool found = false;
  for (const hw::TileSpec& t : g.tiles_for(A.dtype)) {
    const std::uint64_t S = g.stages_for(t, dtype_size(A.dtype), dtype_size(B.dtype), dtype_size(C.dtype),
                                         bias ? dtype_size(bias->dtype) : 0, pes[0]->tcm().capacity());
    if (S == 0) continue;
    const std::int64_t mt = (M + t.m - 1) / t.m, nt = (N + t.n - 1) / t.n;
    const std::int64_t nk = std::max<std::int64_t>((K + t.k - 1) / t.k, 1);
    const double em = static_cast<double>(std::min<std::int64_t>(t.m, M)), en = static_cast<double>(std::min<std::int64_t>(t.n, N));
    const double ek = static_cast<double>(std::min<std::int64_t>(t.k, K));
    const double a_box = em * ek * ea, b_box = ek * en * eb;
    double mma = std::max(std::ceil(static_cast<double>(t.m) * t.n * ek / macs), static_cast<double>(g.issue_cycles_per_k_block));
    if (unaligned) mma = std::max(mma, unaligned_cycles(g, static_cast<double>(t.m) * t.n * ek, a_box + b_box, align));
    for (const auto& [cm, cn] : clusters) {
      const std::int64_t G = per_cube / (cm * cn) * static_cast<std::int64_t>(cubes.size());
      if (G == 0) continue;
      const std::int64_t blocks = (mt + cm - 1) / cm * ((nt + cn - 1) / cn);
      const std::int64_t full = blocks / G, rem = blocks % G;  // full waves, blocks of the last partial one
      const double issued = static_cast<double>(cm) * a_box + static_cast<double>(cn) * b_box;  // per block, k-block
      const double step = std::max({mma / f, issued / static_cast<double>(cm * cn) / dma,
                                    (latency + (a_box + b_box) / dma) / static_cast<double>(S)});
      const double tile = static_cast<double>(g.prologue_cycles + g.epilogue_cycles) / f + static_cast<double>(nk) * step;
      // A wave takes its tiles' time or its blocks' loads through the L2, whichever is longer.
      auto wave = [&](std::int64_t n) { return std::max(tile, static_cast<double>(n * nk) * issued / l2_bw); };
      const double est = launch + std::max(static_cast<double>(full) * wave(G) + (rem ? wave(rem) : 0.0), unique / hbm_bw);
    
      if (!found || est < best.estimate) best = Kernel{t, cm, cn, S, est};
      found = true;
    }
  }
  if (!found) {
    throw std::invalid_argument(fmt::format("sim_pe_gemm: no tile of pe.gemm for {} fits {}'s TCM of {} bytes with its C "
                                            "tile and a stage", dtype_name(A.dtype), pes[0]->name(),
                                            pes[0]->tcm().capacity()));
  }
  return best;
}

// The GPU-like path (the topology's "pe.gemm"): clusters of cm x cn PEs within a cube, blocks of
// cm x cn tiles in the swizzled raster walk, cluster g running blocks g, g + G, ... (see the header).
SimGemmReport run_pipeline(hw::System& sys, const HbmMatrix& A, const HbmMatrix& B, const HbmVector* bias,
                           const HbmMatrix& C, const SimGemmOptions& opts, const std::vector<int>& cubes,
                           const std::vector<hw::Pe*>& pes) {
  const hw::GemmPipelineSpec& g = pes[0]->spec().gemm;
  const std::uint64_t align = std::min({alignment(A), alignment(B), alignment(C)});
  const bool unaligned = g.unaligned_bytes_per_cycle > 0 && align < 16;
  const Kernel kernel = choose_kernel(sys, A, B, bias, C, cubes, pes, unaligned, align);
  const hw::TileSpec& tile = kernel.tile;
  Pipe P{&A, &B, &C, bias, &g, tile.m, tile.n, tile.k, 0, 0, 0, kernel.cm, kernel.cn, 0, 0, 0,
         static_cast<std::size_t>(kernel.stages), sys.options().functional};
  P.numerics = opts.numerics;
  check_numerics(P.numerics, P.tk, A, B);
  P.mtiles = (A.rows + P.tm - 1) / P.tm;
  P.ntiles = (B.cols + P.tn - 1) / P.tn;
  P.nk = std::max<std::int64_t>((A.cols + P.tk - 1) / P.tk, 1);
  P.unaligned = unaligned;
  P.align = align;
  P.mblocks = (P.mtiles + P.cm - 1) / P.cm;
  P.nblocks = (P.ntiles + P.cn - 1) / P.cn;
  const std::uint64_t need =
      P.stages * (static_cast<std::uint64_t>(P.tm * P.tk) * dtype_size(A.dtype) +
                  static_cast<std::uint64_t>(P.tk * P.tn) * dtype_size(B.dtype) +
                  (bias ? static_cast<std::uint64_t>(P.tn) * dtype_size(bias->dtype) : 0)) +
      static_cast<std::uint64_t>(P.tm * P.tn) * dtype_size(C.dtype);
  if (need > pes[0]->tcm().capacity()) {
    throw std::invalid_argument(fmt::format("sim_pe_gemm: {} stages of a {}x{}x{} tile ({} x {} -> {}) need {} bytes of "
                                            "TCM but {} has {}; give fewer pe.gemm.stages or a smaller pe.gemm.tiles.{}",
                                            P.stages, P.tm, P.tn, P.tk, dtype_name(A.dtype), dtype_name(B.dtype),
                                            dtype_name(C.dtype), need, pes[0]->name(), pes[0]->tcm().capacity(),
                                            dtype_name(A.dtype)));
  }
  // Clusters never span cubes: a cube's PEs in order, cm * cn at a time; the rest of a cube idles.
  const std::size_t csize = static_cast<std::size_t>(P.cm * P.cn);
  std::vector<std::vector<hw::Pe*>> clusters;
  for (std::size_t i = 0; i < pes.size();) {
    std::size_t j = i;
    while (j < pes.size() && pes[j]->cube() == pes[i]->cube()) ++j;
    for (std::size_t c = i; c + csize <= j; c += csize) clusters.emplace_back(pes.begin() + c, pes.begin() + c + csize);
    i = j;
  }
  P.clusters = static_cast<std::int64_t>(clusters.size());
  sim::Simulator& sim = sys.simulator();
  const sim::Time t0 = sim.now();
  const std::int64_t nblocks = P.mblocks * P.nblocks;
  if (g.launch > 0) sim::this_process::sleep(g.launch);  // the kernel's launch, before any PE starts
  Workers workers{sim};
  for (std::int64_t c = 0; c < std::min(P.clusters, nblocks); ++c) {
    std::vector<hw::Pe*> members = clusters[static_cast<std::size_t>(c)];
    std::string name = fmt::format("{}/{}", members[0]->name(), opts.label);
    workers.spawn(std::move(name), "gemm cluster done",
                  [&sys, members = std::move(members), c, &P] { run_cluster(sys, members, c, P); });
  }
  workers.wait();

  SimGemmReport r;
  r.time = sim.now() - t0;
  r.pes = static_cast<int>(pes.size());
  r.tile_m = P.tm;
  r.tile_n = P.tn;
  r.tile_k = P.tk;
  r.tiles = P.mtiles * P.ntiles;
  r.clusters = static_cast<int>(P.clusters);
  r.cluster_m = static_cast<int>(P.cm);
  r.cluster_n = static_cast<int>(P.cn);
  r.waves = (nblocks + P.clusters - 1) / P.clusters;
  r.stages = static_cast<int>(P.stages);
  r.estimate = kernel.estimate;
  r.dma_bytes = P.dma_bytes;
  r.multicast_bytes = P.multicast_bytes;
  roofline(r, A, B, bias, C, *pes[0], pes.size());
  return r;
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
  std::vector<sim::Duration> busy0(pes.size());
  for (std::size_t p = 0; p < pes.size(); ++p) busy0[p] = pes[p]->mac().server().busy;
  auto finish = [&](SimGemmReport& r) {  // per-PE idle: the run's time less the MAC array's busy time
    r.pe_idle.resize(pes.size());
    for (std::size_t p = 0; p < pes.size(); ++p) {
      const sim::Duration busy = pes[p]->mac().server().busy - busy0[p];
      r.pe_idle[p] = r.time > busy ? r.time - busy : 0;
    }
  };
  if (pes[0]->spec().gemm.present) {
    SimGemmReport r = run_pipeline(sys, A, B, bias, C, opts, cubes, pes);
    finish(r);
    return r;
  }
  const auto& tile = pes[0]->spec().tile;
  Shared sh{&A, &B, &C, bias, static_cast<std::int64_t>(tile.m), static_cast<std::int64_t>(tile.n),
            static_cast<std::int64_t>(tile.k), 0, 0, sys.options().functional};
  sh.numerics = opts.numerics;
  check_numerics(sh.numerics, sh.tk, A, B);
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
  Workers workers{sim};
  for (std::size_t p = 0; p < pes.size(); ++p) {
    std::vector<std::int64_t> mine;
    for (std::int64_t t = static_cast<std::int64_t>(p); t < ntiles; t += static_cast<std::int64_t>(pes.size())) mine.push_back(t);
    if (mine.empty()) continue;
    hw::Pe* pe = pes[p];
    workers.spawn(fmt::format("{}/{}", pe->name(), opts.label), pe->name() + " " + opts.label + " done",
                  [&sys, pe, mine = std::move(mine), &sh] { run_pe(sys, *pe, mine, sh); });
  }
  workers.wait();

  SimGemmReport r;
  r.time = sim.now() - t0;
  r.pes = static_cast<int>(pes.size());
  r.tile_m = sh.tm;
  r.tile_n = sh.tn;
  r.tile_k = sh.tk;
  roofline(r, A, B, bias, C, *pes[0], pes.size());
  r.dma_bytes = sh.dma_bytes;
  r.tiles = ntiles;
  r.waves = (ntiles + static_cast<std::int64_t>(pes.size()) - 1) / static_cast<std::int64_t>(pes.size());
  finish(r);
  return r;
}

}  // namespace cubesim::kernels
