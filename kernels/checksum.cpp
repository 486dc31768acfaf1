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
std::uint64_t sum_words(const unsigned char* p, std::int64_t count, ChecksumKind kind, std::uint64_t base) {
  using U = std::make_unsigned_t<W>;
  std::uint64_t s = 0;
  if (kind == ChecksumKind::word) {
    for (std::int64_t i = 0; i < count; ++i) {
      W w;
      std::memcpy(&w, p + i * sizeof(W), sizeof(W));
      s += static_cast<std::uint64_t>(static_cast<std::int64_t>(w));
    }
  } else {
    std::uint64_t pos = (base + 1) * kMixStep;
    for (std::int64_t i = 0; i < count; ++i, pos += kMixStep) {
      U w;
      std::memcpy(&w, p + i * sizeof(W), sizeof(W));
      s += fmix64(static_cast<std::uint64_t>(w) + pos);
    }
  }
  return s;
}
}  // namespace

std::uint64_t checksum(const void* data, DType dtype, std::int64_t count, ChecksumKind kind, std::uint64_t base) {
  if (count < 0) throw std::invalid_argument(fmt::format("checksum: negative element count {}", count));
  const auto* p = static_cast<const unsigned char*>(data);
  if (dtype_size(dtype) == 4) return sum_words<std::int32_t>(p, count, kind, base);
  return sum_words<std::int16_t>(p, count, kind, base);
}

}  // namespace cubesim::kernels
