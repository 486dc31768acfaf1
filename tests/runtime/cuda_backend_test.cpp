// The cuda backend on 1, 2 and 4 GPUs: collectives over the deterministic ring (every algorithm)
// bitwise equal to the host replay; NCCL collectives within tolerance (bitwise where no arithmetic
// is involved); the device kernels bitwise equal to the host ops; the TP MLP with exact GEMMs and
// the ring bitwise equal to the host replay, with tensor-core GEMMs and NCCL within tolerance; the
// caching allocator; CUDA graphs (recorded work launched again, bitwise the work run as it is); and
// the errors (no GPU, fewer GPUs than ranks, a failing CUDA call, the host inside a recording).
// Every test that needs GPUs skips when fewer are present, so CI (no GPU) compiles and skips.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include <fmt/format.h>

#include "collective_harness.h"
#include "runtime/comm.h"
#include "runtime/cuda_backend.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "sim/hw/errors.h"
#include "tp/equivalence.h"
#include "tp/gpt_step.h"
#include "tp/mlp_step.h"
#include "tp/transformer_step.h"

namespace cubesim::rt::testing {
namespace {

#define NEED_GPUS(n)                                                                              \
  do {                                                                                            \
    const int have_ = cuda_device_count();                                                        \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " GPU(s), " << have_ << " present"        \
                                  << (have_ == 0 ? " (" + cuda_unavailable_reason() + ")" : ""); \
  } while (0)

Factory cuda_with(cuda::GemmMode g, CudaCollectives c) {
  return [g, c](int ranks) {
    ContextOptions o;
    o.world_size = ranks;
    return make_cuda_context(o, {.gemm_mode = g, .collectives = c});
  };
}
const Factory cuda_ring = cuda_with(cuda::GemmMode::exact, CudaCollectives::ring);
const Factory cuda_nccl = cuda_with(cuda::GemmMode::tensor_core, CudaCollectives::nccl);

std::vector<CollCase> cases_up_to(int max_ranks) {
  std::vector<CollCase> out;
  for (const CollCase& c : all_cases()) {
    if (c.ranks <= max_ranks) out.push_back(c);
  }
  return out;
}

// ---------------------------------------------------------------- the deterministic ring
class CudaRingCollectives : public ::testing::TestWithParam<CollCase> {};

TEST_P(CudaRingCollectives, BitwiseEqualToHostReplay) {
  const CollCase c = GetParam();
  NEED_GPUS(c.ranks);
  const CollResult h = run_collective(host_context, c);
  const CollResult g = run_collective(cuda_ring, c);
  for (int k = 0; k < c.ranks; ++k) {
    ASSERT_EQ(g.out_bytes[static_cast<std::size_t>(k)], h.out_bytes[static_cast<std::size_t>(k)]) << "rank " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(UpTo4Gpus, CudaRingCollectives, ::testing::ValuesIn(cases_up_to(4)),
                         [](const auto& info) { return info.param.name(); });

TEST(CudaRing, OneRankLeavesTheTensorAsItIs) {
  NEED_GPUS(1);
  for (const char* coll : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}) {
    CollCase c{coll, Algorithm::ring, DType::bf16, 1, 1000};
    const CollResult h = run_collective(host_context, c);
    const CollResult g = run_collective(cuda_ring, c);
    EXPECT_EQ(g.out_bytes[0], h.out_bytes[0]) << coll;
  }
}

// ---------------------------------------------------------------- NCCL
double rel_norm(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = static_cast<double>(got[i]) - ref[i];
    num += std::isfinite(e) ? e * e : INFINITY;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

class CudaNcclCollectives : public ::testing::TestWithParam<CollCase> {};

TEST_P(CudaNcclCollectives, AgreeWithHostReplay) {
  const CollCase c = GetParam();
  NEED_GPUS(c.ranks);
  const CollResult h = run_collective(host_context, c);
  const CollResult g = run_collective(cuda_nccl, c);
  // Moving data and max involve no rounding: bitwise. Sums: NCCL's own order, within tolerance.
  const bool exact = c.coll == "all_gather" || c.coll == "broadcast" || c.op == ReduceOp::max;
  const double u = c.dtype == DType::f32 ? std::ldexp(1.0, -24) : c.dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  for (int k = 0; k < c.ranks; ++k) {
    const auto ks = static_cast<std::size_t>(k);
    if (exact) {
      EXPECT_EQ(g.out_bytes[ks], h.out_bytes[ks]) << "rank " << k;
    } else {
      EXPECT_LE(rel_norm(g.out[ks], h.out[ks]), 2.0 * c.ranks * u) << "rank " << k;
    }
    if (c.coll != "reduce_scatter") {
      EXPECT_EQ(g.out_bytes[ks], g.out_bytes[0]) << "rank " << k << " differs from rank 0";
    }
  }
}

std::vector<CollCase> nccl_cases() {
  std::vector<CollCase> out;
  std::uint64_t seed = 900;
  for (const char* coll : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      for (int p : {2, 4}) {
        CollCase c{coll, Algorithm::ring, d, p, 4096 + 64};
        c.seed = ++seed;
        c.root = p - 1;
        out.push_back(c);
      }
    }
  }
  CollCase m{"all_reduce", Algorithm::ring, DType::bf16, 4, 777, ReduceOp::max};
  m.seed = ++seed;
  out.push_back(m);
  CollCase big{"all_reduce", Algorithm::ring, DType::bf16, 4, 1 << 22};
  big.seed = ++seed;
  out.push_back(big);
  return out;
}

INSTANTIATE_TEST_SUITE_P(UpTo4Gpus, CudaNcclCollectives, ::testing::ValuesIn(nccl_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------- device kernels
// Every elementwise op and reduction on the GPU gives the host's bits (random data, every dtype).
TEST(CudaKernels, ElementwiseAndReduceEqualHostBits) {
  NEED_GPUS(1);
  auto g = cuda_ring(1);
  auto h = host_context(1);
  std::mt19937_64 rng(42);
  // 67 x 129: the bf16 kernels' element-by-element tails and columns that cut their vectors; 300 x 1024:
  // their 16-byte vectors throughout, and a bias gradient over two whole row chunks and part of a third.
  for (auto [R, C] : {std::pair<std::int64_t, std::int64_t>{67, 129}, {300, 1024}})
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::to_string(R) + " x " + std::to_string(C));
    const auto xa = random_values(R * C, d, rng), xb = random_values(R * C, d, rng), bias = random_values(C, d, rng);
    std::vector<float> xs(xa);
    for (std::size_t i = 0; i < xs.size(); i += 7) xs[i] *= 3.0f;  // GELU's tails too
    if (d != DType::f32) {  // specials (an f32 NaN's payload is the hardware's: see the reduce test)
      xs[5] = std::numeric_limits<float>::quiet_NaN();
      xs[6] = std::numeric_limits<float>::infinity();
      xs[10] = -0.0f;
    }
    auto run = [&](Context& ctx) {
      std::map<std::string, std::vector<std::uint8_t>> out;
      ctx.spawn(1, [&](int r) {
        Tensor a = ctx.from_host_f32(r, {R, C}, d, xs), b = ctx.from_host_f32(r, {R, C}, d, xb);
        Tensor bv = ctx.from_host_f32(r, {C}, d, bias);
        Tensor y = ctx.empty(r, {R, C}, d);
        for (auto k : {kernels::GeluKind::tanh, kernels::GeluKind::erf}) {
          const std::string kn(kernels::gelu_kind_name(k));
          gelu(k, a, y);
          out["gelu_" + kn] = y.to_host_bytes();
          gelu_backward(k, a, b, y);
          out["gelu_backward_" + kn] = y.to_host_bytes();
          Tensor pre = ctx.empty(r, {R, C}, d);
          bias_gelu(k, a, bv, pre, y);
          out["bias_gelu_pre_" + kn] = pre.to_host_bytes();
          out["bias_gelu_" + kn] = y.to_host_bytes();
        }
        add(a, b, y);
        out["add"] = y.to_host_bytes();
        add_bias(a, bv, y);
        out["add_bias"] = y.to_host_bytes();
        Tensor db = ctx.empty(r, {C}, d);
        bias_grad(b, db);
        out["bias_grad"] = db.to_host_bytes();
        Tensor c2 = ctx.empty(r, {R, C}, d);
        rt::copy(b, c2);
        out["copy"] = c2.to_host_bytes();
      });
      return out;
    };
    const auto hv = run(*h), gv = run(*g);
    for (const auto& [name, bytes] : hv) EXPECT_EQ(gv.at(name), bytes) << name << " " << dtype_name(d);
  }
}

// The bias gradient's bf16 paths (8-warp blocks; widened transposed tiles from 2048 rows; a warp per
// 32 columns with a ring of row chunks in flight) over shapes that cut their chunks and columns every way: fewer rows than a chunk, a chunk and
// one row, many chunks and a part; columns a multiple of 8 but not of 32 (the 16-byte vectors), and not
// of 8 (the element-by-element path); -0 and infinities of both signs (in different columns: inf - inf's
// NaN payload is the hardware's) among the values. Bits equal to the host's chain.
TEST(CudaKernels, BiasGradEqualsHostBitsAcrossShapes) {
  NEED_GPUS(1);
  auto g = cuda_ring(1);
  auto h = host_context(1);
  std::mt19937_64 rng(1818);
  // Up to 8192 columns the 8-warp block runs; from 2 x 132 SMs x 32 = 8448 columns (on an H100 or
  // H200) a warp per 32 columns: 8456 and 40960 columns take that path on any GPU of up to 640 SMs.
  for (auto [R, C] : {std::pair<std::int64_t, std::int64_t>{1, 8}, {3, 40}, {127, 96}, {129, 264}, {1000, 200},
                      {2333, 1032}, {4099, 4104}, {8200, 96}, {70, 33}, {1, 8448}, {130, 8456}, {1100, 8712}, {67, 40960}})
  for (DType d : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(std::to_string(R) + " x " + std::to_string(C) + " " + std::string(dtype_name(d)));
    auto xs = random_values(R * C, d, rng);
    for (std::size_t i = 0; i < xs.size(); i += 97) xs[i] *= 1024.0f;  // cancellations in the chain
    if (xs.size() > 40) {
      xs[C % xs.size()] = -0.0f;
      xs[xs.size() - 1] = std::numeric_limits<float>::infinity();
      xs[xs.size() / 2] = -std::numeric_limits<float>::infinity();
    }
    auto run = [&](Context& ctx) {
      std::vector<std::uint8_t> out;
      ctx.spawn(1, [&](int r) {
        Tensor a = ctx.from_host_f32(r, {R, C}, d, xs);
        Tensor db = ctx.from_host_f32(r, {C}, d, std::vector<float>(static_cast<std::size_t>(C), 12345.0f));
        bias_grad(a, db);
        out = db.to_host_bytes();
      });
      return out;
    };
    EXPECT_EQ(run(*g), run(*h));
  }
}

// The bf16 GELU kernels look values up in tables of every bf16 input: every one of the 65536 bit
// patterns (zeros, subnormals, infinities, NaNs) through gelu, gelu_backward and bias_gelu gives the
// host's bits, both kinds.
TEST(CudaKernels, GeluOverEveryBf16InputEqualsHostBits) {
  NEED_GPUS(1);
  auto g = cuda_ring(1);
  auto h = host_context(1);
  std::mt19937_64 rng(4242);
  const std::int64_t R = 256, C = 256;
  std::vector<std::uint8_t> every(R * C * 2);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    every[2 * i] = static_cast<std::uint8_t>(i & 0xff);
    every[2 * i + 1] = static_cast<std::uint8_t>(i >> 8);
  }
  const auto dyv = random_values(R * C, DType::bf16, rng), bias = random_values(C, DType::bf16, rng);
  auto run = [&](Context& ctx) {
    std::map<std::string, std::vector<std::uint8_t>> out;
    ctx.spawn(1, [&](int r) {
      Tensor x = ctx.empty(r, {R, C}, DType::bf16);
      x.copy_from_host_bytes(every.data(), every.size());
      Tensor dy = ctx.from_host_f32(r, {R, C}, DType::bf16, dyv), bv = ctx.from_host_f32(r, {C}, DType::bf16, bias);
      Tensor y = ctx.empty(r, {R, C}, DType::bf16), pre = ctx.empty(r, {R, C}, DType::bf16);
      for (auto k : {kernels::GeluKind::tanh, kernels::GeluKind::erf}) {
        const std::string kn(kernels::gelu_kind_name(k));
        gelu(k, x, y);
        out["gelu_" + kn] = y.to_host_bytes();
        gelu_backward(k, x, dy, y);
        out["gelu_backward_" + kn] = y.to_host_bytes();
        bias_gelu(k, x, bv, pre, y);
        out["bias_gelu_" + kn] = y.to_host_bytes();
      }
    });
    return out;
  };
  const auto hv = run(*h), gv = run(*g);
  for (const auto& [name, bytes] : hv) {
    const auto& got = gv.at(name);
    std::int64_t diff = 0, first = -1;
    for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
      if (got[i] != bytes[i] || got[i + 1] != bytes[i + 1]) {
        ++diff;
        if (first < 0) first = static_cast<std::int64_t>(i / 2);
      }
    }
    EXPECT_EQ(diff, 0) << name << ": first differing input pattern 0x" << std::hex << first;
  }
}

// Asynchronous NCCL collectives run beside the rank's later work (a side stream): an all_reduce (in
// place: the side stream) and a reduce_scatter and all_gather (staging copies: ordered on the
// stream), each launched async with a GEMM queued before wait() and the input's tensor handle
// dropped at once, give the bits of the same collectives run synchronously, and a Work nobody
// waits for is ordered before the next run.
TEST(CudaNccl, AsyncCollectivesEqualTheSynchronousOnes) {
  NEED_GPUS(2);
  auto ctx = cuda_nccl(2);
  std::mt19937_64 rng(77);
  const std::int64_t n = 1 << 20, k = 512;
  std::vector<std::vector<float>> in(2);
  for (auto& v : in) v = random_values(n, DType::bf16, rng);
  const auto wa = random_values(k * k, DType::bf16, rng);
  auto run = [&](bool async) {
    std::vector<std::vector<std::uint8_t>> out(6);
    ctx->spawn(2, [&](int r) {
      const auto i = static_cast<std::size_t>(r);
      Tensor a = ctx->from_host_f32(r, {k, k}, DType::bf16, wa), y = ctx->empty(r, {k, k}, DType::bf16);
      Tensor t = ctx->from_host_f32(r, {n}, DType::bf16, in[i]);
      Tensor keep = t;  // the result is read through this handle; the one given to the call is dropped
      CollectiveOptions o;
      o.async_op = async;
      Work w = all_reduce(t, ReduceOp::sum, &ctx->world(), o);
      t = Tensor();
      matmul(a, a.t(), nullptr, y, "beside");
      w.wait();
      out[i] = keep.to_host_bytes();
      Tensor rs = ctx->empty(r, {n / 2}, DType::bf16), ag = ctx->empty(r, {n}, DType::bf16);
      Work w2 = reduce_scatter(rs, keep, ReduceOp::sum, &ctx->world(), o);
      matmul(a, a.t(), nullptr, y, "beside");
      w2.wait();
      Work w3 = all_gather(ag, rs, &ctx->world(), o);
      matmul(a, a.t(), nullptr, y, "beside");
      w3.wait();
      out[2 + i] = rs.to_host_bytes();
      out[4 + i] = ag.to_host_bytes();
      if (async) (void)all_reduce(keep, ReduceOp::sum, &ctx->world(), o);  // never waited for
    });
    return out;
  };
  const auto sync = run(false), async = run(true), again = run(false);
  for (std::size_t i = 0; i < sync.size(); ++i) EXPECT_EQ(async[i], sync[i]) << "output " << i;
  EXPECT_EQ(again, sync) << "a run after one that left a collective unwaited";
}

TEST(CudaKernels, ReduceEqualsHostReduceValues) {
  NEED_GPUS(1);
  auto ctx = cuda_ring(1);
  auto& be = ctx->backend();
  std::mt19937_64 rng(7);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      const std::int64_t n = 10007;
      auto a = random_values(n, d, rng), b = random_values(n, d, rng);
      // NaN: max gives the quiet NaN on both sides; an f32 sum's NaN payload is the hardware's
      // (x86 keeps the operand's, CUDA gives the canonical one), so f32 sums are checked without.
      if (op == ReduceOp::max || d != DType::f32) a[3] = std::numeric_limits<float>::quiet_NaN();
      b[5] = -std::numeric_limits<float>::infinity();
      a[8] = -0.0f;
      b[8] = 0.0f;
      std::vector<std::uint8_t> want, got;
      ctx->spawn(1, [&](int r) {
        Tensor ta = ctx->from_host_f32(r, {n}, d, a), tb = ctx->from_host_f32(r, {n}, d, b);
        want = ta.to_host_bytes();
        const auto bb = tb.to_host_bytes();
        reduce_values(want.data(), bb.data(), d, n, op);
        ASSERT_TRUE(be.reduce(ta, tb, op));
        got = ta.to_host_bytes();
      });
      EXPECT_EQ(got, want) << dtype_name(d) << " " << reduce_op_name(op);
    }
  }
}

// ---------------------------------------------------------------- TP MLP
struct MlpCase {
  int tp;
  bool sp;
  bool exact;  // exact GEMM + ring, else tensor_core + NCCL
  std::string name() const {
    return fmt::format("tp{}_{}_{}", tp, sp ? "sp" : "nosp", exact ? "exact_ring" : "tensorcore_nccl");
  }
};

class CudaMlp : public ::testing::TestWithParam<MlpCase> {};

TEST_P(CudaMlp, AgreesWithHostAndUnshardedModel) {
  const MlpCase c = GetParam();
  NEED_GPUS(c.tp);
  auto ctx = (c.exact ? cuda_ring : cuda_nccl)(c.tp);
  tp::MlpCheckOptions o;
  o.tp = c.tp;
  o.tokens = 96;
  o.mlp.hidden = 256;
  o.mlp.ffn = 1024;
  o.mlp.sequence_parallel = c.sp;
  o.mlp.seed = 31 + c.tp;
  o.data_seed = 8 + c.tp;
  const tp::EquivalenceReport rep = tp::check_mlp_equivalence(*ctx, o);
  int replay = 0;
  for (const auto& t : rep.checks) {
    if (t.against == "host replay") ++replay;
    if (c.exact) {
      // Exact GEMMs and the ring: every claim as on sim (bitwise against the host replay).
      EXPECT_TRUE(t.pass) << t.tensor << " vs " << t.against << ": bitwise " << t.bitwise << ", max abs " << t.max_abs
                          << ", rel " << t.rel_norm << " (tol " << t.tolerance << ")";
    } else if (t.against == "ranks") {
      EXPECT_TRUE(t.bitwise) << t.tensor << ": ranks differ";
    } else {
      // Tensor cores and NCCL make no bitwise claim: every tensor within the tp tolerance.
      EXPECT_LE(t.rel_norm, tp::tp_tolerance(o.mlp.dtype, std::max(c.tp, 2)))
          << t.tensor << " vs " << t.against << ": max abs " << t.max_abs;
    }
  }
  EXPECT_EQ(replay, 7);
}

INSTANTIATE_TEST_SUITE_P(Gpus1to4, CudaMlp,
                         ::testing::Values(MlpCase{1, false, true}, MlpCase{2, false, true}, MlpCase{4, false, true},
                                           MlpCase{2, true, true}, MlpCase{4, true, true}, MlpCase{1, false, false},
                                           MlpCase{2, false, false}, MlpCase{4, false, false}, MlpCase{4, true, false}),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------- the row-wise ops on the GPU
// Norms, SwiGLU, rotary, the embedding and the cross-entropy pieces (kernels/cuda/rowwise_cuda.h) on
// the cuda backend, bitwise the host's, on random data: rows of 1, 7, 128, 300 and 4097 columns
// (chunks of the row and column sweeps cut anywhere), 1 to 70 rows (sweep blocks of 32 cut), every
// dtype, strided rows; every output poisoned (NaN) first. `Each` runs one case on both backends.
using Outputs = std::map<std::string, std::vector<std::uint8_t>>;

void expect_same_on_gpu(const std::function<void(Context&, int, Outputs&)>& body, const std::string& what) {
  Outputs want, got;
  auto h = host_context(1);
  h->spawn(1, [&](int r) { body(*h, r, want); });
  auto g = cuda_ring(1);
  g->spawn(1, [&](int r) { body(*g, r, got); });
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, bytes] : want) EXPECT_EQ(got.at(name), bytes) << what << " " << name;
}

Tensor poisoned(Context& ctx, int r, Shape shape, DType d) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  return ctx.from_host_f32(r, shape, d, std::vector<float>(static_cast<std::size_t>(n), std::nanf("")));
}

TEST(CudaRowwise, NormsEqualHostBits) {
  NEED_GPUS(1);
  std::mt19937_64 rng(19001);
  // 128 and 1000 (with strided rows of n + 8): the 16-byte vector path of the y and dx passes.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {3, 7}, {33, 4097}, {70, 128}, {2, 300}, {65, 1000}};
  for (auto [R, n] : shapes)
    for (DType d : {DType::f32, DType::bf16, DType::f16})
      for (bool strided : {false, true}) {
        const auto xs = random_values(R * (n + 8), d, rng), dys = random_values(R * n, d, rng),
                   ws = random_values(n, d, rng), bs = random_values(n, d, rng);
        expect_same_on_gpu(
            [&](Context& ctx, int r, Outputs& out) {
              // Strided: x and dx are columns [8, 8 + n) of [R, n + 8] tensors.
              Tensor xb = ctx.from_host_f32(r, {R, n + 8}, d, xs);
              Tensor x = strided ? xb.narrow(1, 8, n) : ctx.from_host_f32(r, {R, n}, d, std::vector<float>(xs.begin(), xs.begin() + R * n));
              Tensor dy = ctx.from_host_f32(r, {R, n}, d, dys), w = ctx.from_host_f32(r, {n}, d, ws),
                     b = ctx.from_host_f32(r, {n}, d, bs);
              Tensor y = poisoned(ctx, r, {R, n}, d), rstd = poisoned(ctx, r, {R}, DType::f32),
                     mean = poisoned(ctx, r, {R}, DType::f32);
              Tensor dxb = poisoned(ctx, r, {R, n + 8}, d);
              Tensor dx = strided ? dxb.narrow(1, 8, n) : poisoned(ctx, r, {R, n}, d);
              Tensor dw = poisoned(ctx, r, {n}, d), db = poisoned(ctx, r, {n}, d);
              rms_norm(x, w, y, rstd, 1e-5f);
              out["rms y"] = y.to_host_bytes();
              out["rms rstd"] = rstd.to_host_bytes();
              rms_norm_backward(x, w, dy, rstd, dx, dw);
              out["rms dx"] = dx.to_host_bytes();
              out["rms dw"] = dw.to_host_bytes();
              y = poisoned(ctx, r, {R, n}, d);
              dxb = poisoned(ctx, r, {R, n + 8}, d);
              dx = strided ? dxb.narrow(1, 8, n) : poisoned(ctx, r, {R, n}, d);
              dw = poisoned(ctx, r, {n}, d);
              rstd = poisoned(ctx, r, {R}, DType::f32);
              layer_norm(x, w, b, y, mean, rstd, 1e-5f);
              out["ln y"] = y.to_host_bytes();
              out["ln mean"] = mean.to_host_bytes();
              out["ln rstd"] = rstd.to_host_bytes();
              layer_norm_backward(x, w, dy, mean, rstd, dx, dw, db);
              out["ln dx"] = dx.to_host_bytes();
              out["ln dw"] = dw.to_host_bytes();
              out["ln db"] = db.to_host_bytes();
              out["dx's whole rows"] = dxb.to_host_bytes();  // the columns outside the view untouched
              // In place: the backward's dx over dy (every element read before it is written).
              Tensor dy2 = ctx.from_host_f32(r, {R, n}, d, dys);
              rms_norm_backward(x, w, dy2, rstd, dy2, dw);
              out["rms dx in place"] = dy2.to_host_bytes();
            },
            fmt::format("{} x {} {}{}", R, n, dtype_name(d), strided ? " strided" : ""));
      }
}

TEST(CudaRowwise, SwigluAndRotaryEqualHostBits) {
  NEED_GPUS(1);
  std::mt19937_64 rng(19002);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    // f % 8 == 0: the 16-byte vector path; the others one element at a time.
    for (auto [R, f] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 13}, {40, 4097}, {33, 264}}) {
      auto xs = random_values(R * 2 * f, d, rng);
      for (std::size_t i = 0; i < xs.size(); i += 5) xs[i] *= 20.0f;  // sigmoid's tails
      const auto dys = random_values(R * f, d, rng);
      expect_same_on_gpu(
          [&](Context& ctx, int r, Outputs& out) {
            Tensor x = ctx.from_host_f32(r, {R, 2 * f}, d, xs), dy = ctx.from_host_f32(r, {R, f}, d, dys);
            Tensor y = poisoned(ctx, r, {R, f}, d), dx = poisoned(ctx, r, {R, 2 * f}, d);
            swiglu(x, y);
            swiglu_backward(x, dy, dx);
            out["y"] = y.to_host_bytes();
            out["dx"] = dx.to_host_bytes();
          },
          fmt::format("swiglu {} x {} {}", R, f, dtype_name(d)));
    }
    const kernels::AttentionShape shapes[] = {
        {.batch = 1, .seq_q = 1, .seq_k = 1, .heads = 1, .kv_heads = 1, .head_dim = 2},
        {.batch = 2, .seq_q = 7, .seq_k = 7, .heads = 4, .kv_heads = 2, .head_dim = 6},
        {.batch = 3, .seq_q = 37, .seq_k = 37, .heads = 6, .kv_heads = 2, .head_dim = 64}};
    for (const auto& s : shapes) {
      const std::int64_t T = s.batch * s.seq_q, W = s.kv_heads * (s.heads / s.kv_heads + 2) * s.head_dim;
      const auto xs = random_values(T * (W + 8), d, rng);
      expect_same_on_gpu(
          [&](Context& ctx, int r, Outputs& out) {
            // The QKV as columns [8, 8 + W) of wider rows: strided, and the columns around untouched (head_dim
            // 64: 16-byte vectors; the others one element at a time).
            Tensor xb = ctx.from_host_f32(r, {T, W + 8}, d, xs);
            Tensor qkv = xb.narrow(1, 8, W);
            rotary_qkv(s, qkv, 10000.0, false);
            out["forward"] = xb.to_host_bytes();
            rotary_qkv(s, qkv, 500.0, true);
            out["inverse"] = xb.to_host_bytes();
          },
          fmt::format("rotary heads {} kv {} d {} seq {} {}", s.heads, s.kv_heads, s.head_dim, s.seq_q, dtype_name(d)));
    }
  }
}

TEST(CudaRowwise, EmbeddingAndCrossEntropyEqualHostBits) {
  NEED_GPUS(1);
  std::mt19937_64 rng(19003);
  const std::int64_t start = 11;
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    // Multiples of 8 (H 256, V 1024): the 16-byte vector paths.
    for (auto [T, V, H] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1}, {40, 7, 13}, {37, 50, 4097},
                           {70, 4097, 7}, {33, 1024, 256}}) {
      // Ids and targets around the slice [start, start + V): some outside it, many repeated.
      std::uniform_int_distribution<std::int64_t> id(start - 3, start + V + 2);
      std::vector<std::int64_t> ids(static_cast<std::size_t>(T)), targets(ids.size());
      for (auto& v : ids) v = id(rng);
      for (auto& v : targets) v = id(rng);
      const auto ws = random_values(V * H, d, rng), dys = random_values(T * H, d, rng);
      auto logits = random_values(T * V, d, rng);
      for (auto& v : logits) v *= 8.0f;
      // A -inf logit (its exponential 0); not a whole row of them, whose max -inf makes x − m NaN, and
      // a NaN made by the hardware has its own payload (as in the reduce test).
      if (V > 1) logits[0] = -std::numeric_limits<float>::infinity();
      std::vector<float> dloss = random_values(T, DType::f32, rng);
      expect_same_on_gpu(
          [&](Context& ctx, int r, Outputs& out) {
            Tensor w = ctx.from_host_f32(r, {V, H}, d, ws), dy = ctx.from_host_f32(r, {T, H}, d, dys);
            Tensor e = poisoned(ctx, r, {T, H}, d), dw = poisoned(ctx, r, {V, H}, d);
            embedding(w, start, ids, e);
            embedding_backward(dy, ids, start, dw);
            out["embedding"] = e.to_host_bytes();
            out["embedding dw"] = dw.to_host_bytes();
            Tensor lg = ctx.from_host_f32(r, {T, V}, d, logits), dl = ctx.from_host_f32(r, {T}, DType::f32, dloss);
            Tensor mx = poisoned(ctx, r, {T}, DType::f32), part = poisoned(ctx, r, {2 * T}, DType::f32),
                   loss = poisoned(ctx, r, {T}, DType::f32), dlg = poisoned(ctx, r, {T, V}, d);
            cross_entropy_max(lg, mx);
            cross_entropy_partials(lg, mx, targets, start, part);
            cross_entropy_loss(part, mx, loss);
            cross_entropy_backward(lg, mx, part, targets, start, dl, dlg);
            out["max"] = mx.to_host_bytes();
            out["partials"] = part.to_host_bytes();
            out["loss"] = loss.to_host_bytes();
            out["dlogits"] = dlg.to_host_bytes();
            cross_entropy_backward(lg, mx, part, targets, start, dl, lg);  // in place
            out["dlogits in place"] = lg.to_host_bytes();
          },
          fmt::format("{} tokens, slice {}, hidden {} {}", T, V, H, dtype_name(d)));
    }
  }
}

// ---------------------------------------------------------------- allocator, timing
// The transformer layer and the GPT model with exact GEMMs, the GPU's exact attention kernels
// (kernels/cuda/attention_cuda.h) and the deterministic ring: every tensor bitwise the host replay's.
TEST(CudaTransformer, ExactModeLayerAndGptEqualTheHostsBits) {
  NEED_GPUS(1);
  const int gpus = std::min(cuda_device_count(), 2);
  for (int tp = 1; tp <= gpus; ++tp) {
    const tp::TransformerStepOptions lo{
        .layer = {.hidden = 128, .heads = 8, .kv_heads = 4, .ffn = 256, .seq = 136, .norm = tp::NormKind::rms_norm,
                  .sequence_parallel = tp > 1, .dtype = DType::bf16, .seed = 3},
        .batch = 2, .tp = tp, .data_seed = 5, .collect = tp::Collect::all};
    auto g = cuda_ring(tp);
    auto h = host_context(tp);
    const auto got = tp::run_transformer_step(*g, lo), want = tp::run_transformer_step(*h, lo);
    for (int k = 0; k < tp; ++k)
      for (const auto& [name, bytes] : want.tensors[static_cast<std::size_t>(k)])
        EXPECT_EQ(got.tensors[static_cast<std::size_t>(k)].at(name), bytes) << "layer tp " << tp << " rank " << k << " " << name;
    const tp::GptStepOptions go{
        .model = {.vocab = 256, .hidden = 64, .heads = 4, .kv_heads = 2, .ffn = 128, .seq = 80, .layers = 2,
                  .dtype = DType::bf16, .seed = 4},
        .batch = 2, .tp = tp, .data_seed = 6, .collect = tp::Collect::all};
    auto g2 = cuda_ring(tp);
    auto h2 = host_context(tp);
    const auto gg = tp::run_gpt_step(*g2, go), gw = tp::run_gpt_step(*h2, go);
    for (int k = 0; k < tp; ++k)
      for (const auto& [name, bytes] : gw.tensors[static_cast<std::size_t>(k)])
        EXPECT_EQ(gg.tensors[static_cast<std::size_t>(k)].at(name), bytes) << "gpt tp " << tp << " rank " << k << " " << name;
    EXPECT_EQ(gg.mean_loss, gw.mean_loss);
  }
}

// Right padding (kv_valid) reaches the GPU's kernels: the cuda backend's fused attention with padded
// sequences, forward and backward, bitwise the host's.
TEST(CudaTransformer, PaddedAttentionEqualsTheHostsBits) {
  NEED_GPUS(1);
  constexpr std::int64_t S = 72, G = 2, d = 16, heads = 4, kv = 2, w = kv * (G + 2) * d;
  const kernels::AttentionShape s{.batch = 3, .seq_q = S, .seq_k = S, .heads = heads, .kv_heads = kv, .head_dim = d};
  std::mt19937 rng(7);
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  std::vector<float> x(3 * S * w), dy(3 * S * heads * d);
  for (auto& v : x) v = nrm(rng);
  for (auto& v : dy) v = nrm(rng);
  const std::vector<std::int64_t> lengths{50, 72, 1};
  std::vector<std::vector<std::uint8_t>> got, want;
  for (bool gpu : {true, false}) {
    auto ctx = gpu ? cuda_ring(1) : host_context(1);
    ctx->spawn(1, [&](int r) {
      Tensor X = ctx->from_host_f32(r, {3 * S, w}, DType::bf16, x), DY = ctx->from_host_f32(r, {3 * S, heads * d}, DType::bf16, dy);
      Tensor O = ctx->empty(r, {3 * S, heads * d}, DType::bf16), St = ctx->empty(r, {3 * S, 2 * heads}, DType::f32),
             DX = ctx->empty(r, {3 * S, w}, DType::bf16);
      attention_qkv(s, X, O, St, lengths);
      attention_qkv_backward(s, X, O, St, DY, DX, lengths);
      (gpu ? got : want) = {O.to_host_bytes(), St.to_host_bytes(), DX.to_host_bytes()};
    });
  }
  EXPECT_EQ(got, want);
}

// With tensor_core GEMMs the backend's attention is the tensor_core mode (kernels/attention_tc.h) on
// the fused QKV (group_stride) with right padding: within tolerance of the host's exact attention,
// and a padded sequence's rows bitwise the same in a batch of three as alone.
TEST(CudaTransformer, TensorCoreAttentionOnTheFusedQkv) {
  NEED_GPUS(1);
  constexpr std::int64_t S = 136, G = 2, d = 64, heads = 4, kv = 2, w = kv * (G + 2) * d;
  std::mt19937 rng(9);
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  std::vector<float> x(3 * S * w), dy(3 * S * heads * d);
  for (auto& v : x) v = nrm(rng);
  for (auto& v : dy) v = nrm(rng);
  auto run = [&](const Factory& f, std::int64_t batch, std::vector<std::int64_t> lengths) {
    const kernels::AttentionShape s{.batch = batch, .seq_q = S, .seq_k = S, .heads = heads, .kv_heads = kv, .head_dim = d};
    std::vector<std::vector<float>> out;
    auto ctx = f(1);
    ctx->spawn(1, [&](int r) {
      const std::vector<float> xs(x.begin(), x.begin() + batch * S * w), dys(dy.begin(), dy.begin() + batch * S * heads * d);
      Tensor X = ctx->from_host_f32(r, {batch * S, w}, DType::bf16, xs),
             DY = ctx->from_host_f32(r, {batch * S, heads * d}, DType::bf16, dys);
      Tensor O = ctx->empty(r, {batch * S, heads * d}, DType::bf16), St = ctx->empty(r, {batch * S, 2 * heads}, DType::f32),
             DX = ctx->empty(r, {batch * S, w}, DType::bf16);
      attention_qkv(s, X, O, St, lengths);
      attention_qkv_backward(s, X, O, St, DY, DX, lengths);
      out = {O.to_host_f32(), DX.to_host_f32()};
    });
    return out;
  };
  const Factory tc = cuda_with(cuda::GemmMode::tensor_core, CudaCollectives::ring);
  const auto got = run(tc, 3, {100, 136, 1}), want = run(host_context, 3, {100, 136, 1});
  for (std::size_t i = 0; i < 2; ++i) {
    double num = 0, den = 0;
    for (std::size_t e = 0; e < got[i].size(); ++e) {
      num += (double(got[i][e]) - want[i][e]) * (double(got[i][e]) - want[i][e]);
      den += double(want[i][e]) * want[i][e];
    }
    EXPECT_LE(std::sqrt(num / den), i == 0 ? 2e-2 : 5e-2) << (i == 0 ? "O" : "dX");
  }
  const auto alone = run(tc, 1, {100});
  for (std::size_t i = 0; i < 2; ++i) {
    const std::size_t row = i == 0 ? heads * d : w;
    for (std::size_t e = 0; e < 100 * row; ++e)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(alone[i][e]), std::bit_cast<std::uint32_t>(got[i][e]))
          << (i == 0 ? "O" : "dX") << " element " << e;
  }
}

TEST(CudaBackendAllocator, ReusesFreedBlocksBySizeClass) {
  NEED_GPUS(1);
  auto ctx = cuda_ring(1);
  auto& be = static_cast<CudaBackend&>(ctx->backend());
  { auto s = be.allocate(0, 3000, "a"); }
  const auto before = be.allocator_stats(0);
  EXPECT_EQ(before.in_use_bytes, 0u);
  EXPECT_GE(before.cached_bytes, 3000u);
  { auto s = be.allocate(0, 4000, "b"); }  // same class (4 KiB)
  const auto after = be.allocator_stats(0);
  EXPECT_EQ(after.reuses, before.reuses + 1);
  EXPECT_EQ(after.device_mallocs, before.device_mallocs);
}

TEST(CudaBackendTiming, EveryGemmAndCollectiveIsMeasured) {
  NEED_GPUS(2);
  ContextOptions o;
  o.world_size = 2;
  o.record_ops = true;
  auto ctx = make_cuda_context(o, {});
  std::mt19937_64 rng(1);
  const auto x = random_values(256 * 512, DType::bf16, rng);
  ctx->spawn(2, [&](int r) {
    Tensor a = ctx->from_host_f32(r, {256, 512}, DType::bf16, x);
    Tensor c = ctx->empty(r, {256, 256}, DType::f32);
    matmul(a, a.narrow(0, 0, 256).t(), nullptr, c, "probe gemm");
    all_reduce(c);
  });
  int gemms = 0, colls = 0;
  for (const auto& op : ctx->op_records()) {
    (op.kind == "gemm" ? gemms : colls)++;
    EXPECT_GT(ctx->backend().measured_seconds(op.region), 0.0) << op.name;
  }
  EXPECT_EQ(gemms, 2);
  EXPECT_EQ(colls, 2);
}

// ---------------------------------------------------------------- notes in the run report
// A tensor-core GEMM whose operand TMA cannot read in place (here: f32) takes the repacking path,
// gives the bits of the same GEMM on that operand rounded to bf16 beforehand, and the run report
// says so once, with the count; the next run, without such an operand, says nothing.
TEST(CudaBackendNotes, ARepackedOperandIsSaidOncePerRun) {
  NEED_GPUS(1);
  auto ctx = cuda_nccl(1);
  std::mt19937_64 rng(11);
  const auto x = random_values(64 * 256, DType::bf16, rng), w = random_values(256 * 128, DType::f32, rng);
  std::vector<float> repacked, rounded, again;
  const RunReport rep = ctx->spawn(1, [&](int r) {
    Tensor a = ctx->from_host_f32(r, {64, 256}, DType::bf16, x);
    Tensor wf = ctx->from_host_f32(r, {256, 128}, DType::f32, w);
    Tensor wb = ctx->from_host_f32(r, {256, 128}, DType::bf16, w);  // rounded to nearest even
    const std::vector<float> poison(64 * 128, std::nanf(""));
    auto gemm = [&](const Tensor& b, const char* name) {
      Tensor c = ctx->from_host_f32(r, {64, 128}, DType::f32, poison);
      matmul(a, b, nullptr, c, name);
      return c.to_host_f32();
    };
    repacked = gemm(wf, "probe gemm");
    again = gemm(wf, "probe gemm");
    rounded = gemm(wb, "in place");
  });
  ASSERT_EQ(rep.notes.size(), 1u) << ::testing::PrintToString(rep.notes);
  for (const char* part : {"probe gemm", "B [256 x 128] is f32", "repacked", "(2 calls)"})
    EXPECT_NE(rep.notes[0].find(part), std::string::npos) << "'" << part << "' not in: " << rep.notes[0];
  for (std::size_t i = 0; i < rounded.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(repacked[i]), std::bit_cast<std::uint32_t>(rounded[i])) << "element " << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(again[i]), std::bit_cast<std::uint32_t>(rounded[i])) << "element " << i;
  }
  const RunReport next = ctx->spawn(1, [&](int r) {
    Tensor a = ctx->from_host_f32(r, {64, 256}, DType::bf16, x);
    Tensor wb = ctx->from_host_f32(r, {256, 128}, DType::bf16, w);
    Tensor c = ctx->empty(r, {64, 128}, DType::f32);
    matmul(a, wb, nullptr, c, "in place");
  });
  EXPECT_TRUE(next.notes.empty()) << ::testing::PrintToString(next.notes);
}

// ---------------------------------------------------------------- a failed run
// A run in which one rank fails before an NCCL collective that the others joined leaves the context
// usable: the next run's collectives (same group, same call numbers) pair among themselves and give
// the right values (issue 13: the half-joined rendezvous of the failed run used to be joined).
TEST(CudaBackendErrors, AFailedRunLeavesAUsableContext) {
  NEED_GPUS(2);
  for (const Factory& make : {cuda_nccl, cuda_ring}) {
    auto ctx = make(2);
    EXPECT_THROW(ctx->spawn(2, [&](int r) {
      Tensor t = ctx->zeros(r, {4096}, DType::f32);
      if (r == 1) throw std::runtime_error("rank 1 stops before the collective");
      all_reduce(t);
    }),
                 RankError);
    std::mt19937_64 rng(7);
    const auto a = random_values(4096, DType::f32, rng), b = random_values(4096, DType::f32, rng);
    std::vector<std::vector<float>> got(2);
    ctx->spawn(2, [&](int r) {
      Tensor t = ctx->from_host_f32(r, {4096}, DType::f32, r == 0 ? a : b);
      all_reduce(t);
      got[static_cast<std::size_t>(r)] = t.to_host_f32();
    });
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(got[0][i], a[i] + b[i]) << "element " << i;  // two addends: one rounding, any order
      ASSERT_EQ(got[1][i], got[0][i]) << "element " << i;
    }
  }
}

// ---------------------------------------------------------------- CUDA graphs
// A recorded GEMM + bias + GELU, added to a tensor made with zeros(), runs nothing while recorded
// (its output, made and poisoned before, still holds the poison after graph_end); each launch runs it
// on what its tensors hold then: the output and the zeroed tensor poisoned (NaN) before every launch
// (so a zeroing left out of the graph shows), the input rewritten between launches, each result
// bitwise the same ops run as they are on the same values. A region timed inside the recording
// measures nothing until the graph has run.
TEST(CudaGraphs, ALaunchRunsTheRecordedWorkOnTheTensorsCurrentValues) {
  NEED_GPUS(1);
  for (const cuda::GemmMode mode : {cuda::GemmMode::exact, cuda::GemmMode::tensor_core}) {
    auto ctx = cuda_with(mode, CudaCollectives::nccl)(1);
    Backend& be = ctx->backend();
    std::mt19937_64 rng(23 + static_cast<int>(mode));
    const std::int64_t M = 96, K = 256, N = 192;
    const auto x1 = random_values(M * K, DType::bf16, rng), x2 = random_values(M * K, DType::bf16, rng);
    const auto w = random_values(K * N, DType::bf16, rng), b = random_values(N, DType::bf16, rng);
    const std::vector<float> nan(static_cast<std::size_t>(M * N), std::nanf(""));
    std::vector<std::uint8_t> want1, want2, got1, got2, recorded, poison;
    double unlaunched = 0;
    const RunReport rep = ctx->spawn(1, [&](int r) {
      Tensor x = ctx->from_host_f32(r, {M, K}, DType::bf16, x1), wt = ctx->from_host_f32(r, {K, N}, DType::bf16, w);
      Tensor bias = ctx->from_host_f32(r, {N}, DType::bf16, b);
      Tensor out = ctx->empty(r, {M, N}, DType::bf16, "out"), z;
      auto ops = [&] {
        Tensor pre = ctx->empty(r, {M, N}, DType::bf16, "pre"), y = ctx->empty(r, {M, N}, DType::bf16, "y");
        matmul(x, wt, &bias, pre, "graph gemm");
        gelu(kernels::GeluKind::tanh, pre, y);
        z = ctx->zeros(r, {M, N}, DType::bf16, "z");  // recorded: zeroed at each launch
        add(z, y, out);
      };
      ops();
      want1 = out.to_host_bytes();
      x.copy_from_host_f32(x2.data(), M * K);
      ops();
      want2 = out.to_host_bytes();
      x.copy_from_host_f32(x1.data(), M * K);
      out.copy_from_host_f32(nan.data(), M * N);
      poison = out.to_host_bytes();
      const std::uint64_t g = be.graph_begin(r);
      ASSERT_NE(g, 0u) << "one rank records a graph";
      const std::uint64_t region = be.begin_region(r, "gemm");
      ops();  // recorded: nothing runs
      be.end_region(region);
      be.graph_end(g);
      unlaunched = be.measured_seconds(region);
      recorded = out.to_host_bytes();
      z.copy_from_host_f32(nan.data(), M * N);
      be.graph_launch(g);
      got1 = out.to_host_bytes();
      out.copy_from_host_f32(nan.data(), M * N);
      z.copy_from_host_f32(nan.data(), M * N);
      x.copy_from_host_f32(x2.data(), M * K);
      be.graph_launch(g);
      got2 = out.to_host_bytes();
    });
    const char* m = cuda::gemm_mode_name(mode);
    EXPECT_TRUE(rep.notes.empty()) << m << ": " << ::testing::PrintToString(rep.notes);
    EXPECT_NE(want1, want2) << m << ": two inputs, one output";
    EXPECT_EQ(recorded, poison) << m << ": the recording ran something";
    EXPECT_LT(unlaunched, 0.0) << m << ": a region of a graph never launched has no time";
    EXPECT_EQ(got1, want1) << m << ": first launch";
    EXPECT_EQ(got2, want2) << m << ": launch after the input changed";
  }
}

// The MLP step with its iterations after the first as one graph equals the step run each time, bit
// for bit, on one GPU (tensor-core GEMMs, exact GEMMs). (Every iteration computes the same values, so
// this test alone would not see a launch that ran nothing over blocks that still hold them: the test
// above does.) On two GPUs no graph is recorded (the ring's copies; NCCL's launches would have to be
// queued together): the run report says so and the values are those of the step run each time.
TEST(CudaGraphs, TheMlpStepAsAGraphEqualsTheStepRunEachTime) {
  NEED_GPUS(1);
  struct Case {
    int tp;
    cuda::GemmMode mode;
    CudaCollectives coll;
  };
  std::vector<Case> cases = {{1, cuda::GemmMode::tensor_core, CudaCollectives::nccl},
                             {1, cuda::GemmMode::exact, CudaCollectives::ring}};
  if (cuda_device_count() >= 2) {
    cases.push_back({2, cuda::GemmMode::tensor_core, CudaCollectives::nccl});
    cases.push_back({2, cuda::GemmMode::exact, CudaCollectives::ring});
  }
  for (const Case& c : cases) {
    const std::string what = fmt::format("tp {} {} {}", c.tp, cuda::gemm_mode_name(c.mode), cuda_collectives_name(c.coll));
    tp::MlpStepOptions o{.mlp = {.hidden = 256, .ffn = 1024, .dtype = DType::bf16, .seed = 41},
                         .tokens = 128,
                         .tp = c.tp,
                         .data_seed = 17,
                         .iterations = 3,
                         .collect = tp::Collect::all};
    auto eager_ctx = cuda_with(c.mode, c.coll)(c.tp);
    const tp::MlpStepResult eager = tp::run_mlp_step(*eager_ctx, o);
    o.graph = true;
    auto graph_ctx = cuda_with(c.mode, c.coll)(c.tp);
    const tp::MlpStepResult graph = tp::run_mlp_step(*graph_ctx, o);
    const bool records = c.tp == 1;
    EXPECT_EQ(graph.graphs, records ? c.tp : 0) << what;
    EXPECT_EQ(eager.graphs, 0) << what;
    if (records) {
      EXPECT_TRUE(graph.report.notes.empty()) << what << ": " << ::testing::PrintToString(graph.report.notes);
    } else {
      ASSERT_EQ(graph.report.notes.size(), 1u) << what << ": " << ::testing::PrintToString(graph.report.notes);
      EXPECT_NE(graph.report.notes[0].find("CUDA graphs: recorded on a one-rank backend only (this one has 2 ranks"),
                std::string::npos)
          << graph.report.notes[0];
    }
    for (int r = 0; r < c.tp; ++r) {
      const auto& e = eager.tensors[static_cast<std::size_t>(r)];
      const auto& g = graph.tensors[static_cast<std::size_t>(r)];
      ASSERT_EQ(e.size(), 7u) << what;
      for (const auto& [name, bytes] : e) {
        const auto& gb = g.at(name);
        ASSERT_EQ(gb.size(), bytes.size()) << what << " " << name;
        if (c.coll == CudaCollectives::ring || c.tp == 1) {
          EXPECT_EQ(gb, bytes) << what << " rank " << r << " " << name;
          continue;
        }
        double num = 0, den = 0;
        for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
          const double a = bf16_to_f32(static_cast<std::uint16_t>(gb[i] | gb[i + 1] << 8));
          const double b = bf16_to_f32(static_cast<std::uint16_t>(bytes[i] | bytes[i + 1] << 8));
          num += (a - b) * (a - b);
          den += b * b;
        }
        EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), tp::tp_tolerance(DType::bf16, 2)) << what << " rank " << r << " " << name;
      }
    }
  }
}

// What the host cannot do inside a recording is refused by name, the run fails without a hang, and
// the context runs again (the recording was ended with the failed run).
TEST(CudaGraphs, TheHostInsideARecordingIsRefusedByName) {
  NEED_GPUS(1);
  auto ctx = cuda_nccl(1);
  Backend& be = ctx->backend();
  try {
    ctx->spawn(1, [&](int r) {
      Tensor t = ctx->zeros(r, {1024}, DType::f32);
      const std::uint64_t g = be.graph_begin(r);
      ASSERT_NE(g, 0u);
      (void)t.to_host_f32();
    });
    FAIL() << "a host read inside a recording succeeded";
  } catch (const RankError& e) {
    const std::string m = e.what();
    for (const char* part : {"reading 4096 bytes to the host", "rank 0", "recorded into a CUDA graph", "graph_end"})
      EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
  }
  EXPECT_THROW(be.graph_launch(1), RuntimeError);  // its run ended: the graph is gone
  std::mt19937_64 rng(3);
  const auto a = random_values(1024, DType::f32, rng);
  std::vector<float> got;
  ctx->spawn(1, [&](int r) {
    Tensor t = ctx->from_host_f32(r, {1024}, DType::f32, a);
    Tensor y = ctx->empty(r, {1024}, DType::f32);
    add(t, t, y);
    got = y.to_host_f32();
  });
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(got[i], a[i] + a[i]) << "element " << i;
}

// ---------------------------------------------------------------- errors
TEST(CudaBackendErrors, NoGpuOrTooFewGpusNameTheCounts) {
  const int n = cuda_device_count();
  ContextOptions o;
  o.world_size = n + 1;
  try {
    make_cuda_context(o, {});
    FAIL() << "expected an error for " << n + 1 << " ranks on " << n << " GPUs";
  } catch (const RuntimeError& e) {
    const std::string m = e.what();
    if (n == 0) {
      EXPECT_NE(m.find("cudaGetDeviceCount"), std::string::npos) << m;
    } else {
      EXPECT_NE(m.find(fmt::format("{} ranks need {} GPUs", n + 1, n + 1)), std::string::npos) << m;
      EXPECT_NE(m.find(fmt::format("but {} ", n)), std::string::npos) << m;
    }
  }
  if (n == 0) {
    EXPECT_THROW(make_cuda_context({}, {}), RuntimeError);  // world_size 0: every GPU, of which there are none
  }
}

TEST(CudaBackendErrors, FailedCudaCallNamesTheCallAndTheError) {
  NEED_GPUS(1);
  auto ctx = cuda_ring(1);
  try {
    ctx->backend().allocate(0, std::uint64_t{1} << 50, "a petabyte");
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const hw::OutOfMemoryError& e) {  // as a simulated memory's (Python: cubesim.OutOfMemoryError)
    const std::string m = e.what();
    EXPECT_NE(m.find("a petabyte"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaMalloc failed"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
  }
}

TEST(CudaBackendErrors, ParsesCollectivesNames) {
  EXPECT_EQ(parse_cuda_collectives("ring"), CudaCollectives::ring);
  EXPECT_EQ(parse_cuda_collectives("nccl"), CudaCollectives::nccl);
  try {
    parse_cuda_collectives("mpi");
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("ring"), std::string::npos);
  }
}

}  // namespace
}  // namespace cubesim::rt::testing
