// event.h — a one-shot event: processes wait until it is triggered, then resume in FIFO order.
//
//   Event done("dma.done");
//   sim.spawn("dma", [&] { this_process::sleep(ns(40)); done.trigger(); });
//   sim.spawn("pe",  [&] { done.wait(); /* now() == 40 ns */ });
//
// trigger() may be called from a process or a callback; triggering twice is a no-op. Waiting on a
// triggered event returns at once. For several events see wait.h (wait_all / wait_any).
#pragma once

#include <string>

#include "sim/core/waiter.h"

namespace cubesim::sim {

class Event {
 public:
  explicit Event(std::string name = "event") : name_(std::move(name)), waiters_("Event", &name_) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void wait();
  void trigger();
  bool triggered() const { return triggered_; }
  const std::string& name() const { return name_; }
  std::size_t waiting() const { return waiters_.count; }
  // Makes a triggered event waitable again (pooled events: a message's). Nobody may be waiting.
  void reset();
  // A line of state a deadlock report adds after the name ("from rank 3 to rank 4, ..."), made
  // only when a report needs it.
  void set_detail(std::string (*detail)(const void* owner), const void* owner) {
    waiters_.detail = detail;
    waiters_.owner = owner;
  }

 private:
  friend std::size_t wait_any_impl(Event* const*, std::size_t, bool);
  std::string name_;
  WaiterList waiters_;
  bool triggered_ = false;
};

}  // namespace cubesim::sim
