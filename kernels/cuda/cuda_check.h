// cuda_check.h — turn a failed CUDA call into an exception that names the call, the file:line and
// cudaGetErrorString. Every runtime call in kernels/cuda goes through CUBESIM_CUDA_CHECK, and every
// launch is followed by CUBESIM_CUDA_CHECK_LAUNCH (a launch reports its configuration error only
// through cudaGetLastError; exit code 0 proves nothing).
//
//   CUBESIM_CUDA_CHECK(cudaMalloc(&p, bytes));
//   kernel<<<grid, block, smem, stream>>>(...);
//   CUBESIM_CUDA_CHECK_LAUNCH("exact_gemm_kernel");
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace cubesim::cuda {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  throw CudaError(e, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                         cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace cubesim::cuda

#define CUBESIM_CUDA_CHECK(call)                                                     \
  do {                                                                               \
    cudaError_t cubesim_err_ = (call);                                               \
    if (cubesim_err_ != cudaSuccess)                                                 \
      ::cubesim::cuda::throw_cuda_error(cubesim_err_, #call, __FILE__, __LINE__);    \
  } while (0)

#define CUBESIM_CUDA_CHECK_LAUNCH(name)                                              \
  do {                                                                               \
    cudaError_t cubesim_err_ = cudaGetLastError();                                   \
    if (cubesim_err_ != cudaSuccess)                                                 \
      ::cubesim::cuda::throw_cuda_error(cubesim_err_, "launch of " name, __FILE__, __LINE__); \
  } while (0)
