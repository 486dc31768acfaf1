#include "sim/hw/memory.h"

#include <cstring>

#include <fmt/format.h>

#include "sim/hw/errors.h"
#include "sim/hw/format.h"
#include "sim/hw/system.h"

namespace cubesim::hw {

Memory::Memory(System& sys, MemoryKind kind, int id, int cube, int pe, std::string name, std::uint64_t capacity,
               sim::Bandwidth bandwidth, sim::Duration latency, std::uint32_t channels, std::uint64_t interleave)
    : sys_(&sys),
      kind_(kind),
      id_(id),
      cube_(cube),
      pe_(pe),
      name_(std::move(name)),
      capacity_(capacity),
      bandwidth_(bandwidth),
      latency_(latency),
      interleave_(interleave == 0 ? 1 : interleave),
      channels_(channels == 0 ? 1 : channels),
      allocator_(name_, capacity) {
  // Equal channels (the remainder of bytes_per_s / channels, under one byte per second per channel,
  // is dropped), so that evenly striped traffic books all channels alike.
  const std::uint64_t n = channels_.size();
  for (Server& c : channels_) c.bandwidth = sim::Bandwidth{bandwidth.bytes_per_s / n};
  stripe_.bandwidth = channels_[0].bandwidth;
}

std::uint64_t Memory::bytes_served() const {
  std::uint64_t b = stripe_.bytes;
  for (const Server& c : channels_) b += c.bytes;
  return b;
}

void Memory::check_range(std::uint64_t addr, std::uint64_t len, std::string_view what) const {
  if (len > capacity_ || addr > capacity_ - len) {
    throw MemoryError(fmt::format("{}: {} [{:#x}, {:#x}) ({} bytes) is outside the memory: capacity {} ({} bytes), "
                                  "valid addresses 0x0..{:#x}",
                                  name_, what, addr, addr + len, len, format_bytes(capacity_), capacity_,
                                  capacity_ - 1));
  }
}

void Memory::check_region(const Region& r, std::string_view what) const {
  if (r.empty()) return;
  if (r.rows > 1 && r.pitch < r.row_bytes) {
    throw MemoryError(fmt::format("{}: {} has pitch {} smaller than its rows ({} bytes); rows must not overlap", name_,
                                  what, r.pitch, r.row_bytes));
  }
  // rows * pitch must not wrap before the bounds check sees it.
  if (r.rows > 1 && r.pitch > (capacity_ / (r.rows - 1))) {
    throw MemoryError(fmt::format("{}: {} spans {} rows {} bytes apart, beyond the capacity {}", name_, what, r.rows,
                                  r.pitch, format_bytes(capacity_)));
  }
  check_range(r.addr, r.end() - r.addr, what);
}

void Memory::write(std::uint64_t addr, std::span<const std::byte> data) {
  check_range(addr, data.size(), "write");
  if (data.empty()) return;
  sys_->check_hazards(*this, Region::contiguous(addr, data.size()), true, nullptr);
  if (sys_->options().functional) store_.write(addr, data.data(), data.size());
}

void Memory::fill(std::uint64_t addr, std::uint64_t len, std::byte value) {
  check_range(addr, len, "fill");
  if (len == 0) return;
  sys_->check_hazards(*this, Region::contiguous(addr, len), true, nullptr);
  if (sys_->options().functional) store_.fill(addr, len, value);
}

void Memory::read(std::uint64_t addr, std::span<std::byte> out) {
  check_range(addr, out.size(), "read");
  if (out.empty()) return;
  sys_->check_hazards(*this, Region::contiguous(addr, out.size()), false, nullptr);
  if (!sys_->options().functional) {
    std::memset(out.data(), 0, out.size());
    return;
  }
  if (sys_->options().check_uninitialized) {
    if (auto u = store_.first_unwritten(addr, out.size())) {
      throw UninitializedReadError(
          fmt::format("{}: {} reads [{:#x}, {:#x}) at {} but byte {:#x} was never written; write it first, or set "
                      "SystemOptions::check_uninitialized = false to read zeros",
                      name_, sys_->actor(), addr, addr + out.size(), sim::format_time(sys_->simulator().now()), *u),
          *u);
    }
  }
  store_.read(addr, out.data(), out.size());
}

std::optional<std::uint64_t> Memory::first_unwritten(std::uint64_t addr, std::uint64_t len) const {
  check_range(addr, len, "first_unwritten");
  if (!sys_->options().functional) return std::nullopt;
  return store_.first_unwritten(addr, len);
}

}  // namespace cubesim::hw
