// gemm_test_util.h — host matrices for GEMM tests: strided layouts with poisoned gaps, random
// fills, bitwise comparison, and an f64 product for accuracy.
//
//   HostMatrix a = HostMatrix::random(DType::bf16, 64, 129, Layout::row_padded, /*seed=*/1);
//   HostMatrix c = HostMatrix::output(DType::f32, 64, 32, Layout::row_major, /*poison=*/0);
//   det_gemm(a.view(), b.view(), nullptr, c.mview());
//   EXPECT_TRUE(c.fully_written());        // no element still holds the poison, gaps untouched
//   EXPECT_TRUE(bitwise_equal(c, want));
//
// Inputs get NaN in their gaps, so a kernel that reads outside a view produces NaN; outputs are
// filled entirely with a NaN pattern before each run, so an element the kernel forgets is caught
// (random finite data never produces that pattern).
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/det_gemm.h"

namespace cubesim::kernels::testing {

enum class Layout {
  row_major,   // row_stride = cols
  col_major,   // the transpose stored row-major: row_stride 1, col_stride = rows
  row_padded,  // row_stride = cols + 5: gaps between rows
  col_padded,  // col_stride = rows + 3
};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::row_major: return "rowmajor";
    case Layout::col_major: return "colmajor";
    case Layout::row_padded: return "rowpadded";
    case Layout::col_padded: return "colpadded";
  }
  return "?";
}

// Two NaN patterns per dtype, one per poison index, never produced by a kernel (CUDA's and our
// canonical NaN is 0x7fff for 16-bit types; random finite inputs give finite outputs).
inline std::uint32_t poison_bits(DType t, int which) {
  switch (t) {
    case DType::f32: return which ? 0xffc0beefu : 0x7fc0deadu;
    case DType::bf16: return which ? 0xffbeu : 0x7fdeu;
    case DType::f16: return which ? 0xfe7bu : 0x7e5au;
  }
  return 0;
}

class HostMatrix {
 public:
  HostMatrix() = default;
  HostMatrix(DType t, std::int64_t rows, std::int64_t cols, Layout layout) : dtype_(t), rows_(rows), cols_(cols) {
    switch (layout) {
      case Layout::row_major: rs_ = cols, cs_ = 1; break;
      case Layout::col_major: rs_ = 1, cs_ = rows; break;
      case Layout::row_padded: rs_ = cols + 5, cs_ = 1; break;
      case Layout::col_padded: rs_ = 1, cs_ = rows + 3; break;
    }
    const std::int64_t n = rows > 0 && cols > 0 ? (rows - 1) * rs_ + (cols - 1) * cs_ + 1 : 0;
    bytes_.assign(static_cast<std::size_t>(n) * dtype_size(t), 0);
    in_view_.assign(static_cast<std::size_t>(n), false);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) in_view_[static_cast<std::size_t>(index(r, c))] = true;
  }

  // Random values in [-1, 1) rounded to the dtype; gaps hold NaN.
  static HostMatrix random(DType t, std::int64_t rows, std::int64_t cols, Layout layout, std::uint64_t seed) {
    HostMatrix m(t, rows, cols, layout);
    m.fill_all_bits(poison_bits(t, 0));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) m.set(r, c, u(rng));
    return m;
  }
  // An output, every byte (gaps included) holding poison pattern `which`.
  static HostMatrix output(DType t, std::int64_t rows, std::int64_t cols, Layout layout, int which = 0) {
    HostMatrix m(t, rows, cols, layout);
    m.poison(which);
    return m;
  }

  void poison(int which) {
    poison_ = poison_bits(dtype_, which);
    fill_all_bits(poison_);
  }
  void set(std::int64_t r, std::int64_t c, float v) { store_f32(bytes_.data(), dtype_, index(r, c), v); }
  float at(std::int64_t r, std::int64_t c) const { return load_f32(bytes_.data(), dtype_, index(r, c)); }
  std::uint32_t bits(std::int64_t r, std::int64_t c) const { return bits_at(index(r, c)); }

  MatrixView view() const { return {bytes_.data(), dtype_, rows_, cols_, rs_, cs_}; }
  MutableMatrixView mview() { return {bytes_.data(), dtype_, rows_, cols_, rs_, cs_}; }
  DType dtype() const { return dtype_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }

  // Every element of the view was written (none holds the poison) and no gap was.
  ::testing::AssertionResult fully_written() const {
    for (std::size_t i = 0; i < in_view_.size(); ++i) {
      const bool poisoned = bits_at(static_cast<std::int64_t>(i)) == poison_;
      if (in_view_[i] && poisoned) {
        return ::testing::AssertionFailure() << "element at storage index " << i << " was never written";
      }
      if (!in_view_[i] && !poisoned) {
        return ::testing::AssertionFailure() << "gap at storage index " << i << " (outside the view) was written";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::int64_t index(std::int64_t r, std::int64_t c) const { return r * rs_ + c * cs_; }
  std::uint32_t bits_at(std::int64_t i) const {
    if (dtype_ == DType::f32) {
      std::uint32_t v;
      std::memcpy(&v, bytes_.data() + i * 4, 4);
      return v;
    }
    std::uint16_t v;
    std::memcpy(&v, bytes_.data() + i * 2, 2);
    return v;
  }
  void fill_all_bits(std::uint32_t pattern) {
    const std::size_t es = dtype_size(dtype_);
    for (std::size_t i = 0; i + es <= bytes_.size(); i += es) std::memcpy(bytes_.data() + i, &pattern, es);
  }

  DType dtype_ = DType::f32;
  std::int64_t rows_ = 0, cols_ = 0, rs_ = 0, cs_ = 1;
  std::vector<std::uint8_t> bytes_;
  std::vector<bool> in_view_;
  std::uint32_t poison_ = 0;
};

// Element-wise bitwise equality of two equally shaped matrices (any layouts); on failure names the
// first differing element and counts the rest.
inline ::testing::AssertionResult bitwise_equal(const HostMatrix& got, const HostMatrix& want,
                                                std::int64_t want_row0 = 0) {
  if (got.cols() != want.cols() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << "shape/dtype mismatch";
  }
  std::int64_t bad = 0, br = -1, bc = -1;
  for (std::int64_t r = 0; r < got.rows(); ++r)
    for (std::int64_t c = 0; c < got.cols(); ++c)
      if (got.bits(r, c) != want.bits(want_row0 + r, c)) {
        if (bad++ == 0) br = r, bc = c;
      }
  if (!bad) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s << bad << " of " << got.rows() * got.cols() << " elements differ; first at (" << br << ", " << bc << "): got "
    << got.at(br, bc) << " (0x" << std::hex << got.bits(br, bc) << ") want " << want.at(want_row0 + br, bc) << " (0x"
    << want.bits(want_row0 + br, bc) << ")";
  return ::testing::AssertionFailure() << s.str();
}

// Rows [r0, r0+n) of `got` against rows [w0, w0+n) of `want`.
inline ::testing::AssertionResult rows_bitwise_equal(const HostMatrix& got, std::int64_t r0, const HostMatrix& want,
                                                     std::int64_t w0, std::int64_t n) {
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < got.cols(); ++c)
      if (got.bits(r0 + r, c) != want.bits(w0 + r, c)) {
        std::ostringstream s;
        s << "row " << r0 + r << " vs row " << w0 + r << " differ at column " << c << ": " << got.at(r0 + r, c)
          << " (0x" << std::hex << got.bits(r0 + r, c) << ") vs " << want.at(w0 + r, c) << " (0x"
          << want.bits(w0 + r, c) << ")";
        return ::testing::AssertionFailure() << s.str();
      }
  return ::testing::AssertionSuccess();
}

// f64 L·R (+ bias) of the stored (already rounded) values, row-major M x N.
inline std::vector<double> product_f64(const MatrixView& L, const MatrixView& R, const VectorView* bias) {
  std::vector<double> out(static_cast<std::size_t>(L.rows * R.cols));
  for (std::int64_t i = 0; i < L.rows; ++i)
    for (std::int64_t j = 0; j < R.cols; ++j) {
      double s = bias ? bias->at(j) : 0.0;
      for (std::int64_t k = 0; k < L.cols; ++k) s += static_cast<double>(L.at(i, k)) * R.at(k, j);
      out[static_cast<std::size_t>(i * R.cols + j)] = s;
    }
  return out;
}

// ‖C − ref‖₂ / ‖ref‖₂.
inline double relative_error(const HostMatrix& C, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < C.rows(); ++i)
    for (std::int64_t j = 0; j < C.cols(); ++j) {
      const double r = ref[static_cast<std::size_t>(i * C.cols() + j)];
      const double d = C.at(i, j) - r;
      num += d * d;
      den += r * r;
    }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The accuracy bound we hold every backend to, as a relative norm against f64: the f32 sum of K
// products drifts like sqrt(K) unit roundoffs (8 of them is a wide margin for random data), and
// rounding the output costs at most one unit roundoff of the output type.
inline double accuracy_tolerance(DType out, std::int64_t K) {
  const double u_out = out == DType::bf16 ? 0x1p-8 : out == DType::f16 ? 0x1p-11 : 0.0;
  return u_out + 8.0 * std::sqrt(static_cast<double>(std::max<std::int64_t>(K, 1))) * 0x1p-24;
}

}  // namespace cubesim::kernels::testing
