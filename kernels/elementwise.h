// elementwise.h — GELU (tanh and erf forms) forward and backward, under the numerics contract.
//
// Every function here uses only correctly rounded IEEE operations (+, -, *, /, fma) in a fixed
// order — no libm tanh/erf/exp, whose results differ between glibc and CUDA — so the same source
// compiled for the host and for a GPU gives the same bits. Arithmetic goes through det_add/
// det_mul/det_fma, which are plain operators on the host (the project builds with
// -ffp-contract=off) and the non-contracting __fadd_rn/__fmul_rn/__fmaf_rn on the device.
//
//   float y = gelu_tanh(x);           float dx = gelu_tanh_backward(x, dy);
//   gelu_forward(GeluKind::erf, in, out, n);   // buffers of f32 values
//
// Accuracy (against the f64 formulas, tested): det_exp within 2 ulp for normal results (subnormal
// results within their spacing); det_tanh within 3e-7 absolute; det_erf uses Abramowitz-Stegun
// 7.1.26 (1.5e-7 in exact arithmetic, below 5e-7 absolute in f32), and GELU, which scales it by
// x/2, stays within 1e-6 relative.
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define CUBESIM_HD __host__ __device__ inline
#else
#define CUBESIM_HD inline
#endif

namespace cubesim::kernels {

enum class GeluKind { tanh, erf };
std::string_view gelu_kind_name(GeluKind k);
GeluKind parse_gelu_kind(std::string_view s);  // "tanh" | "erf"; throws std::invalid_argument otherwise

#if defined(__CUDA_ARCH__)
CUBESIM_HD float det_add(float a, float b) { return __fadd_rn(a, b); }
CUBESIM_HD float det_mul(float a, float b) { return __fmul_rn(a, b); }
CUBESIM_HD float det_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
CUBESIM_HD float det_div(float a, float b) { return __fdiv_rn(a, b); }
CUBESIM_HD float det_sqrt(float a) { return __fsqrt_rn(a); }
#else
CUBESIM_HD float det_add(float a, float b) { return a + b; }
CUBESIM_HD float det_mul(float a, float b) { return a * b; }
CUBESIM_HD float det_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
CUBESIM_HD float det_div(float a, float b) { return a / b; }
CUBESIM_HD float det_sqrt(float a) { return __builtin_sqrtf(a); }  // IEEE: correctly rounded
#endif

// e^x: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact reduction), a degree-7
// polynomial for e^r in Horner form with fma, then scaling by 2^n through the exponent bits.
CUBESIM_HD float det_exp(float x) {
  if (x != x) return x;
  if (x > 88.72283f) return __builtin_inff();
  if (x < -103.97208f) return 0.0f;
  const float n = __builtin_rintf(det_mul(x, 1.44269504088896341f));
  float r = det_fma(n, -0.693145751953125f, x);  // ln2 high part (exact product)
  r = det_fma(n, -1.428606765330187e-06f, r);    // ln2 low part
  float p = 1.9841270e-4f;
  p = det_fma(p, r, 1.3888889e-3f);
  p = det_fma(p, r, 8.3333333e-3f);
  p = det_fma(p, r, 4.1666667e-2f);
  p = det_fma(p, r, 1.6666667e-1f);
  p = det_fma(p, r, 0.5f);
  p = det_fma(p, r, 1.0f);
  p = det_fma(p, r, 1.0f);
  // 2^n in two steps so that n down to -149 (subnormal results) stays exact.
  const int ni = static_cast<int>(n);
  const int n1 = ni / 2, n2 = ni - n1;
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>((n1 + 127) << 23));
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>((n2 + 127) << 23));
  return det_mul(det_mul(p, s1), s2);
}

// tanh(y) = sign(y) (1 - e) / (1 + e) with e = e^{-2|y|} (no cancellation for large |y|).
CUBESIM_HD float det_tanh(float y) {
  const float a = y < 0 ? -y : y;
  const float e = det_exp(det_mul(-2.0f, a));
  const float t = det_div(det_add(1.0f, -e), det_add(1.0f, e));
  return y < 0 ? -t : t;
}

// ln x: x = 2^e m with m in [sqrt(1/2), sqrt 2) (through the exponent bits; subnormals scaled by
// 2^23 first), ln m = 2 atanh(s) = 2 (s + s^3/3 + ... + s^15/15) with s = (m - 1) / (m + 1), |s| <=
// 0.1716 (the series' tail below 1e-13), then e ln2 with ln2 split in two. ln 0 = -inf, ln of a
// negative or NaN = NaN, ln inf = inf.
CUBESIM_HD float det_log(float x) {
  if (x != x || x < 0.0f) return __builtin_nanf("");
  if (x == 0.0f) return -__builtin_inff();
  if (x == __builtin_inff()) return x;
  int e = 0;
  if (x < 1.17549435e-38f) {  // subnormal
    x = det_mul(x, 8388608.0f);
    e = -23;
  }
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  e += static_cast<int>((bits >> 23) & 0xffu) - 127;
  float m = std::bit_cast<float>((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = det_mul(m, 0.5f);
    ++e;
  }
  const float s = det_div(det_add(m, -1.0f), det_add(m, 1.0f));
  const float s2 = det_mul(s, s);
  float p = 1.0f / 15.0f;
  p = det_fma(p, s2, 1.0f / 13.0f);
  p = det_fma(p, s2, 1.0f / 11.0f);
  p = det_fma(p, s2, 1.0f / 9.0f);
  p = det_fma(p, s2, 1.0f / 7.0f);
  p = det_fma(p, s2, 1.0f / 5.0f);
  p = det_fma(p, s2, 1.0f / 3.0f);
  const float lnm = det_fma(det_mul(2.0f, det_mul(s, s2)), p, det_mul(2.0f, s));
  const float fe = static_cast<float>(e);
  return det_fma(fe, 0.693145751953125f, det_fma(fe, 1.428606765330187e-06f, lnm));
}

// erf(x), Abramowitz-Stegun 7.1.26.
CUBESIM_HD float det_erf(float x) {
  const float a = x < 0 ? -x : x;
  const float t = det_div(1.0f, det_fma(0.3275911f, a, 1.0f));
  float p = 1.061405429f;
  p = det_fma(p, t, -1.453152027f);
  p = det_fma(p, t, 1.421413741f);
  p = det_fma(p, t, -0.284496736f);
  p = det_fma(p, t, 0.254829592f);
  p = det_mul(p, t);
  const float y = det_fma(-p, det_exp(det_mul(-a, a)), 1.0f);
  return x < 0 ? -y : y;
}

inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCoeff = 0.044715f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
CUBESIM_HD float gelu_tanh(float x) {
  const float x3 = det_mul(det_mul(x, x), x);
  const float inner = det_mul(kSqrt2OverPi, det_fma(kGeluCoeff, x3, x));
  return det_mul(det_mul(0.5f, x), det_add(1.0f, det_tanh(inner)));
}

// d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(inner)
CUBESIM_HD float gelu_tanh_backward(float x, float dy) {
  const float x2 = det_mul(x, x);
  const float inner = det_mul(kSqrt2OverPi, det_fma(kGeluCoeff, det_mul(x2, x), x));
  const float t = det_tanh(inner);
  const float dinner = det_mul(kSqrt2OverPi, det_fma(3.0f * kGeluCoeff, x2, 1.0f));
  const float left = det_mul(0.5f, det_add(1.0f, t));
  const float right = det_mul(det_mul(det_mul(0.5f, x), det_fma(-t, t, 1.0f)), dinner);
  return det_mul(dy, det_add(left, right));
}

// 0.5 x (1 + erf(x / sqrt 2))
CUBESIM_HD float gelu_erf(float x) {
  return det_mul(det_mul(0.5f, x), det_add(1.0f, det_erf(det_mul(x, kInvSqrt2))));
}

// d/dx: 0.5 (1 + erf(x / sqrt 2)) + x phi(x), phi(x) = e^{-x^2/2} / sqrt(2 pi)
CUBESIM_HD float gelu_erf_backward(float x, float dy) {
  const float cdf = det_mul(0.5f, det_add(1.0f, det_erf(det_mul(x, kInvSqrt2))));
  const float pdf = det_mul(kInvSqrt2Pi, det_exp(det_mul(det_mul(-0.5f, x), x)));
  return det_mul(dy, det_fma(x, pdf, cdf));
}

CUBESIM_HD float gelu(GeluKind k, float x) { return k == GeluKind::tanh ? gelu_tanh(x) : gelu_erf(x); }
CUBESIM_HD float gelu_backward(GeluKind k, float x, float dy) {
  return k == GeluKind::tanh ? gelu_tanh_backward(x, dy) : gelu_erf_backward(x, dy);
}

// SwiGLU (Shazeer 2020, the Llama MLP's activation): silu(g)·u with silu(g) = g·sigmoid(g), sigmoid(g)
// = 1 / (1 + e^{-g}); one rounding at the end (silu(g) is not rounded on its own).
CUBESIM_HD float det_sigmoid(float g) { return det_div(1.0f, det_add(1.0f, det_exp(-g))); }
CUBESIM_HD float swiglu(float g, float u) { return det_mul(det_mul(g, det_sigmoid(g)), u); }
// d/dg = dy·u·s·(1 + g·(1 − s)), d/du = dy·silu(g), s = sigmoid(g).
struct SwigluGrad {
  float dg, du;
};
CUBESIM_HD SwigluGrad swiglu_backward(float g, float u, float dy) {
  const float s = det_sigmoid(g);
  const float dsilu = det_mul(s, det_fma(g, det_add(1.0f, -s), 1.0f));
  return {det_mul(det_mul(dy, u), dsilu), det_mul(dy, det_mul(g, s))};
}

// Buffers of f32 values, on the host. out may alias in.
void gelu_forward(GeluKind k, const float* in, float* out, std::int64_t n);
void gelu_backward(GeluKind k, const float* x, const float* dy, float* dx, std::int64_t n);

}  // namespace cubesim::kernels
