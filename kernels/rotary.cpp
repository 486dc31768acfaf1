#include "kernels/rotary.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "kernels/elementwise.h"

namespace cubesim::kernels {

RotaryTable rotary_table(std::int64_t positions, std::int64_t head_dim, double base) {
  if (head_dim < 2 || head_dim % 2 != 0) {
    throw std::invalid_argument(fmt::format("rotary: head_dim {} must be even and at least 2 (element e pairs with "
                                            "e + head_dim / 2)",
                                            head_dim));
  }
  if (positions < 1) throw std::invalid_argument(fmt::format("rotary: positions {} must be at least 1", positions));
  if (!(base > 1.0) || !std::isfinite(base)) {
    throw std::invalid_argument(fmt::format("rotary: base {} must be a finite number above 1", base));
  }
  RotaryTable t;
  t.positions = positions;
  t.half = head_dim / 2;
  t.cos.resize(static_cast<std::size_t>(positions * t.half));
  t.sin.resize(t.cos.size());
  for (std::int64_t e = 0; e < t.half; ++e) {
    const double inv_freq = std::pow(base, -2.0 * static_cast<double>(e) / static_cast<double>(head_dim));
    for (std::int64_t p = 0; p < positions; ++p) {
      const double a = static_cast<double>(p) * inv_freq;
      t.cos[static_cast<std::size_t>(p * t.half + e)] = static_cast<float>(std::cos(a));
      t.sin[static_cast<std::size_t>(p * t.half + e)] = static_cast<float>(std::sin(a));
    }
  }
  return t;
}

void rotary_apply(const AttentionShape& s, MutableAttentionBuffer b, std::int64_t heads, std::int64_t per_group,
                  const RotaryTable& t, bool inverse) {
  const std::int64_t d = s.head_dim, half = d / 2;
  if (t.half != half) {
    throw std::invalid_argument(fmt::format("rotary: the table is for head_dim {}, the heads have {}", 2 * t.half, d));
  }
  if (t.positions < s.seq_q) {
    throw std::invalid_argument(fmt::format("rotary: the table has {} positions for sequences of {}", t.positions, s.seq_q));
  }
  for (std::int64_t bi = 0; bi < s.batch; ++bi)
    for (std::int64_t p = 0; p < s.seq_q; ++p) {
      const float* c = &t.cos[static_cast<std::size_t>(p * half)];
      const float* sn = &t.sin[static_cast<std::size_t>(p * half)];
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t ho = attention_head_offset(b.group_stride, h, per_group, d);
        const std::int64_t row = (bi * s.seq_q + p) * b.row_stride + ho;
        for (std::int64_t e = 0; e < half; ++e) {
          const float x1 = load_f32(b.data, b.dtype, row + e), x2 = load_f32(b.data, b.dtype, row + e + half);
          float y1, y2;
          if (!inverse) {
            y1 = det_fma(x1, c[e], det_mul(-x2, sn[e]));
            y2 = det_fma(x2, c[e], det_mul(x1, sn[e]));
          } else {
            y1 = det_fma(x1, c[e], det_mul(x2, sn[e]));
            y2 = det_fma(x2, c[e], det_mul(-x1, sn[e]));
          }
          store_f32(b.data, b.dtype, row + e, y1);
          store_f32(b.data, b.dtype, row + e + half, y2);
        }
      }
    }
}

}  // namespace cubesim::kernels
