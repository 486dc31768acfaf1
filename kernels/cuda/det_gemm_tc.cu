// det_gemm_tc.cu — GemmMode::tensor_core: bf16 wgmma with f32 accumulators, TMA loads, sm_90a.
//
// Persistent CTAs (one per SM) walk BM x BN tiles of C. Warpgroup 0 is the producer: one thread (or,
// for the n32 tiles of small M, one in each of its four warps, taking k-tiles in turn) streams 64-wide
// k-tiles of A (BM x 64) and Bᵀ (BN x 64) into a ring of shared-memory stages with
// the bulk tensor copy engine (128-byte swizzle, completion on a "full" mbarrier per stage), running
// ahead into the next tile. Each operand is read in place in either major-ness: k-major (A row-major,
// B = Wᵀ: the forward layer) as one box of rows x 64 k, or MN-major (the backward GEMMs' transposed
// views: dY·W reads W N-major, Xᵀ·dY reads both M- and N-major) as boxes of 64 MN-contiguous elements
// x 64 k rows, which the MMA reads with its transpose flag set. Warpgroups 1..NC are consumers: each owns 64 rows and issues, per k-tile,
// four wgmma m64nBNk16 in ascending k, then frees the stage on its "empty" mbarrier; the epilogue adds
// the bias, rounds, writes the tile into swizzled staging chunks (stmatrix for 2-byte outputs) and
// hands them to TMA stores that overlap the next tile.
// m128n256_c2 runs the same in clusters of 2 CTAs along M that multicast halves of the B tile.
// m128n224(_c2) tiles cover N = 3584 in whole waves; m224n128_c2 computes Cᵀ = Bᵀ·Aᵀ in m128n224
// tiles (M = 3584 in whole waves) and stores each tile transposed (stmatrix .trans).
// Ping-pong configurations (m64n256_pp, _c2) give each of the two consumers whole m64n256 tiles in
// turn (tile p of a CTA's sequence to consumer p % 2, stage ring unchanged): a named-barrier handshake
// lets one consumer's MMAs start once the other has issued all of its tile's, so one's epilogue runs
// under the other's mainloop. The arithmetic of an element is the same as in every other tile.
// Launches are programmatic dependent launches: a CTA may start while the stream's previous kernel
// drains, and touches no global memory before griddepcontrol.wait says that kernel is complete.
//
// Why a row of C does not depend on M, the tile configuration, or the other rows:
//  - every element's accumulator starts at 0.0f in a register and receives the same sequence of
//    k16 MMAs: k = 0..15, 16..31, ... up to ceil(K/64)*64 (TMA fills k >= K with zeros, and does so
//    identically for every configuration, since BK = 64 is fixed), issued in order on one
//    accumulator (wgmma on the same registers completes in issue order);
//  - the MMA computes each output element from its own row of A, column of B and accumulator only;
//    M and the tile choose which rows share an instruction and how many columns it spans (n32..n256),
//    never the arithmetic of an element. That the n width leaves an element's bits alone is a property
//    of the hardware we rely on and pin with a test: every configuration is compared bit for bit;
//  - no split-K, no atomics, no reduction across threads: one thread writes each element, once;
//  - an operand's major-ness changes where its elements sit in shared memory, not which elements
//    meet in which k16 MMA (pinned by a test: every layout against every other, bit for bit);
//  - m224n128_c2 swaps the operands' roles (element (i, j) is Cᵀ's (j, i): the same products
//    a[i][k]·b[k][j], exact in f32, meeting in the same k16 MMAs); that the MMA's sum of a k16 group
//    does not depend on which operand is A is again a hardware property, pinned by the same tests.
// Rows past M and columns past N read TMA's zero fill (or, for k-major A with M < BM, whatever the
// stage held before: the A box is M rows) and are never stored.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/det_gemm_cuda_internal.h"
#include "kernels/cuda/dtype_cuda.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace cubesim::cuda::detail {

int num_sms() {
  // Cached per device: this runs on every tensor-core call, some of which take microseconds.
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
  int n = dev < 64 ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    CUBESIM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

namespace {

constexpr int BK = 64;  // one 128-byte swizzle row of bf16: fixed for every configuration

// Cooperative (PINGPONG false): NC consumer warpgroups share one tile of BM = 64*NC rows, 64 rows
// each. Ping-pong: two consumer warpgroups take turns, each owning whole tiles of BM = 64 rows: tile p
// of a CTA's sequence goes to consumer p % 2, and while one runs its epilogue the other runs its MMAs
// (an ordering barrier hands the tensor cores over).
template <int NC_, int BN_, int STAGES_, int CLUSTER_ = 1, bool PINGPONG_ = false, bool TRANS_ = false>
struct Cfg {
  // TRANS: the kernel computes Cᵀ = Bᵀ·Aᵀ (the host swaps the operands; its M, N are C's N, M) and
  // the epilogue writes each tile transposed into C (stmatrix .trans, TMA boxes of C's own layout).
  static constexpr bool TRANS = TRANS_;
  static constexpr int NC = NC_;  // consumer warpgroups
  static constexpr bool PINGPONG = PINGPONG_;
  static_assert(!PINGPONG || NC_ == 2, "ping-pong alternates two consumers");
  static constexpr int BM = PINGPONG ? 64 : 64 * NC_;  // rows of a CTA's tile (one stage's A)
  static constexpr int BN = BN_;
  static constexpr int STAGES = STAGES_;
  // CTAs of a cluster along M: they work on vertically adjacent tiles with the same B panel, each
  // loads 1/CLUSTER of the B tile and multicasts it to all, so each pulls less from L2.
  static constexpr int CLUSTER = CLUSTER_;
  static constexpr int B_ROWS_PER_CTA = BN_ / CLUSTER_;
  // An N-major B tile is boxes of B_MN_BOX columns x 64 k rows: 64 (128-byte rows, 128-byte
  // swizzle), or 32 (64-byte rows, 64-byte swizzle) for the n32 tiles and for BN = 224 (7 boxes).
  // In a cluster, CTA r loads boxes r, r + CLUSTER, ... and multicasts each to all.
  static constexpr int B_MN_BOX = (BN_ % 64 == 0 && B_ROWS_PER_CTA >= 64) ? 64 : 32;
  static_assert(BN_ % B_MN_BOX == 0, "whole N-major boxes (expect_tx counts the whole tile)");
  static_assert(B_ROWS_PER_CTA * BK * 2 % 1024 == 0, "multicast slices must stay swizzle-atom aligned");
  static constexpr int A_BYTES = BM * BK * 2;
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int THREADS = 128 * (NC_ + 1);
  // Producer threads (one a warp of warpgroup 0), taking k-tiles in turn. One thread issuing every
  // load is the limit of the m64n32 tile: its loop (empty-barrier wait, expect_tx, two TMA issues
  // with their uniform-register set-up) takes ~350 clocks a k-tile while the MMAs need ~100, so the
  // consumer waited on data with the ring never full, whatever its depth (8-18 stages measured the
  // same). Four take M <= 64 at N = K = 4096 from 14.6 to 13.6 us (H200). The large tiles' k-tiles
  // take ~1000 clocks of MMAs: one producer, as before.
  static constexpr int PRODUCERS = BN_ <= 32 ? 4 : 1;
  // Consumer warpgroups that read (and free) each stage: all of them, or one in ping-pong.
  static constexpr int STAGE_READERS = PINGPONG ? 1 : NC_;
  // Output staging for the TMA-store epilogue, per consumer warpgroup: two buffers of 64 rows x 128
  // bytes (one column chunk, 128-byte swizzled like the TMA box). Configurations with BN >= 64 only.
  static constexpr bool TMA_EPILOGUE = BN_ >= 64;
  static constexpr int EPI_CHUNK_BYTES = 64 * 128;
  // A 2-byte output's staging chunk: 64 columns of 128-byte rows, or 32 of 64 bytes where BN is not
  // a multiple of 64 (BN = 224: 7 chunks). f32 outputs: 32 columns of 128 bytes.
  static constexpr int EPI_ROW_BYTES_B16 = BN_ % 64 == 0 ? 128 : 64;
  static constexpr int EPI_BYTES = TMA_EPILOGUE ? 2 * EPI_CHUNK_BYTES : 0;
  static constexpr int SMEM = STAGES * STAGE_BYTES + NC_ * EPI_BYTES + 2 * STAGES * 8 + 1024;  // + barriers, alignment
  static_assert(SMEM <= 232448, "more shared memory than an SM has");
  static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "stages must stay 1024-byte aligned (swizzle atom)");
};

using CfgL = Cfg<2, 256, 4>;      // m128n256
using CfgL2 = Cfg<2, 256, 4, 2>;  // m128n256_c2: clusters of 2 along M sharing B
// m128n224: N = 3584 (tp 4's ffn) is 16 n-tiles: 512 tiles, 3.9 waves on 132 SMs, where n256's 448
// are 3.4 waves run in 4. 4 stages of 44 KB.
using CfgL224 = Cfg<2, 224, 4>;
using CfgL224c2 = Cfg<2, 224, 4, 2>;  // m128n224_c2
// m224n128_c2: m128n224_c2 on the transposed problem, for M = 3584 (tp 4's column wgrad, 3584 x 4096):
// 16 x 32 tiles of Cᵀ, 4 waves, against 448 m128n256 tiles.
using CfgT224c2 = Cfg<2, 224, 4, 2, false, true>;

using CfgM = Cfg<2, 128, 6>;   // m128n128
using CfgS = Cfg<1, 32, 16>;   // m64n32
using CfgS2 = Cfg<2, 32, 11>;  // m128n32: M = 65..128 with N / 32 CTAs, B read once for both halves

// Ping-pong: each consumer owns whole m64n256 tiles (4 stages of 40 KB).
using CfgPW = Cfg<2, 256, 4, 1, true>;   // m64n256_pp
using CfgPW2 = Cfg<2, 256, 4, 2, true>;  // m64n256_pp_c2: clusters of 2 along M sharing B

struct Epi {
  void* c;
  std::int64_t c_rs, c_cs;
  const void* bias;
  std::int64_t bias_stride;
  int M, N, K;
  DType c_dtype, bias_dtype;
  int tma_store;         // C has unit column stride and 16-byte aligned rows: the TMA-store epilogue
  std::uint32_t stage_tx;  // bytes a stage's loads deliver (k-major A: a box of min(BM, M) rows)
  int group_m;  // tile raster: this many m-tiles walk the n-tiles together (L2 reuse)
};

// ---- PTX wrappers --------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_load_2d_multicast(std::uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                                      std::uint32_t bar, std::uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      ::"r"(dst), "l"(reinterpret_cast<std::uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

__device__ __forceinline__ std::uint32_t cluster_ctarank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Arrive on the mbarrier at the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ void mbar_arrive_cluster(std::uint32_t bar, std::uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar), "r"(rank)
      : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void tma_load_2d(std::uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      ::"r"(dst), "l"(reinterpret_cast<std::uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// Matrix descriptor of a k-major operand tile in shared memory, 128-byte swizzle: rows of 128 bytes,
// 8-row swizzle atoms 1024 bytes apart (the stride byte offset); the leading byte offset is unused
// for swizzled k-major layouts. Moving along k inside the 128-byte row moves the start address.
__device__ __forceinline__ std::uint64_t smem_desc(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<std::uint64_t>(1) << 16) |
         (static_cast<std::uint64_t>(1024 >> 4) << 32) | (static_cast<std::uint64_t>(1) << 62);
}

// Matrix descriptor of an MN-major operand tile: TMA boxes of ROW_BYTES / 2 MN-contiguous elements x
// 64 k rows, one after another. In the MMA's canonical MN-major layout a swizzle atom is 8 k rows of
// one box (the stride byte offset: 8 x ROW_BYTES from one 8-k group to the next) and the next
// ROW_BYTES / 2 elements along MN are the next box (the leading byte offset: 64 x ROW_BYTES). A k16
// step moves the start address 16 rows. ROW_BYTES 128: 128-byte swizzle; 64: 64-byte swizzle.
template <int ROW_BYTES>
__device__ __forceinline__ std::uint64_t smem_desc_mn(std::uint32_t addr) {
  static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "128- or 64-byte swizzle");
  constexpr std::uint64_t lbo = 64 * ROW_BYTES, sbo = 8 * ROW_BYTES, mode = ROW_BYTES == 128 ? 1 : 2;
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}

// ---- epilogue ------------------------------------------------------------------------------------

template <DType TC>
__device__ __forceinline__ void store_pair(const Epi& e, int m, int n, float v0, float v1) {
  if (e.bias) {
    v0 = __fadd_rn(v0, load_elem_rt(e.bias, e.bias_dtype, n * e.bias_stride));
    if (n + 1 < e.N) v1 = __fadd_rn(v1, load_elem_rt(e.bias, e.bias_dtype, (n + 1) * e.bias_stride));
  }
  const std::int64_t off = static_cast<std::int64_t>(m) * e.c_rs + static_cast<std::int64_t>(n) * e.c_cs;
  using T = typename Storage<TC>::type;
  T* p = static_cast<T*>(e.c) + off;
  const bool pair = e.c_cs == 1 && n + 1 < e.N && (reinterpret_cast<std::uintptr_t>(p) % (2 * sizeof(T))) == 0;
  if constexpr (TC == DType::f32) {
    if (pair) { *reinterpret_cast<float2*>(p) = make_float2(v0, v1); return; }
    p[0] = v0;
    if (n + 1 < e.N) p[e.c_cs] = v1;
  } else if constexpr (TC == DType::bf16) {
    if (pair) { *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1); return; }
    p[0] = __float2bfloat16_rn(v0);
    if (n + 1 < e.N) p[e.c_cs] = __float2bfloat16_rn(v1);
  } else {
    if (pair) { *reinterpret_cast<__half2*>(p) = __floats2half2_rn(v0, v1); return; }
    p[0] = __float2half_rn(v0);
    if (n + 1 < e.N) p[e.c_cs] = __float2half_rn(v1);
  }
}

template <DType TC, int BN>
__device__ __forceinline__ void epilogue(const Epi& e, const float (&acc)[BN / 2], int row0, int col0) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = row0 + warp * 16 + lane / 4 + 8 * h;
      const int n = col0 + 8 * j + 2 * (lane % 4);
      if (m < e.M && n < e.N) store_pair<TC>(e, m, n, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
}

// The warpgroup's staged 64-row x 128-byte chunk at shared address `src` to global memory by one
// TMA store at coordinates (c0, c1) of `map`, once every thread's shared stores are visible to the
// copy engine (the three TMA-storing epilogues end each chunk with it).
__device__ __forceinline__ void tma_store_staged(const CUtensorMap* map, int c0, int c1, std::uint32_t src, int cw,
                                                 int t) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the copy engine
  asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
  if (t == 0) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
        "cp.async.bulk.commit_group;" ::"l"(reinterpret_cast<std::uint64_t>(map)),
        "r"(c0), "r"(c1), "r"(src)
        : "memory");
  }
}

// The same values as `epilogue`, stored by the copy engine: the warpgroup writes one 64 x 128-byte
// column chunk of its rows into a swizzled shared buffer, one thread hands it to a TMA store
// (bounds-clipped at M and N), and the warpgroup moves on. Two buffers alternate, so the stores of
// one tile overlap the mainloop of the next; a buffer is rewritten only after its previous store has
// read it (cp.async.bulk.wait_group.read). `chunk` counts this warpgroup's chunks across tiles.
template <DType TC, int BN>
__device__ __forceinline__ void epilogue_tma(const Epi& e, const float (&acc)[BN / 2], int row0, int col0,
                                             std::uint8_t* bufs, std::uint32_t bufs_smem, const CUtensorMap* map,
                                             int cw, int& chunk) {
  using T = typename Storage<TC>::type;
  constexpr int ES = sizeof(T);
  constexpr int CW = 128 / ES;  // columns in a chunk
  static_assert(BN % CW == 0, "whole chunks");
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
#pragma unroll
  for (int ch = 0; ch < BN / CW; ++ch, ++chunk) {
    const int b = chunk & 1;
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");  // buffer b's last store has read it
    asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
    std::uint8_t* buf = bufs + b * (64 * 128);
#pragma unroll
    for (int jj = 0; jj < CW / 8; ++jj) {
      const int j = ch * (CW / 8) + jj;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp * 16 + lane / 4 + 8 * h, cl = 8 * jj + 2 * (lane % 4);
        const int n = col0 + ch * CW + cl;
        float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        if (e.bias) {
          if (n < e.N) v0 = __fadd_rn(v0, load_elem_rt(e.bias, e.bias_dtype, n * e.bias_stride));
          if (n + 1 < e.N) v1 = __fadd_rn(v1, load_elem_rt(e.bias, e.bias_dtype, (n + 1) * e.bias_stride));
        }
        const int byte = cl * ES;  // within the 128-byte row; 16-byte units swizzled by row % 8
        std::uint8_t* p = buf + r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
        if constexpr (TC == DType::f32) {
          *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
        } else if constexpr (TC == DType::bf16) {
          *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
        } else {
          *reinterpret_cast<__half2*>(p) = __floats2half2_rn(v0, v1);
        }
      }
    }
    tma_store_staged(map, col0 + ch * CW, row0, bufs_smem + b * (64 * 128), cw, t);
  }
}

// The same values as `epilogue_tma` for 2-byte outputs, written to the staging buffer with stmatrix:
// a warp's 16 rows x 16 bytes of four 8 x 8 matrices per instruction, 4x fewer shared stores (and
// address computations) than 4-byte stores, and with the bias test outside the loop: one straight run
// of code with no branches. The epilogue's cost had been instruction fetch, not shared memory: ncu's
// warp samples put 10% of the consumers' time in the old epilogue (4-byte stores, a bias branch per
// pair, ~750 instructions a warp a tile run once each), half of it `no_inst` (H100, 4096x14336x4096).
// Rounding and bias are those of `epilogue_tma` (the same __fadd_rn, the same RNE pair conversion).
// pk for matrix (j, h) is rows warp*16 + 8h + 0..7, columns 8j..8j+7 of the tile in the fragment layout
// stmatrix takes (thread l: row l / 4, columns 2 (l % 4), +1), i.e. acc[4j + 2h], acc[4j + 2h + 1].
// Lane l gives row l % 8 of matrix l / 8 of each x4. ROWB: the chunk's row in bytes, 128 (64 columns,
// 128-byte swizzle: unit u of row r at u ^ (r % 8)) or 64 (32 columns, for BN = 224; 64-byte swizzle:
// unit u at u ^ ((r / 2) % 4)), matching the C tensor map's box and swizzle.
template <DType TC, int BN, int ROWB, bool BIAS>
__device__ __forceinline__ void epilogue_tma_b16(const Epi& e, const float (&acc)[BN / 2], int row0, int col0,
                                                 std::uint32_t bufs_smem, const CUtensorMap* map, int cw, int& chunk) {
  static_assert(TC == DType::bf16 || TC == DType::f16, "2-byte outputs");
  static_assert(ROWB == 128 || ROWB == 64, "128- or 64-byte chunk rows");
  constexpr int CW = ROWB / 2;  // columns in a chunk
  constexpr int JC = CW / 8;    // 8-column groups in a chunk
  static_assert(BN % CW == 0, "whole chunks");
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int mi = lane / 8, rr = lane % 8;
  const int r = warp * 16 + 8 * (mi % 2) + rr;  // the row this lane addresses
  const int sw = ROWB == 128 ? (r % 8) : ((r / 2) % 4);
  const std::uint32_t row_off = static_cast<std::uint32_t>(r * ROWB);
#pragma unroll
  for (int ch = 0; ch < BN / CW; ++ch, ++chunk) {
    const int b = chunk & 1;
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");  // buffer b's last store has read it
    asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
    const std::uint32_t buf = bufs_smem + b * (64 * 128) + row_off;
#pragma unroll
    for (int q = 0; q < JC / 2; ++q) {
      std::uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int j = ch * JC + 2 * q + k / 2, h = k % 2;
        float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        if constexpr (BIAS) {
          const int n = col0 + 8 * j + 2 * (lane % 4);
          if (n < e.N) v0 = __fadd_rn(v0, load_elem_rt(e.bias, e.bias_dtype, n * e.bias_stride));
          if (n + 1 < e.N) v1 = __fadd_rn(v1, load_elem_rt(e.bias, e.bias_dtype, (n + 1) * e.bias_stride));
        }
        if constexpr (TC == DType::bf16) {
          const __nv_bfloat162 x = __floats2bfloat162_rn(v0, v1);
          std::memcpy(&w[k], &x, 4);
        } else {
          const __half2 x = __floats2half2_rn(v0, v1);
          std::memcpy(&w[k], &x, 4);
        }
      }
      const int u = 2 * q + mi / 2;  // the 16-byte unit of this lane's matrix row
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(buf + ((u ^ sw) * 16)),
                   "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
    tma_store_staged(map, col0 + ch * CW, row0, bufs_smem + b * (64 * 128), cw, t);
  }
}

// TRANS epilogues: the kernel's tile is of Cᵀ (rows i = C's columns, columns j = C's rows) and the
// bias is per row of Cᵀ. Values and rounding are those of the other epilogues, element for element.
// Element stores (f32 outputs, or rows TMA cannot store): Cᵀ(i, j) at i * c_rs + j * c_cs.
template <DType TC, int BN>
__device__ __forceinline__ void epilogue_trans(const Epi& e, const float (&acc)[BN / 2], int row0, int col0) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  using T = typename Storage<TC>::type;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = row0 + warp * 16 + lane / 4 + 8 * h;
    if (i >= e.M) continue;
    const float bi = e.bias ? load_elem_rt(e.bias, e.bias_dtype, i * e.bias_stride) : 0.0f;
#pragma unroll
    for (int j8 = 0; j8 < BN / 8; ++j8) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = col0 + 8 * j8 + 2 * (lane % 4) + x;
        if (j >= e.N) continue;
        float v = acc[4 * j8 + 2 * h + x];
        if (e.bias) v = __fadd_rn(v, bi);
        T* p = static_cast<T*>(e.c) + static_cast<std::int64_t>(i) * e.c_rs + static_cast<std::int64_t>(j) * e.c_cs;
        if constexpr (TC == DType::f32) *p = v;
        else if constexpr (TC == DType::bf16) *p = __float2bfloat16_rn(v);
        else *p = __float2half_rn(v);
      }
    }
  }
}

// 2-byte outputs through TMA: stmatrix .trans writes each 8 x 8 fragment matrix transposed, so a
// staging row is one row of C (a column of Cᵀ) holding 8 consecutive C columns per 16-byte unit. A
// chunk is 32 rows of C (4 column groups j of Cᵀ) x 64 columns of C (this consumer's 64 rows of Cᵀ),
// 128-byte rows with the 128-byte swizzle (unit u of row r at u ^ (r % 8)); 7 chunks for BN = 224.
// Warp w's matrix (j, h) holds Cᵀ rows 16w + 8h + 0..7: staging unit 2w + h of rows 8j + 0..7.
template <DType TC, int BN, bool BIAS>
__device__ __forceinline__ void epilogue_tma_b16_trans(const Epi& e, const float (&acc)[BN / 2], int row0, int col0,
                                                       std::uint32_t bufs_smem, const CUtensorMap* map, int cw,
                                                       int& chunk) {
  static_assert(TC == DType::bf16 || TC == DType::f16, "2-byte outputs");
  constexpr int CR = 32;  // C rows (Cᵀ columns) in a chunk
  static_assert(BN % CR == 0, "whole chunks");
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int mi = lane / 8, rr = lane % 8;
  const int u = 2 * warp + (mi % 2);  // the 16-byte unit (8 C columns) of this lane's matrix
  float bias_h[2] = {0.0f, 0.0f};
  if constexpr (BIAS) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = row0 + warp * 16 + lane / 4 + 8 * h;
      if (i < e.M) bias_h[h] = load_elem_rt(e.bias, e.bias_dtype, i * e.bias_stride);
    }
  }
#pragma unroll
  for (int ch = 0; ch < BN / CR; ++ch, ++chunk) {
    const int b = chunk & 1;
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");  // buffer b's last store has read it
    asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
    const std::uint32_t buf = bufs_smem + b * (64 * 128);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      std::uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int j = ch * (CR / 8) + 2 * q + k / 2, h = k % 2;
        float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        if constexpr (BIAS) {
          const int i = row0 + warp * 16 + lane / 4 + 8 * h;
          if (i < e.M) {
            v0 = __fadd_rn(v0, bias_h[h]);
            v1 = __fadd_rn(v1, bias_h[h]);
          }
        }
        if constexpr (TC == DType::bf16) {
          const __nv_bfloat162 x = __floats2bfloat162_rn(v0, v1);
          std::memcpy(&w[k], &x, 4);
        } else {
          const __half2 x = __floats2half2_rn(v0, v1);
          std::memcpy(&w[k], &x, 4);
        }
      }
      const int r = 8 * (2 * q + mi / 2) + rr;  // staging row (C row within the chunk) this lane addresses
      asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                       buf + r * 128 + ((u ^ rr) * 16)),
                   "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
    // C column row0 (this consumer's Cᵀ rows), C row col0 + 32 ch.
    tma_store_staged(map, row0, col0 + ch * CR, bufs_smem + b * (64 * 128), cw, t);
  }
}

// ---- the kernel ----------------------------------------------------------------------------------

// AMN / BMN: A is M-major / Bᵀ is N-major in global memory (otherwise k-major).
template <class C, bool AMN, bool BMN>
__global__ void __launch_bounds__(C::THREADS, 1)
    tc_gemm_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                   const __grid_constant__ CUtensorMap tma_c, const Epi e) {
  extern __shared__ std::uint8_t smem_raw[];
  const std::uint32_t raw = smem_addr(smem_raw);
  const std::uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle atom needs 1024-byte alignment
  const std::uint32_t sa = base, sb = base + C::STAGES * C::A_BYTES;
  const std::uint32_t epi = sb + C::STAGES * C::B_BYTES;  // C::NC staging buffers
  const std::uint32_t bars = epi + C::NC * C::EPI_BYTES;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (C::STAGES + s); };

  constexpr int CM = C::CLUSTER;
  const std::uint32_t rank = CM > 1 ? cluster_ctarank() : 0;
  const int m_tiles = (e.M + C::BM - 1) / C::BM, n_tiles = (e.N + C::BN - 1) / C::BN;
  // A unit is CM vertically adjacent tiles with one n-tile: one per cluster at a time. With an odd
  // tile count the last unit's extra CTA reads TMA's zero fill and stores nothing (rows >= M).
  const int m_units = (m_tiles + CM - 1) / CM;
  const int units = m_units * n_tiles;
  const int ktiles = (e.K + BK - 1) / BK;
  // Raster: groups of group_m units walk the n-tiles together, so the clusters working at the
  // same time share A and B panels in L2.
  auto unit_coords = [&](int unit, int& m_tile, int& n_tile) {
    const int per_group = e.group_m * n_tiles;
    const int g = unit / per_group, first_m = g * e.group_m;
    const int gsize = min(m_units - first_m, e.group_m);
    m_tile = (first_m + (unit % per_group) % gsize) * CM + static_cast<int>(rank);
    n_tile = (unit % per_group) / gsize;
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(full(s), 1);                // the producer's arrive.expect_tx; TMA completes the bytes
      mbar_init(empty(s), CM * C::STAGE_READERS * 4);  // one arrival per reading consumer warp of every CTA of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  // Every CTA's barriers exist before any peer multicasts into them or arrives on them.
  if constexpr (CM > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  // Programmatic dependent launch (the host sets the attribute): past the wait, the kernel before
  // this one in the stream has completed and its writes are visible, so no global memory (A, B, C,
  // bias) is touched before it; only the barrier set-up above overlaps that kernel's tail. The
  // trigger lets the next kernel of the stream, if launched the same way, be scheduled as this
  // one's CTAs leave (it waits for this grid's completion in the same way before reading C).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  // Persistent: cluster c takes units c, c + clusters, ...; one ring of stages runs across units,
  // so the producer fills the next tile's first stages while the consumers store the last one.
  const int cluster_id = blockIdx.x / CM, clusters = gridDim.x / CM;
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    if constexpr (C::NC >= 2) setmaxnreg_dec<40>();
    // C::PRODUCERS threads, one in each of as many warps: warp pw fills the stages of the k-tiles
    // it with it % PRODUCERS == pw. A warp waits on a stage's empty barrier by parity; it is never
    // two phases ahead of the consumers because its previous k-tile (it - PRODUCERS) waited for
    // k-tile it - PRODUCERS - STAGES to be consumed, which is past round it / STAGES - 2 of every
    // stage when STAGES >= PRODUCERS.
    constexpr int PRODUCERS = C::PRODUCERS;
    static_assert(C::STAGES >= PRODUCERS && (PRODUCERS & (PRODUCERS - 1)) == 0, "producers: a power of 2, <= stages");
    const int pw = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0 && pw < PRODUCERS) {
      if (pw == 0) {
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&tma_a)) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&tma_b)) : "memory");
      }
      int it0 = 0;  // the first k-tile of this unit in the CTA's sequence
      for (int unit = cluster_id; unit < units; unit += clusters, it0 += ktiles) {
        int m_tile, n_tile;
        unit_coords(unit, m_tile, n_tile);
        for (int kt = (pw - it0) & (PRODUCERS - 1); kt < ktiles; kt += PRODUCERS) {
          const int it = it0 + kt;
          const int s = it % C::STAGES;
          // Free in every CTA of the cluster (the empty barrier counts all their consumers), since
          // this CTA's slice of B lands in all of them.
          if (it >= C::STAGES) mbar_wait(empty(s), ((it / C::STAGES) + 1) & 1);
          mbar_expect_tx(full(s), e.stage_tx);  // whole boxes (zero fill counts), all B slices
          if constexpr (AMN) {
#pragma unroll
            for (int j = 0; j < C::BM / 64; ++j)
              tma_load_2d(sa + s * C::A_BYTES + j * 64 * 128, &tma_a, m_tile * C::BM + j * 64, kt * BK, full(s));
          } else {
            tma_load_2d(sa + s * C::A_BYTES, &tma_a, kt * BK, m_tile * C::BM, full(s));
          }
          // This CTA's slice of the B tile: B_ROWS_PER_CTA columns (all of them without a cluster).
          const std::uint32_t b_dst = sb + s * C::B_BYTES + rank * C::B_ROWS_PER_CTA * BK * 2;
          const int n0 = n_tile * C::BN + static_cast<int>(rank) * C::B_ROWS_PER_CTA;
          constexpr std::uint16_t mask = static_cast<std::uint16_t>((1u << CM) - 1);
          if constexpr (BMN) {
            // Boxes rank, rank + CM, ... of the tile's BN / box (all of them without a cluster).
            constexpr int box = C::B_MN_BOX;
            const std::uint32_t b_tile = sb + s * C::B_BYTES;
#pragma unroll
            for (int j0 = 0; j0 < C::BN / box; j0 += CM) {
              const int j = j0 + static_cast<int>(rank);
              if (j >= C::BN / box) break;
              if constexpr (CM > 1) {
                tma_load_2d_multicast(b_tile + j * box * BK * 2, &tma_b, n_tile * C::BN + j * box, kt * BK, full(s),
                                      mask);
              } else {
                tma_load_2d(b_tile + j * box * BK * 2, &tma_b, n_tile * C::BN + j * box, kt * BK, full(s));
              }
            }
          } else if constexpr (CM > 1) {
            tma_load_2d_multicast(b_dst, &tma_b, kt * BK, n0, full(s), mask);
          } else {
            tma_load_2d(b_dst, &tma_b, kt * BK, n0, full(s));
          }
        }
      }
    }
    __syncwarp();
  } else {
    if constexpr (C::NC >= 2) setmaxnreg_inc<232>();
    const int cw = wg - 1;  // consumer index: its 64 rows of the tile, or (ping-pong) its tiles
    const int lane = threadIdx.x % 32;
    auto release = [&](int s) {
      if (lane != 0) return;
      mbar_arrive(empty(s));
      if constexpr (CM > 1) {
#pragma unroll
        for (int r = 1; r < CM; ++r) mbar_arrive_cluster(empty(s), (rank + r) % CM);
      }
    };
    // Cooperative: every consumer walks every unit of this cluster. Ping-pong: consumer cw takes the
    // units p = cw, cw + 2, ... of the cluster's sequence, whose stages start at p * ktiles.
    constexpr int PSTEP = C::PINGPONG ? 2 : 1;
    int chunk = 0;
    for (int p = C::PINGPONG ? cw : 0;; p += PSTEP) {
      const long long unit_ll = cluster_id + static_cast<long long>(p) * clusters;
      if (unit_ll >= units) break;
      const int unit = static_cast<int>(unit_ll);
      int m_tile, n_tile;
      unit_coords(unit, m_tile, n_tile);
      int it = p * ktiles;
      float acc[C::BN / 2];
#pragma unroll
      for (int i = 0; i < C::BN / 2; ++i) acc[i] = 0.0f;

      // Ping-pong: the MMAs of tile p start after consumer (p - 1) % 2 has issued all of tile p - 1's
      // (named barrier 3 + cw: the other consumer arrives, this one waits; 256 threads).
      if constexpr (C::PINGPONG) {
        if (p > 0) asm volatile("bar.sync %0, 256;" ::"r"(3 + cw) : "memory");
      }
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % C::STAGES;
        mbar_wait(full(s), (it / C::STAGES) & 1);
        const std::uint32_t a_tile = sa + s * C::A_BYTES + (C::PINGPONG ? 0 : cw * 64 * 128);
        const std::uint32_t b_tile = sb + s * C::B_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          // k-major: the next 16 k are 32 bytes along the row; MN-major: 16 rows further on.
          std::uint64_t da, db;
          if constexpr (AMN) da = smem_desc_mn<128>(a_tile + kk * 16 * 128);
          else da = smem_desc(a_tile + kk * 32);
          if constexpr (BMN) db = smem_desc_mn<C::B_MN_BOX * 2>(b_tile + kk * 16 * C::B_MN_BOX * 2);
          else db = smem_desc(b_tile + kk * 32);
          Wgmma<C::BN>::template mma<AMN ? 1 : 0, BMN ? 1 : 0>(acc, da, db);
        }
        wgmma_commit();
        // Keep this k-tile's MMAs in flight; the previous k-tile's are done, so free its stage.
        wgmma_wait<1>();
        if (kt > 0) release((it - 1) % C::STAGES);
      }
      if constexpr (C::PINGPONG) {
        // All of this tile's MMAs are issued: the other consumer's next tile may start its own.
        if (cluster_id + static_cast<long long>(p + 1) * clusters < units)
          asm volatile("bar.arrive %0, 256;" ::"r"(3 + (1 - cw)) : "memory");
      }
      wgmma_wait<0>();
      release((it - 1) % C::STAGES);

      // Cooperative: this consumer's 64 rows of the tile; ping-pong: the whole (64-row) tile.
      const int row0 = m_tile * C::BM + (C::PINGPONG ? 0 : cw * 64), col0 = n_tile * C::BN;
      if constexpr (C::TRANS) {
        const std::uint32_t bs = epi + cw * C::EPI_BYTES;
        switch (e.c_dtype) {
          case DType::f32: epilogue_trans<DType::f32, C::BN>(e, acc, row0, col0); break;
          case DType::bf16:
            if (!e.tma_store) epilogue_trans<DType::bf16, C::BN>(e, acc, row0, col0);
            else if (e.bias) epilogue_tma_b16_trans<DType::bf16, C::BN, true>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
            else epilogue_tma_b16_trans<DType::bf16, C::BN, false>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
            break;
          case DType::f16:
            if (!e.tma_store) epilogue_trans<DType::f16, C::BN>(e, acc, row0, col0);
            else if (e.bias) epilogue_tma_b16_trans<DType::f16, C::BN, true>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
            else epilogue_tma_b16_trans<DType::f16, C::BN, false>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
            break;
        }
        continue;
      }
      if constexpr (C::TMA_EPILOGUE) {
        if (e.tma_store) {
          const std::uint32_t bs = epi + cw * C::EPI_BYTES;
          std::uint8_t* bp = smem_raw + (bs - raw);
          constexpr int RB = C::EPI_ROW_BYTES_B16;
          switch (e.c_dtype) {
            case DType::f32: epilogue_tma<DType::f32, C::BN>(e, acc, row0, col0, bp, bs, &tma_c, cw, chunk); break;
            case DType::bf16:
              if (e.bias) epilogue_tma_b16<DType::bf16, C::BN, RB, true>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
              else epilogue_tma_b16<DType::bf16, C::BN, RB, false>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
              break;
            case DType::f16:
              if (e.bias) epilogue_tma_b16<DType::f16, C::BN, RB, true>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
              else epilogue_tma_b16<DType::f16, C::BN, RB, false>(e, acc, row0, col0, bs, &tma_c, cw, chunk);
              break;
          }
          continue;
        }
      }
      switch (e.c_dtype) {
        case DType::f32: epilogue<DType::f32, C::BN>(e, acc, row0, col0); break;
        case DType::bf16: epilogue<DType::bf16, C::BN>(e, acc, row0, col0); break;
        case DType::f16: epilogue<DType::f16, C::BN>(e, acc, row0, col0); break;
      }
    }
    // The last TMA stores must have read shared memory (and be on their way) before the CTA leaves.
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  // No CTA leaves while a peer may still multicast into its shared memory or arrive on its barriers.
  if constexpr (CM > 1) cluster_sync();
}

// ---- host side -----------------------------------------------------------------------------------

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_fn() {
  static EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUBESIM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || p == nullptr)
      throw CudaError(cudaErrorSymbolNotFound, "cuTensorMapEncodeTiled: driver entry point not found");
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// rows x k bf16, k contiguous, row stride ld elements; boxes of box_rows x 64.
CUtensorMap make_map(const void* ptr, std::int64_t rows, std::int64_t k, std::int64_t ld, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {BK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
                                 box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError(cudaErrorInvalidValue, "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) +
                                               ") for a " + std::to_string(rows) + " x " + std::to_string(k) +
                                               " bf16 operand with row stride " + std::to_string(ld));
  return map;
}

// MN-major: element (i, k) of an MN extent x k operand at ptr + k*ld + i (i contiguous); boxes of box
// MN elements x 64 k rows, box*2-byte rows with the swizzle of that width (128 or 64 bytes).
CUtensorMap make_map_mn(const void* ptr, std::int64_t mn, std::int64_t k, std::int64_t ld, int box, const char* which) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(mn), static_cast<cuuint64_t>(k)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t boxd[2] = {static_cast<cuuint32_t>(box), BK};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
                                 boxd, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 box == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError(cudaErrorInvalidValue, "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) + ") for " +
                                               which + ", a " + std::to_string(k) + " x " + std::to_string(mn) +
                                               " MN-major bf16 operand with row stride " + std::to_string(ld));
  return map;
}

// The output C for TMA stores: rows x cols of `t`, unit column stride, row stride ld elements; boxes
// of 64 rows x row_bytes (128 or 64), swizzled by the same width (the layout the epilogues write).
CUtensorMap make_c_map(void* ptr, DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld, int row_bytes,
                       int box_rows = 64) {
  CUtensorMap map;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(t));
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * es)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(row_bytes / es), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUtensorMapDataType dt = t == DType::f32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : t == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                    : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode_fn()(&map, dt, 2, ptr, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                 CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError(cudaErrorInvalidValue, "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) +
                                               ") for the " + std::to_string(rows) + " x " + std::to_string(cols) +
                                               " output with row stride " + std::to_string(ld));
  return map;
}

template <class C, bool AMN = false, bool BMN = false>
void set_smem_attribute() {
  static std::once_flag once[64];
  int dev = 0;
  CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
  std::call_once(once[dev % 64], [] {
    CUBESIM_CUDA_CHECK(
        cudaFuncSetAttribute(tc_gemm_kernel<C, AMN, BMN>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  });
}

// Clusters of this configuration that fit on the device at once (cached per device).
template <class C>
int resident_clusters() {
  set_smem_attribute<C>();
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
  int fit = cache[dev % 64].load(std::memory_order_relaxed);
  if (fit > 0) return fit;
  cudaLaunchConfig_t lc = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C::CLUSTER;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  lc.gridDim = dim3(static_cast<unsigned>(num_sms() / C::CLUSTER * C::CLUSTER));
  lc.blockDim = dim3(C::THREADS);
  lc.dynamicSmemBytes = C::SMEM;
  lc.attrs = attr;
  lc.numAttrs = 1;
  // Every layout's kernel has the same threads and shared memory: one answer for all.
  CUBESIM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, tc_gemm_kernel<C, false, false>, &lc));
  if (fit <= 0)
    throw CudaError(cudaErrorInvalidConfiguration, "tc_gemm_kernel: no cluster of this configuration fits on the GPU");
  cache[dev % 64].store(fit, std::memory_order_relaxed);
  return fit;
}

template <class C, bool AMN, bool BMN>
void launch(const TcOperands& o, const BiasArg& bias, const MutableMatrixView& c, cudaStream_t stream, int sm_margin) {
  set_smem_attribute<C, AMN, BMN>();
  // k-major A with M < BM (one m-tile): a box of M rows, not BM rows of which BM - M are zero fill.
  // TMA's zero fill is slow (M = 1 at N = K = 4096: 22 us against 16 with a 1-row box, H200). The
  // tile's rows past M keep whatever the stage held before; an MMA row reads only its own row of A
  // and those rows are never stored, so no stored element changes (pinned: every configuration
  // gives the same bits, M from 1 up; batch invariance; accuracy against f64 at M = 1 and 7).
  const int a_box_rows = static_cast<int>(std::min<std::int64_t>(C::BM, o.M));
  const CUtensorMap ma =
      AMN ? make_map_mn(o.a, o.M, o.K, o.lda, 64, "A") : make_map(o.a, o.M, o.K, o.lda, a_box_rows);
  const CUtensorMap mb = BMN ? make_map_mn(o.bt, o.N, o.K, o.ldb, C::B_MN_BOX, "B")
                             : make_map(o.bt, o.N, o.K, o.ldb, C::B_ROWS_PER_CTA);
  Epi e;
  e.c = c.data;
  // The kernel's C is Cᵀ under TRANS: element (i, j) of its M x N at i * c_rs + j * c_cs.
  e.c_rs = C::TRANS ? c.col_stride : c.row_stride;
  e.c_cs = C::TRANS ? c.row_stride : c.col_stride;
  e.bias = bias.data;
  e.bias_dtype = bias.dtype;
  e.bias_stride = bias.stride;
  e.c_dtype = c.dtype;
  e.M = o.M;
  e.N = o.N;
  e.K = o.K;
  e.stage_tx = static_cast<std::uint32_t>(AMN ? C::STAGE_BYTES : C::STAGE_BYTES - C::A_BYTES + a_box_rows * BK * 2);
  // in units of CLUSTER m-tiles: 16 m-tiles a group (ping-pong: 2048 rows a group, as m128 tiles)
  e.group_m = (C::PINGPONG ? 2048 / C::BM : 16) / C::CLUSTER;
  CUtensorMap mc;
  std::memset(&mc, 0, sizeof mc);
  {
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(c.dtype));
    e.tma_store = C::TMA_EPILOGUE && c.col_stride == 1 && reinterpret_cast<std::uintptr_t>(c.data) % 16 == 0 &&
                  (c.rows <= 1 || (c.row_stride > 0 && (c.row_stride * es) % 16 == 0)) && (!C::TRANS || es == 2);
    if (e.tma_store) {
      const std::int64_t ld = c.rows <= 1 ? (c.cols * es + 15) / 16 * 16 / es : c.row_stride;
      // TRANS: boxes of 32 C rows (a chunk of Cᵀ's columns) x 64 C columns (a consumer's 64 rows of Cᵀ).
      mc = C::TRANS ? make_c_map(c.data, c.dtype, c.rows, c.cols, ld, 128, 32)
                    : make_c_map(c.data, c.dtype, c.rows, c.cols, ld, es == 2 ? C::EPI_ROW_BYTES_B16 : 128);
    }
  }  // units of CLUSTER m-tiles: 16 m-tiles a group
  const long long m_units = ((o.M + C::BM - 1) / C::BM + C::CLUSTER - 1) / C::CLUSTER;
  const long long units = m_units * ((o.N + C::BN - 1) / C::BN);
  if (units * C::CLUSTER > 0x7fffffffLL) throw_shape_error("det_gemm_cuda: too many tiles for one launch");
  cudaLaunchConfig_t lc = {};
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C::CLUSTER;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  // Programmatic dependent launch: this grid may be scheduled while the previous kernel of the
  // stream drains (its CTAs run their prologue, then wait in griddepcontrol.wait for that kernel's
  // completion and memory), so back-to-back GEMMs do not pay the launch gap. Every global access of
  // the kernel comes after the wait; the numerics are untouched.
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  lc.blockDim = dim3(C::THREADS);
  lc.dynamicSmemBytes = C::SMEM;
  lc.stream = stream;
  lc.attrs = attr;
  lc.numAttrs = 2;
  // Persistent: as many clusters as fit at once (one CTA per SM), never more than there are units.
  const int fit = std::max(1, resident_clusters<C>() - (sm_margin + C::CLUSTER - 1) / C::CLUSTER);
  lc.gridDim = dim3(static_cast<unsigned>(C::CLUSTER * std::min<long long>(units, fit)));
  CUBESIM_CUDA_CHECK(cudaLaunchKernelEx(&lc, tc_gemm_kernel<C, AMN, BMN>, ma, mb, mc, e));
  CUBESIM_CUDA_CHECK_LAUNCH("tc_gemm_kernel");
}

// The kernel for the operands' major-ness.
template <class C>
void launch(const TcOperands& o, const BiasArg& bias, const MutableMatrixView& c, cudaStream_t stream, int sm_margin) {
  if (o.a_mn && o.b_mn) return launch<C, true, true>(o, bias, c, stream, sm_margin);
  if (o.a_mn) return launch<C, true, false>(o, bias, c, stream, sm_margin);
  if (o.b_mn) return launch<C, false, true>(o, bias, c, stream, sm_margin);
  launch<C, false, false>(o, bias, c, stream, sm_margin);
}

}  // namespace

}  // namespace cubesim::cuda::detail

namespace cubesim::cuda {

int tc_config_resident_ctas(TcConfig c) {
  switch (c) {
    case TcConfig::m128n256: return detail::resident_clusters<detail::CfgL>() * detail::CfgL::CLUSTER;
    case TcConfig::m128n256_c2: return detail::resident_clusters<detail::CfgL2>() * detail::CfgL2::CLUSTER;
    case TcConfig::m128n128: return detail::resident_clusters<detail::CfgM>() * detail::CfgM::CLUSTER;
    case TcConfig::m64n32: return detail::resident_clusters<detail::CfgS>() * detail::CfgS::CLUSTER;
    case TcConfig::m64n256_pp: return detail::resident_clusters<detail::CfgPW>() * detail::CfgPW::CLUSTER;
    case TcConfig::m64n256_pp_c2: return detail::resident_clusters<detail::CfgPW2>() * detail::CfgPW2::CLUSTER;
    case TcConfig::m128n32: return detail::resident_clusters<detail::CfgS2>() * detail::CfgS2::CLUSTER;
    case TcConfig::m128n224: return detail::resident_clusters<detail::CfgL224>() * detail::CfgL224::CLUSTER;
    case TcConfig::m128n224_c2: return detail::resident_clusters<detail::CfgL224c2>() * detail::CfgL224c2::CLUSTER;
    case TcConfig::m224n128_c2: return detail::resident_clusters<detail::CfgT224c2>() * detail::CfgT224c2::CLUSTER;
    case TcConfig::automatic: break;
  }
  return 0;
}

namespace {

// `automatic`'s choice; with `transposed` false, never m224n128_c2 (for outputs its TMA-store epilogue
// cannot write: f32, strided or unaligned rows, where it would store element by element).
TcConfig resolve_auto(std::int64_t M, std::int64_t N, bool transposed) {
  if (M <= 64) return TcConfig::m64n32;
  const std::int64_t sms = detail::num_sms();
  // M = 65..128: m128n128 runs N / 128 CTAs (32 at N = 4096: 26 us, 0.59 of cuBLAS on the H200);
  // m128n32 runs N / 32, each reading its B panel once for both 64-row halves (16.5 us), while
  // its tiles fit in one wave: at N = 14336 (448 tiles) it took 63 us against m128n128's 37.
  if (M <= 128 && (N + 31) / 32 <= sms) return TcConfig::m128n32;
  const std::int64_t m_tiles = (M + 127) / 128;
  const std::int64_t big = m_tiles * ((N + 255) / 256);
  if (big < sms) return TcConfig::m128n128;
  // m128n224 where its tiles fill whole waves that m128n256's do not: N = 3584 is 16 n-tiles of 224
  // (512 tiles in 4 waves of 132, each tile 7/8 of the work) against 14 of 256 (448 tiles: 3.4 waves
  // run in 4). Per FLOP the two move the same shared-memory bytes; the 3% margin is for the rest.
  const std::int64_t waves256 = (big + sms - 1) / sms;
  const std::int64_t waves224 = (m_tiles * ((N + 223) / 224) + sms - 1) / sms;
  if (waves224 * 224 * 100 < waves256 * 256 * 97)
    return m_tiles % 2 == 0 ? TcConfig::m128n224_c2 : TcConfig::m128n224;
  // The same for M: Cᵀ in m128n224 tiles (M = 3584: 32 x 16 tiles of Cᵀ in 4 waves, against 448
  // m128n256 tiles of C), the epilogue storing each tile transposed.
  const std::int64_t t_m_tiles = (N + 127) / 128;
  const std::int64_t waves_t = (t_m_tiles * ((M + 223) / 224) + sms - 1) / sms;
  if (transposed && t_m_tiles % 2 == 0 && waves_t * 224 * 100 < waves256 * 256 * 97) return TcConfig::m224n128_c2;
  // Ping-pong m64n256 tiles in clusters of 2 cost ~15% more per FLOP than the cooperative m128n256
  // (more shared-memory traffic per FLOP, and half the stages' latency cover: on the H100 they wait
  // for data), but are half the size: where the last wave of m128n256 tiles leaves most SMs idle,
  // the finer tiles finish sooner. Since the stmatrix epilogue (2026-11-25) the forced-configuration
  // tables put m64n256_pp_c2 at 0.84-0.88 of m128n256_c2 on the layer shapes (H100 and H200); at
  // 448 tiles (4 waves for 3.4 of work) it no longer pays.
  const std::int64_t coop_waves = (big + sms - 1) / sms;  // m128n256 tiles a CTA, at most
  const std::int64_t clusters = sms / 2;  // a cluster's unit: 2 m64n256 tiles, as many units as `big`
  const std::int64_t pp_tiles = (big + clusters - 1) / clusters;  // m64n256 tiles a CTA, at most
  // pp time ~ pp_tiles / 2 / 0.85 against coop_waves: ping-pong if pp_tiles * 100 < coop_waves * 170.
  if (pp_tiles * 100 < coop_waves * 170) return TcConfig::m64n256_pp_c2;
  // Clusters of 2 sharing B measured 1-8% faster than single CTAs on the layer shapes (H200); with an
  // odd m-tile count the last unit's second CTA would compute zero rows, so single CTAs then.
  return ((M + 127) / 128) % 2 == 0 ? TcConfig::m128n256_c2 : TcConfig::m128n256;
}

}  // namespace

TcConfig resolve_tc_config(TcConfig requested, std::int64_t M, std::int64_t N) {
  return requested != TcConfig::automatic ? requested : resolve_auto(M, N, true);
}

}  // namespace cubesim::cuda

namespace cubesim::cuda::detail {

void launch_tc_gemm(const TcOperands& ops, const BiasArg& bias, const MutableMatrixView& c, TcConfig cfg,
                    cudaStream_t stream, int sm_margin) {
  TcConfig r = resolve_tc_config(cfg, ops.M, ops.N);
  if (r == TcConfig::m224n128_c2 && cfg == TcConfig::automatic) {
    const bool tma_2byte = dtype_size(c.dtype) == 2 && c.col_stride == 1 &&
                           reinterpret_cast<std::uintptr_t>(c.data) % 16 == 0 &&
                           (c.rows <= 1 || (c.row_stride > 0 && (c.row_stride * 2) % 16 == 0));
    if (!tma_2byte) r = resolve_auto(ops.M, ops.N, false);
  }
  switch (r) {
    case TcConfig::m128n256: return launch<CfgL>(ops, bias, c, stream, sm_margin);
    case TcConfig::m128n256_c2: return launch<CfgL2>(ops, bias, c, stream, sm_margin);
    case TcConfig::m128n128: return launch<CfgM>(ops, bias, c, stream, sm_margin);
    case TcConfig::m64n32: return launch<CfgS>(ops, bias, c, stream, sm_margin);
    case TcConfig::m64n256_pp: return launch<CfgPW>(ops, bias, c, stream, sm_margin);
    case TcConfig::m64n256_pp_c2: return launch<CfgPW2>(ops, bias, c, stream, sm_margin);
    case TcConfig::m128n32: return launch<CfgS2>(ops, bias, c, stream, sm_margin);
    case TcConfig::m128n224: return launch<CfgL224>(ops, bias, c, stream, sm_margin);
    case TcConfig::m128n224_c2: return launch<CfgL224c2>(ops, bias, c, stream, sm_margin);
    case TcConfig::m224n128_c2: {
      // Cᵀ = Bᵀ·Aᵀ: A' = Bᵀ (N x K), B'ᵀ = A (M x K), each read in its own major-ness.
      TcOperands t;
      t.a = ops.bt;
      t.lda = ops.ldb;
      t.a_mn = ops.b_mn;
      t.bt = ops.a;
      t.ldb = ops.lda;
      t.b_mn = ops.a_mn;
      t.M = ops.N;
      t.N = ops.M;
      t.K = ops.K;
      return launch<CfgT224c2>(t, bias, c, stream, sm_margin);
    }
    case TcConfig::automatic: break;
  }
  throw_shape_error("det_gemm_cuda: invalid tensor-core configuration");
}

}  // namespace cubesim::cuda::detail
