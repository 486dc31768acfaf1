// microkernel.h — the register-blocked 6x16 micro-kernels of the fast det_gemm (internal).
//
// A micro-kernel continues a 6x16 f32 tile c (row i at c + i*ldc) by kc steps over packed panels:
//   for k in [0, kc):  c[i][j] = fma(a[k*6 + i], b[k*16 + j], c[i][j])
// starting from c's values when `load`, from +0.0f otherwise. Lanes run across j (n) only: one
// lane of a vector FMA is exactly one scalar fma, so every variant gives the reference's bits.
//
//   microkernel_6x16_avx2(kc, packed_a, packed_b, &acc[i0 * ld + j0], ld, /*load=*/k0 > 0);
//
// This header holds declarations only: det_gemm_avx2.cpp is compiled with -mavx2 -mfma and must
// not instantiate any inline function another file could share (the linker might keep its AVX2
// copy for a CPU without AVX2).
#pragma once

#include <cstdint>

namespace cubesim::kernels::detail {

inline constexpr int kMR = 6;   // rows of the register tile
inline constexpr int kNR = 16;  // columns of the register tile: two 8-lane vectors

using MicroKernel = void (*)(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool load);

void microkernel_6x16_avx2(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool load);
void microkernel_6x16_portable(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                               bool load);

}  // namespace cubesim::kernels::detail
