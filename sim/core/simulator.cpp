#include "sim/core/simulator.h"
#include "sim/core/interrupt.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>
#include <fmt/format.h>

#include "sim/core/waiter.h"

#ifdef CUBESIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace cubesim::sim {

namespace bctx = boost::context;
using bctx::detail::fcontext_t;
using bctx::detail::transfer_t;

thread_local Simulator* Simulator::t_active_ = nullptr;

namespace {
char kFinishedTag;  // address passed back by a fiber that has finished
}  // namespace

// Context switches. On x86-64 (System V, ELF) this is Boost.Context's jump_fcontext, with the same
// context layout (so contexts made by make_fcontext start as before) and the same callee-saved
// registers, with two differences:
//   - it leaves by `ret` into the saved return address where jump_fcontext loads it and leaves by
//     `jmp`. The difference is the CPU's return-stack predictor: with `jmp`, every switch pushed a
//     return address that was never popped, and the first `ret` after a switch mispredicted. With
//     `ret`, the call into the switch and the ret out of it pair up, and when the process arriving
//     blocked where the one leaving blocks (processes of one kind waiting at the same place: ranks
//     in a collective, the bench's ping-pong) every return after the switch is predicted. (Not for
//     CET shadow stacks, which this build does not enable.)
//   - it does not switch the floating-point control words (MXCSR, the x87 control word): a
//     simulator's processes share their thread's floating-point environment, as the code they run
//     shares the thread. Saving them (stmxcsr, fnstcw) and loading them (ldmxcsr, fldcw) was 1.4-1.6
//     ns of a 7.9 ns hand-over on the 2-core VM; loading them only when they differed was slower
//     still (9.0 ns). Nothing in cubesim changes the rounding mode, flush-to-zero or the exception
//     masks; code that does so inside a process must restore them before it blocks
//     (docs/ARCHITECTURE.md, "Processes").
#if defined(__x86_64__) && defined(__ELF__) && !defined(__CET__)
extern "C" transfer_t cubesim_switch_fcontext(fcontext_t to, void* data);
asm(R"(
        .text
        .p2align 4
        .globl cubesim_switch_fcontext
        .hidden cubesim_switch_fcontext
        .type cubesim_switch_fcontext, @function
cubesim_switch_fcontext:
        leaq    -0x38(%rsp), %rsp
        movq    %r12, 0x8(%rsp)
        movq    %r13, 0x10(%rsp)
        movq    %r14, 0x18(%rsp)
        movq    %r15, 0x20(%rsp)
        movq    %rbx, 0x28(%rsp)
        movq    %rbp, 0x30(%rsp)
        movq    %rsp, %rax
        movq    %rdi, %rsp
        movq    0x8(%rsp), %r12
        movq    0x10(%rsp), %r13
        movq    0x18(%rsp), %r14
        movq    0x20(%rsp), %r15
        movq    0x28(%rsp), %rbx
        movq    0x30(%rsp), %rbp
        leaq    0x38(%rsp), %rsp
        movq    %rsi, %rdx
        movq    %rax, %rdi
        ret
        .size cubesim_switch_fcontext, .-cubesim_switch_fcontext
)");
#define CUBESIM_SWITCH cubesim_switch_fcontext
// Simulator::off_stack's switch: calls fn(arg) with the stack pointer at `sp` (16-byte aligned) and
// comes back to the caller's stack. The frame is a plain frame-pointer frame with its unwind
// information, so debuggers and profilers walk through it; no exception crosses it (off_stack's
// thunk catches them).
extern "C" void cubesim_call_on_stack(void* arg, void (*fn)(void*), void* sp);
asm(R"(
        .text
        .p2align 4
        .globl cubesim_call_on_stack
        .hidden cubesim_call_on_stack
        .type cubesim_call_on_stack, @function
cubesim_call_on_stack:
        .cfi_startproc
        pushq   %rbp
        .cfi_def_cfa_offset 16
        .cfi_offset %rbp, -16
        movq    %rsp, %rbp
        .cfi_def_cfa_register %rbp
        movq    %rdx, %rsp
        callq   *%rsi
        movq    %rbp, %rsp
        popq    %rbp
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_endproc
        .size cubesim_call_on_stack, .-cubesim_call_on_stack
)");
#define CUBESIM_HAVE_CALL_ON_STACK 1
#else
#define CUBESIM_SWITCH bctx::detail::jump_fcontext
#endif

namespace {
__attribute__((always_inline)) inline transfer_t switch_to(void* ctx, void* data) {
  return CUBESIM_SWITCH(static_cast<fcontext_t>(ctx), data);
}

[[noreturn]] void internal_error(const char* what) {
  std::fprintf(stderr, "cubesim: internal error in the scheduler: %s\n", what);
  std::abort();
}
}  // namespace

namespace detail {
// Stacks a simulator no longer needs, kept for the next one in this process (a sweep runs thousands
// of short simulations, several at once on threads): unmapping a stack, and mprotect-ing a new
// one's guard page, make the kernel shoot down the TLB of every CPU running a thread of the
// process, which cost each of two threads running simulations side by side about a tenth of its
// time. At most kMaxStacks are kept (their pages stay committed as deep as they were used).
class StackCache {
 public:
  static constexpr std::size_t kMaxStacks = 1024;
  static StackCache& instance() {
    static StackCache* cache = [] {
      auto* c = new StackCache;  // never destroyed: stacks may be returned at exit
      // A process forked while another thread holds the lock (a sweep forks its workers while
      // simulations run on other threads) would inherit it held: fork waits for it instead.
      ::pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                       [] { instance().mu_.unlock(); });
      return c;
    }();
    return *cache;
  }
  // A cached stack of this mapping (size, guard), or nullptr.
  void* take(std::size_t mapped, bool guarded) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = entries_.size(); i-- > 0;) {
      if (entries_[i].mapped == mapped && entries_[i].guarded == guarded) {
        void* sp = entries_[i].sp;
        entries_[i] = entries_.back();
        entries_.pop_back();
        return sp;
      }
    }
    return nullptr;
  }
  // Keeps the stack if there is room; false: the caller unmaps it.
  bool give(std::size_t mapped, bool guarded, void* sp) {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= kMaxStacks) return false;
    entries_.push_back({mapped, guarded, sp});
    return true;
  }

 private:
  struct Entry {
    std::size_t mapped;
    bool guarded;
    void* sp;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
};

// Stacks are anonymous mappings (reserved, committed page by page on first touch), recycled through
// a free list, and handed to the process-wide StackCache when the simulator goes. A guarded stack
// has one PROT_NONE page below its usable range, so an overflow faults.
class StackPool {
 public:
  StackPool(std::size_t size, bool guarded) : guarded_(guarded) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    page_ = page;
    size_ = (size + page - 1) / page * page;
  }
  ~StackPool() {
    StackCache& cache = StackCache::instance();
    for (void* sp : free_) {
      if (!cache.give(mapped(), guarded_, sp)) ::munmap(static_cast<char*>(sp) - mapped(), mapped());
    }
  }
  // Returns the top of a stack of size() usable bytes.
  void* get() {
    if (!free_.empty()) {
      void* sp = free_.back();
      free_.pop_back();
      return clean(sp);
    }
    if (void* sp = StackCache::instance().take(mapped(), guarded_)) {
      ++allocated_;
      return clean(sp);
    }
    void* base = ::mmap(nullptr, mapped(), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) {
      throw std::runtime_error(fmt::format("cubesim: cannot map a {}-byte process stack ({} stacks live); "
                                           "lower SimulatorOptions::stack_size or the process count",
                                           mapped(), allocated_));
    }
    if (guarded_ && ::mprotect(base, page_, PROT_NONE) != 0) {
      ::munmap(base, mapped());
      throw std::runtime_error("cubesim: cannot protect a stack guard page (mprotect failed)");
    }
    ++allocated_;
    ++fresh_;
    return clean(static_cast<char*>(base) + mapped());
  }
  void put(void* sp) { free_.push_back(sp); }
  std::size_t size() const { return size_; }
  std::size_t allocated() const { return allocated_; }
  std::size_t fresh() const { return fresh_; }

 private:
  std::size_t mapped() const { return size_ + (guarded_ ? page_ : 0); }
  // A finished fiber leaves its frames' redzones poisoned in ASan's shadow, and unmapping does not
  // clear them either, so a stack (reused, or mapped where an old one was) starts clean.
  char* clean(void* sp) const {
#ifdef CUBESIM_ASAN
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(sp) - size_, size_);
#endif
    return static_cast<char*>(sp);
  }
  std::size_t size_;
  std::size_t page_;
  bool guarded_;
  std::vector<void*> free_;
  std::size_t allocated_ = 0;
  std::size_t fresh_ = 0;  // of those, mapped anew (not from the StackCache)
};
}  // namespace detail

// The function every fiber starts in. It never returns: it jumps back to the scheduler for good.
// Whoever starts it (the scheduler, or a process handing over directly) has made it current_.
struct FiberEntry {
  static void run(transfer_t t) {
    Simulator* sim = Simulator::active();
    Process* p = sim->current_;
    sim->arrive(t.data, t.fctx);
#ifdef CUBESIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &sim->asan_main_bottom_, &sim->asan_main_size_);
#endif
    if (!p->cancel_) {
      try {
        p->body();
      } catch (const detail::ProcessUnwind&) {
        // torn down while blocked: nothing to report
      } catch (...) {
        sim->record_failure(*p, std::current_exception());
      }
    }
    sim->unlink(p);
    sim->finished_sp_ = p->stack_sp_;
    p->~Process();  // the record lives on this stack: destroy it before leaving for good
#ifdef CUBESIM_ASAN
    __sanitizer_start_switch_fiber(nullptr, sim->asan_main_bottom_, sim->asan_main_size_);
#endif
    switch_to(sim->main_ctx_, &kFinishedTag);
    internal_error("a finished fiber was resumed");
  }
};

Simulator::Simulator(SimulatorOptions opts)
    : opts_(opts), stacks_(std::make_unique<detail::StackPool>(opts.stack_size, opts.protected_stacks)) {
  if (opts.stack_size < 16 * 1024) {
    throw std::invalid_argument(
        fmt::format("cubesim: SimulatorOptions::stack_size {} is too small; use at least 16384 bytes", opts.stack_size));
  }
  trace_.set_enabled(opts.trace);
}

Simulator::~Simulator() {
  unwind_all();
  queue_.clear();
}


std::size_t Simulator::stack_size() const { return stacks_->size(); }
std::size_t Simulator::stacks_allocated() const { return stacks_->allocated(); }
std::size_t Simulator::stacks_mapped() const { return stacks_->fresh(); }

void* Simulator::allocate_record(std::size_t bytes, std::size_t align, void** sp, std::size_t* size) {
  void* top_ptr = stacks_->get();
  *sp = top_ptr;
  *size = stacks_->size();
  if (align < 64) align = 64;
  // Stack colouring: stacks are page-aligned and equally sized, so without an offset every fiber
  // would save its registers at the same address modulo 4 KiB, inviting 4K-aliasing stalls between
  // one fiber's context store and the next one's load. A few hundred bytes of offset avoid that.
  const std::uintptr_t colour = ((next_id_ * 5) % 16) * 256;
  auto top = reinterpret_cast<std::uintptr_t>(top_ptr);
  auto rec = (top - colour - bytes) & ~(static_cast<std::uintptr_t>(align) - 1);
  if (top - rec + 4096 > *size) {
    stacks_->put(top_ptr);
    throw std::invalid_argument(fmt::format(
        "cubesim: the process callable ({} bytes) does not fit its {}-byte stack; capture by reference or "
        "raise SimulatorOptions::stack_size",
        bytes, *size));
  }
  return reinterpret_cast<void*>(rec);
}

void Simulator::start(Process* p, void* sp, std::size_t size) {
  p->stack_sp_ = sp;
  p->stack_size_ = size;
  p->id_ = next_id_++;
  p->live_prev_ = live_tail_;
  p->live_next_ = nullptr;
  if (live_tail_) live_tail_->live_next_ = p; else live_head_ = p;
  live_tail_ = p;
  ++live_count_;
  // The fiber's stack runs from just below the record down to the bottom of the allocation.
  const auto top = reinterpret_cast<std::uintptr_t>(sp);
  const auto rec = reinterpret_cast<std::uintptr_t>(p);
  p->ctx_ = bctx::detail::make_fcontext(p, size - (top - rec), &FiberEntry::run);
  p->state_ = Process::State::kReady;
  queue_.push_resume(now(), EventQueue::kDefaultPriority, p);
}

void Simulator::unlink(Process* p) {
  if (p->live_prev_) p->live_prev_->live_next_ = p->live_next_; else live_head_ = p->live_next_;
  if (p->live_next_) p->live_next_->live_prev_ = p->live_prev_; else live_tail_ = p->live_prev_;
  --live_count_;
}

// Every jump passes, as its data, the process it leaves (nullptr: the scheduler's loop), so that
// the side that arrives can store the context it left: a process may be resumed by the scheduler
// or, directly, by the process that ran before it (switch_out).
__attribute__((always_inline)) inline void Simulator::arrive(void* from, void* ctx) {
  if (from != nullptr) {
    static_cast<Process*>(from)->ctx_ = ctx;
  } else {
    main_ctx_ = ctx;
  }
}

__attribute__((always_inline)) inline void Simulator::resume(Process* p) {
  if (p->state_ == Process::State::kRunning) internal_error("resume of a running process");
  Process* prev = current_;
  current_ = p;
  p->state_ = Process::State::kRunning;
#ifdef CUBESIM_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, static_cast<char*>(p->stack_sp_) - p->stack_size_, p->stack_size_);
#endif
  transfer_t t = switch_to(p->ctx_, nullptr);
#ifdef CUBESIM_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  current_ = prev;
  // Back from p, or from a later process that p handed over to, or from one that finished.
  if (t.data == &kFinishedTag) {
    stacks_->put(finished_sp_);
  } else {
    static_cast<Process*>(t.data)->ctx_ = t.fctx;
  }
}

// The running process p has blocked (its wake-up, if any, is queued). When the queue's next event
// is a process to resume, due within the run's limit, p pops it and switches to that process
// directly: one context switch per hand-over instead of two (p to the scheduler, the scheduler to
// the next), and the scheduler's loop is not entered at all. The queue pops the same events in the
// same order either way; only which stack runs the pop differs. Anything else (a callback, nothing
// due, the interrupt poll coming due) goes back to the scheduler. If the next is p itself (a
// yield with nothing else due now), p simply goes on.
__attribute__((always_inline)) inline void Simulator::switch_out(Process& p) {
#ifndef CUBESIM_ASAN
  if (poll_ > 1) [[likely]] {
    if (void* target = queue_.pop_resume(stop_at_)) {
      --poll_;
      Process* next = static_cast<Process*>(target);
      if (next == &p) {
        p.state_ = Process::State::kRunning;
        return;
      }
      if (next->state_ == Process::State::kRunning) internal_error("resume of a running process");
      current_ = next;
      next->state_ = Process::State::kRunning;
      transfer_t t = switch_to(next->ctx_, &p);
      arrive(t.data, t.fctx);
      return;
    }
  }
#else
  __sanitizer_start_switch_fiber(&p.asan_fake_stack_, asan_main_bottom_, asan_main_size_);
#endif
  transfer_t t = switch_to(main_ctx_, &p);
#ifdef CUBESIM_ASAN
  __sanitizer_finish_switch_fiber(p.asan_fake_stack_, &asan_main_bottom_, &asan_main_size_);
#endif
  arrive(t.data, t.fctx);
}

void Simulator::throw_not_in_process(const char* what) {
  if (t_active_ == nullptr) {
    throw NotInProcessError(fmt::format(
        "cubesim: {} called outside a simulated process (no simulation is running on this thread); "
        "blocking calls are valid only inside a process started with Simulator::spawn",
        what));
  }
  t_active_->require_process(what);
  internal_error("throw_not_in_process with a running process");
}

Process& Simulator::require_process(const char* what) const {
  if (current_ == nullptr) {
    throw NotInProcessError(fmt::format(
        "cubesim: {} called outside a simulated process (from a callback or from code outside run()); "
        "blocking calls are valid only inside a process started with Simulator::spawn",
        what));
  }
  return *current_;
}

void Simulator::block(Process& p, const WaitGroup* group) { block_inline(p, group); }

void Simulator::call_off_stack(void (*fn)(void*), void* arg) {
  // fn is off_stack's thunk, which never throws: off_stack_ is always reset.
  if (current_ == nullptr || off_stack_ != nullptr) {
    fn(arg);
    return;
  }
  off_stack_ = current_;
#if defined(CUBESIM_HAVE_CALL_ON_STACK) && !defined(CUBESIM_ASAN)
  if (main_ctx_ != nullptr) [[likely]] {
    // Below the scheduler's saved context (its stack pointer where its loop waits to resume a
    // process; nothing of the scheduler lives below it), past a red zone's worth, on a cache line.
    const auto sp = (reinterpret_cast<std::uintptr_t>(main_ctx_) - 256) & ~std::uintptr_t{63};
    cubesim_call_on_stack(arg, fn, reinterpret_cast<void*>(sp));
    off_stack_ = nullptr;
    return;
  }
#endif
  fn(arg);
  off_stack_ = nullptr;
}

__attribute__((always_inline)) inline void Simulator::block_inline(Process& p, const WaitGroup* group) {
  if (&p != current_) [[unlikely]] internal_error("block() of a process that is not running");
  if (off_stack_ != nullptr) [[unlikely]] internal_error("a process blocked inside Simulator::off_stack");
  if (p.cancel_) throw detail::ProcessUnwind{};
  p.state_ = Process::State::kBlocked;
  p.wait_group_ = group;
  p.blocked_since_ = now();
  switch_out(p);
  p.wait_group_ = nullptr;
  if (p.cancel_) throw detail::ProcessUnwind{};
}

void Simulator::wake(Process& p) {
  if (p.state_ != Process::State::kBlocked) internal_error("wake() of a process that is not blocked");
  p.state_ = Process::State::kReady;
  queue_.push_resume(now(), EventQueue::kDefaultPriority, &p);
}

void Simulator::sleep(Process& p, Duration d) { sleep_inline(p, d); }

__attribute__((always_inline)) inline void Simulator::sleep_inline(Process& p, Duration d) {
  queue_.push_resume(add(now(), d), EventQueue::kDefaultPriority, &p);
  block_inline(p, nullptr);
}

void Simulator::record_failure(Process& p, std::exception_ptr e) {
  std::string msg;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    msg = ex.what();
  } catch (...) {
    msg = "an exception not derived from std::exception";
  }
  if (!stopping_) {
    stopping_ = true;
    failure_time_ = now();
    if (stop_at_ > now()) stop_at_ = now();  // finish this instant, then stop
  }
  failures_.push_back(ProcessFailure{.process = p.name_, .process_id = p.id_, .time = now(), .message = std::move(msg), .error = e, .user = p.user_});
}

namespace {
struct ActiveGuard {
  Simulator* prev;
  explicit ActiveGuard(Simulator* s) : prev(Simulator::active()) { Simulator::set_active(s); }
  ~ActiveGuard() { Simulator::set_active(prev); }
};
}  // namespace

void Simulator::run_loop(Time limit) {
  if (current_ != nullptr) {
    throw std::logic_error("cubesim: Simulator::run() called from inside a simulated process");
  }
  ActiveGuard guard(this);
  stop_at_ = limit;
  auto resumer = [this](void* p) { resume(static_cast<Process*>(p)); };
  poll_ = kInterruptPoll;
  bool interrupted = false;
  while (queue_.run_next(stop_at_, resumer)) {
    if (--poll_ == 0) [[unlikely]] {
      poll_ = kInterruptPoll;
      if (interrupt_requested()) {
        interrupted = true;
        break;
      }
    }
  }
  if (interrupted && failures_.empty()) {
    // Ctrl-C (interrupt.h): stop here, leaving an idle simulator that can run again.
    const Time t = now();
    const std::uint64_t events = events_executed();
    unwind_all();
    queue_.clear();
    throw InterruptedError(t, events);
  }
  if (!failures_.empty()) {
    std::vector<ProcessFailure> failures = std::move(failures_);
    failures_.clear();
    unwind_all();
    queue_.clear();
    stopping_ = false;
    throw ProcessError(std::move(failures));
  }
}

void Simulator::run() {
  run_loop(kTimeMax);
  queue_.rewind_noop_tail();
  if (live_count_ > 0) throw_deadlock();
}

void Simulator::run_until(Time t) { run_loop(t); }

std::string describe(const WaiterList& list, std::uint64_t amount) {
  std::string s = fmt::format("{} '{}'", list.kind, list.name ? *list.name : std::string("?"));
  if (amount) s += fmt::format(" ({} units)", amount);
  if (list.detail) s += fmt::format(" ({})", list.detail(list.owner));
  return s;
}

void Simulator::throw_deadlock() {
  std::vector<BlockedProcess> blocked;
  for (Process* p = live_head_; p; p = p->live_next_) {
    std::string what = "nothing (it was never woken)";
    if (const WaitGroup* g = p->wait_group_) {
      std::vector<std::string> parts;
      for (std::size_t i = 0; i < g->count; ++i) {
        const Waiter& w = g->waiters[i];
        if (w.list) parts.push_back(describe(*w.list, w.amount));
      }
      if (g->mode == nullptr && parts.size() == 1) {
        what = parts[0];
      } else {
        what = fmt::format("{} of [{}]", g->mode ? g->mode : "one", fmt::join(parts, ", "));
      }
    }
    blocked.push_back(BlockedProcess{.process = p->name_, .process_id = p->id_, .waits_on = std::move(what), .since = p->blocked_since_, .user = p->user_});
  }
  const Time t = now();
  unwind_all();
  queue_.clear();
  throw DeadlockError(t, std::move(blocked));
}

void Simulator::unwind_all() {
  // Resume every live process with cancel set: a blocked one throws ProcessUnwind out of its
  // blocking call, so its stack unwinds (destructors run) and its fiber finishes.
  ActiveGuard guard(this);
  while (live_head_) {
    Process* p = live_head_;
    p->cancel_ = true;
    resume(p);
    if (live_head_ == p) internal_error("a process did not finish when unwound (did it swallow ProcessUnwind?)");
  }
  failures_.clear();
  stopping_ = false;
}

namespace this_process {
void sleep(Duration d) {
  // Simulator::running_process, but keeping the simulator it read: going through p.simulator()
  // would add a dependent load to the head of the switch path.
  Simulator* s = Simulator::active();
  if (s == nullptr || s->current_ == nullptr) [[unlikely]] Simulator::running_process("this_process::sleep()");
  s->sleep_inline(*s->current_, d);
}

Time now() {
  Simulator* s = Simulator::active();
  if (s == nullptr) throw NotInProcessError("cubesim: this_process::now() called with no simulation running");
  return s->now();
}

Process& self() { return Simulator::running_process("this_process::self()"); }
}  // namespace this_process

}  // namespace cubesim::sim
