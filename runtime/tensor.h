// tensor.h — a strided view of f32/bf16/f16 elements on one rank.
//
// A Tensor is shape + strides (in elements) + an element offset into shared Storage. Fresh tensors
// are row-major and contiguous; narrow() and chunk() make views that share storage (a split along
// the last dimension is strided). Tensors are created by a Context (empty, zeros, from_host).
//
//   Tensor x = ctx.from_host(rank, {4096, 1024}, DType::bf16, host_bits);
//   auto parts = x.chunk(4, /*dim=*/1);      // four [4096, 256] views, strided
//   std::vector<float> v = parts[2].to_host_f32();
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/det_gemm.h"
#include "base/dtype.h"
#include "runtime/storage.h"

namespace cubesim::rt {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);  // "[4096, 1024]"

// The largest tensor: 2^48 bytes (256 TiB), far above any device's memory and far below where an
// element count times an element size could wrap 64 bits. Shapes past it are refused before any
// allocation.
inline constexpr std::uint64_t kMaxTensorBytes = std::uint64_t{1} << 48;
// The element count of `shape`, checked: RuntimeError naming `what`, the shape and the limit when
// a dimension is negative or the bytes (count x dtype size) exceed kMaxTensorBytes.
std::int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype);  // contiguous, offset 0

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const;
  DType dtype() const { return dtype_; }
  std::size_t element_size() const { return dtype_size(dtype_); }
  std::uint64_t nbytes() const { return static_cast<std::uint64_t>(numel()) * element_size(); }
  int device() const { return storage_ ? storage_->rank() : -1; }
  std::int64_t offset() const { return offset_; }  // in elements
  std::uint64_t byte_offset() const { return static_cast<std::uint64_t>(offset_) * element_size(); }
  Storage& storage() const;
  const std::shared_ptr<Storage>& storage_ptr() const { return storage_; }
  bool is_contiguous() const;
  // "bf16[4096, 1024] on rank 2"
  std::string describe() const;

  // Views sharing storage.
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  // The same view written into `out`, reusing its shape and stride buffers: no allocation once out
  // has held a view of as many dimensions (the collectives' per-step chunks).
  void narrow_into(Tensor& out, std::int64_t dim, std::int64_t start, std::int64_t length) const;
  std::vector<Tensor> chunk(std::int64_t n, std::int64_t dim) const;  // n equal parts; dim size % n == 0
  Tensor reshape(Shape shape) const;                                   // contiguous tensors only
  Tensor t() const;                                                    // 2-D: the transposed view
  Tensor flatten() const { return reshape({numel()}); }

  // A 2-D view for kernels (host-resident storage only).
  kernels::MatrixView matrix() const;
  kernels::MutableMatrixView mutable_matrix() const;
  // The tensor as rows x cols, the leading dimensions folded into rows.
  std::int64_t rows() const;
  std::int64_t cols() const { return shape_.empty() ? 1 : shape_.back(); }

  // Untimed host access (element order is row-major over the view, whatever the strides).
  std::vector<std::uint8_t> to_host_bytes() const;
  std::vector<float> to_host_f32() const;
  void copy_from_host_bytes(const void* src, std::uint64_t n) const;  // a handle: writes the data, not the view
  void copy_from_host_f32(const float* src, std::int64_t count) const;  // rounds to dtype (RNE)

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  std::int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

// Throws RuntimeError naming `what` unless a and b have the same shape (and dtype, if asked).
void check_same_shape(const Tensor& a, const Tensor& b, const char* what, bool same_dtype = true);

}  // namespace cubesim::rt
