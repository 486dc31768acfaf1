#include "sim/hw/sparse_store.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace cubesim::hw {

namespace {
constexpr std::uint64_t kAll = ~std::uint64_t{0};

// Mask of bits [lo, hi) within one 64-bit word (0 <= lo < hi <= 64).
constexpr std::uint64_t word_mask(std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t upper = hi == 64 ? kAll : ((std::uint64_t{1} << hi) - 1);
  return upper & ~((std::uint64_t{1} << lo) - 1);
}
}  // namespace

SparseStore::Page& SparseStore::page_for_write(std::uint64_t index, bool whole) {
  auto [it, inserted] = pages_.try_emplace(index);
  if (inserted) {
    if (whole) {
      // The caller writes every byte next: nothing to zero, nothing to track.
      it->second.data = std::make_unique_for_overwrite<std::byte[]>(kPageBytes);
      it->second.written_bytes = kPageBytes;
    } else {
      it->second.data = std::make_unique<std::byte[]>(kPageBytes);  // zeroed: unwritten reads as 0
      it->second.written = std::make_unique<std::uint64_t[]>(kWords);
    }
  }
  return it->second;
}

// Marks bytes [lo, hi) of the page written; drops the bitmap once the whole page is.
void SparseStore::mark_written(Page& p, std::uint64_t lo, std::uint64_t hi) {
  if (!p.written) return;
  if (lo == 0 && hi == kPageBytes) {
    p.written.reset();
    p.written_bytes = kPageBytes;
    return;
  }
  std::uint64_t added = 0;
  for (std::uint64_t w = lo / 64; w <= (hi - 1) / 64; ++w) {
    const std::uint64_t a = std::max(lo, w * 64) - w * 64;
    const std::uint64_t b = std::min(hi, w * 64 + 64) - w * 64;
    const std::uint64_t m = word_mask(a, b);
    added += static_cast<std::uint64_t>(std::popcount(m & ~p.written[w]));
    p.written[w] |= m;
  }
  p.written_bytes += added;
  if (p.written_bytes == kPageBytes) p.written.reset();
}

void SparseStore::write(std::uint64_t addr, const std::byte* src, std::uint64_t len) {
  while (len > 0) {
    const std::uint64_t off = addr % kPageBytes;
    const std::uint64_t n = std::min(len, kPageBytes - off);
    Page& p = page_for_write(addr / kPageBytes, n == kPageBytes);
    std::memcpy(p.data.get() + off, src, n);
    mark_written(p, off, off + n);
    addr += n;
    src += n;
    len -= n;
  }
}

void SparseStore::fill(std::uint64_t addr, std::uint64_t len, std::byte value) {
  while (len > 0) {
    const std::uint64_t off = addr % kPageBytes;
    const std::uint64_t n = std::min(len, kPageBytes - off);
    Page& p = page_for_write(addr / kPageBytes, n == kPageBytes);
    std::memset(p.data.get() + off, static_cast<int>(value), n);
    mark_written(p, off, off + n);
    addr += n;
    len -= n;
  }
}

void SparseStore::read(std::uint64_t addr, std::byte* dst, std::uint64_t len) const {
  while (len > 0) {
    const std::uint64_t off = addr % kPageBytes;
    const std::uint64_t n = std::min(len, kPageBytes - off);
    if (const Page* p = find(addr / kPageBytes)) {
      std::memcpy(dst, p->data.get() + off, n);
    } else {
      std::memset(dst, 0, n);
    }
    addr += n;
    dst += n;
    len -= n;
  }
}

void SparseStore::copy_from(const SparseStore& src, std::uint64_t src_addr, std::uint64_t dst_addr,
                            std::uint64_t len) {
  while (len > 0) {
    const std::uint64_t soff = src_addr % kPageBytes;
    const std::uint64_t doff = dst_addr % kPageBytes;
    const std::uint64_t n = std::min({len, kPageBytes - soff, kPageBytes - doff});
    Page& d = page_for_write(dst_addr / kPageBytes, n == kPageBytes);
    if (const Page* s = src.find(src_addr / kPageBytes)) {
      std::memcpy(d.data.get() + doff, s->data.get() + soff, n);
    } else {
      std::memset(d.data.get() + doff, 0, n);
    }
    mark_written(d, doff, doff + n);
    src_addr += n;
    dst_addr += n;
    len -= n;
  }
}

void SparseStore::combine_from(const SparseStore& src, std::uint64_t src_addr, std::uint64_t dst_addr,
                               std::uint64_t len, Combine f, void* ctx) {
  static const std::byte kZeros[kPageBytes] = {};
  while (len > 0) {
    const std::uint64_t soff = src_addr % kPageBytes;
    const std::uint64_t doff = dst_addr % kPageBytes;
    const std::uint64_t n = std::min({len, kPageBytes - soff, kPageBytes - doff});
    Page& d = page_for_write(dst_addr / kPageBytes, false);  // read too: never "whole"
    const Page* s = src.find(src_addr / kPageBytes);  // (a node of the map: stays put when d is made)
    f(d.data.get() + doff, s ? s->data.get() + soff : kZeros, n, ctx);
    mark_written(d, doff, doff + n);
    src_addr += n;
    dst_addr += n;
    len -= n;
  }
}

std::optional<std::uint64_t> SparseStore::first_unwritten(std::uint64_t addr, std::uint64_t len) const {
  while (len > 0) {
    const std::uint64_t off = addr % kPageBytes;
    const std::uint64_t n = std::min(len, kPageBytes - off);
    const Page* p = find(addr / kPageBytes);
    if (p == nullptr) return addr;
    if (p->written) {
      const std::uint64_t lo = off, hi = off + n;
      for (std::uint64_t w = lo / 64; w <= (hi - 1) / 64; ++w) {
        const std::uint64_t a = std::max(lo, w * 64) - w * 64;
        const std::uint64_t b = std::min(hi, w * 64 + 64) - w * 64;
        const std::uint64_t missing = word_mask(a, b) & ~p->written[w];
        if (missing != 0) {
          return addr - off + w * 64 + static_cast<std::uint64_t>(std::countr_zero(missing));
        }
      }
    }
    addr += n;
    len -= n;
  }
  return std::nullopt;
}

std::uint64_t SparseStore::resident_bytes() const {
  std::uint64_t b = 0;
  for (const auto& [index, p] : pages_) b += kPageBytes + (p.written ? kWords * 8 : 0);
  return b;
}

}  // namespace cubesim::hw
