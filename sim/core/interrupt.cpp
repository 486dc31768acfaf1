// The interrupt flag and the SIGINT scope (interrupt.h).
#include "sim/core/interrupt.h"

#include <atomic>
#include <csignal>
#include <mutex>

#include <fmt/format.h>

namespace cubesim::sim {

namespace {

std::atomic<bool> g_interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");

std::mutex g_scope_mutex;
int g_scopes = 0;                 // live SigintScopes
bool g_installed = false;         // whether the first scope installed the handler
struct sigaction g_previous {};   // the handler it replaced

void on_sigint(int sig) {
  g_interrupt.store(true, std::memory_order_relaxed);
  // Pass the signal on (Python's handler only marks it for its interpreter).
  if ((g_previous.sa_flags & SA_SIGINFO) == 0 && g_previous.sa_handler != SIG_DFL &&
      g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
  }
}

}  // namespace

InterruptedError::InterruptedError(Time at, std::uint64_t events)
    : SimError(fmt::format("interrupted (SIGINT) at simulated time {} after {} events", format_time(at), events)),
      time_(at),
      events_(events) {}

void request_interrupt() noexcept { g_interrupt.store(true, std::memory_order_relaxed); }
bool interrupt_requested() noexcept { return g_interrupt.load(std::memory_order_relaxed); }
void clear_interrupt() noexcept { g_interrupt.store(false, std::memory_order_relaxed); }

SigintScope::SigintScope() {
  std::lock_guard<std::mutex> lock(g_scope_mutex);
  if (g_scopes++ > 0) return;
  struct sigaction cur {};
  if (sigaction(SIGINT, nullptr, &cur) != 0 || cur.sa_handler == SIG_IGN) return;
  struct sigaction act {};
  act.sa_handler = on_sigint;
  sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;
  g_previous = cur;
  g_installed = sigaction(SIGINT, &act, nullptr) == 0;
}

SigintScope::~SigintScope() {
  std::lock_guard<std::mutex> lock(g_scope_mutex);
  if (--g_scopes > 0) return;
  if (g_installed) sigaction(SIGINT, &g_previous, nullptr);
  g_installed = false;
}

}  // namespace cubesim::sim
