// verify_conversions_cuda.cu — checks base/dtype.h against the GPU, exhaustively: every one of
// the 2^32 f32 patterns narrowed by __float2bfloat16_rn and __float2half_rn on the device, and every
// 16-bit pattern widened by __bfloat162float and __half2float, compared with the host functions.
// Not part of the build (CI has no GPU); run it on a CUDA machine from the repository root:
//
//   nvcc -std=c++20 -O2 -arch=sm_90 -Xcompiler -fopenmp -I. kernels/tools/verify_conversions_cuda.cu \
//        -o /tmp/verify_conversions && /tmp/verify_conversions
//
// It prints the mismatches per conversion (NaN inputs counted apart) and exits non-zero on any.
// Last run (2026-11-21, H200, CUDA 13.0): no mismatch in any of the four conversions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/dtype.h"

namespace {

__global__ void narrow(std::uint32_t base, std::uint32_t n, std::uint16_t* bf, std::uint16_t* hf) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __uint_as_float(base + i);
  bf[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
  hf[i] = __half_as_ushort(__float2half_rn(x));
}

__global__ void widen(float* fb, float* fh) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  fb[i] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(i)));
  fh[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(i)));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

}  // namespace

int main() {
  constexpr std::uint32_t kChunk = 1u << 28;
  std::uint16_t *d_bf, *d_hf;
  check(cudaMalloc(&d_bf, kChunk * 2), "cudaMalloc");
  check(cudaMalloc(&d_hf, kChunk * 2), "cudaMalloc");
  std::vector<std::uint16_t> bf(kChunk), hf(kChunk);
  unsigned long long bad_bf = 0, bad_hf = 0, bad_bf_nan = 0, bad_hf_nan = 0;
  for (std::uint64_t base = 0; base < (1ull << 32); base += kChunk) {
    narrow<<<kChunk / 256, 256>>>(static_cast<std::uint32_t>(base), kChunk, d_bf, d_hf);
    check(cudaGetLastError(), "narrow");
    check(cudaMemcpy(bf.data(), d_bf, kChunk * 2, cudaMemcpyDeviceToHost), "copy bf16");
    check(cudaMemcpy(hf.data(), d_hf, kChunk * 2, cudaMemcpyDeviceToHost), "copy f16");
#pragma omp parallel for reduction(+ : bad_bf, bad_hf, bad_bf_nan, bad_hf_nan) schedule(static)
    for (std::int64_t i = 0; i < kChunk; ++i) {
      const std::uint32_t u = static_cast<std::uint32_t>(base + i);
      float x;
      std::memcpy(&x, &u, 4);
      const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
      if (cubesim::f32_to_bf16(x) != bf[i]) {
        if (nan) ++bad_bf_nan; else ++bad_bf;
        if (!nan && bad_bf <= 5)
          std::printf("bf16 mismatch 0x%08x: host 0x%04x device 0x%04x\n", u, cubesim::f32_to_bf16(x), bf[i]);
      }
      if (cubesim::f32_to_f16(x) != hf[i]) {
        if (nan) ++bad_hf_nan; else ++bad_hf;
        if (!nan && bad_hf <= 5)
          std::printf("f16 mismatch 0x%08x: host 0x%04x device 0x%04x\n", u, cubesim::f32_to_f16(x), hf[i]);
      }
    }
  }
  std::printf("f32->bf16: %llu mismatches in finite/inf inputs, %llu among NaN inputs\n", bad_bf, bad_bf_nan);
  // One NaN sample each, to show what the device makes of a negative NaN.
  narrow<<<1, 1>>>(0xffc00001u, 1, d_bf, d_hf);
  std::uint16_t nb, nh;
  check(cudaMemcpy(&nb, d_bf, 2, cudaMemcpyDeviceToHost), "copy");
  check(cudaMemcpy(&nh, d_hf, 2, cudaMemcpyDeviceToHost), "copy");
  std::printf("f32->f16: %llu mismatches in finite/inf inputs, %llu among NaN inputs\n", bad_hf, bad_hf_nan);
  std::printf("NaN 0xffc00001 on the device: bf16 0x%04x, f16 0x%04x (host: 0x%04x, 0x%04x)\n", nb, nh,
              cubesim::f32_to_bf16(-__builtin_nanf("1")), cubesim::f32_to_f16(-__builtin_nanf("1")));

  float *d_fb, *d_fh;
  check(cudaMalloc(&d_fb, 65536 * 4), "cudaMalloc");
  check(cudaMalloc(&d_fh, 65536 * 4), "cudaMalloc");
  widen<<<256, 256>>>(d_fb, d_fh);
  std::vector<float> fb(65536), fh(65536);
  check(cudaMemcpy(fb.data(), d_fb, 65536 * 4, cudaMemcpyDeviceToHost), "copy");
  check(cudaMemcpy(fh.data(), d_fh, 65536 * 4, cudaMemcpyDeviceToHost), "copy");
  int wb = 0, wh = 0, wb_nan = 0, wh_nan = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const bool nb16 = (h & 0x7fff) > 0x7f80, nf16 = (h & 0x7fff) > 0x7c00;
    if (bits(cubesim::bf16_to_f32(x)) != bits(fb[h])) {
      if (nb16) { if (wb_nan++ < 3) std::printf("bf16 NaN 0x%04x widens on the device to 0x%08x, host 0x%08x\n", h, bits(fb[h]), bits(cubesim::bf16_to_f32(x))); }
      else ++wb;
    }
    if (bits(cubesim::f16_to_f32(x)) != bits(fh[h])) {
      if (nf16) { if (wh_nan++ < 3) std::printf("f16 NaN 0x%04x widens on the device to 0x%08x, host 0x%08x\n", h, bits(fh[h]), bits(cubesim::f16_to_f32(x))); }
      else ++wh;
    }
  }
  std::printf("bf16->f32: %d mismatches among non-NaN, %d among NaN; f16->f32: %d among non-NaN, %d among NaN\n", wb,
              wb_nan, wh, wh_nan);
  const bool ok = bad_bf == 0 && bad_hf == 0 && bad_bf_nan == 0 && bad_hf_nan == 0 && wb == 0 && wh == 0 &&
                  wb_nan == 0 && wh_nan == 0;
  std::printf("%s\n", ok ? "OK: base/dtype.h converts exactly as CUDA does, NaNs included" : "MISMATCH");
  return ok ? 0 : 1;
}
