// trace.h — spans and instants on named tracks, exported as Chrome/Perfetto trace JSON.
//
// Tracks are grouped (a group becomes a "process" row in ui.perfetto.dev, a track a "thread"), so
// a cube's PEs, DMA engines and links sit together. Recording is a branch when disabled; build
// argument lists only when enabled():
//
//   Trace& tr = sim.trace();
//   auto t = tr.track("pe0.dma.read", "cube0");
//   if (tr.enabled()) tr.span(t, "load A tile", start, sim.now(), {{"bytes", 65536}});
//   tr.save("run.trace.json");     // open in ui.perfetto.dev
//
// Per-track statistics (span count, busy time) are kept whether or not spans are recorded.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "sim/core/time.h"

namespace cubesim::sim {

class Trace {
 public:
  using TrackId = std::uint32_t;
  using Value = std::variant<std::int64_t, double, std::string>;
  struct Arg {
    std::string key;
    Value value;
    Arg(std::string k, std::int64_t v) : key(std::move(k)), value(v) {}
    Arg(std::string k, int v) : key(std::move(k)), value(std::int64_t{v}) {}
    Arg(std::string k, std::uint64_t v) : key(std::move(k)), value(static_cast<std::int64_t>(v)) {}
    Arg(std::string k, double v) : key(std::move(k)), value(v) {}
    Arg(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {}
    Arg(std::string k, const char* v) : key(std::move(k)), value(std::string(v)) {}
  };
  struct TrackStats {
    std::string name;
    std::string group;
    std::uint64_t spans = 0;
    Duration busy = 0;  // sum of span lengths
    Time first = 0;
    Time last = 0;      // end of the latest span
  };

  bool enabled() const { return enabled_; }
  void set_enabled(bool on) { enabled_ = on; }

  // Returns the id of the track (group, name), creating it on first use.
  TrackId track(std::string_view name, std::string_view group = "sim");

  void span(TrackId track, std::string_view name, Time start, Time end, std::initializer_list<Arg> args = {}) {
    account(track, start, end);
    if (enabled_) record(track, name, start, end, false, args);
  }
  void instant(TrackId track, std::string_view name, Time t, std::initializer_list<Arg> args = {}) {
    if (enabled_) record(track, name, t, t, true, args);
  }

  std::size_t size() const { return records_.size(); }
  const std::vector<TrackStats>& stats() const { return tracks_; }
  const TrackStats& stats(TrackId id) const { return tracks_.at(id); }
  void clear();

  void write_chrome_json(std::ostream& os) const;
  // Writes the trace to `path`; throws std::runtime_error naming the path if it cannot.
  void save(const std::string& path) const;

 private:
  struct Record {
    Time start;
    Time end;
    TrackId track;
    std::uint32_t name;        // index into names_
    std::uint32_t args_begin;  // into args_
    std::uint32_t args_end;
    bool instant;
  };
  void account(TrackId track, Time start, Time end);
  void record(TrackId track, std::string_view name, Time start, Time end, bool instant,
              std::initializer_list<Arg> args);
  std::uint32_t intern(std::string_view s);

  bool enabled_ = false;
  std::vector<TrackStats> tracks_;
  std::unordered_map<std::string, TrackId> track_ids_;  // key: group + '\0' + name
  std::vector<std::string> names_;
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  std::vector<Record> records_;
  std::vector<Arg> args_;
};

}  // namespace cubesim::sim
