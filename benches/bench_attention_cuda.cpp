// bench_attention_cuda — the tensor_core attention (kernels/attention_tc.h) on the GPU: forward and
// backward times (CUDA events, median of --reps) and TFLOP/s on Llama-like shapes, with a run-to-run
// bitwise check of every output. Its peer, PyTorch's SDPA, is timed by benches/torch_attention.py,
// which runs this binary and SDPA alternately in one process tree on the same shapes.
//
//   bench_attention_cuda [--json FILE] [--quick] [--batch 1,2] [--seq 4096] [--heads 32] [--kv-heads 8]
//                        [--dim 128] [--full] [--f16] [--reps 20] [--variant FWD_WARPS,FWD_ROWS16,BWD_WARPS]
//                        [--phases]  (also times the backward's kernels one at a time)
//
// FLOPs follow FlashAttention's convention, so TF/s compare with SDPA's: forward 4·b·h·s²·d (halved
// when causal), backward 2.5 times that.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cuda_check.h"

namespace {

using namespace cubesim;

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t c = s.find(',', at);
    v.push_back(std::stoi(s.substr(at, c == std::string::npos ? std::string::npos : c - at)));
    if (c == std::string::npos) break;
    at = c + 1;
  }
  return v;
}

struct Dev {
  void* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t bytes) : n(bytes) { CUBESIM_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
};

// Random 16-bit values in [-1, 1) (bf16 or f16 bits), never constant.
void fill(Dev& d, bool f16, std::uint64_t seed) {
  std::vector<std::uint16_t> h(d.n / 2);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& e : h) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const float f = static_cast<float>(static_cast<std::int64_t>(x >> 40) - (1 << 23)) / float(1 << 23);
    if (f16) {
      // f16: sign, 5-bit exponent, 10-bit mantissa from f32 by truncation (inputs only need to be random)
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      const int ex = static_cast<int>((u >> 23) & 255) - 127 + 15;
      e = ex <= 0 ? static_cast<std::uint16_t>((u >> 16) & 0x8000)
                  : static_cast<std::uint16_t>(((u >> 16) & 0x8000) | (ex << 10) | ((u >> 13) & 0x3ff));
    } else {
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      e = static_cast<std::uint16_t>(u >> 16);
    }
  }
  CUBESIM_CUDA_CHECK(cudaMemcpy(d.p, h.data(), d.n, cudaMemcpyHostToDevice));
}

std::vector<unsigned char> bytes(const Dev& d) {
  std::vector<unsigned char> h(d.n);
  CUBESIM_CUDA_CHECK(cudaMemcpy(h.data(), d.p, d.n, cudaMemcpyDeviceToHost));
  return h;
}

template <class F>
double median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  CUBESIM_CUDA_CHECK(cudaEventCreate(&a));
  CUBESIM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CUBESIM_CUDA_CHECK(cudaEventRecord(a));
    f();
    CUBESIM_CUDA_CHECK(cudaEventRecord(b));
    CUBESIM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUBESIM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  const bench::BenchArgs args = bench::parse_bench_args(argc, argv, "bench_attention_cuda");
  std::vector<int> batches = {1, 2};
  int seq = args.quick ? 1024 : 4096, heads = 32, kv_heads = 8, dim = 128, reps = args.quick ? 5 : 20;
  bool causal = true, f16 = false;
  std::vector<int> variant = {0, 0, 0};
  bool phases = false;
  for (std::size_t i = 0; i < args.rest.size(); ++i) {
    const std::string& a = args.rest[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= args.rest.size()) throw std::invalid_argument("bench_attention_cuda: " + a + " needs a value");
      return args.rest[++i];
    };
    if (a == "--batch") batches = parse_list(next());
    else if (a == "--seq") seq = std::stoi(next());
    else if (a == "--heads") heads = std::stoi(next());
    else if (a == "--kv-heads") kv_heads = std::stoi(next());
    else if (a == "--dim") dim = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--full") causal = false;
    else if (a == "--f16") f16 = true;
    else if (a == "--variant") variant = parse_list(next());
    else if (a == "--phases") phases = true;
    else throw std::invalid_argument("bench_attention_cuda: unknown argument " + a);
  }
  if (variant.size() != 3) throw std::invalid_argument("bench_attention_cuda: --variant takes three numbers");
  cuda::attention_tc_set_variant(variant[0], variant[1], variant[2]);
  cudaDeviceProp prop{};
  CUBESIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const DType dt = f16 ? DType::f16 : DType::bf16;

  bench::Table table({"shape", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "bitwise repeat"});
  nlohmann::json rows = nlohmann::json::array();
  for (int b : batches) {
    const kernels::AttentionShape s{.batch = b, .seq_q = seq, .seq_k = seq, .heads = heads, .kv_heads = kv_heads,
                                    .head_dim = dim, .causal = causal};
    const std::size_t tq = static_cast<std::size_t>(b) * seq, qw = static_cast<std::size_t>(heads) * dim,
                      kw = static_cast<std::size_t>(kv_heads) * dim;
    Dev q(tq * qw * 2), k(tq * kw * 2), v(tq * kw * 2), o(tq * qw * 2), dout(tq * qw * 2), dq(tq * qw * 2),
        dk(tq * kw * 2), dv(tq * kw * 2), stats(tq * heads * 2 * 4), ws(cuda::attention_tc_backward_workspace_bytes(s));
    fill(q, f16, 1);
    fill(k, f16, 2);
    fill(v, f16, 3);
    fill(dout, f16, 4);
    const auto in = [&](const Dev& d, std::size_t w) {
      return kernels::AttentionBuffer{d.p, dt, static_cast<std::int64_t>(w)};
    };
    const auto out = [&](Dev& d, std::size_t w) {
      return kernels::MutableAttentionBuffer{d.p, dt, static_cast<std::int64_t>(w)};
    };
    auto fwd = [&] {
      cuda::attention_forward_tc(s, in(q, qw), in(k, kw), in(v, kw), out(o, qw), static_cast<float*>(stats.p), nullptr,
                                 nullptr);
    };
    auto bwd = [&] {
      cuda::attention_backward_tc(s, in(q, qw), in(k, kw), in(v, kw), in(o, qw), static_cast<const float*>(stats.p),
                                  in(dout, qw), out(dq, qw), out(dk, kw), out(dv, kw), nullptr, ws.p, nullptr);
    };
    for (int i = 0; i < 3; ++i) fwd(), bwd();
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto o1 = bytes(o), q1 = bytes(dq), k1 = bytes(dk), v1 = bytes(dv);
    const double f_ms = median_ms(fwd, reps);
    const double b_ms = median_ms(bwd, reps);
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    const bool same = o1 == bytes(o) && q1 == bytes(dq) && k1 == bytes(dk) && v1 == bytes(dv);
    if (phases) {  // the backward's kernels one at a time (prep runs in both)
      cuda::attention_tc_set_variant(variant[0], variant[1], variant[2], 1);
      const double dq_ms = median_ms(bwd, reps);
      cuda::attention_tc_set_variant(variant[0], variant[1], variant[2], 2);
      const double dkdv_ms = median_ms(bwd, reps);
      cuda::attention_tc_set_variant(variant[0], variant[1], variant[2], 0);
      const double prep_ms = median_ms(bwd, reps);
      cuda::attention_tc_set_variant(variant[0], variant[1], variant[2], 3);
      fmt::print("b{} backward phases: prep {:.3f} ms, prep+dq {:.3f} ms, prep+dkdv {:.3f} ms\n", b, prep_ms, dq_ms,
                 dkdv_ms);
    }
    const double flops = 4.0 * b * heads * double(seq) * seq * dim * (causal ? 0.5 : 1.0);
    const std::string shape = fmt::format("b{} s{} h{}/{} d{} {} {}", b, seq, heads, kv_heads, dim,
                                          causal ? "causal" : "full", f16 ? "f16" : "bf16");
    table.row({shape, fmt::format("{:.3f}", f_ms), fmt::format("{:.1f}", flops / f_ms * 1e-9),
               fmt::format("{:.3f}", b_ms), fmt::format("{:.1f}", 2.5 * flops / b_ms * 1e-9), same ? "yes" : "NO"});
    rows.push_back({{"batch", b}, {"seq", seq}, {"heads", heads}, {"kv_heads", kv_heads}, {"head_dim", dim},
                    {"causal", causal}, {"dtype", f16 ? "f16" : "bf16"}, {"fwd_ms", f_ms}, {"bwd_ms", b_ms},
                    {"fwd_tflops", flops / f_ms * 1e-9}, {"bwd_tflops", 2.5 * flops / b_ms * 1e-9},
                    {"bitwise_repeat", same}});
  }
  fmt::print("bench_attention_cuda on {} (variant {},{},{})\n", prop.name, variant[0], variant[1], variant[2]);
  table.print();
  bench::write_json(args, {{"bench", "bench_attention_cuda"}, {"gpu", prop.name}, {"rows", rows},
                           {"variant", variant}});
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_attention_cuda: %s\n", e.what());
  return 1;
}
