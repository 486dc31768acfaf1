// The backend-independent contract table (tests/kernels/gemm_cases.h) on the CUDA backends:
//
//   cuda_exact   GemmMode::exact: every case of the table (bitwise equality with the reference,
//                accuracy, every invariance check), unchanged;
//   cuda_tc      GemmMode::tensor_core: the invariance cases of the table (batch size, chunked
//                prefill, batch padding, row position, other rows, and reduction padding after the
//                real terms). Not its equality-with-the-reference or f32-accuracy cases: the mode is
//                not the exact contract (its accuracy is tested against f64 in test_det_gemm_cuda.cpp),
//                and not zero terms *before* the real ones, which shift them across the MMA's k16
//                groups — a different summation, by design, that no batch change can cause.
//
// Each backend copies the host views' bytes (gaps included: the table fills input gaps with NaN and
// outputs with a poison pattern) to the device, runs there with the same strides, and copies the
// output's bytes back. Without a CUDA device the fixture skips every case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/accumulator.h"
#include "kernels/cuda/det_gemm_cuda.h"
#include "tests/kernels/gemm_cases.h"

namespace cubesim::kernels::testing {
namespace {

using cuda::test::DeviceBuffer;

// Element offsets [lo, hi) a view spans (strides of any sign).
std::pair<std::int64_t, std::int64_t> span(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
  if (rows <= 0 || cols <= 0) return {0, 0};
  const std::int64_t lo = std::min<std::int64_t>(0, (rows - 1) * rs) + std::min<std::int64_t>(0, (cols - 1) * cs);
  const std::int64_t hi = std::max<std::int64_t>(0, (rows - 1) * rs) + std::max<std::int64_t>(0, (cols - 1) * cs) + 1;
  return {lo, hi};
}

// The device copy of a host view's bytes, and the same view over it.
struct Mirror {
  DeviceBuffer buf;
  const void* host = nullptr;
  std::int64_t lo = 0, bytes = 0;
  void* dev_data = nullptr;

  Mirror(const void* data, DType t, std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
    host = data;
    const auto [l, h] = span(rows, cols, rs, cs);
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(t));
    lo = l * es;
    bytes = (h - l) * es;
    if (bytes == 0) return;
    buf = DeviceBuffer(static_cast<std::size_t>(bytes));
    CUBESIM_CUDA_CHECK(cudaMemcpy(buf.get(), static_cast<const std::uint8_t*>(data) + lo, static_cast<std::size_t>(bytes),
                                  cudaMemcpyHostToDevice));
    dev_data = static_cast<std::uint8_t*>(buf.get()) - lo;
  }
  void copy_back(void* data) const {
    if (bytes == 0) return;
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    CUBESIM_CUDA_CHECK(cudaMemcpy(static_cast<std::uint8_t*>(data) + lo, buf.get(), static_cast<std::size_t>(bytes),
                                  cudaMemcpyDeviceToHost));
  }
};

Mirror mirror(const MatrixView& v) { return Mirror(v.data, v.dtype, v.rows, v.cols, v.row_stride, v.col_stride); }
MatrixView on_device(const Mirror& m, const MatrixView& v) {
  return {m.bytes ? m.dev_data : nullptr, v.dtype, v.rows, v.cols, v.row_stride, v.col_stride};
}
MutableMatrixView on_device(const Mirror& m, const MutableMatrixView& v) {
  return {m.bytes ? m.dev_data : nullptr, v.dtype, v.rows, v.cols, v.row_stride, v.col_stride};
}

GemmBackend cuda_backend(std::string name, cuda::GemmOptions opt) {
  return {std::move(name),
          [opt](const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
            const Mirror a = mirror(A), b = mirror(B), c = mirror(C);
            std::unique_ptr<Mirror> bm;
            VectorView dbias;
            if (bias) {
              bm = std::make_unique<Mirror>(bias->data, bias->dtype, 1, bias->size, 0, bias->stride);
              dbias = {bm->bytes ? bm->dev_data : nullptr, bias->dtype, bias->size, bias->stride};
            }
            cuda::det_gemm_cuda(on_device(a, A), on_device(b, B), bias ? &dbias : nullptr, on_device(c, C), opt, nullptr);
            c.copy_back(C.data);
          },
          [opt](const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
            const Mirror g = mirror(dC), b = mirror(B), a = mirror(dA);
            cuda::det_gemm_cuda_backward_input(on_device(g, dC), on_device(b, B), on_device(a, dA), opt, nullptr);
            a.copy_back(dA.data);
          },
          [opt](const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
            const Mirror a = mirror(A), g = mirror(dC), b = mirror(dB);
            cuda::det_gemm_cuda_backward_weight(on_device(a, A), on_device(g, dC), on_device(b, dB), opt, nullptr);
            b.copy_back(dB.data);
          }};
}

cuda::GemmOptions mode(cuda::GemmMode m) {
  cuda::GemmOptions o;
  o.mode = m;
  return o;
}

std::vector<GemmCase> tc_invariance_cases() {
  std::vector<GemmCase> out;
  for (const GemmCase& c : gemm_cases()) {
    switch (c.check) {
      case Check::batch_size:
      case Check::chunked_prefill:
      case Check::padding:
      case Check::row_position:
      case Check::other_rows: out.push_back(c); break;
      case Check::reduction_padding:
        if (c.sizes.at(0) == 0) out.push_back(c);
        break;
      case Check::matches_reference:
      case Check::accuracy: break;
    }
  }
  return out;
}

// The table's own TEST_P is instantiated by the host test binary, not this one.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GemmContract);

// The table's fixture, plus a skip when there is no GPU (and for tc, no sm_90).
class CudaGemmContract : public GemmContract {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::test::have_cuda_device(&why)) GTEST_SKIP() << why;
    if (std::get<0>(GetParam()).name == "cuda_tc" && !cuda::tensor_core_mode_supported())
      GTEST_SKIP() << "tensor_core mode needs an sm_90 GPU (H100/H200)";
  }
};

TEST_P(CudaGemmContract, Holds) {
  const auto& [backend, c] = GetParam();
  run_gemm_case(backend, c);
}

// The simulator's hopper_tc accumulator model (kernels/accumulator.h) as a backend of the table,
// against the tensor-core mode on every bf16 case whose check compares with a reference: forward and
// both backward products, every layout and edge of the table, bit for bit.
GemmBackend hopper_tc_model_backend() {
  using kernels::AccumulatorModel;
  return {"hopper_tc_model",
          [](const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
            kernels::gemm_model(AccumulatorModel::hopper_tc, A, B, bias, C);
          },
          [](const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
            kernels::gemm_model(AccumulatorModel::hopper_tc, dC, B.transposed(), nullptr, dA);
          },
          [](const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
            kernels::gemm_model(AccumulatorModel::hopper_tc, A.transposed(), dC, nullptr, dB);
          }};
}

TEST(CudaHopperTcModel, EqualsTheTensorCoresOnTheContractTable) {
  std::string why;
  if (!cuda::test::have_cuda_device(&why)) GTEST_SKIP() << why;
  if (!cuda::tensor_core_mode_supported()) GTEST_SKIP() << "tensor_core mode needs an sm_90 GPU (H100/H200)";
  const GemmBackend gpu = cuda_backend("cuda_tc", mode(cuda::GemmMode::tensor_core));
  const GemmBackend model = hopper_tc_model_backend();
  int cases = 0;
  std::int64_t elements = 0;
  for (const GemmCase& c : gemm_cases()) {
    if (c.check != Check::matches_reference || c.in != DType::bf16) continue;
    SCOPED_TRACE(c.name());
    const Operands o = make_operands(c, c.batch, 0x5eed + static_cast<std::uint64_t>(cases), c.layout);
    const HostMatrix got = run_case_op(gpu, c, o.X, o.W, o, c.layout, 0);
    const HostMatrix want = run_case_op(model, c, o.X, o.W, o, c.layout, 1);
    EXPECT_TRUE(bitwise_equal(got, want));
    ++cases;
    elements += c.batch * c.width;
  }
  std::printf("hopper_tc model vs tensor cores on the contract table: %d bf16 cases, %lld elements\n", cases,
              static_cast<long long>(elements));
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(CudaExact, CudaGemmContract,
                         ::testing::Combine(::testing::Values(cuda_backend("cuda_exact", mode(cuda::GemmMode::exact))),
                                            ::testing::ValuesIn(gemm_cases())),
                         gemm_contract_test_name);
INSTANTIATE_TEST_SUITE_P(CudaTc, CudaGemmContract,
                         ::testing::Combine(::testing::Values(cuda_backend("cuda_tc", mode(cuda::GemmMode::tensor_core))),
                                            ::testing::ValuesIn(tc_invariance_cases())),
                         gemm_contract_test_name);

}  // namespace
}  // namespace cubesim::kernels::testing
