// context.h — a backend plus the ranks that run on it: the runtime's entry point.
//
// A Context owns the scheduler (every backend runs ranks as processes), the backend, the process
// groups and the bookkeeping of collectives in flight. spawn() runs a function on each rank with
// torch.multiprocessing.spawn semantics: blocking calls yield to the scheduler; an exception in any
// rank stops its siblings and spawn() throws one RankError naming every failing rank and its cause.
//
//   Context ctx(ContextOptions{.world_size = 4});   // the host backend
//   auto report = ctx.spawn(4, [&](int rank) {
//     Tensor t = ctx.from_host_f32(rank, {1024}, DType::bf16, values[rank]);
//     all_reduce(t);                       // sum over the world group, ring by default
//   });
//   fmt::print("{}\n", sim::format_time(report.sim_time));
//
// Contexts on any backend by name: rt::make_context (runtime/backend_registry.h); simulated ones
// also by make_sim_context() (runtime/sim_backend.h) from a topology.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/backend.h"
#include "runtime/collective_types.h"
#include "runtime/process_group.h"
#include "runtime/tensor.h"
#include "sim/core/simulator.h"

namespace cubesim::rt {

// The most ranks one context runs (as many as a topology has cubes at most, hw::kMaxCubes), and what
// a rank holds at least in memory: its stack's touched pages and its runtime state (measured: about
// 0.3-0.4 MB per rank in a timing-only MLP at 1024 and 4096 cubes, docs/PERFORMANCE.md).
inline constexpr int kMaxRanks = 1 << 16;
inline constexpr std::uint64_t kBytesPerRank = 256 * 1024;
// Refuses, before any work, a rank count above kMaxRanks, one whose estimated memory
// (ranks x kBytesPerRank) exceeds the machine's, and one whose stacks need more memory maps than
// the kernel allows (guarded stacks: two maps each, vm.max_map_count): RuntimeError naming the
// limit and the memory the ranks would need.
void check_rank_count(int ranks, std::size_t stack_size, bool guarded_stacks);

struct ContextOptions {
  int world_size = 0;          // 0: every device the backend has (required > 0 for host)
  bool trace = false;          // record trace spans (per-rank compute/communication, links, PEs)
  Algorithm algorithm = Algorithm::ring;  // default collective algorithm
  bool accumulate_f32 = false;            // default for CollectiveOptions::accumulate_f32
  int hierarchy = 0;                      // default inner-group size for hierarchical (0: auto)
  std::size_t stack_size = 256 * 1024;    // per rank process
  bool record_ops = false;                // keep an OpRecord of every GEMM and collective (op_records())
  // A timing-only run (no values, no trace) runs ring collectives over a whole group by callbacks
  // instead of each rank's per-message code: the same transfers at the same times, several times
  // faster at scale (runtime/algorithms/ring_callbacks.h). false: always the ranks' code.
  bool callback_collectives = true;
  // The nccl algorithm's figures on a backend without a topology section (the host replaying a
  // simulated run: give it the simulated topology's section); none: hw::NcclSpec::defaults().
  std::optional<hw::NcclSpec> nccl = std::nullopt;
};

// One GEMM or collective as a rank ran it (ContextOptions::record_ops), in the rank's program order.
struct OpRecord {
  int rank = 0;
  std::string kind;    // "gemm", "collective"
  std::string name;    // "column fprop", "all_reduce #3 on group 'world'"
  std::string detail;  // "bf16 4096x14336x4096", "bf16[4194304] ring"
  sim::Time start = 0, end = 0;  // simulated
  std::uint64_t region = 0;      // the backend's begin_region token (Backend::measured_seconds)
};

// The real time a backend measured for one rank's GEMMs and collectives (record_ops on a backend
// that measures: cuda).
struct MeasuredTotals {
  int rank = 0;
  double gemm_s = 0;
  int gemms = 0;
  double collective_s = 0;
  int collectives = 0;
};

// Simulated time a rank spent, split by what it was doing.
struct RankTimeline {
  int rank = 0;
  sim::Duration compute = 0;  // charged compute (GEMMs, elementwise)
  // compute split by op name ("column fprop", "attention", "rms_norm", ...): where it went
  std::map<std::string, sim::Duration, std::less<>> compute_by_op;
  sim::Duration comm = 0;     // inside collectives and send/recv (waiting included)
  sim::Time finish = 0;       // when the rank's function returned
};

struct RunReport {
  sim::Time sim_time = 0;      // simulated time when the last rank finished
  double wall_s = 0;           // host seconds spent in spawn()
  std::uint64_t events = 0;
  // The simulator's event-order fingerprint after the run (a hash of every event's time and key
  // since the context was made): equal runs give equal hashes; the golden tests pin it.
  std::uint64_t event_hash = 0;
  std::vector<RankTimeline> ranks;
  // What each hardware unit did during the run: the units and their counters over the run (none on
  // backends that simulate no hardware); usage() pairs them.
  std::shared_ptr<const std::vector<hw::UnitInfo>> units;
  std::vector<hw::UnitCounters> unit_counters;
  std::vector<hw::UnitUsage> usage() const {
    return units ? hw::usage_of(*units, unit_counters) : std::vector<hw::UnitUsage>{};
  }
  // The trace tracks that got spans during the run, with the spans and busy time of this run.
  std::vector<sim::Trace::TrackStats> tracks;
  // What the backend said about this run, each thing once (Backend::take_notes): e.g. a GEMM whose
  // operand the cuda backend's tensor cores could not read in place.
  std::vector<std::string> notes;
};

class Context {
 public:
  Context(ContextOptions opts, std::unique_ptr<Backend> backend);
  explicit Context(ContextOptions opts);  // host backend
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const ContextOptions& options() const { return opts_; }
  int world_size() const { return world_size_; }
  Backend& backend() { return *backend_; }
  sim::Simulator& simulator() { return *sim_; }
  sim::Trace& trace() { return sim_->trace(); }

  // Runs fn(rank) for rank in [0, nprocs) and waits for all. nprocs must not exceed world_size().
  RunReport spawn(int nprocs, const std::function<void(int)>& fn);

  // Tensors on a rank. Inside spawn(), `rank` is normally the calling rank.
  Tensor empty(int rank, Shape shape, DType dtype, std::string_view what = "tensor");
  Tensor zeros(int rank, Shape shape, DType dtype, std::string_view what = "tensor");
  Tensor from_host_f32(int rank, Shape shape, DType dtype, const std::vector<float>& values);
  Tensor from_host_bytes(int rank, Shape shape, DType dtype, const void* bytes, std::uint64_t n);

  // RuntimeError naming `op`, the tensor and both contexts unless `t` was made by this context: a
  // tensor of one context used by the ranks of another (a sim tensor in a host spawn, or the
  // reverse) is refused before any backend touches its memory.
  void check_owned(const Tensor& t, std::string_view op) const;

  ProcessGroup& world() { return *groups_.front(); }
  // The group of these global ranks, in ascending order whatever order they are given in (as
  // torch.distributed.new_group sorts them): index i of the group is its i-th smallest rank, which
  // is where all_gather puts that rank's chunk and which chunk reduce_scatter gives it.
  ProcessGroup& new_group(std::vector<int> ranks);

  // The global rank of the calling process; RuntimeError outside spawn().
  static int current_rank(const char* what);
  static Context& current(const char* what);

  // Timelines (for the runtime's own layers).
  // `op` (when given) also books d under its name in the rank's compute_by_op.
  void add_compute(int rank, sim::Duration d, std::string_view op = {});
  void add_comm(int rank, sim::Duration d);
  // Trace tracks of a rank ("rank3" group: "compute", "comm").
  sim::Trace::TrackId compute_track(int rank);
  sim::Trace::TrackId comm_track(int rank);
  // Names the tracks of every rank and of the hardware the ranks run on, so a saved trace shows the
  // whole machine; spans appear on them only where something ran.
  void declare_tracks();

  // State of the layers above (tp's parallel_state), created on first use and dropped at the start
  // of every spawn(): like torch.multiprocessing.spawn's fresh processes, each spawn starts clean.
  template <class T>
  T& extension(const std::string& key) {
    auto& slot = extensions_[key];
    if (!slot) slot = std::make_shared<T>();
    return *static_cast<T*>(slot.get());
  }

  // The GEMMs and collectives of the last spawn() (ContextOptions::record_ops).
  const std::vector<OpRecord>& op_records() const { return op_records_; }
  // Per rank 0..ranks-1, the sums of what the backend measured over op_records() (zero where it
  // measured nothing).
  std::vector<MeasuredTotals> measured_totals(int ranks);
  void record_op(OpRecord r) {
    if (opts_.record_ops) op_records_.push_back(std::move(r));
  }

  // Spawns a helper process acting for `rank` (async collectives, sends in flight).
  void spawn_for_rank(int rank, std::string name, std::function<void()> fn);
  // What every process of a rank carries as its sim::Process::user(): how current_rank() and
  // failure reports find the rank.
  struct RankSlot {
    Context* ctx;
    int rank;
  };

  // Collective bookkeeping (collectives.cpp).
  struct Pending;
  Pending& pending(int group_id, std::uint64_t seq);
  void finish_pending(int group_id, std::uint64_t seq, int index);
  // Messages (comm.h): the mailbox of a key, joined (one more reference), and released.
  struct MailKey;
  struct Mailbox;
  class MailTable;
  Mailbox& join_mailbox(const MailKey& key);
  void release_mailbox(Mailbox& mb);
  // Ring collectives this context ran by callbacks (ContextOptions::callback_collectives), ever.
  std::uint64_t callback_rings() const { return callback_rings_; }
  void count_callback_ring() { ++callback_rings_; }
  // Messages filed now, and the mailboxes ever made (the most in flight at once: the pool's size).
  std::size_t messages_in_flight() const;
  std::size_t mailboxes_made() const;
  // Point to point: the k-th send from src to dst with a tag pairs with the k-th recv (mailboxes of
  // group id -(g+1), sequence k).
  std::uint64_t next_p2p(bool sending, int group_id, int src_index, int dst_index, int tag);

 private:
  [[noreturn]] void rethrow_as_rank_error(const std::exception& e, bool deadlock);
  std::string describe_pending() const;

  ContextOptions opts_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<sim::Simulator> sim_;
  int world_size_;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;
  std::vector<RankTimeline> timelines_;
  std::vector<std::pair<sim::Trace::TrackId, sim::Trace::TrackId>> tracks_;
  std::map<std::pair<int, std::uint64_t>, std::unique_ptr<Pending>> pending_;
  std::unique_ptr<MailTable> mail_;
  std::map<std::tuple<bool, int, int, int, int>, std::uint64_t> p2p_count_;
  std::map<std::string, std::shared_ptr<void>> extensions_;
  std::vector<OpRecord> op_records_;
  std::vector<std::unique_ptr<RankSlot>> slots_;
  std::uint64_t callback_rings_ = 0;
};

}  // namespace cubesim::rt
