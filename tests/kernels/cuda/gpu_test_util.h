// gpu_test_util.h — what the CUDA kernel tests share: device buffers, random strided operands that
// live both on the host (for the reference) and on the device, output poisoning, a multithreaded
// scalar reference of the numerics contract, and an f64 reference for the tensor-core mode.
//
//   GTEST_SKIP unless have_cuda_device();
//   Operand a = Operand::random(rng, DType::bf16, M, K, Layout::row_major);
//   Operand c = Operand::output(DType::f32, M, N, Layout::row_major);
//   c.poison();  det_gemm_cuda(a.dev(), b.dev(), nullptr, c.dev_mut(), opt, 0);  c.download();
//   reference_gemm(a.host(), b.host(), nullptr, ref.host_mut());
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/det_gemm.h"
#include "base/dtype.h"

namespace cubesim::cuda::test {

using kernels::MatrixView;
using kernels::MutableMatrixView;
using kernels::VectorView;

// True when a CUDA device is usable; the reason otherwise (for GTEST_SKIP).
inline bool have_cuda_device(std::string* why = nullptr) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = std::string("no CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return true;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) CUBESIM_CUDA_CHECK(cudaMalloc(&p_, bytes));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// padded_rows: rows 5 elements apart beyond cols (never 16-byte aligned); aligned_rows / aligned_cols:
// row-major / column-major with the leading dimension rounded up to 8 elements (16-byte aligned
// rows at any size, so odd sizes reach the kernels' aligned paths with partial 16-byte chunks).
enum class Layout { row_major, col_major, padded_rows, aligned_rows, aligned_cols };

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::row_major: return "row_major";
    case Layout::col_major: return "col_major";
    case Layout::padded_rows: return "padded_rows";
    case Layout::aligned_rows: return "aligned_rows";
    case Layout::aligned_cols: return "aligned_cols";
  }
  return "?";
}

// A rows x cols matrix with a host copy and a device copy of the same bytes and strides.
class Operand {
 public:
  static Operand zeros(DType t, std::int64_t rows, std::int64_t cols, Layout l) {
    Operand o;
    o.t_ = t;
    o.rows_ = rows;
    o.cols_ = cols;
    switch (l) {
      case Layout::row_major: o.rs_ = cols; o.cs_ = 1; o.n_ = rows * cols; break;
      case Layout::col_major: o.rs_ = 1; o.cs_ = rows; o.n_ = rows * cols; break;
      case Layout::padded_rows: o.rs_ = cols + 5; o.cs_ = 1; o.n_ = rows * (cols + 5); break;
      case Layout::aligned_rows: o.rs_ = (cols + 7) / 8 * 8; o.cs_ = 1; o.n_ = rows * o.rs_; break;
      case Layout::aligned_cols: o.rs_ = 1; o.cs_ = (rows + 7) / 8 * 8; o.n_ = cols * o.cs_; break;
    }
    o.host_.assign(static_cast<std::size_t>(std::max<std::int64_t>(o.n_, 1)) * dtype_size(t), 0);
    o.dev_ = DeviceBuffer(o.host_.size());
    CUBESIM_CUDA_CHECK(cudaMemset(o.dev_.get(), 0, o.host_.size()));
    return o;
  }
  // Uniform in [-1, 1), rounded to t; never constant, never zero-filled.
  static Operand random(std::mt19937_64& rng, DType t, std::int64_t rows, std::int64_t cols, Layout l) {
    Operand o = zeros(t, rows, cols, l);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < o.n_; ++i) store_f32(o.host_.data(), t, i, u(rng));
    o.upload();
    return o;
  }
  static Operand output(DType t, std::int64_t rows, std::int64_t cols, Layout l) { return zeros(t, rows, cols, l); }

  void upload() { CUBESIM_CUDA_CHECK(cudaMemcpy(dev_.get(), host_.data(), host_.size(), cudaMemcpyHostToDevice)); }
  void download() {
    CUBESIM_CUDA_CHECK(cudaDeviceSynchronize());
    CUBESIM_CUDA_CHECK(cudaMemcpy(host_.data(), dev_.get(), host_.size(), cudaMemcpyDeviceToHost));
  }
  // Every byte 0xff: a NaN in all three types, so an element the kernel never wrote is visible.
  void poison() {
    CUBESIM_CUDA_CHECK(cudaMemset(dev_.get(), 0xff, host_.size()));
    std::memset(host_.data(), 0xff, host_.size());
  }

  MatrixView host() const { return {host_.data(), t_, rows_, cols_, rs_, cs_}; }
  MutableMatrixView host_mut() { return {host_.data(), t_, rows_, cols_, rs_, cs_}; }
  MatrixView dev() const { return {dev_.get(), t_, rows_, cols_, rs_, cs_}; }
  MutableMatrixView dev_mut() { return {dev_.get(), t_, rows_, cols_, rs_, cs_}; }
  VectorView host_vec() const { return {host_.data(), t_, rows_ * cols_, 1}; }
  VectorView dev_vec() const { return {dev_.get(), t_, rows_ * cols_, 1}; }

  float at(std::int64_t r, std::int64_t c) const { return load_f32(host_.data(), t_, r * rs_ + c * cs_); }
  std::uint32_t bits(std::int64_t r, std::int64_t c) const {
    const std::int64_t i = r * rs_ + c * cs_;
    if (t_ == DType::f32) {
      std::uint32_t u;
      std::memcpy(&u, host_.data() + i * 4, 4);
      return u;
    }
    std::uint16_t h;
    std::memcpy(&h, host_.data() + i * 2, 2);
    return h;
  }
  // Copy row r of `src` (same cols) into row `dst_row` of this operand, host and device.
  void set_row(std::int64_t dst_row, const Operand& src, std::int64_t r) {
    for (std::int64_t c = 0; c < cols_; ++c) store_f32(host_.data(), t_, dst_row * rs_ + c * cs_, src.at(r, c));
  }

  DType dtype() const { return t_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }

 private:
  DType t_ = DType::f32;
  std::int64_t rows_ = 0, cols_ = 0, rs_ = 0, cs_ = 1, n_ = 0;
  std::vector<std::uint8_t> host_;
  DeviceBuffer dev_;
};

template <class F>
void parallel_rows(std::int64_t rows, F&& f) {
  const unsigned hw = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  const std::int64_t nt = std::min<std::int64_t>(hw, std::max<std::int64_t>(rows, 1));
  std::vector<std::thread> ts;
  for (std::int64_t t = 0; t < nt; ++t)
    ts.emplace_back([&, t] {
      for (std::int64_t r = t; r < rows; r += nt) f(r);
    });
  for (auto& th : ts) th.join();
}

// The numerics contract, spelled out: acc = +0.0f, one fma per k ascending, bias after the sum,
// one rounding. (This file is compiled with -ffp-contract=off; std::fma is the only fused op.)
inline void reference_gemm(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
  parallel_rows(C.rows, [&](std::int64_t m) {
    for (std::int64_t n = 0; n < C.cols; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < A.cols; ++k) acc = std::fma(A.at(m, k), B.at(k, n), acc);
      if (bias && bias->data) acc = acc + bias->at(n);
      store_f32(C.data, C.dtype, m * C.row_stride + n * C.col_stride, acc);
    }
  });
}

// f64 reference of the same product on the operands rounded as the tensor-core mode sees them
// (bf16), and the relative Frobenius error of `got` against it.
struct ErrorStats {
  double rel_fro = 0;
  std::int64_t unwritten = 0;  // NaN left from the poison
};
inline ErrorStats tc_error(const MatrixView& A, const MatrixView& B, const VectorView* bias, const Operand& got,
                           bool round_inputs_to_bf16) {
  std::vector<double> num(got.rows(), 0), den(got.rows(), 0);
  std::vector<std::int64_t> nan(got.rows(), 0);
  auto rd = [&](float x) { return round_inputs_to_bf16 ? static_cast<double>(round_to(DType::bf16, x)) : double(x); };
  parallel_rows(got.rows(), [&](std::int64_t m) {
    for (std::int64_t n = 0; n < got.cols(); ++n) {
      double acc = 0;
      for (std::int64_t k = 0; k < A.cols; ++k) acc += rd(A.at(m, k)) * rd(B.at(k, n));
      if (bias && bias->data) acc += bias->at(n);
      const double g = got.at(m, n);
      if (std::isnan(g)) ++nan[m];
      num[m] += (g - acc) * (g - acc);
      den[m] += acc * acc;
    }
  });
  ErrorStats s;
  double tn = 0, td = 0;
  for (std::int64_t m = 0; m < got.rows(); ++m) {
    tn += num[m];
    td += den[m];
    s.unwritten += nan[m];
  }
  s.rel_fro = td > 0 ? std::sqrt(tn / td) : std::sqrt(tn);
  return s;
}

// Number of elements of rows [r0, r0+rows) of a that differ bitwise from rows [s0, s0+rows) of b.
inline std::int64_t count_bit_mismatches(const Operand& a, std::int64_t r0, const Operand& b, std::int64_t s0,
                                         std::int64_t rows) {
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < a.cols(); ++c) bad += a.bits(r0 + r, c) != b.bits(s0 + r, c);
  return bad;
}

}  // namespace cubesim::cuda::test
