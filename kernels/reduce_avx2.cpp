// The AVX2 (and F16C, for f16) reduction step: the same bits as the scalar loop in reduce.cpp,
// eight elements at a time. Compiled with -mavx2 -mf16c and called only after a run-time check
// (reduce.cpp), so the library runs on any x86-64. Each lane does what the scalar step does: widen
// both operands exactly to f32, combine once (a + b; max with NaN propagation, dst kept on ties),
// round once to the dtype (round to nearest even; any NaN becomes the dtype's canonical NaN).
#include <immintrin.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/detail/reduce_loop.h"
#include "kernels/reduce.h"

namespace cubesim::kernels::detail {

namespace {
inline __m256 combine(__m256 a, __m256 b, ReduceOp op) {
  if (op == ReduceOp::sum) return _mm256_add_ps(a, b);
  // (isnan(a) || isnan(b)) ? qNaN : (a < b ? b : a)
  const __m256 lt = _mm256_cmp_ps(a, b, _CMP_LT_OQ);
  const __m256 r = _mm256_blendv_ps(a, b, lt);
  const __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
}

inline __m256 load_bf16(const std::uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// f32_to_bf16 (base/dtype.h) on eight lanes: NaN -> the canonical NaN, else add 0x7fff plus the
// kept lsb and keep the high half.
inline void store_bf16(std::uint16_t* p, __m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));  // both non-negative
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(kBf16CanonicalNaN), nan);
  // 32 -> 16 bits: packus works within 128-bit halves; put the halves back in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

inline __m256 load_f16(const std::uint16_t* p) {
  // Exact for every f16 (subnormals included); NaNs keep a payload here, but the store makes any
  // NaN canonical, as the scalar path's result is.
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void store_f16(std::uint16_t* p, __m256 v) {
  __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                        _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
  h = _mm_blendv_epi8(h, _mm_set1_epi16(static_cast<short>(kF16CanonicalNaN)), nan16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
}
}  // namespace

// Handles the multiple-of-8 prefix of count; returns how many elements it did.
std::int64_t reduce_values_avx2(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op) {
  switch (dtype) {
    case DType::f32:
      return vector_loop<float, 8>(static_cast<float*>(dst), static_cast<const float*>(src), count,
                                   [op](float* d, const float* s) {
                                     _mm256_storeu_ps(d, combine(_mm256_loadu_ps(d), _mm256_loadu_ps(s), op));
                                   });
    case DType::bf16:
      return vector_loop<std::uint16_t, 8>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(src),
                                           count, [op](std::uint16_t* d, const std::uint16_t* s) {
                                             store_bf16(d, combine(load_bf16(d), load_bf16(s), op));
                                           });
    case DType::f16:
      return vector_loop<std::uint16_t, 8>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(src),
                                           count, [op](std::uint16_t* d, const std::uint16_t* s) {
                                             store_f16(d, combine(load_f16(d), load_f16(s), op));
                                           });
  }
  return 0;
}

}  // namespace cubesim::kernels::detail
