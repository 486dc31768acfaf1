#include "sim/hw/hazard.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/hw/format.h"
#include "sim/hw/unit.h"

namespace cubesim::hw {

namespace {
std::string_view hazard_kind_name(HazardKind k) {
  switch (k) {
    case HazardKind::kReadDuringWrite: return "read during write";
    case HazardKind::kWriteDuringWrite: return "write during write";
    case HazardKind::kWriteDuringRead: return "write during read";
  }
  return "?";
}
}  // namespace

HazardMode parse_hazard_mode(std::string_view s) {
  if (s == "throw") return HazardMode::kThrow;
  if (s == "record") return HazardMode::kRecord;
  if (s == "off") return HazardMode::kOff;
  throw std::invalid_argument(fmt::format("hazards: '{}' is not valid; use 'throw', 'record' or 'off'", s));
}

std::string HazardTracker::actor() const {
  std::string s;
  actor_into(s);
  return s;
}

void HazardTracker::actor_into(std::string& out) const {
  out.clear();
  if (const sim::Process* p = sim_->current()) {
    out += '\'';
    out += p->name();
    out += '\'';
  } else {
    out += "a callback";
  }
}

void InFlightSet::List::remove(const TransferInfo* t, bool write) {
  const std::uint32_t i = t->in_flight_slot[write ? 1 : 0];
  if (i >= v.size() || v[i].transfer != t) return;  // not in this list
  v[i].transfer = nullptr;
  if (++dead * 2 > v.size()) {
    v.erase(std::remove_if(v.begin(), v.end(), [](const InFlight& f) { return f.transfer == nullptr; }), v.end());
    dead = 0;
    for (std::size_t j = 0; j < v.size(); ++j) v[j].transfer->in_flight_slot[write ? 1 : 0] = static_cast<std::uint32_t>(j);
  }
}

void HazardTracker::check(const Unit& memory, const InFlightSet& in_flight, const Region& region, bool write,
                          const TransferInfo* self) {
  if (mode_ == HazardMode::kOff) return;
  const std::span<const InFlight> writes = in_flight.writes();
  if (!write) {
    // A read races with the writes alone.
    for (const InFlight& f : writes) {
      if (f.transfer && f.transfer != self && f.region.overlaps(region)) report(memory, f, region, write, self);
    }
    return;
  }
  // A write races with both, taken in the order they were issued (a transfer's read before its
  // write when both are in this memory).
  const std::span<const InFlight> reads = in_flight.reads();
  std::size_t i = 0, j = 0;
  while (i < reads.size() || j < writes.size()) {
    const bool take_read = j == writes.size() || (i < reads.size() && reads[i].id <= writes[j].id);
    const InFlight& f = take_read ? reads[i++] : writes[j++];
    if (f.transfer && f.transfer != self && f.region.overlaps(region)) report(memory, f, region, write, self);
  }
}

void HazardTracker::report(const Unit& memory, const InFlight& f, const Region& region, bool write,
                           const TransferInfo* self) {
  HazardReport h;
  h.kind = write ? (f.write ? HazardKind::kWriteDuringWrite : HazardKind::kWriteDuringRead) : HazardKind::kReadDuringWrite;
  h.time = sim_->now();
  h.memory = memory.name();
  h.actor = self ? fmt::format("transfer {} issued by {}", self->id, self->issuer) : actor();
  h.region = region;
  const TransferInfo& o = *f.transfer;
  h.other_transfer = o.id;
  h.other_region = f.region;
  h.other_actor = fmt::format("transfer {} issued by {} at {} ({} {} -> {} {})", o.id, o.issuer,
                              sim::format_time(o.issued), o.src_unit->name(), format_region(o.src_region), o.dst_unit->name(),
                              format_region(o.dst_region));
  const bool landed_known = o.landed == o.nchunks;
  h.message = fmt::format(
      "hazard ({}) at {} in {}: {} {} {} while {} is still {} {}{}; wait for that transfer before touching these bytes",
      hazard_kind_name(h.kind), sim::format_time(h.time), h.memory, h.actor, write ? "writes" : "reads",
      format_region(region), h.other_actor, f.write ? "writing" : "reading", format_region(f.region),
      landed_known ? fmt::format(" (it lands at {})", sim::format_time(o.landing)) : std::string());
  if (mode_ == HazardMode::kThrow) throw HazardError(std::move(h));
  reports_.push_back(std::move(h));
}

}  // namespace cubesim::hw
