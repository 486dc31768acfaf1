// hazard.h — reports of accesses that race with a transfer in flight.
//
// While a transfer is in flight its destination is being written and its source read. Touching
// either in a way that depends on the order is a race the hardware would expose:
//   read during write  — reading a region a transfer has not finished writing (stale bytes);
//   write during write — two writers, the later landing wins;
//   write during read  — overwriting a source before the transfer has read it.
// The checker (SystemOptions::hazards) either throws HazardError at the access, records the
// report in System::hazards(), or is off. A report names both actors, both regions and the time.
//
//   SystemOptions o;  o.hazards = HazardMode::kRecord;
//   ... sim.run();
//   for (const HazardReport& h : sys.hazards()) fmt::print("{}\n", h.message);
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "sim/core/time.h"
#include "sim/hw/region.h"

namespace cubesim::hw {

enum class HazardMode : std::uint8_t { kOff, kRecord, kThrow };
enum class HazardKind : std::uint8_t { kReadDuringWrite, kWriteDuringWrite, kWriteDuringRead };

struct HazardReport {
  HazardKind kind = HazardKind::kReadDuringWrite;
  sim::Time time = 0;
  std::string memory;         // "cube1.hbm"
  std::string actor;          // who accessed now: "'rank2'", or "transfer 9 issued by 'rank2'"
  Region region;              // what it accessed
  std::string other_actor;    // the in-flight transfer: "transfer 7 issued by 'rank1' at 1.000 us"
  std::uint64_t other_transfer = 0;
  Region other_region;        // what the in-flight transfer reads or writes in this memory
  std::string message;        // one line with all of the above
};

class HazardError : public std::runtime_error {
 public:
  explicit HazardError(HazardReport r) : std::runtime_error(r.message), report_(std::move(r)) {}
  const HazardReport& report() const { return report_; }

 private:
  HazardReport report_;
};

}  // namespace cubesim::hw
