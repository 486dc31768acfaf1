// The loop both vector reduction steps (reduce_avx2.cpp, reduce_avx512.cpp) run. Header-only and
// free of vector types, so each of those translation units instantiates it with its own ISA flags.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

namespace cubesim::kernels::detail {

// The loop over whole vectors: one 64-byte line of each operand per step, with the line 2 KiB ahead
// of each prefetched (three streams of 64 KiB simulated pages: the hardware's prefetchers alone left
// the loop at ~75% of memcpy's bandwidth on cold data), then single vectors.
template <class T, int kStep, class Body>
inline std::int64_t vector_loop(T* d, const T* s, std::int64_t count, Body body) {
  constexpr std::int64_t kLine = 64 / sizeof(T), kAhead = 2048 / sizeof(T);
  std::int64_t i = 0;
  for (; i + kLine <= count; i += kLine) {
    _mm_prefetch(reinterpret_cast<const char*>(d + i + kAhead), _MM_HINT_T0);  // never faults
    _mm_prefetch(reinterpret_cast<const char*>(s + i + kAhead), _MM_HINT_T0);
    for (std::int64_t j = 0; j < kLine; j += kStep) body(d + i + j, s + i + j);
  }
  for (; i + kStep <= count; i += kStep) body(d + i, s + i);
  return i;
}

}  // namespace cubesim::kernels::detail
