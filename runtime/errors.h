// errors.h — the runtime's user-facing errors. Each message names the input (tensor shape, rank,
// collective, group) and what would be valid.
//
//   RuntimeError      wrong shape, dtype or device; bad group; unsupported algorithm
//   CollectiveError   ranks called mismatched collectives, or some never arrived
//   RankError         spawn(): one or more ranks failed; names each rank and its cause
//   BackendUnavailableError  a backend this build or machine cannot run (says why)
//   InterruptedError  spawn(): stopped by SIGINT (Ctrl-C); says how far it ran (Python: KeyboardInterrupt)
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace cubesim::rt {

class RuntimeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A backend that cannot run here (cuda without a GPU, or a build without CUDA).
class BackendUnavailableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// spawn() stopped by SIGINT (sim/core/interrupt.h): the message says the simulated time and the
// events it reached; the context can run again.
class InterruptedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RankFailure {
  int rank = -1;
  std::string message;
  std::exception_ptr error;
};

class RankError : public std::runtime_error {
 public:
  RankError(std::string what, std::vector<RankFailure> failures)
      : std::runtime_error(std::move(what)), failures_(std::move(failures)) {}
  const std::vector<RankFailure>& failures() const { return failures_; }

 private:
  std::vector<RankFailure> failures_;
};

}  // namespace cubesim::rt
