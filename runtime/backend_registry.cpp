#include "runtime/backend_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"

namespace cubesim::rt {

// Each row lives in its backend's file (the cuda row in cuda_backend.cpp, or in
// cuda_backend_absent.cpp when this build has no CUDA).
extern const BackendInfo kSimBackendInfo;
extern const BackendInfo kHostBackendInfo;
extern const BackendInfo kCudaBackendInfo;

namespace {
const BackendInfo* const kRows[] = {
    &kSimBackendInfo,
    &kHostBackendInfo,
    &kCudaBackendInfo,
};
}  // namespace

std::span<const BackendInfo* const> backends() { return kRows; }

const BackendInfo& find_backend(std::string_view name) {
  std::vector<std::string_view> names;
  for (const BackendInfo* b : kRows) {
    if (b->name == name) return *b;
    names.push_back(b->name);
  }
  throw RuntimeError(fmt::format("unknown backend '{}': valid backends are {}", name, fmt::join(names, ", ")));
}

std::unique_ptr<Context> make_context(std::string_view backend, ContextOptions opts, const BackendArgs& args) {
  return find_backend(backend).make(opts, args);
}

}  // namespace cubesim::rt
