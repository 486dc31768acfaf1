// The attention contract's case table (tests/kernels/attention_cases.h) on the GPU's exact-mode
// kernels (kernels/cuda/attention_cuda.h): every case bitwise the host definition, and batch
// invariance, padding and chunked prefill on the device. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

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

AttentionBackend cuda_exact_attention() {
  AttentionBackend be;
  be.name = "cuda_exact";
  be.unavailable = no_gpu;
  be.forward = [](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                  MutableAttentionBuffer o, float* stats, const std::int64_t* kv_valid) {
    const std::int64_t G = s.heads / s.kv_heads, tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, d = s.head_dim;
    OnDevice dq(q.data, extent(q, tq, s.heads, G, d)), dk(k.data, extent(k, tk, s.kv_heads, 1, d)),
        dv(v.data, extent(v, tk, s.kv_heads, 1, d)), dout(o.data, extent(o, tq, s.heads, G, d)),
        dst(stats, sizeof(float) * static_cast<std::size_t>(tq * s.heads * 2)),
        dkv(kv_valid, kv_valid ? sizeof(std::int64_t) * static_cast<std::size_t>(s.batch) : 0);
    cuda::attention_forward(s, on(q, dq), on(k, dk), on(v, dv), on(o, dout), static_cast<float*>(dst.dev()),
                            kv_valid ? static_cast<const std::int64_t*>(dkv.dev()) : nullptr, nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    dout.back();
    dst.back();
  };
  be.backward = [](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v, AttentionBuffer o,
                   const float* stats, AttentionBuffer dout, MutableAttentionBuffer dq, MutableAttentionBuffer dk,
                   MutableAttentionBuffer dv, const std::int64_t* kv_valid) {
    const std::int64_t G = s.heads / s.kv_heads, tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, d = s.head_dim;
    OnDevice Q(q.data, extent(q, tq, s.heads, G, d)), K(k.data, extent(k, tk, s.kv_heads, 1, d)),
        V(v.data, extent(v, tk, s.kv_heads, 1, d)), O(o.data, extent(o, tq, s.heads, G, d)),
        ST(stats, sizeof(float) * static_cast<std::size_t>(tq * s.heads * 2)),
        DO(dout.data, extent(dout, tq, s.heads, G, d)), DQ(dq.data, extent(dq, tq, s.heads, G, d)),
        DK(dk.data, extent(dk, tk, s.kv_heads, 1, d)), DV(dv.data, extent(dv, tk, s.kv_heads, 1, d)),
        KV(kv_valid, kv_valid ? sizeof(std::int64_t) * static_cast<std::size_t>(s.batch) : 0);
    std::vector<std::uint8_t> ws(cuda::attention_backward_workspace_bytes(s));
    OnDevice W(ws.data(), ws.size());
    cuda::attention_backward(s, on(q, Q), on(k, K), on(v, V), on(o, O), static_cast<const float*>(ST.dev()),
                             on(dout, DO), on(dq, DQ), on(dk, DK), on(dv, DV),
                             kv_valid ? static_cast<const std::int64_t*>(KV.dev()) : nullptr, W.dev(), nullptr);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    DQ.back();
    DK.back();
    DV.back();
  };
  return be;
}

INSTANTIATE_ATTENTION_CONTRACT(Cuda, ::testing::Values(cuda_exact_attention()));

}  // namespace
}  // namespace cubesim::kernels::testing
