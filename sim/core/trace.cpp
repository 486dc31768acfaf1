#include "sim/core/trace.h"

#include <fstream>
#include <cstring>
#include <filesystem>
#include <cerrno>
#include <map>
#include <ostream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace cubesim::sim {

namespace {
void write_json_string(std::ostream& os, std::string_view s) {
  os.put('"');
  for (char c : s) {
    switch (c) {
      case '"': os << "\\\""; break;
      case '\\': os << "\\\\"; break;
      case '\n': os << "\\n"; break;
      case '\t': os << "\\t"; break;
      case '\r': os << "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          os << fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          os.put(c);
        }
    }
  }
  os.put('"');
}

// Chrome's trace format counts in microseconds; six decimals keep every picosecond.
std::string us_string(Time t) { return fmt::format("{}.{:06}", t / kPsPerUs, t % kPsPerUs); }
}  // namespace

Trace::TrackId Trace::track(std::string_view name, std::string_view group) {
  std::string key;
  key.reserve(group.size() + name.size() + 1);
  key.append(group).push_back('\0');
  key.append(name);
  auto [it, inserted] = track_ids_.try_emplace(std::move(key), static_cast<TrackId>(tracks_.size()));
  if (inserted) tracks_.push_back(TrackStats{std::string(name), std::string(group)});
  return it->second;
}

void Trace::account(TrackId track, Time start, Time end) {
  TrackStats& s = tracks_.at(track);
  if (s.spans == 0 || start < s.first) s.first = start;
  if (end > s.last) s.last = end;
  ++s.spans;
  s.busy += end - start;
}

std::uint32_t Trace::intern(std::string_view s) {
  auto it = name_ids_.find(std::string(s));
  if (it != name_ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(names_.size());
  names_.emplace_back(s);
  name_ids_.emplace(std::string(s), id);
  return id;
}

void Trace::record(TrackId track, std::string_view name, Time start, Time end, bool instant,
                   std::initializer_list<Arg> args) {
  if (track >= tracks_.size()) throw std::out_of_range(fmt::format("cubesim: trace track id {} unknown", track));
  const auto a0 = static_cast<std::uint32_t>(args_.size());
  for (const Arg& a : args) args_.push_back(a);
  records_.push_back(Record{start, end, track, intern(name), a0, static_cast<std::uint32_t>(args_.size()), instant});
}

void Trace::clear() {
  records_.clear();
  args_.clear();
  for (TrackStats& s : tracks_) s = TrackStats{s.name, s.group};
}

void Trace::write_chrome_json(std::ostream& os) const {
  // Groups become pids (in order of first appearance), tracks become tids.
  std::map<std::string, int> pid_of;
  std::vector<std::string> groups;
  for (const TrackStats& t : tracks_) {
    if (pid_of.try_emplace(t.group, static_cast<int>(groups.size()) + 1).second) groups.push_back(t.group);
  }
  os << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) os << ",\n";
    first = false;
  };
  for (std::size_t g = 0; g < groups.size(); ++g) {
    sep();
    os << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << g + 1 << ",\"tid\":0,\"args\":{\"name\":";
    write_json_string(os, groups[g]);
    os << "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" << g + 1
       << ",\"tid\":0,\"args\":{\"sort_index\":" << g << "}}";
  }
  for (std::size_t t = 0; t < tracks_.size(); ++t) {
    sep();
    os << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << pid_of[tracks_[t].group] << ",\"tid\":" << t + 1
       << ",\"args\":{\"name\":";
    write_json_string(os, tracks_[t].name);
    os << "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" << pid_of[tracks_[t].group]
       << ",\"tid\":" << t + 1 << ",\"args\":{\"sort_index\":" << t << "}}";
  }
  for (const Record& r : records_) {
    sep();
    os << "{\"name\":";
    write_json_string(os, names_[r.name]);
    os << ",\"pid\":" << pid_of[tracks_[r.track].group] << ",\"tid\":" << r.track + 1 << ",\"ts\":" << us_string(r.start);
    if (r.instant) {
      os << ",\"ph\":\"i\",\"s\":\"t\"";
    } else {
      os << ",\"ph\":\"X\",\"dur\":" << us_string(r.end - r.start);
    }
    if (r.args_end > r.args_begin) {
      os << ",\"args\":{";
      for (std::uint32_t i = r.args_begin; i < r.args_end; ++i) {
        if (i != r.args_begin) os << ',';
        write_json_string(os, args_[i].key);
        os << ':';
        std::visit(
            [&](const auto& v) {
              using V = std::decay_t<decltype(v)>;
              if constexpr (std::is_same_v<V, std::string>) {
                write_json_string(os, v);
              } else if constexpr (std::is_same_v<V, double>) {
                os << fmt::format("{}", v);
              } else {
                os << v;
              }
            },
            args_[i].value);
      }
      os << '}';
    }
    os << '}';
  }
  os << "\n]}\n";
}

void Trace::save(const std::string& path) const {
  errno = 0;
  std::ofstream f(path, std::ios::binary);
  if (!f) {
    throw std::runtime_error(fmt::format("cubesim: cannot open trace file '{}' for writing: {}", path,
                                         errno ? std::strerror(errno) : "unknown error"));
  }
  errno = 0;
  write_chrome_json(f);
  const bool wrote = f.good();
  int err = wrote ? 0 : errno;  // the failed write's reason, before close() may change errno
  if (wrote) errno = 0;
  f.close();
  if (wrote && !f) err = errno;
  if (!wrote || !f) {
    std::error_code ec;  // no partial trace left behind (a regular file only: never a device or a pipe)
    if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
    throw std::runtime_error(fmt::format("cubesim: writing trace file '{}' failed ({}{})", path,
                                         wrote ? "on close: " : "while writing: ",
                                         err ? std::strerror(err) : "the stream reported an error"));
  }
}

}  // namespace cubesim::sim
