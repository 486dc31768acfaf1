// errors.h — the exceptions sim/hw throws for mistakes a user can make.
//
// TopologyError: a topology file or JSON document is invalid. The message names the file, the
//   dotted JSON path, the value, and what would be valid:
//     topology 'mesh4x4' (topologies/mesh4x4.json): network.link.bandwidth_GBps: -5 is not valid;
//     give a bandwidth > 0 (GB/s, 1 GB/s = 1e9 bytes/s)
// MemoryError: an access outside a memory, a bad free. OutOfMemoryError adds the allocator's
//   statistics. UninitializedReadError: bytes read before anything wrote them (when checked).
// TransferError: a transfer that cannot be made (zero-size region, bad shape, no route).
// Hazards (a read while a write is in flight) are HazardError, in hazard.h.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace cubesim::hw {

class TopologyError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class MemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class OutOfMemoryError : public MemoryError {
 public:
  using MemoryError::MemoryError;
};

class UninitializedReadError : public MemoryError {
 public:
  UninitializedReadError(const std::string& what, std::uint64_t first_unwritten)
      : MemoryError(what), first_unwritten_(first_unwritten) {}
  // The address of the first byte that was never written.
  std::uint64_t first_unwritten() const { return first_unwritten_; }

 private:
  std::uint64_t first_unwritten_;
};

class TransferError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace cubesim::hw
