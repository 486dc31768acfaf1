// attention_cases.h — the attention contract (kernels/attention.h) as a table of test cases that any
// attention backend plugs into unchanged: equality with the host definition, accuracy against f64,
// and batch invariance (batch size, batch position, whatever the other sequences hold, chunked
// prefill, padding), forward and backward, with grouped-query heads and odd sizes round the key block.
//
// A backend is two functions over host buffers; a device backend copies the inputs in, runs, and
// writes the results into the given host buffers. Add one with one line in one .cpp of a test binary:
//
//   #include "tests/kernels/attention_cases.h"
//   INSTANTIATE_ATTENTION_CONTRACT(Cuda, ::testing::Values(cuda_exact_attention()));
//
// Operands have padded rows (row_stride > heads x head_dim) whose gaps hold NaN; outputs are
// poisoned before each run and checked fully written, gaps untouched. Data is random, never constant.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/gemm_test_util.h"

namespace cubesim::kernels::testing {

struct AttentionBackend {
  std::string name;  // letters, digits and '_'
  // Why the backend cannot run here ("" when it can): every case of it is skipped with the reason.
  std::function<std::string()> unavailable = [] { return std::string(); };
  std::function<void(const AttentionShape&, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                     MutableAttentionBuffer out, float* stats, const std::int64_t* kv_valid)>
      forward;
  std::function<void(const AttentionShape&, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                     AttentionBuffer out, const float* stats, AttentionBuffer dout, MutableAttentionBuffer dq,
                     MutableAttentionBuffer dk, MutableAttentionBuffer dv, const std::int64_t* kv_valid)>
      backward;
  // The bound on ‖out − f64‖/‖f64‖ for the accuracy check (out's dtype, gradient or not); empty:
  // attn_tolerance, the exact mode's.
  std::function<double(DType, bool)> tolerance;
};

inline AttentionBackend host_attention() {
  return {"host", [] { return std::string(); },
          [](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v, MutableAttentionBuffer o,
             float* st, const std::int64_t* kv) { attention_forward(s, q, k, v, o, st, kv); },
          [](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v, AttentionBuffer o,
             const float* st, AttentionBuffer dout, MutableAttentionBuffer dq, MutableAttentionBuffer dk,
             MutableAttentionBuffer dv,
             const std::int64_t* kv) { attention_backward(s, q, k, v, o, st, dout, dq, dk, dv, kv); },
          {}};
}

enum class AttnCheck {
  matches_host,      // bitwise equal to the host definition (and to itself with other poison)
  accuracy,          // ‖out − f64‖/‖f64‖ within the dtype's bound
  batch_size,        // sequence 0 alone == sequence 0 in a batch of `batch` random sequences
  batch_position,    // a sequence alone == the same sequence at every position of the batch
  other_sequences,   // a sequence alone == the same among sequences holding inf, NaN, huge values
  chunked_prefill,   // causal: the queries in uneven chunks (q_offset, keys so far) == all at once
  padding,           // right padding: kv_valid with garbage keys and queries beyond it changes nothing
  repeat,            // run to run: the same inputs twice (other poison) give the same bits
};

inline const char* attn_check_name(AttnCheck c) {
  switch (c) {
    case AttnCheck::matches_host: return "matches_host";
    case AttnCheck::accuracy: return "accuracy";
    case AttnCheck::batch_size: return "batch_size";
    case AttnCheck::batch_position: return "batch_position";
    case AttnCheck::other_sequences: return "other_sequences";
    case AttnCheck::chunked_prefill: return "chunked_prefill";
    case AttnCheck::padding: return "padding";
    case AttnCheck::repeat: return "repeat";
  }
  return "?";
}

struct AttentionCase {
  AttnCheck check = AttnCheck::matches_host;
  bool backward = false;
  std::int64_t batch = 1, seq = 1, heads = 1, kv_heads = 1, head_dim = 8;
  bool causal = true;
  DType in = DType::f32, out = DType::f32;
  Layout layout = Layout::row_padded;  // of every operand (tensor-core backends need 16-byte rows)

  AttentionShape shape(std::int64_t b) const {
    return {.batch = b, .seq_q = seq, .seq_k = seq, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
            .causal = causal};
  }
  std::string name() const {
    return std::string(backward ? "bwd_" : "fwd_") + attn_check_name(check) + "_" + std::string(dtype_name(in)) +
           "to" + std::string(dtype_name(out)) + (causal ? "_causal" : "_full") + "_b" + std::to_string(batch) + "s" +
           std::to_string(seq) + "h" + std::to_string(heads) + "g" + std::to_string(kv_heads) + "d" +
           std::to_string(head_dim);
  }
};

// ---- operands ------------------------------------------------------------------------------------

// One operand: tokens x width, padded rows (gaps NaN).
inline HostMatrix attn_random(DType t, std::int64_t tokens, std::int64_t width, std::uint64_t seed,
                              Layout layout = Layout::row_padded) {
  return HostMatrix::random(t, tokens, width, layout, seed);
}
inline AttentionBuffer abuf(const HostMatrix& m) {
  const MatrixView v = m.view();
  return {v.data, v.dtype, v.row_stride};
}
inline MutableAttentionBuffer mbuf(HostMatrix& m) {
  const MutableMatrixView v = m.mview();
  return {v.data, v.dtype, v.row_stride};
}

struct AttnInputs {
  HostMatrix q, k, v, dout;
};
inline AttnInputs attn_inputs(const AttentionCase& c, std::int64_t batch, std::int64_t seq_q, std::int64_t seq_k,
                              std::uint64_t seed) {
  return {attn_random(c.in, batch * seq_q, c.heads * c.head_dim, seed, c.layout),
          attn_random(c.in, batch * seq_k, c.kv_heads * c.head_dim, seed + 1, c.layout),
          attn_random(c.in, batch * seq_k, c.kv_heads * c.head_dim, seed + 2, c.layout),
          attn_random(c.out, batch * seq_q, c.heads * c.head_dim, seed + 3, c.layout)};
}

struct AttnResults {
  HostMatrix out, dq, dk, dv;
  std::vector<float> stats;
};

inline AttnResults attn_run(const AttentionBackend& be, const AttentionCase& c, const AttentionShape& s,
                            const AttnInputs& in, int poison = 0, const std::int64_t* kv_valid = nullptr) {
  AttnResults r;
  const std::int64_t qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  r.out = HostMatrix::output(c.out, s.batch * s.seq_q, qw, c.layout, poison);
  r.stats.assign(static_cast<std::size_t>(s.batch * s.seq_q * s.heads * 2), std::nanf(""));
  be.forward(s, abuf(in.q), abuf(in.k), abuf(in.v), mbuf(r.out), r.stats.data(), kv_valid);
  EXPECT_TRUE(r.out.fully_written()) << be.name << " " << c.name() << ": out";
  if (!c.backward) return r;
  r.dq = HostMatrix::output(c.in, s.batch * s.seq_q, qw, c.layout, poison);
  r.dk = HostMatrix::output(c.in, s.batch * s.seq_k, kw, c.layout, poison);
  r.dv = HostMatrix::output(c.in, s.batch * s.seq_k, kw, c.layout, poison);
  be.backward(s, abuf(in.q), abuf(in.k), abuf(in.v), abuf(r.out), r.stats.data(), abuf(in.dout), mbuf(r.dq),
              mbuf(r.dk), mbuf(r.dv), kv_valid);
  EXPECT_TRUE(r.dq.fully_written()) << be.name << " " << c.name() << ": dq";
  EXPECT_TRUE(r.dk.fully_written()) << be.name << " " << c.name() << ": dk";
  EXPECT_TRUE(r.dv.fully_written()) << be.name << " " << c.name() << ": dv";
  return r;
}

// The bytes a buffer spans: rows of row_stride, the last up to its last head's end (a device or
// simulated copy of a host buffer covers this much).
inline std::size_t attn_extent_bytes(AttentionBuffer b, std::int64_t rows, std::int64_t heads, std::int64_t per_group,
                                     std::int64_t d) {
  const std::int64_t last = attention_head_offset(b.group_stride, heads - 1, per_group, d) + d;
  return static_cast<std::size_t>((rows - 1) * b.row_stride + last) * dtype_size(b.dtype);
}

// Rows [r0, r0+n) of `got` bitwise equal rows [w0, w0+n) of `want` (same width and dtype).
inline ::testing::AssertionResult attn_rows_equal(const char* what, const HostMatrix& got, std::int64_t r0,
                                                  const HostMatrix& want, std::int64_t w0, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t e = 0; e < got.cols(); ++e) {
      if (got.bits(r0 + i, e) != want.bits(w0 + i, e)) {
        return ::testing::AssertionFailure() << what << " row " << i << " column " << e << ": " << got.at(r0 + i, e)
                                             << " against " << want.at(w0 + i, e);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Copies rows [from0, from0+n) of `from` into rows [to0, to0+n) of `to`.
inline void attn_copy_rows(const HostMatrix& from, std::int64_t from0, HostMatrix& to, std::int64_t to0,
                           std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t e = 0; e < from.cols(); ++e) to.set(to0 + i, e, from.at(from0 + i, e));
}

// The checked results of sequence `at` of run `got` against sequence 0 of run `alone`.
inline void expect_sequence_equal(const AttentionCase& c, const AttnResults& got, std::int64_t at,
                                  const AttnResults& alone, const std::string& where) {
  const std::int64_t s = c.seq;
  EXPECT_TRUE(attn_rows_equal("out", got.out, at * s, alone.out, 0, s)) << where;
  const std::size_t per_seq = static_cast<std::size_t>(s * c.heads * 2);  // the softmax statistics
  EXPECT_EQ(0, std::memcmp(got.stats.data() + static_cast<std::size_t>(at) * per_seq, alone.stats.data(),
                           per_seq * sizeof(float)))
      << where << ": stats";
  if (!c.backward) return;
  EXPECT_TRUE(attn_rows_equal("dq", got.dq, at * s, alone.dq, 0, s)) << where;
  EXPECT_TRUE(attn_rows_equal("dk", got.dk, at * s, alone.dk, 0, s)) << where;
  EXPECT_TRUE(attn_rows_equal("dv", got.dv, at * s, alone.dv, 0, s)) << where;
}

// ---- the f64 definition --------------------------------------------------------------------------

struct AttnF64 {
  std::vector<double> out, dq, dk, dv;
};

// softmax(q·kᵀ·scale) v and its gradients in f64 on the same (widened) inputs; D from the f64 output.
inline AttnF64 attn_f64(const AttentionShape& s, const AttnInputs& in, bool backward) {
  const std::int64_t d = s.head_dim, group = s.heads / s.kv_heads, sq = s.seq_q, sk = s.seq_k;
  const double scale = s.softmax_scale();
  AttnF64 r;
  r.out.assign(static_cast<std::size_t>(s.batch * sq * s.heads * d), 0.0);
  if (backward) {
    r.dq.assign(r.out.size(), 0.0);
    r.dk.assign(static_cast<std::size_t>(s.batch * sk * s.kv_heads * d), 0.0);
    r.dv.assign(r.dk.size(), 0.0);
  }
  const std::int64_t off = s.query_offset();
  std::vector<double> p(static_cast<std::size_t>(sk)), dp(static_cast<std::size_t>(sk));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t t = 0; t < sq; ++t) {
        const std::int64_t nk = s.causal ? std::min(sk, off + t + 1) : sk;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < nk; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) dot += double(in.q.at(b * sq + t, h * d + e)) * in.k.at(b * sk + j, g * d + e);
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < nk; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (std::int64_t j = 0; j < nk; ++j) p[j] /= sum;
        double* o = &r.out[((b * sq + t) * s.heads + h) * d];
        for (std::int64_t j = 0; j < nk; ++j)
          for (std::int64_t e = 0; e < d; ++e) o[e] += p[j] * in.v.at(b * sk + j, g * d + e);
        if (!backward) continue;
        double D = 0;
        for (std::int64_t e = 0; e < d; ++e) D += double(in.dout.at(b * sq + t, h * d + e)) * o[e];
        for (std::int64_t j = 0; j < nk; ++j) {
          double x = 0;
          for (std::int64_t e = 0; e < d; ++e) x += double(in.dout.at(b * sq + t, h * d + e)) * in.v.at(b * sk + j, g * d + e);
          const double ds = p[j] * (x - D);
          for (std::int64_t e = 0; e < d; ++e) {
            r.dq[((b * sq + t) * s.heads + h) * d + e] += ds * scale * in.k.at(b * sk + j, g * d + e);
            r.dk[((b * sk + j) * s.kv_heads + g) * d + e] += ds * scale * in.q.at(b * sq + t, h * d + e);
            r.dv[((b * sk + j) * s.kv_heads + g) * d + e] += p[j] * in.dout.at(b * sq + t, h * d + e);
          }
        }
      }
    }
  return r;
}

inline double attn_rel_error(const HostMatrix& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  const std::int64_t w = got.cols();
  for (std::int64_t r = 0; r < got.rows(); ++r)
    for (std::int64_t e = 0; e < w; ++e) {
      const double x = want[static_cast<std::size_t>(r * w + e)];
      num += (got.at(r, e) - x) * (got.at(r, e) - x);
      den += x * x;
    }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The bound on ‖out − f64‖/‖f64‖: the output's rounding (half an ulp, relative) plus f32 arithmetic
// over the softmax and sums (a few hundred terms: 1e-5). Gradients read the rounded output (D) and
// round dQ, dK, dV to the input dtype: four times the rounding.
inline double attn_tolerance(DType out, bool gradient) {
  const double u = out == DType::f32 ? 0.0 : out == DType::bf16 ? 0x1p-8 : 0x1p-11;
  return (gradient ? 4 : 1) * u + 2e-5;
}

// ---- the checks ----------------------------------------------------------------------------------

inline void run_attention_case(const AttentionBackend& be, const AttentionCase& c) {
  if (const std::string why = be.unavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::uint64_t seed = std::hash<std::string>{}(c.name()) % 100000;
  const AttentionShape s = c.shape(c.batch);
  switch (c.check) {
    case AttnCheck::matches_host: {
      const AttnInputs in = attn_inputs(c, c.batch, c.seq, c.seq, seed);
      const AttnResults got = attn_run(be, c, s, in, 0);
      const AttnResults want = attn_run(host_attention(), c, s, in, 1);
      const std::int64_t n = c.batch * c.seq;
      EXPECT_TRUE(attn_rows_equal("out", got.out, 0, want.out, 0, n));
      EXPECT_EQ(0, std::memcmp(got.stats.data(), want.stats.data(), got.stats.size() * sizeof(float))) << "stats";
      if (c.backward) {
        EXPECT_TRUE(attn_rows_equal("dq", got.dq, 0, want.dq, 0, n));
        EXPECT_TRUE(attn_rows_equal("dk", got.dk, 0, want.dk, 0, n));
        EXPECT_TRUE(attn_rows_equal("dv", got.dv, 0, want.dv, 0, n));
      }
      return;
    }
    case AttnCheck::accuracy: {
      const AttnInputs in = attn_inputs(c, c.batch, c.seq, c.seq, seed);
      const AttnResults got = attn_run(be, c, s, in);
      const AttnF64 ref = attn_f64(s, in, c.backward);
      const auto bound = [&](DType t, bool gradient) {
        return be.tolerance ? be.tolerance(t, gradient) : attn_tolerance(t, gradient);
      };
      const double eo = attn_rel_error(got.out, ref.out);
      EXPECT_LE(eo, bound(c.out, false)) << "out";
      ::testing::Test::RecordProperty("rel_error_out", std::to_string(eo));
      if (c.backward) {
        const double tol = bound(c.in == DType::f32 ? c.out : c.in, true);
        ::testing::Test::RecordProperty("rel_error_dq", std::to_string(attn_rel_error(got.dq, ref.dq)));
        ::testing::Test::RecordProperty("rel_error_dk", std::to_string(attn_rel_error(got.dk, ref.dk)));
        ::testing::Test::RecordProperty("rel_error_dv", std::to_string(attn_rel_error(got.dv, ref.dv)));
        EXPECT_LE(attn_rel_error(got.dq, ref.dq), tol) << "dq";
        EXPECT_LE(attn_rel_error(got.dk, ref.dk), tol) << "dk";
        EXPECT_LE(attn_rel_error(got.dv, ref.dv), tol) << "dv";
      }
      return;
    }
    case AttnCheck::repeat: {
      const AttnInputs in = attn_inputs(c, c.batch, c.seq, c.seq, seed);
      const AttnResults a = attn_run(be, c, s, in, 0);
      const AttnResults b = attn_run(be, c, s, in, 1);
      expect_sequence_equal(c, a, 0, b, "run to run");
      for (std::int64_t at = 1; at < c.batch; ++at) {
        EXPECT_TRUE(attn_rows_equal("out", a.out, at * c.seq, b.out, at * c.seq, c.seq)) << "run to run";
        if (c.backward) {
          EXPECT_TRUE(attn_rows_equal("dq", a.dq, at * c.seq, b.dq, at * c.seq, c.seq)) << "run to run";
          EXPECT_TRUE(attn_rows_equal("dk", a.dk, at * c.seq, b.dk, at * c.seq, c.seq)) << "run to run";
          EXPECT_TRUE(attn_rows_equal("dv", a.dv, at * c.seq, b.dv, at * c.seq, c.seq)) << "run to run";
        }
      }
      return;
    }
    case AttnCheck::batch_size:
    case AttnCheck::batch_position:
    case AttnCheck::other_sequences: {
      const AttnInputs one = attn_inputs(c, 1, c.seq, c.seq, seed);
      const AttnResults alone = attn_run(be, c, c.shape(1), one);
      const std::int64_t positions = c.check == AttnCheck::batch_size ? 1 : c.batch;
      for (std::int64_t at = 0; at < positions; ++at) {
        AttnInputs many = attn_inputs(c, c.batch, c.seq, c.seq, seed + 100 + static_cast<std::uint64_t>(at));
        if (c.check == AttnCheck::other_sequences) {
          // The others hold values that poison any sum they reach.
          const float extreme[] = {INFINITY, -INFINITY, std::nanf(""), 3e38f, -3e38f, 0.0f, 1e-40f};
          std::mt19937 rng(static_cast<std::uint32_t>(seed));
          for (HostMatrix* m : {&many.q, &many.k, &many.v, &many.dout})
            for (std::int64_t r = 0; r < m->rows(); ++r)
              for (std::int64_t e = 0; e < m->cols(); ++e) m->set(r, e, extreme[rng() % 7]);
        }
        for (auto [from, to] : {std::pair{&one.q, &many.q}, {&one.k, &many.k}, {&one.v, &many.v}, {&one.dout, &many.dout}})
          attn_copy_rows(*from, 0, *to, at * c.seq, c.seq);
        const AttnResults got = attn_run(be, c, s, many);
        expect_sequence_equal(c, got, at, alone, "sequence at batch position " + std::to_string(at));
      }
      return;
    }
    case AttnCheck::chunked_prefill: {
      // Forward only: uneven chunks, each with the keys so far (a KV cache), q_offset at its start.
      const AttnInputs in = attn_inputs(c, 1, c.seq, c.seq, seed);
      const AttnResults whole = attn_run(be, c, c.shape(1), in);
      std::int64_t t0 = 0, step = 1;
      while (t0 < c.seq) {
        const std::int64_t n = std::min(step, c.seq - t0);
        AttentionShape cs = c.shape(1);
        cs.seq_q = n;
        cs.seq_k = t0 + n;
        cs.q_offset = t0;
        AttnInputs part = attn_inputs(c, 1, n, t0 + n, seed + 7);
        attn_copy_rows(in.q, t0, part.q, 0, n);
        attn_copy_rows(in.k, 0, part.k, 0, t0 + n);
        attn_copy_rows(in.v, 0, part.v, 0, t0 + n);
        AttentionCase fwd = c;
        fwd.backward = false;
        const AttnResults got = attn_run(be, fwd, cs, part);
        EXPECT_TRUE(attn_rows_equal("out", got.out, 0, whole.out, t0, n)) << "chunk at " << t0 << " of " << n;
        t0 += n;
        step = step * 3 + 2;  // 1, 5, 17, 53, ...: chunks across the key blocks' edges
      }
      return;
    }
    case AttnCheck::padding: {
      // Sequence 0 of length seq alone, and right-padded to seq + 37 in a batch: keys and queries
      // beyond kv_valid hold garbage (inf, NaN), and their rows of dout too.
      const AttnInputs one = attn_inputs(c, 1, c.seq, c.seq, seed);
      const AttnResults alone = attn_run(be, c, c.shape(1), one);
      AttentionCase pc = c;
      pc.seq = c.seq + 37;
      AttnInputs many = attn_inputs(pc, c.batch, pc.seq, pc.seq, seed + 11);
      for (auto [from, to] : {std::pair{&one.q, &many.q}, {&one.k, &many.k}, {&one.v, &many.v}, {&one.dout, &many.dout}}) {
        attn_copy_rows(*from, 0, *to, 0, c.seq);
        for (std::int64_t r = c.seq; r < pc.seq; ++r)
          for (std::int64_t e = 0; e < to->cols(); ++e) to->set(r, e, (r + e) % 2 ? std::nanf("") : INFINITY);
      }
      std::vector<std::int64_t> valid(static_cast<std::size_t>(c.batch), pc.seq);
      valid[0] = c.seq;
      for (std::size_t b = 1; b < valid.size(); ++b) valid[b] = pc.seq - static_cast<std::int64_t>(b) * 5;
      AttentionShape ps = pc.shape(c.batch);
      ps.q_offset = 0;
      const AttnResults got = attn_run(be, pc, ps, many, 0, valid.data());
      EXPECT_TRUE(attn_rows_equal("out", got.out, 0, alone.out, 0, c.seq));
      for (std::int64_t r = c.seq; r < pc.seq; ++r)  // padding queries see no key: zero rows
        for (std::int64_t e = 0; e < got.out.cols(); ++e) ASSERT_EQ(got.out.at(r, e), 0.0f) << "out padding row " << r;
      if (c.backward) {
        EXPECT_TRUE(attn_rows_equal("dq", got.dq, 0, alone.dq, 0, c.seq));
        EXPECT_TRUE(attn_rows_equal("dk", got.dk, 0, alone.dk, 0, c.seq));
        EXPECT_TRUE(attn_rows_equal("dv", got.dv, 0, alone.dv, 0, c.seq));
        for (std::int64_t r = c.seq; r < pc.seq; ++r) {  // padding rows' gradients are zero
          for (std::int64_t e = 0; e < got.dq.cols(); ++e) ASSERT_EQ(got.dq.at(r, e), 0.0f) << "dq padding row " << r;
          for (std::int64_t e = 0; e < got.dk.cols(); ++e) {
            ASSERT_EQ(got.dk.at(r, e), 0.0f) << "dk padding row " << r;
            ASSERT_EQ(got.dv.at(r, e), 0.0f) << "dv padding row " << r;
          }
        }
      }
      return;
    }
  }
}

// The table: every check over shapes round the key block (1, 63, 64, 65, 130 keys), grouped-query
// heads, head sizes 8 and 80, causal and full, and dtype pairs.
inline std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> cases;
  struct Io {
    DType in, out;
  };
  const Io ios[] = {{DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32},
                    {DType::f16, DType::f16}};
  const std::int64_t seqs[] = {1, 63, 64, 65, 130};
  struct Heads {
    std::int64_t heads, kv, d;
  };
  const Heads hs[] = {{1, 1, 8}, {4, 2, 16}, {3, 1, 80}};
  for (bool bwd : {false, true}) {
    for (const Io& io : ios) {
      for (std::int64_t seq : seqs) {
        for (bool causal : {true, false}) {
          const Heads& h = hs[(seq + (causal ? 1 : 0)) % 3];
          AttentionCase c{.backward = bwd, .batch = 3, .seq = seq, .heads = h.heads, .kv_heads = h.kv, .head_dim = h.d,
                          .causal = causal, .in = io.in, .out = io.out};
          for (AttnCheck k : {AttnCheck::matches_host, AttnCheck::accuracy, AttnCheck::batch_size})
            cases.push_back([&] { auto x = c; x.check = k; return x; }());
          if (seq >= 63) {
            for (AttnCheck k : {AttnCheck::batch_position, AttnCheck::other_sequences, AttnCheck::padding}) {
              if (k == AttnCheck::padding && !causal) continue;  // right padding is causal self-attention
              cases.push_back([&] { auto x = c; x.check = k; return x; }());
            }
            if (!bwd && causal) cases.push_back([&] { auto x = c; x.check = AttnCheck::chunked_prefill; return x; }());
          }
        }
      }
    }
  }
  return cases;
}

// The table for tolerance-checked (tensor-core) backends, kernels/attention_tc.h: every invariance
// check bitwise and run to run, accuracy against f64 within the backend's tolerance, over head sizes
// 64 and 128, bf16 and f16, grouped-query heads, causal and full, sequences round the 64-key block.
// Operands are row-major (16-byte rows, as the tensor-core kernels need).
inline std::vector<AttentionCase> attention_tc_cases() {
  std::vector<AttentionCase> cases;
  struct Io {
    DType in, out;
  };
  const Io ios[] = {{DType::bf16, DType::bf16}, {DType::f16, DType::f16}};
  const std::int64_t seqs[] = {1, 63, 64, 65, 130, 257};
  struct Heads {
    std::int64_t heads, kv, d;
  };
  const Heads hs[] = {{4, 2, 128}, {1, 1, 64}, {8, 2, 64}, {2, 2, 128}};
  for (bool bwd : {false, true}) {
    for (const Io& io : ios) {
      for (std::int64_t seq : seqs) {
        for (bool causal : {true, false}) {
          const Heads& h = hs[(seq + (causal ? 1 : 0) + (bwd ? 2 : 0)) % 4];
          AttentionCase c{.backward = bwd, .batch = 3, .seq = seq, .heads = h.heads, .kv_heads = h.kv, .head_dim = h.d,
                          .causal = causal, .in = io.in, .out = io.out, .layout = Layout::row_major};
          for (AttnCheck k : {AttnCheck::accuracy, AttnCheck::batch_size, AttnCheck::repeat}) {
            // One key: the true dQ and dK are exactly 0 (p = 1, dp = D), so no relative error exists;
            // the exact mode's table pins that case bitwise.
            if (k == AttnCheck::accuracy && bwd && seq == 1) continue;
            cases.push_back([&] { auto x = c; x.check = k; return x; }());
          }
          if (seq >= 63) {
            for (AttnCheck k : {AttnCheck::batch_position, AttnCheck::other_sequences, AttnCheck::padding}) {
              if (k == AttnCheck::padding && !causal) continue;
              cases.push_back([&] { auto x = c; x.check = k; return x; }());
            }
            if (!bwd && causal) cases.push_back([&] { auto x = c; x.check = AttnCheck::chunked_prefill; return x; }());
          }
        }
      }
    }
  }
  return cases;
}

// The tensor_core mode's bound (kernels/attention_tc.h): P (and dS) rounded to the operand dtype
// before the MMAs, on top of the output's rounding: twice the exact mode's forward bound; gradients
// read P and dS rounded and cancel in Σ dS (rows of dS sum to ~0): eight times the unit.
inline double attn_tc_tolerance(DType out, bool gradient) {
  const double u = out == DType::f32 ? 0x1p-8 : out == DType::bf16 ? 0x1p-8 : 0x1p-11;
  return (gradient ? 8 : 2) * u + 2e-5;
}

inline void PrintTo(const AttentionBackend& b, std::ostream* os) { *os << b.name; }
inline void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name(); }

class AttentionContract : public ::testing::TestWithParam<std::tuple<AttentionBackend, AttentionCase>> {};

TEST_P(AttentionContract, Holds) {
  const auto& [be, c] = GetParam();
  run_attention_case(be, c);
}

// The same check with another case list (e.g. attention_tc_cases for tensor-core backends).
#define INSTANTIATE_ATTENTION_CASES(prefix, backends, cases)                                                \
  INSTANTIATE_TEST_SUITE_P(                                                                                   \
      prefix, AttentionContract, ::testing::Combine(backends, ::testing::ValuesIn(cases)),                    \
      [](const auto& info) { return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name(); })

#define INSTANTIATE_ATTENTION_CONTRACT(prefix, backends)                                                     \
  INSTANTIATE_TEST_SUITE_P(                                                                                   \
      prefix, AttentionContract,                                                                              \
      ::testing::Combine(backends, ::testing::ValuesIn(::cubesim::kernels::testing::attention_cases())),       \
      [](const auto& info) { return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name(); })

}  // namespace cubesim::kernels::testing
