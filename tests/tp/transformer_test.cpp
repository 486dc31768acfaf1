// The tensor-parallel TransformerLayer (tp/transformer.h) against the unsharded layer on the host:
// bitwise where the contract fixes the order (the QKV projection's output and core attention's
// output, per head), within tolerance downstream of the first reduction of tp partials; bitwise
// against the host replay of the same tp program on the simulator; every rank's copy of a reduced
// tensor bitwise the same. And the sizes a user can get wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "runtime/errors.h"
#include "runtime/sim_backend.h"
#include "sim/hw/topology.h"
#include "tp/equivalence.h"
#include "tp/parallel_state.h"
#include "tests/tp/tp_test_util.h"
#include "tp/transformer_step.h"

namespace cubesim::tp {
namespace {

struct Case {
  int tp;
  DType dtype;
  bool sp;
  std::int64_t kv_heads;
  NormKind norm;
  bool sim;
  bool swiglu = false;
  std::string name() const {
    return fmt::format("tp{}_{}_{}_kv{}_{}_{}_{}", tp, dtype_name(dtype), sp ? "sp" : "nosp", kv_heads,
                       norm_kind_name(norm), swiglu ? "swiglu_rope" : "gelu", sim ? "sim" : "host");
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

using tptest::make;

constexpr std::int64_t kHidden = 64, kHeads = 8, kFfn = 128, kSeq = 80, kBatch = 2, kRows = kBatch * kSeq;

TransformerStepOptions options(const Case& c, int tp) {
  TransformerStepOptions o;
  o.layer = {.hidden = kHidden, .heads = kHeads, .kv_heads = c.kv_heads, .ffn = kFfn, .seq = kSeq, .norm = c.norm,
             .swiglu = c.swiglu, .rotary = c.swiglu, .sequence_parallel = c.sp, .dtype = c.dtype, .seed = 21};
  o.batch = kBatch;
  o.tp = tp;
  o.data_seed = 8;
  o.collect = Collect::all;
  return o;
}

std::vector<float> f32(const std::vector<std::uint8_t>& b, DType t) {
  std::vector<float> v(b.size() / dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_f32(b.data(), t, static_cast<std::int64_t>(i));
  return v;
}

// How a tensor is split over the ranks.
enum class Split { whole, rows, cols };
Split split_of(const std::string& name, bool sp) {
  if (name == "output" || name == "input_grad") return sp ? Split::rows : Split::whole;
  if (name == "attention.qkv_output" || name == "attention.context") return Split::cols;
  if (name == "attention.qkv.weight_grad" || name == "mlp.fc1.weight_grad" || name == "attention.qkv.bias_grad" ||
      name == "mlp.fc1.bias_grad")
    return Split::rows;
  if (name == "attention.proj.weight_grad" || name == "mlp.fc2.weight_grad") return Split::cols;
  return Split::whole;  // the row layers' biases and the norms: the same on every rank
}

// The full tensor from the ranks' pieces (row-major, `cols` columns per piece for a column split).
std::vector<float> assemble(const TransformerStepResult& r, const std::string& name, Split s, std::int64_t rows, DType t) {
  const auto tp = r.tensors.size();
  if (s == Split::whole) return f32(r.tensors[0].at(name), t);
  std::vector<float> out;
  if (s == Split::rows) {
    for (std::size_t k = 0; k < tp; ++k) {
      const auto v = f32(r.tensors[k].at(name), t);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
  std::vector<std::vector<float>> parts;
  for (std::size_t k = 0; k < tp; ++k) parts.push_back(f32(r.tensors[k].at(name), t));
  const std::size_t c = parts[0].size() / static_cast<std::size_t>(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::size_t k = 0; k < tp; ++k) out.insert(out.end(), parts[k].begin() + i * c, parts[k].begin() + (i + 1) * c);
  return out;
}

std::int64_t rows_of(const std::string& name) {
  if (name == "attention.proj.weight_grad") return kHidden;
  if (name == "mlp.fc2.weight_grad") return kHidden;
  return kRows;  // qkv_output, context
}

double rel_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class TpTransformer : public ::testing::TestWithParam<Case> {};

TEST_P(TpTransformer, EquivalentToUnshardedLayerAndItsHostReplay) {
  const Case c = GetParam();
  auto ctx = make(c.sim, c.tp);
  const TransformerStepResult got = run_transformer_step(*ctx, options(c, c.tp));
  auto host1 = make(false, 1);
  const TransformerStepResult ref = run_transformer_step(*host1, options(c, 1));
  // A layer stacks a few reductions of tp partials (attention output, MLP output, their backwards)
  // and norms that amplify relative error by up to ~2: twice the single reduction's bound (measured:
  // bf16 tp 4 at most 0.006 against 0.0625, f32 4e-7 against 2e-6).
  const double tol = 2 * tp_tolerance(c.dtype, c.tp);
  for (const auto& [name, bytes] : got.tensors[0]) {
    const Split s = split_of(name, c.sp && c.tp > 1);
    const auto full = assemble(got, name, s, rows_of(name), c.dtype);
    const auto want = f32(ref.tensors[0].at(name), c.dtype);
    ASSERT_EQ(full.size(), want.size()) << name;
    const bool bitwise = c.tp == 1 || name == "attention.qkv_output" || name == "attention.context";
    if (bitwise) {
      EXPECT_EQ(0, std::memcmp(full.data(), want.data(), full.size() * 4)) << name << " vs unsharded: bitwise claim, "
                                                                           << "rel norm " << rel_norm(full, want);
    } else {
      EXPECT_LE(rel_norm(full, want), tol) << name << " vs unsharded";
    }
    if (s == Split::whole) {  // every rank holds the same bits
      for (std::size_t k = 1; k < got.tensors.size(); ++k) EXPECT_EQ(got.tensors[k].at(name), bytes) << name << " rank " << k;
    }
  }
  if (c.sim) {  // the simulator computes what the host computes with the same tp and order
    auto host = make(false, c.tp);
    const TransformerStepResult replay = run_transformer_step(*host, options(c, c.tp));
    for (std::size_t k = 0; k < got.tensors.size(); ++k)
      for (const auto& [name, bytes] : got.tensors[k]) EXPECT_EQ(bytes, replay.tensors[k].at(name)) << name << " rank " << k;
    EXPECT_GT(got.report.sim_time, 0u);
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int tp : {1, 2, 4})
    for (DType d : {DType::bf16, DType::f32})
      for (bool sp : {false, true}) {
        if (tp == 1 && sp) continue;
        const std::int64_t kv = (tp + (sp ? 1 : 0)) % 2 ? 8 : 4;
        const NormKind norm = d == DType::bf16 ? NormKind::rms_norm : NormKind::layer_norm;
        v.push_back({tp, d, sp, kv, norm, tp != 1 || d == DType::bf16, (tp + (sp ? 1 : 0) + (d == DType::f32)) % 2 == 1});
        if (tp == 2 && d == DType::bf16) v.push_back({tp, d, sp, kv, norm, false});
      }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layers, TpTransformer, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

std::string error_of(int tp, TransformerLayerOptions lo, std::int64_t batch = 1) {
  auto ctx = make(false, tp);
  TransformerStepOptions o;
  o.layer = lo;
  o.batch = batch;
  o.tp = tp;
  try {
    run_transformer_step(*ctx, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// Right padding through the layer (forward's lengths), full (non-causal) attention, where a real query
// would otherwise see the padding keys: a padded sequence's real rows, forward and input gradient, are
// bitwise those it gives alone at its own length; garbage (huge values) in the padding rows changes none.
TEST(TpTransformerPadding, RealRowsGiveTheirBitsAloneWhateverThePaddingHolds) {
  const int tp = 2;
  const std::int64_t S = 20, H = 32;
  const std::vector<std::int64_t> lengths{20, 7, 12};
  const std::int64_t B = static_cast<std::int64_t>(lengths.size());
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "data seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(B * S * H)), dy(x.size());
  for (auto& v : x) v = nd(rng);
  for (auto& v : dy) v = 0.1f * nd(rng);
  for (const bool sim : {false, true}) {
    // Runs the layer of seq `seq` on rows [rows, H] of x and dy with `lens`; rank 0's y and dx.
    auto run = [&](std::int64_t seq, const std::vector<float>& xs, const std::vector<float>& dys,
                   const std::vector<std::int64_t>& lens) {
      auto ctx = make(sim, tp);
      std::pair<std::vector<float>, std::vector<float>> out;
      const std::int64_t rows = static_cast<std::int64_t>(xs.size()) / H;
      ctx->spawn(tp, [&](int r) {
        initialize_model_parallel(tp);
        TransformerLayer layer(*ctx, {.hidden = H, .heads = 4, .kv_heads = 2, .ffn = 64, .seq = seq,
                                      .norm = NormKind::rms_norm, .swiglu = true, .rotary = true, .causal = false,
                                      .dtype = DType::f32, .seed = 11});
        const rt::Tensor xt = ctx->from_host_f32(r, {rows, H}, DType::f32, xs);
        const rt::Tensor dyt = ctx->from_host_f32(r, {rows, H}, DType::f32, dys);
        const rt::Tensor y = layer.forward(xt, lens);
        const rt::Tensor dx = layer.backward(dyt);
        if (r == 0) out = {y.to_host_f32(), dx.to_host_f32()};
        destroy_model_parallel();
      });
      return out;
    };
    // dy is 0 on padding rows (the loss mask's effect), so padding gives no gradient either.
    std::vector<float> dyp = dy;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = lengths[static_cast<std::size_t>(b)]; t < S; ++t)
        for (std::int64_t c = 0; c < H; ++c) dyp[static_cast<std::size_t>((b * S + t) * H + c)] = 0.0f;
    const auto padded = run(S, x, dyp, lengths);
    std::vector<float> x2 = x;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = lengths[static_cast<std::size_t>(b)]; t < S; ++t)
        for (std::int64_t c = 0; c < H; ++c) x2[static_cast<std::size_t>((b * S + t) * H + c)] = 1e6f * nd(rng);
    const auto padded2 = run(S, x2, dyp, lengths);
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = lengths[static_cast<std::size_t>(b)];
      const auto first = static_cast<std::size_t>(b * S * H), count = static_cast<std::size_t>(n * H);
      const std::vector<float> xs(x.begin() + first, x.begin() + first + count);
      const std::vector<float> dys(dy.begin() + first, dy.begin() + first + count);
      const auto alone = run(n, xs, dys, {});
      for (const auto* p : {&padded, &padded2}) {
        EXPECT_EQ(std::memcmp(p->first.data() + first, alone.first.data(), count * sizeof(float)), 0)
            << "y of sequence " << b << (sim ? " (sim)" : " (host)");
        EXPECT_EQ(std::memcmp(p->second.data() + first, alone.second.data(), count * sizeof(float)), 0)
            << "dx of sequence " << b << (sim ? " (sim)" : " (host)");
      }
    }
  }
}

TEST(TpTransformerErrors, NameTheSizesAndTheValidChoices) {
  const TransformerLayerOptions ok{.hidden = 64, .heads = 8, .kv_heads = 2, .ffn = 128, .seq = 16};
  EXPECT_EQ(error_of(2, ok), "no error");
  std::string m = error_of(4, ok);
  EXPECT_NE(m.find("kv_heads (query groups) 2 are not divisible by the tensor-parallel size 4"), std::string::npos) << m;
  EXPECT_NE(m.find("valid tp sizes 1, 2"), std::string::npos) << m;
  auto bad = ok;
  bad.kv_heads = 3;
  m = error_of(1, bad);
  EXPECT_NE(m.find("heads 8 are not divisible by kv_heads (query groups) 3"), std::string::npos) << m;
  bad = ok;
  bad.heads = 6;
  bad.kv_heads = 0;
  m = error_of(1, bad);
  EXPECT_NE(m.find("hidden 64 is not divisible by heads 6"), std::string::npos) << m;
  bad = ok;
  bad.sequence_parallel = true;
  bad.seq = 7;
  m = error_of(2, bad);
  EXPECT_NE(m.find("sequence parallel needs batch x seq = 7 rows divisible by tp 2"), std::string::npos) << m;
  bad = ok;
  bad.ffn = 130;
  m = error_of(4, {.hidden = 64, .heads = 8, .kv_heads = 4, .ffn = 130, .seq = 16});
  EXPECT_NE(m.find("not divisible by the tensor-parallel size 4"), std::string::npos) << m;
  m = error_of(4, {.hidden = 64, .heads = 8, .kv_heads = 4, .ffn = 130, .seq = 16, .swiglu = true});
  EXPECT_NE(m.find("ParallelMLP: ffn (SwiGLU) features (130) are not divisible by the tensor-parallel size 4"),
            std::string::npos)
      << m;
  m = error_of(1, {.hidden = 60, .heads = 4, .ffn = 64, .seq = 16, .rotary = true});
  EXPECT_NE(m.find("rotary embeddings need an even head_dim (hidden 60 / heads 4 = 15)"), std::string::npos) << m;
}

}  // namespace
}  // namespace cubesim::tp
