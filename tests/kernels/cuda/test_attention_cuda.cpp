// The attention contract's case table (tests/kernels/attention_cases.h) on the GPU's exact-mode
// kernels (kernels/cuda/attention_cuda.h): every case bitwise the host definition, and batch
// invariance, padding and chunked prefill on the device; and the tolerance-checked table
// (attention_tc_cases) on the tensor_core mode (kernels/attention_tc.h). Skips without a GPU.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/kernels/attention_cases.h"

namespace cubesim::kernels::testing {
namespace {

std::string no_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  return "";
}

// A host buffer's bytes on the device for one call: copied in (outputs too, so the gaps the kernel
// must not write keep the host's poison) and, for outputs, back.
class OnDevice {
 public:
  OnDevice(const void* host, std::size_t bytes) : host_(const_cast<void*>(host)), bytes_(bytes) {
    CUBESIM_CUDA_CHECK(cudaMalloc(&dev_, bytes ? bytes : 1));
    if (bytes) CUBESIM_CUDA_CHECK(cudaMemcpy(dev_, host, bytes, cudaMemcpyHostToDevice));
  }
  ~OnDevice() { cudaFree(dev_); }
  OnDevice(const OnDevice&) = delete;
  void back() const {
    if (bytes_) CUBESIM_CUDA_CHECK(cudaMemcpy(host_, dev_, bytes_, cudaMemcpyDeviceToHost));
  }
  void* dev() const { return dev_; }

 private:
  void* host_;
  void* dev_ = nullptr;
  std::size_t bytes_;
};

std::size_t extent(AttentionBuffer b, std::int64_t rows, std::int64_t heads, std::int64_t per_group, std::int64_t d) {
  return attn_extent_bytes(b, rows, heads, per_group, d);
}

AttentionBuffer on(AttentionBuffer b, const OnDevice& d) { return {d.dev(), b.dtype, b.row_stride, b.group_stride}; }
MutableAttentionBuffer on(MutableAttentionBuffer b, const OnDevice& d) {
  return {d.dev(), b.dtype, b.row_stride, b.group_stride};
}

// tc: the tensor_core mode, with the forward variant (fwd_warps, fwd_rows16) of
// attention_tc_set_variant (0, 0: the default).
AttentionBackend cuda_attention(bool tc, int fwd_warps = 0, int fwd_rows16 = 0) {
  AttentionBackend be;
  be.name = tc ? (fwd_rows16 == 5 ? "cuda_tc_pipe" : "cuda_tc") : "cuda_exact";
  be.unavailable = no_gpu;
  if (tc) be.tolerance = attn_tc_tolerance;
  be.forward = [tc, fwd_warps, fwd_rows16](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                  MutableAttentionBuffer o, float* stats, const std::int64_t* kv_valid) {
    const std::int64_t G = s.heads / s.kv_heads, tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, d = s.head_dim;
    OnDevice dq(q.data, extent(q, tq, s.heads, G, d)), dk(k.data, extent(k, tk, s.kv_heads, 1, d)),
        dv(v.data, extent(v, tk, s.kv_heads, 1, d)), dout(o.data, extent(o, tq, s.heads, G, d)),
        dst(stats, sizeof(float) * static_cast<std::size_t>(tq * s.heads * 2)),
        dkv(kv_valid, kv_valid ? sizeof(std::int64_t) * static_cast<std::size_t>(s.batch) : 0);
    const auto* kvd = kv_valid ? static_cast<const std::int64_t*>(dkv.dev()) : nullptr;
    if (tc) {
      cuda::attention_tc_set_variant(fwd_warps, fwd_rows16, 0);
      cuda::attention_forward_tc(s, on(q, dq), on(k, dk), on(v, dv), on(o, dout), static_cast<float*>(dst.dev()), kvd,
                                 nullptr);
      cuda::attention_tc_set_variant(0, 0, 0);
    } else {
      cuda::attention_forward(s, on(q, dq), on(k, dk), on(v, dv), on(o, dout), static_cast<float*>(dst.dev()), kvd,
                              nullptr);
    }
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    dout.back();
    dst.back();
  };
  be.backward = [tc](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v, AttentionBuffer o,
                   const float* stats, AttentionBuffer dout, MutableAttentionBuffer dq, MutableAttentionBuffer dk,
                   MutableAttentionBuffer dv, const std::int64_t* kv_valid) {
    const std::int64_t G = s.heads / s.kv_heads, tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, d = s.head_dim;
    OnDevice Q(q.data, extent(q, tq, s.heads, G, d)), K(k.data, extent(k, tk, s.kv_heads, 1, d)),
        V(v.data, extent(v, tk, s.kv_heads, 1, d)), O(o.data, extent(o, tq, s.heads, G, d)),
        ST(stats, sizeof(float) * static_cast<std::size_t>(tq * s.heads * 2)),
        DO(dout.data, extent(dout, tq, s.heads, G, d)), DQ(dq.data, extent(dq, tq, s.heads, G, d)),
        DK(dk.data, extent(dk, tk, s.kv_heads, 1, d)), DV(dv.data, extent(dv, tk, s.kv_heads, 1, d)),
        KV(kv_valid, kv_valid ? sizeof(std::int64_t) * static_cast<std::size_t>(s.batch) : 0);
    std::vector<std::uint8_t> ws(tc ? cuda::attention_tc_backward_workspace_bytes(s)
                                    : cuda::attention_backward_workspace_bytes(s));
    OnDevice W(ws.data(), ws.size());
    const auto* kvd = kv_valid ? static_cast<const std::int64_t*>(KV.dev()) : nullptr;
    const auto* st = static_cast<const float*>(ST.dev());
    if (tc) {
      cuda::attention_backward_tc(s, on(q, Q), on(k, K), on(v, V), on(o, O), st, on(dout, DO), on(dq, DQ), on(dk, DK),
                                  on(dv, DV), kvd, W.dev(), nullptr);
    } else {
      cuda::attention_backward(s, on(q, Q), on(k, K), on(v, V), on(o, O), st, on(dout, DO), on(dq, DQ), on(dk, DK),
                               on(dv, DV), kvd, W.dev(), nullptr);
    }
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    DQ.back();
    DK.back();
    DV.back();
  };
  return be;
}

INSTANTIATE_ATTENTION_CONTRACT(Cuda, ::testing::Values(cuda_attention(false)));
INSTANTIATE_ATTENTION_CASES(CudaTc, ::testing::Values(cuda_attention(true), cuda_attention(true, 12, 5)),
                            ::cubesim::kernels::testing::attention_tc_cases());

// What the tensor_core mode does not take is refused with the reason, before any device work (runs
// without a GPU).
TEST(AttentionTc, RefusesWhatItCannotRun) {
  const AttentionShape s{.batch = 1, .seq_q = 8, .seq_k = 8, .heads = 2, .kv_heads = 1, .head_dim = 80};
  alignas(16) static std::uint16_t buf[4096];
  const AttentionBuffer q{buf, DType::bf16, 160}, k{buf, DType::bf16, 80};
  const MutableAttentionBuffer o{buf, DType::bf16, 160};
  EXPECT_NE(cuda::attention_tc_unsupported(s, q, k, k, o).find("head_dim 80"), std::string::npos);
  float stats[32];
  try {
    cuda::attention_forward_tc(s, q, k, k, o, stats, nullptr, nullptr);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 80"), std::string::npos) << e.what();
  }
  AttentionShape s64 = s;
  s64.head_dim = 64;
  const AttentionBuffer q64{buf, DType::bf16, 128}, k64{buf, DType::f16, 64}, odd{buf, DType::bf16, 68};
  EXPECT_NE(cuda::attention_tc_unsupported(s64, q64, k64, k64, o).find("k is f16"), std::string::npos);
  EXPECT_NE(cuda::attention_tc_unsupported(s64, q64, odd, odd, o).find("16 bytes"), std::string::npos);
  EXPECT_EQ(cuda::attention_tc_unsupported(s64, q64, AttentionBuffer{buf, DType::bf16, 64},
                                           AttentionBuffer{buf, DType::bf16, 64}, o),
            "");
}

// Every kernel variant (forward: wgmma with 2 or 3 warpgroups of 64 rows, 2 or 3 K/V stages, with or
// without the next block's S issued before the softmax; mma.sync tiles of 8 x 16,
// 4 x 16 and 4 x 32 rows; backward: wgmma with dK/dV tiles of 1 or 2 warpgroups, mma.sync with 4 or
// 8 warps) gives the same bits: the tile shape and the MMA instruction never enter an element's
// arithmetic.
TEST(AttentionTc, EveryVariantGivesTheSameBits) {
  if (const std::string why = no_gpu(); !why.empty()) GTEST_SKIP() << why;
  const AttentionBackend be = cuda_attention(true);
  for (std::int64_t d : {64, 128}) {
    AttentionCase c{.backward = true, .batch = 2, .seq = 300, .heads = 4, .kv_heads = 2, .head_dim = d, .causal = true,
                    .in = DType::bf16, .out = DType::bf16, .layout = Layout::row_major};
    const AttnInputs in = attn_inputs(c, c.batch, c.seq, c.seq, 77 + static_cast<std::uint64_t>(d));
    cuda::attention_tc_set_variant(0, 0, 0);
    const AttnResults want = attn_run(be, c, c.shape(c.batch), in);
    const int variants[][3] = {{12, 5, 0}, {8, 5, 1}, {8, 4, 8}, {13, 4, 2}, {12, 4, 4}, {8, 1, 2}, {4, 1, 1}, {4, 2, 8}};
    for (const auto& v : variants) {
      cuda::attention_tc_set_variant(v[0], v[1], v[2]);
      const AttnResults got = attn_run(be, c, c.shape(c.batch), in, 1);
      for (std::int64_t at = 0; at < c.batch; ++at) {
        expect_sequence_equal(c, got, at, [&] {
          AttnResults w = want;  // sequence `at` of want moved to position 0
          attn_copy_rows(want.out, at * c.seq, w.out, 0, c.seq);
          attn_copy_rows(want.dq, at * c.seq, w.dq, 0, c.seq);
          attn_copy_rows(want.dk, at * c.seq, w.dk, 0, c.seq);
          attn_copy_rows(want.dv, at * c.seq, w.dv, 0, c.seq);
          const std::size_t per = static_cast<std::size_t>(c.seq * c.heads * 2);
          std::copy_n(want.stats.begin() + static_cast<std::ptrdiff_t>(at * per), per, w.stats.begin());
          return w;
        }(), "variant " + std::to_string(v[0]) + "x" + std::to_string(v[1]) + "/" + std::to_string(v[2]) +
                 " head_dim " + std::to_string(d));
      }
    }
    cuda::attention_tc_set_variant(0, 0, 0);
  }
}

}  // namespace
}  // namespace cubesim::kernels::testing
