// backend.h — where a program runs: the one seam between "what it computes" and "where".
//
// Model code (tp/) and the collectives are written once against Context/Tensor; a Backend
// provides storage on each rank, timed movement between ranks, and compute. The backends are the
// rows of the registry (runtime/backend_registry.h; cubesim.backend_info() lists them), e.g. a
// simulated system (sim_backend.h), the host reference (host_backend.h), real GPUs (cuda_backend.h).
// All calls are made from a rank's own process (a fiber), which a timed call blocks.
//
// Hooks a backend may take over (each returns false by default, and the runtime then computes on
// host values through Storage::read/write, which is always correct): gemm, reduce (the combining
// step of the collective algorithms), elementwise (GELU, bias, copies, bias gradient), attention,
// rowwise (norms, SwiGLU, rotary, embedding, cross-entropy) and
// collective (a whole collective, for backends with their own library: NCCL). Backends that measure
// real time bracket each GEMM and collective with begin_region/end_region.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "kernels/accumulator.h"
#include "kernels/attention.h"
#include "kernels/checksum.h"
#include "kernels/elementwise.h"
#include "runtime/collective_types.h"
#include "runtime/fault_replay.h"
#include "runtime/storage.h"
#include "sim/core/simulator.h"
#include "sim/core/time.h"
#include "sim/hw/topology.h"
#include "sim/hw/transfer.h"
#include "sim/hw/unit.h"

namespace cubesim::rt {

class Tensor;
class ProcessGroup;


// What a piece of compute costs, for backends that charge time for work done on host values.
struct OpCost {
  enum class Kind { gemm, reduce, elementwise, copy } kind = Kind::elementwise;
  const char* name = "op";
  std::int64_t m = 0, n = 0, k = 0;  // gemm shape (m x k times k x n)
  DType dtype = DType::f32;          // input dtype (sets the MAC or vector rate)
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  double flops = 0;                  // elementwise/reduce arithmetic, for vector-unit time
  bool kernel = false;               // a kernel of its own (the runtime's ops), not a step inside a collective
};

// One collective as the runtime hands it to a backend that runs whole collectives (cuda + NCCL).
// `buf` is the algorithm's working buffer, flat and contiguous on the calling rank:
//   all_reduce, broadcast  in place;
//   reduce_scatter         p chunks (chunk_range) in; chunk `index` holds the reduction afterwards;
//   all_gather             chunk `index` in; every chunk out.
struct CollectiveRequest {
  enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast };
  Kind kind = Kind::all_reduce;
  const Tensor* buf = nullptr;
  ReduceOp op = ReduceOp::sum;
  int root = 0;  // broadcast: the root's index in the group
  const ProcessGroup* group = nullptr;
  int index = 0;               // the caller's index in the group
  std::uint64_t sequence = 0;  // the group's collective number: equal on every member for one call
  std::string_view name;       // "all_reduce #3 on group 'world'"
  std::uint64_t region = 0;    // the begin_region token of this collective (0: none)
  std::uint64_t async = 0;     // the async_begin token of an asynchronous collective (0: none)
};
std::string_view collective_kind_name(CollectiveRequest::Kind k);

// An elementwise op (runtime/ops.h) for backends that compute where the data lives. Every tensor
// is contiguous and on the calling rank; values follow kernels/elementwise.h and one rounding to
// out's dtype, exactly as the host path computes them.
struct ElementwiseRequest {
  enum class Kind { gelu, gelu_backward, add, add_bias, bias_grad, copy, bias_gelu };
  Kind kind = Kind::copy;
  kernels::GeluKind gelu = kernels::GeluKind::tanh;
  const Tensor* x = nullptr;    // gelu, gelu_backward: x; add: a; add_bias, bias_gelu: x; bias_grad: dy [rows, cols]; copy: src
  const Tensor* y = nullptr;    // gelu_backward: dy; add: b; add_bias, bias_gelu: bias [cols]
  const Tensor* out = nullptr;  // bias_grad: db [cols], summed over rows in ascending order from +0.0f; bias_gelu: gelu(pre)
  const Tensor* pre = nullptr;  // bias_gelu: x + bias rounded to its dtype (may be x)
};

// The row-wise ops of runtime/ops.h (norms, SwiGLU, rotary, the vocabulary's kernels) for backends that
// compute where the data lives. Values follow kernels/norm.h, kernels/elementwise.h, kernels/rotary.h
// and kernels/vocab.h bit for bit (every reduction in their written order). Every tensor is on the
// calling rank, 2-D ones with contiguous columns (rows may be strided), vectors and statistics
// contiguous; runtime/ops.cpp has checked the shapes. Operands by kind (null where a kind has none):
//   rms_norm             x, w -> out (y), rstd                 rms_norm_backward    x, w, dy, rstd -> out (dx), dw
//   layer_norm           x, w, b -> out (y), mean, rstd        layer_norm_backward  x, w, dy, mean, rstd -> out (dx), dw, db
//   swiglu               x -> out (y)                          swiglu_backward      x, dy -> out (dx)
//   rotary               x = out (the fused QKV, in place; shape, rotary_base, inverse)
//   embedding            x (the weight slice), ids, vocab_start -> out
//   embedding_backward   dy, ids, vocab_start -> out (dweight)
//   cross_entropy_max    x (logits) -> out (max)
//   cross_entropy_partials  x (logits), max, ids (targets), vocab_start -> out (partials)
//   cross_entropy_loss   partials, max -> out (loss)
//   cross_entropy_backward  x (logits), max, partials, ids (targets), vocab_start, dy (dloss) -> out (dlogits)
struct RowwiseRequest {
  enum class Kind {
    rms_norm, rms_norm_backward, layer_norm, layer_norm_backward, swiglu, swiglu_backward, rotary, embedding,
    embedding_backward, cross_entropy_max, cross_entropy_partials, cross_entropy_loss, cross_entropy_backward
  };
  Kind kind = Kind::rms_norm;
  const Tensor* x = nullptr;
  const Tensor* w = nullptr;
  const Tensor* b = nullptr;
  const Tensor* dy = nullptr;
  const Tensor* out = nullptr;
  const Tensor* dw = nullptr;
  const Tensor* db = nullptr;
  const Tensor* mean = nullptr;
  const Tensor* rstd = nullptr;
  const Tensor* max = nullptr;
  const Tensor* partials = nullptr;
  float eps = 0;
  std::span<const std::int64_t> ids{};
  std::int64_t vocab_start = 0;
  kernels::AttentionShape shape{};  // rotary
  double rotary_base = 10000.0;
  bool inverse = false;
};

// Attention (runtime/ops.h) for backends that compute where the data lives. Each operand is a
// tensor on the calling rank with contiguous columns, read from column `col` of its rows with the
// given group_stride (kernels/attention.h: 0 heads side by side; Megatron's fused QKV row otherwise).
// Values follow kernels/attention.h bit for bit. backward: dout, dq, dk, dv are set (and written);
// forward: out and stats are written.
struct AttentionRequest {
  struct Operand {
    const Tensor* t = nullptr;
    std::int64_t col = 0;
    std::int64_t group_stride = 0;
  };
  kernels::AttentionShape shape;
  bool backward = false;
  Operand q, k, v, out, dout, dq, dk, dv;
  const Tensor* stats = nullptr;
  std::span<const std::int64_t> kv_valid;  // per sequence, its real tokens (right padding); empty: none
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Called once by the Context with its scheduler, before any other call.
  virtual void attach(sim::Simulator& sim) {}
  // The backend's name in the registry (runtime/backend_registry.h): "sim", "host", "cuda".
  virtual std::string_view name() const = 0;
  // True for the reference (the host): a run on it is its own replay.
  virtual bool reference() const { return false; }
  // The system a simulating backend runs (null for the others).
  virtual const hw::Topology* topology() const { return nullptr; }
  virtual int ranks() const = 0;  // devices available (cubes, GPUs, or any number on the host)
  // The device rank r runs on (sim: the cube its tensors, GEMMs and transfers use; rank r on
  // cube r unless the backend was given a placement).
  virtual int device_of(int rank) const { return rank; }
  virtual std::string describe() const = 0;

  // Device memory on `rank`. Throws (out of memory with the allocator's statistics) naming `what`.
  virtual std::shared_ptr<Storage> allocate(int rank, std::uint64_t bytes, std::string_view what) = 0;

  // Moves n bytes between any two storages (a device-to-device transfer), blocking the calling
  // process until they have landed. Timing-only backends move no values.
  virtual void copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off,
                    std::uint64_t n) = 0;

  // Starts moving n bytes as copy() does, with `wire` bytes on every link per byte of payload (a
  // protocol's flags, hw::WireScale), and returns without blocking; `landed` is called once they have landed, from an
  // event of the backend's or, when the copy is done at once, before start_copy returns. The
  // runtime's messages use it, so that no process waits on each message. A copy that cannot start
  // (a hazard, an unwritten source) throws here. The default copies at once: backends without
  // simulated time.
  virtual void start_copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off,
                          std::uint64_t n, hw::WireScale wire, hw::OnLanded landed) {
    copy(src, src_off, dst, dst_off, n);
    if (landed.fn) landed.fn(landed.arg);
  }
  // Whether the backend keeps simulated time (sim): delays and protocol latencies take effect.
  virtual bool simulates_time() const { return false; }
  // A fixed latency on `rank`'s timeline (blocks the calling process for d); `what` says what it
  // stands for. Nothing on backends without simulated time.
  virtual void delay(int rank, sim::Duration d, std::string_view what) {}

  // Charges the simulated time of work that the runtime computed on host values, on `rank`
  // (blocks the calling process for it). `overlapped_with` is time already spent that the work
  // streamed alongside (a reduction fused with the receive that delivered its data): only the
  // excess is charged.
  virtual void charge(int rank, const OpCost& cost, sim::Duration overlapped_with = 0) {}
  // The time charge() would take for `cost` on `rank` with nothing overlapped (blocks nothing).
  virtual sim::Duration charge_time(int rank, const OpCost& cost) const { return 0; }

  // Runs c = a·b (+ bias) itself — values and time, on the calling rank — and returns true; or
  // returns false, and the runtime computes it on the host and charge()s it. (2-D views.)
  virtual bool gemm(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) {
    return false;
  }

  // dst = op(dst, src) with kernels::reduce_values' arithmetic (kernels/reduce.h), on the calling rank; both
  // contiguous, same dtype and size. false: the runtime computes it on host values.
  virtual bool reduce(const Tensor& dst, const Tensor& src, ReduceOp op) { return false; }

  // Computes the op where the data lives and returns true, or returns false (host values).
  virtual bool elementwise(const ElementwiseRequest& r) { return false; }
  virtual bool attention(const AttentionRequest& r) { return false; }
  virtual bool rowwise(const RowwiseRequest& r) { return false; }

  // Runs the whole collective (values, on every member once all have called) and returns true; or
  // false, and the runtime runs the selected algorithm over Comm (copy + reduce).
  virtual bool collective(const CollectiveRequest& r) { return false; }

  // Checksums where the data lives (runtime/checksum.h), for backends that compute them on their
  // device: checksum_slots() makes `slots` zeroed 64-bit slots on `rank` (null: the runtime computes
  // on host values and charge()s the time), checksum() takes t's word sum into slot `word` and its mix
  // sum into slot `mix` in one pass over t (either may be kNoSlot: not taken; t is on the calling rank),
  // read_checksums() copies all of them to the host in one read.
  static constexpr std::size_t kNoSlot = ~std::size_t{0};
  virtual std::shared_ptr<void> checksum_slots(int rank, std::size_t slots) { return nullptr; }
  virtual void checksum(const Tensor& t, std::uint64_t base, void* slots, std::size_t word, std::size_t mix) {}
  virtual void read_checksums(int rank, void* slots, std::uint64_t* out, std::size_t n) {}

  // A logical point where a fault may strike (hw::FaultSpec's sites gemm_tile, reduce and link): the
  // runtime calls it after a GEMM wrote its output `t`, after a reduction step wrote `t`, and when a
  // collective's result `t` is complete on its rank. The simulator
  // passes reductions to its fault injector (its GEMM tiles reach it from the PEs); other backends
  // replay the specs armed in fault_replay() here, changing bits of t where it lives (device memory).
  using FaultPoint = rt::FaultPoint;
  virtual void fault_point(FaultPoint p, const Tensor& t) {
    if (replay_.armed()) replay_.on_point(p, t);
  }
  // The accumulator model of the GEMMs this backend computes on host values (kernels/accumulator.h:
  // the host and sim backends' `gemm_numerics` option; f32_fma_seq is the numerics contract).
  kernels::AccumulatorModel gemm_numerics() const { return gemm_numerics_; }
  void set_gemm_numerics(kernels::AccumulatorModel m) { gemm_numerics_ = m; }

  // The fault specs replayed at those points (runtime/fault_replay.h); null on a backend that injects
  // faults into a simulated system of its own (sim: SimBackend::system().faults()).
  virtual FaultReplay* fault_replay() { return &replay_; }

  // Whether begin_region/end_region measure real time (backends on hardware: cuda).
  virtual bool measures_time() const { return false; }
  // Real-time measurement of one GEMM or collective on `rank` ("gemm", "collective"), for backends
  // on hardware: begin returns a token (0: not measured), end closes it, and measured_seconds gives
  // its duration once the spawn() that ran it has returned (negative when not measured).
  virtual std::uint64_t begin_region(int rank, std::string_view kind) { return 0; }
  // An asynchronous collective (async_op) on a backend with streams: async_begin is called by the
  // launching process where the collective's input is ready in the rank's order of work, and its token
  // reaches collective() (CollectiveRequest::async), which may then run it beside the rank's later
  // work (a side stream, as Megatron overlaps the column layer's input-gradient all-reduce with the
  // weight-gradient GEMM); Work::wait() calls async_end, after which the rank's work waits for it.
  // Tokens count from 1; 0 and the defaults: the collective is ordered where it runs.
  virtual std::uint64_t async_begin(int rank) { return 0; }
  virtual void async_end(std::uint64_t token) {}
  // Graphs, on a backend whose work is queued (cuda: CUDA graphs): graph_begin(rank) starts recording
  // the work the rank then issues instead of running it, graph_end(token) ends the recording, and
  // graph_launch(token) runs what was recorded, again each time, on the same tensors (the recording's
  // own tensors are held until the run ends; those made before it must outlive its launches). A graph
  // lives until its run (Context::spawn) ends. graph_begin returns 0 where the backend records no
  // graph (every default, and cuda where it cannot): the caller then runs the work itself.
  virtual std::uint64_t graph_begin(int rank) { return 0; }
  virtual void graph_end(std::uint64_t token) {}
  virtual void graph_launch(std::uint64_t token) {}
  // Expires with the backend (a Work that outlives its context must not call it).
  std::weak_ptr<const void> lifetime() const { return alive_; }
  virtual void end_region(std::uint64_t token) {}
  virtual double measured_seconds(std::uint64_t token) { return -1; }

  // Whether values are skipped (sweeps of large systems): compute and copies move no bytes, and
  // timing is identical.
  virtual bool timing_only() const { return false; }

  // The hardware units the backend simulates and their counters so far (hw::System::units(),
  // counters()); none on backends that simulate no hardware.
  virtual std::shared_ptr<const std::vector<hw::UnitInfo>> units() const { return nullptr; }
  virtual std::vector<hw::UnitCounters> counters() const { return {}; }
  // Names the trace tracks of the hardware the first `ranks` ranks run on (hw::System::declare_tracks).
  virtual void declare_tracks(int ranks) {}
  // The rank a helper process the backend's own code spawned (no rank slot: a PE of a simulated
  // GEMM) works for, from its name; -1 when unknown. Failure reports name that rank.
  virtual int rank_of_helper(std::string_view process_name) const { return -1; }
  // A run failed and its processes were unwound: drop what it left in flight (transfers that will
  // never land), so the next run starts from a usable state.
  virtual void abandon_run() {}
  // A run ended with every rank returned: what it left running beside the ranks' work (an
  // asynchronous collective nobody waited for) is ordered before the next run's work.
  virtual void end_run() {}
  // What the backend has to say about the run that just ended, each thing once (a slower path it
  // took, and why: "column fprop: A [...] is f32: ... repacked first (5 calls)"), then forgotten.
  // Context::spawn puts them in RunReport::notes.
  virtual std::vector<std::string> take_notes() { return {}; }

 private:
  std::shared_ptr<const void> alive_ = std::make_shared<int>(0);
  FaultReplay replay_;
  kernels::AccumulatorModel gemm_numerics_ = kernels::AccumulatorModel::f32_fma_seq;
};

}  // namespace cubesim::rt
