// The cuda backend's registry row in a build without CUDA: the name is known everywhere (listings,
// --backend choices), and asking for it says why it cannot run.
#include "runtime/backend_info.h"
#include "runtime/errors.h"

namespace cubesim::rt {

namespace {
constexpr const char* kWhy =
    "this build has no CUDA backend: cubesim was built without CUDA (configure with -DCUBESIM_CUDA=ON on a machine "
    "with nvcc)";

std::unique_ptr<Context> make_cuda(ContextOptions, const BackendArgs&) {
  throw BackendUnavailableError(std::string("backend 'cuda' is not available in this build: ") + kWhy +
                                "; use backend 'sim' or 'host'");
}
}  // namespace

extern const BackendInfo kCudaBackendInfo;
const BackendInfo kCudaBackendInfo{
    .name = "cuda",
    .summary = "real GPUs, one rank per GPU (not in this build)",
    .options = "gemm_mode ('exact' | 'tensor_core'), collectives ('ring' | 'nccl')",
    .devices = [] { return 0; },
    .unavailable = [] { return std::string(kWhy); },
    .make = &make_cuda};

}  // namespace cubesim::rt
