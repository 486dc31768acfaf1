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
  constexpr std::int64_t kLine = 64 / sizeof(T);
  static_assert(kLine % kStep == 0, "whole vectors to a line");
  // The address 2 KiB ahead, as an integer: it may lie past the operands (a prefetch never faults;
  // a pointer formed there would be undefined).
  auto ahead = [](const T* p) { return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + 2048); };
  std::int64_t i = 0;
  for (; i + kLine <= count; i += kLine) {
    _mm_prefetch(ahead(d + i), _MM_HINT_T0);
    _mm_prefetch(ahead(s + i), _MM_HINT_T0);
    for (std::int64_t j = 0; j < kLine; j += kStep) body(d + i + j, s + i + j);
  }
  for (; i + kStep <= count; i += kStep) body(d + i, s + i);
  return i;
}

}  // namespace cubesim::kernels::detail
