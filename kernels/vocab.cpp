#include "kernels/vocab.h"

#include <limits>
#include <vector>

#include "kernels/elementwise.h"

namespace cubesim::kernels {

namespace {
float at(NormBuffer b, std::int64_t r, std::int64_t j) { return load_f32(b.data, b.dtype, r * b.row_stride + j); }
bool in_slice(std::int64_t id, std::int64_t start, std::int64_t rows) { return id >= start && id < start + rows; }
}  // namespace

void embedding_forward(NormBuffer weight, std::int64_t rows, std::int64_t vocab_start, const std::int64_t* ids,
                       std::int64_t tokens, std::int64_t hidden, MutableNormBuffer out) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const bool mine = in_slice(ids[t], vocab_start, rows);
    for (std::int64_t e = 0; e < hidden; ++e) {
      store_f32(out.data, out.dtype, t * out.row_stride + e, mine ? at(weight, ids[t] - vocab_start, e) : 0.0f);
    }
  }
}

void embedding_backward(NormBuffer dy, const std::int64_t* ids, std::int64_t tokens, std::int64_t hidden,
                        std::int64_t rows, std::int64_t vocab_start, MutableNormBuffer dweight) {
  std::vector<float> acc(static_cast<std::size_t>(rows * hidden), 0.0f);
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (!in_slice(ids[t], vocab_start, rows)) continue;
    float* row = &acc[static_cast<std::size_t>((ids[t] - vocab_start) * hidden)];
    for (std::int64_t e = 0; e < hidden; ++e) row[e] = det_add(row[e], at(dy, t, e));
  }
  for (std::int64_t v = 0; v < rows; ++v)
    for (std::int64_t e = 0; e < hidden; ++e)
      store_f32(dweight.data, dweight.dtype, v * dweight.row_stride + e, acc[static_cast<std::size_t>(v * hidden + e)]);
}

void cross_entropy_max(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, float* max) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < vocab; ++j) {
      const float x = at(logits, t, j);
      if (x > m || x != x) m = x;  // NaN wins, as a max reduction's NaN does
      if (m != m) break;
    }
    max[t] = m;
  }
}

void cross_entropy_partials(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const std::int64_t* targets, std::int64_t vocab_start, float* partials) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    float s = 0.0f;
    for (std::int64_t j = 0; j < vocab; ++j) s = det_add(s, det_exp(det_add(at(logits, t, j), -max[t])));
    partials[2 * t] = s;
    partials[2 * t + 1] = in_slice(targets[t], vocab_start, vocab) ? at(logits, t, targets[t] - vocab_start) : 0.0f;
  }
}

float cross_entropy_loss(float sum_exp, float max, float target_logit) {
  return det_add(det_log(sum_exp), -det_add(target_logit, -max));
}

void cross_entropy_backward(NormBuffer logits, std::int64_t tokens, std::int64_t vocab, const float* max,
                            const float* partials, const std::int64_t* targets, std::int64_t vocab_start,
                            const float* dloss, MutableNormBuffer dlogits) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float s = partials[2 * t];
    for (std::int64_t j = 0; j < vocab; ++j) {
      const float p = det_div(det_exp(det_add(at(logits, t, j), -max[t])), s);
      const float g = det_add(p, targets[t] == vocab_start + j ? -1.0f : 0.0f);
      store_f32(dlogits.data, dlogits.dtype, t * dlogits.row_stride + j, det_mul(g, dloss[t]));
    }
  }
}

}  // namespace cubesim::kernels
