// interrupt.h — stopping a running simulation from outside it (Ctrl-C).
//
// A process-wide flag that a signal handler may set (an atomic store: async-signal-safe). Every
// Simulator's run loop reads it between events (every kInterruptPoll events) and, once set, stops:
// it unwinds its processes, drops its pending events and throws InterruptedError naming the
// simulated time reached and the events run. The simulator is then idle and can run again.
//
// SigintScope installs a SIGINT handler that sets the flag (and calls the handler it replaced, so
// an embedding interpreter such as Python also sees the signal) for its lifetime, and restores the
// previous one after; scopes nest and may be entered from several threads (the first installs, the
// last restores). A SIGINT that is ignored (SIG_IGN) stays ignored.
//
//   sim::SigintScope scope;         // around a run
//   try { sim.run(); } catch (const sim::InterruptedError& e) { ... }
#pragma once

#include <cstdint>
#include <string>

#include "sim/core/errors.h"
#include "sim/core/time.h"

namespace cubesim::sim {

inline constexpr std::uint32_t kInterruptPoll = 1024;  // events between two reads of the flag

class InterruptedError : public SimError {
 public:
  InterruptedError(Time at, std::uint64_t events);
  Time time() const { return time_; }
  std::uint64_t events() const { return events_; }

 private:
  Time time_;
  std::uint64_t events_;
};

void request_interrupt() noexcept;  // async-signal-safe
bool interrupt_requested() noexcept;
void clear_interrupt() noexcept;

class SigintScope {
 public:
  SigintScope();
  ~SigintScope();
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;
};

}  // namespace cubesim::sim
