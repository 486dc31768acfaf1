// The backend-independent contract table (gemm_cases.h) on the host backends: the scalar
// reference and the fast kernel with one and two threads, the portable micro-kernel, and cache
// blockings small enough to put a block edge in every case. The CUDA and simulated-PE backends
// instantiate the same table.
#include "tests/kernels/gemm_cases.h"

namespace cubesim::kernels::testing {
namespace {

GemmBackend cpu_backend(std::string name, GemmOptions o) {
  return {std::move(name),
          [o](const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
            det_gemm(A, B, bias, C, o);
          },
          [o](const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
            det_gemm_backward_input(dC, B, dA, o);
          },
          [o](const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
            det_gemm_backward_weight(A, dC, dB, o);
          }};
}

}  // namespace
}  // namespace cubesim::kernels::testing

INSTANTIATE_GEMM_CONTRACT(
    Host, ::testing::Values(reference_backend(), cpu_backend("cpu_1t", {.threads = 1}),
                            cpu_backend("cpu_2t", {.threads = 2, .min_flops_per_thread = 0}),
                            cpu_backend("cpu_portable", {.threads = 1, .isa = GemmIsa::portable}),
                            cpu_backend("cpu_2t_tiny_blocks",
                                        {.threads = 2, .mc = 6, .nc = 16, .kc = 5, .min_flops_per_thread = 0})));
