#include "runtime/comm.h"

#include <cmath>
#include <exception>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace cubesim::rt {

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
}

Comm::~Comm() {
  if (std::uncaught_exceptions() == 0) ctx_.finish_pending(group_.id(), seq_, me_);
}

Comm::Send Comm::isend(int to, const Tensor& region, std::uint64_t tag) { return isend(to, region, tag, 0, {}); }

Comm::Send Comm::isend(int to, const Tensor& region, std::uint64_t tag, sim::Duration delay, hw::WireScale wire) {
  auto done = std::make_shared<sim::Event>("send done");  // the sending process's name says who and where
  const int gid = group_.id();
  const std::uint64_t seq = seq_;
  const int me = me_;
  Context* ctx = &ctx_;
  const std::string name = name_;
  const int to_rank = rank_of(to);
  ctx_.spawn_for_rank(rank_, fmt::format("rank{}/send->{}", rank_, to_rank), [=] {
    Context::Mailbox& mb = ctx->mailbox(gid, seq, me, to, tag);
    mb.posted.wait();
    if (mb.dst.nbytes() != region.nbytes()) {
      throw CollectiveError(fmt::format("{}: rank {} sends {} bytes to rank {}, which expects {} (tensor sizes differ "
                                        "between ranks)",
                                        name, Context::current_rank("send"), region.nbytes(), to_rank, mb.dst.nbytes()));
    }
    mb.t_start = ctx->simulator().now();
    if (delay == 0 && wire.identity()) {
      ctx->backend().copy(region.storage(), region.byte_offset(), mb.dst.storage(), mb.dst.byte_offset(), region.nbytes());
    } else {
      ctx->backend().protocol_copy(region.storage(), region.byte_offset(), mb.dst.storage(), mb.dst.byte_offset(),
                                   region.nbytes(), delay, wire);
    }
    mb.t_end = ctx->simulator().now();
    mb.delivered.trigger();
    done->trigger();
  });
  sends_.push_back(Send{done});
  return sends_.back();
}

void Comm::wait(Send& s) { s.done->wait(); }

void Comm::wait_all() {
  // By index, holding each handle: another process of this rank (a second tree) may add sends
  // while this one waits.
  for (std::size_t i = 0; i < sends_.size(); ++i) {
    std::shared_ptr<sim::Event> e = sends_[i].done;
    e->wait();
  }
  sends_.clear();
}

void Comm::recv(int from, const Tensor& dst, std::uint64_t tag) {
  Context::Mailbox& mb = ctx_.mailbox(group_.id(), seq_, from, me_, tag);
  mb.dst = dst;
  mb.posted.trigger();
  mb.delivered.wait();
  ctx_.drop_mailbox(group_.id(), seq_, from, me_, tag);
}

void Comm::recv_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag) {
  Tensor staged = scratch(dst.numel(), dst.dtype());
  Context::Mailbox& mb = ctx_.mailbox(group_.id(), seq_, from, me_, tag);
  mb.dst = staged;
  mb.posted.trigger();
  mb.delivered.wait();
  const sim::Duration streamed = mb.t_end - mb.t_start;
  ctx_.drop_mailbox(group_.id(), seq_, from, me_, tag);
  reduce_local(dst, staged, op, streamed);
}

Comm::Posted Comm::post(int from, const Tensor& dst, std::uint64_t tag) {
  Context::Mailbox& mb = ctx_.mailbox(group_.id(), seq_, from, me_, tag);
  mb.dst = dst;
  mb.posted.trigger();
  return Posted{from, tag, dst, Tensor{}, ReduceOp::sum, false};
}

Comm::Posted Comm::post_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag) {
  Posted r{from, tag, dst, scratch(dst.numel(), dst.dtype()), op, true};
  Context::Mailbox& mb = ctx_.mailbox(group_.id(), seq_, from, me_, tag);
  mb.dst = r.staged;
  mb.posted.trigger();
  return r;
}

void Comm::complete(const Posted& r) {
  Context::Mailbox& mb = ctx_.mailbox(group_.id(), seq_, r.from, me_, r.tag);
  mb.delivered.wait();
  const sim::Duration streamed = mb.t_end - mb.t_start;
  ctx_.drop_mailbox(group_.id(), seq_, r.from, me_, r.tag);
  if (r.reduce) reduce_local(r.dst, r.staged, r.op, streamed);
}

void Comm::reduce_local(const Tensor& dst, const Tensor& src, ReduceOp op, sim::Duration overlapped) {
  Backend& be = ctx_.backend();
  const std::int64_t n = dst.numel();
  const std::uint64_t bytes = dst.nbytes();
  if (!be.timing_only() && n > 0 && !(dst.is_contiguous() && src.is_contiguous() && be.reduce(dst, src, op))) {
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
  OpCost c;
  c.kind = OpCost::Kind::reduce;
  c.name = "reduce";
  c.dtype = dst.dtype();
  c.bytes_read = 2 * bytes;
  c.bytes_written = bytes;
  c.flops = static_cast<double>(n);
  be.charge(rank_, c, overlapped);
}

void Comm::copy_local(const Tensor& dst, const Tensor& src) {
  ctx_.backend().copy(src.storage(), src.byte_offset(), dst.storage(), dst.byte_offset(), src.nbytes());
}

Tensor Comm::scratch(std::int64_t numel, DType dtype) { return ctx_.empty(rank_, {numel}, dtype, "collective staging"); }

}  // namespace cubesim::rt
