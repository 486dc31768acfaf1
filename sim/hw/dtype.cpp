#include "sim/hw/dtype.h"

#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::hw {

Dtype parse_dtype(std::string_view s, std::string_view where) {
  for (Dtype d : kAllDtypes) {
    if (dtype_name(d) == s) return d;
  }
  throw std::invalid_argument(fmt::format("{}: unknown dtype '{}'; valid dtypes: f32, bf16, f16", where, s));
}

}  // namespace cubesim::hw
