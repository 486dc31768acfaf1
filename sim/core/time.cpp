#include "sim/core/time.h"

#include <fmt/format.h>

namespace cubesim::sim {
namespace detail {
void throw_time_error(const char* what, double value) {
  throw TimeError(fmt::format("cubesim: invalid {} value {}: times and durations must be finite and "
                              "non-negative, and bandwidths positive",
                              what, value));
}
void throw_overflow(const char* what, std::uint64_t a, std::uint64_t b) {
  throw TimeError(fmt::format("cubesim: {} overflows simulated time ({} and {} ps; the limit is "
                              "2^64-1 ps, about 213 days)",
                              what, a, b));
}
}  // namespace detail

std::string format_time(Time t) {
  if (t < kPsPerNs) return fmt::format("{} ps", t);
  if (t < kPsPerUs) return fmt::format("{:.3f} ns", static_cast<double>(t) / kPsPerNs);
  if (t < kPsPerMs) return fmt::format("{:.3f} us", static_cast<double>(t) / kPsPerUs);
  if (t < kPsPerS) return fmt::format("{:.3f} ms", static_cast<double>(t) / kPsPerMs);
  return fmt::format("{:.6f} s", static_cast<double>(t) / kPsPerS);
}
}  // namespace cubesim::sim
