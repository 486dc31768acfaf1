// bench_util.h — what every benchmark shares: a wall clock, --json FILE parsing, an aligned table.
//
//   BenchArgs args = parse_bench_args(argc, argv, "bench_sim_core");
//   Table t({"metric", "value", "target"});  t.row({...});  t.print();
//   write_json(args, json);   // only when --json FILE was given
#pragma once

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace cubesim::bench {

struct BenchArgs {
  std::string json_path;            // --json FILE
  bool quick = false;               // --quick: smaller sizes (smoke tests)
  std::vector<std::string> rest;    // anything else, for the benchmark to interpret
};

inline BenchArgs parse_bench_args(int argc, char** argv, const char* name) {
  BenchArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--json") {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{}: --json needs a file path", name));
      a.json_path = argv[++i];
    } else if (s == "--quick") {
      a.quick = true;
    } else if (s == "-h" || s == "--help") {
      fmt::print("usage: {} [--json FILE] [--quick]\n", name);
      std::exit(0);
    } else {
      a.rest.push_back(s);
    }
  }
  return a;
}

inline double wall_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

inline void write_json(const BenchArgs& a, const nlohmann::json& j) {
  if (a.json_path.empty()) return;
  std::ofstream f(a.json_path);
  if (!f) throw std::runtime_error(fmt::format("cannot write --json file '{}'", a.json_path));
  f << j.dump(2) << "\n";
  fmt::print("wrote {}\n", a.json_path);
}

class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void row(std::vector<std::string> r) { rows_.push_back(std::move(r)); }
  void print() const {
    std::vector<std::size_t> w;
    for (const auto& r : rows_) {
      if (w.size() < r.size()) w.resize(r.size(), 0);
      for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      std::string line;
      for (std::size_t i = 0; i < rows_[k].size(); ++i) {
        line += fmt::format("{:<{}}", rows_[k][i], w[i] + 2);
      }
      fmt::print("{}\n", line);
      if (k == 0) {
        std::size_t total = 0;
        for (auto x : w) total += x + 2;
        fmt::print("{}\n", std::string(total, '-'));
      }
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace cubesim::bench
