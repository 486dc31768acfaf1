// attention_cuda.h — the attention contract (kernels/attention.h) on a GPU in the exact mode: every
// score, exponential and sum in the contract's order with the non-contracting det_* operations, so
// the results are the host definition's bits (tests/kernels/cuda/test_attention_cuda.cpp runs the
// contract's case table against it).
//
//   cuda::attention_forward(s, q, k, v, out, stats, nullptr, stream);     // device pointers
//   cuda::attention_backward(s, q, k, v, out, stats, dout, dq, dk, dv, nullptr, workspace, stream);
//
// Buffers and the layout are attention.h's (group_stride included); stats f32 [tokens, heads, 2];
// kv_valid, when given, a device array of batch int64. The backward needs
// attention_backward_workspace_bytes(s) of device memory. Launches are asynchronous on `stream` and
// throw cubesim::cuda::CudaError naming the kernel when a launch fails; the shape is validated as the
// host does (std::invalid_argument).
//
// How it runs: a block of 16 query rows (forward, dQ) or 16 key rows (dK, dV) walks the other side in
// blocks of 64: threads compute the block's scores in parallel (each a sequential fma chain over the
// head dimension, as the contract orders it), one thread per row keeps the running max and sum, and
// threads over (row, element) carry the accumulators across the block's keys (or queries) in order.
//
// The tensor_core mode (kernels/attention_tc.h; attention_tc.cu) takes the same arguments:
//
//   if (cuda::attention_tc_unsupported(s, q, k, v, out).empty())
//     cuda::attention_forward_tc(s, q, k, v, out, stats, kv_valid, stream);
//   cuda::attention_backward_tc(s, q, k, v, out, stats, dout, dq, dk, dv, kv_valid, workspace, stream);
//
// FlashAttention-2-style kernels on the tensor cores (wgmma on sm_90a), head_dim 64 or 128, bf16 or
// f16 operands, 16-byte rows; the backward needs attention_tc_backward_workspace_bytes(s).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention.h"
#include "kernels/attention_tc.h"

namespace cubesim::cuda {

void attention_forward(const kernels::AttentionShape& s, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                       kernels::AttentionBuffer v, kernels::MutableAttentionBuffer out, float* stats,
                       const std::int64_t* kv_valid, cudaStream_t stream);

std::size_t attention_backward_workspace_bytes(const kernels::AttentionShape& s);

void attention_backward(const kernels::AttentionShape& s, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                        kernels::AttentionBuffer v, kernels::AttentionBuffer out, const float* stats,
                        kernels::AttentionBuffer dout, kernels::MutableAttentionBuffer dq,
                        kernels::MutableAttentionBuffer dk, kernels::MutableAttentionBuffer dv,
                        const std::int64_t* kv_valid, void* workspace, cudaStream_t stream);

// The tensor_core mode (kernels/attention_tc.h): same arguments as above. attention_tc_unsupported
// says why a call cannot run in it ("" when it can); the entry points throw std::invalid_argument with
// that reason. The backward needs attention_tc_backward_workspace_bytes(s) of device memory.
std::string attention_tc_unsupported(const kernels::AttentionShape& s, kernels::AttentionBuffer q,
                                     kernels::AttentionBuffer k, kernels::AttentionBuffer v,
                                     kernels::AttentionBuffer out);

std::string attention_tc_backward_unsupported(const kernels::AttentionShape& s, kernels::AttentionBuffer q,
                                              kernels::AttentionBuffer k, kernels::AttentionBuffer v,
                                              kernels::AttentionBuffer out, kernels::AttentionBuffer dout,
                                              kernels::AttentionBuffer dq, kernels::AttentionBuffer dk,
                                              kernels::AttentionBuffer dv);

void attention_forward_tc(const kernels::AttentionShape& s, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                          kernels::AttentionBuffer v, kernels::MutableAttentionBuffer out, float* stats,
                          const std::int64_t* kv_valid, cudaStream_t stream);

std::size_t attention_tc_backward_workspace_bytes(const kernels::AttentionShape& s);

void attention_backward_tc(const kernels::AttentionShape& s, kernels::AttentionBuffer q, kernels::AttentionBuffer k,
                           kernels::AttentionBuffer v, kernels::AttentionBuffer out, const float* stats,
                           kernels::AttentionBuffer dout, kernels::MutableAttentionBuffer dq,
                           kernels::MutableAttentionBuffer dk, kernels::MutableAttentionBuffer dv,
                           const std::int64_t* kv_valid, void* workspace, cudaStream_t stream);

// Benchmarks and tests only: force the forward's (warps, 16-row tiles a warp) and the backward's warps
// a CTA (0: the default), and which backward kernels run (bit 0 dQ, bit 1 dK/dV; 3: both, anything
// else leaves outputs unwritten: for timing a phase). Not thread-safe; every variant computes the
// same bits.
void attention_tc_set_variant(int fwd_warps, int fwd_rows16, int bwd_warps, int bwd_phases = 3);

}  // namespace cubesim::cuda
