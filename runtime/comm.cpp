#include "runtime/comm.h"

#include <cmath>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace cubesim::rt {

namespace {
std::string describe_message(const void* owner);
}  // namespace

Range chunk_range(std::int64_t n, int parts, int i) {
  const std::int64_t base = n / parts, rem = n % parts;
  const std::int64_t begin = i * base + std::min<std::int64_t>(i, rem);
  return Range{begin, base + (i < rem ? 1 : 0)};
}

Comm::Comm(Context& ctx, ProcessGroup& g, const std::string& name, const std::string& signature)
    : ctx_(ctx), group_(g) {
  rank_ = Context::current_rank(name.c_str());
  me_ = g.index_of(rank_);
  if (me_ < 0) {
    throw RuntimeError(fmt::format("{}: rank {} is not a member of group '{}' (members: {})", name, rank_, g.name(),
                                   fmt::join(g.ranks(), ", ")));
  }
  seq_ = g.next_sequence(me_);
  name_ = fmt::format("{} #{} on group '{}'", name, seq_, g.name());
  Context::Pending& p = ctx.pending(g.id(), seq_);
  const std::string mine = fmt::format("{} {}", name, signature);
  if (p.first_index < 0) {
    p.collective = name_;
    p.signature = mine;
    p.first_index = me_;
  } else if (p.signature != mine) {
    throw CollectiveError(fmt::format(
        "mismatched collectives: call #{} on group '{}': rank {} called {} but rank {} called {} (every rank of a group "
        "must issue the same collectives, with the same sizes, dtypes, ops and algorithms, in the same order)",
        seq_, g.name(), rank_, mine, g.rank_at(p.first_index), p.signature));
  }
  p.arrived[static_cast<std::size_t>(me_)] = true;
  idle_.set_detail(
      [](const void* o) {
        const auto* c = static_cast<const Comm*>(o);
        std::string s = fmt::format("{} of {}'s sends in flight", c->outstanding_, c->name_);
        int shown = 0;
        for (const Context::Mailbox* m = c->in_flight_; m != nullptr && shown < 4; m = m->next_sent, ++shown) {
          s += "; " + describe_message(m);
        }
        return s;
      },
      this);
}

Comm::~Comm() {
  // Sends still in flight (a run being unwound) land without telling this Comm.
  for (Context::Mailbox* m = in_flight_; m != nullptr; m = m->next_sent) m->sender = nullptr;
  if (std::uncaught_exceptions() == 0) ctx_.finish_pending(group_.id(), seq_, me_);
}

// ---------------------------------------------------------------- mailboxes

namespace {
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string describe_message(const void* owner) {
  const auto* m = static_cast<const Context::Mailbox*>(owner);
  return fmt::format("a message from rank {} to rank {} in {}: {}", m->src_rank, m->dst_rank,
                     m->what ? *m->what : std::string("?"),
                     m->offered ? (m->posted ? "in flight" : "sent, but the receiver has not posted its receive")
                                : "the receive is posted, but nothing was sent");
}

void reset(Context::Mailbox& m) {
  m.refs = 0;
  ++m.generation;
  m.sender = nullptr;
  m.prev_sent = m.next_sent = nullptr;
  m.delivered.reset();
  m.sent.reset();
  m.landed = false;
  m.what = nullptr;
  m.src_rank = m.dst_rank = -1;
  m.posted = m.offered = false;
  m.dst.reset();
  m.src.reset();
  m.dst_off = m.dst_bytes = m.src_off = m.src_bytes = 0;
  m.delay = 0;
  m.wire = {};
  m.t_start = m.t_end = 0;
}
}  // namespace

Context::Mailbox::Mailbox() {
  delivered.set_detail(&describe_message, this);
  sent.set_detail(&describe_message, this);
}

std::uint64_t Context::MailTable::hash(const MailKey& k) {
  std::uint64_t h = mix((static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.group)) << 32) |
                        static_cast<std::uint32_t>(k.src));
  h = mix(h ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.dst)) << 32) ^ k.seq);
  return mix(h ^ k.tag);
}

std::size_t Context::MailTable::find_slot(const MailKey& k, std::uint64_t h) const {
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = static_cast<std::size_t>(h) & mask;
  while (slots_[i].m != nullptr && !(slots_[i].hash == h && slots_[i].m->key == k)) i = (i + 1) & mask;
  return i;
}

Context::Mailbox& Context::MailTable::join(Context& ctx, const MailKey& k) {
  if (slots_.empty()) slots_.assign(1024, Slot{});
  const std::uint64_t h = hash(k);
  std::size_t i = find_slot(k, h);
  Mailbox* m = slots_[i].m;
  if (m == nullptr) {
    if (2 * (used_ + 1) > slots_.size()) {
      std::vector<Slot> old(2 * slots_.size(), Slot{});
      old.swap(slots_);
      const std::size_t mask = slots_.size() - 1;
      for (const Slot& x : old) {  // keys are distinct: each goes to the first free slot from its home
        if (x.m == nullptr) continue;
        std::size_t j = static_cast<std::size_t>(x.hash) & mask;
        while (slots_[j].m != nullptr) j = (j + 1) & mask;
        slots_[j] = x;
        x.m->slot = j;
      }
      i = find_slot(k, h);
    }
    if (free_.empty()) {
      all_.push_back(std::make_unique<Mailbox>());
      m = all_.back().get();
    } else {
      m = free_.back();
      free_.pop_back();
    }
    m->key = k;
    m->ctx = &ctx;
    m->slot = i;
    slots_[i] = Slot{h, m};
    ++used_;
  }
  ++m->refs;
  return *m;
}

void Context::MailTable::release(Mailbox& m) {
  if (--m.refs > 0) return;
  // Unfile it (linear probing's backward-shift deletion: no tombstones).
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = m.slot;
  slots_[i] = Slot{};
  for (std::size_t j = (i + 1) & mask; slots_[j].m != nullptr; j = (j + 1) & mask) {
    const std::size_t home = static_cast<std::size_t>(slots_[j].hash) & mask;
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    slots_[i].m->slot = i;
    slots_[j] = Slot{};
    i = j;
  }
  --used_;
  reset(m);
  free_.push_back(&m);
}

void Context::MailTable::clear() {
  for (Slot& x : slots_) {
    if (x.m == nullptr) continue;
    reset(*x.m);
    free_.push_back(x.m);
    x = Slot{};
  }
  used_ = 0;
}

namespace {
// The transfer's end: it landed (error null) or failed to start after its delay.
void finish(Context::Mailbox& m, std::exception_ptr error) {
  m.landed = error == nullptr;
  if (m.landed) {
    m.t_end = m.ctx->simulator().now();
    m.delivered.trigger();  // the receiver stays blocked on a failed one and is stopped with the run
  }
  m.src.reset();  // nothing per message outlives it
  m.dst.reset();
  m.sent.trigger();
  if (m.sender) m.sender->send_finished(m, error);
  m.ctx->release_mailbox(m);  // the transfer's reference
}

void landed(void* arg) { finish(*static_cast<Context::Mailbox*>(arg), nullptr); }

void launch(Context::Mailbox& m) {
  m.ctx->backend().start_copy(*m.src, m.src_off, *m.dst, m.dst_off, m.src_bytes, m.wire, hw::OnLanded{&landed, &m});
}

// A protocol's send starts its delay after both sides are there (an event, not a process).
struct DelayedStart {
  Context::Mailbox* m;
  void operator()() const {
    try {
      launch(*m);
    } catch (...) {
      finish(*m, std::current_exception());  // the sender's wait rethrows it
    }
  }
};

// Both sides are there: check the sizes and start the transfer, which takes over the sender's
// reference until it lands.
void start(Context::Mailbox& m) {
  if (m.src_bytes != m.dst_bytes) {
    throw CollectiveError(fmt::format("{}: rank {} sends {} bytes to rank {}, which expects {} (tensor sizes differ "
                                      "between ranks)",
                                      m.what ? *m.what : std::string("a message"), m.src_rank, m.src_bytes, m.dst_rank,
                                      m.dst_bytes));
  }
  Context& ctx = *m.ctx;
  m.t_start = ctx.simulator().now();
  if (m.delay > 0 && ctx.backend().simulates_time()) {
    ctx.simulator().after(m.delay, DelayedStart{&m});
  } else {
    launch(m);
  }
}
// Who the message is between and in which call (for messages; either side may come first).
void name_parties(Context::Mailbox& m, const std::string* what, int src_rank, int dst_rank) {
  if (m.what == nullptr) m.what = what;
  m.src_rank = src_rank;
  m.dst_rank = dst_rank;
}
}  // namespace

void offer(Context::Mailbox& m, Comm* sender, const std::string* what, int src_rank, int dst_rank,
           std::shared_ptr<Storage> src, std::uint64_t src_off, std::uint64_t n, sim::Duration delay,
           hw::WireScale wire) {
  name_parties(m, what, src_rank, dst_rank);
  m.sender = sender;
  m.offered = true;
  m.src = std::move(src);
  m.src_off = src_off;
  m.src_bytes = n;
  m.delay = delay;
  m.wire = wire;
  if (m.posted) start(m);
}

void post_into(Context::Mailbox& m, const std::string* what, int src_rank, int dst_rank, std::shared_ptr<Storage> dst,
               std::uint64_t dst_off, std::uint64_t n) {
  name_parties(m, what, src_rank, dst_rank);
  m.posted = true;
  m.dst = std::move(dst);
  m.dst_off = dst_off;
  m.dst_bytes = n;
  if (m.offered) start(m);
}

void wait_sent(Context::Mailbox& m, std::uint64_t generation) {
  // A later generation: this message landed and its mailbox went back to the pool.
  if (m.generation == generation && !m.landed) m.sent.wait();
}

// ---------------------------------------------------------------- Comm's messages

Comm::Send Comm::isend(int to, const Tensor& region, std::uint64_t tag) { return isend(to, region, tag, 0, {}); }

// Sending and posting never block, and they go deep (the mailbox, then the backend starting the
// transfer): they run on the scheduler's stack (sim::Simulator::off_stack), which stays in the
// cache where a rank's own stack, touched once per step of a collective over thousands of ranks,
// does not. The same calls in the same order: no simulated time or event moves.
Comm::Send Comm::isend(int to, const Tensor& region, std::uint64_t tag, sim::Duration delay, hw::WireScale wire) {
  return ctx_.simulator().off_stack([&] {
    Context::Mailbox& mb = ctx_.join_mailbox(Context::MailKey{group_.id(), me_, to, seq_, tag});
    const Send handle{&mb, mb.generation};
    // In this Comm's list of sends in flight before it can land (a copy may land at once).
    mb.next_sent = in_flight_;
    if (in_flight_) in_flight_->prev_sent = &mb;
    in_flight_ = &mb;
    ++outstanding_;
    offer(mb, this, &name_, rank_, rank_of(to), region.storage_ptr(), region.byte_offset(), region.nbytes(), delay,
          wire);
    return handle;
  });
}

void Comm::send_finished(Context::Mailbox& mb, std::exception_ptr error) {
  if (mb.prev_sent) mb.prev_sent->next_sent = mb.next_sent; else in_flight_ = mb.next_sent;
  if (mb.next_sent) mb.next_sent->prev_sent = mb.prev_sent;
  mb.prev_sent = mb.next_sent = nullptr;
  mb.sender = nullptr;
  if (error && !send_error_) send_error_ = error;
  if (--outstanding_ == 0) idle_.trigger();
}

void Comm::wait(Send& s) {
  // A mailbox used again since (a later generation) was this send's once it had landed.
  if (s.mb != nullptr && s.mb->generation == s.generation && !s.mb->landed) s.mb->sent.wait();
  if (send_error_) std::rethrow_exception(send_error_);
}

void Comm::wait_all() {
  // Another process of this rank (a second tree) may add sends while this one waits.
  while (outstanding_ > 0) {
    if (idle_.triggered()) idle_.reset();
    idle_.wait();
  }
  if (send_error_) std::rethrow_exception(send_error_);
}

Context::Mailbox& Comm::post_to(int from, const Tensor& into, std::uint64_t tag) {
  return *ctx_.simulator().off_stack([&] {
    Context::Mailbox& mb = ctx_.join_mailbox(Context::MailKey{group_.id(), from, me_, seq_, tag});
    post_into(mb, &name_, rank_of(from), rank_, into.storage_ptr(), into.byte_offset(), into.nbytes());
    return &mb;
  });
}

sim::Duration Comm::await_delivery(Context::Mailbox& mb) {
  mb.delivered.wait();
  const sim::Duration streamed = mb.t_end - mb.t_start;
  ctx_.release_mailbox(mb);
  return streamed;
}

void Comm::recv(int from, const Tensor& dst, std::uint64_t tag) { await_delivery(post_to(from, dst, tag)); }

void Comm::recv_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag) {
  Tensor staged = staging(dst.numel(), dst.dtype());
  const sim::Duration streamed = await_delivery(post_to(from, staged, tag));
  reduce_local(dst, staged, op, streamed);
  spare_.push_back(std::move(staged));
}

Tensor Comm::staging(std::int64_t numel, DType dtype) {
  // A staging buffer this collective used before and gave back, else a fresh one: a ring's steps
  // alternate between two chunk sizes, so it allocates two buffers, not one per step.
  for (std::size_t i = 0; i < spare_.size(); ++i) {
    if (spare_[i].numel() == numel && spare_[i].dtype() == dtype) {
      Tensor t = std::move(spare_[i]);
      spare_[i] = std::move(spare_.back());
      spare_.pop_back();
      return t;
    }
  }
  return scratch(numel, dtype);
}

Comm::Posted Comm::post(int from, const Tensor& dst, std::uint64_t tag) {
  return Posted{&post_to(from, dst, tag), dst, Tensor{}, ReduceOp::sum, false};
}

Comm::Posted Comm::post_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag) {
  Posted r{nullptr, dst, staging(dst.numel(), dst.dtype()), op, true};
  r.mb = &post_to(from, r.staged, tag);
  return r;
}

void Comm::complete(Posted& r) {
  const sim::Duration streamed = await_delivery(*r.mb);
  r.mb = nullptr;
  if (r.reduce) {
    reduce_local(r.dst, r.staged, r.op, streamed);
    spare_.push_back(std::move(r.staged));
  }
}

void Comm::reduce_local(const Tensor& dst, const Tensor& src, ReduceOp op, sim::Duration overlapped) {
  Backend& be = ctx_.backend();
  const std::int64_t n = dst.numel();
  const std::uint64_t bytes = dst.nbytes();
  const bool values = !be.timing_only() && n > 0;
  if (values && !(dst.is_contiguous() && src.is_contiguous() && be.reduce(dst, src, op))) {
    void* d = dst.storage().host_ptr();
    void* s = src.storage().host_ptr();
    if (d && s) {
      kernels::reduce_values(static_cast<std::uint8_t*>(d) + dst.byte_offset(), static_cast<std::uint8_t*>(s) + src.byte_offset(),
                    dst.dtype(), n, op);
    } else {
      // Grow-only scratch, reused: fresh large vectors cost a page fault and a zeroed page per 4 KiB.
      static thread_local std::unique_ptr<std::uint8_t[]> buf;
      static thread_local std::uint64_t cap = 0;
      if (cap < 2 * bytes) {
        buf.reset(new std::uint8_t[2 * bytes]);
        cap = 2 * bytes;
      }
      std::uint8_t* a = buf.get();
      std::uint8_t* b = a + bytes;
      dst.storage().read(dst.byte_offset(), a, bytes);
      src.storage().read(src.byte_offset(), b, bytes);
      kernels::reduce_values(a, b, dst.dtype(), n, op);
      dst.storage().write(dst.byte_offset(), a, bytes);
    }
  }
  if (values) {  // on the host or on the device (be.reduce): the step's result is in dst
    be.fault_point(Backend::FaultPoint::reduce, dst);
    if (reduce_tap && *reduce_tap) (*reduce_tap)(src, dst);
  }
  be.charge(rank_, reduce_cost(dst.dtype(), n), overlapped);
}

OpCost reduce_cost(DType dtype, std::int64_t n) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(n) * dtype_size(dtype);
  OpCost c;
  c.kind = OpCost::Kind::reduce;
  c.name = "reduce";
  c.dtype = dtype;
  c.bytes_read = 2 * bytes;
  c.bytes_written = bytes;
  c.flops = static_cast<double>(n);
  return c;
}

void Comm::copy_local(const Tensor& dst, const Tensor& src) {
  ctx_.backend().copy(src.storage(), src.byte_offset(), dst.storage(), dst.byte_offset(), src.nbytes());
}

Tensor Comm::scratch(std::int64_t numel, DType dtype) { return ctx_.empty(rank_, {numel}, dtype, "collective staging"); }

}  // namespace cubesim::rt
