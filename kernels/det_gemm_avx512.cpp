// The AVX-512 micro-kernel. Compiled with -mavx512f -mfma and called only after a run-time check
// (cpu_has_avx512f), like det_gemm_avx2.cpp; include nothing that instantiates shared inline code.
#include <immintrin.h>

#include "kernels/detail/microkernel.h"

namespace cubesim::kernels::detail {

// A 12x32 tile: 24 zmm accumulators (12 rows x 2 vectors of 16 columns), two B vectors, one
// broadcast: 27 of the 32 zmm registers. Four times the 6x16 tile's work per loop step for the
// same loop overhead and half the loads per FMA, which is what lifts it from ~89% to ~96% of the
// FMA ports' peak (Zen 4, where a zmm FMA takes both 256-bit pipes for one cycle). Each
// _mm512_fmadd_ps lane is one correctly rounded fma in ascending k: the contract's order.
void microkernel_12x32_avx512(std::int64_t kc, const float* a0, const float* a1, const float* b0, const float* b1,
                              float* c, std::int64_t ldc, bool load) {
  __m512 acc[2 * kMR][2];
  if (load) {
#pragma GCC unroll 12
    for (int i = 0; i < 2 * kMR; ++i) {
      acc[i][0] = _mm512_loadu_ps(c + i * ldc);
      acc[i][1] = _mm512_loadu_ps(c + i * ldc + 16);
    }
  } else {
#pragma GCC unroll 12
    for (int i = 0; i < 2 * kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  }
  // C is read and written once per k block, so by the time a tile comes round again its lines
  // have left the caches. The first 24 steps each prefetch one of this tile's 24 lines (for the
  // stores at the end) and one of the tile below's (the caller's next call; a prefetch past the
  // end of C is harmless): spread out, they don't stall the loop as a burst of 48 would.
  const float* next = c + 2 * kMR * ldc;
  auto step = [&](std::int64_t k) {
    const __m512 x0 = _mm512_loadu_ps(b0 + k * kNR), x1 = _mm512_loadu_ps(b1 + k * kNR);
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      const __m512 av = _mm512_set1_ps(a0[k * kMR + i]);
      acc[i][0] = _mm512_fmadd_ps(av, x0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, x1, acc[i][1]);
    }
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      const __m512 av = _mm512_set1_ps(a1[k * kMR + i]);
      acc[kMR + i][0] = _mm512_fmadd_ps(av, x0, acc[kMR + i][0]);
      acc[kMR + i][1] = _mm512_fmadd_ps(av, x1, acc[kMR + i][1]);
    }
  };
  std::int64_t k = 0;
  for (; k < kc && k < 4 * kMR; ++k) {
    const std::int64_t line = (k >> 1) * ldc + (k & 1) * kNR;
    _mm_prefetch(reinterpret_cast<const char*>(c + line), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(next + line), _MM_HINT_T0);
    step(k);
  }
  for (; k < kc; ++k) step(k);
#pragma GCC unroll 12
  for (int i = 0; i < 2 * kMR; ++i) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}

}  // namespace cubesim::kernels::detail
