#include "sim/hw/unit.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "sim/hw/path_unit.h"

namespace cubesim::hw {

std::vector<UnitUsage> usage_since(std::span<const UnitUsage> now, std::span<const UnitUsage> before) {
  if (now.size() != before.size()) {
    throw std::logic_error(fmt::format("usage_since: {} units now but {} before: not snapshots of one System",
                                       now.size(), before.size()));
  }
  std::vector<UnitUsage> out(now.begin(), now.end());
  for (std::size_t i = 0; i < out.size(); ++i) {
    UnitUsage& u = out[i];
    const UnitUsage& b = before[i];
    u.bytes -= b.bytes;
    u.pieces -= b.pieces;
    u.hits -= b.hits;
    u.misses -= b.misses;
    if (!u.channel_busy.empty() && u.channel_busy.size() == b.channel_busy.size()) {
      for (std::size_t c = 0; c < u.channel_busy.size(); ++c) u.channel_busy[c] -= b.channel_busy[c];
      u.busy = *std::max_element(u.channel_busy.begin(), u.channel_busy.end());
    } else {
      u.busy -= b.busy;
    }
  }
  return out;
}

void PathUnit::trace_chunk(const ChunkVisit& v, Server& s, std::string_view name, sim::Time start, sim::Time end,
                           std::uint64_t bytes) {
  sim::Trace& tr = *v.trace;
  if (s.track == Server::kNoTrack) s.track = tr.track(name, track_group());
  start = std::max(start, s.traced_until);
  if (end <= start) return;
  s.traced_until = end;
  tr.span(s.track, fmt::format("t{}", v.transfer), start, end,
          {{"bytes", bytes}, {"chunk", v.chunk}, {"from", *v.from}, {"to", *v.to}});
}

}  // namespace cubesim::hw
