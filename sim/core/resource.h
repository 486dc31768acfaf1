// resource.h — a counting semaphore with strict FIFO queueing (no barging).
//
// A request for n units waits until it is at the head of the queue and n units are free; a later
// small request never overtakes an earlier large one, so service order is arrival order.
//
//   Resource port(1, "link0");          // one unit: a mutex
//   port.acquire();  this_process::sleep(transfer_time(bytes, bw));  port.release();
#pragma once

#include <cstdint>
#include <string>

#include "sim/core/waiter.h"

namespace cubesim::sim {

class Resource {
 public:
  explicit Resource(std::uint64_t capacity, std::string name = "resource");
  Resource(const Resource&) = delete;
  Resource& operator=(const Resource&) = delete;

  void acquire(std::uint64_t n = 1);      // blocks the calling process
  bool try_acquire(std::uint64_t n = 1);  // never blocks; false if it would have to wait
  void release(std::uint64_t n = 1);      // from a process or a callback

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t available() const { return available_; }
  std::size_t queued() const { return waiters_.count; }
  const std::string& name() const { return name_; }

 private:
  void grant();
  std::string name_;
  std::uint64_t capacity_;
  std::uint64_t available_;
  WaiterList waiters_;
};

}  // namespace cubesim::sim
