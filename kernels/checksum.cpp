#include "kernels/checksum.h"

#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::kernels {

std::string_view checksum_kind_name(ChecksumKind k) { return k == ChecksumKind::word ? "word" : "mix"; }

ChecksumKind parse_checksum_kind(std::string_view s) {
  if (s == "word") return ChecksumKind::word;
  if (s == "mix") return ChecksumKind::mix;
  throw std::invalid_argument(fmt::format("unknown checksum kind '{}' (valid: word, mix)", s));
}

namespace {
template <class W>
ChecksumPair sum_words(const unsigned char* p, std::int64_t count, std::uint64_t base, bool want_mix) {
  using U = std::make_unsigned_t<W>;
  ChecksumPair s;
  for (std::int64_t i = 0; i < count; ++i) {
    W w;
    std::memcpy(&w, p + i * sizeof(W), sizeof(W));
    s.word += static_cast<std::uint64_t>(static_cast<std::int64_t>(w));
    if (want_mix) s.mix += mix_term(static_cast<U>(w), base + static_cast<std::uint64_t>(i));
  }
  return s;
}

ChecksumPair sums(const void* data, DType dtype, std::int64_t count, std::uint64_t base, bool want_mix) {
  if (count < 0) throw std::invalid_argument(fmt::format("checksum: negative element count {}", count));
  const auto* p = static_cast<const unsigned char*>(data);
  if (dtype_size(dtype) == 4) return sum_words<std::int32_t>(p, count, base, want_mix);
  return sum_words<std::int16_t>(p, count, base, want_mix);
}
}  // namespace

ChecksumPair checksum_pair(const void* data, DType dtype, std::int64_t count, std::uint64_t base) {
  return sums(data, dtype, count, base, true);
}

std::uint64_t checksum(const void* data, DType dtype, std::int64_t count, ChecksumKind kind, std::uint64_t base) {
  const ChecksumPair s = sums(data, dtype, count, base, kind == ChecksumKind::mix);
  return kind == ChecksumKind::word ? s.word : s.mix;
}

}  // namespace cubesim::kernels
