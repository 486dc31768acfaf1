#include "runtime/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace cubesim::rt {

namespace {
template <class F>
void bind(void* h, const char* sym, F*& out, const std::string& path, bool required = true) {
  out = reinterpret_cast<F*>(dlsym(h, sym));
  if (!out && required) {
    throw RuntimeError(fmt::format("NCCL library '{}' lacks the symbol {} (NCCL 2.12 or newer is needed)", path, sym));
  }
}

NcclLibrary load() {
  // Before NCCL reads its environment: multicast stays off (see the header).
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<std::string> tried;
  std::vector<std::string> candidates = {"libnccl.so.2"};
  if (const char* p = std::getenv("CUBESIM_NCCL_LIBRARY")) candidates.insert(candidates.begin(), p);
  for (const char* p : {"/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                        "/usr/lib/x86_64-linux-gnu/libnccl.so.2"}) {
    candidates.emplace_back(p);
  }
  void* h = nullptr;
  NcclLibrary lib;
  for (const auto& c : candidates) {
    h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      lib.path = c;
      break;
    }
    const char* e = dlerror();
    tried.push_back(fmt::format("{} ({})", c, e ? e : "not found"));
  }
  if (!h) {
    std::string msg = "the cuda backend's NCCL collectives need libnccl.so.2, which could not be loaded; tried:";
    for (const auto& t : tried) msg += "\n  " + t;
    msg += "\nset CUBESIM_NCCL_LIBRARY to its path, or use the deterministic ring (collectives = ring)";
    throw RuntimeError(msg);
  }
  bind(h, "ncclGetVersion", lib.get_version, lib.path);
  bind(h, "ncclCommInitAll", lib.comm_init_all, lib.path);
  bind(h, "ncclCommDestroy", lib.comm_destroy, lib.path);
  bind(h, "ncclGetErrorString", lib.get_error_string, lib.path);
  bind(h, "ncclGetLastError", lib.get_last_error, lib.path, false);
  bind(h, "ncclGroupStart", lib.group_start, lib.path);
  bind(h, "ncclGroupEnd", lib.group_end, lib.path);
  bind(h, "ncclAllReduce", lib.all_reduce, lib.path);
  bind(h, "ncclAllGather", lib.all_gather, lib.path);
  bind(h, "ncclReduceScatter", lib.reduce_scatter, lib.path);
  bind(h, "ncclBroadcast", lib.broadcast, lib.path);
  lib.check(lib.get_version(&lib.version), "ncclGetVersion");
  return lib;
}
}  // namespace

const NcclLibrary& NcclLibrary::get() {
  static std::once_flag once;
  static NcclLibrary lib;
  static std::string error;
  std::call_once(once, [] {
    try {
      lib = load();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw RuntimeError(error);
  return lib;
}

void NcclLibrary::check(ncclResult_t r, const std::string& call) const {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = get_last_error ? get_last_error(nullptr) : nullptr;
  throw NcclError(fmt::format("{} failed: {} (NCCL {}){}{}", call, get_error_string ? get_error_string(r) : "?", version,
                                 last && *last ? ": " : "", last ? last : ""));
}

}  // namespace cubesim::rt
