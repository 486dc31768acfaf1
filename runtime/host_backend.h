// host_backend.h — the reference backend: plain CPU memory, no simulated time.
//
// Ranks still run as processes on the scheduler (so blocking semantics are the same as on sim);
// every operation takes zero simulated time. Collectives run the same per-rank algorithm code as on
// sim, so the host is the bit-exact replay of a simulated run.
#pragma once

#include "runtime/backend.h"

namespace cubesim::rt {

class HostStorage final : public Storage {
 public:
  HostStorage(int rank, std::uint64_t bytes);
  void read(std::uint64_t offset, void* dst, std::uint64_t n) const override;
  void write(std::uint64_t offset, const void* src, std::uint64_t n) override;
  void* host_ptr() override { return data_.get(); }
  std::string where() const override;

 private:
  std::unique_ptr<std::uint8_t[]> data_;
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(int ranks) : ranks_(ranks) {}
  std::string_view name() const override { return "host"; }
  bool reference() const override { return true; }
  int ranks() const override { return ranks_; }
  std::string describe() const override;
  std::shared_ptr<Storage> allocate(int rank, std::uint64_t bytes, std::string_view what) override;
  void copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n) override;

 private:
  int ranks_;
};

}  // namespace cubesim::rt
