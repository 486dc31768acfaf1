// unit.h — a hardware unit: one piece of the machine with its own figures, counters and trace track.
//
// Every memory (HBM, TCM, host DRAM), DMA channel, link direction, MAC array and vector unit of a
// System is a Unit with an id, a kind and a name. A unit counts what it serves
// (bytes, or operations on a compute unit; pieces; busy time) whether or not a trace records, so
// statistics come from the counters (System::usage()), never from a recorded trace:
//
//   for (const UnitUsage& u : sys.usage())
//     if (u.kind == UnitKind::link && u.busy > 0) fmt::print("{}: {} bytes\n", u.name, u.bytes);
//
// Units that chunks of a transfer pass are PathUnits (path_unit.h); System builds each transfer's
// path as a chain of them. How to add a unit: docs/ARCHITECTURE.md, "How to add a hardware unit".
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/time.h"
#include "sim/core/trace.h"
#include "sim/hw/server.h"

namespace cubesim::hw {

// dma_read: a DMA channel into a PE's TCM; dma_write: out of it. switch_port: a switch's ports
// facing one cube, one direction (switch_port.h); l2: a cube's L2 cache (l2_cache.h).
enum class UnitKind : std::uint8_t { memory, dma_read, dma_write, link, mac, vector, switch_port, l2 };
// "memory", "dma_read", "dma_write", "link", "mac", "vector", "switch_port", "l2"
constexpr std::string_view unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::l2: return "l2";
    case UnitKind::memory: return "memory";
    case UnitKind::dma_read: return "dma_read";
    case UnitKind::dma_write: return "dma_write";
    case UnitKind::link: return "link";
    case UnitKind::mac: return "mac";
    case UnitKind::vector: return "vector";
    case UnitKind::switch_port: return "switch_port";
  }
  return "?";
}

// A unit's index in its System (System::unit(id)); ids are dense, in the order the System built them.
struct UnitId {
  std::uint32_t value = 0;
  friend auto operator<=>(UnitId, UnitId) = default;
};

// Where a unit sits. Links name their endpoints (a cube id, kSwitchNode or
// kHostNode, topology.h); -1 where a field does not apply.
struct UnitPlace {
  int cube = -1;  // the cube it belongs to (-1: the host, a link, the switch)
  int pe = -1;    // the PE it belongs to
  int from = -1;  // links and switch ports
  int to = -1;
};

// What a unit has done so far.
struct UnitCounters {
  std::uint64_t bytes = 0;  // bytes served; a compute unit counts operations
  std::uint64_t pieces = 0; // chunks (or pieces of compute work) served
  sim::Duration busy = 0;   // time occupied; a memory of several channels: its busiest channel's
  std::vector<sim::Duration> channel_busy;  // a memory of several channels: each channel's busy time
  std::uint64_t hits = 0;   // caches: sectors read that were in the cache (l2_cache.h)
  std::uint64_t misses = 0; // caches: sectors read that were fetched from below
  std::uint64_t fill_bytes = 0;       // caches: bytes fetched from the memory below on misses
  std::uint64_t writeback_bytes = 0;  // caches: dirty bytes written to the memory below on eviction
};

// What identifies a unit (plain data: a System's catalog of thousands of units costs no strings).
struct UnitInfo {
  UnitId id;
  UnitKind kind = UnitKind::memory;
  UnitPlace place;
};

// A unit's name, from its kind and place: "cube0.hbm", "cube0.l2", "cube0.pe3.tcm", "host", "cube0.pe3.dma.read",
// "link c0->c1" (links name their endpoints c<i>, sw, host), "cube0.pe3.mac", "switch.port c3->sw"
// (the ports receiving from cube 3) and "switch.port sw->c3" (those sending to it). Every unit's name()
// is this (a new kind names itself here).
std::string unit_name(UnitKind kind, const UnitPlace& place);

// A unit's counters, and what identifies it.
struct UnitUsage : UnitInfo, UnitCounters {
  std::string name;  // unit_name(kind, place)
};

// The counters accrued between two snapshots of the same System (`before` taken first): bytes,
// pieces, busy time, hits, misses, fill and write-back bytes are differences; a memory's busy time is its busiest
// channel's over the interval.
std::vector<UnitCounters> counters_since(std::vector<UnitCounters> now, std::span<const UnitCounters> before);
// Each unit's identity with its counters (the same units, in id order).
std::vector<UnitUsage> usage_of(std::span<const UnitInfo> units, std::span<const UnitCounters> counters);
inline std::vector<UnitUsage> usage_since(std::span<const UnitInfo> units, std::vector<UnitCounters> now,
                                          std::span<const UnitCounters> before) {
  return usage_of(units, counters_since(std::move(now), before));
}

// Adds a server's counters (bytes, pieces, busy time) to u: what a unit of one server counts.
inline void count_server(const Server& s, UnitCounters& u) {
  u.bytes += s.bytes;
  u.pieces += s.chunks;
  u.busy += s.busy;
}

class Unit {
 public:
  // The unit's name is unit_name(kind, place), made when first asked: systems of thousands of units
  // pay for names only where someone reads them.
  Unit(UnitKind kind, UnitPlace place) : kind_(kind), place_(place) {}
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  UnitId id() const { return id_; }
  UnitKind kind() const { return kind_; }
  const std::string& name() const {
    if (name_.empty()) name_ = unit_name(kind_, place_);
    return name_;
  }
  const UnitPlace& place() const { return place_; }
  UnitInfo info() const { return UnitInfo{.id = id_, .kind = kind_, .place = place_}; }

  // The counters so far.
  UnitCounters counters() const {
    UnitCounters c;
    count(c);
    return c;
  }
  // The counters with what identifies the unit.
  UnitUsage usage() const {
    UnitUsage u;
    static_cast<UnitInfo&>(u) = info();
    u.name = name();
    count(u);
    return u;
  }

  // The unit's trace track: group ("cube3", "links", "host") and name ("pe5.dma.read",
  // "link c0->c1"); made when a trace needs them. A memory of several channels also has a track per
  // channel ("hbm.ch3").
  virtual std::string track_group() const = 0;
  virtual std::string track_name() const = 0;
  // Names the unit's trace track(s) in `trace` now, so that a trace shows the unit even where it
  // did nothing (tracks are otherwise made on the first span).
  virtual void declare_tracks(sim::Trace& trace) = 0;

 protected:
  // Adds the unit's counters to c.
  virtual void count(UnitCounters& c) const = 0;

 private:
  friend class System;  // assigns ids
  UnitId id_;
  UnitKind kind_;
  mutable std::string name_;
  UnitPlace place_;
};

// Names of a cube's units, built with one allocation and no format string (systems of thousands of
// units name them all for a report): "cube3", "pe5", and cube_pe_name(3, 5, ".dma.read") is
// "cube3.pe5.dma.read".
std::string cube_name(int cube);
std::string pe_name(int pe);
std::string cube_pe_name(int cube, int pe, std::string_view suffix);

}  // namespace cubesim::hw
