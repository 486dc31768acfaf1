// microkernel.h — the register-blocked 6x16 micro-kernels of the fast det_gemm (internal).
//
// A micro-kernel continues a 6x16 f32 tile c (row i at c + i*ldc) by kc steps over packed panels:
//   for k in [0, kc):  c[i][j] = fma(a[k*6 + i], b[k*16 + j], c[i][j])
// starting from c's values when `load`, from +0.0f otherwise. Lanes run across j (n) only: one
// lane of a vector FMA is exactly one scalar fma, so every variant gives the reference's bits.
//
//   microkernel_6x16_avx2(kc, packed_a, packed_b, &acc[i0 * ld + j0], ld, /*load=*/k0 > 0);
//
// With AVX-512 the bulk of the output goes through a 12x32 tile built from the same packed slivers
// (two 6-row A slivers, two 16-column B slivers), the 6x16 kernel doing the edges:
//   microkernel_12x32_avx512(kc, a, a + 6*kc, b, b + 16*kc, &acc[i0 * ld + j0], ld, load);
//
// This header holds declarations only: det_gemm_avx2.cpp is compiled with -mavx2 -mfma (and
// det_gemm_avx512.cpp with -mavx512f) and must not instantiate any inline function another file
// could share (the linker might keep its AVX2 copy for a CPU without AVX2).
#pragma once

#include <cstdint>

namespace cubesim::kernels::detail {

inline constexpr int kMR = 6;   // rows of the register tile
inline constexpr int kNR = 16;  // columns of the register tile: two 8-lane vectors

using MicroKernel = void (*)(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool load);

void microkernel_6x16_avx2(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool load);
// Rows 0-5 from the A sliver a0, rows 6-11 from a1; columns 0-15 from the B sliver b0, 16-31 from b1.
void microkernel_12x32_avx512(std::int64_t kc, const float* a0, const float* a1, const float* b0, const float* b1,
                              float* c, std::int64_t ldc, bool load);
void microkernel_6x16_portable(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                               bool load);

// Packing a full 16-column sliver of B with AVX2 (the same values the scalar packer writes):
// dst[k*16 + c] = B(k, c) for k < kc, c < 16. `src` points at B(0, 0) of the sliver.
// k-major: B's columns are contiguous along k (B = Wᵀ of a row-major W), column c at src + c*ld.
void pack_b_kmajor_f32_avx2(const float* src, std::int64_t ld, std::int64_t kc, float* dst);
void pack_b_kmajor_bf16_avx2(const std::uint16_t* src, std::int64_t ld, std::int64_t kc, float* dst);
// A full 6-row sliver of a row-major A (row r at src + r*ld): dst[k*6 + r] for k < kc. Writes up to
// 2 floats past dst + kc*6 (garbage the next sliver overwrites; the buffer keeps slack for the last).
void pack_a_rowmajor_f32_avx2(const float* src, std::int64_t ld, std::int64_t kc, float* dst);
void pack_a_rowmajor_bf16_avx2(const std::uint16_t* src, std::int64_t ld, std::int64_t kc, float* dst);
// n-major: B's rows are contiguous (row-major B), row k at src + k*ld. `slivers` consecutive full
// slivers at once, row by row: dst[j*kc*16 + k*16 + c] = B(k, 16j + c).
void pack_b_nmajor_f32_avx2(const float* src, std::int64_t ld, std::int64_t kc, std::int64_t slivers, float* dst);
void pack_b_nmajor_bf16_avx2(const std::uint16_t* src, std::int64_t ld, std::int64_t kc, std::int64_t slivers,
                             float* dst);

}  // namespace cubesim::kernels::detail
