// errors.h — how a simulation run fails: never by hanging.
//
// ProcessError: a process threw. run() stops at the end of that simulated instant (so processes
//   failing at the same time are all reported), unwinds every other process, and throws one
//   ProcessError naming each failed process, the time and the cause. The original exceptions stay
//   available through failures() for callers that map them (the runtime names ranks).
// DeadlockError: the event queue drained while processes still wait; the message lists each blocked
//   process, what it waits on and since when.
// NotInProcessError: a blocking call (sleep, wait, acquire) made outside a simulated process.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/core/time.h"

namespace cubesim::sim {

class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ProcessFailure {
  std::string process;  // the process name given to spawn()
  std::uint64_t process_id = 0;
  Time time = 0;        // simulated time of the throw
  std::string message;  // what() of the exception, or a note for non-std exceptions
  std::exception_ptr error;
  void* user = nullptr;  // the process's Process::user(): the layer above finds its own record there
};

class ProcessError : public SimError {
 public:
  explicit ProcessError(std::vector<ProcessFailure> failures);
  const std::vector<ProcessFailure>& failures() const { return failures_; }

 private:
  std::vector<ProcessFailure> failures_;
};

struct BlockedProcess {
  std::string process;
  std::uint64_t process_id = 0;
  std::string waits_on;  // "Event 'ar0.arrive'", "Resource 'hbm' (2 units)", ...
  Time since = 0;
  void* user = nullptr;  // the process's Process::user()
};

class DeadlockError : public SimError {
 public:
  DeadlockError(Time now, std::vector<BlockedProcess> blocked);
  const std::vector<BlockedProcess>& blocked() const { return blocked_; }
  Time time() const { return time_; }

 private:
  Time time_;
  std::vector<BlockedProcess> blocked_;
};

class NotInProcessError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace cubesim::sim
