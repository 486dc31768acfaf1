// sparse_store.h — bytes at addresses, backed sparsely: a page exists once something writes to it.
//
// A memory of terabytes costs only the pages touched (64 KiB each, plus a bitmap of written bytes
// while a page is only partly written), so nominal HBM sizes run on a laptop. The store remembers
// which bytes were ever written: reading never-written bytes is not an error here (they read as
// zero) but first_unwritten() finds them, which is how Memory reports uninitialized reads.
//
//   SparseStore s(1ull << 40);                  // 1 TiB nominal, nothing resident
//   s.write(4096, bytes.data(), bytes.size());  // one page now resident
//   s.first_unwritten(0, 8192);                 // -> 0: bytes 0..4095 were never written
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

namespace cubesim::hw {

class SparseStore {
 public:
  static constexpr std::uint64_t kPageBytes = 64 * 1024;

  SparseStore() = default;
  SparseStore(const SparseStore&) = delete;
  SparseStore& operator=(const SparseStore&) = delete;

  // Preconditions for all: the range is inside the owning memory (Memory checks bounds).
  void write(std::uint64_t addr, const std::byte* src, std::uint64_t len);
  void fill(std::uint64_t addr, std::uint64_t len, std::byte value);
  // Never-written bytes read as zero.
  void read(std::uint64_t addr, std::byte* dst, std::uint64_t len) const;
  // Copies from another store (not the same one); the destination bytes count as written.
  void copy_from(const SparseStore& src, std::uint64_t src_addr, std::uint64_t dst_addr, std::uint64_t len);
  // dst = f(dst, src) in place, piece by piece where both ranges are contiguous (pieces end at either
  // range's page boundaries): f(d, s, n) combines n bytes at s into d. src may be this store (the
  // ranges must not overlap); never-written source bytes read as zero; the destination bytes count
  // as written.
  using Combine = void (*)(std::byte* d, const std::byte* s, std::uint64_t n, void* ctx);
  void combine_from(const SparseStore& src, std::uint64_t src_addr, std::uint64_t dst_addr, std::uint64_t len,
                    Combine f, void* ctx);

  std::optional<std::uint64_t> first_unwritten(std::uint64_t addr, std::uint64_t len) const;
  bool all_written(std::uint64_t addr, std::uint64_t len) const { return !first_unwritten(addr, len); }

  std::uint64_t pages() const { return pages_.size(); }
  // Bytes this store holds in host memory (pages and written-bitmaps).
  std::uint64_t resident_bytes() const;
  void clear() { pages_.clear(); }

 private:
  static constexpr std::uint64_t kWords = kPageBytes / 64;
  struct Page {
    std::unique_ptr<std::byte[]> data;
    // One bit per byte while the page is partly written; null once every byte has been written.
    std::unique_ptr<std::uint64_t[]> written;
    std::uint64_t written_bytes = 0;
  };
  // The page at `index`, made if absent: zeroed with a written-bitmap, or (whole: the caller is
  // about to write all of it) left as it comes and marked written.
  Page& page_for_write(std::uint64_t index, bool whole);
  const Page* find(std::uint64_t index) const {
    auto it = pages_.find(index);
    return it == pages_.end() ? nullptr : &it->second;
  }
  static void mark_written(Page& p, std::uint64_t lo, std::uint64_t hi);

  std::unordered_map<std::uint64_t, Page> pages_;
};

}  // namespace cubesim::hw
