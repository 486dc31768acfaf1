// storage.h — the bytes behind a tensor, on one rank of one backend.
//
// A backend hands out Storage; tensors share it (views). Reads and writes here are the plain,
// untimed access used by compute that happens on the host (the host backend, and the simulated
// backend, which computes values on the CPU and charges simulated time separately). Timed movement
// goes through Backend::copy.
#pragma once

#include <cstdint>
#include <string>

namespace cubesim::rt {

class Storage {
 public:
  Storage(int rank, std::uint64_t bytes) : rank_(rank), bytes_(bytes) {}
  virtual ~Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  int rank() const { return rank_; }
  std::uint64_t bytes() const { return bytes_; }
  // The Context that made it (Context::empty sets it): a tensor is used only by that context's ranks.
  const void* owner() const { return owner_; }
  void set_owner(const void* ctx) { owner_ = ctx; }

  virtual void read(std::uint64_t offset, void* dst, std::uint64_t n) const = 0;
  virtual void write(std::uint64_t offset, const void* src, std::uint64_t n) = 0;
  // Writes n zero bytes, a bounded piece at a time (no host buffer the size of the tensor); a
  // backend with a faster way (cudaMemset) overrides it.
  virtual void write_zeros(std::uint64_t offset, std::uint64_t n) {
    static constexpr std::uint8_t kZeros[64 * 1024] = {};
    while (n > 0) {
      const std::uint64_t k = n < sizeof(kZeros) ? n : sizeof(kZeros);
      write(offset, kZeros, k);
      offset += k;
      n -= k;
    }
  }
  // A host pointer to the bytes when they live in host memory (host backend), else nullptr.
  virtual void* host_ptr() { return nullptr; }
  // Where the bytes live, for messages and traces ("cube2.hbm @ 0x4000").
  virtual std::string where() const = 0;

 private:
  int rank_;
  std::uint64_t bytes_;
  const void* owner_ = nullptr;
};

}  // namespace cubesim::rt
