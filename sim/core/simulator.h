// simulator.h — the discrete-event scheduler: an event queue plus processes that are fibers.
//
// A process is a function running on its own fiber (Boost.Context, fcontext) with a pooled stack.
// It blocks by yielding to the scheduler (this_process::sleep, Event::wait, Resource::acquire,
// Barrier::arrive_and_wait, wait_all/wait_any); nothing blocks the OS thread. Plain callbacks can be
// scheduled too. Everything runs on the thread that calls run(), in the queue's total order
// (time, priority, insertion sequence), so a run is deterministic.
//
//   Simulator sim;
//   Event ready("ready");
//   sim.spawn("producer", [&] { this_process::sleep(ns(10)); ready.trigger(); });
//   sim.spawn("consumer", [&] { ready.wait(); fmt::print("{}\n", format_time(sim.now())); });
//   sim.run();   // throws ProcessError or DeadlockError instead of hanging
//
// The process record and the callable live at the top of the fiber's stack, so an idle process
// costs its stack and nothing on the heap (bench_sim_core measures it).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <type_traits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/core/errors.h"
#include "sim/core/event_queue.h"
#include "sim/core/time.h"
#include "sim/core/trace.h"

namespace cubesim::sim {

class Simulator;
struct WaitGroup;
namespace this_process {
void sleep(Duration d);
}

struct SimulatorOptions {
  std::size_t stack_size = 256 * 1024;  // bytes per process stack
  // A guard page below each stack, so an overflow faults at once instead of corrupting memory.
  // On by default in builds configured with CUBESIM_PROTECTED_STACKS.
#ifdef CUBESIM_PROTECTED_STACKS_DEFAULT
  bool protected_stacks = true;
#else
  bool protected_stacks = false;
#endif
  bool trace = false;  // record trace spans (Trace::enabled)
};

namespace detail {
class StackPool;
struct ProcessUnwind {};  // thrown inside a blocked process to unwind it when the run is torn down
}  // namespace detail

// A simulated process. Owned by the Simulator; valid while it runs.
class Process {
 public:
  const std::string& name() const { return name_; }
  std::uint64_t id() const { return id_; }
  Simulator& simulator() const { return *sim_; }
  // One pointer for the layer above (the runtime keeps the calling rank here).
  void* user() const { return user_; }
  void set_user(void* u) { user_ = u; }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

 protected:
  Process(Simulator* sim, std::string name) : sim_(sim), name_(std::move(name)) {}
  virtual ~Process() = default;
  virtual void body() = 0;

 private:
  friend class Simulator;
  friend struct FiberEntry;
  friend void this_process::sleep(Duration d);
  enum class State : std::uint8_t { kCreated, kReady, kRunning, kBlocked };

  Simulator* sim_;
  void* ctx_ = nullptr;          // saved fcontext while not running
  void* stack_sp_ = nullptr;     // top of the stack (for recycling)
  std::size_t stack_size_ = 0;
  std::uint64_t id_ = 0;
  Process* live_prev_ = nullptr;  // intrusive list of live processes
  Process* live_next_ = nullptr;
  // What it waits on (for deadlock reports): a wait group, or a sleep when null.
  const WaitGroup* wait_group_ = nullptr;
  Time blocked_since_ = 0;
  void* user_ = nullptr;
  State state_ = State::kCreated;
  bool cancel_ = false;
#ifdef CUBESIM_ASAN
  void* asan_fake_stack_ = nullptr;
#endif
  std::string name_;
};

class Simulator {
 public:
  explicit Simulator(SimulatorOptions opts = {});
  ~Simulator();
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  Time now() const { return queue_.now(); }

  // Starts a process at the current time (after processes and events already due now).
  // `user` becomes the process's Process::user() (failure and deadlock reports carry it).
  template <class F>
  std::uint64_t spawn(std::string name, F&& fn, void* user = nullptr);

  // Schedules a callback. Callbacks must not block; they may trigger events and spawn processes.
  template <class F>
  void at(Time t, F&& cb, int priority = EventQueue::kDefaultPriority) {
    queue_.push(t, priority, std::forward<F>(cb));
  }
  template <class F>
  void after(Duration d, F&& cb, int priority = EventQueue::kDefaultPriority) {
    queue_.push(add(now(), d), priority, std::forward<F>(cb));
  }

  // A callback says it did nothing (a wake-up superseded since it was scheduled). If the events a
  // run() ends with all did nothing, now() afterwards is the time of the last one that did: such a
  // wake-up, scheduled far ahead, does not move the end of the run.
  void note_noop_event() { queue_.note_noop(); }

  // Runs until the queue drains. Throws ProcessError (a process threw) or DeadlockError (the queue
  // drained with processes still blocked); in both cases every remaining process is unwound first.
  void run();
  // Runs the events due at or before t and stops (now() is the last event's time). Blocked
  // processes stay blocked and a later run() or run_until() continues from there.
  void run_until(Time t);

  // The process running now, or nullptr when called from a callback or outside run().
  Process* current() const { return current_; }
  // Like current(), but a blocking primitive named `what` was called outside a process: throws
  // NotInProcessError with a message naming it.
  Process& require_process(const char* what) const;

  // The simulator whose run() is executing on this thread (nullptr outside run()).
  static Simulator* active() { return t_active_; }
  static void set_active(Simulator* s) { t_active_ = s; }
  // The process running now on this thread's active simulator; NotInProcessError naming `what`
  // when there is none.
  static Process& running_process(const char* what) {
    Simulator* s = t_active_;
    if (s != nullptr && s->current_ != nullptr) [[likely]] return *s->current_;
    throw_not_in_process(what);
  }

  // For primitives: block the current process until wake(). `group` says what it waits on (for
  // deadlock reports); nullptr means a timed sleep, which is woken by its own event.
  void block(Process& p, const WaitGroup* group);
  // Make a blocked process runnable at the current time (FIFO among wake-ups at the same time).
  void wake(Process& p);
  // Blocks the current process for d (one event, resumed directly).
  void sleep(Process& p, Duration d);

  // Runs f() to completion on the scheduler's stack when called from a process, and returns its
  // result (an exception f throws is rethrown here, on the process's stack). f must not block.
  // Why: a process's stack is touched only while it runs, so in a simulation of thousands of
  // processes that run in turn (the ranks of a collective) the stack lines a deep call uses are
  // cold every time it runs. The scheduler's stack, just below where its loop waits, is where
  // every callback runs: its lines stay in the cache. Work that does not block (starting a
  // transfer, pricing an op) done there touches no cold stack; only the frames a process keeps
  // while blocked stay on its own stack. From a callback, outside run(), nested, in an
  // AddressSanitizer build, under CET shadow stacks or off x86-64 ELF f runs where it is called. A
  // process that blocks inside f is an internal error (abort), not undefined behaviour. A simulator
  // run inside another's process has that process's stack as its scheduler's: f then uses what is
  // left of it (SimulatorOptions::stack_size; guarded only with protected_stacks).
  template <class F>
  auto off_stack(F&& f);
  bool in_off_stack_call() const { return off_stack_ != nullptr; }

  Trace& trace() { return trace_; }
  const Trace& trace() const { return trace_; }

  std::uint64_t events_executed() const { return queue_.executed(); }
  std::uint64_t event_order_hash() const { return queue_.order_hash(); }
  std::uint64_t processes_spawned() const { return next_id_; }
  std::uint64_t processes_live() const { return live_count_; }
  std::size_t stack_size() const;
  std::size_t stacks_allocated() const;  // stacks created so far (pooled, reused)
  // Of those, the stacks mapped anew; the others came from the process-wide cache of stacks that
  // simulators destroyed earlier left behind (at most 1024 are kept, simulator.cpp's StackCache).
  std::size_t stacks_mapped() const;

 private:
  template <class F>
  class ProcessImpl final : public Process {
   public:
    ProcessImpl(Simulator* s, std::string n, F&& f) : Process(s, std::move(n)), fn_(std::forward<F>(f)) {}

   private:
    void body() override { fn_(); }
    std::decay_t<F> fn_;
  };

  // Places a process record of `bytes` at the top of a fresh stack; returns where to construct it.
  void* allocate_record(std::size_t bytes, std::size_t align, void** sp, std::size_t* size);
  void start(Process* p, void* sp, std::size_t size);
  void resume(Process* p);
  void switch_out(Process& p);
  void arrive(void* from, void* ctx);
  void run_loop(Time limit);
  // off_stack's switch: calls fn(arg) on the scheduler's stack (or in place where off_stack says).
  void call_off_stack(void (*fn)(void*), void* arg);
  // The switch path, forced inline: few returns follow a switch, and the switch itself leaves by
  // ret (simulator.cpp), so those few are predicted when processes block at the same place.
  void block_inline(Process& p, const WaitGroup* group);
  void sleep_inline(Process& p, Duration d);
  [[noreturn]] static void throw_not_in_process(const char* what);
  static thread_local Simulator* t_active_;
  void record_failure(Process& p, std::exception_ptr e);
  void unlink(Process* p);
  void unwind_all();
  [[noreturn]] void throw_deadlock();
  friend struct FiberEntry;
  friend void this_process::sleep(Duration d);

  SimulatorOptions opts_;
  EventQueue queue_;
  std::unique_ptr<detail::StackPool> stacks_;
  Trace trace_;
  void* main_ctx_ = nullptr;
  Process* current_ = nullptr;
  Process* off_stack_ = nullptr;  // the process whose off_stack call is running (null: none)
  Process* live_head_ = nullptr;
  Process* live_tail_ = nullptr;
  std::uint64_t live_count_ = 0;
  std::uint64_t next_id_ = 0;
  void* finished_sp_ = nullptr;  // stack of the process that just finished, to recycle
  std::vector<ProcessFailure> failures_;
  Time failure_time_ = 0;
  Time stop_at_ = kTimeMax;  // the run loop's limit; a failure lowers it to the failure's instant
  std::uint32_t poll_ = 0;   // events until the run loop next reads the interrupt flag
  bool stopping_ = false;
  Simulator* prev_active_ = nullptr;
#ifdef CUBESIM_ASAN
  const void* asan_main_bottom_ = nullptr;
  std::size_t asan_main_size_ = 0;
#endif
};

template <class F>
std::uint64_t Simulator::spawn(std::string name, F&& fn, void* user) {
  using Impl = ProcessImpl<F>;
  void* sp = nullptr;
  std::size_t size = 0;
  void* mem = allocate_record(sizeof(Impl), alignof(Impl), &sp, &size);
  Process* p = ::new (mem) Impl(this, std::move(name), std::forward<F>(fn));
  p->user_ = user;
  start(p, sp, size);
  return p->id();
}

template <class F>
auto Simulator::off_stack(F&& f) {
  using R = std::invoke_result_t<F&>;
  static_assert(!std::is_reference_v<R>, "Simulator::off_stack: return a pointer rather than a reference");
  struct Call {
    std::remove_reference_t<F>* f;
    std::exception_ptr error;
    std::conditional_t<std::is_void_v<R>, char, std::optional<R>> result;
    static void run(void* arg) {
      auto* c = static_cast<Call*>(arg);
      try {
        if constexpr (std::is_void_v<R>) {
          (*c->f)();
        } else {
          c->result.emplace((*c->f)());
        }
      } catch (...) {
        c->error = std::current_exception();
      }
    }
  };
  Call c{&f, nullptr, {}};
  call_off_stack(&Call::run, &c);
  if (c.error) [[unlikely]] std::rethrow_exception(c.error);
  if constexpr (!std::is_void_v<R>) return std::move(*c.result);
}

// Calls for the process that is running now.
namespace this_process {
// Blocks for d of simulated time (0 lets everything else due now run first).
void sleep(Duration d);
// Yields: runs after every other event already due at the current time.
inline void yield() { sleep(0); }
Time now();
Process& self();
}  // namespace this_process

}  // namespace cubesim::sim
