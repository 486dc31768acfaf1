// The ring algorithms of a timing-only run as callbacks (ring_callbacks.h).
#include "runtime/algorithms/ring_callbacks.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "sim/core/event.h"

namespace cubesim::rt::algo {

namespace {

enum class Kind : std::uint8_t { reduce_scatter, all_gather };

class RingRun;

// One rank's part: where its code would be, and its buffers. Hot fields first.
struct Slot {
  RingRun* run = nullptr;
  int pos = 0;                 // ring position
  int step = 0;                // the step whose receive it is at
  int offered = 0;             // sends offered in this phase
  int outstanding = 0;         // its sends not landed yet
  std::uint8_t phase = 0;      // index into the run's phases; == phases: over
  bool joined = false;         // its rank has arrived
  bool posted = false;         // its receive of `step` is posted and not started
  bool running = false;        // its own step is on the stack: a landing now continues inline
  bool landed_inline = false;  // ... and one did
  bool waiting_all = false;    // at the end of a phase, for its sends to land
  bool handed_back = false;    // its last receive landed: its process does the rest, as its code would
  bool finished = false;
  sim::Time t_start = 0, t_end = 0;  // the receive's transfer: started (both sides there), landed
  Storage* flat = nullptr;
  std::uint64_t flat_off = 0;
  // A reduce-scatter's staging buffers, one per chunk size, and the reduction's time for each.
  std::int64_t stage_numel[2] = {-1, -1};
  Storage* stage[2] = {nullptr, nullptr};
  std::uint64_t stage_off[2] = {0, 0};
  sim::Duration reduce_time[2] = {0, 0};
  int rank = -1;
  std::exception_ptr error;
  std::unique_ptr<sim::Event> done;
};

// Where a rank's code would resume.
enum class Resume { enter, received, reduced, phase_over };

class RingRun {
 public:
  RingRun(Context& ctx, const ProcessGroup& g, const Members& m, std::int64_t n, DType d, RingPhases phases)
      : group_(g), sim_(ctx.simulator()), be_(ctx.backend()), order_(m.order), tag_(m.phase), ring_phases_(phases),
        n_(n), dtype_(d), el_(dtype_size(d)), M_(m.size()), base_(n / m.size()), rem_(n % m.size()),
        slots_(static_cast<std::size_t>(m.size())) {
    if (phases != RingPhases::all_gather) kinds_[phases_++] = Kind::reduce_scatter;
    if (phases != RingPhases::reduce_scatter) kinds_[phases_++] = Kind::all_gather;
  }

  // The same ring (members in order, tag, phases, count, dtype) that the caller's position has not
  // joined yet: two identical rings of one call (on two regions) are run one after the other.
  bool matches(const Members& m, RingPhases phases, std::int64_t n, DType d) const {
    return m.order == order_ && m.phase == tag_ && phases == ring_phases_ && n == n_ && d == dtype_ &&
           !slots_[static_cast<std::size_t>(m.pos)].joined;
  }

  void join(Comm& c, const Members& m, const Tensor& flat) {
    Slot& k = slots_[static_cast<std::size_t>(m.pos)];
    if (k.joined) throw RuntimeError(fmt::format("{}: rank {} joined its ring twice", c.name(), c.rank()));
    k.run = this;
    k.pos = m.pos;
    k.rank = c.rank();
    k.flat = &flat.storage();
    k.flat_off = flat.byte_offset();
    if (kinds_[0] == Kind::reduce_scatter) {
      // The staging buffers in the order the rank's code asks for them (Comm::staging), handed back
      // to the Comm at once: freed with it, as there.
      for (int s = 0; s < M_ - 1; ++s) {
        const std::int64_t count = chunk(Members::mod(k.pos - s - 2, M_)).count;
        if (k.stage_numel[0] == count || k.stage_numel[1] == count) continue;
        const int b = k.stage_numel[0] < 0 ? 0 : 1;
        Tensor t = c.staging(count, dtype_);
        k.stage_numel[b] = count;
        k.stage[b] = &t.storage();
        k.stage_off[b] = t.byte_offset();
        k.reduce_time[b] = be_.charge_time(k.rank, reduce_cost(dtype_, count));  // as Comm::reduce_local
        c.keep_staging(std::move(t));
      }
    }
    k.done = std::make_unique<sim::Event>(c.name());
    k.done->set_detail(&describe, &k);
    k.joined = true;
    go(k, Resume::enter);  // in the rank's process: an error here is the rank's, as in its code
    if (!k.finished) k.done->wait();
    if (k.error) std::rethrow_exception(k.error);
    if (k.finished) return;
    // Handed back at the landing of its last receive, which woke this process as it wakes the
    // rank's code: the reduction's excess and the wait for its sends happen here, as there, so the
    // run has the same events as the ranks' code, one for one.
    k.done->reset();
    if (kinds_[k.phase] == Kind::reduce_scatter) {
      const sim::Duration t = reduce_time(k);
      if (t > k.t_end - k.t_start) sim::this_process::sleep(t - (k.t_end - k.t_start));
    }
    ++k.step;
    while (k.outstanding > 0) {
      k.waiting_all = true;
      k.done->wait();
      k.done->reset();
    }
    ++k.phase;
    k.finished = true;
  }

 private:
  Slot& next(const Slot& k) { return slots_[static_cast<std::size_t>(k.pos + 1 == M_ ? 0 : k.pos + 1)]; }
  Slot& prev(const Slot& k) { return slots_[static_cast<std::size_t>(k.pos == 0 ? M_ - 1 : k.pos - 1)]; }
  // chunk_range(n_, M_, i) without its divisions (two per call, several per message).
  Range chunk(int i) const {
    return Range{i * base_ + std::min<std::int64_t>(i, rem_), base_ + (i < rem_ ? 1 : 0)};
  }
  int stage_of(const Slot& k, std::int64_t count) const { return k.stage_numel[0] == count ? 0 : 1; }
  // The reduction of k's current receive (reduce-scatter), as Comm::reduce_local prices it.
  sim::Duration reduce_time(const Slot& k) const {
    return k.reduce_time[stage_of(k, chunk(Members::mod(k.pos - k.step - 2, M_)).count)];
  }

  // Offers the rank's send of this step and posts its receive, starting each transfer whose other
  // side is there (as Comm::isend then Comm::recv do).
  void enter_step(Slot& k) {
    k.running = true;
    const int s = k.step;
    ++k.offered;
    ++k.outstanding;
    Slot& n = next(k);
    if (n.joined && n.phase == k.phase && n.posted && n.step == s) start(k, n);
    k.posted = true;
    Slot& p = prev(k);
    if (p.joined && p.phase == k.phase && p.offered > s) start(p, k);
    k.running = false;
  }

  // The message of k's current step from f (its ring predecessor) to k.
  void start(Slot& f, Slot& k) {
    const int s = k.step;
    const Kind kind = kinds_[k.phase];
    const Range r = chunk(Members::mod(k.pos - s - (kind == Kind::reduce_scatter ? 2 : 1), M_));
    const std::uint64_t bytes = static_cast<std::uint64_t>(r.count) * el_;
    const std::uint64_t at = static_cast<std::uint64_t>(r.begin) * el_;
    Storage* dst = k.flat;
    std::uint64_t dst_off = k.flat_off + at;
    if (kind == Kind::reduce_scatter) {
      const int b = stage_of(k, r.count);
      dst = k.stage[b];
      dst_off = k.stage_off[b];
    }
    k.posted = false;
    k.t_start = sim_.now();
    be_.start_copy(*f.flat, f.flat_off + at, *dst, dst_off, bytes, {}, hw::OnLanded{&landed, &k});
  }

  static void landed(void* arg) {
    Slot& k = *static_cast<Slot*>(arg);
    k.run->on_landed(k);
  }

  // As the message's landing wakes its receiver, then tells its sender (Comm::send_finished).
  void on_landed(Slot& k) {
    k.t_end = sim_.now();
    if (k.running) {
      k.landed_inline = true;
    } else if (k.phase + 1 == phases_ && k.step == M_ - 2) {
      k.handed_back = true;  // its last receive: its process goes on from here (join)
      k.done->trigger();
    } else {
      sim_.after(0, Wake{this, &k, Resume::received});
    }
    Slot& f = prev(k);
    if (--f.outstanding == 0 && f.waiting_all) {
      f.waiting_all = false;
      if (f.handed_back) {
        f.done->trigger();
      } else {
        sim_.after(0, Wake{this, &f, Resume::phase_over});
      }
    }
  }

  struct Wake {
    RingRun* run;
    Slot* k;
    Resume at;
    void operator()() const { run->resume(*k, at); }
  };

  // A callback's resumption: an error ends the rank's part, and its process rethrows it.
  void resume(Slot& k, Resume at) {
    try {
      go(k, at);
    } catch (...) {
      k.running = false;
      k.error = std::current_exception();
      finish(k);
    }
  }

  // The rank's code from `at` until it waits again.
  void go(Slot& k, Resume at) {
    for (;;) {
      switch (at) {
        case Resume::enter: break;
        case Resume::received:
          if (kinds_[k.phase] == Kind::reduce_scatter) {  // Comm::recv_reduce: the reduction's excess
            const sim::Duration streamed = k.t_end - k.t_start;
            const sim::Duration t = reduce_time(k);
            if (t > streamed) {
              sim_.after(t - streamed, Wake{this, &k, Resume::reduced});
              return;
            }
          }
          [[fallthrough]];
        case Resume::reduced:
          if (++k.step < M_ - 1) break;
          if (k.outstanding > 0) {  // wait_all
            k.waiting_all = true;
            return;
          }
          [[fallthrough]];
        case Resume::phase_over:
          if (++k.phase == phases_) {
            finish(k);
            return;
          }
          k.step = 0;
          k.offered = 0;
          break;
      }
      enter_step(k);
      if (!k.landed_inline) return;
      k.landed_inline = false;
      at = Resume::received;
    }
  }

  void finish(Slot& k) {
    k.finished = true;
    k.done->trigger();
  }

  static std::string describe(const void* owner) {
    const auto* k = static_cast<const Slot*>(owner);
    const RingRun& r = *k->run;
    if (k->finished) return "over";
    if (k->handed_back && !k->waiting_all) return fmt::format("rank {}: its last receive landed", k->rank);
    const char* ph = r.kinds_[k->phase] == Kind::reduce_scatter ? "reduce-scatter" : "all-gather";
    const int from = r.group_.rank_at(r.order_[static_cast<std::size_t>(k->pos == 0 ? r.M_ - 1 : k->pos - 1)]);
    if (k->waiting_all) {
      return fmt::format("rank {} at the end of the ring's {}: {} of its sends not landed", k->rank, ph, k->outstanding);
    }
    return fmt::format("rank {} at step {} of {} of the ring's {}: {} the message from rank {}", k->rank,
                       k->step + 1, r.M_ - 1, ph, k->posted ? "waiting for" : "receiving", from);
  }

  const ProcessGroup& group_;
  sim::Simulator& sim_;
  Backend& be_;
  std::vector<int> order_;
  std::uint64_t tag_;
  RingPhases ring_phases_;
  std::int64_t n_;
  DType dtype_;
  std::uint64_t el_;
  int M_;
  std::int64_t base_, rem_;  // n_ / M_, n_ % M_
  Kind kinds_[2] = {Kind::reduce_scatter, Kind::reduce_scatter};
  std::uint8_t phases_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace

bool ring_by_callbacks(Comm& c, const Members& m, const Tensor& flat, ReduceOp, RingPhases phases) {
  Context& ctx = c.context();
  const int M = m.size();
  if (M < 2 || !ctx.options().callback_collectives) return false;
  Backend& be = ctx.backend();
  if (!be.timing_only() || !be.simulates_time() || ctx.trace().enabled()) return false;
  auto& runs = ctx.pending(c.group().id(), c.sequence()).runs;
  std::shared_ptr<RingRun> run;
  for (const auto& x : runs) {
    auto r = std::static_pointer_cast<RingRun>(x);
    if (r->matches(m, phases, flat.numel(), flat.dtype())) {
      run = std::move(r);
      break;  // the earliest: the ranks join a call's identical rings in the same order
    }
  }
  if (!run) {
    run = std::make_shared<RingRun>(ctx, c.group(), m, flat.numel(), flat.dtype(), phases);
    runs.push_back(run);
    ctx.count_callback_ring();
  }
  run->join(c, m, flat);  // holds the run while the rank waits
  return true;
}

}  // namespace cubesim::rt::algo
