#include "runtime/collectives.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/algorithms/nccl.h"
#include "runtime/algorithms/table.h"
#include "runtime/comm.h"
#include "runtime/errors.h"
#include "sim/core/event.h"

namespace cubesim::rt {

std::string_view collective_kind_name(CollectiveRequest::Kind k) {
  switch (k) {
    case CollectiveRequest::Kind::all_reduce: return "all_reduce";
    case CollectiveRequest::Kind::reduce_scatter: return "reduce_scatter";
    case CollectiveRequest::Kind::all_gather: return "all_gather";
    case CollectiveRequest::Kind::broadcast: return "broadcast";
  }
  return "?";
}

Work::Work(std::shared_ptr<sim::Event> done, Backend* be, std::uint64_t async)
    : done_(std::move(done)), be_(be), alive_(be ? be->lifetime() : std::weak_ptr<const void>()), async_(async) {}

void Work::wait() {
  if (done_) done_->wait();
  if (be_ && async_ && !alive_.expired()) be_->async_end(async_);  // a Work may outlive its context
}
bool Work::is_completed() const { return !done_ || done_->triggered(); }

namespace {

using algo::Collective;

struct Call {
  Context& ctx;
  ProcessGroup& group;
  int rank;
  const algo::Row& algorithm;  // the table's row of the chosen algorithm
  bool acc_f32;
  algo::Params params;
  const ReduceTap* reduce_tap = nullptr;
};

Call prologue(Collective kind, const std::vector<const Tensor*>& tensors, ProcessGroup* group,
              const CollectiveOptions& o) {
  const std::string name(collective_kind_name(kind));
  const char* coll = name.c_str();
  Context& ctx = Context::current(coll);
  const int rank = Context::current_rank(coll);
  ProcessGroup& g = group ? *group : ctx.world();
  for (const Tensor* t : tensors) {
    if (!t->defined()) throw RuntimeError(fmt::format("{}: an undefined tensor", coll));
    ctx.check_owned(*t, coll);
    if (t->device() != rank) {
      throw RuntimeError(fmt::format("{} on rank {}: tensor {} lives on rank {}; pass a tensor of the calling rank", coll,
                                     rank, t->describe(), t->device()));
    }
    if (!t->is_contiguous()) {
      throw RuntimeError(fmt::format("{}: tensor {} is a strided view; collectives need contiguous tensors", coll,
                                     t->describe()));
    }
  }
  Algorithm a = o.algorithm ? *o.algorithm : (g.default_algorithm ? *g.default_algorithm : ctx.options().algorithm);
  const algo::Row& row = algo::row(a);
  if (!row.supports(kind)) {
    throw RuntimeError(
        fmt::format("{}: algorithm '{}' is not available; valid: {}", coll, row.name, algo::supported_names(kind)));
  }
  return Call{.ctx = ctx,
              .group = g,
              .rank = rank,
              .algorithm = row,
              .acc_f32 = o.accumulate_f32.value_or(ctx.options().accumulate_f32),
              .params = {.hierarchy = o.hierarchy ? o.hierarchy : ctx.options().hierarchy},
              .reduce_tap = o.reduce_tap};
}

// Runs the chosen algorithm's body for collective k (the prologue checked that it has one), after
// the check of what the body needs of the group: made here, where the body would make it, so a
// group that fails it fails at the same simulated time, in the same process.
template <class Fn, class... Args>
void run_algorithm(const Call& c, Collective k, const algo::Body<Fn>& body, Comm& comm, const algo::Members& m,
                   const Args&... args) {
  algo::require_group(c.algorithm, k, comm, m.size());
  body.run(comm, m, args..., c.params);
}

// Runs body(comm) now (sync) or in a helper process of the rank (async). The Comm is created here,
// in program order, so sequence numbers follow each rank's order of calls.
template <class Body>
// `side`: the body's only work on the rank's stream is the collective on its buffer (in place, no
// staging or working copies), so a backend may run an asynchronous one beside the rank's later work.
Work launch(const Call& call, const char* coll, std::string signature, bool async, Body body, bool side = false) {
  auto comm = std::make_shared<Comm>(call.ctx, call.group, coll, signature);
  comm->reduce_tap = call.reduce_tap;
  auto done = std::make_shared<sim::Event>(comm->name());
  Context& ctx = call.ctx;
  const int rank = call.rank;
  // Where an asynchronous collective's input is ready in the rank's order of work: now, before the
  // caller goes on (the collective's process runs later).
  if (async && side) comm->async = ctx.backend().async_begin(rank);
  auto run = [comm, done, body, &ctx, rank, signature] {
    const sim::Time t0 = ctx.simulator().now();
    comm->region = ctx.backend().begin_region(rank, "collective");
    body(*comm);
    ctx.backend().end_region(comm->region);
    const sim::Time t1 = ctx.simulator().now();
    ctx.add_comm(rank, t1 - t0);
    auto& tr = ctx.trace();
    tr.span(ctx.comm_track(rank), comm->name(), t0, t1);
    if (ctx.options().record_ops) {
      ctx.record_op(OpRecord{rank, "collective", comm->name(), comm->plan.empty() ? signature : signature + " " + comm->plan,
                             t0, t1, comm->region});
    }
    done->trigger();
  };
  if (async) {
    ctx.spawn_for_rank(rank, fmt::format("rank{}/{}", rank, comm->name()), run);
  } else {
    run();
  }
  return comm->async ? Work(done, &ctx.backend(), comm->async) : Work(done);
}

// The buffer the algorithm works on: the tensor itself, or an f32 copy when partial sums are to be
// carried in f32 (then rounded back once at the end).
struct Working {
  Tensor buf;
  bool converted = false;
};

Working working_copy(Comm& comm, const Tensor& t, bool acc_f32) {
  if (!acc_f32 || t.dtype() == DType::f32) return {t.flatten(), false};
  Tensor w = comm.scratch(t.numel(), DType::f32);
  Context& ctx = comm.context();
  if (!ctx.backend().timing_only()) {
    const auto v = t.to_host_f32();
    w.copy_from_host_f32(v.data(), static_cast<std::int64_t>(v.size()));
  }
  OpCost c{OpCost::Kind::elementwise, "widen to f32", 0, 0, 0, t.dtype(), t.nbytes(), w.nbytes(), 0};
  ctx.backend().charge(comm.rank(), c);
  return {w, true};
}

void finish_working(Comm& comm, const Working& w, const Tensor& t) {
  if (!w.converted) return;
  Context& ctx = comm.context();
  if (!ctx.backend().timing_only()) {
    const auto v = w.buf.to_host_f32();
    Tensor flat = t.flatten();
    flat.copy_from_host_f32(v.data(), static_cast<std::int64_t>(v.size()));
  }
  OpCost c{OpCost::Kind::elementwise, "round from f32", 0, 0, 0, t.dtype(), w.buf.nbytes(), t.nbytes(), 0};
  ctx.backend().charge(comm.rank(), c);
}

// A staging copy around a collective: timed (a device copy), except around an nccl call whose
// figures charge NCCL's own copies inside its channel loop (nccl_copies_in_loop): then the bytes
// move without time (a timing-only backend moves none).
void staging_copy(Comm& comm, const Call& c, const Tensor& dst, const Tensor& src) {
  if (c.algorithm.id != Algorithm::nccl || !algo::nccl_copies_in_loop(comm)) {
    comm.copy_local(dst, src);
    return;
  }
  if (comm.context().backend().timing_only()) return;
  constexpr std::uint64_t kPiece = 1 << 20;
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, src.nbytes())));
  for (std::uint64_t off = 0; off < src.nbytes(); off += kPiece) {
    const std::uint64_t n = std::min(kPiece, src.nbytes() - off);
    src.storage().read(src.byte_offset() + off, buf.data(), n);
    dst.storage().write(dst.byte_offset() + off, buf.data(), n);
  }
}

// Offers the whole collective to the backend (NCCL on cuda); false: run the algorithm.
bool backend_runs(Comm& comm, CollectiveRequest::Kind k, const Tensor& buf, ReduceOp op = ReduceOp::sum, int root = 0) {
  CollectiveRequest r;
  r.kind = k;
  r.buf = &buf;
  r.op = op;
  r.root = root;
  r.group = &comm.group();
  r.index = comm.me();
  r.sequence = comm.sequence();
  r.name = comm.name();
  r.region = comm.region;
  r.async = comm.async;
  return comm.context().backend().collective(r);
}

std::string sig(const Tensor& t, const Call& c, std::string extra = {}) {
  return fmt::format("({}{}[{}], {}{})", extra, dtype_name(t.dtype()), t.numel(), c.algorithm.name,
                     c.acc_f32 ? ", f32 accumulation" : "");
}

// The collective's result is in `out` on this rank: a point where a fault may strike (replayed on
// backends without a simulated system, runtime/fault_replay.h).
void output_ready(Comm& comm, const Tensor& out) {
  Backend& be = comm.context().backend();
  if (!be.timing_only() && out.numel() > 0) be.fault_point(Backend::FaultPoint::collective_output, out);
}

}  // namespace

Work all_reduce(const Tensor& t, ReduceOp op, ProcessGroup* group, CollectiveOptions o) {
  const Call c = prologue(Collective::all_reduce, {&t}, group, o);
  const std::string s = sig(t, c, fmt::format("{}, ", reduce_op_name(op)));
  const bool in_place = !(c.acc_f32 && op == ReduceOp::sum) || t.dtype() == DType::f32;  // no f32 working copy
  return launch(
      c, "all_reduce", s, o.async_op,
      [t, op, c](Comm& comm) {
        Working w = working_copy(comm, t, c.acc_f32 && op == ReduceOp::sum);
        if (!backend_runs(comm, Collective::all_reduce, w.buf, op)) {
          const auto m = algo::Members::whole(comm);
          run_algorithm(c, Collective::all_reduce, c.algorithm.all_reduce, comm, m, w.buf, op);
        }
        finish_working(comm, w, t);
        output_ready(comm, t);
      },
      in_place);
}

Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, ProcessGroup* group, CollectiveOptions o) {
  const Call c = prologue(Collective::reduce_scatter, {&out, &in}, group, o);
  const int p = c.group.size();
  if (in.numel() != out.numel() * p || in.dtype() != out.dtype()) {
    throw RuntimeError(fmt::format("reduce_scatter on group '{}' ({} ranks): input {} must have {} x {} = {} elements "
                                   "of the output's dtype; output is {}",
                                   c.group.name(), p, in.describe(), p, out.numel(), out.numel() * p, out.describe()));
  }
  const std::string s = sig(in, c, fmt::format("{}, ", reduce_op_name(op)));
  return launch(c, "reduce_scatter", s, o.async_op, [in, out, op, c](Comm& comm) {
    // Works on a copy of the input (the input is left as it was, as torch does).
    Tensor buf = comm.scratch(in.numel(), in.dtype());
    staging_copy(comm, c, buf, in.flatten());
    Working w = working_copy(comm, buf, c.acc_f32 && op == ReduceOp::sum);
    const auto m = algo::Members::whole(comm);
    if (!backend_runs(comm, Collective::reduce_scatter, w.buf, op)) {
      run_algorithm(c, Collective::reduce_scatter, c.algorithm.reduce_scatter, comm, m, w.buf, op);
    }
    finish_working(comm, w, buf);
    staging_copy(comm, c, out.flatten(), algo::region(buf, chunk_range(buf.numel(), comm.size(), comm.me())));
    output_ready(comm, out);
  });
}

Work all_gather(const Tensor& out, const Tensor& in, ProcessGroup* group, CollectiveOptions o) {
  const Call c = prologue(Collective::all_gather, {&out, &in}, group, o);
  const int p = c.group.size();
  if (out.numel() != in.numel() * p || in.dtype() != out.dtype()) {
    throw RuntimeError(fmt::format("all_gather on group '{}' ({} ranks): output {} must have {} x {} = {} elements of "
                                   "the input's dtype; input is {}",
                                   c.group.name(), p, out.describe(), p, in.numel(), in.numel() * p, in.describe()));
  }
  const std::string s = sig(in, c);
  return launch(c, "all_gather", s, o.async_op, [in, out, c](Comm& comm) {
    const Tensor flat = out.flatten();
    staging_copy(comm, c, algo::region(flat, chunk_range(flat.numel(), comm.size(), comm.me())), in.flatten());
    const auto m = algo::Members::whole(comm);
    if (!backend_runs(comm, Collective::all_gather, flat))
      run_algorithm(c, Collective::all_gather, c.algorithm.all_gather, comm, m, flat);
    output_ready(comm, out);
  });
}

Work broadcast(const Tensor& t, int root, ProcessGroup* group, CollectiveOptions o) {
  const Call c = prologue(Collective::broadcast, {&t}, group, o);
  const int ri = c.group.index_of(root);
  if (ri < 0) {
    throw RuntimeError(fmt::format("broadcast: root rank {} is not in group '{}' (members: {})", root, c.group.name(),
                                   fmt::join(c.group.ranks(), ", ")));
  }
  const std::string s = sig(t, c, fmt::format("root {}, ", root));
  return launch(
      c, "broadcast", s, o.async_op,
      [t, ri, c](Comm& comm) {
        algo::Members m;
        const int p = comm.size();
        for (int i = 0; i < p; ++i) m.order.push_back((ri + i) % p);
        m.pos = (comm.me() - ri + p) % p;
        const Tensor flat = t.flatten();
        if (!backend_runs(comm, Collective::broadcast, flat, ReduceOp::sum, ri))
          run_algorithm(c, Collective::broadcast, c.algorithm.broadcast, comm, m, flat);
        output_ready(comm, t);
      },
      true);
}

void barrier(ProcessGroup* group) {
  // Dissemination barrier: round k sends to index + 2^k and receives from index - 2^k, so after
  // ceil(log2 p) rounds everyone has heard from everyone.
  Context& ctx = Context::current("barrier");
  const int rank = Context::current_rank("barrier");
  ProcessGroup& g = group ? *group : ctx.world();
  Comm comm(ctx, g, "barrier", "()");
  const sim::Time t0 = ctx.simulator().now();
  const int p = comm.size();
  // The token's value means nothing, but it is written: a memory that checks for uninitialized
  // reads refuses to send bytes nobody wrote.
  Tensor token = ctx.zeros(rank, {1}, DType::f32, "barrier token");
  Tensor in = comm.scratch(1, DType::f32);
  int round = 0;
  for (int d = 1; d < p; d *= 2, ++round) {
    comm.isend((comm.me() + d) % p, token, algo::tag(7, round));
    comm.recv((comm.me() - d + p) % p, in, algo::tag(7, round));
  }
  comm.wait_all();
  ctx.add_comm(rank, ctx.simulator().now() - t0);
}

namespace {
// What send and recv share: the calling rank, the checks, and the pairing of the k-th send from a
// to b with a tag with the k-th recv at b from a with that tag (mailboxes of group -(g+1), sequence k).
struct P2p {
  Context& ctx;
  int rank;
  int src_rank, dst_rank;
  Context::MailKey key;
  std::string what;  // for messages
  sim::Time t0;
  void done() { ctx.add_comm(rank, ctx.simulator().now() - t0); }
};

P2p p2p_begin(const char* what, bool sending, const Tensor& t, int peer, int tag, ProcessGroup* group) {
  Context& ctx = Context::current(what);
  const int rank = Context::current_rank(what);
  ProcessGroup& g = group ? *group : ctx.world();
  ctx.check_owned(t, what);
  if (!g.contains(peer) || peer == rank) {
    throw RuntimeError(fmt::format("{} on rank {}: peer rank {} must be another member of group '{}' (members: {})", what,
                                   rank, peer, g.name(), fmt::join(g.ranks(), ", ")));
  }
  if (t.device() != rank || !t.is_contiguous()) {
    throw RuntimeError(fmt::format("{} on rank {}: tensor {} must be a contiguous tensor of the calling rank", what, rank,
                                   t.describe()));
  }
  const int src = sending ? rank : peer, dst = sending ? peer : rank;
  const int src_i = g.index_of(src), dst_i = g.index_of(dst);
  const std::uint64_t k = ctx.next_p2p(sending, g.id(), src_i, dst_i, tag);
  return P2p{ctx,
             rank,
             src,
             dst,
             Context::MailKey{-1 - g.id(), src_i, dst_i, k, static_cast<std::uint64_t>(tag)},
             fmt::format("send/recv on group '{}' (tag {}, message #{} from rank {} to rank {})", g.name(), tag, k, src,
                         dst),
             ctx.simulator().now()};
}
}  // namespace

void send(const Tensor& t, int dst, int tag, ProcessGroup* group) {
  P2p p = p2p_begin("send", true, t, dst, tag, group);
  Context::Mailbox& mb = p.ctx.join_mailbox(p.key);
  const std::uint64_t generation = mb.generation;
  offer(mb, nullptr, &p.what, p.src_rank, p.dst_rank, t.storage_ptr(), t.byte_offset(), t.nbytes());
  wait_sent(mb, generation);  // the sender's reference went to the transfer
  p.done();
}

void recv(const Tensor& t, int src, int tag, ProcessGroup* group) {
  P2p p = p2p_begin("recv", false, t, src, tag, group);
  Context::Mailbox& mb = p.ctx.join_mailbox(p.key);
  post_into(mb, &p.what, p.src_rank, p.dst_rank, t.storage_ptr(), t.byte_offset(), t.nbytes());
  mb.delivered.wait();
  p.ctx.release_mailbox(mb);
  p.done();
}

}  // namespace cubesim::rt
