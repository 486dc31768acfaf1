// checksum.h — exact checksums of tensor bits, for silent-data-corruption detection.
//
// Both sums are over the tensor's words (one word per element: a 16-bit element is read as int16,
// an f32 as int32, each sign-extended to 64 bits) in two's-complement arithmetic modulo 2^64. No
// floating point is involved, so every bit of every element counts, and, integer addition being
// associative, the result is the same whatever order a device reduces in (the cuda kernel sums in
// any order and gives these bits).
//
//   word   S = sum_i sext(w_i)                                            (the recipe's checksum)
//   mix    M = sum_i fmix32(zext(w_i) ^ lo32((base + i + 1) * kMixStep))   (each term < 2^32)
//
// `word` detects any change to a single element (the sum moves by a nonzero amount below 2^32)
// but not two elements swapping places. `mix` is position-sensitive: fmix32 (MurmurHash3's 32-bit
// finalizer) is a bijection of 32-bit values and the position enters by xor, so a change to one
// element always moves M, and a permutation or several changes cancel out only by a coincidence of
// about 2^-32. It costs two 32-bit multiplies per element (cheap on a GPU, where 64-bit multiplies
// are not), so one pass computes both sums at memory speed. Both are additive over
// disjoint pieces: the checksum of a tensor is the sum of its chunks' checksums when each chunk
// passes its first element's index as `base` (so a gathered buffer's sum is its chunks' sums).
//
//   auto s = kernels::checksum(bytes.data(), DType::bf16, n, kernels::ChecksumKind::word);
#pragma once

#include <cstdint>
#include <string_view>

#include "base/dtype.h"

namespace cubesim::kernels {

enum class ChecksumKind : std::uint8_t { word, mix };
inline constexpr ChecksumKind kChecksumKinds[] = {ChecksumKind::word, ChecksumKind::mix};
std::string_view checksum_kind_name(ChecksumKind k);  // "word", "mix"
// "word" | "mix"; std::invalid_argument naming the input and the valid kinds otherwise.
ChecksumKind parse_checksum_kind(std::string_view s);

inline constexpr std::uint64_t kMixStep = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

// MurmurHash3's 32-bit finalizer: a bijection (each step is invertible).
constexpr std::uint32_t fmix32(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
// One term of the mix sum: the word (zero-extended) at index `pos` of its tensor.
constexpr std::uint64_t mix_term(std::uint32_t word, std::uint64_t pos) {
  return fmix32(word ^ static_cast<std::uint32_t>((pos + 1) * kMixStep));
}

// The checksum of `count` elements of `dtype` at `data` (host memory, any alignment); `base` is the
// index of data's first element in the tensor it belongs to (mix only).
std::uint64_t checksum(const void* data, DType dtype, std::int64_t count, ChecksumKind kind, std::uint64_t base = 0);
// Both kinds in one pass: {word, mix}.
struct ChecksumPair {
  std::uint64_t word = 0, mix = 0;
};
ChecksumPair checksum_pair(const void* data, DType dtype, std::int64_t count, std::uint64_t base = 0);

}  // namespace cubesim::kernels
