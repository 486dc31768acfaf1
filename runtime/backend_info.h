// backend_info.h — what a backend tells the registry about itself (one row of the table in
// backend_registry.cpp), and the reader of its options.
//
// Each backend defines its row next to its code:
//
//   extern const BackendInfo kHostBackendInfo;
//   const BackendInfo kHostBackendInfo{.name = "host", .summary = "...", .options = "none",
//                                      .devices = [] { return -1; },
//                                      .unavailable = [] { return std::string(); }, .make = &make_host};
//
// A backend's own options come by name (a JSON object) and the backend reads them with an
// OptionReader, so an option it does not take is an error naming the options it does.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/context.h"
#include "sim/hw/topology.h"

namespace cubesim::rt {

struct BackendArgs {
  const hw::Topology* topology = nullptr;             // the system to simulate (sim; the others take none)
  nlohmann::json options = nlohmann::json::object();  // the backend's own options, by name
};

struct BackendInfo {
  std::string_view name;     // "sim", "host", "cuda"
  std::string_view summary;  // one line, for listings and help
  std::string_view options;  // the options it takes, for help: "timing_only (bool), hazards ('throw'|...)"
  // True when it simulates the system of a topology (it takes one; its ranks are the cubes).
  bool simulates = false;
  // Ranks it offers here without a topology: -1 any number (host), else the devices (cuda: GPUs).
  int (*devices)() = nullptr;
  // Why the backend cannot run here ("this build has no CUDA", "no GPU: ..."); "" when it can.
  std::string (*unavailable)();
  // A context on it. Throws BackendUnavailableError when unavailable, RuntimeError naming a bad option.
  std::unique_ptr<Context> (*make)(ContextOptions, const BackendArgs&);
};

// Reads a backend's options: each read marks its key as known; finish() rejects the rest, naming
// the backend, the key and the options it takes.
//
//   OptionReader r("sim", args.options);
//   const bool timing_only = r.flag("timing_only", false);
//   r.finish();
class OptionReader {
 public:
  OptionReader(std::string_view backend, const nlohmann::json& options);
  bool flag(std::string_view key, bool dflt);
  // One of `choices`; RuntimeError listing them otherwise.
  std::string choice(std::string_view key, std::string_view dflt, std::initializer_list<std::string_view> choices);
  // A list of integers (empty when absent); RuntimeError otherwise.
  std::vector<int> int_list(std::string_view key);
  void finish() const;

 private:
  std::string backend_;
  const nlohmann::json& options_;
  std::vector<std::string> known_;
};

// Backends that simulate no system take no topology: RuntimeError when one is given.
void reject_topology(std::string_view backend, const BackendArgs& args);

}  // namespace cubesim::rt
