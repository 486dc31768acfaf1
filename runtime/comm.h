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
};

struct Context::Mailbox {
  sim::Event posted{"recv posted"};
  sim::Event delivered{"data delivered"};
  Tensor dst;
  sim::Time t_start = 0, t_end = 0;
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
  std::string plan;          // what the algorithm chose ("nccl ring/Simple x16"), for op records

  struct Send {
    std::shared_ptr<sim::Event> done;
  };
  Send isend(int to, const Tensor& region, std::uint64_t tag);
  // A protocol's send (nccl.h): the transfer starts `delay` after the receiver posted, with `wire`
  // bytes on every link per byte of payload.
  Send isend(int to, const Tensor& region, std::uint64_t tag, sim::Duration delay, hw::WireScale wire);
  void wait(Send& s);
  void wait_all();  // every isend of this Comm so far

  void recv(int from, const Tensor& dst, std::uint64_t tag);
  void recv_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag);

  // A receive posted ahead (a protocol's FIFO slot, nccl.h): post() lets the sender's transfer
  // start; complete() waits for the data and, for a reducing receive, combines it into dst as
  // recv_reduce() does. post + complete = recv / recv_reduce, same bits.
  struct Posted {
    int from = 0;
    std::uint64_t tag = 0;
    Tensor dst, staged;  // staged: the reducing receive's staging buffer
    ReduceOp op = ReduceOp::sum;
    bool reduce = false;
  };
  Posted post(int from, const Tensor& dst, std::uint64_t tag);
  Posted post_reduce(int from, const Tensor& dst, ReduceOp op, std::uint64_t tag);
  void complete(const Posted& r);

  // Local, on this rank: dst = op(dst, src); dst = src (timed device copy).
  void reduce_local(const Tensor& dst, const Tensor& src, ReduceOp op, sim::Duration overlapped = 0);
  void copy_local(const Tensor& dst, const Tensor& src);
  Tensor scratch(std::int64_t numel, DType dtype);

 private:
  Context& ctx_;
  ProcessGroup& group_;
  std::string name_;
  int me_;
  int rank_;
  std::uint64_t seq_;
  std::vector<Send> sends_;
};

// [begin, begin + count) of chunk i when n elements are cut into `parts` chunks: the first n % parts
// chunks hold one element more. Every algorithm that chunks uses this.
struct Range {
  std::int64_t begin;
  std::int64_t count;
};
Range chunk_range(std::int64_t n, int parts, int i);

}  // namespace cubesim::rt
