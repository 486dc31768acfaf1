// sim_pe_gemm.h — det_gemm on the simulated processing elements: real bytes, simulated time.
//
// C = A·B (+ bias) with A, B, C (and bias) in simulated memories (HBM). C is cut into tiles of
// the PE's tile shape (topology "pe.tile": m x n, and k for the reduction blocks); tiles are dealt
// round-robin to the PEs of the chosen cubes (cube-major, then PE). Each PE runs one process that
// walks its tiles' (tile, k-block) steps in order:
//   - A's and B's k-block tiles move HBM -> TCM by the PE's DMA (strided regions), double-buffered:
//     step s+1's loads are issued before step s computes, across tile boundaries too;
//   - the MAC array computes the block (time: m·n·k MACs at the PE's rate for the dtype) and the
//     values are continued from the running f32 accumulator by det_gemm_accumulate on the bytes
//     read from the TCM — the contract's "k blocked by loading the running accumulator";
//   - after the last k-block, det_gemm_store adds the bias and rounds into a TCM output buffer
//     (double-buffered) that the DMA writes back to HBM while the next tile proceeds.
// So C is bitwise what det_gemm computes on the host, whatever the tile shape or PE count.
// Operands are row-major (col_stride 1) or column-major (row_stride 1) views, so a transposed
// weight is a view, not a copy. With a timing-only system, no values move and times are the same.
//
// The GPU-like pipeline. When the topology's PEs have a "pe.gemm" section (topologies/README.md),
// the GEMM runs as a persistent Hopper-style kernel instead (values are the same bits):
//   - Tile: pe.gemm.tiles.<A's dtype>, else pe.gemm.tile, else pe.tile (m x n output, k-block k);
//     with pe.gemm.choices.<A's dtype>, one of that list (Kernel choice, below).
//   - Clusters: each cube's PEs form floor(PEs / (cm·cn)) clusters of cm x cn PEs ("cluster", or
//     1 x 1 when the kernel choice runs without clusters), cube-major; G clusters in all (the rest
//     idle). A cluster runs a block of cm x cn adjacent tiles.
//   - Stages: pe.gemm.stages k-block buffers per PE, or with "auto" as many as the TCM holds besides
//     the C tile: (TCM - C tile) / (A k-block + B k-block + bias slice).
//   - Kernel choice (as a GPU library's heuristic picks a kernel for a shape): every tile of the
//     choices (or the one tile), with the cluster and without, is estimated and the least estimate
//     runs (ties: the earlier tile, the cluster first). With G clusters, blocks of cm x cn tiles,
//     nk k-blocks, boxes a = A k-block bytes and b = B k-block bytes, S stages, per PE:
//       step = max(MMA cycles of a whole tile's k-block / f, (cm·a + cn·b) / (cm·cn) / DMA read rate,
//                  (HBM latency + L2 latency + (a + b) / DMA read rate) / S)
//       tile = (prologue + epilogue) / f + nk · step
//       wave(n)  = max(tile, n · nk · (cm·a + cn·b) / L2 bandwidth)     (n blocks at once)
//       estimate = launch + max(floor(blocks / G) · wave(G) + wave(blocks mod G),
//                               (A + B + C bytes) / HBM bandwidth)
//     An estimate, not the simulation: it only picks the kernel; the time is what the run takes.
//   - Launch: pe.gemm.launch_ns passes before the first tile starts (a GPU kernel's launch).
//   - Walk: blocks are ordered by a swizzled raster: with raster "n", block rows are cut into bands
//     of `swizzle` rows; bands go top to bottom, each walked column by column, down the band first
//     (swizzle 1: row-major). Raster "m" is the transpose (swizzle 1: column-major). Cluster g runs
//     blocks g, g+G, g+2G, ...: wave w is blocks wG .. wG+G-1, consecutive in the walk, and
//     waves = ceil(blocks / G); a last partial wave leaves clusters idle (wave quantization).
//   - Loads: A's k-block of a tile row and B's of a tile column are one DMA request each (a TMA box:
//     chunking follows pe.dma.chunk_bytes), issued by one member of the cluster (rotating with the
//     k-block) into its TCM and delivered to every member of the row (A) or column (B) by
//     multicast: HBM and the issuer's DMA channel carry the bytes once; the receivers get them when
//     they land in the issuer's TCM (the fabric's replication costs no extra time, an approximation).
//     Bias slices go with B at the first k-block. `stages` k-block buffers per PE: the load of step
//     s + stages is issued when every member's MMAs of step s have finished (the cluster-wide
//     "buffer empty" barrier).
//   - Timing, per member and tile (cycles at the MAC clock, f = clock):
//       k-block  = max(ceil(tm·tn·k / macs_per_cycle[dtype]), issue_cycles_per_k_block,
//                      [unaligned] ceil((A k-block + B k-block bytes) / unaligned_bytes_per_cycle)) / f,
//                  starting when its A and B have landed and the MAC array is free (tm x tn:
//                  the whole tile's MMAs, also for a tile at the edge that holds fewer rows or
//                  columns: a tensor core's instruction shape does not shrink with the data);
//     [unaligned]: when A's, B's or C's base address or row pitch (the stride of its major
//     dimension) in bytes is not a multiple of 16, a GPU cannot use TMA (the tensor copy engine
//     needs 16-byte aligned global addresses and strides) and its kernels load operands through
//     the SM's load path instead (a fallback kernel, for all of its operands): with a the largest
//     power of two dividing every one of those addresses and pitches (1..8 bytes), a k-block takes
//     at least max((A + B k-block bytes) / (unaligned_bytes_per_cycle x max(a, 2) / 2),
//     tm·tn·k / unaligned_macs_per_cycle) cycles: loads as wide as the alignment allows, and the
//     fallback's MMA rate (mma.sync rather than wgmma; absent or 0: no such limit). Without
//     unaligned_bytes_per_cycle there is no fallback at all.
//       tile     = prologue_cycles / f  +  sum of its k-blocks (plus any wait on loads)
//                  + bias+round on the vector unit (m·n / ops_per_cycle)  +  epilogue_cycles / f,
//       then the C tile goes to HBM by one DMA write from one TCM buffer (the next tile's epilogue
//       waits for it). MAC-bound and loads hidden: time = waves x tile + fill + drain.
//   - TCM per PE: stages x (A k-block + B k-block + bias slice) + one C tile (checked at load).
//   The report adds tiles, waves, clusters, multicast_bytes and each PE's idle time.
//
//   SimGemmReport r = sim_pe_gemm(sys, A, B, &bias, C, {.cubes = {0}});   // inside a process
//   fmt::print("{} ({}-bound, {:.1%} of roofline)\n", sim::format_time(r.time), r.bound, r.efficiency);
#pragma once

#include "kernels/accumulator.h"
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "sim/core/time.h"
#include "sim/hw/system.h"

namespace cubesim::kernels {

// rows x cols elements of dtype at memory->at(addr); element (r, c) at addr + (r*row_stride +
// c*col_stride) * size. One of the strides must be 1.
struct HbmMatrix {
  hw::Memory* memory = nullptr;
  std::uint64_t addr = 0;
  DType dtype = DType::f32;
  std::int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 1;
};

struct HbmVector {
  hw::Memory* memory = nullptr;
  std::uint64_t addr = 0;  // contiguous
  DType dtype = DType::f32;
  std::int64_t size = 0;
};

struct SimGemmOptions {
  std::vector<int> cubes;  // cubes whose PEs run the tiles (empty: the cube that holds C)
  int max_pes = 0;         // per cube; 0 = all
  std::string label = "gemm";
  // The MAC array's accumulator model (kernels/accumulator.h); f32_fma_seq is the numerics contract.
  // Others need the tile's k to be a multiple of the model's group (std::invalid_argument otherwise).
  AccumulatorModel numerics = AccumulatorModel::f32_fma_seq;
};

// The run's time against the roofline: compute bound = MACs / (the PEs' MAC rate); memory bound =
// the fewest bytes (A, B, bias read once, C written once) / the HBM bandwidth of the cubes used.
struct SimGemmReport {
  sim::Duration time = 0;
  sim::Duration compute_bound = 0;
  sim::Duration memory_bound = 0;
  const char* bound = "compute";  // which of the two is larger
  double efficiency = 0;          // max(compute_bound, memory_bound) / time
  std::uint64_t macs = 0;
  std::uint64_t min_bytes = 0;
  std::uint64_t dma_bytes = 0;    // what the DMA engines actually moved
  int pes = 0;
  std::int64_t tile_m = 0, tile_n = 0, tile_k = 0;
  std::int64_t tiles = 0;  // output tiles
  std::int64_t waves = 0;  // ceil(blocks of cluster tiles / clusters): the last one may leave PEs idle
  int clusters = 0, cluster_m = 1, cluster_n = 1;  // pe.gemm's clusters (0 without the section)
  int stages = 0;       // pe.gemm's k-block buffers per PE (0 without the section)
  double estimate = 0;  // pe.gemm: the kernel choice's estimate of the time, seconds
  std::uint64_t multicast_bytes = 0;  // bytes delivered to TCMs besides the issuer's (multicast)
  std::vector<sim::Duration> pe_idle;  // per PE (cube-major order): time less its MAC array's busy time
};

// Blocks the calling process until C is in HBM. Throws std::invalid_argument on shapes, dtypes,
// layouts or a TCM too small for the tile (naming them).
SimGemmReport sim_pe_gemm(hw::System& sys, const HbmMatrix& A, const HbmMatrix& B, const HbmVector* bias,
                          const HbmMatrix& C, const SimGemmOptions& opts = {});

}  // namespace cubesim::kernels
