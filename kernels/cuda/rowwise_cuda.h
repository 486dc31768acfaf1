// rowwise_cuda.h — the cuda backend's kernels for the row-wise ops: RMSNorm and LayerNorm (forward and
// backward), SwiGLU, rotary embeddings, the embedding and the vocab-parallel cross-entropy pieces.
//
// Each gives the bits of its host definition (kernels/norm.h, elementwise.h, rotary.h, vocab.h): the
// same det_* operations in the same order, one rounding to the output's dtype. Every reduction there
// is a sequential chain (Σ over j ascending from +0, one row at a time; the weight gradients over rows
// ascending), and here too: one GPU lane walks each chain in that order. What makes it fast is
// the feeding: a block owns 32 chains (rows, or columns for the weight gradients); warps 1..7 stream
// chunks of their elements into shared memory, transformed (widened, dy·w, exp(x − m), ...) two
// chunks ahead of warp 0, whose lane k adds chain k's terms in order. The elementwise parts (y, dx,
// SwiGLU, rotary, the embedding, the cross-entropy gradient) are one thread per element.
//
//   cuda::rms_norm_forward(x, w, y, rstd, rows, n, 1e-5f, stream);    // device pointers in the buffers
//
// Buffers are kernels::NormBuffer views of device memory (columns contiguous, rows strided). An output
// may alias an input of the same shape (dx = dy, y = x, dlogits = logits): every element is read
// before it is written, as on the host. Launchers are asynchronous on `stream` and throw
// cubesim::cuda::CudaError naming the kernel when a launch fails; rows or n may be 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/norm.h"

namespace cubesim::cuda {

using kernels::MutableNormBuffer;
using kernels::NormBuffer;

void rms_norm_forward(NormBuffer x, NormBuffer w, MutableNormBuffer y, float* rstd, std::int64_t rows, std::int64_t n,
                      float eps, cudaStream_t stream);
// scratch: `rows` floats of device memory (the per-row factor a).
void rms_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* rstd, MutableNormBuffer dx,
                       MutableNormBuffer dw, std::int64_t rows, std::int64_t n, float* scratch, cudaStream_t stream);
void layer_norm_forward(NormBuffer x, NormBuffer w, NormBuffer b, MutableNormBuffer y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t n, float eps, cudaStream_t stream);
// scratch: 2 x `rows` floats (the per-row a and c).
void layer_norm_backward(NormBuffer x, NormBuffer w, NormBuffer dy, const float* mean, const float* rstd,
                         MutableNormBuffer dx, MutableNormBuffer dw, MutableNormBuffer db, std::int64_t rows,
                         std::int64_t n, float* scratch, cudaStream_t stream);

// x [rows, 2f] (gate, up) interleaved; y [rows, f]; dx [rows, 2f].
void swiglu(NormBuffer x, MutableNormBuffer y, std::int64_t rows, std::int64_t f, cudaStream_t stream);
void swiglu_backward(NormBuffer x, NormBuffer dy, MutableNormBuffer dx, std::int64_t rows, std::int64_t f,
                     cudaStream_t stream);

// kernels::rotary_apply on the device; cos, sin: the table's values in device memory ([>= s.seq_q][head_dim / 2]).
void rotary_apply(const kernels::AttentionShape& s, kernels::MutableAttentionBuffer b, std::int64_t heads,
                  std::int64_t per_group, const float* cos, const float* sin, bool inverse, cudaStream_t stream);

// ids: device, one per token.
void embedding_forward(NormBuffer weight, std::int64_t rows, std::int64_t vocab_start, const std::int64_t* ids,
                       std::int64_t tokens, std::int64_t hidden, MutableNormBuffer out, cudaStream_t stream);
// The embedding gradient's order as data: the tokens whose id is in the slice, grouped by id (ids
// ascending) and within a group by token index ascending (`order`); group g covers order[begin[g],
// begin[g + 1]) and accumulates into row `row[g]` of the slice. Built on the host from the ids.
struct EmbeddingGroups {
  std::vector<std::int64_t> order, row, begin;  // begin has row.size() + 1 entries
};
EmbeddingGroups embedding_groups(const std::int64_t* ids, std::int64_t tokens, std::int64_t rows,
                                 std::int64_t vocab_start);
// order, row, begin: the groups' arrays in device memory; dweight [rows, hidden] (rows outside every
// group get +0).
void embedding_backward(NormBuffer dy, std::int64_t hidden, std::int64_t rows, const std::int64_t* order,
                        const std::int64_t* row, const std::int64_t* begin, std::int64_t groups,
                        MutableNormBuffer dweight, cudaStream_t stream);

// targets: device, one per token; max, partials, loss, dloss: f32 device arrays.
void cross_entropy_max(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, float* max, cudaStream_t stream);
void cross_entropy_partials(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const std::int64_t* targets, std::int64_t vocab_start, float* partials,
                            cudaStream_t stream);
void cross_entropy_loss(const float* partials, const float* max, float* loss, std::int64_t tokens, cudaStream_t stream);
void cross_entropy_backward(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const float* partials, const std::int64_t* targets, std::int64_t vocab_start,
                            const float* dloss, MutableNormBuffer dlogits, cudaStream_t stream);

}  // namespace cubesim::cuda
