// The AVX2+FMA micro-kernel. Compiled with -mavx2 -mfma and called only after a run-time check
// (cpu_has_avx2_fma), so the rest of the library runs on any x86-64. Include nothing here that
// instantiates shared inline code: see detail/microkernel.h.
#include <immintrin.h>

#include "kernels/detail/microkernel.h"

namespace cubesim::kernels::detail {

// Twelve accumulators (6 rows x 2 vectors), two B vectors and one broadcast A value: 15 of the 16
// ymm registers. Each _mm256_fmadd_ps lane is a correctly rounded fma of (a[i], b[j], c[i][j]),
// in ascending k — the contract's order, eight columns at a time.
void microkernel_6x16_avx2(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool load) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (load) {
    c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
    c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
    c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  } else {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
  }
#define CUBESIM_STEP(K)                                     \
  do {                                                      \
    const __m256 b0 = _mm256_loadu_ps(b + (K) * 16);        \
    const __m256 b1 = _mm256_loadu_ps(b + (K) * 16 + 8);    \
    __m256 av = _mm256_broadcast_ss(a + (K) * 6 + 0);       \
    c00 = _mm256_fmadd_ps(av, b0, c00);                     \
    c01 = _mm256_fmadd_ps(av, b1, c01);                     \
    av = _mm256_broadcast_ss(a + (K) * 6 + 1);              \
    c10 = _mm256_fmadd_ps(av, b0, c10);                     \
    c11 = _mm256_fmadd_ps(av, b1, c11);                     \
    av = _mm256_broadcast_ss(a + (K) * 6 + 2);              \
    c20 = _mm256_fmadd_ps(av, b0, c20);                     \
    c21 = _mm256_fmadd_ps(av, b1, c21);                     \
    av = _mm256_broadcast_ss(a + (K) * 6 + 3);              \
    c30 = _mm256_fmadd_ps(av, b0, c30);                     \
    c31 = _mm256_fmadd_ps(av, b1, c31);                     \
    av = _mm256_broadcast_ss(a + (K) * 6 + 4);              \
    c40 = _mm256_fmadd_ps(av, b0, c40);                     \
    c41 = _mm256_fmadd_ps(av, b1, c41);                     \
    av = _mm256_broadcast_ss(a + (K) * 6 + 5);              \
    c50 = _mm256_fmadd_ps(av, b0, c50);                     \
    c51 = _mm256_fmadd_ps(av, b1, c51);                     \
  } while (0)
  // Not unrolled: with an unrolled body GCC 12 hoists the next step's B loads and runs out of
  // registers (spills in the loop, ~10% slower); this loop is 12 FMAs, 8 loads and 3 adds.
  for (std::int64_t k = 0; k < kc; ++k) {
    CUBESIM_STEP(0);
    a += 6;
    b += 16;
  }
#undef CUBESIM_STEP
  _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
  _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

namespace {

// bf16 -> f32 for 8 values: a shift, exactly as bf16_to_f32.
inline __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

// Rows r[0..7] (8 lines of 8 k each) become dst + j*stride, j = 0..7, each holding element j of
// every line. The stores go in ascending address order, so with stride < 8 each store's tail is
// overwritten by the next (the A packer relies on that).
template <int stride>
inline void transpose8_store(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 r4, __m256 r5, __m256 r6,
                             __m256 r7, float* dst) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  _mm256_storeu_ps(dst + 0 * stride, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + 1 * stride, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 2 * stride, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 3 * stride, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 4 * stride, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 5 * stride, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 6 * stride, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 7 * stride, _mm256_permute2f128_ps(u3, u7, 0x31));
}

inline float widen_bf16_scalar(std::uint16_t h) {
  const std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &x, 4);
  return f;
}

}  // namespace

void pack_b_kmajor_f32_avx2(const float* src, std::int64_t ld, std::int64_t kc, float* dst) {
  std::int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    for (int c0 = 0; c0 < 16; c0 += 8) {
      const float* s = src + c0 * ld + k;
      transpose8_store<16>(_mm256_loadu_ps(s), _mm256_loadu_ps(s + ld), _mm256_loadu_ps(s + 2 * ld),
                       _mm256_loadu_ps(s + 3 * ld), _mm256_loadu_ps(s + 4 * ld), _mm256_loadu_ps(s + 5 * ld),
                       _mm256_loadu_ps(s + 6 * ld), _mm256_loadu_ps(s + 7 * ld), dst + k * 16 + c0);
    }
  }
  for (; k < kc; ++k)
    for (int c = 0; c < 16; ++c) dst[k * 16 + c] = src[c * ld + k];
}

void pack_b_kmajor_bf16_avx2(const std::uint16_t* src, std::int64_t ld, std::int64_t kc, float* dst) {
  auto load = [](const std::uint16_t* p) { return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  std::int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    for (int c0 = 0; c0 < 16; c0 += 8) {
      const std::uint16_t* s = src + c0 * ld + k;
      transpose8_store<16>(load(s), load(s + ld), load(s + 2 * ld), load(s + 3 * ld), load(s + 4 * ld),
                       load(s + 5 * ld), load(s + 6 * ld), load(s + 7 * ld), dst + k * 16 + c0);
    }
  }
  for (; k < kc; ++k)
    for (int c = 0; c < 16; ++c) dst[k * 16 + c] = widen_bf16_scalar(src[c * ld + k]);
}

void pack_a_rowmajor_f32_avx2(const float* src, std::int64_t ld, std::int64_t kc, float* dst) {
  const __m256 z = _mm256_setzero_ps();
  std::int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    const float* s = src + k;
    transpose8_store<6>(_mm256_loadu_ps(s), _mm256_loadu_ps(s + ld), _mm256_loadu_ps(s + 2 * ld),
                        _mm256_loadu_ps(s + 3 * ld), _mm256_loadu_ps(s + 4 * ld), _mm256_loadu_ps(s + 5 * ld), z, z,
                        dst + k * 6);
  }
  for (; k < kc; ++k)
    for (int r = 0; r < 6; ++r) dst[k * 6 + r] = src[r * ld + k];
}

void pack_a_rowmajor_bf16_avx2(const std::uint16_t* src, std::int64_t ld, std::int64_t kc, float* dst) {
  auto load = [](const std::uint16_t* p) { return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  const __m256 z = _mm256_setzero_ps();
  std::int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    const std::uint16_t* s = src + k;
    transpose8_store<6>(load(s), load(s + ld), load(s + 2 * ld), load(s + 3 * ld), load(s + 4 * ld),
                        load(s + 5 * ld), z, z, dst + k * 6);
  }
  for (; k < kc; ++k)
    for (int r = 0; r < 6; ++r) dst[k * 6 + r] = widen_bf16_scalar(src[r * ld + k]);
}

void pack_b_nmajor_f32_avx2(const float* src, std::int64_t ld, std::int64_t kc, std::int64_t slivers, float* dst) {
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* s = src + k * ld;
    float* d = dst + k * 16;
    for (std::int64_t j = 0; j < slivers; ++j, s += 16, d += kc * 16) {
      _mm256_storeu_ps(d, _mm256_loadu_ps(s));
      _mm256_storeu_ps(d + 8, _mm256_loadu_ps(s + 8));
    }
  }
}

void pack_b_nmajor_bf16_avx2(const std::uint16_t* src, std::int64_t ld, std::int64_t kc, std::int64_t slivers,
                             float* dst) {
  for (std::int64_t k = 0; k < kc; ++k) {
    const std::uint16_t* s = src + k * ld;
    float* d = dst + k * 16;
    for (std::int64_t j = 0; j < slivers; ++j, s += 16, d += kc * 16) {
      _mm256_storeu_ps(d, widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))));
      _mm256_storeu_ps(d + 8, widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8))));
    }
  }
}

}  // namespace cubesim::kernels::detail
