// time.h — simulated time: an integer count of picoseconds.
//
// Time is a point, Duration a length; both are uint64_t picoseconds (2^64 ps is about 213 days).
// No floating point is used to schedule anything. Conversions from user figures (ns, us, ms as
// doubles, bandwidth in GB/s) happen once, at the edge, and reject negative, NaN and overflowing
// values instead of wrapping.
//
//   using namespace cubesim::sim;
//   Duration d = ns(8) + from_ns(0.5);                 // 8500 ps
//   Duration t = transfer_time(1 << 20, Bandwidth::GBps(128));   // ceil(bytes / bandwidth)
//   Time end  = add(now, t);                           // throws on overflow
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace cubesim::sim {

using Time = std::uint64_t;      // picoseconds since the start of the run
using Duration = std::uint64_t;  // picoseconds

inline constexpr Time kTimeMax = std::numeric_limits<Time>::max();
inline constexpr std::uint64_t kPsPerNs = 1000;
inline constexpr std::uint64_t kPsPerUs = 1000 * kPsPerNs;
inline constexpr std::uint64_t kPsPerMs = 1000 * kPsPerUs;
inline constexpr std::uint64_t kPsPerS = 1000 * kPsPerMs;

// Thrown for a time computation that would be negative or overflow: a user error (a figure in a
// topology file, a sleep length), never silently wrapped.
class TimeError : public std::range_error {
 public:
  using std::range_error::range_error;
};

namespace detail {
[[noreturn]] void throw_time_error(const char* what, double value);
[[noreturn]] void throw_overflow(const char* what, std::uint64_t a, std::uint64_t b);

template <class T>
constexpr Duration scale_int(T v, std::uint64_t unit, const char* what) {
  if constexpr (std::signed_integral<T>) {
    if (v < 0) throw_time_error(what, static_cast<double>(v));
  }
  const auto u = static_cast<std::uint64_t>(v);
  if (u != 0 && unit > kTimeMax / u) throw_overflow(what, u, unit);
  return u * unit;
}

inline Duration scale_double(double v, std::uint64_t unit, const char* what) {
  if (!(v >= 0.0)) throw_time_error(what, v);  // also catches NaN
  const double ps = std::round(v * static_cast<double>(unit));
  if (ps >= 18446744073709551615.0) throw_time_error(what, v);
  return static_cast<Duration>(ps);
}
}  // namespace detail

// Integer helpers: exact.
template <std::integral T> constexpr Duration ps(T v) { return detail::scale_int(v, 1, "ps"); }
template <std::integral T> constexpr Duration ns(T v) { return detail::scale_int(v, kPsPerNs, "ns"); }
template <std::integral T> constexpr Duration us(T v) { return detail::scale_int(v, kPsPerUs, "us"); }
template <std::integral T> constexpr Duration ms(T v) { return detail::scale_int(v, kPsPerMs, "ms"); }

// Figures from files: rounded to the nearest picosecond.
inline Duration from_ns(double v) { return detail::scale_double(v, kPsPerNs, "ns"); }
inline Duration from_us(double v) { return detail::scale_double(v, kPsPerUs, "us"); }
inline Duration from_ms(double v) { return detail::scale_double(v, kPsPerMs, "ms"); }
inline Duration from_s(double v) { return detail::scale_double(v, kPsPerS, "s"); }

// Checked arithmetic: overflow is an error.
constexpr Time add(Time t, Duration d) {
  if (d > kTimeMax - t) detail::throw_overflow("time + duration", t, d);
  return t + d;
}
constexpr Duration sub(Time later, Time earlier) {
  if (later < earlier) detail::throw_time_error("negative duration (later - earlier)",
                                                -static_cast<double>(earlier - later));
  return later - earlier;
}
constexpr Duration mul(Duration d, std::uint64_t n) {
  if (n != 0 && d > kTimeMax / n) detail::throw_overflow("duration * n", d, n);
  return d * n;
}

inline double to_ns(Duration d) { return static_cast<double>(d) / kPsPerNs; }
inline double to_us(Duration d) { return static_cast<double>(d) / kPsPerUs; }
inline double to_s(Duration d) { return static_cast<double>(d) / kPsPerS; }

// Bandwidth as an integer number of bytes per second, so transfer times are exact.
struct Bandwidth {
  std::uint64_t bytes_per_s = 0;

  static Bandwidth GBps(double gbps) {  // 1 GB/s = 1e9 bytes/s (decimal, as datasheets use)
    if (!(gbps > 0.0) || gbps > 1e9) detail::throw_time_error("bandwidth GB/s (must be > 0)", gbps);
    return Bandwidth{static_cast<std::uint64_t>(std::llround(gbps * 1e9))};
  }
  double gbps() const { return static_cast<double>(bytes_per_s) / 1e9; }
  Bandwidth scaled(double factor) const {
    if (!(factor > 0.0)) detail::throw_time_error("bandwidth scale factor (must be > 0)", factor);
    return Bandwidth{static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes_per_s) * factor))};
  }
  friend bool operator==(Bandwidth, Bandwidth) = default;
};

// Time to push `bytes` through `bw`: ceil(bytes * 1e12 / bytes_per_s) picoseconds, exact.
inline Duration transfer_time(std::uint64_t bytes, Bandwidth bw) {
  if (bw.bytes_per_s == 0) detail::throw_time_error("transfer at zero bandwidth", 0.0);
  // Up to ~18 MB the product fits 64 bits: one hardware division, not a 128-bit library call (the
  // same quotient). Chunks and most messages take this path.
  if (bytes <= UINT64_MAX / kPsPerS) {
    const std::uint64_t n = bytes * kPsPerS;
    return n / bw.bytes_per_s + (n % bw.bytes_per_s != 0);
  }
  const unsigned __int128 num = static_cast<unsigned __int128>(bytes) * kPsPerS;
  const unsigned __int128 q = (num + bw.bytes_per_s - 1) / bw.bytes_per_s;
  if (q > kTimeMax) detail::throw_overflow("transfer_time", bytes, bw.bytes_per_s);
  return static_cast<Duration>(q);
}

// "1.250 us", "12 ns", "3.000 ms": for messages and reports.
std::string format_time(Time t);

}  // namespace cubesim::sim
