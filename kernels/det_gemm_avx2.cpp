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
  std::int64_t k = 0;
  for (; k + 4 <= kc; k += 4) {
    CUBESIM_STEP(0);
    CUBESIM_STEP(1);
    CUBESIM_STEP(2);
    CUBESIM_STEP(3);
    a += 4 * 6;
    b += 4 * 16;
  }
  for (; k < kc; ++k) {
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

}  // namespace cubesim::kernels::detail
