// format.h — sizes and rates as people read them, for error messages and bench tables.
//
//   format_bytes(3 << 20)          -> "3.00 MiB"
//   format_bytes(100)              -> "100 B"
//   format_bandwidth(128e9)        -> "128.0 GB/s"
//   format_region(Region{0x100, 2, 64, 4096}) -> "[0x100: 2 rows of 64 B, pitch 4096]"
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "sim/hw/region.h"

namespace cubesim::hw {

inline std::string format_bytes(std::uint64_t b) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (b < 1024) return fmt::format("{} B", b);
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

inline std::string format_bandwidth(double bytes_per_s) { return fmt::format("{:.1f} GB/s", bytes_per_s / 1e9); }

inline std::string format_region(const Region& r) {
  if (r.rows == 1) return fmt::format("[{:#x}, {:#x})", r.addr, r.addr + r.row_bytes);
  return fmt::format("[{:#x}: {} rows of {} B, pitch {}]", r.addr, r.rows, r.row_bytes, r.pitch);
}

}  // namespace cubesim::hw
