// nccl_library.h — NCCL for the cuda backend, loaded when first asked for (dlopen).
//
// Loading at run time means binaries start where libnccl is absent (CI; the deterministic ring needs
// no NCCL) and only a run that selects NCCL needs the library. It is looked up as libnccl.so.2 on
// the loader's path, then $CUBESIM_NCCL_LIBRARY, then CUDA's lib directories. NVLink multicast
// (NVLS) is switched off before the first NCCL call: NCCL_NVLS_ENABLE=0, whatever the environment
// says (on shared hosts a program that uses multicast can take the GPUs out of service).
//
//   const NcclLibrary& nccl = NcclLibrary::get();     // RuntimeError listing the paths tried
//   nccl.check(nccl.comm_init_all(comms, n, devs), "ncclCommInitAll");   // NcclError naming the call
#pragma once

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace cubesim::rt {

// A failed NCCL call: the message names the call and ncclGetErrorString (and ncclGetLastError).
class NcclError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NcclLibrary {
  static const NcclLibrary& get();

  std::string path;  // the file that was loaded
  int version = 0;   // ncclGetVersion: 22809 for 2.28.9

  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  const char* (*get_last_error)(ncclComm_t) = nullptr;  // may be null (NCCL before 2.13)
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                 cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;

  // Throws NcclError "<call> failed: <ncclGetErrorString> (NCCL <version>): <ncclGetLastError>".
  void check(ncclResult_t r, const std::string& call) const;
};

}  // namespace cubesim::rt
