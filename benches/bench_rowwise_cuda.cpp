// bench_rowwise_cuda — the row-wise ops (RMSNorm, LayerNorm, SwiGLU, rotary, embedding, cross-entropy)
// on the cuda backend at a Llama-like layer's sizes (bench_tp_gpt's: 4096 tokens, hidden 4096, ffn
// 14336, 32 heads in 8 groups of head 128, bf16; a vocabulary slice of 32000), and the transformer
// layer step (forward + backward, tensor-core GEMMs) on the cuda backend.
//
// Each op runs on its GPU kernels (kernels/cuda/rowwise_cuda.h: the host's bits) and on the host path
// the backend took before them (CudaBackendOptions::rowwise_kernels = false: values copied to the host,
// computed there, copied back). The peer: a device-to-device copy of 2 x 235 MB in the same run, whose
// bandwidth is the HBM figure the kernels' are divided by ("of copy"). Bytes are each op's compulsory
// traffic (every input read once, every output written once).
//
//   bench_rowwise_cuda [--json FILE] [--quick] [--seq N] [--hidden N] [--ffn N] [--heads N] [--kv-heads N]
//                      [--vocab N] [--iters N] [--no-host] [--no-layer] [--tp N]
// --tp N: the layer step on N GPUs (NCCL; without sequence parallelism, as the PyTorch reference
// `torchrun --nproc_per_node N benches/torch_transformer_layer.py`).
// JSON: device, rows (op, bytes, gpu_us, gpu_gbps, of_copy, host_us), layer (tp, gpu_ms, host_ms).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "runtime/cuda_backend.h"
#include "runtime/ops.h"
#include "sim/core/barrier.h"
#include "tp/parallel_state.h"
#include "tp/transformer.h"

using namespace cubesim;
using namespace cubesim::bench;

namespace {

std::vector<float> noise(std::int64_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);  // [-1, 1)
  }
  return v;
}

struct Sizes {
  std::int64_t tokens = 4096, hidden = 4096, ffn = 14336, heads = 32, kv_heads = 8, vocab = 32000;
};

struct OpTime {
  std::string op;
  double bytes = 0, gpu_us = 0, host_us = -1;
};

// Every op once per `iters` (after one warm-up when iters > 1), the stream drained before and after.
std::vector<OpTime> time_ops(bool gpu, const Sizes& z, int iters) {
  rt::ContextOptions co;
  co.world_size = 1;
  auto ctx = rt::make_cuda_context(co, {.gemm_mode = cuda::GemmMode::tensor_core, .rowwise_kernels = gpu});
  auto& be = static_cast<rt::CudaBackend&>(ctx->backend());
  std::vector<OpTime> out;
  ctx->spawn(1, [&](int r) {
    const DType bf = DType::bf16;
    const std::int64_t T = z.tokens, H = z.hidden, F = z.ffn, V = z.vocab, d = H / z.heads, G = z.heads / z.kv_heads;
    auto make = [&](rt::Shape s, DType t, std::uint64_t seed, float scale = 2.0f) {
      std::int64_t n = 1;
      for (auto e : s) n *= e;
      return ctx->from_host_f32(r, s, t, noise(n, seed, scale));
    };
    rt::Tensor x = make({T, H}, bf, 1), dy = make({T, H}, bf, 2), w = make({H}, bf, 3), b = make({H}, bf, 4);
    rt::Tensor y = ctx->empty(r, {T, H}, bf), dx = ctx->empty(r, {T, H}, bf), dw = ctx->empty(r, {H}, bf),
               db = ctx->empty(r, {H}, bf);
    rt::Tensor rstd = ctx->empty(r, {T}, DType::f32), mean = ctx->empty(r, {T}, DType::f32);
    rt::Tensor gx = make({T, 2 * F}, bf, 5, 6.0f), gdy = make({T, F}, bf, 6), gy = ctx->empty(r, {T, F}, bf),
               gdx = ctx->empty(r, {T, 2 * F}, bf), gcopy = ctx->empty(r, {T, 2 * F}, bf);
    const kernels::AttentionShape s{.batch = 1, .seq_q = T, .seq_k = T, .heads = z.heads, .kv_heads = z.kv_heads,
                                    .head_dim = d};
    rt::Tensor qkv = make({T, z.kv_heads * (G + 2) * d}, bf, 7);
    rt::Tensor emb = make({V, H}, bf, 8), demb = ctx->empty(r, {V, H}, bf);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(T)), targets(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int64_t>((i * 7919) % static_cast<std::size_t>(V));
      targets[i] = static_cast<std::int64_t>((i * 104729 + 13) % static_cast<std::size_t>(V));
    }
    rt::Tensor logits = make({T, V}, bf, 9, 8.0f), dlogits = ctx->empty(r, {T, V}, bf);
    rt::Tensor mx = ctx->empty(r, {T}, DType::f32), part = ctx->empty(r, {2 * T}, DType::f32),
               loss = ctx->empty(r, {T}, DType::f32), dloss = make({T}, DType::f32, 10, 0.01f);
    const double e2 = 2;  // bf16 bytes
    const double TH = static_cast<double>(T * H), TF = static_cast<double>(T * F), TV = static_cast<double>(T * V);
    const double rot = static_cast<double>(T * (z.heads + z.kv_heads) * d);
    const std::vector<std::pair<std::pair<const char*, double>, std::function<void()>>> ops = {
        {{"copy (peer)", 2 * e2 * 2 * TF}, [&] { rt::copy(gx, gcopy); }},
        {{"rms_norm", 2 * e2 * TH}, [&] { rt::rms_norm(x, w, y, rstd, 1e-5f); }},
        {{"rms_norm_backward", 3 * e2 * TH}, [&] { rt::rms_norm_backward(x, w, dy, rstd, dx, dw); }},
        {{"layer_norm", 2 * e2 * TH}, [&] { rt::layer_norm(x, w, b, y, mean, rstd, 1e-5f); }},
        {{"layer_norm_backward", 3 * e2 * TH}, [&] { rt::layer_norm_backward(x, w, dy, mean, rstd, dx, dw, db); }},
        {{"swiglu", 3 * e2 * TF}, [&] { rt::swiglu(gx, gy); }},
        {{"swiglu_backward", 5 * e2 * TF}, [&] { rt::swiglu_backward(gx, gdy, gdx); }},
        {{"rotary_qkv", 2 * e2 * rot}, [&] { rt::rotary_qkv(s, qkv, 10000.0, false); }},
        {{"rotary_qkv backward", 2 * e2 * rot}, [&] { rt::rotary_qkv(s, qkv, 10000.0, true); }},
        {{"embedding", 2 * e2 * TH}, [&] { rt::embedding(emb, 0, ids, y); }},
        {{"embedding_backward", e2 * TH + e2 * static_cast<double>(V * H)}, [&] { rt::embedding_backward(dy, ids, 0, demb); }},
        {{"cross_entropy_max", e2 * TV}, [&] { rt::cross_entropy_max(logits, mx); }},
        {{"cross_entropy_partials", e2 * TV}, [&] { rt::cross_entropy_partials(logits, mx, targets, 0, part); }},
        {{"cross_entropy_backward", 2 * e2 * TV},
         [&] { rt::cross_entropy_backward(logits, mx, part, targets, 0, dloss, dlogits); }},
    };
    for (const auto& [what, fn] : ops) {
      if (iters > 1) fn();
      be.synchronize();
      const double t0 = wall_seconds();
      for (int i = 0; i < iters; ++i) fn();
      be.synchronize();
      out.push_back({what.first, what.second, 1e6 * (wall_seconds() - t0) / iters});
    }
  });
  return out;
}

// The layer step (forward + backward) in ms on tp GPUs (NCCL between them; Megatron's layout without
// sequence parallelism, as benches/torch_transformer_layer.py under torchrun): the median of `iters`
// after one warm-up, each step timed from every GPU drained to every GPU drained.
double time_layer(bool gpu, const Sizes& z, int iters, int tp = 1) {
  rt::ContextOptions co;
  co.world_size = tp;
  auto ctx = rt::make_cuda_context(co, {.gemm_mode = cuda::GemmMode::tensor_core,
                                        .collectives = tp > 1 ? rt::CudaCollectives::nccl : rt::CudaCollectives::ring,
                                        .rowwise_kernels = gpu});
  auto& be = static_cast<rt::CudaBackend&>(ctx->backend());
  std::vector<double> ms;
  sim::Barrier step_start(static_cast<std::size_t>(tp), "step start"), step_end(static_cast<std::size_t>(tp), "step end");
  ctx->spawn(tp, [&](int r) {
    tp::initialize_model_parallel(tp);
    tp::TransformerLayer layer(*ctx, {.hidden = z.hidden, .heads = z.heads, .kv_heads = z.kv_heads, .ffn = z.ffn,
                                      .seq = z.tokens, .norm = tp::NormKind::rms_norm, .swiglu = true, .rotary = true,
                                      .bias = false, .dtype = DType::bf16, .seed = 7});
    const rt::Tensor x = ctx->from_host_f32(r, {z.tokens, z.hidden}, DType::bf16, noise(z.tokens * z.hidden, 11));
    const rt::Tensor dy = ctx->from_host_f32(r, {z.tokens, z.hidden}, DType::bf16, noise(z.tokens * z.hidden, 12, 0.1f));
    double t0 = 0;
    for (int i = 0; i <= iters; ++i) {
      step_start.arrive_and_wait();  // the ranks run in turn on one thread: the last to arrive starts the clock
      if (r == 0) {
        be.synchronize();
        t0 = wall_seconds();
      }
      step_start.arrive_and_wait();
      layer.forward(x);
      layer.backward(dy);
      step_end.arrive_and_wait();
      if (r == 0) {
        be.synchronize();
        if (i > 0) ms.push_back(1e3 * (wall_seconds() - t0));
      }
    }
    tp::destroy_model_parallel();
  });
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args = parse_bench_args(argc, argv, "bench_rowwise_cuda");
  Sizes z;
  int iters = 20;
  bool host = true, layer = true;
  int layer_tp = 1;  // --tp N: the layer step on N GPUs
  try {
    for (std::size_t i = 0; i < args.rest.size(); ++i) {
      const std::string& a = args.rest[i];
      auto next = [&]() -> std::int64_t {
        if (i + 1 >= args.rest.size()) throw std::invalid_argument(a + " needs a value");
        return std::stoll(args.rest[++i]);
      };
      if (a == "--seq") z.tokens = next();
      else if (a == "--hidden") z.hidden = next();
      else if (a == "--ffn") z.ffn = next();
      else if (a == "--heads") z.heads = next();
      else if (a == "--kv-heads") z.kv_heads = next();
      else if (a == "--vocab") z.vocab = next();
      else if (a == "--iters") iters = static_cast<int>(next());
      else if (a == "--no-host") host = false;
      else if (a == "--no-layer") layer = false;
      else if (a == "--tp") layer_tp = static_cast<int>(next());
      else throw std::invalid_argument("unknown argument '" + a + "'");
    }
    if (iters < 1) throw std::invalid_argument("--iters must be at least 1");
    if (layer_tp < 1) throw std::invalid_argument("--tp must be at least 1");
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_rowwise_cuda: {} (valid: --json FILE, --quick, --seq N, --hidden N, --ffn N, --heads N, "
                       "--kv-heads N, --vocab N, --iters N, --no-host, --no-layer, --tp N)\n", e.what());
    return 2;
  }
  if (args.quick) z = {.tokens = 256, .hidden = 512, .ffn = 1024, .heads = 8, .kv_heads = 2, .vocab = 1000};
  if (rt::cuda_device_count() < 1) {
    fmt::print(stderr, "bench_rowwise_cuda: no usable GPU ({})\n", rt::cuda_unavailable_reason());
    return 3;
  }
  if (layer && layer_tp > rt::cuda_device_count()) {
    fmt::print(stderr, "bench_rowwise_cuda: --tp {} needs {} GPUs; this machine has {}\n", layer_tp, layer_tp,
               rt::cuda_device_count());
    return 2;
  }
  std::string device;
  {
    rt::ContextOptions co;
    co.world_size = 1;
    auto ctx = rt::make_cuda_context(co);
    device = static_cast<rt::CudaBackend&>(ctx->backend()).device_name(0);
  }
  std::vector<OpTime> rows = time_ops(true, z, iters);
  if (host) {
    const std::vector<OpTime> h = time_ops(false, z, 1);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i].host_us = h[i].gpu_us;
  }
  const double copy_gbps = rows[0].bytes / rows[0].gpu_us / 1e3;
  Table t({"op", "MB", "GPU us", "GB/s", "of copy", "host path us", "speedup"});
  nlohmann::json out = {{"bench", "bench_rowwise_cuda"}, {"device", device}, {"tokens", z.tokens}, {"hidden", z.hidden},
                        {"ffn", z.ffn}, {"heads", z.heads}, {"kv_heads", z.kv_heads}, {"vocab", z.vocab},
                        {"iters", iters}, {"rows", nlohmann::json::array()}};
  for (const OpTime& o : rows) {
    const double gbps = o.bytes / o.gpu_us / 1e3;
    t.row({o.op, fmt::format("{:.1f}", o.bytes / 1e6), fmt::format("{:.1f}", o.gpu_us), fmt::format("{:.0f}", gbps),
           fmt::format("{:.2f}", gbps / copy_gbps), o.host_us < 0 ? "-" : fmt::format("{:.0f}", o.host_us),
           o.host_us < 0 ? "-" : fmt::format("{:.0f}x", o.host_us / o.gpu_us)});
    out["rows"].push_back({{"op", o.op}, {"bytes", o.bytes}, {"gpu_us", o.gpu_us}, {"gpu_gbps", gbps},
                           {"of_copy", gbps / copy_gbps}, {"host_us", o.host_us}});
  }
  fmt::print("{}, {} tokens, hidden {}, ffn {}, heads {}/{}, vocab slice {}, bf16\n", device, z.tokens, z.hidden, z.ffn,
             z.heads, z.kv_heads, z.vocab);
  t.print();
  if (layer) {
    const double g = time_layer(true, z, std::max(3, iters), layer_tp);
    const double h = host ? time_layer(false, z, 1, layer_tp) : -1;
    // tensor_core mode: the tensor-core attention (kernels/attention_tc.h) wherever the call fits it.
    fmt::print("layer step (forward + backward, tensor-core GEMMs and attention, tp {}): {:.2f} ms with the row-wise "
               "kernels, {} on the host path\n",
               layer_tp, g, h < 0 ? "-" : fmt::format("{:.2f} ms", h));
    out["layer"] = {{"tp", layer_tp}, {"gpu_ms", g}, {"host_ms", h}};
  }
  write_json(args, out);
  return 0;
}
