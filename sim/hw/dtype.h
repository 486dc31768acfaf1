// dtype.h — the element types the hardware model has rates for (MAC array, vector unit).
//
// sim/hw knows nothing of tensors; it only needs to name a dtype to look up a rate and to size
// a tile. The runtime maps its own dtype onto this one.
//
//   Dtype d = parse_dtype("bf16", "cube.pe.mac.macs_per_cycle");  // throws, naming the path
//   dtype_bytes(d) == 2;  dtype_name(d) == "bf16"
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace cubesim::hw {

enum class Dtype : std::uint8_t { kF32 = 0, kBf16 = 1, kF16 = 2 };
inline constexpr std::size_t kNumDtypes = 3;
inline constexpr std::array<Dtype, kNumDtypes> kAllDtypes = {Dtype::kF32, Dtype::kBf16, Dtype::kF16};

constexpr std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kF32: return "f32";
    case Dtype::kBf16: return "bf16";
    case Dtype::kF16: return "f16";
  }
  return "?";
}
constexpr std::uint32_t dtype_bytes(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

// "f32" | "bf16" | "f16"; anything else throws std::invalid_argument naming `where` and the choices.
Dtype parse_dtype(std::string_view s, std::string_view where);

}  // namespace cubesim::hw
