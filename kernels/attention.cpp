#include "kernels/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/elementwise.h"

namespace cubesim::kernels {

float AttentionShape::softmax_scale() const {
  if (scale != 0) return scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

void AttentionShape::validate() const {
  auto bad = [](const std::string& m) { throw std::invalid_argument("attention: " + m); };
  if (batch < 1 || seq_q < 1 || seq_k < 1 || head_dim < 1) {
    bad(fmt::format("batch {}, seq_q {}, seq_k {} and head_dim {} must all be at least 1", batch, seq_q, seq_k,
                    head_dim));
  }
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) {
    bad(fmt::format("heads {} must be a positive multiple of kv_heads {} (the query groups)", heads, kv_heads));
  }
  if (causal && q_offset >= 0 && q_offset + seq_q > seq_k) {
    bad(fmt::format("causal queries at positions {}..{} need keys up to {}, but seq_k is {}", q_offset,
                    q_offset + seq_q - 1, q_offset + seq_q - 1, seq_k));
  }
  if (q_offset < -1) bad(fmt::format("q_offset {} must be >= 0 (or -1: seq_k - seq_q)", q_offset));
  if (causal && q_offset < 0 && seq_q > seq_k) {
    bad(fmt::format("causal attention with more queries ({}) than keys ({}) needs q_offset", seq_q, seq_k));
  }
  if (!std::isfinite(scale)) bad(fmt::format("scale {} is not finite", scale));
}

namespace {

struct Operand {
  AttentionBuffer buf;
  std::int64_t seq;
  std::int64_t per_group;  // heads of one query group in this operand (q-like: heads / kv_heads; k-like: 1)
  std::int64_t offset(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) const {
    return (b * seq + t) * buf.row_stride + attention_head_offset(buf.group_stride, h, per_group, d);
  }
  float at(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d, std::int64_t e) const {
    return load_f32(buf.data, buf.dtype, offset(b, t, h, d) + e);
  }
};

}  // namespace

void check_attention_buffer(const char* what, AttentionBuffer b, std::int64_t heads, std::int64_t per_group,
                            std::int64_t d) {
  if (b.data == nullptr) throw std::invalid_argument(fmt::format("attention: {} is null", what));
  if (b.group_stride < 0 || (b.group_stride > 0 && b.group_stride < per_group * d)) {
    throw std::invalid_argument(fmt::format("attention: {}'s group_stride {} must be 0 or at least its group's {} x "
                                            "head_dim = {}",
                                            what, b.group_stride, per_group, per_group * d));
  }
  const std::int64_t width = attention_head_offset(b.group_stride, heads - 1, per_group, d) + d;
  if (b.row_stride < width) {
    throw std::invalid_argument(fmt::format("attention: {}'s row_stride {} is less than its heads' extent {}", what,
                                            b.row_stride, width));
  }
}

namespace {

std::int64_t visible_keys(const AttentionShape& s, std::int64_t b, std::int64_t t, const std::int64_t* kv_valid) {
  return attention_visible_keys(s.seq_k, s.query_offset(), s.causal, b, t, kv_valid);
}

float dot(const float* a, const float* b, std::int64_t n) {
  float acc = 0.0f;
  for (std::int64_t e = 0; e < n; ++e) acc = det_fma(a[e], b[e], acc);
  return acc;
}

// Rows of one (sequence, head) of an operand, widened to f32: [seq][d].
void gather(const Operand& o, std::int64_t b, std::int64_t h, std::int64_t d, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(o.seq * d));
  for (std::int64_t t = 0; t < o.seq; ++t) {
    for (std::int64_t e = 0; e < d; ++e) out[t * d + e] = o.at(b, t, h, d, e);
  }
}

}  // namespace

void attention_forward(const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                       MutableAttentionBuffer out, float* stats, const std::int64_t* kv_valid) {
  s.validate();
  const std::int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  check_attention_buffer("q", q, s.heads, group, d);
  check_attention_buffer("k", k, s.kv_heads, 1, d);
  check_attention_buffer("v", v, s.kv_heads, 1, d);
  check_attention_buffer("out", out, s.heads, group, d);
  if (stats == nullptr) throw std::invalid_argument("attention: stats is null");
  const Operand Q{q, s.seq_q, group}, K{k, s.seq_k, 1}, V{v, s.seq_k, 1};
  const Operand Out{out, s.seq_q, group};
  const float scale = s.softmax_scale();
  std::vector<float> kf, vf, qrow(static_cast<std::size_t>(d)), acc(static_cast<std::size_t>(d)),
      sc(static_cast<std::size_t>(kAttentionKeyBlock));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t g = 0; g < s.kv_heads; ++g) {
      gather(K, b, g, d, kf);
      gather(V, b, g, d, vf);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (std::int64_t t = 0; t < s.seq_q; ++t) {
          for (std::int64_t e = 0; e < d; ++e) qrow[e] = Q.at(b, t, h, d, e);
          const std::int64_t nk = visible_keys(s, b, t, kv_valid);
          float m = kNegInf, l = 0.0f;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (std::int64_t j0 = 0; j0 < nk; j0 += kAttentionKeyBlock) {
            const std::int64_t j1 = std::min(nk, j0 + kAttentionKeyBlock);
            float mb = kNegInf;
            for (std::int64_t j = j0; j < j1; ++j) {
              const float x = det_mul(dot(qrow.data(), &kf[j * d], d), scale);
              sc[j - j0] = x;
              if (x > mb) mb = x;
            }
            const float mn = mb > m ? mb : m;
            const float c = m == kNegInf ? 0.0f : det_exp(det_add(m, -mn));
            l = det_mul(l, c);
            for (std::int64_t e = 0; e < d; ++e) acc[e] = det_mul(acc[e], c);
            for (std::int64_t j = j0; j < j1; ++j) {
              const float p = det_exp(det_add(sc[j - j0], -mn));
              l = det_add(l, p);
              const float* vj = &vf[j * d];
              for (std::int64_t e = 0; e < d; ++e) acc[e] = det_fma(p, vj[e], acc[e]);
            }
            m = mn;
          }
          const std::int64_t row = Out.offset(b, t, h, d);
          for (std::int64_t e = 0; e < d; ++e) {
            store_f32(out.data, out.dtype, row + e, nk == 0 ? 0.0f : det_div(acc[e], l));
          }
          float* st = stats + ((b * s.seq_q + t) * s.heads + h) * 2;
          st[0] = m;
          st[1] = l;
        }
      }
    }
  }
}

void attention_backward(const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                        AttentionBuffer out, const float* stats, AttentionBuffer dout, MutableAttentionBuffer dq,
                        MutableAttentionBuffer dk, MutableAttentionBuffer dv, const std::int64_t* kv_valid) {
  s.validate();
  const std::int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  check_attention_buffer("q", q, s.heads, group, d);
  check_attention_buffer("k", k, s.kv_heads, 1, d);
  check_attention_buffer("v", v, s.kv_heads, 1, d);
  check_attention_buffer("out", out, s.heads, group, d);
  check_attention_buffer("dout", dout, s.heads, group, d);
  check_attention_buffer("dq", dq, s.heads, group, d);
  check_attention_buffer("dk", dk, s.kv_heads, 1, d);
  check_attention_buffer("dv", dv, s.kv_heads, 1, d);
  if (stats == nullptr) throw std::invalid_argument("attention: stats is null");
  const Operand Q{q, s.seq_q, group}, K{k, s.seq_k, 1}, V{v, s.seq_k, 1}, O{out, s.seq_q, group},
      dO{dout, s.seq_q, group}, dQ{dq, s.seq_q, group}, dK{dk, s.seq_k, 1}, dV{dv, s.seq_k, 1};
  const float scale = s.softmax_scale();
  const std::int64_t sq = s.seq_q, sk = s.seq_k;
  std::vector<float> kf, vf, qf, dof, dkacc, dvacc, dqacc(static_cast<std::size_t>(d));
  std::vector<float> p(static_cast<std::size_t>(sk)), ds(static_cast<std::size_t>(sk));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t g = 0; g < s.kv_heads; ++g) {
      gather(K, b, g, d, kf);
      gather(V, b, g, d, vf);
      dkacc.assign(static_cast<std::size_t>(sk * d), 0.0f);
      dvacc.assign(static_cast<std::size_t>(sk * d), 0.0f);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
        gather(Q, b, h, d, qf);
        gather(dO, b, h, d, dof);
        for (std::int64_t t = 0; t < sq; ++t) {
          const float* qt = &qf[t * d];
          const float* dot_t = &dof[t * d];
          float D = 0.0f;
          for (std::int64_t e = 0; e < d; ++e) D = det_fma(dot_t[e], O.at(b, t, h, d, e), D);
          const float* st = stats + ((b * sq + t) * s.heads + h) * 2;
          const float m = st[0], l = st[1];
          const std::int64_t nk = visible_keys(s, b, t, kv_valid);
          for (std::int64_t j = 0; j < nk; ++j) {
            const float x = det_mul(dot(qt, &kf[j * d], d), scale);
            p[j] = det_div(det_exp(det_add(x, -m)), l);
            const float dp = dot(dot_t, &vf[j * d], d);
            ds[j] = det_mul(p[j], det_add(dp, -D));
          }
          std::fill(dqacc.begin(), dqacc.end(), 0.0f);
          for (std::int64_t j = 0; j < nk; ++j) {
            const float* kj = &kf[j * d];
            float* dkj = &dkacc[j * d];
            float* dvj = &dvacc[j * d];
            for (std::int64_t e = 0; e < d; ++e) {
              dqacc[e] = det_fma(ds[j], kj[e], dqacc[e]);
              dkj[e] = det_fma(ds[j], qt[e], dkj[e]);
              dvj[e] = det_fma(p[j], dot_t[e], dvj[e]);
            }
          }
          const std::int64_t row = dQ.offset(b, t, h, d);
          for (std::int64_t e = 0; e < d; ++e) store_f32(dq.data, dq.dtype, row + e, det_mul(dqacc[e], scale));
        }
      }
      for (std::int64_t j = 0; j < sk; ++j) {
        const std::int64_t krow = dK.offset(b, j, g, d);
        const std::int64_t vrow = dV.offset(b, j, g, d);
        for (std::int64_t e = 0; e < d; ++e) {
          store_f32(dk.data, dk.dtype, krow + e, det_mul(dkacc[j * d + e], scale));
          store_f32(dv.data, dv.dtype, vrow + e, dvacc[j * d + e]);
        }
      }
    }
  }
}

double attention_forward_flops(const AttentionShape& s) {
  double scores = 0;
  for (std::int64_t t = 0; t < s.seq_q; ++t) scores += static_cast<double>(visible_keys(s, 0, t, nullptr));
  scores *= static_cast<double>(s.batch * s.heads);
  return scores * (4.0 * static_cast<double>(s.head_dim) + 5.0);
}

}  // namespace cubesim::kernels
