// region.h — a set of bytes in one memory: `rows` runs of `row_bytes`, `pitch` apart.
//
// A contiguous range is one row. A tile of a row-major matrix is several: a 128x64 bf16 tile of a
// matrix with 4096 columns is Region{addr, 128, 64 * 2, 4096 * 2}. Overlap is exact (row by row),
// so two tiles side by side in one matrix do not count as overlapping though their bounding
// ranges do; the hazard checker depends on that.
//
//   Region a = Region::contiguous(0, 4096);
//   Region t{base, 128, 128, 8192};
//   a.overlaps(t);
#pragma once

#include <algorithm>
#include <cstdint>

namespace cubesim::hw {

struct Region {
  std::uint64_t addr = 0;
  std::uint64_t rows = 1;
  std::uint64_t row_bytes = 0;
  std::uint64_t pitch = 0;  // start of row r is addr + r * pitch; ignored when rows == 1

  static Region contiguous(std::uint64_t addr, std::uint64_t bytes) { return Region{addr, 1, bytes, bytes}; }

  std::uint64_t bytes() const { return rows * row_bytes; }
  bool empty() const { return rows == 0 || row_bytes == 0; }
  std::uint64_t row_addr(std::uint64_t r) const { return addr + r * pitch; }
  // One past the last byte.
  std::uint64_t end() const { return empty() ? addr : row_addr(rows - 1) + row_bytes; }
  bool contiguous_bytes() const { return rows == 1 || pitch == row_bytes; }

  bool overlaps(const Region& o) const {
    if (empty() || o.empty() || end() <= o.addr || o.end() <= addr) return false;
    // Walk the region with fewer rows; find the other's candidate row in O(1).
    const Region& few = rows <= o.rows ? *this : o;
    const Region& many = rows <= o.rows ? o : *this;
    for (std::uint64_t r = 0; r < few.rows; ++r) {
      const std::uint64_t a = few.row_addr(r), l = few.row_bytes;
      if (many.rows == 1) {
        if (many.addr < a + l && a < many.addr + many.row_bytes) return true;
        continue;
      }
      // First row j of `many` that ends after a: addr + j*pitch + row_bytes > a.
      std::uint64_t j = 0;
      if (a >= many.addr + many.row_bytes) j = (a - many.addr - many.row_bytes) / many.pitch + 1;
      if (j < many.rows && many.row_addr(j) < a + l) return true;
    }
    return false;
  }
  friend bool operator==(const Region&, const Region&) = default;
};

}  // namespace cubesim::hw
