// backend_registry.h — every backend by name: whether it can run here, and how to make a Context on it.
//
// The registry is a table (backend_registry.cpp) with one row per backend; each row is defined in
// its backend's own file, next to its code (sim_backend.cpp, host_backend.cpp, cuda_backend.cpp;
// backend_info.h says what a row holds). Everything that names backends reads the table: parsing a
// name, the Python Context(...) factory, cubesim.backends(), the CLI's --backend choices.
//
//   hw::Topology topo = hw::load_topology("ring4");
//   auto ctx = rt::make_context("sim", {.world_size = 4}, {.topology = &topo, .options = {{"timing_only", true}}});
//   for (const BackendInfo* b : rt::backends()) fmt::print("{}: {}\n", b->name, b->summary);
//
// Library cubesim::backends: it sits above runtime/ and the cuda backend's library.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "runtime/backend_info.h"

namespace cubesim::rt {

// The rows, in the order listings show them.
std::span<const BackendInfo* const> backends();
// The row named `name`; RuntimeError listing the valid names otherwise.
const BackendInfo& find_backend(std::string_view name);
inline const BackendInfo& parse_backend(std::string_view name) { return find_backend(name); }
// find_backend(name).make(opts, args).
std::unique_ptr<Context> make_context(std::string_view backend, ContextOptions opts, const BackendArgs& args = {});

}  // namespace cubesim::rt
