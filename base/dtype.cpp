#include "base/dtype.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace cubesim {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "float" || name == "fp32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "float16" || name == "half" || name == "fp16") return DType::f16;
  throw std::invalid_argument("unknown dtype '" + std::string(name) +
                              "'; valid: f32 (float32), bf16 (bfloat16), f16 (float16, half)");
}

void convert_to_f32(const void* src, DType src_type, float* dst, std::size_t n) {
  switch (src_type) {
    case DType::f32:
      if (n) std::memmove(dst, src, n * sizeof(float));
      return;
    case DType::bf16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
  }
  throw std::invalid_argument("convert_to_f32: invalid dtype value " +
                              std::to_string(static_cast<int>(src_type)));
}

void convert_from_f32(const float* src, void* dst, DType dst_type, std::size_t n) {
  switch (dst_type) {
    case DType::f32:
      if (n) std::memmove(dst, src, n * sizeof(float));
      return;
    case DType::bf16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
  }
  throw std::invalid_argument("convert_from_f32: invalid dtype value " +
                              std::to_string(static_cast<int>(dst_type)));
}

}  // namespace cubesim
