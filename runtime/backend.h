// backend.h — where a program runs: the one seam between "what it computes" and "where".
//
// Model code (tp/) and the collectives are written once against Context/Tensor; a Backend
// provides storage on each rank, timed movement between ranks, and compute. Three exist:
//   sim   simulated cubes: bytes in simulated HBM, movement through simulated links, time charged
//         from the hardware model (values are computed on the host by the same kernels);
//   host  the reference: plain CPU memory, no time;
//   cuda  real GPUs (one rank per GPU; issue 8).
// All calls are made from a rank's own process (a fiber), which a timed call blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/dtype.h"
#include "runtime/storage.h"
#include "sim/core/simulator.h"
#include "sim/core/time.h"

namespace cubesim::rt {

class Tensor;

enum class BackendKind { sim, host, cuda };
std::string_view backend_name(BackendKind k);
BackendKind parse_backend(std::string_view s);  // throws RuntimeError listing sim, host, cuda

// What a piece of compute costs, for backends that charge time for work done on host values.
struct OpCost {
  enum class Kind { gemm, reduce, elementwise, copy } kind = Kind::elementwise;
  const char* name = "op";
  std::int64_t m = 0, n = 0, k = 0;  // gemm shape (m x k times k x n)
  DType dtype = DType::f32;          // input dtype (sets the MAC or vector rate)
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  double flops = 0;                  // elementwise/reduce arithmetic, for vector-unit time
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Called once by the Context with its scheduler, before any other call.
  virtual void attach(sim::Simulator& sim) {}
  virtual BackendKind kind() const = 0;
  virtual int ranks() const = 0;  // devices available (cubes, GPUs, or any number on the host)
  virtual std::string describe() const = 0;

  // Device memory on `rank`. Throws (out of memory with the allocator's statistics) naming `what`.
  virtual std::shared_ptr<Storage> allocate(int rank, std::uint64_t bytes, std::string_view what) = 0;

  // Moves n bytes between any two storages (a device-to-device transfer), blocking the calling
  // process until they have landed. Timing-only backends move no values.
  virtual void copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off,
                    std::uint64_t n) = 0;

  // Charges the simulated time of work that the runtime computed on host values, on `rank`
  // (blocks the calling process for it). `overlapped_with` is time already spent that the work
  // streamed alongside (a reduction fused with the receive that delivered its data): only the
  // excess is charged.
  virtual void charge(int rank, const OpCost& cost, sim::Duration overlapped_with = 0) {}

  // Runs c = a·b (+ bias) itself — values and time, on the calling rank — and returns true; or
  // returns false, and the runtime computes it on the host and charge()s it. (2-D views.)
  virtual bool gemm(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) {
    return false;
  }

  // Whether values are skipped (sweeps of large systems): compute and copies move no bytes, and
  // timing is identical.
  virtual bool timing_only() const { return false; }
};

}  // namespace cubesim::rt
