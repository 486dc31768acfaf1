// The runtime's attention and norm ops (runtime/ops.h) on the host and the simulator: the bits of
// the kernels' definitions (kernels/attention.h, kernels/norm.h) whatever backend runs them, with Q,
// K and V as column slices of one fused QKV tensor; a timing-only run takes the simulated time of a
// functional one; and wrong shapes are refused naming the operand and the valid shape.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/norm.h"
#include "runtime/backend_registry.h"
#include "runtime/context.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "sim/hw/topology.h"

namespace cubesim::rt {
namespace {

std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<std::uint8_t> bytes_of(const std::vector<float>& v, DType t) {
  std::vector<std::uint8_t> b(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) store_f32(b.data(), t, static_cast<std::int64_t>(i), v[i]);
  return b;
}

constexpr std::int64_t kBatch = 2, kSeq = 70, kHeads = 4, kKv = 2, kDim = 16;
constexpr DType kT = DType::bf16;
const kernels::AttentionShape kShape{.batch = kBatch, .seq_q = kSeq, .seq_k = kSeq, .heads = kHeads, .kv_heads = kKv,
                                     .head_dim = kDim};
constexpr std::int64_t kTokens = kBatch * kSeq, kQw = kHeads * kDim, kKw = kKv * kDim, kFused = kQw + 2 * kKw;

struct Outputs {
  std::vector<std::uint8_t> out, stats, dq, dk, dv;
  sim::Time time = 0;
};

// One forward and backward through the runtime on `backend`; q, k, v are slices of a fused tensor.
Outputs run_attention(std::string_view backend, bool timing_only = false) {
  const hw::Topology topo = hw::load_topology("ring4");
  BackendArgs args;
  if (backend == "sim") {
    args.topology = &topo;
    args.options = {{"timing_only", timing_only}};
  }
  auto ctx = make_context(backend, {.world_size = 1}, args);
  const auto qkv = random_values(kTokens * kFused, 1), dout = random_values(kTokens * kQw, 2);
  Outputs o;
  ctx->spawn(1, [&](int r) {
    Tensor fused = ctx->from_host_f32(r, {kTokens, kFused}, kT, qkv);
    Tensor q = fused.narrow(1, 0, kQw), k = fused.narrow(1, kQw, kKw), v = fused.narrow(1, kQw + kKw, kKw);
    Tensor out = ctx->empty(r, {kTokens, kQw}, kT), stats = ctx->empty(r, {kTokens, 2 * kHeads}, DType::f32);
    Tensor dO = ctx->from_host_f32(r, {kTokens, kQw}, kT, dout);
    Tensor dq = ctx->empty(r, {kTokens, kQw}, kT), dk = ctx->empty(r, {kTokens, kKw}, kT),
           dv = ctx->empty(r, {kTokens, kKw}, kT);
    attention(kShape, q, k, v, out, stats);
    attention_backward(kShape, q, k, v, out, stats, dO, dq, dk, dv);
    o.time = ctx->simulator().now();
    if (timing_only) return;
    o.out = out.to_host_bytes();
    o.stats = stats.to_host_bytes();
    o.dq = dq.to_host_bytes();
    o.dk = dk.to_host_bytes();
    o.dv = dv.to_host_bytes();
  });
  return o;
}

TEST(AttentionOp, EveryBackendGivesTheKernelsBitsOnSlicesOfAFusedQkv) {
  // The definition on the same values, straight from the kernel.
  const auto qkv = bytes_of(random_values(kTokens * kFused, 1), kT), dout = bytes_of(random_values(kTokens * kQw, 2), kT);
  const std::size_t es = dtype_size(kT);
  std::vector<std::uint8_t> out(kTokens * kQw * es), dq(out.size()), dk(kTokens * kKw * es), dv(dk.size());
  std::vector<float> stats(kTokens * 2 * kHeads);
  const kernels::AttentionBuffer q{qkv.data(), kT, kFused}, k{qkv.data() + kQw * es, kT, kFused},
      v{qkv.data() + (kQw + kKw) * es, kT, kFused};
  kernels::attention_forward(kShape, q, k, v, {out.data(), kT, kQw}, stats.data());
  kernels::attention_backward(kShape, q, k, v, {out.data(), kT, kQw}, stats.data(), {dout.data(), kT, kQw},
                              {dq.data(), kT, kQw}, {dk.data(), kT, kKw}, {dv.data(), kT, kKw});
  for (const char* be : {"host", "sim"}) {
    const Outputs o = run_attention(be);
    EXPECT_EQ(o.out, out) << be;
    EXPECT_EQ(0, std::memcmp(o.stats.data(), stats.data(), o.stats.size())) << be;
    EXPECT_EQ(o.dq, dq) << be;
    EXPECT_EQ(o.dk, dk) << be;
    EXPECT_EQ(o.dv, dv) << be;
  }
}

// attention_qkv reads Megatron's fused row in place and writes the gradient in the same layout.
TEST(AttentionOp, TheFusedQkvFormGivesTheKernelsBitsOnEveryBackend) {
  constexpr std::int64_t G = kHeads / kKv, gs = (G + 2) * kDim, width = kKv * gs;
  const auto qkvv = random_values(kTokens * width, 11), doutv = random_values(kTokens * kQw, 12);
  const auto qkv = bytes_of(qkvv, kT), dout = bytes_of(doutv, kT);
  const std::size_t es = dtype_size(kT);
  std::vector<std::uint8_t> out(kTokens * kQw * es), dqkv(qkv.size());
  std::vector<float> stats(kTokens * 2 * kHeads);
  const kernels::AttentionBuffer q{qkv.data(), kT, width, gs}, k{qkv.data() + G * kDim * es, kT, width, gs},
      v{qkv.data() + (G + 1) * kDim * es, kT, width, gs};
  kernels::attention_forward(kShape, q, k, v, {out.data(), kT, kQw}, stats.data());
  kernels::attention_backward(kShape, q, k, v, {out.data(), kT, kQw}, stats.data(), {dout.data(), kT, kQw},
                              {dqkv.data(), kT, width, gs}, {dqkv.data() + G * kDim * es, kT, width, gs},
                              {dqkv.data() + (G + 1) * kDim * es, kT, width, gs});
  const hw::Topology topo = hw::load_topology("ring4");
  for (const char* be : {"host", "sim"}) {
    BackendArgs args;
    if (std::string_view(be) == "sim") args.topology = &topo;
    auto ctx = make_context(be, {.world_size = 1}, args);
    ctx->spawn(1, [&](int r) {
      Tensor X = ctx->from_host_f32(r, {kTokens, width}, kT, qkvv), DO = ctx->from_host_f32(r, {kTokens, kQw}, kT, doutv);
      Tensor O = ctx->empty(r, {kTokens, kQw}, kT), S = ctx->empty(r, {kTokens, 2 * kHeads}, DType::f32),
             DX = ctx->empty(r, {kTokens, width}, kT);
      attention_qkv(kShape, X, O, S);
      attention_qkv_backward(kShape, X, O, S, DO, DX);
      EXPECT_EQ(O.to_host_bytes(), out) << be;
      EXPECT_EQ(DX.to_host_bytes(), dqkv) << be;
    });
  }
}

TEST(AttentionOp, TimingOnlyTakesTheFunctionalRunsSimulatedTime) {
  const Outputs f = run_attention("sim", false), t = run_attention("sim", true);
  EXPECT_GT(f.time, 0u);
  EXPECT_EQ(f.time, t.time);
  EXPECT_EQ(run_attention("host").time, 0u);
}

// Simulated time of one attention forward + backward (bf16, 1 sequence, 4 heads of 64 in 2 groups) on
// cube 0 of `topo`.
sim::Duration attention_time(std::int64_t seq, bool causal, hw::Topology topo, bool timing_only,
                             std::vector<std::uint8_t>* out = nullptr) {
  const kernels::AttentionShape s{.seq_q = seq, .seq_k = seq, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = causal};
  auto ctx = make_context("sim", {.world_size = 1}, {.topology = &topo, .options = {{"timing_only", timing_only}}});
  sim::Duration t = 0;
  ctx->spawn(1, [&](int r) {
    const std::int64_t w = 2 * (2 + 2) * 64;
    Tensor qkv = timing_only ? ctx->empty(r, {seq, w}, kT) : ctx->from_host_f32(r, {seq, w}, kT, random_values(seq * w, 3));
    Tensor o = ctx->empty(r, {seq, 256}, kT), st = ctx->empty(r, {seq, 8}, DType::f32);
    Tensor dout = timing_only ? ctx->empty(r, {seq, 256}, kT) : ctx->from_host_f32(r, {seq, 256}, kT, random_values(seq * 256, 4));
    Tensor dqkv = ctx->empty(r, {seq, w}, kT);
    const sim::Time t0 = ctx->simulator().now();
    attention_qkv(s, qkv, o, st);
    attention_qkv_backward(s, qkv, o, st, dout, dqkv);
    t = ctx->simulator().now() - t0;
    if (out) {
      *out = o.to_host_bytes();
      const auto d = dqkv.to_host_bytes();
      out->insert(out->end(), d.begin(), d.end());
    }
  });
  return t;
}

// The simulator runs attention as tiles on the PEs (kernels/sim_pe_attention.h): causal costs about
// half of full attention at length, the work grows as seq^2, and a TCM too small for the PE's tile
// makes the tiles smaller (slower), not wrong.
TEST(AttentionOp, TheSimulatorRunsItAsTilesOnThePes) {
  const hw::Topology topo = hw::load_topology("ring4");
  const sim::Duration full = attention_time(1024, false, topo, true), causal = attention_time(1024, true, topo, true);
  // 8 tiles of 128: causal runs 36 of the 64 blocks (the diagonal ones whole), plus per-tile loads and stores.
  EXPECT_GT(causal, full * 50 / 100);
  EXPECT_LT(causal, full * 80 / 100);
  const sim::Duration full2 = attention_time(2048, false, topo, true);
  EXPECT_GT(full2, full * 3);
  EXPECT_LT(full2, full * 9 / 2);
  std::vector<std::uint8_t> big, small;
  const sim::Duration roomy = attention_time(200, true, topo, false, &big);
  // 128 KiB (the least the GEMM tiles take) holds the forward's 128-row tiles but not the backward's
  // (K, V, dK, dV tiles and two Q and dO blocks: 128 KiB and a bit): its key tile halves.
  const hw::Topology tight = hw::load_topology("ring4", {{"cube.pe.tcm.capacity_KiB", 128}});
  const sim::Duration cramped = attention_time(200, true, tight, false, &small);
  EXPECT_EQ(big, small);
  EXPECT_GT(cramped, roomy);
}

// Right padding through the runtime (kv_valid): a sequence of 50 tokens padded to 64 in a batch of two
// gives the bits it gives alone, forward and backward, on the host and the simulator; padding rows of
// the output are zero; bad lengths are refused naming them.
TEST(AttentionOp, RightPaddingLeavesASequencesBitsAsAlone) {
  constexpr std::int64_t L = 50, S = 64, G = 2, d = 16, heads = 4, kv = 2, w = kv * (G + 2) * d;
  const kernels::AttentionShape one{.seq_q = L, .seq_k = L, .heads = heads, .kv_heads = kv, .head_dim = d};
  const kernels::AttentionShape two{.batch = 2, .seq_q = S, .seq_k = S, .heads = heads, .kv_heads = kv, .head_dim = d};
  const auto x1 = random_values(L * w, 21), d1 = random_values(L * heads * d, 22);
  auto x2 = random_values(2 * S * w, 23), d2 = random_values(2 * S * heads * d, 24);
  std::copy(x1.begin(), x1.end(), x2.begin());  // sequence 0's real tokens, then padding that holds values
  std::copy(d1.begin(), d1.end(), d2.begin());
  const std::vector<std::int64_t> lengths{L, S - 3};
  const hw::Topology topo = hw::load_topology("ring4");
  for (const char* be : {"host", "sim"}) {
    BackendArgs args;
    if (std::string_view(be) == "sim") args.topology = &topo;
    auto ctx = make_context(be, {.world_size = 1}, args);
    ctx->spawn(1, [&](int r) {
      auto run = [&](const kernels::AttentionShape& s, const std::vector<float>& x, const std::vector<float>& dy,
                     std::span<const std::int64_t> kv_valid) {
        const std::int64_t t = s.batch * s.seq_q;
        Tensor X = ctx->from_host_f32(r, {t, w}, kT, x), DY = ctx->from_host_f32(r, {t, heads * d}, kT, dy);
        Tensor O = ctx->empty(r, {t, heads * d}, kT), St = ctx->empty(r, {t, 2 * heads}, DType::f32),
               DX = ctx->empty(r, {t, w}, kT);
        attention_qkv(s, X, O, St, kv_valid);
        attention_qkv_backward(s, X, O, St, DY, DX, kv_valid);
        return std::pair{O.to_host_bytes(), DX.to_host_bytes()};
      };
      const auto [o1, dx1] = run(one, x1, d1, {});
      const auto [o2, dx2] = run(two, x2, d2, lengths);
      const std::size_t ob = L * heads * d * 2, xb = L * w * 2;
      EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), ob)) << be << ": out";
      EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), xb)) << be << ": dqkv";
      for (std::size_t i = ob; i < static_cast<std::size_t>(S * heads * d * 2); ++i) ASSERT_EQ(o2[i], 0) << be << " " << i;
      Tensor X = ctx->empty(r, {2 * S, w}, kT), O = ctx->empty(r, {2 * S, heads * d}, kT),
             St = ctx->empty(r, {2 * S, 2 * heads}, DType::f32);
      const std::vector<std::int64_t> bad{L, S + 1};
      try {
        attention_qkv(two, X, O, St, bad);
        ADD_FAILURE() << "no error";
      } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find("kv_valid[1] = 65 is outside 0..64"), std::string::npos) << e.what();
      }
    });
  }
}

TEST(NormOp, EveryBackendGivesTheKernelsBits) {
  constexpr std::int64_t rows = 37, n = 96;
  const auto xv = random_values(rows * n, 3, 2.0f), wv = random_values(n, 4), bv = random_values(n, 5),
             dyv = random_values(rows * n, 6);
  const auto x = bytes_of(xv, kT), w = bytes_of(wv, kT), b = bytes_of(bv, kT), dyb = bytes_of(dyv, kT);
  const std::size_t es = dtype_size(kT);
  // The definition.
  std::vector<std::uint8_t> y(rows * n * es), dx(y.size()), dw(n * es), db(n * es), ly(y.size()), ldx(y.size()),
      ldw(dw.size());
  std::vector<float> rs(rows), mu(rows), lrs(rows);
  kernels::rms_norm_forward({x.data(), kT, n}, {w.data(), kT, 0}, {y.data(), kT, n}, rs.data(), rows, n, 1e-5f);
  kernels::rms_norm_backward({x.data(), kT, n}, {w.data(), kT, 0}, {dyb.data(), kT, n}, rs.data(), {dx.data(), kT, n},
                             {dw.data(), kT, 0}, rows, n);
  kernels::layer_norm_forward({x.data(), kT, n}, {w.data(), kT, 0}, {b.data(), kT, 0}, {ly.data(), kT, n}, mu.data(),
                              lrs.data(), rows, n, 1e-5f);
  kernels::layer_norm_backward({x.data(), kT, n}, {w.data(), kT, 0}, {dyb.data(), kT, n}, mu.data(), lrs.data(),
                               {ldx.data(), kT, n}, {ldw.data(), kT, 0}, {db.data(), kT, 0}, rows, n);
  const hw::Topology topo = hw::load_topology("ring4");
  for (const char* be : {"host", "sim"}) {
    BackendArgs args;
    if (std::string_view(be) == "sim") args.topology = &topo;
    auto ctx = make_context(be, {.world_size = 1}, args);
    ctx->spawn(1, [&](int r) {
      Tensor X = ctx->from_host_f32(r, {rows, n}, kT, xv), W = ctx->from_host_f32(r, {n}, kT, wv),
             B = ctx->from_host_f32(r, {n}, kT, bv), DY = ctx->from_host_f32(r, {rows, n}, kT, dyv);
      Tensor Y = ctx->empty(r, {rows, n}, kT), DX = ctx->empty(r, {rows, n}, kT), DW = ctx->empty(r, {n}, kT),
             DB = ctx->empty(r, {n}, kT), M = ctx->empty(r, {rows}, DType::f32), R = ctx->empty(r, {rows}, DType::f32);
      rms_norm(X, W, Y, R, 1e-5f);
      EXPECT_EQ(Y.to_host_bytes(), y) << be;
      rms_norm_backward(X, W, DY, R, DX, DW);
      EXPECT_EQ(DX.to_host_bytes(), dx) << be;
      EXPECT_EQ(DW.to_host_bytes(), dw) << be;
      layer_norm(X, W, B, Y, M, R, 1e-5f);
      EXPECT_EQ(Y.to_host_bytes(), ly) << be;
      layer_norm_backward(X, W, DY, M, R, DX, DW, DB);
      EXPECT_EQ(DX.to_host_bytes(), ldx) << be;
      EXPECT_EQ(DW.to_host_bytes(), ldw) << be;
      EXPECT_EQ(DB.to_host_bytes(), db) << be;
    });
  }
}

std::string error_of(const std::function<void(Context&, int)>& f) {
  auto ctx = make_context("host", {.world_size = 1});
  std::string msg = "no error";
  try {
    ctx->spawn(1, [&](int r) { f(*ctx, r); });
  } catch (const std::exception& e) {
    msg = e.what();
  }
  return msg;
}

TEST(TransformerOps, RefuseWrongShapesNamingTheOperandAndTheValidShape) {
  std::string m = error_of([](Context& c, int r) {
    Tensor q = c.empty(r, {kTokens, kQw}, kT), k = c.empty(r, {kTokens, kKw + 1}, kT), v = c.empty(r, {kTokens, kKw}, kT);
    Tensor o = c.empty(r, {kTokens, kQw}, kT), st = c.empty(r, {kTokens, 2 * kHeads}, DType::f32);
    attention(kShape, q, k, v, o, st);
  });
  EXPECT_NE(m.find("attention: k is"), std::string::npos) << m;
  EXPECT_NE(m.find("must be [140, 32] (batch x seq_k, kv_heads x head_dim)"), std::string::npos) << m;
  m = error_of([](Context& c, int r) {
    Tensor q = c.empty(r, {kTokens, kQw}, kT), k = c.empty(r, {kTokens, kKw}, kT), v = c.empty(r, {kTokens, kKw}, kT);
    Tensor o = c.empty(r, {kTokens, kQw}, kT), st = c.empty(r, {kTokens, 2 * kHeads}, DType::bf16);
    attention(kShape, q, k, v, o, st);
  });
  EXPECT_NE(m.find("stats is"), std::string::npos) << m;
  EXPECT_NE(m.find("must be f32"), std::string::npos) << m;
  m = error_of([](Context& c, int r) {
    kernels::AttentionShape s = kShape;
    s.kv_heads = 3;
    Tensor q = c.empty(r, {kTokens, kQw}, kT);
    attention(s, q, q, q, q, q);
  });
  EXPECT_NE(m.find("heads 4 must be a positive multiple of kv_heads 3"), std::string::npos) << m;
  m = error_of([](Context& c, int r) {
    Tensor x = c.empty(r, {4, 8}, kT), w = c.empty(r, {7}, kT), y = c.empty(r, {4, 8}, kT),
           rs = c.empty(r, {4}, DType::f32);
    rms_norm(x, w, y, rs, 1e-5f);
  });
  EXPECT_NE(m.find("rms_norm: weight is"), std::string::npos) << m;
  EXPECT_NE(m.find("must be contiguous with 8 elements"), std::string::npos) << m;
}

}  // namespace
}  // namespace cubesim::rt
