// sim_pe_attention.h — attention (kernels/attention.h) on the simulated processing elements: operand
// tiles move HBM -> TCM by each PE's DMA, the products run on its MAC array, the softmax on its vector
// unit, and the outputs move back to HBM at their simulated times.
//
// Forward (as FlashAttention does, one pass): work items are (sequence, head, query tile of tile.m
// rows), dealt round-robin to the PEs of the chosen cubes. A PE loads the Q tile, then walks the key
// blocks of tile.n keys the tile's rows can see (causal: up to the last row's position; partly masked
// blocks cost a whole block), K and V blocks double-buffered (the next block's loads are issued before
// this block computes); per block: Q·Kᵀ (rows x keys x head_dim MACs), the online softmax (5 vector
// operations per score) and P·V (the same MACs); at the end the normalisation (one per output element)
// and the O tile and its statistics go back to HBM.
// Backward (deterministic, two passes, as kernels/cuda/attention_cuda.h runs it): items (sequence,
// query group, key tile) walk the group's heads and the query blocks that see the tile: Q·Kᵀ, dO·Vᵀ,
// Pᵀ·dO and dSᵀ·Q (4 products) and 8 vector operations per score, then write dK and dV; items
// (sequence, head, query tile) walk the key blocks: Q·Kᵀ, dO·Vᵀ and dS·K (3 products), then write dQ.
// The tile shape is the PE's (pe.tile m x n); when its buffers (Q tile, two K and V blocks, the output
// tile) do not fit the TCM, the key block and then the query tile are halved until they do.
//
// Values: the numbers are the contract's, computed by the caller on the host from HBM before the run
// (`values`: the output spans' bytes, as in HBM, or null in a timing-only system); each output tile is
// written into the PE's TCM and moved to HBM by its DMA, so the bytes arrive when the simulated
// transfer lands.
//
//   SimAttentionReport r = sim_pe_attention_forward(sys, shape, q, k, v, out, stats, values, {.cubes = {0}});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "sim/core/time.h"
#include "sim/hw/system.h"

namespace cubesim::kernels {

// An attention operand in simulated memory: attention.h's layout (row_stride, group_stride in
// elements) from addr.
struct HbmAttention {
  hw::Memory* memory = nullptr;
  std::uint64_t addr = 0;
  DType dtype = DType::f32;
  std::int64_t row_stride = 0;
  std::int64_t group_stride = 0;
};

// A host copy of memory bytes: data[i] is what the memory must hold at addr + i.
struct HostBytes {
  const std::uint8_t* data = nullptr;  // null: nothing to write (timing only)
  std::uint64_t addr = 0;
};
// What the outputs must hold, each covering its operand's rows.
struct AttentionValues {
  HostBytes out, stats;  // forward (stats: f32, 2 per token and head)
  HostBytes dq, dk, dv;  // backward
};

struct SimAttentionOptions {
  std::vector<int> cubes;  // cubes whose PEs run the items (empty: the cube holding the first output)
  std::string label = "attention";
};

struct SimAttentionReport {
  sim::Duration time = 0;
  std::int64_t items = 0;
  int pes = 0;
  std::int64_t tile_q = 0, tile_k = 0;
  std::uint64_t macs = 0;       // the MAC array work charged (masked parts of diagonal blocks included)
  std::uint64_t dma_bytes = 0;  // what the DMA engines moved
};

// Blocks the calling process until the outputs are in HBM. Throws std::invalid_argument on a shape
// (AttentionShape::validate) or a TCM too small for a single row.
SimAttentionReport sim_pe_attention_forward(hw::System& sys, const AttentionShape& s, const HbmAttention& q,
                                            const HbmAttention& k, const HbmAttention& v, const HbmAttention& out,
                                            const HbmAttention& stats, const AttentionValues& values,
                                            const SimAttentionOptions& opts = {});

SimAttentionReport sim_pe_attention_backward(hw::System& sys, const AttentionShape& s, const HbmAttention& q,
                                             const HbmAttention& k, const HbmAttention& v, const HbmAttention& dout,
                                             const HbmAttention& dq, const HbmAttention& dk, const HbmAttention& dv,
                                             const AttentionValues& values, const SimAttentionOptions& opts = {});

}  // namespace cubesim::kernels
