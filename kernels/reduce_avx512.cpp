// The AVX-512 reduction step: reduce_avx2.cpp's lanes, sixteen at a time. Compiled with -mavx512f
// and called only after a run-time check (reduce.cpp), like det_gemm_avx512.cpp. Each lane does what
// the scalar step does (reduce.cpp): widen both operands exactly to f32, combine once (a + b; max with
// NaN propagation, dst kept on ties), round once to the dtype (round to nearest even; any NaN becomes
// the dtype's canonical NaN). Twice the AVX2 loop's lanes per instruction: a reduction step of a
// functional collective runs at the memory's speed, not the core's.
#include <immintrin.h>


#include <cstdint>

#include "base/dtype.h"
#include "kernels/detail/reduce_loop.h"
#include "kernels/reduce.h"

namespace cubesim::kernels::detail {

// GCC 12's AVX-512 conversion intrinsics start from _mm*_undefined_*() values, which its
// -Wmaybe-uninitialized reports inside the header once inlined in this file's loops: a false report.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {
inline __m512 combine(__m512 a, __m512 b, ReduceOp op) {
  if (op == ReduceOp::sum) return _mm512_add_ps(a, b);
  // (isnan(a) || isnan(b)) ? qNaN : (a < b ? b : a)
  const __mmask16 lt = _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
  const __m512 r = _mm512_mask_blend_ps(lt, a, b);
  const __mmask16 nan = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, r, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

inline __m512 load_bf16(const std::uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// f32_to_bf16 (base/dtype.h) on sixteen lanes: NaN -> the canonical NaN, else add 0x7fff plus the
// kept lsb and keep the high half.
inline void store_bf16(std::uint16_t* p, __m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(kBf16CanonicalNaN));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));  // each lane < 2^16
}

inline __m512 load_f16(const std::uint16_t* p) {
  // Exact for every f16 (subnormals included); NaNs keep a payload here, but the store makes any
  // NaN canonical, as the scalar path's result is.
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline void store_f16(std::uint16_t* p, __m512 v) {
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  // Widened to 32-bit lanes to blend under the 16-lane mask, then narrowed back.
  const __m512i wide = _mm512_mask_blend_epi32(nan, _mm512_cvtepu16_epi32(h), _mm512_set1_epi32(kF16CanonicalNaN));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(wide));
}
}  // namespace

// Handles the multiple-of-16 prefix of count; returns how many elements it did.
std::int64_t reduce_values_avx512(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op) {
  switch (dtype) {
    case DType::f32:
      return vector_loop<float, 16>(static_cast<float*>(dst), static_cast<const float*>(src), count,
                                    [op](float* d, const float* s) {
                                      _mm512_storeu_ps(d, combine(_mm512_loadu_ps(d), _mm512_loadu_ps(s), op));
                                    });
    case DType::bf16:
      return vector_loop<std::uint16_t, 16>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(src),
                                            count, [op](std::uint16_t* d, const std::uint16_t* s) {
                                              store_bf16(d, combine(load_bf16(d), load_bf16(s), op));
                                            });
    case DType::f16:
      return vector_loop<std::uint16_t, 16>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(src),
                                            count, [op](std::uint16_t* d, const std::uint16_t* s) {
                                              store_f16(d, combine(load_f16(d), load_f16(s), op));
                                            });
  }
  return 0;
}

#pragma GCC diagnostic pop

}  // namespace cubesim::kernels::detail
