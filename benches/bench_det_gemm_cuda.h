// bench_det_gemm_cuda.h — the device helpers bench_det_gemm_cuda.cpp calls (bench_det_gemm_cuda.cu).
#pragma once

#include <cstdint>

namespace cubesim::bench::gpu {

// n bf16 values uniform in [-1, 1) from a counter-based hash of (seed, index); on the default stream.
void fill_random_bf16(void* p, std::int64_t n, std::uint64_t seed);

// n f32 values uniform in [-1, 1) (24 random bits) from the same hash; on the default stream.
void fill_random_f32(void* p, std::int64_t n, std::uint64_t seed);

// An order-independent 64-bit digest of the bytes of n 32-bit words (each word mixed with its index,
// then summed): equal digests mean equal bits with overwhelming probability. Synchronizes.
std::uint64_t digest_words(const void* p, std::int64_t n);

struct Comparison {
  std::int64_t mismatches = 0;  // elements whose bits differ
  std::int64_t compared = 0;
  double rel_fro = 0;           // ||a - b|| / ||b||
};
// Two rows x cols bf16 matrices (row strides lda, ldb) compared on the device; synchronizes.
Comparison compare_bf16(const void* a, std::int64_t lda, const void* b, std::int64_t ldb, std::int64_t rows,
                        std::int64_t cols);

// FLOP/s of a kernel that does nothing but independent FFMA chains on every SM: the f32 ceiling as
// this GPU runs it now (clock and power as they are), beside the nominal SMs x 128 x 2 x clock.
double ffma_ceiling_flops();

}  // namespace cubesim::bench::gpu
