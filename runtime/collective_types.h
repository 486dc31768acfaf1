// collective_types.h — the vocabulary of collectives: reduce ops, algorithms, per-call options,
// and the async handle.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "kernels/reduce.h"

namespace cubesim::sim {
class Event;
}

namespace cubesim::rt {

class Tensor;
class Backend;

// Told after each reduction step a collective's algorithm runs on the calling rank, in the rank's
// order of steps: `received` the chunk that arrived, `reduced` the destination after the step.
using ReduceTap = std::function<void(const Tensor& received, const Tensor& reduced)>;

// The reduce ops and their arithmetic live with the kernels (kernels/reduce.h).
using kernels::ReduceOp;
using kernels::reduce_op_name;
using kernels::parse_reduce_op;

// How a collective moves and combines data. Each has a row in runtime/algorithms/table.h (its
// name, the collectives it does) and a header there documenting its chunking and reduction order;
// the simulated data path follows it exactly, so a host run of the same algorithm gives the same bits.
enum class Algorithm { ring, direct, tree, halving_doubling, hierarchical, nccl };
std::string_view algorithm_name(Algorithm a);
Algorithm parse_algorithm(std::string_view s);  // throws RuntimeError listing the valid names

struct CollectiveOptions {
  std::optional<Algorithm> algorithm = {}; // default: the group's, else the context's
  std::optional<bool> accumulate_f32 = {}; // carry bf16/f16 partial sums in f32 (one rounding at the end)
  int hierarchy = 0;                       // hierarchical: ranks per inner group (0: context default)
  bool async_op = false;                   // return at once; Work::wait() blocks until done
  // Checks inside a reduction chain (sdc's tensor-parallel mode): called with values only, and not
  // when the backend runs the whole collective itself (NCCL on cuda). Every reduce step the
  // algorithm runs reaches it: on the f32 working copy with accumulate_f32, per slice where an
  // algorithm slices (tree, nccl). Must outlive the collective.
  const ReduceTap* reduce_tap = nullptr;
};

// The handle of a collective. A synchronous call returns a completed one.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<sim::Event> done) : done_(std::move(done)) {}
  // An asynchronous collective a backend runs beside the rank's later work (Backend::async_begin).
  Work(std::shared_ptr<sim::Event> done, Backend* be, std::uint64_t async);
  void wait();                 // blocks the calling process until the collective finished
  bool is_completed() const;

 private:
  std::shared_ptr<sim::Event> done_;
  Backend* be_ = nullptr;      // with async_: told at wait() (Backend::async_end) while alive_ lasts
  std::weak_ptr<const void> alive_;
  std::uint64_t async_ = 0;
};

}  // namespace cubesim::rt
