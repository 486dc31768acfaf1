// RMSNorm and LayerNorm (kernels/norm.h) against f64 on random data, rows independent of each other
// bitwise, weight gradients in row order, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "tests/kernels/gemm_test_util.h"

namespace cubesim::kernels::testing {
namespace {

struct NormRun {
  HostMatrix y, dx, dw, db;
  std::vector<float> mean, rstd;
};

NormBuffer nb(const HostMatrix& m) { return {m.view().data, m.dtype(), m.view().row_stride}; }
MutableNormBuffer mnb(HostMatrix& m) { return {m.mview().data, m.dtype(), m.mview().row_stride}; }

// x, dy: rows x n (padded rows, gaps NaN); w, b: 1 x n.
NormRun run_norm(bool layer, const HostMatrix& x, const HostMatrix& w, const HostMatrix& b, const HostMatrix& dy,
                 DType out, int poison = 0) {
  const std::int64_t rows = x.rows(), n = x.cols();
  NormRun r;
  r.y = HostMatrix::output(out, rows, n, Layout::row_padded, poison);
  r.dx = HostMatrix::output(x.dtype(), rows, n, Layout::row_padded, poison);
  r.dw = HostMatrix::output(w.dtype(), 1, n, Layout::row_major, poison);
  r.db = HostMatrix::output(w.dtype(), 1, n, Layout::row_major, poison);
  r.mean.assign(static_cast<std::size_t>(rows), NAN);
  r.rstd.assign(static_cast<std::size_t>(rows), NAN);
  if (layer) {
    layer_norm_forward(nb(x), nb(w), nb(b), mnb(r.y), r.mean.data(), r.rstd.data(), rows, n, 1e-5f);
    layer_norm_backward(nb(x), nb(w), nb(dy), r.mean.data(), r.rstd.data(), mnb(r.dx), mnb(r.dw), mnb(r.db), rows, n);
    EXPECT_TRUE(r.db.fully_written());
  } else {
    rms_norm_forward(nb(x), nb(w), mnb(r.y), r.rstd.data(), rows, n, 1e-5f);
    rms_norm_backward(nb(x), nb(w), nb(dy), r.rstd.data(), mnb(r.dx), mnb(r.dw), rows, n);
  }
  EXPECT_TRUE(r.y.fully_written());
  EXPECT_TRUE(r.dx.fully_written());
  EXPECT_TRUE(r.dw.fully_written());
  return r;
}

struct NormF64 {
  std::vector<double> y, dx, dw, db;
};
NormF64 norm_f64(bool layer, const HostMatrix& x, const HostMatrix& w, const HostMatrix& b, const HostMatrix& dy) {
  const std::int64_t rows = x.rows(), n = x.cols();
  NormF64 r{std::vector<double>(rows * n), std::vector<double>(rows * n), std::vector<double>(n, 0.0),
            std::vector<double>(n, 0.0)};
  for (std::int64_t i = 0; i < rows; ++i) {
    double mu = 0, var = 0;
    if (layer) {
      for (std::int64_t j = 0; j < n; ++j) mu += x.at(i, j);
      mu /= n;
    }
    for (std::int64_t j = 0; j < n; ++j) var += (x.at(i, j) - mu) * (x.at(i, j) - mu);
    const double rs = 1 / std::sqrt(var / n + 1e-5);
    double sg = 0, sgx = 0;
    std::vector<double> xh(n), g(n);
    for (std::int64_t j = 0; j < n; ++j) {
      xh[j] = (x.at(i, j) - mu) * rs;
      g[j] = double(dy.at(i, j)) * w.at(0, j);
      r.y[i * n + j] = xh[j] * w.at(0, j) + (layer ? b.at(0, j) : 0.0);
      sg += g[j];
      sgx += g[j] * xh[j];
      r.dw[j] += dy.at(i, j) * xh[j];
      r.db[j] += dy.at(i, j);
    }
    for (std::int64_t j = 0; j < n; ++j)
      r.dx[i * n + j] = layer ? rs * (g[j] - sg / n - xh[j] * sgx / n) : rs * (g[j] - xh[j] * sgx / n);
  }
  return r;
}

double rel(const HostMatrix& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < got.rows(); ++i)
    for (std::int64_t j = 0; j < got.cols(); ++j) {
      const double w = want[i * got.cols() + j];
      num += (got.at(i, j) - w) * (got.at(i, j) - w);
      den += w * w;
    }
  return std::sqrt(num / den);
}

double unit(DType t) { return t == DType::f32 ? 0 : t == DType::bf16 ? 0x1p-8 : 0x1p-11; }

struct NormCase {
  bool layer;
  DType in, out;
  std::int64_t rows, n;
};

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << (c.layer ? "layer " : "rms ") << dtype_name(c.in) << "->" << dtype_name(c.out) << " " << c.rows << "x" << c.n;
}

class NormContract : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormContract, AccurateAgainstF64) {
  const NormCase c = GetParam();
  const std::uint64_t seed = c.rows * 131 + c.n + (c.layer ? 7 : 0);
  HostMatrix x = HostMatrix::random(c.in, c.rows, c.n, Layout::row_padded, seed);
  // An offset in the rows makes LayerNorm's mean matter.
  for (std::int64_t i = 0; i < c.rows; ++i)
    for (std::int64_t j = 0; j < c.n; ++j) x.set(i, j, x.at(i, j) * 3.0f + static_cast<float>(i % 5) - 2.0f);
  const HostMatrix w = HostMatrix::random(c.in, 1, c.n, Layout::row_major, seed + 1);
  const HostMatrix b = HostMatrix::random(c.in, 1, c.n, Layout::row_major, seed + 2);
  const HostMatrix dy = HostMatrix::random(c.out, c.rows, c.n, Layout::row_padded, seed + 3);
  const NormRun r = run_norm(c.layer, x, w, b, dy, c.out);
  const NormF64 f = norm_f64(c.layer, x, w, b, dy);
  EXPECT_LE(rel(r.y, f.y), unit(c.out) + 1e-5);
  EXPECT_LE(rel(r.dx, f.dx), 2 * unit(c.in) + 1e-5);
  EXPECT_LE(rel(r.dw, f.dw), unit(c.in) + 1e-5);
  if (c.layer) {
    EXPECT_LE(rel(r.db, f.db), unit(c.in) + 1e-5);
  }
  // Deterministic: again with other poison, the same bits.
  const NormRun again = run_norm(c.layer, x, w, b, dy, c.out, 1);
  for (std::int64_t i = 0; i < c.rows; ++i)
    for (std::int64_t j = 0; j < c.n; ++j) {
      ASSERT_EQ(r.y.bits(i, j), again.y.bits(i, j));
      ASSERT_EQ(r.dx.bits(i, j), again.dx.bits(i, j));
    }
}

// A row's y and dx alone equal the same row among others holding inf, NaN and huge values; the
// weight gradient of rows [0, k) plus rows [k, n) in that order equals the whole (row order).
TEST_P(NormContract, RowsAreIndependentAndWeightGradientsGoInRowOrder) {
  const NormCase c = GetParam();
  const std::uint64_t seed = c.rows * 17 + c.n;
  const HostMatrix w = HostMatrix::random(c.in, 1, c.n, Layout::row_major, seed + 1);
  const HostMatrix b = HostMatrix::random(c.in, 1, c.n, Layout::row_major, seed + 2);
  const HostMatrix x1 = HostMatrix::random(c.in, 1, c.n, Layout::row_padded, seed);
  const HostMatrix dy1 = HostMatrix::random(c.out, 1, c.n, Layout::row_padded, seed + 3);
  const NormRun alone = run_norm(c.layer, x1, w, b, dy1, c.out);
  HostMatrix x = HostMatrix::random(c.in, c.rows, c.n, Layout::row_padded, seed + 4);
  HostMatrix dy = HostMatrix::random(c.out, c.rows, c.n, Layout::row_padded, seed + 5);
  const float extreme[] = {INFINITY, NAN, 3e38f, -3e38f, 1e-40f, 0.0f};
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  const std::int64_t at = c.rows / 2;
  for (std::int64_t i = 0; i < c.rows; ++i)
    for (std::int64_t j = 0; j < c.n; ++j) {
      if (i == at) {
        x.set(i, j, x1.at(0, j));
        dy.set(i, j, dy1.at(0, j));
      } else if (i % 2) {
        x.set(i, j, extreme[rng() % 6]);
      }
    }
  const NormRun many = run_norm(c.layer, x, w, b, dy, c.out);
  for (std::int64_t j = 0; j < c.n; ++j) {
    ASSERT_EQ(many.y.bits(at, j), alone.y.bits(0, j)) << j;
    ASSERT_EQ(many.dx.bits(at, j), alone.dx.bits(0, j)) << j;
  }
  // Weight gradient in row order: with f32 weights the sum over rows is visible bit for bit in the
  // order of a sequential fma over the per-row terms the forward defines.
  if (c.in != DType::f32) return;
  const HostMatrix xs = HostMatrix::random(c.in, c.rows, c.n, Layout::row_padded, seed + 6);
  const HostMatrix dys = HostMatrix::random(c.out, c.rows, c.n, Layout::row_padded, seed + 7);
  const NormRun r = run_norm(c.layer, xs, w, b, dys, c.out);
  for (std::int64_t j = 0; j < c.n; ++j) {
    float acc = 0.0f, accb = 0.0f;
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const float xh = c.layer ? det_mul(det_add(xs.at(i, j), -r.mean[i]), r.rstd[i]) : det_mul(xs.at(i, j), r.rstd[i]);
      acc = det_fma(dys.at(i, j), xh, acc);
      accb = det_add(accb, dys.at(i, j));
    }
    ASSERT_EQ(r.dw.at(0, j), acc) << j;
    if (c.layer) {
      ASSERT_EQ(r.db.at(0, j), accb) << j;
    }
  }
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> v;
  for (bool layer : {false, true})
    for (auto [in, out] : {std::pair{DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32},
                           {DType::f16, DType::f16}})
      for (auto [rows, n] : {std::pair<std::int64_t, std::int64_t>{1, 33}, {3, 7}, {40, 256}, {5, 1000}})
        v.push_back({layer, in, out, rows, n});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Host, NormContract, ::testing::ValuesIn(norm_cases()), [](const auto& info) {
  const NormCase& c = info.param;
  return std::string(c.layer ? "layer" : "rms") + "_" + std::string(dtype_name(c.in)) + "to" +
         std::string(dtype_name(c.out)) + "_r" + std::to_string(c.rows) + "n" + std::to_string(c.n);
});

TEST(Norm, RefusesBadSizesAndBuffers) {
  std::vector<float> x(8), w(4), y(8), rs(2);
  try {
    rms_norm_forward({x.data(), DType::f32, 3}, {w.data(), DType::f32, 0}, {y.data(), DType::f32, 4}, rs.data(), 2, 4,
                     1e-5f);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("x's row_stride 3 is less than the row length 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer_norm_forward({x.data(), DType::f32, 4}, {w.data(), DType::f32, 0}, {nullptr, DType::f32, 0},
                                  {y.data(), DType::f32, 4}, rs.data(), rs.data(), 2, 4, 1e-5f),
               std::invalid_argument);
  EXPECT_THROW(rms_norm_forward({x.data(), DType::f32, 4}, {w.data(), DType::f32, 0}, {y.data(), DType::f32, 4},
                                rs.data(), 2, 0, 1e-5f),
               std::invalid_argument);
}

}  // namespace
}  // namespace cubesim::kernels::testing
