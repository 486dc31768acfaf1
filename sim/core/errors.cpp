#include "sim/core/errors.h"

#include <fmt/format.h>

namespace cubesim::sim {

namespace {
std::string failure_message(const std::vector<ProcessFailure>& f) {
  if (f.size() == 1) {
    return fmt::format("cubesim: process '{}' failed at {}: {}", f[0].process, format_time(f[0].time), f[0].message);
  }
  std::string s = fmt::format("cubesim: {} processes failed at {}:", f.size(), format_time(f.front().time));
  for (const ProcessFailure& x : f) s += fmt::format("\n  '{}': {}", x.process, x.message);
  return s;
}

std::string deadlock_message(Time now, const std::vector<BlockedProcess>& b) {
  std::string s = fmt::format(
      "cubesim: deadlock at {}: no event is pending but {} process{} still wait{} (something they wait for "
      "is never triggered, released or reached):",
      format_time(now), b.size(), b.size() == 1 ? "" : "es", b.size() == 1 ? "s" : "");
  for (const BlockedProcess& p : b) {
    s += fmt::format("\n  '{}' waits on {} since {}", p.process, p.waits_on, format_time(p.since));
  }
  return s;
}
}  // namespace

ProcessError::ProcessError(std::vector<ProcessFailure> failures)
    : SimError(failure_message(failures)), failures_(std::move(failures)) {}

DeadlockError::DeadlockError(Time now, std::vector<BlockedProcess> blocked)
    : SimError(deadlock_message(now, blocked)), time_(now), blocked_(std::move(blocked)) {}

}  // namespace cubesim::sim
