#include "sim/hw/unit.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

#include "sim/hw/path_unit.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

namespace {
void append_int(std::string& s, int v) {
  char buf[16];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}
}  // namespace

std::string cube_name(int cube) {
  std::string s = "cube";
  append_int(s, cube);
  return s;
}

std::string pe_name(int pe) {
  std::string s = "pe";
  append_int(s, pe);
  return s;
}

std::string cube_pe_name(int cube, int pe, std::string_view suffix) {
  std::string s;
  s.reserve(4 + 11 + 3 + 11 + suffix.size());
  s += "cube";
  append_int(s, cube);
  s += ".pe";
  append_int(s, pe);
  s += suffix;
  return s;
}

std::string unit_name(UnitKind kind, const UnitPlace& p) {
  switch (kind) {
    case UnitKind::memory:
      if (p.cube < 0) return "host";
      return p.pe >= 0 ? cube_pe_name(p.cube, p.pe, ".tcm") : cube_name(p.cube) + ".hbm";
    case UnitKind::dma_read: return cube_pe_name(p.cube, p.pe, ".dma.read");
    case UnitKind::dma_write: return cube_pe_name(p.cube, p.pe, ".dma.write");
    case UnitKind::link: return "link " + node_name(p.from) + "->" + node_name(p.to);
    case UnitKind::mac: return cube_pe_name(p.cube, p.pe, ".mac");
    case UnitKind::vector: return cube_pe_name(p.cube, p.pe, ".vector");
    case UnitKind::switch_port: return "switch.port " + node_name(p.from) + "->" + node_name(p.to);
    case UnitKind::l2: return cube_name(p.cube) + ".l2";
  }
  return std::string(unit_kind_name(kind));
}

std::vector<UnitCounters> counters_since(std::vector<UnitCounters> now, std::span<const UnitCounters> before) {
  if (now.size() != before.size()) {
    throw std::logic_error(fmt::format("counters_since: {} units now but {} before: not snapshots of one System",
                                       now.size(), before.size()));
  }
  for (std::size_t i = 0; i < now.size(); ++i) {
    UnitCounters& u = now[i];
    const UnitCounters& b = before[i];
    u.bytes -= b.bytes;
    u.pieces -= b.pieces;
    u.hits -= b.hits;
    u.misses -= b.misses;
    u.fill_bytes -= b.fill_bytes;
    u.writeback_bytes -= b.writeback_bytes;
    if (!u.channel_busy.empty() && u.channel_busy.size() == b.channel_busy.size()) {
      for (std::size_t c = 0; c < u.channel_busy.size(); ++c) u.channel_busy[c] -= b.channel_busy[c];
      u.busy = *std::max_element(u.channel_busy.begin(), u.channel_busy.end());
    } else {
      u.busy -= b.busy;
    }
  }
  return now;
}

std::vector<UnitUsage> usage_of(std::span<const UnitInfo> units, std::span<const UnitCounters> counters) {
  if (units.size() != counters.size()) {
    throw std::logic_error(fmt::format("usage_of: {} units but {} counters", units.size(), counters.size()));
  }
  std::vector<UnitUsage> out(units.size());
  for (std::size_t i = 0; i < units.size(); ++i) {
    static_cast<UnitInfo&>(out[i]) = units[i];
    static_cast<UnitCounters&>(out[i]) = counters[i];
    out[i].name = unit_name(units[i].kind, units[i].place);
  }
  return out;
}

void PathUnit::trace_chunk(const ChunkVisit& v, Server& s, std::uint64_t channel, sim::Time start, sim::Time end,
                           std::uint64_t bytes) {
  sim::Trace& tr = *v.trace;
  if (s.track == Server::kNoTrack) s.track = tr.track(track_name_of(channel), track_group());
  start = std::max(start, s.traced_until);
  if (end <= start) return;
  s.traced_until = end;
  tr.span(s.track, fmt::format("t{}", v.transfer), start, end,
          {{"bytes", bytes}, {"chunk", v.chunk}, {"from", v.from->name()}, {"to", v.to->name()}});
}

}  // namespace cubesim::hw
