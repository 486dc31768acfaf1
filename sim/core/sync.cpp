// Event, Resource, Barrier and wait_all/wait_any: the blocking primitives over waiter.h.
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "sim/core/barrier.h"
#include "sim/core/event.h"
#include "sim/core/resource.h"
#include "sim/core/wait.h"

namespace cubesim::sim {

namespace {
// The running process, or NotInProcessError naming the call.
Process& caller(const char* what) { return Simulator::running_process(what); }
}  // namespace

// ---- Event ----
void Event::wait() {
  Process& p = caller("Event::wait()");
  if (triggered_) return;
  wait_on(p.simulator(), p, waiters_);
}

void Event::reset() {
  if (!waiters_.empty()) {
    throw std::logic_error(fmt::format("cubesim: Event '{}' reset while {} process(es) wait on it", name_, waiters_.count));
  }
  triggered_ = false;
}

void Event::trigger() {
  if (triggered_) return;
  triggered_ = true;
  while (Waiter* w = waiters_.pop_front()) w->group->signal(w->index);
}

std::size_t wait_any_impl(Event* const* events, std::size_t n, bool all) {
  Process& p = caller(all ? "wait_all()" : "wait_any()");
  if (n == 0) {
    if (all) return 0;
    throw std::invalid_argument("cubesim: wait_any() needs at least one event");
  }
  int pending = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!events[i]->triggered()) {
      ++pending;
    } else if (!all) {
      return i;
    }
  }
  if (pending == 0) return 0;
  std::vector<Waiter> waiters(n);  // linked in place: never resized after this
  WaitGroup g{&p, all ? pending : 1, all ? "all" : "any", waiters.data(), n};
  for (std::size_t i = 0; i < n; ++i) {
    if (events[i]->triggered()) continue;
    waiters[i].group = &g;
    waiters[i].index = static_cast<int>(i);
    events[i]->waiters_.push_back(&waiters[i]);
  }
  p.simulator().block(p, &g);
  return static_cast<std::size_t>(g.fired);  // ~Waiter unlinks the rest
}

// ---- Resource ----
Resource::Resource(std::uint64_t capacity, std::string name)
    : name_(std::move(name)), capacity_(capacity), available_(capacity), waiters_("Resource", &name_) {
  if (capacity == 0) throw std::invalid_argument(fmt::format("cubesim: Resource '{}' needs a capacity of at least 1", name_));
  waiters_.owner = this;
  waiters_.detail = [](const void* o) {
    auto* r = static_cast<const Resource*>(o);
    return fmt::format("{} of {} free, {} queued", r->available_, r->capacity_, r->waiters_.count);
  };
}

void Resource::acquire(std::uint64_t n) {
  Process& p = caller("Resource::acquire()");
  if (n == 0 || n > capacity_) {
    throw std::invalid_argument(fmt::format("cubesim: Resource '{}': acquire({}) can never be granted; "
                                            "ask for 1 to {} units",
                                            name_, n, capacity_));
  }
  if (waiters_.empty() && available_ >= n) {
    available_ -= n;
    return;
  }
  wait_on(p.simulator(), p, waiters_, n);
}

bool Resource::try_acquire(std::uint64_t n) {
  if (n == 0 || n > capacity_ || !waiters_.empty() || available_ < n) return false;
  available_ -= n;
  return true;
}

void Resource::release(std::uint64_t n) {
  if (n > capacity_ - available_) {
    throw std::logic_error(fmt::format("cubesim: Resource '{}': release({}) but only {} of {} units are held",
                                       name_, n, capacity_ - available_, capacity_));
  }
  available_ += n;
  grant();
}

void Resource::grant() {
  while (waiters_.head && waiters_.head->amount <= available_) {
    Waiter* w = waiters_.pop_front();
    available_ -= w->amount;
    w->group->signal(0);
  }
}

// ---- Barrier ----
Barrier::Barrier(std::size_t n, std::string name) : name_(std::move(name)), n_(n), waiters_("Barrier", &name_) {
  if (n == 0) throw std::invalid_argument(fmt::format("cubesim: Barrier '{}' needs at least 1 party", name_));
  waiters_.owner = this;
  waiters_.detail = [](const void* o) {
    auto* b = static_cast<const Barrier*>(o);
    return fmt::format("{} of {} arrived", b->arrived_, b->n_);
  };
}

void Barrier::arrive_and_wait() {
  Process& p = caller("Barrier::arrive_and_wait()");
  if (++arrived_ == n_) {
    arrived_ = 0;
    ++generation_;
    while (Waiter* w = waiters_.pop_front()) w->group->signal(0);
    return;
  }
  wait_on(p.simulator(), p, waiters_);
}

}  // namespace cubesim::sim
