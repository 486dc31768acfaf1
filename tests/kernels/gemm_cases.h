// gemm_cases.h — the numerics contract as a table of test cases that any det_gemm backend plugs
// into unchanged: equality with the scalar reference, accuracy against f64, and batch invariance
// (batch size, chunked prefill, padding, zero-padded reductions, row position, whatever the other
// rows hold), forward and both backward products.
//
// A backend is three functions over host views; a device backend copies the inputs in, runs, and
// writes the result into the given (possibly strided) host output view. Add one with one line in
// exactly one .cpp of a test binary (this header defines the TEST_P):
//
//   #include "tests/kernels/gemm_cases.h"
//   INSTANTIATE_GEMM_CONTRACT(Cuda, ::testing::Values(cuda_exact_backend()));
//
// Every case poisons the outputs before each run (fully_written() catches an unwritten element or
// a write outside the view) and uses random data, never constant fills.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/det_gemm.h"
#include "tests/kernels/gemm_test_util.h"

namespace cubesim::kernels::testing {

struct GemmBackend {
  std::string name;  // letters, digits and '_' (it becomes part of the test name)
  // C = A·B (+ bias)
  std::function<void(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C)>
      forward;
  // dA = dC·Bᵀ (ascending n)
  std::function<void(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA)> backward_input;
  // dB = Aᵀ·dC (ascending m)
  std::function<void(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB)> backward_weight;
};

// The scalar definition, as a backend: the table holds it to its own properties too.
inline GemmBackend reference_backend() {
  return {"reference",
          [](const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C) {
            det_gemm_reference(A, B, bias, C);
          },
          [](const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA) {
            det_gemm_backward_input_reference(dC, B, dA);
          },
          [](const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB) {
            det_gemm_backward_weight_reference(A, dC, dB);
          }};
}

enum class Op { forward, backward_input, backward_weight };

enum class Check {
  matches_reference,  // bitwise equal to det_gemm_*_reference (inputs and output in `layout`)
  accuracy,           // ‖out − f64‖/‖f64‖ <= accuracy_tolerance(out dtype, depth)
  batch_size,         // a row alone (batch 1) == the same row in batches of each of `sizes`
  chunked_prefill,    // the batch run as chunks of `sizes` (uneven) == the batch in one call
  padding,            // sizes = {before, after}: zero items around the batch change no row
  reduction_padding,  // sizes = {before, after}: zero terms around the summed index change nothing
  row_position,       // a row alone == that row placed at each position in `sizes` of a random batch
  other_rows,         // a row alone == that row among others holding 0, huge, inf, NaN or subnormals
};

inline const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "fwd";
    case Op::backward_input: return "dgrad";
    case Op::backward_weight: return "wgrad";
  }
  return "?";
}

inline const char* check_name(Check c) {
  switch (c) {
    case Check::matches_reference: return "matches_reference";
    case Check::accuracy: return "accuracy";
    case Check::batch_size: return "batch_size";
    case Check::chunked_prefill: return "chunked_prefill";
    case Check::padding: return "padding";
    case Check::reduction_padding: return "reduction_padding";
    case Check::row_position: return "row_position";
    case Check::other_rows: return "other_rows";
  }
  return "?";
}

// Every op is out[batch, width] = sum over depth, and "a row" is one batch item:
//   forward          X = A  [batch, depth]   W = B  [depth, width]   out = C  [batch, width]  (+bias)
//   backward_input   X = dC [batch, depth]   W = B  [width, depth]   out = dA [batch, width]
//   backward_weight  X = A  [depth, batch]   W = dC [depth, width]   out = dB [batch, width]
// so batch is M, M and K, width is N, K and N, and depth (the summed index) is K, N and M.
struct GemmCase {
  Check check = Check::matches_reference;
  Op op = Op::forward;
  std::int64_t batch = 1, width = 1, depth = 1;
  DType in = DType::f32, out = DType::f32;
  bool bias = false;  // forward only
  std::vector<std::int64_t> sizes;
  Layout layout = Layout::row_major;

  std::string name() const {
    std::string s = std::string(op_name(op)) + "_" + check_name(check) + "_" + std::string(dtype_name(in)) + "to" +
                    std::string(dtype_name(out)) + (bias ? "_bias" : "") + "_b" + std::to_string(batch) + "w" +
                    std::to_string(width) + "d" + std::to_string(depth);
    if (layout != Layout::row_major) s += std::string("_") + layout_name(layout);
    for (auto v : sizes) s += "_" + std::to_string(v);
    return s;
  }
};

// ---- operands of one case ------------------------------------------------------------------------

struct Operands {
  HostMatrix X, W, bias;  // bias: 1 x width, or empty
};

inline HostMatrix make_x(const GemmCase& c, std::int64_t batch, std::int64_t depth, std::uint64_t seed,
                         Layout layout = Layout::row_major) {
  return c.op == Op::backward_weight ? HostMatrix::random(c.in, depth, batch, layout, seed)
                                     : HostMatrix::random(c.in, batch, depth, layout, seed);
}
inline HostMatrix make_w(const GemmCase& c, std::int64_t depth, std::uint64_t seed, Layout layout = Layout::row_major) {
  return c.op == Op::backward_input ? HostMatrix::random(c.in, c.width, depth, layout, seed)
                                    : HostMatrix::random(c.in, depth, c.width, layout, seed);
}
inline Operands make_operands(const GemmCase& c, std::int64_t batch, std::uint64_t seed,
                              Layout layout = Layout::row_major) {
  Operands o{make_x(c, batch, c.depth, seed, layout), make_w(c, c.depth, seed + 1000, layout), {}};
  if (c.bias && c.op == Op::forward) o.bias = HostMatrix::random(c.in, 1, c.width, Layout::row_major, seed + 2000);
  return o;
}

// Element (item, d) of X: item is the batch index, d the summed index.
inline float x_get(const GemmCase& c, const HostMatrix& X, std::int64_t item, std::int64_t d) {
  return c.op == Op::backward_weight ? X.at(d, item) : X.at(item, d);
}
inline void x_set(const GemmCase& c, HostMatrix& X, std::int64_t item, std::int64_t d, float v) {
  if (c.op == Op::backward_weight) {
    X.set(d, item, v);
  } else {
    X.set(item, d, v);
  }
}
inline std::int64_t x_items(const GemmCase& c, const HostMatrix& X) {
  return c.op == Op::backward_weight ? X.cols() : X.rows();
}
// Items [i0, i0+n) of X as a view (rows, or columns for backward_weight).
inline MatrixView x_items_view(const GemmCase& c, const HostMatrix& X, std::int64_t i0, std::int64_t n) {
  const MatrixView v = X.view();
  return c.op == Op::backward_weight ? v.block(0, i0, v.rows, n) : v.block(i0, 0, n, v.cols);
}

inline VectorView bias_view(const Operands& o) {
  const MatrixView v = o.bias.view();
  return {v.data, v.dtype, v.cols, v.col_stride};
}

inline void run_op(const GemmBackend& be, const GemmCase& c, const MatrixView& X, const MatrixView& W,
                   const Operands& o, const MutableMatrixView& out) {
  switch (c.op) {
    case Op::forward: {
      const VectorView b = bias_view(o);
      be.forward(X, W, o.bias.rows() ? &b : nullptr, out);
      return;
    }
    case Op::backward_input: be.backward_input(X, W, out); return;
    case Op::backward_weight: be.backward_weight(X, W, out); return;
  }
}

inline HostMatrix run_case_op(const GemmBackend& be, const GemmCase& c, const HostMatrix& X, const HostMatrix& W,
                              const Operands& o, Layout out_layout = Layout::row_major, int poison = 0) {
  HostMatrix out = HostMatrix::output(c.out, x_items(c, X), c.width, out_layout, poison);
  run_op(be, c, X.view(), W.view(), o, out.mview());
  EXPECT_TRUE(out.fully_written()) << be.name << " " << c.name();
  return out;
}

// X with one batch item copied from another matrix of the same case.
inline void copy_item(const GemmCase& c, const HostMatrix& from, std::int64_t from_item, HostMatrix& to,
                      std::int64_t to_item, std::int64_t depth) {
  for (std::int64_t d = 0; d < depth; ++d) x_set(c, to, to_item, d, x_get(c, from, from_item, d));
}

// ---- the checks ----------------------------------------------------------------------------------

inline void run_gemm_case(const GemmBackend& be, const GemmCase& c) {
  const std::uint64_t seed = std::hash<std::string>{}(c.name()) % 100000;
  switch (c.check) {
    case Check::matches_reference: {
      const Operands o = make_operands(c, c.batch, seed, c.layout);
      const HostMatrix got = run_case_op(be, c, o.X, o.W, o, c.layout, 0);
      const HostMatrix want = run_case_op(reference_backend(), c, o.X, o.W, o, c.layout, 1);
      EXPECT_TRUE(bitwise_equal(got, want));
      return;
    }
    case Check::accuracy: {
      const Operands o = make_operands(c, c.batch, seed);
      const HostMatrix got = run_case_op(be, c, o.X, o.W, o);
      // out = L·R with L [batch, depth], R [depth, width] in every op.
      const MatrixView L = c.op == Op::backward_weight ? o.X.view().transposed() : o.X.view();
      const MatrixView R = c.op == Op::backward_input ? o.W.view().transposed() : o.W.view();
      const VectorView b = bias_view(o);
      const double err = relative_error(got, product_f64(L, R, o.bias.rows() ? &b : nullptr));
      const double tol = accuracy_tolerance(c.out, c.depth);
      EXPECT_LE(err, tol) << "relative error " << err << " exceeds " << tol;
      ::testing::Test::RecordProperty("relative_error", std::to_string(err));
      return;
    }
    case Check::batch_size: {
      const Operands o = make_operands(c, 1, seed);
      for (std::int64_t b : c.sizes) {
        const HostMatrix X = make_x(c, b, c.depth, seed + static_cast<std::uint64_t>(b));
        const HostMatrix full = run_case_op(be, c, X, o.W, o);
        for (std::int64_t item : {std::int64_t{0}, b / 2, b - 1}) {
          HostMatrix one = make_x(c, 1, c.depth, 1);
          copy_item(c, X, item, one, 0, c.depth);
          const HostMatrix alone = run_case_op(be, c, one, o.W, o, Layout::row_major, 1);
          EXPECT_TRUE(rows_bitwise_equal(full, item, alone, 0, 1)) << "batch " << b << ", row " << item;
        }
      }
      return;
    }
    case Check::chunked_prefill: {
      const Operands o = make_operands(c, c.batch, seed);
      const HostMatrix full = run_case_op(be, c, o.X, o.W, o);
      HostMatrix chunked = HostMatrix::output(c.out, c.batch, c.width, Layout::row_major, 1);
      std::int64_t at = 0;
      for (std::int64_t n : c.sizes) {
        run_op(be, c, x_items_view(c, o.X, at, n), o.W.view(), o, chunked.mview().block(at, 0, n, c.width));
        at += n;
      }
      ASSERT_EQ(at, c.batch) << "the chunks of a chunked_prefill case must add up to its batch";
      EXPECT_TRUE(chunked.fully_written());
      EXPECT_TRUE(bitwise_equal(chunked, full));
      return;
    }
    case Check::padding: {
      const std::int64_t before = c.sizes.at(0), after = c.sizes.at(1);
      const Operands o = make_operands(c, c.batch, seed);
      const HostMatrix plain = run_case_op(be, c, o.X, o.W, o);
      HostMatrix padded = make_x(c, before + c.batch + after, c.depth, seed + 1);
      for (std::int64_t i = 0; i < before + c.batch + after; ++i)
        for (std::int64_t d = 0; d < c.depth; ++d) x_set(c, padded, i, d, 0.0f);
      for (std::int64_t i = 0; i < c.batch; ++i) copy_item(c, o.X, i, padded, before + i, c.depth);
      const HostMatrix out = run_case_op(be, c, padded, o.W, o, Layout::row_major, 1);
      EXPECT_TRUE(rows_bitwise_equal(out, before, plain, 0, c.batch));
      return;
    }
    case Check::reduction_padding: {
      // Zero terms in the summed index: fma(0, w, acc) == acc for the nonzero accumulators of random
      // data, and fma(0, w, +0) == +0, so a padded reduction (a tile-aligned K, masked tokens in the
      // weight gradient) gives the same bits. The zeros sit in X, or in dC for the weight gradient.
      const std::int64_t before = c.sizes.at(0), after = c.sizes.at(1), depth = before + c.depth + after;
      const Operands o = make_operands(c, c.batch, seed);
      const HostMatrix plain = run_case_op(be, c, o.X, o.W, o);
      HostMatrix X = make_x(c, c.batch, depth, seed + 1);
      HostMatrix W = make_w(c, depth, seed + 2);
      const bool zeros_in_w = c.op == Op::backward_weight;
      const bool w_transposed = c.op == Op::backward_input;  // W is [width, depth]
      auto w_get = [&](const HostMatrix& m, std::int64_t d, std::int64_t j) { return w_transposed ? m.at(j, d) : m.at(d, j); };
      for (std::int64_t d = 0; d < depth; ++d) {
        const bool pad = d < before || d >= before + c.depth;
        for (std::int64_t i = 0; i < c.batch; ++i) {
          // padded terms: X keeps its random value when the zeros are in W
          const float v = !pad ? x_get(c, o.X, i, d - before) : zeros_in_w ? x_get(c, X, i, d) : 0.0f;
          x_set(c, X, i, d, v);
        }
        for (std::int64_t j = 0; j < c.width; ++j) {
          const float v = !pad ? w_get(o.W, d - before, j) : zeros_in_w ? 0.0f : w_get(W, d, j);
          if (w_transposed) {
            W.set(j, d, v);
          } else {
            W.set(d, j, v);
          }
        }
      }
      const HostMatrix out = run_case_op(be, c, X, W, o, Layout::row_major, 1);
      EXPECT_TRUE(bitwise_equal(out, plain));
      return;
    }
    case Check::row_position: {
      const Operands o = make_operands(c, 1, seed);
      const HostMatrix alone = run_case_op(be, c, o.X, o.W, o);
      for (std::int64_t p : c.sizes) {
        HostMatrix X = make_x(c, c.batch, c.depth, seed + 7 * static_cast<std::uint64_t>(p) + 1);
        copy_item(c, o.X, 0, X, p, c.depth);
        const HostMatrix out = run_case_op(be, c, X, o.W, o, Layout::row_major, 1);
        EXPECT_TRUE(rows_bitwise_equal(out, p, alone, 0, 1)) << "position " << p;
      }
      return;
    }
    case Check::other_rows: {
      const Operands o = make_operands(c, 1, seed);
      const HostMatrix alone = run_case_op(be, c, o.X, o.W, o);
      const float inf = std::numeric_limits<float>::infinity();
      const float huge = c.in == DType::f16 ? 60000.0f : 1e30f;
      const float tiny = c.in == DType::f16 ? 6e-8f : 1e-39f;
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const std::int64_t p = c.batch / 2;
      for (float fill : {0.0f, huge, -huge, inf, -inf, nan, tiny}) {
        HostMatrix X = make_x(c, c.batch, c.depth, seed + 3);
        for (std::int64_t i = 0; i < c.batch; ++i)
          for (std::int64_t d = 0; d < c.depth; ++d)
            if (i != p && (d % 3 != 1)) x_set(c, X, i, d, fill);  // keep a third random
        copy_item(c, o.X, 0, X, p, c.depth);
        HostMatrix out = HostMatrix::output(c.out, c.batch, c.width, Layout::row_major, 1);
        run_op(be, c, X.view(), o.W.view(), o, out.mview());
        // Other rows may legitimately hold NaN here; only row p must be written and unchanged.
        EXPECT_TRUE(rows_bitwise_equal(out, p, alone, 0, 1)) << "other rows filled with " << fill;
      }
      return;
    }
  }
}

// ---- the table -----------------------------------------------------------------------------------

inline std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> t;
  struct Types {
    DType in, out;
  };
  const Types main_types[] = {{DType::f32, DType::f32}, {DType::bf16, DType::bf16}};
  const Types all_types[] = {{DType::f32, DType::f32},  {DType::f32, DType::bf16},  {DType::f32, DType::f16},
                             {DType::bf16, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f16},
                             {DType::f16, DType::f32},  {DType::f16, DType::bf16},  {DType::f16, DType::f16}};
  for (Op op : {Op::forward, Op::backward_input, Op::backward_weight}) {
    const bool fwd = op == Op::forward;
    // Equality with the reference: edge shapes, strided and transposed inputs, every dtype pair.
    struct Shape {
      std::int64_t b, w, d;
    };
    for (Shape s : {Shape{1, 1, 1}, Shape{7, 16, 129}, Shape{16, 7, 1000}, Shape{129, 33, 7}, Shape{13, 130, 300}}) {
      for (Layout l : {Layout::row_major, Layout::row_padded, Layout::col_major}) {
        t.push_back({Check::matches_reference, op, s.b, s.w, s.d, DType::bf16, DType::bf16, fwd, {}, l});
      }
    }
    for (Types ty : all_types) {
      t.push_back({Check::matches_reference, op, 23, 37, 261, ty.in, ty.out, fwd, {}, Layout::col_padded});
    }
    if (fwd) t.push_back({Check::matches_reference, op, 23, 37, 261, DType::f32, DType::f32, false, {}});
    // Accuracy against f64.
    for (Types ty : all_types) t.push_back({Check::accuracy, op, 48, 40, 1000, ty.in, ty.out, fwd, {}});
    // Invariance. Depths 129 and 300 are not multiples of any tile (300 crosses the 256 k-block).
    for (Types ty : main_types) {
      for (std::int64_t depth : {129, 300}) {
        t.push_back({Check::batch_size, op, 1, 64, depth, ty.in, ty.out, fwd, {2, 3, 64, 257, 2048}});
      }
      t.push_back({Check::chunked_prefill, op, 300, 48, 257, ty.in, ty.out, fwd, {1, 7, 64, 100, 128}});
      t.push_back({Check::chunked_prefill, op, 37, 70, 1000, ty.in, ty.out, fwd, {5, 31, 1}});
      t.push_back({Check::padding, op, 37, 40, 129, ty.in, ty.out, fwd, {0, 11}});
      t.push_back({Check::padding, op, 37, 40, 129, ty.in, ty.out, fwd, {5, 64}});
      t.push_back({Check::reduction_padding, op, 20, 40, 129, ty.in, ty.out, fwd, {0, 127}});
      t.push_back({Check::reduction_padding, op, 20, 40, 129, ty.in, ty.out, fwd, {3, 9}});
      t.push_back({Check::row_position, op, 64, 40, 300, ty.in, ty.out, fwd, {0, 1, 31, 62, 63}});
      t.push_back({Check::other_rows, op, 19, 40, 129, ty.in, ty.out, fwd, {}});
    }
  }
  return t;
}

// gtest prints parameters of failing tests with these (instead of a hex dump).
inline void PrintTo(const GemmBackend& b, std::ostream* os) { *os << b.name; }
inline void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.name(); }

// ---- the parameterized test ----------------------------------------------------------------------

class GemmContract : public ::testing::TestWithParam<std::tuple<GemmBackend, GemmCase>> {};

TEST_P(GemmContract, Holds) {
  const auto& [backend, c] = GetParam();
  run_gemm_case(backend, c);
}

inline std::string gemm_contract_test_name(const ::testing::TestParamInfo<std::tuple<GemmBackend, GemmCase>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name();
}

}  // namespace cubesim::kernels::testing

// backends: a gtest generator of GemmBackend, e.g. ::testing::Values(a(), b()). Use at global scope.
#define INSTANTIATE_GEMM_CONTRACT(prefix, backends)                                                     \
  namespace cubesim::kernels::testing {                                                                 \
  INSTANTIATE_TEST_SUITE_P(prefix, GemmContract, ::testing::Combine(backends, ::testing::ValuesIn(gemm_cases())), \
                           gemm_contract_test_name);                                                    \
  }
