#include "runtime/context.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <set>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/comm.h"
#include "runtime/errors.h"
#include "runtime/host_backend.h"
#include "sim/core/interrupt.h"

namespace cubesim::rt {

namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::unique_ptr<Backend> host_backend_for(const ContextOptions& o) {
  if (o.world_size <= 0) {
    throw RuntimeError(fmt::format("a host context needs world_size >= 1 (got {})", o.world_size));
  }
  check_rank_count(o.world_size, o.stack_size, sim::SimulatorOptions{}.protected_stacks);  // before the backend
  return std::make_unique<HostBackend>(o.world_size);
}

std::uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

long max_map_count() {
  std::ifstream f("/proc/sys/vm/max_map_count");
  long n = 0;
  return f >> n ? n : 0;
}

std::string gib(std::uint64_t b) { return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1ull << 30)); }
}  // namespace

void check_rank_count(int ranks, std::size_t stack_size, bool guarded_stacks) {
  const std::uint64_t need = static_cast<std::uint64_t>(std::max(ranks, 0)) * kBytesPerRank;
  if (ranks > kMaxRanks) {
    throw RuntimeError(fmt::format("{} ranks: the limit is {} ranks per context (as many as a topology may have cubes); "
                                   "{} ranks would need about {} (about {} KiB each: stack pages and runtime state)",
                                   ranks, kMaxRanks, ranks, gib(need), kBytesPerRank / 1024));
  }
  if (const std::uint64_t phys = physical_memory(); phys > 0 && need > phys) {
    throw RuntimeError(fmt::format("{} ranks would need about {} (about {} KiB each: stack pages and runtime state), "
                                   "more than this machine's {}; use at most {} ranks here",
                                   ranks, gib(need), kBytesPerRank / 1024, gib(phys), phys / kBytesPerRank));
  }
  if (guarded_stacks) {
    const long maps = max_map_count();
    const long want = 2L * ranks + 4096;  // a stack and its guard page each, and room for everything else
    if (maps > 0 && want > maps) {
      throw RuntimeError(fmt::format(
          "{} ranks need {} memory maps for their stacks ({} bytes each with a guard page below it), and this kernel "
          "allows {} (vm.max_map_count): use at most {} ranks, raise it (sysctl -w vm.max_map_count={}), or use a "
          "build without guarded stacks",
          ranks, 2L * ranks, stack_size, maps, (maps - 4096) / 2, want));
    }
  }
}

Context::Context(ContextOptions opts) : Context(opts, host_backend_for(opts)) {}

Context::Context(ContextOptions opts, std::unique_ptr<Backend> backend) : opts_(opts), backend_(std::move(backend)) {
  world_size_ = opts_.world_size > 0 ? opts_.world_size : backend_->ranks();
  if (world_size_ > backend_->ranks()) {
    throw RuntimeError(fmt::format("world_size {} exceeds the {} devices of {}", world_size_, backend_->ranks(),
                                   backend_->describe()));
  }
  sim::SimulatorOptions so;
  check_rank_count(world_size_, opts_.stack_size, so.protected_stacks);  // before any work
  so.stack_size = opts_.stack_size;
  so.trace = opts_.trace;
  sim_ = std::make_unique<sim::Simulator>(so);
  backend_->attach(*sim_);
  std::vector<int> all(static_cast<std::size_t>(world_size_));
  for (int i = 0; i < world_size_; ++i) all[static_cast<std::size_t>(i)] = i;
  groups_.push_back(std::make_unique<ProcessGroup>(0, all, "world"));
  timelines_.resize(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) slots_.push_back(std::make_unique<RankSlot>(RankSlot{this, r}));
  mail_ = std::make_unique<MailTable>();
}

Context::~Context() {
  sim_.reset();  // unwinds any process still alive before tensors and groups go away
}

ProcessGroup& Context::new_group(std::vector<int> ranks) {
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= world_size_) {
      throw RuntimeError(fmt::format("new_group({}): rank {} is outside the world of {} ranks (0 to {})",
                                     fmt::join(ranks, ", "), r, world_size_, world_size_ - 1));
    }
    if (!seen.insert(r).second) {
      throw RuntimeError(fmt::format("new_group({}): rank {} appears twice", fmt::join(ranks, ", "), r));
    }
  }
  if (ranks.empty()) throw RuntimeError("new_group: a group needs at least one rank");
  // Group order is ascending global rank, whatever order the caller gave (as torch.distributed's
  // new_group sorts its ranks): all_gather and reduce_scatter lay chunks out in this order.
  std::sort(ranks.begin(), ranks.end());
  for (auto& g : groups_) {
    if (g->ranks() == ranks) return *g;
  }
  const int id = static_cast<int>(groups_.size());
  groups_.push_back(std::make_unique<ProcessGroup>(id, ranks, fmt::format("group{}[{}]", id, fmt::join(ranks, ","))));
  return *groups_.back();
}

int Context::current_rank(const char* what) {
  sim::Simulator* s = sim::Simulator::active();
  const sim::Process* p = s ? s->current() : nullptr;
  if (p == nullptr || p->user() == nullptr) {
    throw RuntimeError(fmt::format("{} must be called from a rank's function inside Context.spawn()", what));
  }
  return static_cast<const RankSlot*>(p->user())->rank;
}

Context& Context::current(const char* what) {
  current_rank(what);
  return *static_cast<const RankSlot*>(sim::Simulator::active()->current()->user())->ctx;
}

void Context::add_compute(int rank, sim::Duration d, std::string_view op) {
  RankTimeline& t = timelines_.at(static_cast<std::size_t>(rank));
  t.compute += d;
  if (op.empty() || d == 0) return;
  auto it = t.compute_by_op.find(op);
  if (it == t.compute_by_op.end()) it = t.compute_by_op.emplace(std::string(op), 0).first;
  it->second += d;
}
void Context::add_comm(int rank, sim::Duration d) { timelines_.at(static_cast<std::size_t>(rank)).comm += d; }

sim::Trace::TrackId Context::compute_track(int rank) {
  return trace().track("compute", fmt::format("rank{}", rank));
}
sim::Trace::TrackId Context::comm_track(int rank) { return trace().track("comm", fmt::format("rank{}", rank)); }

std::vector<MeasuredTotals> Context::measured_totals(int ranks) {
  std::vector<MeasuredTotals> out(static_cast<std::size_t>(std::max(ranks, 0)));
  for (int r = 0; r < ranks; ++r) out[static_cast<std::size_t>(r)].rank = r;
  for (const OpRecord& op : op_records_) {
    if (op.region == 0 || op.rank < 0 || op.rank >= ranks) continue;
    const double s = backend_->measured_seconds(op.region);
    if (s < 0) continue;
    MeasuredTotals& m = out[static_cast<std::size_t>(op.rank)];
    if (op.kind == "gemm") {
      m.gemm_s += s;
      ++m.gemms;
    } else {
      m.collective_s += s;
      ++m.collectives;
    }
  }
  return out;
}

void Context::declare_tracks() {
  for (int r = 0; r < world_size_; ++r) {
    compute_track(r);
    comm_track(r);
  }
  backend_->declare_tracks(world_size_);
}

void Context::spawn_for_rank(int rank, std::string name, std::function<void()> fn) {
  sim_->spawn(std::move(name), std::move(fn), slots_[static_cast<std::size_t>(rank)].get());
}

namespace {
// The rank a process acts for: every process of a context's simulator is spawned by the context
// (spawn_for_rank) and carries its rank's slot as its user pointer; -1 for none.
int rank_of(void* user) { return user ? static_cast<const Context::RankSlot*>(user)->rank : -1; }
}  // namespace

RunReport Context::spawn(int nprocs, const std::function<void(int)>& fn) {
  if (nprocs < 1 || nprocs > world_size_) {
    throw RuntimeError(fmt::format("spawn({}): the context has {} ranks; spawn between 1 and {}", nprocs, world_size_,
                                   world_size_));
  }
  if (sim::Simulator::active() != nullptr) throw RuntimeError("spawn() called from inside a running simulation");
  for (auto& t : timelines_) t = RankTimeline{};
  for (int r = 0; r < world_size_; ++r) timelines_[static_cast<std::size_t>(r)].rank = r;
  pending_.clear();
  mail_->clear();
  p2p_count_.clear();
  extensions_.clear();  // fresh per-rank state, as spawn() starts fresh processes
  for (auto& g : groups_) g->reset_sequences();
  op_records_.clear();
  const sim::Time start = sim_->now();
  const std::uint64_t events0 = sim_->events_executed();
  const std::vector<hw::UnitCounters> usage0 = backend_->counters();
  const std::vector<sim::Trace::TrackStats> tracks0 = sim_->trace().stats();
  // However the run ends in an exception (a rank failed, a deadlock, an interrupt), the backend
  // drops what the run left in flight, so the next spawn() starts from a usable state.
  struct AbandonOnThrow {
    Backend& backend;
    int uncaught = std::uncaught_exceptions();
    ~AbandonOnThrow() {
      if (std::uncaught_exceptions() > uncaught) backend.abandon_run();
    }
  } abandon_on_throw{*backend_};
  for (int r = 0; r < nprocs; ++r) {
    spawn_for_rank(r, fmt::format("rank{}", r), [this, r, &fn] {
      fn(r);
      timelines_[static_cast<std::size_t>(r)].finish = sim_->now() - 0;
    });
  }
  const double w0 = wall_now();
  auto interrupted = [&](sim::Time at, std::uint64_t events) {
    sim::clear_interrupt();
    throw InterruptedError(fmt::format("spawn(): interrupted (SIGINT) at simulated time {} of this run ({} since the "
                                       "context's start) after {} events; what ran is discarded, the context can run "
                                       "again",
                                       sim::format_time(at - start), sim::format_time(at), events - events0));
  };
  sim::SigintScope sigint;  // Ctrl-C stops the run between events (sim/core/interrupt.h)
  sim::clear_interrupt();
  try {
    sim_->run();
  } catch (const sim::InterruptedError& e) {
    interrupted(e.time(), e.events());
  } catch (const sim::ProcessError& e) {
    // A rank that saw the signal itself (a Python rank function raising KeyboardInterrupt).
    if (sim::interrupt_requested()) interrupted(sim_->now(), sim_->events_executed());
    rethrow_as_rank_error(e, false);
  } catch (const sim::DeadlockError& e) {
    rethrow_as_rank_error(e, true);
  }
  backend_->end_run();
  RunReport rep;
  rep.wall_s = wall_now() - w0;
  // When the last rank finished: not the last event's time, which a flow's superseded end event
  // (a no-op, scheduled before its rate rose) can put later.
  sim::Time last_finish = start;
  for (int r = 0; r < nprocs; ++r) last_finish = std::max(last_finish, timelines_[static_cast<std::size_t>(r)].finish);
  rep.sim_time = last_finish - start;
  rep.events = sim_->events_executed() - events0;
  rep.event_hash = sim_->event_order_hash();
  rep.units = backend_->units();
  rep.unit_counters = hw::counters_since(backend_->counters(), usage0);
  const auto& tracks = sim_->trace().stats();
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    sim::Trace::TrackStats t = tracks[i];
    if (i < tracks0.size()) {
      t.spans -= tracks0[i].spans;
      t.busy -= tracks0[i].busy;
    }
    if (t.spans > 0) rep.tracks.push_back(std::move(t));
  }
  rep.ranks.assign(timelines_.begin(), timelines_.begin() + nprocs);
  for (auto& t : rep.ranks) t.finish -= start;
  rep.notes = backend_->take_notes();
  return rep;
}

std::string Context::describe_pending() const {
  std::string s;
  for (const auto& [key, p] : pending_) {
    std::vector<int> in, out;
    const ProcessGroup& g = *groups_[static_cast<std::size_t>(key.first)];
    for (int i = 0; i < g.size(); ++i) (p->arrived[static_cast<std::size_t>(i)] ? in : out).push_back(g.rank_at(i));
    if (out.empty()) continue;
    s += fmt::format("\n  {} ({}): rank{} {} arrived; rank{} {} did not", p->collective, p->signature,
                     in.size() == 1 ? "" : "s", fmt::join(in, ", "), out.size() == 1 ? "" : "s", fmt::join(out, ", "));
  }
  return s;
}

void Context::rethrow_as_rank_error(const std::exception& e, bool deadlock) {
  std::vector<RankFailure> failures;
  std::string msg;
  if (!deadlock) {
    const auto& pe = static_cast<const sim::ProcessError&>(e);
    std::set<int> ranks;
    for (const auto& f : pe.failures()) {
      // A helper process of the backend's own (a PE of a simulated GEMM) carries no rank slot: the
      // backend says which rank it works for.
      const int r = f.user ? rank_of(f.user) : backend_->rank_of_helper(f.process);
      ranks.insert(r);
      failures.push_back(RankFailure{
          r, f.user ? f.message : fmt::format("in its helper process '{}': {}", f.process, f.message), f.error});
    }
    msg = fmt::format("spawn: rank{} {} failed at {}; the other ranks were stopped:", ranks.size() == 1 ? "" : "s",
                      fmt::join(ranks, ", "), sim::format_time(pe.failures().front().time));
    for (const auto& f : failures) msg += fmt::format("\n  rank {}: {}", f.rank, f.message);
  } else {
    const auto& de = static_cast<const sim::DeadlockError&>(e);
    msg = fmt::format("spawn: the ranks deadlocked at {}", sim::format_time(de.time()));
    const std::string pend = describe_pending();
    if (!pend.empty()) msg += ": a collective was not called by every rank of its group:" + pend;
    msg += "\n  blocked processes:";
    for (const auto& b : de.blocked()) msg += fmt::format("\n    '{}' waits on {}", b.process, b.waits_on);
    for (const auto& b : de.blocked()) {
      failures.push_back(RankFailure{b.user ? rank_of(b.user) : backend_->rank_of_helper(b.process),
                                     "blocked: " + b.waits_on, nullptr});
    }
  }
  pending_.clear();
  mail_->clear();
  throw RankError(msg, std::move(failures));
}

Tensor Context::empty(int rank, Shape shape, DType dtype, std::string_view what) {
  if (rank < 0 || rank >= world_size_) {
    throw RuntimeError(fmt::format("{} {}: rank {} does not exist; valid ranks are 0 to {}", what, shape_str(shape), rank,
                                   world_size_ - 1));
  }
  const std::int64_t n = checked_numel(shape, dtype, what);
  auto st = backend_->allocate(rank, static_cast<std::uint64_t>(n) * dtype_size(dtype), what);
  st->set_owner(this);
  return Tensor(std::move(st), std::move(shape), dtype);
}

void Context::check_owned(const Tensor& t, std::string_view op) const {
  if (!t.defined() || t.storage().owner() == this) return;
  const auto* other = static_cast<const Context*>(t.storage().owner());
  const std::string theirs =
      other ? fmt::format("a context on the {}", other->backend_->describe())
            : std::string("no context");
  throw RuntimeError(fmt::format("{}: tensor {} belongs to {}, but the calling rank runs in a context on the {}; "
                                 "a tensor is used only by the ranks of the context that made it: make it "
                                 "with this context's empty/zeros/tensor, or copy its values over with numpy()",
                                 op, t.describe(), theirs, backend_->describe()));
}

Tensor Context::zeros(int rank, Shape shape, DType dtype, std::string_view what) {
  Tensor t = empty(rank, std::move(shape), dtype, what);
  if (!backend_->timing_only()) t.storage().write_zeros(t.byte_offset(), t.nbytes());  // fresh: contiguous
  return t;
}

Tensor Context::from_host_f32(int rank, Shape shape, DType dtype, const std::vector<float>& values) {
  Tensor t = empty(rank, std::move(shape), dtype, "from_host");
  if (static_cast<std::int64_t>(values.size()) != t.numel()) {
    throw RuntimeError(fmt::format("from_host: {} values for a tensor of shape {} ({} elements)", values.size(),
                                   shape_str(t.shape()), t.numel()));
  }
  if (!backend_->timing_only()) t.copy_from_host_f32(values.data(), t.numel());
  return t;
}

Tensor Context::from_host_bytes(int rank, Shape shape, DType dtype, const void* bytes, std::uint64_t n) {
  Tensor t = empty(rank, std::move(shape), dtype, "from_host");
  if (!backend_->timing_only()) t.copy_from_host_bytes(bytes, n);
  return t;
}

Context::Pending& Context::pending(int group_id, std::uint64_t seq) {
  auto& p = pending_[{group_id, seq}];
  if (!p) {
    p = std::make_unique<Pending>();
    const auto n = static_cast<std::size_t>(groups_[static_cast<std::size_t>(group_id)]->size());
    p->arrived.assign(n, false);
    p->finished.assign(n, false);
  }
  return *p;
}

void Context::finish_pending(int group_id, std::uint64_t seq, int index) {
  auto it = pending_.find({group_id, seq});
  if (it == pending_.end()) return;
  Pending& p = *it->second;
  if (!p.finished[static_cast<std::size_t>(index)]) {
    p.finished[static_cast<std::size_t>(index)] = true;
    if (++p.finished_count == static_cast<int>(p.finished.size())) pending_.erase(it);
  }
}

Context::Mailbox& Context::join_mailbox(const MailKey& key) { return mail_->join(*this, key); }

void Context::release_mailbox(Mailbox& mb) { mail_->release(mb); }
std::size_t Context::messages_in_flight() const { return mail_->size(); }
std::size_t Context::mailboxes_made() const { return mail_->made(); }

std::uint64_t Context::next_p2p(bool sending, int group_id, int src, int dst, int tag) {
  return p2p_count_[{sending, group_id, src, dst, tag}]++;
}

}  // namespace cubesim::rt
