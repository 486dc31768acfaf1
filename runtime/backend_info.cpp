#include "runtime/backend_info.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"

namespace cubesim::rt {

OptionReader::OptionReader(std::string_view backend, const nlohmann::json& options)
    : backend_(backend), options_(options) {
  if (!options_.is_object()) {
    throw RuntimeError(fmt::format("backend '{}': options must be given by name (a JSON object), got {}", backend_,
                                   options_.dump()));
  }
}

bool OptionReader::flag(std::string_view key, bool dflt) {
  known_.emplace_back(key);
  auto it = options_.find(key);
  if (it == options_.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) {
    throw RuntimeError(fmt::format("backend '{}': option '{}' is {}; give true or false", backend_, key, it->dump()));
  }
  return it->get<bool>();
}

std::string OptionReader::choice(std::string_view key, std::string_view dflt,
                                 std::initializer_list<std::string_view> choices) {
  known_.emplace_back(key);
  auto it = options_.find(key);
  if (it == options_.end() || it->is_null()) return std::string(dflt);
  if (it->is_string()) {
    const std::string v = it->get<std::string>();
    if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  }
  const std::string shown = it->is_string() ? "'" + it->get<std::string>() + "'" : it->dump();
  throw RuntimeError(fmt::format("backend '{}': {}: {} is not valid; use one of {}", backend_, key, shown,
                                 fmt::join(choices, ", ")));
}

std::vector<int> OptionReader::int_list(std::string_view key) {
  known_.emplace_back(key);
  auto it = options_.find(key);
  if (it == options_.end() || it->is_null()) return {};
  std::vector<int> out;
  bool ok = it->is_array();
  if (ok) {
    for (const auto& v : *it) {
      if (!v.is_number_integer() || v.get<std::int64_t>() < INT32_MIN || v.get<std::int64_t>() > INT32_MAX) {
        ok = false;
        break;
      }
      out.push_back(static_cast<int>(v.get<std::int64_t>()));
    }
  }
  if (!ok) {
    throw RuntimeError(fmt::format("backend '{}': option '{}' is {}; give a list of integers, e.g. [0, 1, 2, 3]", backend_,
                                   key, it->dump()));
  }
  return out;
}

void OptionReader::finish() const {
  for (auto it = options_.begin(); it != options_.end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    throw RuntimeError(fmt::format("backend '{}' has no option '{}'; its options: {}", backend_, it.key(),
                                   known_.empty() ? std::string("none") : fmt::format("{}", fmt::join(known_, ", "))));
  }
}

void reject_topology(std::string_view backend, const BackendArgs& args) {
  if (args.topology) {
    throw RuntimeError(fmt::format("backend '{}' simulates no system and takes no topology (got '{}'); a topology is "
                                   "for backend 'sim'",
                                   backend, args.topology->name));
  }
}

}  // namespace cubesim::rt
