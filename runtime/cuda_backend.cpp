#include "runtime/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/cuda/rowwise_cuda.h"
#include "kernels/rotary.h"
#include "runtime/backend_info.h"
#include "runtime/errors.h"
#include "runtime/nccl_library.h"
#include "runtime/process_group.h"
#include "runtime/tensor.h"
#include "sim/core/event.h"
#include "sim/hw/errors.h"

namespace cubesim::rt {

std::string_view cuda_collectives_name(CudaCollectives c) { return c == CudaCollectives::ring ? "ring" : "nccl"; }

CudaCollectives parse_cuda_collectives(std::string_view s) {
  if (s == "ring" || s == "deterministic") return CudaCollectives::ring;
  if (s == "nccl") return CudaCollectives::nccl;
  throw RuntimeError(fmt::format("unknown cuda collectives '{}': valid are ring (deterministic, bitwise equal to the "
                                 "simulator) and nccl",
                                 s));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return n == 0 ? "cudaGetDeviceCount reports 0 devices" : "";
}

namespace {

// Size classes: powers of two up to 1 MiB (at least 512 B), above that multiples of an eighth of
// the next power of two (at most 12.5% slack).
std::uint64_t size_class(std::uint64_t n) {
  n = std::max<std::uint64_t>(n, 1);
  const std::uint64_t p = std::bit_ceil(n);
  if (p <= (1u << 20)) return std::max<std::uint64_t>(p, 512);
  const std::uint64_t step = p / 8;
  return (n + step - 1) / step * step;
}

// One GPU: its stream, an event for ordering other streams against it, and its allocator. Shared
// by the backend and every storage on it, so storages may outlive the backend.
struct Device {
  int id = 0;
  std::string name;
  cudaStream_t stream = nullptr;
  cudaStream_t side = nullptr;  // asynchronous NCCL collectives, beside the stream (async_begin)
  cudaEvent_t order = nullptr;
  std::map<std::uint64_t, std::vector<void*>> free;
  CudaAllocatorStats stats;
  std::uint64_t recording = 0;  // the graph token whose recording the stream is in (graph_begin); 0: none

  // What the host cannot do while the stream records a graph (it would run now, not in the graph).
  void refuse_while_recording(int rank, std::string_view what) const {
    if (recording == 0) return;
    throw RuntimeError(fmt::format(
        "{} on rank {} (GPU {}) while the rank's work is recorded into a CUDA graph (graph {}, graph_begin): host "
        "reads and writes, copies between GPUs and checksums cannot be part of a graph; do it before graph_begin or "
        "after graph_end",
        what, rank, id, recording));
  }
  // A timing event: inside a recording it becomes the graph's own node, recorded at each launch.
  void record_timing(cudaEvent_t ev, cudaStream_t s) const {
    if (recording) {
      CUBESIM_CUDA_CHECK(cudaEventRecordWithFlags(ev, s, cudaEventRecordExternal));
    } else {
      CUBESIM_CUDA_CHECK(cudaEventRecord(ev, s));
    }
  }

  Device(int id_) : id(id_) {
    CUBESIM_CUDA_CHECK(cudaSetDevice(id));
    cudaDeviceProp prop{};
    CUBESIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, id));
    name = prop.name;
    CUBESIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUBESIM_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CUBESIM_CUDA_CHECK(cudaEventCreateWithFlags(&order, cudaEventDisableTiming));
  }
  ~Device() {
    // No throwing here: a failed teardown after a CUDA error must not terminate the process.
    cudaSetDevice(id);
    cudaStreamSynchronize(side);
    cudaStreamSynchronize(stream);
    for (auto& [cls, blocks] : free) {
      for (void* p : blocks) cudaFree(p);
    }
    cudaEventDestroy(order);
    cudaStreamDestroy(side);
    cudaStreamDestroy(stream);
    cudaGetLastError();
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  void use() const { CUBESIM_CUDA_CHECK(cudaSetDevice(id)); }

  void* allocate(std::uint64_t cls, int rank, std::string_view what) {
    auto it = free.find(cls);
    if (it != free.end() && !it->second.empty()) {
      // Reuse in stream order: every earlier use of the block was on this stream or ordered
      // before this stream's later work (copies into it wait on this stream's order event).
      void* p = it->second.back();
      it->second.pop_back();
      stats.cached_bytes -= cls;
      stats.in_use_bytes += cls;
      ++stats.reuses;
      return p;
    }
    use();
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation && !recording) {  // (trim waits for the stream: not while recording)
      cudaGetLastError();
      trim();  // give the cache back and try once more
      e = cudaMalloc(&p, cls);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t fr = 0, total = 0;
      cudaMemGetInfo(&fr, &total);
      cudaGetLastError();
      const std::string msg = fmt::format(
          "allocation '{}' of {} bytes on rank {} ({}, GPU {}): cudaMalloc failed: {} ({}); the allocator holds {} "
          "bytes in use and {} cached; the GPU has {} of {} bytes free{}",
          what, cls, rank, name, id, cudaGetErrorName(e), cudaGetErrorString(e), stats.in_use_bytes,
          stats.cached_bytes, fr, total,
          recording ? fmt::format(" (while recording graph {}: its tensors are all held until the run ends, and the "
                                  "cache is not given back meanwhile)", recording)
                    : std::string());
      // Out of memory is the same error as a simulated memory's (Python: cubesim.OutOfMemoryError).
      if (e == cudaErrorMemoryAllocation) throw hw::OutOfMemoryError(msg);
      throw RuntimeError(msg);
    }
    ++stats.device_mallocs;
    stats.in_use_bytes += cls;
    return p;
  }

  void release(void* p, std::uint64_t cls) {
    free[cls].push_back(p);
    stats.in_use_bytes -= cls;
    stats.cached_bytes += cls;
  }

  void trim() {
    cudaSetDevice(id);
    cudaStreamSynchronize(stream);
    for (auto& [cls, blocks] : free) {
      for (void* p : blocks) cudaFree(p);
      stats.cached_bytes -= cls * blocks.size();
      blocks.clear();
    }
  }
};

class CudaStorage final : public Storage {
 public:
  CudaStorage(int rank, std::uint64_t bytes, std::shared_ptr<Device> dev, void* ptr, std::uint64_t cls)
      : Storage(rank, bytes), dev_(std::move(dev)), ptr_(static_cast<std::uint8_t*>(ptr)), cls_(cls) {}
  ~CudaStorage() override { dev_->release(ptr_, cls_); }

  void read(std::uint64_t offset, void* dst, std::uint64_t n) const override {
    if (n == 0) return;
    check(offset, n, "read");
    dev_->refuse_while_recording(rank(), fmt::format("reading {} bytes to the host from {}", n, where()));
    dev_->use();
    CUBESIM_CUDA_CHECK(cudaStreamSynchronize(dev_->side));  // an asynchronous collective not waited for
    CUBESIM_CUDA_CHECK(cudaStreamSynchronize(dev_->stream));
    CUBESIM_CUDA_CHECK(cudaMemcpy(dst, ptr_ + offset, n, cudaMemcpyDeviceToHost));
  }
  void write(std::uint64_t offset, const void* src, std::uint64_t n) override {
    if (n == 0) return;
    check(offset, n, "write");
    dev_->refuse_while_recording(rank(), fmt::format("writing {} bytes from the host to {}", n, where()));
    dev_->use();
    CUBESIM_CUDA_CHECK(cudaMemcpyAsync(ptr_ + offset, src, n, cudaMemcpyHostToDevice, dev_->stream));
    CUBESIM_CUDA_CHECK(cudaStreamSynchronize(dev_->stream));  // the caller may free src on return
  }
  void write_zeros(std::uint64_t offset, std::uint64_t n) override {
    if (n == 0) return;
    check(offset, n, "write");
    dev_->use();
    CUBESIM_CUDA_CHECK(cudaMemsetAsync(ptr_ + offset, 0, n, dev_->stream));  // stream-ordered like write
    // Inside a graph's recording the zeroing is recorded (a tensor made with zeros() in a recorded
    // step is zeroed at each launch); the host has nothing to wait for.
    if (!dev_->recording) CUBESIM_CUDA_CHECK(cudaStreamSynchronize(dev_->stream));
  }
  std::string where() const override {
    return fmt::format("GPU {} ({}) @ {}", dev_->id, dev_->name, static_cast<const void*>(ptr_));
  }

  std::uint8_t* ptr() const { return ptr_; }
  Device& device() const { return *dev_; }

 private:
  void check(std::uint64_t offset, std::uint64_t n, const char* what) const {
    if (offset + n > bytes()) {
      throw RuntimeError(fmt::format("{} of {} bytes at offset {} outside the {} bytes at {}", what, n, offset, bytes(),
                                     where()));
    }
  }
  std::shared_ptr<Device> dev_;
  std::uint8_t* ptr_;
  std::uint64_t cls_;
};

const CudaStorage* as_cuda(const Storage& s) { return dynamic_cast<const CudaStorage*>(&s); }

// Device address of a tensor's first element (nullptr when it is not on this backend).
std::uint8_t* dptr(const Tensor& t) {
  const CudaStorage* s = as_cuda(t.storage());
  return s ? s->ptr() + t.byte_offset() : nullptr;
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::f32: return ncclFloat32;
  }
  return ncclFloat32;  // not reached: every DType has its case (-Wswitch names a missing one)
}

}  // namespace

struct CudaBackend::Impl {
  int ranks = 0;
  CudaBackendOptions opts;
  std::vector<std::shared_ptr<Device>> devs;
  // Run-report notes, each once with its count, in the order first said (take_notes).
  std::vector<std::pair<std::string, int>> notes;
  void note(std::string text) {
    for (auto& [t, n] : notes) {
      if (t == text) {
        ++n;
        return;
      }
    }
    notes.emplace_back(std::move(text), 1);
  }

  // NCCL: communicators per member list, and the rendezvous of each collective in flight.
  const NcclLibrary* nccl = nullptr;
  std::map<std::vector<int>, std::vector<ncclComm_t>> comms;
  struct Rendezvous {
    std::vector<CollectiveRequest> reqs;
    std::vector<Tensor> bufs;
    int arrived = 0, left = 0;
    std::shared_ptr<sim::Event> done;
    std::exception_ptr error;
  };
  std::map<std::pair<int, std::uint64_t>, std::shared_ptr<Rendezvous>> rendezvous;

  // Measured regions; token = index + 1.
  struct Region {
    int rank = 0;
    cudaEvent_t start = nullptr, stop = nullptr;
    double seconds = -1;
    bool side = false;  // an asynchronous NCCL collective's: its stop goes on the side stream
    std::uint64_t graph = 0;  // recorded into this graph: timed only once it has been launched
  };
  std::vector<Region> regions;
  // Asynchronous collectives (async_begin): where the input was ready on the rank's stream, and where
  // the collective finished on the side stream (recorded only when NCCL ran it there).
  struct Async {
    int rank = 0;
    cudaEvent_t ready = nullptr, done = nullptr;
    bool ended = false;  // async_end was called, or the run ended
    Tensor keep;         // the buffer NCCL works on, held until the rank's stream waits for it: the
                         // caching allocator reuses a block in the stream's order, not the side stream's
  };
  std::vector<Async> asyncs;
  // Per rank, asynchronous NCCL collectives launched and not yet waited for: the rank's tensor-core
  // GEMMs meanwhile leave kSideSms SMs to NCCL's kernel, which otherwise finds none free beside the
  // persistent GEMM and runs after it instead of beside it.
  std::vector<int> async_open;
  static constexpr int kSideSms = 16;
  bool async_pending(int rank) const {
    return static_cast<std::size_t>(rank) < async_open.size() && async_open[static_cast<std::size_t>(rank)] > 0;
  }

  // CUDA graphs (graph_begin); token = index + 1. Entries stay after their run (a stale token is
  // refused by name); the executable graph and the blocks go when the run ends.
  struct Graph {
    int rank = 0;
    cudaGraphExec_t exec = nullptr;
    bool ended = false;  // graph_end was called (or the run ended)
    bool failed = false;  // graph_end could not end or instantiate it (said then)
    std::uint64_t launches = 0;
    // Every tensor allocated while recording: the graph writes and reads their blocks at each launch,
    // so none returns to the free lists (to be handed to other tensors) while the graph lives.
    std::vector<std::shared_ptr<Storage>> keep;
  };
  std::vector<Graph> graphs;
  Graph& graph(std::uint64_t token, const char* fn) {
    if (token == 0 || token > graphs.size())
      throw RuntimeError(fmt::format("cuda backend: {}({}): no such graph (graph_begin returned {} so far)", fn, token,
                                     graphs.empty() ? std::string("none") : fmt::format("1 to {}", graphs.size())));
    return graphs[token - 1];
  }
  // Ends every recording still open (a failed run) and lets every graph of the run go.
  void release_graphs();

  Device& dev(int rank) { return *devs.at(static_cast<std::size_t>(rank)); }

  const std::vector<ncclComm_t>& comm_for(const std::vector<int>& members) {
    auto it = comms.find(members);
    if (it != comms.end()) return it->second;
    if (!nccl) nccl = &NcclLibrary::get();
    std::vector<ncclComm_t> c(members.size());
    nccl->check(nccl->comm_init_all(c.data(), static_cast<int>(members.size()), members.data()),
                fmt::format("ncclCommInitAll(devices {})", fmt::join(members, ", ")));
    return comms.emplace(members, std::move(c)).first->second;
  }

  void issue(Rendezvous& v, const ProcessGroup& g);

  // Rotary tables on the device, by (rank, positions, head_dim / 2, base): cos then sin, f32, as
  // kernels::rotary_table computes them on the host (kept for the backend's life).
  std::map<std::tuple<int, std::int64_t, std::int64_t, double>, std::shared_ptr<Storage>> rotary_tables;
};

CudaBackend::CudaBackend(int ranks, CudaBackendOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw RuntimeError(fmt::format("cuda backend: no usable CUDA GPU (cudaGetDeviceCount failed: {}: {}); use the sim "
                                   "or host backend on this machine",
                                   cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  if (ranks < 1) throw RuntimeError(fmt::format("cuda backend: {} ranks requested; give 1 to {}", ranks, n));
  if (ranks > n && !opts.share_gpus) {
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    throw RuntimeError(fmt::format("cuda backend: {} ranks need {} GPUs (one rank per GPU), but {} {} visible{}; use at "
                                   "most {} ranks, or share_gpus",
                                   ranks, ranks, n, n == 1 ? "is" : "are",
                                   vis ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", vis) : "", n));
  }
  if (ranks > n && opts.collectives == CudaCollectives::nccl)
    throw RuntimeError(fmt::format("cuda backend: {} ranks on {} GPU{} (share_gpus) need the runtime's collectives "
                                   "(collectives 'ring'): NCCL takes one rank per GPU",
                                   ranks, n, n == 1 ? "" : "s"));
  impl_->ranks = ranks;
  for (int r = 0; r < ranks; ++r) impl_->devs.push_back(std::make_shared<Device>(r % n));
  // Peer access where the hardware has it (NVLink, PCIe P2P); cudaMemcpyPeerAsync works either way.
  const int gpus = std::min(ranks, n);
  for (int i = 0; i < gpus; ++i) {
    for (int j = 0; j < gpus; ++j) {
      if (i == j) continue;
      int can = 0;
      CUBESIM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, i, j));
      if (!can) continue;
      CUBESIM_CUDA_CHECK(cudaSetDevice(i));
      const cudaError_t pe = cudaDeviceEnablePeerAccess(j, 0);
      if (pe == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        CUBESIM_CUDA_CHECK(pe);
      }
    }
  }
  if (opts.collectives == CudaCollectives::nccl) {
    // The world's communicators now, outside the rank fibers.
    std::vector<int> all(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) all[static_cast<std::size_t>(r)] = r;
    impl_->comm_for(all);
  }
}

CudaBackend::~CudaBackend() {
  impl_->release_graphs();
  for (auto& d : impl_->devs) {
    cudaSetDevice(d->id);
    cudaStreamSynchronize(d->side);
    cudaStreamSynchronize(d->stream);
  }
  for (auto& a : impl_->asyncs) {
    if (a.ready) cudaEventDestroy(a.ready);
    if (a.done) cudaEventDestroy(a.done);
  }
  if (impl_->nccl) {
    for (auto& [members, cs] : impl_->comms) {
      for (ncclComm_t c : cs) impl_->nccl->comm_destroy(c);
    }
  }
  for (auto& r : impl_->regions) {
    cudaEventDestroy(r.start);
    cudaEventDestroy(r.stop);
  }
  cudaGetLastError();
}

int CudaBackend::ranks() const { return impl_->ranks; }
const CudaBackendOptions& CudaBackend::options() const { return impl_->opts; }
std::string CudaBackend::device_name(int rank) const { return impl_->devs.at(static_cast<std::size_t>(rank))->name; }
int CudaBackend::nccl_version() const { return impl_->nccl ? impl_->nccl->version : 0; }

std::string CudaBackend::describe() const {
  const std::string gpu = impl_->devs.empty() ? "?" : impl_->devs[0]->name;
  return fmt::format("cuda: {} x {} ({} GEMM, {} collectives)", impl_->ranks, gpu, cuda::gemm_mode_name(impl_->opts.gemm_mode),
                     cuda_collectives_name(impl_->opts.collectives));
}

void CudaBackend::synchronize() {
  for (auto& d : impl_->devs) {
    d->use();
    CUBESIM_CUDA_CHECK(cudaStreamSynchronize(d->stream));
  }
}

CudaAllocatorStats CudaBackend::allocator_stats(int rank) const { return impl_->devs.at(static_cast<std::size_t>(rank))->stats; }

std::shared_ptr<Storage> CudaBackend::allocate(int rank, std::uint64_t bytes, std::string_view what) {
  if (rank < 0 || rank >= impl_->ranks) {
    throw RuntimeError(fmt::format("allocation '{}' on rank {}: the cuda backend has ranks 0 to {} (one per GPU)", what,
                                   rank, impl_->ranks - 1));
  }
  auto dev = impl_->devs[static_cast<std::size_t>(rank)];
  const std::uint64_t cls = size_class(bytes);
  void* p = dev->allocate(cls, rank, what);
  const std::uint64_t rec = dev->recording;
  auto st = std::make_shared<CudaStorage>(rank, bytes, std::move(dev), p, cls);
  if (rec) impl_->graphs[rec - 1].keep.push_back(st);
  return st;
}

void CudaBackend::copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n) {
  if (n == 0) return;
  const CudaStorage* s = as_cuda(src);
  const CudaStorage* d = as_cuda(dst);
  if (!s || !d) throw RuntimeError(fmt::format("cuda backend: copy between {} and {}: both must be GPU memory", src.where(), dst.where()));
  Device& ds = s->device();
  Device& dd = d->device();
  if (&ds != &dd) {  // (two ranks: reached once graphs span several ranks; graph_begin refuses that now)
    ds.refuse_while_recording(src.rank(), fmt::format("a copy of {} bytes from {} to {}", n, src.where(), dst.where()));
    dd.refuse_while_recording(dst.rank(), fmt::format("a copy of {} bytes from {} to {}", n, src.where(), dst.where()));
  }
  if (&ds == &dd) {
    ds.use();
    CUBESIM_CUDA_CHECK(cudaMemcpyAsync(d->ptr() + dst_off, s->ptr() + src_off, n, cudaMemcpyDeviceToDevice, ds.stream));
    return;
  }
  // The receiver's earlier work on dst finishes before the bytes arrive; its later work waits
  // for them. The sender's stream orders the copy after whatever produced src.
  dd.use();
  CUBESIM_CUDA_CHECK(cudaEventRecord(dd.order, dd.stream));
  ds.use();
  CUBESIM_CUDA_CHECK(cudaStreamWaitEvent(ds.stream, dd.order, 0));
  CUBESIM_CUDA_CHECK(cudaMemcpyPeerAsync(d->ptr() + dst_off, dd.id, s->ptr() + src_off, ds.id, n, ds.stream));
  CUBESIM_CUDA_CHECK(cudaEventRecord(ds.order, ds.stream));
  dd.use();
  CUBESIM_CUDA_CHECK(cudaStreamWaitEvent(dd.stream, ds.order, 0));
}

bool CudaBackend::gemm(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) {
  const int rank = c.device();
  for (const Tensor* t : {&a, &b, &c}) {
    if (!as_cuda(t->storage()) || t->device() != rank || t->dim() != 2) return false;
  }
  if (bias && (!as_cuda(bias->storage()) || bias->device() != rank || !bias->is_contiguous())) return false;
  auto view = [](const Tensor& t) {
    return kernels::MatrixView{dptr(t), t.dtype(), t.shape()[0], t.shape()[1], t.strides()[0], t.strides()[1]};
  };
  const kernels::MutableMatrixView cv{dptr(c), c.dtype(), c.shape()[0], c.shape()[1], c.strides()[0], c.strides()[1]};
  kernels::VectorView bv;
  if (bias) bv = kernels::VectorView::contiguous(dptr(*bias), bias->dtype(), bias->numel());
  Device& d = impl_->dev(rank);
  d.use();
  cuda::GemmOptions go;
  go.mode = impl_->opts.gemm_mode;
  if (static_cast<std::size_t>(rank) < impl_->async_open.size() && impl_->async_open[static_cast<std::size_t>(rank)] > 0)
    go.sm_margin = Impl::kSideSms;
  const kernels::MatrixView av = view(a), bv2 = view(b);
  if (go.mode == cuda::GemmMode::tensor_core) {
    std::string why = cuda::det_gemm_cuda_repack_reason(av, bv2, go);
    if (!why.empty()) impl_->note(fmt::format("tensor_core GEMM '{}': {}", name ? name : "gemm", why));
  }
  cuda::det_gemm_cuda(av, bv2, bias ? &bv : nullptr, cv, go, d.stream);
  return true;
}

std::vector<std::string> CudaBackend::take_notes() {
  std::vector<std::string> out;
  for (auto& [t, n] : impl_->notes) out.push_back(n == 1 ? t : fmt::format("{} ({} calls)", t, n));
  impl_->notes.clear();
  return out;
}

bool CudaBackend::reduce(const Tensor& dst, const Tensor& src, ReduceOp op) {
  if (!as_cuda(dst.storage()) || !as_cuda(src.storage()) || dst.device() != src.device() ||
      dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    return false;
  }
  Device& d = impl_->dev(dst.device());
  d.use();
  cuda::reduce(dptr(dst), dptr(src), dst.dtype(), dst.numel(), op, d.stream);
  return true;
}

namespace {
// A rank's checksum slots: device memory from the backend's pool, zeroed when made.
struct ChecksumSlots {
  std::shared_ptr<Storage> storage;
  int rank = 0;
};
}  // namespace

std::shared_ptr<void> CudaBackend::checksum_slots(int rank, std::size_t slots) {
  auto cs = std::make_shared<ChecksumSlots>();
  cs->rank = rank;
  cs->storage = allocate(rank, std::max<std::uint64_t>(8, 8 * slots), "checksum slots");
  Device& d = impl_->dev(rank);
  d.use();
  CUBESIM_CUDA_CHECK(cudaMemsetAsync(as_cuda(*cs->storage)->ptr(), 0, 8 * slots, d.stream));
  return cs;
}

void CudaBackend::checksum(const Tensor& t, std::uint64_t base, void* slots, std::size_t word, std::size_t mix) {
  auto& cs = *static_cast<ChecksumSlots*>(slots);
  Device& d = impl_->dev(cs.rank);
  // (Its kernels add into slots zeroed when they were made: each launch of a graph would add again.)
  d.refuse_while_recording(cs.rank, "a checksum");
  d.use();
  auto* p = reinterpret_cast<std::uint64_t*>(as_cuda(*cs.storage)->ptr());  // zeroed when made
  std::uint64_t* w = word == kNoSlot ? nullptr : p + word;
  std::uint64_t* m = mix == kNoSlot ? nullptr : p + mix;
  if (t.is_contiguous() && as_cuda(t.storage())) {
    cuda::checksum(dptr(t), t.dtype(), t.numel(), base, w, m, d.stream);
    return;
  }
  // A strided view: its elements in row-major order through the host (rare: the runtime's views
  // of checksummed tensors are contiguous).
  const std::vector<std::uint8_t> bytes = t.to_host_bytes();
  const kernels::ChecksumPair v = kernels::checksum_pair(bytes.data(), t.dtype(), t.numel(), base);
  if (w) CUBESIM_CUDA_CHECK(cudaMemcpyAsync(w, &v.word, 8, cudaMemcpyHostToDevice, d.stream));
  if (m) CUBESIM_CUDA_CHECK(cudaMemcpyAsync(m, &v.mix, 8, cudaMemcpyHostToDevice, d.stream));
  CUBESIM_CUDA_CHECK(cudaStreamSynchronize(d.stream));
}

void CudaBackend::read_checksums(int rank, void* slots, std::uint64_t* out, std::size_t n) {
  auto& cs = *static_cast<ChecksumSlots*>(slots);
  Device& d = impl_->dev(cs.rank);
  d.refuse_while_recording(cs.rank, "reading checksums to the host");
  d.use();
  CUBESIM_CUDA_CHECK(cudaMemcpyAsync(out, as_cuda(*cs.storage)->ptr(), 8 * n, cudaMemcpyDeviceToHost, d.stream));
  CUBESIM_CUDA_CHECK(cudaStreamSynchronize(d.stream));
}

bool CudaBackend::elementwise(const ElementwiseRequest& r) {
  using K = ElementwiseRequest::Kind;
  const Tensor& out = *r.out;
  const int rank = out.device();
  for (const Tensor* t : {r.x, r.y, r.out, r.pre}) {
    if (t && (!as_cuda(t->storage()) || t->device() != rank || !t->is_contiguous())) return false;
  }
  Device& d = impl_->dev(rank);
  d.use();
  const Tensor& x = *r.x;
  switch (r.kind) {
    case K::gelu: cuda::gelu(r.gelu, dptr(x), x.dtype(), dptr(out), out.dtype(), out.numel(), d.stream); break;
    case K::gelu_backward:
      cuda::gelu_backward(r.gelu, dptr(x), x.dtype(), dptr(*r.y), r.y->dtype(), dptr(out), out.dtype(), out.numel(),
                           d.stream);
      break;
    case K::add:
      cuda::add(dptr(x), x.dtype(), dptr(*r.y), r.y->dtype(), dptr(out), out.dtype(), out.numel(), d.stream);
      break;
    case K::add_bias:
      cuda::add_bias(dptr(x), x.dtype(), dptr(*r.y), r.y->dtype(), dptr(out), out.dtype(), x.rows(), x.cols(), d.stream);
      break;
    case K::bias_grad:
      cuda::bias_grad(dptr(x), x.dtype(), dptr(out), out.dtype(), x.rows(), x.cols(), d.stream);
      break;
    case K::bias_gelu:
      cuda::bias_gelu(r.gelu, dptr(x), x.dtype(), dptr(*r.y), r.y->dtype(), dptr(*r.pre), r.pre->dtype(), dptr(out),
                      out.dtype(), x.rows(), x.cols(), d.stream);
      break;
    case K::copy:
      if (x.dtype() != out.dtype() || x.nbytes() != out.nbytes()) return false;
      if (x.nbytes() > 0) {
        CUBESIM_CUDA_CHECK(cudaMemcpyAsync(dptr(out), dptr(x), x.nbytes(), cudaMemcpyDeviceToDevice, d.stream));
      }
      break;
  }
  return true;
}

bool CudaBackend::attention(const AttentionRequest& r) {
  const int rank = r.stats->device();
  const AttentionRequest::Operand* ops[] = {&r.q, &r.k, &r.v, &r.out, &r.dout, &r.dq, &r.dk, &r.dv};
  for (const AttentionRequest::Operand* o : ops) {
    const Tensor* t = o->t;
    if (t && (!as_cuda(t->storage()) || t->device() != rank || t->dim() != 2 || (t->cols() > 1 && t->strides()[1] != 1)))
      return false;
  }
  if (!as_cuda(r.stats->storage()) || !r.stats->is_contiguous()) return false;
  Device& d = impl_->dev(rank);
  d.use();
  auto in = [](const AttentionRequest::Operand& o) {
    return kernels::AttentionBuffer{dptr(*o.t) + o.col * static_cast<std::int64_t>(o.t->element_size()),
                                    o.t->dtype(), o.t->strides()[0], o.group_stride};
  };
  auto out = [&](const AttentionRequest::Operand& o) {
    const kernels::AttentionBuffer b = in(o);
    return kernels::MutableAttentionBuffer{const_cast<void*>(b.data), b.dtype, b.row_stride, b.group_stride};
  };
  auto* stats = reinterpret_cast<float*>(dptr(*r.stats));
  // The padding lengths on the device, for this call (freed back to the allocator in stream order).
  std::shared_ptr<Storage> lengths;
  const std::int64_t* kv_valid = nullptr;
  if (!r.kv_valid.empty()) {
    d.refuse_while_recording(rank, "attention's padding lengths (kv_valid) from the host");
    lengths = allocate(rank, r.kv_valid.size_bytes(), "attention kv_valid");
    auto* p = static_cast<CudaStorage&>(*lengths).ptr();
    CUBESIM_CUDA_CHECK(cudaMemcpyAsync(p, r.kv_valid.data(), r.kv_valid.size_bytes(), cudaMemcpyHostToDevice, d.stream));
    kv_valid = reinterpret_cast<const std::int64_t*>(p);
  }
  // tensor_core GEMMs: attention in its tensor_core mode too (kernels/attention_tc.h) where the call
  // fits it (head_dim 64/128, bf16/f16 operands, 16-byte rows), else the exact kernels.
  const bool tc = impl_->opts.gemm_mode == cuda::GemmMode::tensor_core &&
                  (r.backward ? cuda::attention_tc_backward_unsupported(r.shape, in(r.q), in(r.k), in(r.v), in(r.out),
                                                                         in(r.dout), in(r.dq), in(r.dk), in(r.dv))
                              : cuda::attention_tc_unsupported(r.shape, in(r.q), in(r.k), in(r.v), in(r.out)))
                      .empty();
  if (!r.backward) {
    if (tc) {
      cuda::attention_forward_tc(r.shape, in(r.q), in(r.k), in(r.v), out(r.out), stats, kv_valid, d.stream);
    } else {
      cuda::attention_forward(r.shape, in(r.q), in(r.k), in(r.v), out(r.out), stats, kv_valid, d.stream);
    }
    return true;
  }
  // The workspace goes back to the caching allocator at once: it reuses blocks in stream order.
  const auto ws = allocate(rank,
                           tc ? cuda::attention_tc_backward_workspace_bytes(r.shape)
                              : cuda::attention_backward_workspace_bytes(r.shape),
                           "attention workspace");
  void* w = static_cast<CudaStorage&>(*ws).ptr();
  if (tc) {
    cuda::attention_backward_tc(r.shape, in(r.q), in(r.k), in(r.v), in(r.out), stats, in(r.dout), out(r.dq),
                                out(r.dk), out(r.dv), kv_valid, w, d.stream);
  } else {
    cuda::attention_backward(r.shape, in(r.q), in(r.k), in(r.v), in(r.out), stats, in(r.dout), out(r.dq), out(r.dk),
                             out(r.dv), kv_valid, w, d.stream);
  }
  return true;
}

bool CudaBackend::rowwise(const RowwiseRequest& r) {
  using K = RowwiseRequest::Kind;
  const Tensor* all[] = {r.x, r.w, r.b, r.dy, r.out, r.dw, r.db, r.mean, r.rstd, r.max, r.partials};
  if (!r.out || !impl_->opts.rowwise_kernels) return false;
  const int rank = r.out->device();
  for (const Tensor* t : all) {
    if (t && (!as_cuda(t->storage()) || t->device() != rank || t->dim() > 2 ||
              (t->dim() == 2 && t->cols() > 1 && t->strides()[1] != 1) || (t->dim() == 1 && !t->is_contiguous())))
      return false;
  }
  Device& d = impl_->dev(rank);
  d.use();
  const auto nb = [](const Tensor* t) {
    return kernels::MutableNormBuffer{dptr(*t), t->dtype(), t->dim() == 2 ? t->strides()[0] : 0};
  };
  const auto f32 = [](const Tensor* t) { return reinterpret_cast<float*>(dptr(*t)); };
  // Host arrays on the device for this call: the caching allocator reuses the blocks in stream order.
  std::vector<std::shared_ptr<Storage>> keep;
  const auto upload = [&](const void* p, std::size_t bytes, const char* what) -> std::uint8_t* {
    if (bytes == 0) return nullptr;
    d.refuse_while_recording(rank, fmt::format("{} from the host", what));
    keep.push_back(allocate(rank, bytes, what));
    auto* q = static_cast<CudaStorage&>(*keep.back()).ptr();
    CUBESIM_CUDA_CHECK(cudaMemcpyAsync(q, p, bytes, cudaMemcpyHostToDevice, d.stream));
    return q;
  };
  const auto ids = [&](const char* what) {
    return reinterpret_cast<const std::int64_t*>(upload(r.ids.data(), r.ids.size_bytes(), what));
  };
  const auto scratch = [&](std::int64_t floats) {
    keep.push_back(allocate(rank, static_cast<std::uint64_t>(std::max<std::int64_t>(floats, 1)) * 4, "norm scratch"));
    return reinterpret_cast<float*>(static_cast<CudaStorage&>(*keep.back()).ptr());
  };
  const std::int64_t rows = r.x ? r.x->shape()[0] : 0, n = r.x && r.x->dim() == 2 ? r.x->shape()[1] : 0;
  switch (r.kind) {
    case K::rms_norm:
      cuda::rms_norm_forward(nb(r.x), nb(r.w), nb(r.out), f32(r.rstd), rows, n, r.eps, d.stream);
      break;
    case K::rms_norm_backward:
      cuda::rms_norm_backward(nb(r.x), nb(r.w), nb(r.dy), f32(r.rstd), nb(r.out), nb(r.dw), rows, n, scratch(rows),
                              d.stream);
      break;
    case K::layer_norm:
      cuda::layer_norm_forward(nb(r.x), nb(r.w), nb(r.b), nb(r.out), f32(r.mean), f32(r.rstd), rows, n, r.eps,
                               d.stream);
      break;
    case K::layer_norm_backward:
      cuda::layer_norm_backward(nb(r.x), nb(r.w), nb(r.dy), f32(r.mean), f32(r.rstd), nb(r.out), nb(r.dw), nb(r.db),
                                rows, n, scratch(2 * rows), d.stream);
      break;
    case K::swiglu: cuda::swiglu(nb(r.x), nb(r.out), rows, n / 2, d.stream); break;
    case K::swiglu_backward: cuda::swiglu_backward(nb(r.x), nb(r.dy), nb(r.out), rows, n / 2, d.stream); break;
    case K::rotary: {
      const kernels::AttentionShape& s = r.shape;
      const std::int64_t g = s.heads / s.kv_heads, hd = s.head_dim, half = hd / 2;
      auto& table = impl_->rotary_tables[{rank, s.seq_q, half, r.rotary_base}];
      if (!table) {
        d.refuse_while_recording(rank, "a rotary table from the host (made at its first use: run once before recording)");
        const kernels::RotaryTable t = kernels::rotary_table(s.seq_q, hd, r.rotary_base);
        std::vector<float> cs(t.cos);
        cs.insert(cs.end(), t.sin.begin(), t.sin.end());
        table = allocate(rank, cs.size() * 4, "rotary table");
        CUBESIM_CUDA_CHECK(cudaMemcpyAsync(static_cast<CudaStorage&>(*table).ptr(), cs.data(), cs.size() * 4,
                                           cudaMemcpyHostToDevice, d.stream));
        CUBESIM_CUDA_CHECK(cudaStreamSynchronize(d.stream));  // cs goes out of scope
      }
      const auto* cos = reinterpret_cast<const float*>(static_cast<CudaStorage&>(*table).ptr());
      const float* sin = cos + s.seq_q * half;
      std::uint8_t* base = dptr(*r.x);
      const std::int64_t stride = r.x->strides()[0], es = static_cast<std::int64_t>(r.x->element_size());
      cuda::rotary_apply(s, {base, r.x->dtype(), stride, (g + 2) * hd}, s.heads, g, cos, sin, r.inverse, d.stream);
      cuda::rotary_apply(s, {base + g * hd * es, r.x->dtype(), stride, (g + 2) * hd}, s.kv_heads, 1, cos, sin,
                         r.inverse, d.stream);
      break;
    }
    case K::embedding:
      cuda::embedding_forward(nb(r.x), rows, r.vocab_start, ids("embedding ids"), r.out->shape()[0], n, nb(r.out),
                              d.stream);
      break;
    case K::embedding_backward: {
      const cuda::EmbeddingGroups gr = cuda::embedding_groups(r.ids.data(), static_cast<std::int64_t>(r.ids.size()),
                                                              r.out->shape()[0], r.vocab_start);
      const auto* order = reinterpret_cast<const std::int64_t*>(upload(gr.order.data(), gr.order.size() * 8, "embedding order"));
      const auto* rowv = reinterpret_cast<const std::int64_t*>(upload(gr.row.data(), gr.row.size() * 8, "embedding rows"));
      const auto* begin = reinterpret_cast<const std::int64_t*>(upload(gr.begin.data(), gr.begin.size() * 8, "embedding groups"));
      cuda::embedding_backward(nb(r.dy), r.out->shape()[1], r.out->shape()[0], order, rowv, begin,
                               static_cast<std::int64_t>(gr.row.size()), nb(r.out), d.stream);
      break;
    }
    case K::cross_entropy_max: cuda::cross_entropy_max(nb(r.x), rows, n, f32(r.out), d.stream); break;
    case K::cross_entropy_partials:
      cuda::cross_entropy_partials(nb(r.x), rows, n, f32(r.max), ids("cross-entropy targets"), r.vocab_start,
                                   f32(r.out), d.stream);
      break;
    case K::cross_entropy_loss:
      cuda::cross_entropy_loss(f32(r.partials), f32(r.max), f32(r.out), r.out->numel(), d.stream);
      break;
    case K::cross_entropy_backward:
      cuda::cross_entropy_backward(nb(r.x), rows, n, f32(r.max), f32(r.partials), ids("cross-entropy targets"),
                                   r.vocab_start, f32(r.dy), nb(r.out), d.stream);
      break;
  }
  return true;
}

void CudaBackend::Impl::issue(Rendezvous& v, const ProcessGroup& g) {
  const auto& cs = comm_for(g.ranks());
  const int p = g.size();
  const NcclLibrary& lib = *nccl;
  const CollectiveRequest& r0 = v.reqs[0];
  const std::string what = fmt::format("{} ({}[{}])", r0.name, dtype_name(v.bufs[0].dtype()), v.bufs[0].numel());
  const auto red = [](ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; };
  // An asynchronous collective runs on each member's side stream once the input is ready (the
  // async_begin point on the member's stream); the stream itself goes on with later work.
  auto stream_of = [&](int i) {
    const CollectiveRequest& r = v.reqs[static_cast<std::size_t>(i)];
    Device& d = dev(g.rank_at(i));
    return r.async ? d.side : d.stream;
  };
  for (int i = 0; i < p; ++i) {
    const CollectiveRequest& r = v.reqs[static_cast<std::size_t>(i)];
    if (!r.async) continue;
    dev(g.rank_at(i)).use();
    CUBESIM_CUDA_CHECK(cudaStreamWaitEvent(stream_of(i), asyncs.at(r.async - 1).ready, 0));
  }
  // Members' streams start the collective now: re-record the regions' starts here, so a member
  // that arrived early does not count the wait for the others.
  for (int i = 0; i < p; ++i) {
    const CollectiveRequest& r = v.reqs[static_cast<std::size_t>(i)];
    if (r.region) {
      Device& d = dev(g.rank_at(i));
      d.use();
      Region& reg = regions[r.region - 1];
      reg.side = r.async != 0;
      d.record_timing(reg.start, stream_of(i));
    }
  }
  lib.check(lib.group_start(), "ncclGroupStart for " + what);
  for (int i = 0; i < p; ++i) {
    const CollectiveRequest& r = v.reqs[static_cast<std::size_t>(i)];
    const Tensor& t = v.bufs[static_cast<std::size_t>(i)];
    Device& d = dev(g.rank_at(i));
    std::uint8_t* buf = dptr(t);
    const std::size_t n = static_cast<std::size_t>(t.numel());
    const std::size_t chunk = n / static_cast<std::size_t>(p);
    const ncclDataType_t dt = nccl_type(t.dtype());
    const ncclComm_t c = cs[static_cast<std::size_t>(i)];
    ncclResult_t res = ncclSuccess;
    const char* call = "";
    switch (r.kind) {
      case CollectiveRequest::Kind::all_reduce:
        call = "ncclAllReduce";
        res = lib.all_reduce(buf, buf, n, dt, red(r.op), c, stream_of(i));
        break;
      case CollectiveRequest::Kind::reduce_scatter:
        call = "ncclReduceScatter";
        res = lib.reduce_scatter(buf, buf + i * chunk * t.element_size(), chunk, dt, red(r.op), c, stream_of(i));
        break;
      case CollectiveRequest::Kind::all_gather:
        call = "ncclAllGather";
        res = lib.all_gather(buf + i * chunk * t.element_size(), buf, chunk, dt, c, stream_of(i));
        break;
      case CollectiveRequest::Kind::broadcast:
        call = "ncclBroadcast";
        res = lib.broadcast(buf, buf, n, dt, r.root, c, stream_of(i));
        break;
    }
    if (res != ncclSuccess) {
      lib.group_end();
      lib.check(res, fmt::format("{} on rank {} (GPU {}) for {}", call, g.rank_at(i), d.id, what));
    }
  }
  lib.check(lib.group_end(), "ncclGroupEnd for " + what);
  for (int i = 0; i < p; ++i) {
    const CollectiveRequest& r = v.reqs[static_cast<std::size_t>(i)];
    if (!r.async) continue;
    dev(g.rank_at(i)).use();
    Async& a = asyncs.at(r.async - 1);
    CUBESIM_CUDA_CHECK(cudaEventRecord(a.done, stream_of(i)));
    a.keep = v.bufs[static_cast<std::size_t>(i)];
  }
}

bool CudaBackend::collective(const CollectiveRequest& r) {
  if (impl_->opts.collectives != CudaCollectives::nccl) return false;
  const ProcessGroup& g = *r.group;
  const int p = g.size();
  const bool chunked = r.kind == CollectiveRequest::Kind::reduce_scatter || r.kind == CollectiveRequest::Kind::all_gather;
  if (chunked && r.buf->numel() % p != 0) {
    throw RuntimeError(fmt::format("{}: NCCL needs {} equal chunks, but the buffer holds {} elements", r.name, p,
                                   r.buf->numel()));
  }
  if (!as_cuda(r.buf->storage())) return false;
  auto& slot = impl_->rendezvous[{g.id(), r.sequence}];
  if (!slot) {
    slot = std::make_shared<Impl::Rendezvous>();
    slot->reqs.resize(static_cast<std::size_t>(p));
    slot->bufs.resize(static_cast<std::size_t>(p));
    slot->done = std::make_shared<sim::Event>(fmt::format("NCCL rendezvous of {}", r.name));
  }
  std::shared_ptr<Impl::Rendezvous> v = slot;
  v->reqs[static_cast<std::size_t>(r.index)] = r;
  v->bufs[static_cast<std::size_t>(r.index)] = *r.buf;
  if (++v->arrived < p) {
    v->done->wait();
  } else {
    try {
      impl_->issue(*v, g);
    } catch (...) {
      v->error = std::current_exception();
    }
    v->done->trigger();
  }
  if (++v->left == p) impl_->rendezvous.erase({g.id(), r.sequence});
  if (v->error) std::rethrow_exception(v->error);
  return true;
}

void CudaBackend::abandon_run() {
  // No NCCL call of a half-joined rendezvous was issued (issue() runs once every member has
  // arrived), so no GPU waits on a peer that never comes: dropping them is enough.
  impl_->rendezvous.clear();
  impl_->notes.clear();  // the failed run has no report to say them in
  impl_->release_graphs();
  impl_->async_open.assign(impl_->async_open.size(), 0);  // collectives of the abandoned run are not waited for
  for (Impl::Async& a : impl_->asyncs) {
    a.ended = true;
    a.keep = Tensor();
  }
  for (auto& d : impl_->devs) {
    cudaSetDevice(d->id);
    cudaStreamSynchronize(d->side);
    cudaStreamSynchronize(d->stream);
  }
  cudaGetLastError();
}

std::uint64_t CudaBackend::begin_region(int rank, std::string_view kind) {
  if (!impl_->opts.measure || rank < 0 || rank >= impl_->ranks) return 0;
  Device& d = impl_->dev(rank);
  d.use();
  Impl::Region reg;
  reg.rank = rank;
  reg.graph = d.recording;
  CUBESIM_CUDA_CHECK(cudaEventCreate(&reg.start));
  CUBESIM_CUDA_CHECK(cudaEventCreate(&reg.stop));
  d.record_timing(reg.start, d.stream);
  impl_->regions.push_back(reg);
  return impl_->regions.size();
}

void CudaBackend::end_region(std::uint64_t token) {
  if (token == 0) return;
  Impl::Region& reg = impl_->regions.at(token - 1);
  Device& d = impl_->dev(reg.rank);
  d.use();
  d.record_timing(reg.stop, reg.side ? d.side : d.stream);
}

std::uint64_t CudaBackend::async_begin(int rank) {
  // Only NCCL runs a collective on the side stream; the runtime's own algorithms stay on the stream.
  if (impl_->opts.collectives != CudaCollectives::nccl || rank < 0 || rank >= impl_->ranks) return 0;
  Device& d = impl_->dev(rank);
  d.use();
  Impl::Async a;
  a.rank = rank;
  CUBESIM_CUDA_CHECK(cudaEventCreateWithFlags(&a.ready, cudaEventDisableTiming));
  CUBESIM_CUDA_CHECK(cudaEventCreateWithFlags(&a.done, cudaEventDisableTiming));
  CUBESIM_CUDA_CHECK(cudaEventRecord(a.ready, d.stream));
  impl_->asyncs.push_back(a);
  if (impl_->async_open.empty()) impl_->async_open.assign(static_cast<std::size_t>(impl_->ranks), 0);
  ++impl_->async_open[static_cast<std::size_t>(rank)];
  return impl_->asyncs.size();
}

void CudaBackend::async_end(std::uint64_t token) {
  if (token == 0 || token > impl_->asyncs.size()) return;
  Impl::Async& a = impl_->asyncs[token - 1];
  if (a.ended) return;  // waited before, or the run ended (its stream waited then)
  a.ended = true;
  --impl_->async_open[static_cast<std::size_t>(a.rank)];
  Device& d = impl_->dev(a.rank);
  d.use();
  // A done event never recorded (the collective did not reach NCCL) is complete: no wait.
  CUBESIM_CUDA_CHECK(cudaStreamWaitEvent(d.stream, a.done, 0));
  a.keep = Tensor();  // later reuse of its block is ordered after the collective now
}

void CudaBackend::end_run() {
  impl_->release_graphs();
  // Collectives nobody waited for: each rank's stream waits for its side stream, once, and the
  // events of the run's asynchronous collectives go.
  if (impl_->asyncs.empty()) return;
  for (std::size_t r = 0; r < impl_->async_open.size(); ++r) {
    if (impl_->async_open[r] == 0) continue;
    Device& d = impl_->dev(static_cast<int>(r));
    d.use();
    CUBESIM_CUDA_CHECK(cudaEventRecord(d.order, d.side));
    CUBESIM_CUDA_CHECK(cudaStreamWaitEvent(d.stream, d.order, 0));
    impl_->async_open[r] = 0;
  }
  for (Impl::Async& a : impl_->asyncs) {
    a.ended = true;
    a.keep = Tensor();
    // Entries stay (a stale Work's token must not reach a later run's collective); events go.
    if (a.ready) cudaEventDestroy(a.ready);
    if (a.done) cudaEventDestroy(a.done);
    a.ready = a.done = nullptr;
  }
}

double CudaBackend::measured_seconds(std::uint64_t token) {
  if (token == 0 || token > impl_->regions.size()) return -1;
  Impl::Region& reg = impl_->regions[token - 1];
  if (reg.graph && impl_->graphs[reg.graph - 1].launches == 0) return -1;  // recorded, never run
  if (reg.seconds < 0) {
    impl_->dev(reg.rank).use();
    CUBESIM_CUDA_CHECK(cudaEventSynchronize(reg.stop));
    float ms = 0;
    CUBESIM_CUDA_CHECK(cudaEventElapsedTime(&ms, reg.start, reg.stop));
    reg.seconds = ms * 1e-3;
  }
  return reg.seconds;
}

void CudaBackend::Impl::release_graphs() {
  for (auto& d : devs) {
    if (d->recording == 0) continue;
    // A run that failed while recording: end it and drop what was recorded (an invalidated
    // recording ends with an error, which is the failure already reported).
    cudaSetDevice(d->id);
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(d->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    d->recording = 0;
  }
  for (Graph& g : graphs) {
    if (g.exec) {
      cudaSetDevice(dev(g.rank).id);
      cudaStreamSynchronize(dev(g.rank).stream);  // its last launch (and the timing events in it) done
      // Destroying an executable graph that is still running is allowed (CUDA defers it); its
      // blocks go back to free lists that hand them out in this stream's order, after its launches.
      cudaGraphExecDestroy(g.exec);
      g.exec = nullptr;
    }
    g.ended = true;
    g.keep.clear();
  }
  cudaGetLastError();
}

std::uint64_t CudaBackend::graph_begin(int rank) {
  if (rank < 0 || rank >= impl_->ranks)
    throw RuntimeError(fmt::format("cuda backend: graph_begin on rank {}: ranks are 0 to {}", rank, impl_->ranks - 1));
  if (impl_->ranks > 1) {
    // Several ranks: the runtime's ring copies between the ranks' streams (a copy would tie two
    // recordings together, which CUDA refuses), and a graph holding NCCL collectives must be launched
    // on every member before any of them is waited for, while ranks launch one after another on one
    // host thread (a launch rendezvous, as collective() has, would allow it: not built yet).
    impl_->note(fmt::format("CUDA graphs: recorded on a one-rank backend only (this one has {} ranks: the ring's copies "
                            "join the ranks' streams, and NCCL collectives in graphs need every member's launch "
                            "queued together); the work ran without graphs",
                            impl_->ranks));
    return 0;
  }
  Device& d = impl_->dev(rank);
  if (d.recording)
    throw RuntimeError(fmt::format("cuda backend: graph_begin on rank {}: graph {} is still being recorded there; "
                                   "call graph_end first", rank, d.recording));
  if (impl_->async_pending(rank))
    throw RuntimeError(fmt::format("cuda backend: graph_begin on rank {}: an asynchronous collective launched before "
                                   "it is not waited for yet; wait for it (Work::wait) before recording", rank));
  d.use();
  // Relaxed: every rank records on one host thread, and the allocator may call cudaMalloc meanwhile.
  CUBESIM_CUDA_CHECK(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeRelaxed));
  Impl::Graph g;
  g.rank = rank;
  impl_->graphs.push_back(std::move(g));
  d.recording = impl_->graphs.size();
  return d.recording;
}

void CudaBackend::graph_end(std::uint64_t token) {
  Impl::Graph& g = impl_->graph(token, "graph_end");
  Device& d = impl_->dev(g.rank);
  if (g.ended || d.recording != token)
    throw RuntimeError(fmt::format("cuda backend: graph_end({}) on rank {}: {}", token, g.rank,
                                   g.ended ? "it has ended already" : "it is not being recorded"));
  if (impl_->async_pending(g.rank))
    throw RuntimeError(fmt::format("cuda backend: graph_end({}) on rank {}: an asynchronous collective launched while "
                                   "recording is not waited for yet; wait for it (Work::wait) before graph_end",
                                   token, g.rank));
  d.use();
  // Work the side stream joined in (asynchronous collectives) rejoins the stream before the end.
  cudaStreamCaptureStatus side = cudaStreamCaptureStatusNone;
  CUBESIM_CUDA_CHECK(cudaStreamIsCapturing(d.side, &side));
  if (side == cudaStreamCaptureStatusActive) {
    CUBESIM_CUDA_CHECK(cudaEventRecord(d.order, d.side));
    CUBESIM_CUDA_CHECK(cudaStreamWaitEvent(d.stream, d.order, 0));
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(d.stream, &graph);
  d.recording = 0;
  g.ended = true;
  if (e != cudaSuccess) {
    cudaGetLastError();
    g.failed = true;
    throw RuntimeError(fmt::format("cuda backend: graph_end({}) on rank {}: cudaStreamEndCapture failed: {} ({}); "
                                   "something the rank did while recording cannot be recorded",
                                   token, g.rank, cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  const cudaError_t ie = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    cudaGetLastError();
    g.exec = nullptr;
    g.failed = true;
    throw RuntimeError(fmt::format("cuda backend: graph_end({}) on rank {}: cudaGraphInstantiate failed: {} ({})", token,
                                   g.rank, cudaGetErrorName(ie), cudaGetErrorString(ie)));
  }
}

void CudaBackend::graph_launch(std::uint64_t token) {
  Impl::Graph& g = impl_->graph(token, "graph_launch");
  if (!g.exec)
    throw RuntimeError(fmt::format("cuda backend: graph_launch({}) on rank {}: {}", token, g.rank,
                                   g.failed  ? "its graph_end failed (the error said why); record it again"
                                   : g.ended ? "the graph's run has ended (graphs live until their spawn() returns)"
                                             : "its recording has not ended (graph_end)"));
  Device& d = impl_->dev(g.rank);
  d.use();
  CUBESIM_CUDA_CHECK(cudaGraphLaunch(g.exec, d.stream));
  ++g.launches;
}

std::unique_ptr<Context> make_cuda_context(ContextOptions ctx_opts, CudaBackendOptions cuda_opts) {
  int ranks = ctx_opts.world_size;
  if (ranks <= 0) {
    ranks = cuda_device_count();
    if (ranks == 0) {
      throw RuntimeError(fmt::format("cuda backend: no CUDA GPU ({}); use the sim or host backend on this machine",
                                     cuda_unavailable_reason()));
    }
  }
  auto be = std::make_unique<CudaBackend>(ranks, cuda_opts);
  ctx_opts.world_size = ranks;
  ctx_opts.stack_size = std::max<std::size_t>(ctx_opts.stack_size, 1 << 20);
  return std::make_unique<Context>(ctx_opts, std::move(be));
}

namespace {
std::unique_ptr<Context> make_cuda(ContextOptions o, const BackendArgs& a) {
  reject_topology("cuda", a);
  OptionReader r("cuda", a.options);
  CudaBackendOptions co;
  co.gemm_mode = cuda::parse_gemm_mode(r.choice("gemm_mode", "exact", {"exact", "tensor_core"}));
  co.collectives = parse_cuda_collectives(r.choice("collectives", "ring", {"ring", "nccl"}));
  co.share_gpus = r.flag("share_gpus", false);
  co.measure = r.flag("measure", true);
  r.finish();
  if (cuda_device_count() == 0) {
    throw BackendUnavailableError("backend 'cuda': no usable GPU here (" + cuda_unavailable_reason() +
                                  "); use backend 'sim' or 'host'");
  }
  return make_cuda_context(o, co);
}
}  // namespace

extern const BackendInfo kCudaBackendInfo;
const BackendInfo kCudaBackendInfo{
    .name = "cuda",
    .summary = "real GPUs, one rank per GPU: exact or tensor-core GEMMs, the runtime's collectives or NCCL",
    .options = "gemm_mode ('exact' | 'tensor_core'), collectives ('ring' | 'nccl'), share_gpus (bool: more ranks "
               "than GPUs, rank r on GPU r % GPUs; ring collectives only), measure (bool, default true: CUDA events "
               "around every GEMM and collective, kept until the context goes)",
    .devices = &cuda_device_count,
    .unavailable = [] { return cuda_device_count() > 0 ? std::string() : "no usable GPU: " + cuda_unavailable_reason(); },
    .make = &make_cuda};

}  // namespace cubesim::rt
