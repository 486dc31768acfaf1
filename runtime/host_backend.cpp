#include "runtime/host_backend.h"

#include <cstring>
#include <new>

#include <fmt/format.h>

#include "runtime/backend_info.h"
#include "runtime/errors.h"

namespace cubesim::rt {

HostStorage::HostStorage(int rank, std::uint64_t bytes)
    : Storage(rank, bytes), data_(new std::uint8_t[bytes ? bytes : 1]) {}

void HostStorage::read(std::uint64_t offset, void* dst, std::uint64_t n) const {
  std::memcpy(dst, data_.get() + offset, n);
}
void HostStorage::write(std::uint64_t offset, const void* src, std::uint64_t n) {
  std::memcpy(data_.get() + offset, src, n);
}
std::string HostStorage::where() const { return fmt::format("host memory of rank {}", rank()); }

std::string HostBackend::describe() const { return fmt::format("host reference backend, {} ranks", ranks_); }

std::shared_ptr<Storage> HostBackend::allocate(int rank, std::uint64_t bytes, std::string_view what) {
  if (rank < 0 || rank >= ranks_) {
    throw RuntimeError(fmt::format("allocation '{}' on rank {}: valid ranks are 0 to {}", what, rank, ranks_ - 1));
  }
  try {
    return std::make_shared<HostStorage>(rank, bytes);
  } catch (const std::bad_alloc&) {
    // Still a bad_alloc (Python: MemoryError), but one that says what was asked for.
    struct HostOutOfMemory : std::bad_alloc {
      std::string msg;
      const char* what() const noexcept override { return msg.c_str(); }
    } e;
    e.msg = fmt::format("allocation '{}' on rank {}: the host backend cannot allocate {} bytes of host memory", what,
                        rank, bytes);
    throw e;
  }
}

void HostBackend::copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n) {
  if (n == 0) return;
  auto& s = const_cast<Storage&>(src);
  std::memmove(static_cast<std::uint8_t*>(dst.host_ptr()) + dst_off, static_cast<std::uint8_t*>(s.host_ptr()) + src_off, n);
}

namespace {
std::unique_ptr<Context> make_host(ContextOptions o, const BackendArgs& a) {
  reject_topology("host", a);
  OptionReader r("host", a.options);
  const auto numerics = kernels::parse_accumulator_model(
      r.choice("gemm_numerics", "f32_fma_seq", {"f32_fma_seq", "pairwise", "bf16_acc", "hopper_tc"}));
  r.finish();
  auto ctx = std::make_unique<Context>(o);
  ctx->backend().set_gemm_numerics(numerics);
  return ctx;
}
}  // namespace

extern const BackendInfo kHostBackendInfo;
const BackendInfo kHostBackendInfo{
    .name = "host",
    .summary = "the reference: plain CPU memory, no simulated time; the bit-exact replay of a simulated run",
    .options = "gemm_numerics ('f32_fma_seq' (the contract) | 'pairwise' | 'bf16_acc' | 'hopper_tc': the GEMMs' "
               "accumulator model, kernels/accumulator.h); world_size >= 1 ranks",
    .devices = [] { return -1; },
    .unavailable = [] { return std::string(); },
    .make = &make_host};

}  // namespace cubesim::rt
