// hazard.h — reports of accesses that race with a transfer in flight, and the checker that makes them.
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
//
// Each System has one HazardTracker; its memories hold a reference to it (and their own list of
// the transfers touching them), so a memory checks its accesses without knowing the System.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/core/simulator.h"
#include "sim/core/time.h"
#include "sim/hw/region.h"

#include <boost/container/small_vector.hpp>

namespace cubesim::hw {
class Unit;
}

namespace cubesim::hw {

enum class HazardMode : std::uint8_t { kOff, kRecord, kThrow };
enum class HazardKind : std::uint8_t { kReadDuringWrite, kWriteDuringWrite, kWriteDuringRead };

// "throw" | "record" | "off"; anything else throws std::invalid_argument naming the input and the
// valid modes.
HazardMode parse_hazard_mode(std::string_view s);

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

// What a report says of a transfer in flight (the transfer engine's record is one).
struct TransferInfo {
  std::uint64_t id = 0;
  std::string issuer;  // "'rank3'" or "a callback"
  sim::Time issued = 0;
  // The memories (their names, "cube0.hbm", are made when a report asks: not per transfer).
  const Unit* src_unit = nullptr;
  const Unit* dst_unit = nullptr;
  Region src_region, dst_region;
  std::uint64_t nchunks = 0, landed = 0;  // the landing time is known once every chunk has landed
  sim::Time landing = 0;
  // Where InFlightSet keeps it: its entry in the source memory's reads ([0]) and in the
  // destination memory's writes ([1]).
  mutable std::uint32_t in_flight_slot[2] = {0, 0};
};

// A transfer reading from (write = false) or writing to a memory right now.
struct InFlight {
  const TransferInfo* transfer = nullptr;  // null: it has landed (InFlightSet drops it later)
  std::uint64_t id = 0;                    // transfer->id
  Region region;
  bool write = false;
};

// The transfers reading from and writing to one memory, each list in the order they were issued.
// A read is checked against the writes alone, and a transfer landing marks its entries (found
// through TransferInfo::in_flight_slot; the lists are compacted once half their entries have
// landed), so a memory with hundreds of transfers in flight (an HBM feeding every PE) costs little
// per transfer.
class InFlightSet {
 public:
  // `t` (issued after every transfer added so far) reads or writes `r`.
  void add(const TransferInfo* t, const Region& r, bool write) {
    List& l = write ? writes_ : reads_;
    t->in_flight_slot[write ? 1 : 0] = static_cast<std::uint32_t>(l.v.size());
    l.v.push_back(InFlight{.transfer = t, .id = t->id, .region = r, .write = write});
  }
  // Drops transfer t's read (write = false) or write entry, added before.
  void remove(const TransferInfo* t, bool write) { (write ? writes_ : reads_).remove(t, write); }
  std::span<const InFlight> reads() const { return {reads_.v.data(), reads_.v.size()}; }
  std::span<const InFlight> writes() const { return {writes_.v.data(), writes_.v.size()}; }
  // Forgets every entry (System::abandon_transfers: transfers of a failed run that will never land).
  void clear() {
    reads_ = {};
    writes_ = {};
  }

 private:
  struct List {
    std::size_t dead = 0;  // (before v: next to its size and first entries)
    // Inline for the usual one or two (a memory a collective reads from or writes to): no separate
    // buffer to reach per transfer.
    boost::container::small_vector<InFlight, 2> v;
    void remove(const TransferInfo* t, bool write);
  };
  List reads_, writes_;
};

class HazardTracker {
 public:
  HazardTracker(sim::Simulator& sim, HazardMode mode) : sim_(&sim), mode_(mode) {}
  HazardMode mode() const { return mode_; }
  bool enabled() const { return mode_ != HazardMode::kOff; }

  // Who is acting now, for reports: "'rank3'" in a process, "a callback" otherwise.
  std::string actor() const;
  // The same, written over `out` (reusing its buffer: a transfer record's issuer, per transfer).
  void actor_into(std::string& out) const;
  // Checks an access of `region` in `memory` against the transfers in flight there (write: also
  // against their reads), in the order they were issued. `self` is the transfer making the access,
  // or null for a process's read or write.
  void check(const Unit& memory, const InFlightSet& in_flight, const Region& region, bool write,
             const TransferInfo* self);

  // Reports recorded under HazardMode::kRecord, in the order they happened.
  const std::vector<HazardReport>& reports() const { return reports_; }
  void clear() { reports_.clear(); }

 private:
  sim::Simulator* sim_;
  HazardMode mode_;
  std::vector<HazardReport> reports_;
  void report(const Unit& memory, const InFlight& f, const Region& region, bool write, const TransferInfo* self);
};

}  // namespace cubesim::hw
