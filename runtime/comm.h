// comm.h — point-to-point messaging between the members of a group, for collective algorithms
// (internal to the runtime).
//
// A Comm is one rank's view of one collective call. Algorithms are written as per-rank code over
// it: isend() a contiguous region to a member, recv() straight into a region, or recv_reduce()
// into a staging buffer that is then combined into a region (dst = op(dst, staged), one rounding
// per step in the region's dtype). The receiver posts where the bytes go; the sender's transfer
// (a helper process, so isend returns at once) writes there and signals delivery. Because the
// same per-rank code runs on every backend, a host run replays a simulated run's order exactly.
//
// A reduction is modelled as streaming with the receive that delivers its data (as NCCL reduces
// in registers while data arrives): only the time by which it exceeds the transfer is charged.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "sim/core/event.h"

namespace cubesim::rt {

struct Context::Pending {
  std::string collective;      // "all_reduce #3 on group 'world'"
  std::string signature;       // what the first arriving rank asked for
  int first_index = -1;
  std::vector<bool> arrived;
  std::vector<bool> finished;
  int finished_count = 0;
  // The call's rings run by callbacks (algorithms/ring_callbacks.h), shared by its ranks.
  std::vector<std::shared_ptr<void>> runs;
};

// One message: the k-th send from one member to another with one tag in one collective (or
// point-to-point call), filed in the Context's MailTable under its MailKey. Whichever side comes
// second starts the transfer (Backend::start_copy): no process per message. Pooled: a mailbox
// goes back to the table's pool once the receiver has its data, the sender has waited and the
// transfer has landed (refs counts those still holding it).
class Comm;

struct Context::MailKey {
  int group = 0;  // the group's id, or -(id + 1) for point-to-point messages
  int src = 0, dst = 0;  // indices in the group
  std::uint64_t seq = 0;  // the collective's number (point to point: the message's)
  std::uint64_t tag = 0;
  bool operator==(const MailKey&) const = default;
};

struct Context::Mailbox {
  Mailbox();
  MailKey key;
  // Who still needs it filed: the receiver until it has its data, the sender until its transfer
  // starts, then the transfer until it lands.
  int refs = 0;
  std::size_t slot = 0;  // its slot in the table while filed
  std::uint64_t generation = 0;  // counts its uses: a Send handle of an earlier use sees it landed
  Context* ctx = nullptr;
  Comm* sender = nullptr;  // told when the transfer lands (or fails); null once that Comm is gone
  Mailbox* prev_sent = nullptr;  // in the sender's list of its sends in flight
  Mailbox* next_sent = nullptr;
  sim::Event delivered{"message delivered"};  // the receiver waits: the bytes have landed
  sim::Event sent{"message sent"};            // the sender's wait(): landed, or failed
  bool landed = false;
  const std::string* what = nullptr;          // "all_reduce #3 on group 'world'", for messages
  int src_rank = -1, dst_rank = -1;
  // The receiver's side, once posted.
  bool posted = false;
  std::shared_ptr<Storage> dst;
  std::uint64_t dst_off = 0, dst_bytes = 0;
  // The sender's side, once sent.
  bool offered = false;
  std::shared_ptr<Storage> src;
  std::uint64_t src_off = 0, src_bytes = 0;
  sim::Duration delay = 0;  // the transfer starts this long after both sides are there
  hw::WireScale wire;
  sim::Time t_start = 0, t_end = 0;  // both sides there; landed
};

// The mailboxes of the messages in flight: open addressing on the MailKey, mailboxes from a pool.
class Context::MailTable {
 public:
  MailTable() = default;
  MailTable(const MailTable&) = delete;
  MailTable& operator=(const MailTable&) = delete;
  // The mailbox filed under k, made if there is none; the caller holds one more reference.
  Mailbox& join(Context& ctx, const MailKey& k);
  // Drops one reference; the last one unfiles the mailbox and returns it to the pool.
  void release(Mailbox& m);
  void clear();  // every mailbox back to the pool (a new run)
  std::size_t size() const { return used_; }
  std::size_t made() const { return all_.size(); }

 private:
  static std::uint64_t hash(const MailKey& k);
  // k's slot, or the empty slot where it would go; h = hash(k).
  std::size_t find_slot(const MailKey& k, std::uint64_t h) const;
  // Power-of-two size, linear probing, at most half full. A slot keeps its mailbox's hash, so a probe
  // reads a mailbox only when the hash matches, and moving an entry needs no rehash.
  struct Slot {
    std::uint64_t hash = 0;
    Mailbox* m = nullptr;
  };
  std::vector<Slot> slots_;
  std::size_t used_ = 0;
  std::vector<std::unique_ptr<Mailbox>> all_;
  std::vector<Mailbox*> free_;
};

class Comm {
 public:
  // Registers this rank's arrival at the group's next collective and checks that its signature
  // matches the other ranks' (CollectiveError naming both otherwise).
  Comm(Context& ctx, ProcessGroup& g, const std::string& name, const std::string& signature);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int size() const { return group_.size(); }
  int me() const { return me_; }
  int rank() const { return rank_; }
  int rank_of(int index) const { return group_.rank_at(index); }
  Context& context() { return ctx_; }
  const std::string& name() const { return name_; }
  ProcessGroup& group() const { return group_; }
  std::uint64_t sequence() const { return seq_; }  // the group's collective number, equal on every member

  std::uint64_t region = 0;  // the backend's begin_region token for this collective (0: none)
  std::uint64_t async = 0;   // the backend's async_begin token when launched asynchronously (0: none)
  std::string plan;          // what the algorithm chose ("nccl ring/Simple x16"), for op records
  const ReduceTap* reduce_tap = nullptr;  // CollectiveOptions::reduce_tap: told after each reduce_local

  // A send of this Comm, for wait(): its message's mailbox in the use it had then.
  struct Send {
    Context::Mailbox* mb = nullptr;
    std::uint64_t generation = 0;
  };
  Send isend(int to, const Tensor& region, std::uint64_t tag);
  // A protocol's send (nccl.h): the transfer starts `delay` after the receiver posted, with `wire`
  // bytes on every link per byte of payload.
  Send isend(int to, const Tensor& region, std::uint64_t tag, sim::Duration delay, hw::WireScale wire);
  void wait(Send& s);
  void wait_all();  // every isend of this Comm so far
  // The message plumbing's report that one of this Comm's sends landed (error: it failed to start).
  void send_finished(Context::Mailbox& mb, std::exception_ptr error);

  void recv(int from, const Tensor& dst, std::uint64_t tag);
  void recv_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag);

  // A receive posted ahead (a protocol's FIFO slot, nccl.h): post() lets the sender's transfer
  // start; complete() waits for the data and, for a reducing receive, combines it into dst as
  // recv_reduce() does. post + complete = recv / recv_reduce, same bits.
  struct Posted {
    Context::Mailbox* mb = nullptr;
    Tensor dst, staged;  // staged: the reducing receive's staging buffer
    ReduceOp op = ReduceOp::sum;
    bool reduce = false;
  };
  Posted post(int from, const Tensor& dst, std::uint64_t tag);
  Posted post_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag);
  void complete(Posted& r);  // once: the staging buffer goes back to this Comm

  // Local, on this rank: dst = op(dst, src); dst = src (timed device copy).
  void reduce_local(const Tensor& dst, const Tensor& src, ReduceOp op, sim::Duration overlapped = 0);
  void copy_local(const Tensor& dst, const Tensor& src);
  Tensor scratch(std::int64_t numel, DType dtype);
  // A reducing receive's staging buffer: one given back earlier in this collective, or scratch().
  Tensor staging(std::int64_t numel, DType dtype);
  // Gives a staging buffer back for later staging() calls (freed with this Comm).
  void keep_staging(Tensor t) { spare_.push_back(std::move(t)); }

 private:
  Context& ctx_;
  ProcessGroup& group_;
  std::string name_;
  int me_;
  int rank_;
  std::uint64_t seq_;
  // The sends in flight (an intrusive list through their mailboxes: nothing per message lives
  // here once it has landed), how many, and what wait_all() waits on.
  // A receive from `from` into `into`, posted (its mailbox joined); then its data awaited and the
  // mailbox released, giving the time the transfer streamed (for the reduction it overlaps).
  Context::Mailbox& post_to(int from, const Tensor& into, std::uint64_t tag);
  sim::Duration await_delivery(Context::Mailbox& mb);

  std::vector<Tensor> spare_;  // staging buffers given back (staging())
  Context::Mailbox* in_flight_ = nullptr;
  int outstanding_ = 0;
  sim::Event idle_{"sends landed"};
  std::exception_ptr send_error_;
};

// What one reduction step of n elements (dst = op(dst, src)) costs: read both, write one.
OpCost reduce_cost(DType dtype, std::int64_t n);

// Message plumbing the collectives and point-to-point calls share (comm.cpp). The calling process
// is a rank's; `what` names the call for messages and outlives the message.
// The sender's side: offers n bytes of src; starts the transfer if the receiver has posted. The
// sender's reference passes to the transfer; `sender` (if any) hears when it lands.
void offer(Context::Mailbox& mb, Comm* sender, const std::string* what, int src_rank, int dst_rank,
           std::shared_ptr<Storage> src, std::uint64_t src_off, std::uint64_t n, sim::Duration delay = 0,
           hw::WireScale wire = {});
// The receiver's side: posts where the bytes go; starts the transfer if the sender has offered.
void post_into(Context::Mailbox& mb, const std::string* what, int src_rank, int dst_rank, std::shared_ptr<Storage> dst,
               std::uint64_t dst_off, std::uint64_t n);
// A sender without a Comm (point to point) waits until its bytes have landed: `generation` is the
// mailbox's before offer().
void wait_sent(Context::Mailbox& mb, std::uint64_t generation);

// [begin, begin + count) of chunk i when n elements are cut into `parts` chunks: the first n % parts
// chunks hold one element more. Every algorithm that chunks uses this.
struct Range {
  std::int64_t begin;
  std::int64_t count;
};
Range chunk_range(std::int64_t n, int parts, int i);

}  // namespace cubesim::rt
