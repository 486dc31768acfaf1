#include "kernels/detail/det_gemm_checks.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace cubesim::kernels {

std::string shape_string(std::int64_t rows, std::int64_t cols) { return fmt::format("{}x{}", rows, cols); }

std::string_view gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::automatic: return "automatic";
    case GemmIsa::portable: return "portable";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::avx512: return "avx512";
  }
  return "?";
}

namespace detail {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

struct ByteRange {
  std::intptr_t lo = 0, hi = 0;  // [lo, hi); empty when lo == hi
};

// The bytes a strided view can touch: from its lowest to past its highest element.
ByteRange byte_range(const void* data, DType t, std::int64_t rows, std::int64_t cols, std::int64_t rs,
                     std::int64_t cs) {
  if (rows <= 0 || cols <= 0) return {};
  const auto es = static_cast<std::int64_t>(dtype_size(t));
  std::int64_t lo = 0, hi = 0;
  for (std::int64_t extent : {(rows - 1) * rs, (cols - 1) * cs}) {
    lo += std::min<std::int64_t>(0, extent);
    hi += std::max<std::int64_t>(0, extent);
  }
  const auto base = reinterpret_cast<std::intptr_t>(data);
  return {base + lo * es, base + (hi + 1) * es};
}

void check_dtype(const char* fn, const char* name, DType t) {
  if (!dtype_valid(t)) {
    fail(fmt::format("{}: {} has invalid dtype value {}; valid: f32, bf16, f16", fn, name, static_cast<int>(t)));
  }
}

void check_no_alias(const char* fn, const char* name, ByteRange out,
                    std::initializer_list<std::pair<const char*, MatrixView>> inputs) {
  if (out.lo == out.hi) return;
  for (const auto& [in_name, in] : inputs) {
    const ByteRange r = byte_range(in.data, in.dtype, in.rows, in.cols, in.row_stride, in.col_stride);
    if (r.lo != r.hi && out.lo < r.hi && r.lo < out.hi) {
      fail(fmt::format("{}: output {} overlaps input {} in memory; the output must not alias an input", fn, name,
                       in_name));
    }
  }
}

}  // namespace

std::string describe(const MatrixView& v) {
  return fmt::format("{} {} (row stride {}, col stride {})", shape_string(v.rows, v.cols), dtype_name(v.dtype),
                     v.row_stride, v.col_stride);
}

void check_matrix(const char* fn, const char* name, const MatrixView& v) {
  check_dtype(fn, name, v.dtype);
  if (v.rows < 0 || v.cols < 0) {
    fail(fmt::format("{}: {} is {}; rows and cols must be >= 0", fn, name, shape_string(v.rows, v.cols)));
  }
  if (!v.data && v.rows > 0 && v.cols > 0) {
    fail(fmt::format("{}: {} is {} but its data pointer is null", fn, name, shape_string(v.rows, v.cols)));
  }
}

void check_vector(const char* fn, const char* name, const VectorView& v) {
  check_dtype(fn, name, v.dtype);
  if (v.size < 0) fail(fmt::format("{}: {} has {} elements; the size must be >= 0", fn, name, v.size));
  if (!v.data && v.size > 0) fail(fmt::format("{}: {} has {} elements but its data pointer is null", fn, name, v.size));
}

void check_output(const char* fn, const char* name, const MatrixView& out,
                  std::initializer_list<std::pair<const char*, MatrixView>> inputs) {
  check_matrix(fn, name, out);
  const std::int64_t rs = std::llabs(out.row_stride), cs = std::llabs(out.col_stride);
  bool distinct = true;
  if (out.rows > 1 && out.cols > 1) {
    distinct = cs * (out.cols - 1) < rs || rs * (out.rows - 1) < cs;
  } else if (out.rows > 1) {
    distinct = rs != 0;
  } else if (out.cols > 1) {
    distinct = cs != 0;
  }
  if (!distinct) {
    fail(fmt::format("{}: output {} is {}, whose elements overlap; a row-major output needs |row stride| >= {}",
                     fn, name, describe(out), std::max<std::int64_t>(1, cs * (out.cols - 1) + 1)));
  }
  check_no_alias(fn, name, byte_range(out.data, out.dtype, out.rows, out.cols, out.row_stride, out.col_stride),
                 inputs);
}

void check_output_vector(const char* fn, const char* name, const VectorView& out,
                         std::initializer_list<std::pair<const char*, MatrixView>> inputs) {
  check_vector(fn, name, out);
  if (out.size > 1 && out.stride == 0) {
    fail(fmt::format("{}: output {} has {} elements and stride 0, so they overlap; the stride must be non-zero", fn,
                     name, out.size));
  }
  check_no_alias(fn, name, byte_range(out.data, out.dtype, out.size, 1, out.stride, 1), inputs);
}

void check_gemm(const char* fn, const MatrixView& A, const MatrixView& B, const VectorView* bias,
                const MutableMatrixView& C) {
  check_matrix(fn, "A", A);
  check_matrix(fn, "B", B);
  if (A.cols != B.rows) {
    fail(fmt::format("{}: A is {} but B is {}; A.cols must equal B.rows", fn, shape_string(A.rows, A.cols),
                     shape_string(B.rows, B.cols)));
  }
  if (C.rows != A.rows || C.cols != B.cols) {
    fail(fmt::format("{}: C is {} but A·B is {} (A {}, B {}); C must be A.rows x B.cols", fn,
                     shape_string(C.rows, C.cols), shape_string(A.rows, B.cols), shape_string(A.rows, A.cols),
                     shape_string(B.rows, B.cols)));
  }
  if (bias) {
    check_vector(fn, "bias", *bias);
    if (bias->size != C.cols) {
      fail(fmt::format("{}: bias has {} elements but C is {}; bias must have C.cols = {} elements", fn, bias->size,
                       shape_string(C.rows, C.cols), C.cols));
    }
  }
  check_output(fn, "C", C, {{"A", A}, {"B", B}});
  if (bias) check_no_alias(fn, "C", byte_range(C.data, C.dtype, C.rows, C.cols, C.row_stride, C.col_stride),
                           {{"bias", MatrixView{bias->data, bias->dtype, bias->size, 1, bias->stride, 1}}});
}

void check_backward_input(const char* fn, const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
  check_matrix(fn, "dC", dC);
  check_matrix(fn, "B", B);
  if (dC.cols != B.cols) {
    fail(fmt::format("{}: dC is {} but B is {}; dA = dC·Bᵀ needs dC.cols == B.cols (the forward's N)", fn,
                     shape_string(dC.rows, dC.cols), shape_string(B.rows, B.cols)));
  }
  if (dA.rows != dC.rows || dA.cols != B.rows) {
    fail(fmt::format("{}: dA is {} but dC·Bᵀ is {} (dC {}, B {}); dA must be dC.rows x B.rows", fn,
                     shape_string(dA.rows, dA.cols), shape_string(dC.rows, B.rows), shape_string(dC.rows, dC.cols),
                     shape_string(B.rows, B.cols)));
  }
  check_output(fn, "dA", dA, {{"dC", dC}, {"B", B}});
}

void check_backward_weight(const char* fn, const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
  check_matrix(fn, "A", A);
  check_matrix(fn, "dC", dC);
  if (A.rows != dC.rows) {
    fail(fmt::format("{}: A is {} but dC is {}; dB = Aᵀ·dC needs A.rows == dC.rows (the forward's M)", fn,
                     shape_string(A.rows, A.cols), shape_string(dC.rows, dC.cols)));
  }
  if (dB.rows != A.cols || dB.cols != dC.cols) {
    fail(fmt::format("{}: dB is {} but Aᵀ·dC is {} (A {}, dC {}); dB must be A.cols x dC.cols", fn,
                     shape_string(dB.rows, dB.cols), shape_string(A.cols, dC.cols), shape_string(A.rows, A.cols),
                     shape_string(dC.rows, dC.cols)));
  }
  check_output(fn, "dB", dB, {{"A", A}, {"dC", dC}});
}

void check_accumulate(const char* fn, const MatrixView& A, const MatrixView& B, const float* acc, std::int64_t ld) {
  check_matrix(fn, "A", A);
  check_matrix(fn, "B", B);
  if (A.cols != B.rows) {
    fail(fmt::format("{}: A is {} but B is {}; A.cols must equal B.rows", fn, shape_string(A.rows, A.cols),
                     shape_string(B.rows, B.cols)));
  }
  if (A.rows > 1 && ld < B.cols) {
    fail(fmt::format("{}: the accumulator tile is {} but its leading dimension is {}; ld must be >= {}", fn,
                     shape_string(A.rows, B.cols), ld, B.cols));
  }
  if (!acc && A.rows > 0 && B.cols > 0) {
    fail(fmt::format("{}: the accumulator tile is {} but its pointer is null", fn, shape_string(A.rows, B.cols)));
  }
  check_no_alias(fn, "acc", byte_range(acc, DType::f32, A.rows, B.cols, ld, 1), {{"A", A}, {"B", B}});
}

}  // namespace detail

void det_gemm_bias_grad(const MatrixView& dC, const MutableVectorView& dbias) {
  constexpr const char* fn = "det_gemm_bias_grad";
  detail::check_matrix(fn, "dC", dC);
  detail::check_vector(fn, "dbias", dbias);
  if (dbias.size != dC.cols) {
    throw std::invalid_argument(fmt::format("{}: dbias has {} elements but dC is {}; dbias must have dC.cols = {}",
                                            fn, dbias.size, shape_string(dC.rows, dC.cols), dC.cols));
  }
  detail::check_output_vector(fn, "dbias", dbias, {{"dC", dC}});
  for (std::int64_t n = 0; n < dC.cols; ++n) {
    float acc = 0.0f;
    for (std::int64_t m = 0; m < dC.rows; ++m) acc = acc + dC.at(m, n);
    store_f32(dbias.data, dbias.dtype, n * dbias.stride, acc);
  }
}

void det_gemm_store(const float* acc, std::int64_t ld, const VectorView* bias, const MutableMatrixView& C) {
  constexpr const char* fn = "det_gemm_store";
  detail::check_output(fn, "C", C, {});
  if (C.rows > 1 && ld < C.cols) {
    throw std::invalid_argument(fmt::format("{}: C is {} but the accumulator's leading dimension is {}; ld must be >= {}",
                                            fn, shape_string(C.rows, C.cols), ld, C.cols));
  }
  if (!acc && C.size() > 0) throw std::invalid_argument(fmt::format("{}: the accumulator pointer is null", fn));
  if (bias) {
    detail::check_vector(fn, "bias", *bias);
    if (bias->size != C.cols) {
      throw std::invalid_argument(fmt::format("{}: bias has {} elements but C is {}; bias must have C.cols = {}", fn,
                                              bias->size, shape_string(C.rows, C.cols), C.cols));
    }
  }
  for (std::int64_t i = 0; i < C.rows; ++i) {
    for (std::int64_t j = 0; j < C.cols; ++j) {
      const float b = bias ? bias->at(j) : 0.0f;
      store_f32(C.data, C.dtype, i * C.row_stride + j * C.col_stride, det_gemm_finish(acc[i * ld + j], bias ? &b : nullptr));
    }
  }
}

}  // namespace cubesim::kernels
