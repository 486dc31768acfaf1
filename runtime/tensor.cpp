#include "runtime/tensor.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/errors.h"

namespace cubesim::rt {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what) {
  for (std::int64_t d : shape) {
    if (d < 0) {
      throw RuntimeError(fmt::format("{}: shape {} has a negative dimension; dimensions are >= 0", what,
                                     shape_str(shape)));
    }
  }
  const std::uint64_t es = dtype_size(dtype);
  const std::uint64_t max_elems = kMaxTensorBytes / es;
  // Every dimension is bounded even where another is 0 (the strides multiply them all).
  std::uint64_t n = 1, all = 1;
  for (std::int64_t d : shape) {
    const auto u = static_cast<std::uint64_t>(d);
    if (u > max_elems || (u > 0 && all > max_elems / u)) {  // all * u > max_elems, without overflowing
      throw RuntimeError(fmt::format("{}: shape {} of {} is too large: the largest tensor holds {} bytes (2^48), {} "
                                     "{} elements, and so does each dimension's product",
                                     what, shape_str(shape), dtype_name(dtype), kMaxTensorBytes, max_elems,
                                     dtype_name(dtype)));
    }
    if (u > 0) all *= u;
    n *= u;
  }
  return static_cast<std::int64_t>(n);
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype)
    : storage_(std::move(storage)), shape_(std::move(shape)), dtype_(dtype) {
  for (std::int64_t d : shape_) {
    if (d < 0) throw RuntimeError(fmt::format("tensor shape {} has a negative dimension", shape_str(shape_)));
  }
  strides_ = contiguous_strides(shape_);
  if (storage_ && nbytes() > storage_->bytes()) {
    throw RuntimeError(fmt::format("tensor {} needs {} bytes but its storage has {}", shape_str(shape_), nbytes(),
                                   storage_->bytes()));
  }
}

Storage& Tensor::storage() const {
  if (!storage_) throw RuntimeError("use of an undefined (default-constructed) tensor");
  return *storage_;
}

std::int64_t Tensor::size(std::int64_t d) const {
  if (d < 0) d += dim();
  if (d < 0 || d >= dim()) {
    throw RuntimeError(fmt::format("dimension {} out of range for a {}-d tensor {}", d, dim(), shape_str(shape_)));
  }
  return shape_[static_cast<std::size_t>(d)];
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  // Row-major strides, compared in place (no vector per call: the collectives ask per message).
  std::int64_t expect = 1, n = 1;
  bool row_major = true;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (strides_[i] != expect) row_major = false;
    expect *= shape_[i];
    n *= shape_[i];
  }
  return row_major || n <= 1;
}

std::string Tensor::describe() const {
  return fmt::format("{}{} on rank {}", dtype_name(dtype_), shape_str(shape_), device());
}

Tensor Tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  Tensor t;
  narrow_into(t, d, start, length);
  return t;
}

void Tensor::narrow_into(Tensor& out, std::int64_t d, std::int64_t start, std::int64_t length) const {
  if (&out == this) throw RuntimeError("narrow_into: the view must be another tensor than its source");
  if (d < 0) d += dim();
  if (d < 0 || d >= dim()) {
    throw RuntimeError(fmt::format("narrow: dimension {} out of range for {}", d, describe()));
  }
  const auto du = static_cast<std::size_t>(d);
  if (start < 0 || length < 0 || start + length > shape_[du]) {
    throw RuntimeError(fmt::format("narrow: [{}, {}) is outside dimension {} of size {} of {}", start, start + length,
                                   d, shape_[du], describe()));
  }
  if (out.storage_ != storage_) out.storage_ = storage_;
  const std::size_t n = shape_.size();
  if (out.shape_.size() != n || out.strides_.size() != n) {
    out.shape_.assign(shape_.begin(), shape_.end());
    out.strides_.assign(strides_.begin(), strides_.end());
  } else {
    // The view a loop narrows again and again (a ring's step): as many dimensions, no allocation,
    // and no call either.
    for (std::size_t i = 0; i < n; ++i) {
      out.shape_[i] = shape_[i];
      out.strides_[i] = strides_[i];
    }
  }
  out.dtype_ = dtype_;
  out.shape_[du] = length;
  out.offset_ = offset_ + start * strides_[du];
}

std::vector<Tensor> Tensor::chunk(std::int64_t n, std::int64_t d) const {
  if (d < 0) d += dim();
  if (n <= 0) throw RuntimeError(fmt::format("chunk: the number of chunks must be positive, got {}", n));
  const std::int64_t sz = size(d);
  if (sz % n != 0) {
    throw RuntimeError(fmt::format("chunk: dimension {} of {} has size {}, which does not divide into {} equal parts",
                                   d, describe(), sz, n));
  }
  std::vector<Tensor> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(narrow(d, i * (sz / n), sz / n));
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  const std::int64_t n = checked_numel(shape, dtype_, "reshape");
  if (n != numel()) {
    throw RuntimeError(fmt::format("reshape: {} has {} elements but shape {} has {}", describe(), numel(),
                                   shape_str(shape), n));
  }
  if (!is_contiguous()) throw RuntimeError(fmt::format("reshape: {} is a strided view; reshape needs contiguous", describe()));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::t() const {
  if (dim() != 2) throw RuntimeError(fmt::format("t(): {} is not 2-D", describe()));
  Tensor v = *this;
  std::swap(v.shape_[0], v.shape_[1]);
  std::swap(v.strides_[0], v.strides_[1]);
  return v;
}

std::int64_t Tensor::rows() const {
  std::int64_t r = 1;
  for (std::size_t i = 0; i + 1 < shape_.size(); ++i) r *= shape_[i];
  return r;
}

namespace {
void check_matrix(const Tensor& t) {
  for (std::size_t i = 0; i + 2 < t.shape().size(); ++i) {
    if (t.strides()[i] != t.strides()[i + 1] * t.shape()[i + 1]) {
      throw RuntimeError(fmt::format("{}: leading dimensions cannot fold into rows (a strided view)", t.describe()));
    }
  }
}
}  // namespace

kernels::MatrixView Tensor::matrix() const { return static_cast<kernels::MatrixView>(mutable_matrix()); }

kernels::MutableMatrixView Tensor::mutable_matrix() const {
  void* base = storage().host_ptr();
  if (base == nullptr) throw RuntimeError(fmt::format("{}: not in host memory; matrix() needs host storage", describe()));
  check_matrix(*this);
  const std::int64_t rs = shape_.size() >= 2 ? strides_[shape_.size() - 2] : cols();
  const std::int64_t cs = shape_.empty() ? 1 : strides_.back();
  return kernels::MutableMatrixView{static_cast<unsigned char*>(base) + byte_offset(), dtype_, rows(), cols(), rs, cs};
}

// Element order: row-major over the view. Contiguous runs along the last dimension are read with
// one call each.
std::vector<std::uint8_t> Tensor::to_host_bytes() const {
  const std::size_t es = element_size();
  std::vector<std::uint8_t> out(nbytes());
  if (out.empty()) return out;
  if (is_contiguous()) {
    storage().read(byte_offset(), out.data(), out.size());
    return out;
  }
  check_matrix(*this);
  const std::int64_t R = rows(), C = cols();
  const std::int64_t rs = shape_.size() >= 2 ? strides_[shape_.size() - 2] : C;
  const std::int64_t cs = strides_.back();
  for (std::int64_t r = 0; r < R; ++r) {
    if (cs == 1) {
      storage().read(static_cast<std::uint64_t>(offset_ + r * rs) * es, out.data() + r * C * es, C * es);
    } else {
      for (std::int64_t c = 0; c < C; ++c) {
        storage().read(static_cast<std::uint64_t>(offset_ + r * rs + c * cs) * es, out.data() + (r * C + c) * es, es);
      }
    }
  }
  return out;
}

std::vector<float> Tensor::to_host_f32() const {
  const auto bytes = to_host_bytes();
  std::vector<float> out(static_cast<std::size_t>(numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_f32(bytes.data(), dtype_, static_cast<std::int64_t>(i));
  return out;
}

void Tensor::copy_from_host_bytes(const void* src, std::uint64_t n) const {
  if (n != nbytes()) {
    throw RuntimeError(fmt::format("copy into {}: got {} bytes, the tensor holds {}", describe(), n, nbytes()));
  }
  if (n == 0) return;
  const std::size_t es = element_size();
  if (is_contiguous()) {
    storage().write(byte_offset(), src, n);
    return;
  }
  check_matrix(*this);
  const auto* s = static_cast<const std::uint8_t*>(src);
  const std::int64_t R = rows(), C = cols();
  const std::int64_t rs = shape_.size() >= 2 ? strides_[shape_.size() - 2] : C;
  const std::int64_t cs = strides_.back();
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t c = 0; c < C; ++c) {
      storage().write(static_cast<std::uint64_t>(offset_ + r * rs + c * cs) * es, s + (r * C + c) * es, es);
    }
  }
}

void Tensor::copy_from_host_f32(const float* src, std::int64_t count) const {
  if (count != numel()) {
    throw RuntimeError(fmt::format("copy into {}: got {} values, the tensor holds {}", describe(), count, numel()));
  }
  std::vector<std::uint8_t> bytes(nbytes());
  for (std::int64_t i = 0; i < count; ++i) store_f32(bytes.data(), dtype_, i, src[i]);
  copy_from_host_bytes(bytes.data(), bytes.size());
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* what, bool same_dtype) {
  if (a.shape() != b.shape() || (same_dtype && a.dtype() != b.dtype())) {
    throw RuntimeError(fmt::format("{}: {} and {} must have the same shape{}", what, a.describe(), b.describe(),
                                   same_dtype ? " and dtype" : ""));
  }
}

}  // namespace cubesim::rt
