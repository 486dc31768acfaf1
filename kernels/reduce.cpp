#include "kernels/reduce.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace cubesim::kernels {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view s) {
  for (ReduceOp op : kAllReduceOps) {
    if (s == reduce_op_name(op)) return op;
  }
  throw std::invalid_argument("reduce op '" + std::string(s) + "' is not valid; use 'sum' or 'max'");
}

namespace {
template <class Load, class Store>
void reduce_loop(void* dst, const void* src, std::int64_t count, ReduceOp op, Load load, Store store) {
  for (std::int64_t i = 0; i < count; ++i) {
    const float a = load(dst, i), b = load(src, i);
    float r;
    if (op == ReduceOp::sum) {
      r = a + b;
    } else {
      r = (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<float>::quiet_NaN() : (a < b ? b : a);
    }
    store(dst, i, r);
  }
}
}  // namespace

namespace detail {
#if defined(CUBESIM_KERNELS_AVX2)
std::int64_t reduce_values_avx2(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op);
std::int64_t reduce_values_avx512(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op);
#endif
}  // namespace detail

std::string_view reduce_isa_name(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::automatic: return "automatic";
    case ReduceIsa::scalar: return "scalar";
    case ReduceIsa::avx2: return "avx2";
    case ReduceIsa::avx512: return "avx512";
  }
  return "?";
}

bool reduce_isa_available(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::automatic:
    case ReduceIsa::scalar: return true;
    case ReduceIsa::avx2:
    case ReduceIsa::avx512: {
#if defined(CUBESIM_KERNELS_AVX2)
      static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
      static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
      return isa == ReduceIsa::avx2 ? avx2 : avx512;
#else
      return false;
#endif
    }
  }
  return false;
}

ReduceIsa reduce_isa_automatic() {
  static const ReduceIsa best = reduce_isa_available(ReduceIsa::avx512) ? ReduceIsa::avx512
                                : reduce_isa_available(ReduceIsa::avx2) ? ReduceIsa::avx2
                                                                        : ReduceIsa::scalar;
  return best;
}

void reduce_values(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op, ReduceIsa isa) {
  if (isa == ReduceIsa::automatic) {
    isa = reduce_isa_automatic();
  } else if (!reduce_isa_available(isa)) {
    throw std::invalid_argument("reduce_values: isa " + std::string(reduce_isa_name(isa)) +
                                " is not available on this CPU (" +
                                (isa == ReduceIsa::avx512 ? "AVX-512F, AVX2 and F16C" : "AVX2 and F16C") +
                                " needed); use ReduceIsa::automatic or ReduceIsa::scalar");
  }
  std::int64_t done = 0;
#if defined(CUBESIM_KERNELS_AVX2)
  // Whole vectors with the scalar step's bits (reduce_avx512.cpp, reduce_avx2.cpp); the scalar loop
  // does the rest.
  if (isa == ReduceIsa::avx512) done = detail::reduce_values_avx512(dst, src, dtype, count, op);
  if (isa == ReduceIsa::avx2) done = detail::reduce_values_avx2(dst, src, dtype, count, op);
#endif
  const std::size_t e = dtype_size(dtype);
  reduce_values_scalar(static_cast<std::uint8_t*>(dst) + done * e, static_cast<const std::uint8_t*>(src) + done * e,
                       dtype, count - done, op);
}

void reduce_values_scalar(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op) {
  switch (dtype) {
    case DType::f32:
      reduce_loop(dst, src, count, op, [](const void* p, std::int64_t i) { return static_cast<const float*>(p)[i]; },
                  [](void* p, std::int64_t i, float v) { static_cast<float*>(p)[i] = v; });
      break;
    case DType::bf16:
      reduce_loop(
          dst, src, count, op, [](const void* p, std::int64_t i) { return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]); },
          [](void* p, std::int64_t i, float v) { static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v); });
      break;
    case DType::f16:
      reduce_loop(
          dst, src, count, op, [](const void* p, std::int64_t i) { return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]); },
          [](void* p, std::int64_t i, float v) { static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v); });
      break;
  }
}

}  // namespace cubesim::kernels
