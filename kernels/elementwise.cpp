#include "kernels/elementwise.h"

#include <stdexcept>
#include <string>

namespace cubesim::kernels {

std::string_view gelu_kind_name(GeluKind k) { return k == GeluKind::tanh ? "tanh" : "erf"; }

GeluKind parse_gelu_kind(std::string_view s) {
  if (s == "tanh") return GeluKind::tanh;
  if (s == "erf") return GeluKind::erf;
  throw std::invalid_argument("unknown GELU form '" + std::string(s) + "': valid forms are tanh and erf");
}

void gelu_forward(GeluKind k, const float* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = gelu(k, in[i]);
}

void gelu_backward(GeluKind k, const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = gelu_backward(k, x[i], dy[i]);
}

}  // namespace cubesim::kernels
