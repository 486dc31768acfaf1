// waiter.h — the intrusive wait lists that every blocking primitive is built on (internal).
//
// A blocked process puts one Waiter per handle it waits on into that handle's WaiterList. Waiters
// live on the waiting process's own stack, so blocking allocates nothing. A WaitGroup collects the
// signals and wakes the process once enough have arrived (1 for a plain wait or wait_any, n for
// wait_all). A Waiter unlinks itself when destroyed (a process unwound while waiting), and a list
// detaches its waiters when it is destroyed first.
#pragma once

#include <cstdint>
#include <string>

#include "sim/core/simulator.h"

namespace cubesim::sim {

struct WaiterList;

struct Waiter {
  Waiter* prev = nullptr;
  Waiter* next = nullptr;
  WaiterList* list = nullptr;
  WaitGroup* group = nullptr;
  int index = 0;              // position among the handles of a wait_any/wait_all
  std::uint64_t amount = 0;   // units asked for (Resource)

  Waiter() = default;
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  inline ~Waiter();
};

struct WaiterList {
  const char* kind;          // "Event", "Resource", "Barrier", ...
  const std::string* name;   // the owning object's name, for reports
  Waiter* head = nullptr;
  Waiter* tail = nullptr;
  std::size_t count = 0;
  // Optional: a line of state for deadlock reports ("3 of 4 arrived").
  std::string (*detail)(const void* owner) = nullptr;
  const void* owner = nullptr;

  WaiterList(const char* k, const std::string* n) : kind(k), name(n) {}
  WaiterList(const WaiterList&) = delete;
  WaiterList& operator=(const WaiterList&) = delete;
  ~WaiterList() {
    for (Waiter* w = head; w;) {
      Waiter* next = w->next;
      w->list = nullptr;
      w->prev = w->next = nullptr;
      w = next;
    }
  }

  bool empty() const { return head == nullptr; }
  void push_back(Waiter* w) {
    w->list = this;
    w->prev = tail;
    w->next = nullptr;
    if (tail) tail->next = w; else head = w;
    tail = w;
    ++count;
  }
  void remove(Waiter* w) {
    if (w->prev) w->prev->next = w->next; else head = w->next;
    if (w->next) w->next->prev = w->prev; else tail = w->prev;
    w->prev = w->next = nullptr;
    w->list = nullptr;
    --count;
  }
  Waiter* pop_front() {
    Waiter* w = head;
    if (w) remove(w);
    return w;
  }
};

inline Waiter::~Waiter() {
  if (list) list->remove(this);
}

struct WaitGroup {
  Process* proc;
  int remaining;             // signals still needed
  const char* mode;          // nullptr (single handle), "any" or "all": for reports
  const Waiter* waiters = nullptr;  // the group's waiters (for reports)
  std::size_t count = 0;
  int fired = -1;            // first handle that signalled
  bool woken = false;

  void signal(int index) {
    if (woken) return;
    if (fired < 0) fired = index;
    if (--remaining <= 0) {
      woken = true;
      proc->simulator().wake(*proc);
    }
  }
};

// Blocks the current process on one list until signalled. Throws NotInProcessError outside a process.
inline void wait_on(Simulator& sim, Process& p, WaiterList& list, std::uint64_t amount = 0) {
  Waiter w;
  w.amount = amount;
  WaitGroup g{&p, 1, nullptr, &w, 1};
  w.group = &g;
  list.push_back(&w);
  sim.block(p, &g);
}

// "Event 'x'", "Resource 'hbm' (4 units)", "Barrier 'step' (3 of 4 arrived)".
std::string describe(const WaiterList& list, std::uint64_t amount);

}  // namespace cubesim::sim
