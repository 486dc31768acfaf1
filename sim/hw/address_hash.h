// address_hash.h — the hash that spreads addresses over a memory's parts, as GPUs hash physical
// addresses over their L2 sets and DRAM channels (so that a power-of-two row pitch does not land
// every row of a matrix on the same few).
//
//   const std::uint64_t r = spread(q, n);   // in [0, n): the rotation of stripe q over n parts
#pragma once

#include <cstdint>

namespace cubesim::hw {

// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// floor(mix64(q) * n / 2^64): q's hash scaled into [0, n) (no division, no modulo bias worth naming).
inline std::uint64_t spread(std::uint64_t q, std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(mix64(q)) * n) >> 64);
}

}  // namespace cubesim::hw
