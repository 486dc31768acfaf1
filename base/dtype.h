// dtype.h — the element types of the project (f32, bf16, f16) and the conversions between them: the
// one DType every layer uses (sim/hw's rate tables, kernels, tensors, the CUDA kernels).
//
// Narrowing rounds to nearest, ties to even, bit for bit as CUDA's __float2bfloat16_rn and
// __float2half_rn do (their host code and their sm_80+ `cvt.rn` instructions agree):
//   - overflow goes to infinity (f16: |x| >= 65520; bf16: |x| >= 0x1.ffp127 with ties to even),
//   - f16 subnormals are rounded exactly (smallest 2^-24; anything <= 2^-25 goes to signed zero),
//   - every NaN becomes the canonical NaN 0x7fff, sign dropped — which is what CUDA produces.
// Widening (bf16/f16 -> f32) is exact and matches CUDA's device conversions (__bfloat162float,
// __half2float) on all 65536 patterns: bf16 is a shift (a NaN keeps its bits, signalling or not);
// an f16 NaN becomes the canonical f32 NaN 0x7fffffff, which is what the GPU's cvt.f32.f16 gives.
// kernels/tools/verify_conversions_cuda.cu checks all of this exhaustively on a GPU.
//
//   std::uint16_t h = cubesim::f32_to_bf16(1.0f / 3.0f);   // 0x3eab
//   float x = cubesim::bf16_to_f32(h);                     // 0.333984375f
//   cubesim::DType t = cubesim::parse_dtype("bf16");       // throws, listing f32/bf16/f16, on "fp8"
//
// The functions are header-inline because GEMM packing calls them per element.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cubesim {

enum class DType : std::uint8_t { f32, bf16, f16 };
inline constexpr std::size_t kNumDTypes = 3;
// Every DType in enum order (an index into per-dtype tables such as hw::RateSpec::per_cycle).
inline constexpr DType kAllDTypes[kNumDTypes] = {DType::f32, DType::bf16, DType::f16};

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

// "f32", "bf16", "f16"; "?" for a value outside the enum.
std::string_view dtype_name(DType t);

// Accepts the names above and the usual aliases (float32, float, fp32, bfloat16, float16, half,
// fp16). Throws std::invalid_argument naming the input and the valid names.
DType parse_dtype(std::string_view name);

// True for the three enumerators; a DType read from untrusted bytes may be anything.
constexpr bool dtype_valid(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Canonical NaN of the 16-bit formats, as CUDA's conversions produce it.
inline constexpr std::uint16_t kBf16CanonicalNaN = 0x7fff;
inline constexpr std::uint16_t kF16CanonicalNaN = 0x7fff;
inline constexpr std::uint32_t kF32CanonicalNaN = 0x7fffffff;

inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return kBf16CanonicalNaN;
  // Adding 0x7fff (+1 when the kept lsb is odd) carries into the kept half exactly when the
  // dropped half is above one half-ulp, or equal to it with an odd lsb: ties to even. A carry out
  // of the largest finite value lands on the infinity pattern, as it should.
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

inline float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return kF16CanonicalNaN;
  // 65520 is halfway between 65504 (max f16, odd mantissa) and 2^16: it and above round to inf.
  if (u >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (u >= 0x38800000u) {  // normal in f16 (>= 2^-14): rebias 127 -> 15, round 23 -> 10 bits
    const std::uint32_t r = u - 0x38000000u;
    const std::uint32_t lsb = (r >> 13) & 1u;
    return static_cast<std::uint16_t>(sign | ((r + 0xfffu + lsb) >> 13));
  }
  if (u <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to even zero
  // Subnormal in f16: the result counts units of 2^-24. A rounding carry into bit 10 gives the
  // smallest normal pattern (0x0400), which is again the correct value.
  const std::uint32_t e = u >> 23;                 // 102..112
  const std::uint32_t shift = 126u - e;            // 14..24
  const std::uint32_t mant = (u & 0x7fffffu) | 0x800000u;
  std::uint32_t r = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  std::uint32_t bits;
  if (e == 0x1f) {
    bits = m ? kF32CanonicalNaN : sign | 0x7f800000u;  // NaN: canonical, as on the GPU
  } else if (e != 0) {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    bits = sign;
  } else {  // subnormal: normalise (m * 2^-24 is exact in f32)
    std::uint32_t exp = 113;  // the exponent of 2^-14, biased by 127, before shifting
    while (!(m & 0x400u)) {
      m <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((m & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Element i of a buffer of type t, widened exactly to f32.
inline float load_f32(const void* data, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
  }
  return 0.0f;  // unreachable for a valid DType
}

// Stores v into element i of a buffer of type t, rounding to nearest even.
inline void store_f32(void* data, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(data)[i] = v; return;
    case DType::bf16: static_cast<std::uint16_t*>(data)[i] = f32_to_bf16(v); return;
    case DType::f16: static_cast<std::uint16_t*>(data)[i] = f32_to_f16(v); return;
  }
}

// v rounded to t and widened back: the f32 value a t-typed store of v would hold.
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::f32: return v;
    case DType::bf16: return bf16_to_f32(f32_to_bf16(v));
    case DType::f16: return f16_to_f32(f32_to_f16(v));
  }
  return v;
}

// Bulk conversions of n contiguous elements.
void convert_to_f32(const void* src, DType src_type, float* dst, std::size_t n);
void convert_from_f32(const float* src, void* dst, DType dst_type, std::size_t n);

}  // namespace cubesim
