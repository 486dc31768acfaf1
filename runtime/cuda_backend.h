// cuda_backend.h — the cuda backend: one rank per GPU, every rank a fiber of one process.
//
// Rank r runs on GPU r, on one stream of its own. Tensors live in device memory from a caching
// allocator (free lists by size class: a freed block is reused by the next allocation of its class
// on that GPU, in stream order). Work is asynchronous: GEMMs (kernels/cuda det_gemm_cuda, exact or
// tensor_core mode), elementwise and row-wise ops (norms, SwiGLU, rotary, embedding, cross-entropy:
// kernels/cuda/rowwise_cuda.h), attention, reductions and copies are enqueued on the rank's stream;
// Storage::read/write (Tensor::to_host_*, from_host_*) synchronise that stream. A copy between
// GPUs is a peer copy on the sender's stream, ordered after the receiver's earlier work and before
// its later work by events, so every later access through the runtime sees the bytes landed.
// Attention (Backend::attention) runs kernels/cuda/attention_cuda.h: the exact kernels (the host's
// bits) with exact GEMMs; with gemm_mode tensor_core, the tensor_core attention (kernels/
// attention_tc.h: FlashAttention-2-style, batch-invariant, within tolerance of f64) wherever the call
// fits it (head_dim 64 or 128, bf16 or f16 operands, 16-byte rows), else the exact kernels.
//
// Collectives, two ways (CudaBackendOptions::collectives):
//   ring  the runtime's own algorithms (ring by default; any Algorithm) over peer copies and
//         reduction kernels with the host's arithmetic: the same chunking, order and roundings as
//         the simulated run, so the bits equal sim's and the host replay's;
//   nccl  NCCL (loaded at run time, runtime/nccl_library.h): once every rank of the group has
//         arrived, the last one issues ncclGroupStart, each rank's call on its communicator and
//         stream, ncclGroupEnd. Communicators come from ncclCommInitAll (one process drives all
//         GPUs). NVLink multicast is kept off (NCCL_NVLS_ENABLE=0).
// With exact GEMMs and ring collectives a tp/ model's outputs and gradients equal the simulated
// run bit for bit; with tensor_core and nccl they agree within tolerance.
//
// Every GEMM and collective is timed with CUDA events on the rank's stream (Backend::
// begin_region/measured_seconds; with ContextOptions::record_ops each OpRecord carries its token).
//
//   auto ctx = make_cuda_context({.world_size = 4, .record_ops = true},
//                                {.gemm_mode = cuda::GemmMode::exact, .collectives = CudaCollectives::ring});
//   ctx->spawn(4, [&](int r) { ... all_reduce(t) ... });
//   for (auto& op : ctx->op_records()) fmt::print("{} {} us\n", op.name, 1e6 * ctx->backend().measured_seconds(op.region));
//
// Errors: fewer GPUs than ranks, or no GPU/driver, throw RuntimeError naming the counts; a failed
// CUDA call throws cuda::CudaError naming the call and cudaGetErrorString; a failed NCCL call
// NcclError naming the call and ncclGetErrorString.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/cuda/det_gemm_cuda.h"
#include "runtime/backend.h"
#include "runtime/context.h"

namespace cubesim::rt {

enum class CudaCollectives { ring, nccl };
std::string_view cuda_collectives_name(CudaCollectives c);  // "ring" / "nccl"
CudaCollectives parse_cuda_collectives(std::string_view s);  // throws RuntimeError listing ring, nccl

struct CudaBackendOptions {
  cuda::GemmMode gemm_mode = cuda::GemmMode::exact;
  CudaCollectives collectives = CudaCollectives::ring;
  bool measure = true;  // CUDA events around every GEMM and collective (held until the backend goes)
  // More ranks than GPUs: rank r on GPU r % GPUs, each rank with its own stream and allocator (for
  // tests of multi-rank code on one GPU; the runtime's collectives only, not NCCL; times shared).
  bool share_gpus = false;
  // The row-wise ops (norms, SwiGLU, rotary, embedding, cross-entropy) on the GPU's kernels
  // (kernels/cuda/rowwise_cuda.h); false: on host values, copied to the host and back (the same bits,
  // slowly: for comparison, bench_rowwise_cuda).
  bool rowwise_kernels = true;
};

// CUDA devices this process sees; 0 when there is no driver or GPU (never throws).
int cuda_device_count();
// Why cuda_device_count() is 0 (the failing call and CUDA's error string); "" when GPUs exist.
std::string cuda_unavailable_reason();

struct CudaAllocatorStats {
  std::uint64_t in_use_bytes = 0;   // handed out (by size class)
  std::uint64_t cached_bytes = 0;   // freed, kept on the free lists
  std::uint64_t device_mallocs = 0; // cudaMalloc calls
  std::uint64_t reuses = 0;         // allocations served from a free list
};

class CudaBackend final : public Backend {
 public:
  // Ranks 0..ranks-1 on GPUs 0..ranks-1 (share_gpus: r % GPUs). Throws RuntimeError when fewer GPUs
  // exist and they are not to be shared.
  CudaBackend(int ranks, CudaBackendOptions opts);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  int ranks() const override;
  std::string describe() const override;
  std::shared_ptr<Storage> allocate(int rank, std::uint64_t bytes, std::string_view what) override;
  void copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n) override;
  bool gemm(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) override;
  bool reduce(const Tensor& dst, const Tensor& src, ReduceOp op) override;
  bool elementwise(const ElementwiseRequest& r) override;
  bool attention(const AttentionRequest& r) override;
  bool rowwise(const RowwiseRequest& r) override;
  std::uint64_t async_begin(int rank) override;
  void async_end(std::uint64_t token) override;
  // CUDA graphs (Backend::graph_begin): the rank's stream records instead of running, and its side
  // stream with it (asynchronous NCCL collectives). Recorded on a one-rank backend only: with several
  // ranks graph_begin returns 0 and says why in the run report (the ring copies between ranks'
  // streams; NCCL collectives in graphs need every member's launch queued before any is waited for,
  // which needs a launch rendezvous, not built). While a rank records, host reads and writes of its
  // tensors, host uploads, checksums and copies between GPUs are refused by name.
  std::uint64_t graph_begin(int rank) override;
  void graph_end(std::uint64_t token) override;
  void graph_launch(std::uint64_t token) override;
  void end_run() override;
  std::vector<std::string> take_notes() override;
  bool collective(const CollectiveRequest& r) override;
  // Checksums on the GPU (kernels/cuda: a device reduction into device slots, one read per step).
  std::shared_ptr<void> checksum_slots(int rank, std::size_t slots) override;
  void checksum(const Tensor& t, std::uint64_t base, void* slots, std::size_t word, std::size_t mix) override;
  void read_checksums(int rank, void* slots, std::uint64_t* out, std::size_t n) override;
  std::uint64_t begin_region(int rank, std::string_view kind) override;
  void end_region(std::uint64_t token) override;
  double measured_seconds(std::uint64_t token) override;
  // A failed run: forget the NCCL rendezvous its collectives left half-joined (a rank that failed
  // before calling one), so the next run's calls with the same numbers do not pair with them, and
  // wait for the work already queued on every GPU.
  void abandon_run() override;
  bool measures_time() const override { return true; }

  const CudaBackendOptions& options() const;
  std::string device_name(int rank) const;  // "NVIDIA H200"
  void synchronize();                       // waits for every rank's stream
  CudaAllocatorStats allocator_stats(int rank) const;
  int nccl_version() const;                 // 0 until NCCL has been loaded

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A context with one rank per GPU; world_size 0 means every visible GPU. Fiber stacks are at least
// 1 MiB (CUDA and NCCL calls run on them).
std::unique_ptr<Context> make_cuda_context(ContextOptions ctx_opts, CudaBackendOptions cuda_opts = {});

}  // namespace cubesim::rt
