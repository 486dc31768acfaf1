#include "runtime/ops.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/det_gemm.h"
#include "kernels/norm.h"
#include "kernels/rotary.h"
#include "kernels/vocab.h"
#include "runtime/context.h"
#include "runtime/errors.h"

namespace cubesim::rt {

namespace {

// A host view of a 2-D tensor: the tensor's own memory on the host backend, else a copy of the
// byte span it covers (one read, strides kept), written back afterwards for outputs.
struct Staged {
  std::vector<std::uint8_t> buf;
  kernels::MutableMatrixView view;
};

void check_2d(const Tensor& t, const char* op, const char* what) {
  if (t.dim() != 2) {
    throw RuntimeError(fmt::format("{}: {} must be 2-D, got {}", op, what, t.describe()));
  }
  if (t.strides()[0] < 0 || t.strides()[1] < 0) throw RuntimeError(fmt::format("{}: {} has negative strides", op, what));
}

std::pair<std::uint64_t, std::uint64_t> span_of(const Tensor& t) {  // [first, last] element offsets
  const std::uint64_t first = static_cast<std::uint64_t>(t.offset());
  std::uint64_t last = first;
  if (t.numel() > 0) {
    last += static_cast<std::uint64_t>((t.shape()[0] - 1) * t.strides()[0] + (t.shape()[1] - 1) * t.strides()[1]);
  }
  return {first, last};
}

Staged stage(const Tensor& t, bool load) {
  Staged s;
  if (void* base = t.storage().host_ptr()) {
    s.view = kernels::MutableMatrixView{static_cast<std::uint8_t*>(base) + t.byte_offset(), t.dtype(), t.shape()[0],
                                        t.shape()[1], t.strides()[0], t.strides()[1]};
    return s;
  }
  const auto [first, last] = span_of(t);
  const std::uint64_t es = t.element_size();
  s.buf.resize((last - first + 1) * es);
  if (load && t.numel() > 0) t.storage().read(first * es, s.buf.data(), s.buf.size());
  s.view = kernels::MutableMatrixView{s.buf.data(), t.dtype(), t.shape()[0], t.shape()[1], t.strides()[0], t.strides()[1]};
  return s;
}

void unstage(const Tensor& t, const Staged& s) {
  if (s.buf.empty()) return;
  t.storage().write(span_of(t).first * t.element_size(), s.buf.data(), s.buf.size());
}

// Charges `cost` on the calling rank and books it as compute.
void account(const Tensor& any, OpCost cost) {
  Context& ctx = Context::current(cost.name);
  const int rank = Context::current_rank(cost.name);
  if (any.device() != rank) {
    throw RuntimeError(fmt::format("{} on rank {}: tensor {} lives on rank {}", cost.name, rank, any.describe(), any.device()));
  }
  const sim::Time t0 = ctx.simulator().now();
  ctx.backend().charge(rank, cost);
  const sim::Time t1 = ctx.simulator().now();
  ctx.add_compute(rank, t1 - t0, cost.name);
  if (t1 > t0 && ctx.trace().enabled()) ctx.trace().span(ctx.compute_track(rank), cost.name, t0, t1);
}

bool values(const Tensor& t) { return !Context::current("op").backend().timing_only() && t.numel() > 0; }

void same_rank(const Tensor& a, const Tensor& b, const char* op) {
  const Context& ctx = Context::current(op);
  ctx.check_owned(a, op);
  ctx.check_owned(b, op);
  if (a.device() != b.device()) {
    throw RuntimeError(fmt::format("{}: {} and {} are on different ranks", op, a.describe(), b.describe()));
  }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) {
  check_2d(a, name, "A");
  check_2d(b, name, "B");
  check_2d(c, name, "C");
  same_rank(a, b, name);
  same_rank(a, c, name);
  if (bias) Context::current(name).check_owned(*bias, name);
  if (a.shape()[1] != b.shape()[0]) {
    throw RuntimeError(fmt::format("{}: A {} times B {} is not defined: A's columns ({}) must equal B's rows ({}); "
                                   "valid: A [M, K] times B [K, N] (a transposed weight: pass w.t())",
                                   name, shape_str(a.shape()), shape_str(b.shape()), a.shape()[1], b.shape()[0]));
  }
  if (c.shape()[0] != a.shape()[0] || c.shape()[1] != b.shape()[1]) {
    throw RuntimeError(fmt::format("{}: A {} times B {} gives [{}, {}], but the output C is {}; give an output of "
                                   "shape [{}, {}]",
                                   name, shape_str(a.shape()), shape_str(b.shape()), a.shape()[0], b.shape()[1],
                                   shape_str(c.shape()), a.shape()[0], b.shape()[1]));
  }
  // The output must not share memory with an input, on every backend alike (the host's det_gemm
  // and the simulated PE kernel would otherwise differ: one refuses, the other reads what it wrote).
  auto overlaps = [](const Tensor& x, const Tensor& y) {
    if (x.storage_ptr() != y.storage_ptr() || x.numel() == 0 || y.numel() == 0) return false;
    auto span = [](const Tensor& t) {  // [first, last] element offsets, any rank, strides >= 0
      std::int64_t last = t.offset();
      for (std::size_t i = 0; i < t.shape().size(); ++i) last += (t.shape()[i] - 1) * t.strides()[i];
      return std::pair<std::int64_t, std::int64_t>{t.offset(), last};
    };
    const auto [x0, x1] = span(x);
    const auto [y0, y1] = span(y);
    return x0 <= y1 && y0 <= x1;
  };
  const std::pair<const Tensor*, const char*> inputs[] = {{&a, "A"}, {&b, "B"}, {bias, "bias"}};
  for (const auto& [in, which] : inputs) {
    if (in && overlaps(*in, c)) {
      throw RuntimeError(fmt::format("{}: the output C {} shares memory with input {} {}; the output must not alias "
                                     "an input: give a separate output tensor",
                                     name, c.describe(), which, in->describe()));
    }
  }
  if (bias && (bias->numel() != c.shape()[1] || bias->dim() != 1)) {
    throw RuntimeError(fmt::format("{}: bias {} must be 1-D with {} elements (C's columns)", name, bias->describe(),
                                   c.shape()[1]));
  }
  Context& ctx = Context::current(name);
  const int rank = Context::current_rank(name);
  Backend& be = ctx.backend();
  const sim::Time t0 = ctx.simulator().now();
  const std::uint64_t region = be.begin_region(rank, "gemm");
  if (c.device() == rank && be.gemm(a, b, bias, c, name)) {  // the backend ran it
    const sim::Time t1 = ctx.simulator().now();
    ctx.add_compute(rank, t1 - t0, name);
    if (t1 > t0 && ctx.trace().enabled()) ctx.trace().span(ctx.compute_track(rank), name, t0, t1);
  } else {
    if (values(c)) {
      Staged sa = stage(a, true), sb = stage(b, true), sc = stage(c, !c.is_contiguous());
      std::vector<std::uint8_t> bias_host;
      kernels::VectorView bv;
      if (bias) {
        bias_host = bias->to_host_bytes();
        bv = kernels::VectorView::contiguous(bias_host.data(), bias->dtype(), bias->numel());
      }
      if (be.gemm_numerics() == kernels::AccumulatorModel::f32_fma_seq) {
        kernels::det_gemm(sa.view, sb.view, bias ? &bv : nullptr, sc.view);
      } else {
        try {
          kernels::gemm_model(be.gemm_numerics(), sa.view, sb.view, bias ? &bv : nullptr, sc.view);
        } catch (const std::invalid_argument& e) {
          throw RuntimeError(fmt::format("{}: {}", name, e.what()));
        }
      }
      unstage(c, sc);
    }
    OpCost cost;
    cost.kind = OpCost::Kind::gemm;
    cost.name = name;
    cost.m = a.shape()[0];
    cost.n = b.shape()[1];
    cost.k = a.shape()[1];
    cost.dtype = a.dtype();
    cost.bytes_read = a.nbytes() + b.nbytes();
    cost.bytes_written = c.nbytes();
    account(c, cost);
  }
  if (values(c)) be.fault_point(Backend::FaultPoint::gemm_output, c);
  be.end_region(region);
  if (ctx.options().record_ops) {
    ctx.record_op(OpRecord{rank, "gemm", name,
                           fmt::format("{} {}x{}x{}", dtype_name(a.dtype()), a.shape()[0], b.shape()[1], a.shape()[1]),
                           t0, ctx.simulator().now(), region});
  }
}

void bias_grad(const Tensor& dy, const Tensor& db) {
  const Tensor d2 = dy.dim() == 2 ? dy : dy.reshape({dy.rows(), dy.cols()});
  if (db.numel() != d2.shape()[1]) {
    throw RuntimeError(fmt::format("bias_grad: db {} must have {} elements (dy's columns, dy is {})", db.describe(),
                                   d2.shape()[1], dy.describe()));
  }
  same_rank(dy, db, "bias_grad");
  ElementwiseRequest req{ElementwiseRequest::Kind::bias_grad, kernels::GeluKind::tanh, &d2, nullptr, &db};
  if (values(db) && !(d2.is_contiguous() && db.is_contiguous() && Context::current("bias_grad").backend().elementwise(req))) {
    Staged s = stage(d2, true);
    std::vector<std::uint8_t> out(db.nbytes());
    kernels::det_gemm_bias_grad(s.view, kernels::MutableVectorView::contiguous(out.data(), db.dtype(), db.numel()));
    db.copy_from_host_bytes(out.data(), out.size());
  }
  OpCost cost{OpCost::Kind::reduce, "bias_grad", 0, 0, 0, dy.dtype(), dy.nbytes(), db.nbytes(),
              static_cast<double>(dy.numel()), true};
  account(db, cost);
}

namespace {
bool all_contiguous(const std::vector<const Tensor*>& in, const Tensor& out) {
  for (const Tensor* t : in) {
    if (!t->is_contiguous()) return false;
  }
  return out.is_contiguous();
}

template <class F>
void elementwise(ElementwiseRequest req, const std::vector<const Tensor*>& in, const Tensor& out, double flops_per, F f) {
  const char* name = req.kind == ElementwiseRequest::Kind::gelu            ? "gelu"
                     : req.kind == ElementwiseRequest::Kind::gelu_backward ? "gelu_backward"
                     : req.kind == ElementwiseRequest::Kind::add           ? "add"
                                                                           : "add_bias";
  for (const Tensor* t : in) {
    if (t->shape() != out.shape()) {
      throw RuntimeError(fmt::format("{}: {} and {} must have the same shape", name, t->describe(), out.describe()));
    }
    same_rank(*t, out, name);
  }
  req.out = &out;
  if (values(out) && !(all_contiguous(in, out) && (!req.y || req.y->is_contiguous()) &&
                       Context::current(name).backend().elementwise(req))) {
    std::vector<std::vector<float>> xs;
    for (const Tensor* t : in) xs.push_back(t->to_host_f32());
    std::vector<float> y(static_cast<std::size_t>(out.numel()));
    f(xs, y);
    out.copy_from_host_f32(y.data(), out.numel());
  }
  std::uint64_t rd = 0;
  for (const Tensor* t : in) rd += t->nbytes();
  OpCost cost{OpCost::Kind::elementwise, name, 0, 0, 0, out.dtype(), rd, out.nbytes(), flops_per * static_cast<double>(out.numel()),
              true};
  account(out, cost);
}
using EK = ElementwiseRequest::Kind;
}  // namespace

void gelu(kernels::GeluKind k, const Tensor& x, const Tensor& y) {
  elementwise({EK::gelu, k, &x}, {&x}, y, 20, [k](auto& xs, auto& out) {
    kernels::gelu_forward(k, xs[0].data(), out.data(), static_cast<std::int64_t>(out.size()));
  });
}

void gelu_backward(kernels::GeluKind k, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  elementwise({EK::gelu_backward, k, &x, &dy}, {&x, &dy}, dx, 30, [k](auto& xs, auto& out) {
    kernels::gelu_backward(k, xs[0].data(), xs[1].data(), out.data(), static_cast<std::int64_t>(out.size()));
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& y) {
  elementwise({EK::add, kernels::GeluKind::tanh, &a, &b}, {&a, &b}, y, 1, [](auto& xs, auto& out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = xs[0][i] + xs[1][i];
  });
}

void add_bias(const Tensor& x, const Tensor& bias, const Tensor& y) {
  Context::current("add_bias").check_owned(bias, "add_bias");
  if (bias.numel() != x.cols()) {
    throw RuntimeError(fmt::format("add_bias: bias {} must have {} elements (the columns of {})", bias.describe(),
                                   x.cols(), x.describe()));
  }
  const std::int64_t cols = x.cols();
  elementwise({EK::add_bias, kernels::GeluKind::tanh, &x, &bias}, {&x}, y, 1, [&bias, cols](auto& xs, auto& out) {
    const std::vector<float> b = bias.to_host_f32();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = xs[0][i] + b[i % static_cast<std::size_t>(cols)];
  });
}

void bias_gelu(kernels::GeluKind k, const Tensor& x, const Tensor& bias, const Tensor& pre, const Tensor& y) {
  Context& ctx = Context::current("bias_gelu");
  ctx.check_owned(bias, "bias_gelu");
  if (bias.numel() != x.cols()) {
    throw RuntimeError(fmt::format("bias_gelu: bias {} must have {} elements (the columns of {})", bias.describe(),
                                   x.cols(), x.describe()));
  }
  for (const Tensor* t : {&pre, &y}) {
    if (t->shape() != x.shape()) {
      throw RuntimeError(fmt::format("bias_gelu: {} and {} must have the same shape", x.describe(), t->describe()));
    }
    same_rank(x, *t, "bias_gelu");
  }
  same_rank(x, bias, "bias_gelu");
  ElementwiseRequest req{EK::bias_gelu, k, &x, &bias, &y, &pre};
  const bool contiguous = x.is_contiguous() && bias.is_contiguous() && pre.is_contiguous() && y.is_contiguous();
  if (values(y) && !(contiguous && ctx.backend().elementwise(req))) {
    // add_bias's arithmetic, rounded to pre's dtype, then gelu's on the rounded values.
    const std::vector<float> xs = x.to_host_f32(), b = bias.to_host_f32();
    const auto cols = static_cast<std::size_t>(x.cols());
    std::vector<float> p(xs.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = xs[i] + b[i % cols];
    pre.copy_from_host_f32(p.data(), pre.numel());
    p = pre.to_host_f32();
    kernels::gelu_forward(k, p.data(), p.data(), static_cast<std::int64_t>(p.size()));
    y.copy_from_host_f32(p.data(), y.numel());
  }
  // As add_bias, the bias's bytes are not counted; gelu's 20 operations and the add per element.
  OpCost cost{OpCost::Kind::elementwise, "bias_gelu", 0, 0, 0, y.dtype(), x.nbytes(), pre.nbytes() + y.nbytes(),
              21 * static_cast<double>(y.numel()), true};
  account(y, cost);
}

void copy(const Tensor& src, const Tensor& dst) {
  check_same_shape(src, dst, "copy");
  same_rank(src, dst, "copy");
  ElementwiseRequest req{EK::copy, kernels::GeluKind::tanh, &src, nullptr, &dst};
  if (values(dst) && !(src.is_contiguous() && dst.is_contiguous() && Context::current("copy").backend().elementwise(req))) {
    const auto bytes = src.to_host_bytes();
    dst.copy_from_host_bytes(bytes.data(), bytes.size());
  }
  OpCost cost{OpCost::Kind::copy, "copy", 0, 0, 0, src.dtype(), src.nbytes(), dst.nbytes(), 0, true};
  account(dst, cost);
}

// ---- attention and norms ------------------------------------------------------------------------

namespace {

// A 2-D operand as kernel rows (columns contiguous): the tensor's memory on the host backend, else a
// staged copy written back afterwards for outputs.
struct Rows {
  Staged st;
  Tensor view;  // 2-D (a vector as one row)
  const Tensor* t = nullptr;
  void* data() const { return st.view.data; }
  std::int64_t stride() const { return st.view.row_stride; }
  kernels::AttentionBuffer in() const { return {st.view.data, t->dtype(), stride()}; }
  kernels::MutableAttentionBuffer out() const { return {st.view.data, t->dtype(), stride()}; }
  kernels::NormBuffer norm() const { return {st.view.data, t->dtype(), stride()}; }
  kernels::MutableNormBuffer mnorm() const { return {st.view.data, t->dtype(), stride()}; }
  void store() const { unstage(view, st); }
};

Rows rows_of(const Tensor& t, bool load) {
  Rows r;
  r.view = t.dim() == 1 ? t.reshape({1, t.numel()}) : t;
  r.t = &t;
  r.st = stage(r.view, load);
  return r;
}

// A tensor of `rows` x `cols` elements with contiguous columns, on the calling rank.
void check_operand(const Tensor& t, const char* op, const char* what, std::int64_t rows, std::int64_t cols,
                   const char* meaning) {
  Context::current(op).check_owned(t, op);
  if (t.dim() != 2 || t.shape()[0] != rows || t.shape()[1] != cols) {
    throw RuntimeError(fmt::format("{}: {} is {}, but must be [{}, {}] ({})", op, what, t.describe(), rows, cols, meaning));
  }
  if (cols > 1 && t.strides()[1] != 1) {
    throw RuntimeError(fmt::format("{}: {} {} must have contiguous columns (rows may be strided)", op, what, t.describe()));
  }
  if (t.strides()[0] < 0) throw RuntimeError(fmt::format("{}: {} has negative strides", op, what));
}

void check_vector(const Tensor& t, const char* op, const char* what, std::int64_t n) {
  Context::current(op).check_owned(t, op);
  if (t.numel() != n || !t.is_contiguous()) {
    throw RuntimeError(fmt::format("{}: {} is {}, but must be contiguous with {} elements", op, what, t.describe(), n));
  }
}

void check_stats(const Tensor& t, const char* op, const char* what, std::int64_t n, const char* meaning) {
  check_vector(t, op, what, n);
  if (t.dtype() != DType::f32) {
    throw RuntimeError(fmt::format("{}: {} is {}, but must be f32 ({})", op, what, t.describe(), meaning));
  }
}

void same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) same_rank(*first, *t, op);
}

std::vector<float> f32_of(const Tensor& t) { return t.to_host_f32(); }

// The op where the backend runs it (values only: the runtime books the time), or false (host values).
using RK = RowwiseRequest::Kind;
bool on_backend(const char* op, const RowwiseRequest& r) { return Context::current(op).backend().rowwise(r); }

// How the simulator prices attention until it runs it as PE tiles: the products as a GEMM's MACs
// (m x n x k = rows x mean visible keys x MACs per score) with Q read once and K, V once per
// 128-query tile, and the softmax's arithmetic on the vector unit.
void account_attention(const Tensor& out, const char* name, const kernels::AttentionShape& s, double macs_per_score,
                       double flops_per_score, std::uint64_t bytes_read, std::uint64_t bytes_written) {
  const double scores = kernels::attention_forward_flops(s) / (4.0 * static_cast<double>(s.head_dim) + 5.0);
  const std::int64_t m = s.batch * s.heads * s.seq_q;
  OpCost mm;
  mm.kind = OpCost::Kind::gemm;
  mm.name = name;
  mm.m = m;
  mm.n = static_cast<std::int64_t>(std::ceil(scores / static_cast<double>(std::max<std::int64_t>(m, 1))));
  mm.k = static_cast<std::int64_t>(macs_per_score);
  mm.dtype = out.dtype();
  mm.bytes_read = bytes_read;
  mm.bytes_written = bytes_written;
  mm.kernel = true;
  account(out, mm);
  OpCost sm{OpCost::Kind::elementwise, "attention softmax", 0, 0, 0, DType::f32, 0, 0, flops_per_score * scores, false};
  account(out, sm);
}

}  // namespace

namespace {
// Runs `run` (a backend's own attention: values and time) and books its time as the rank's compute,
// or returns false when the backend does not run it.
template <class Fn>
bool backend_ran(const Tensor& any, const char* name, Fn run) {
  Context& ctx = Context::current(name);
  const int rank = Context::current_rank(name);
  const sim::Time t0 = ctx.simulator().now();
  if (!run()) return false;
  const sim::Time t1 = ctx.simulator().now();
  ctx.add_compute(rank, t1 - t0, name);
  if (t1 > t0 && ctx.trace().enabled()) ctx.trace().span(ctx.compute_track(rank), name, t0, t1);
  return true;
}

// The forward where the backend runs it, or false (host values).
bool backend_attention_forward(const kernels::AttentionShape& s, AttentionRequest::Operand q,
                               AttentionRequest::Operand k, AttentionRequest::Operand v, const Tensor& out,
                               const Tensor& stats, std::span<const std::int64_t> kv_valid = {}) {
  AttentionRequest req;
  req.kv_valid = kv_valid;
  req.shape = s;
  req.q = q;
  req.k = k;
  req.v = v;
  req.out = {&out, 0, 0};
  req.stats = &stats;
  return Context::current("attention").backend().attention(req);
}

// The backward where the backend runs it, or false (host values).
bool backend_attention_backward(const kernels::AttentionShape& s, AttentionRequest::Operand q, AttentionRequest::Operand k,
                                AttentionRequest::Operand v, AttentionRequest::Operand out, const Tensor& stats,
                                AttentionRequest::Operand dout, AttentionRequest::Operand dq, AttentionRequest::Operand dk,
                                AttentionRequest::Operand dv, std::span<const std::int64_t> kv_valid = {}) {
  Context& ctx = Context::current("attention_backward");
  AttentionRequest req;
  req.kv_valid = kv_valid;
  req.shape = s;
  req.backward = true;
  req.q = q;
  req.k = k;
  req.v = v;
  req.out = out;
  req.dout = dout;
  req.dq = dq;
  req.dk = dk;
  req.dv = dv;
  req.stats = &stats;
  return ctx.backend().attention(req);
}
}  // namespace

void attention(const kernels::AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               const Tensor& stats) {
  const char* op = "attention";
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    throw RuntimeError(e.what());
  }
  const std::int64_t tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, qw = s.heads * s.head_dim,
                     kw = s.kv_heads * s.head_dim;
  check_operand(q, op, "q", tq, qw, "batch x seq_q, heads x head_dim");
  check_operand(k, op, "k", tk, kw, "batch x seq_k, kv_heads x head_dim");
  check_operand(v, op, "v", tk, kw, "batch x seq_k, kv_heads x head_dim");
  check_operand(out, op, "out", tq, qw, "batch x seq_q, heads x head_dim");
  check_stats(stats, op, "stats", tq * 2 * s.heads, "2 per token and head");
  same_device(op, {&q, &k, &v, &out, &stats});
  if (backend_ran(out, op, [&] { return backend_attention_forward(s, {&q, 0, 0}, {&k, 0, 0}, {&v, 0, 0}, out, stats); })) {
    return;
  }
  if (values(out)) {
    const Rows rq = rows_of(q, true), rk = rows_of(k, true), rv = rows_of(v, true), ro = rows_of(out, false);
    std::vector<float> st(static_cast<std::size_t>(stats.numel()));
    kernels::attention_forward(s, rq.in(), rk.in(), rv.in(), ro.out(), st.data());
    ro.store();
    stats.copy_from_host_f32(st.data(), stats.numel());
  }
  const std::uint64_t tiles = static_cast<std::uint64_t>((s.seq_q + 127) / 128);
  account_attention(out, op, s, 2.0 * static_cast<double>(s.head_dim), 5.0, q.nbytes() + tiles * (k.nbytes() + v.nbytes()),
                    out.nbytes() + stats.nbytes());
}

void attention_backward(const kernels::AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& stats, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  const char* op = "attention_backward";
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    throw RuntimeError(fmt::format("{} (backward)", e.what()));
  }
  const std::int64_t tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, qw = s.heads * s.head_dim,
                     kw = s.kv_heads * s.head_dim;
  check_operand(q, op, "q", tq, qw, "batch x seq_q, heads x head_dim");
  check_operand(k, op, "k", tk, kw, "batch x seq_k, kv_heads x head_dim");
  check_operand(v, op, "v", tk, kw, "batch x seq_k, kv_heads x head_dim");
  check_operand(out, op, "out", tq, qw, "the forward's output");
  check_stats(stats, op, "stats", tq * 2 * s.heads, "the forward's statistics");
  check_operand(dout, op, "dout", tq, qw, "out's gradient");
  check_operand(dq, op, "dq", tq, qw, "q's gradient");
  check_operand(dk, op, "dk", tk, kw, "k's gradient");
  check_operand(dv, op, "dv", tk, kw, "v's gradient");
  same_device(op, {&q, &k, &v, &out, &stats, &dout, &dq, &dk, &dv});
  if (backend_ran(dq, op, [&] {
        return backend_attention_backward(s, {&q, 0, 0}, {&k, 0, 0}, {&v, 0, 0}, {&out, 0, 0}, stats, {&dout, 0, 0},
                                          {&dq, 0, 0}, {&dk, 0, 0}, {&dv, 0, 0});
      })) {
    return;
  }
  if (values(dq)) {
    const Rows rq = rows_of(q, true), rk = rows_of(k, true), rv = rows_of(v, true), ro = rows_of(out, true),
               rdo = rows_of(dout, true), rdq = rows_of(dq, false), rdk = rows_of(dk, false), rdv = rows_of(dv, false);
    const std::vector<float> st = f32_of(stats);
    kernels::attention_backward(s, rq.in(), rk.in(), rv.in(), ro.in(), st.data(), rdo.in(), rdq.out(), rdk.out(),
                                rdv.out());
    rdq.store();
    rdk.store();
    rdv.store();
  }
  const std::uint64_t tiles = static_cast<std::uint64_t>((s.seq_k + 127) / 128);
  account_attention(dq, op, s, 5.0 * static_cast<double>(s.head_dim), 6.0,
                    k.nbytes() + v.nbytes() + tiles * (q.nbytes() + out.nbytes() + dout.nbytes() + stats.nbytes()),
                    dq.nbytes() + dk.nbytes() + dv.nbytes());
}

namespace {
// The three operands of a fused QKV row, in place (kernels/attention.h, group_stride).
struct FusedQkv {
  kernels::AttentionBuffer q, k, v;
};
FusedQkv fused_views(const kernels::AttentionShape& s, void* data, DType t, std::int64_t row_stride) {
  const std::int64_t g = s.heads / s.kv_heads, d = s.head_dim, gs = (g + 2) * d;
  auto* base = static_cast<std::uint8_t*>(data);
  const std::size_t es = dtype_size(t);
  return {{base, t, row_stride, gs},
          {base + static_cast<std::size_t>(g * d) * es, t, row_stride, gs},
          {base + static_cast<std::size_t>((g + 1) * d) * es, t, row_stride, gs}};
}

void validate_self_attention(const kernels::AttentionShape& s, const char* op) {
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    throw RuntimeError(fmt::format("{}: {}", op, e.what()));
  }
  if (s.seq_q != s.seq_k) {
    throw RuntimeError(fmt::format("{}: self-attention on a fused QKV needs seq_q ({}) == seq_k ({})", op, s.seq_q,
                                   s.seq_k));
  }
}
}  // namespace

namespace {
// kv_valid's size and values, or an error naming them.
const std::int64_t* valid_lengths(const char* op, const kernels::AttentionShape& s, std::span<const std::int64_t> v) {
  if (v.empty()) return nullptr;
  if (static_cast<std::int64_t>(v.size()) != s.batch) {
    throw RuntimeError(fmt::format("{}: kv_valid has {} lengths for a batch of {} sequences; give one per sequence",
                                   op, v.size(), s.batch));
  }
  for (std::size_t b = 0; b < v.size(); ++b) {
    if (v[b] < 0 || v[b] > s.seq_k) {
      throw RuntimeError(fmt::format("{}: kv_valid[{}] = {} is outside 0..{} (the sequence length)", op, b, v[b],
                                     s.seq_k));
    }
  }
  return v.data();
}
// The q, k and v operands of a fused QKV tensor t (or of its gradient), as fused_views lays them out.
struct FusedOperands {
  AttentionRequest::Operand q, k, v;
};
FusedOperands fused_operands(const kernels::AttentionShape& s, const Tensor& t) {
  const std::int64_t g = s.heads / s.kv_heads, d = s.head_dim, gs = (g + 2) * d;
  return {{&t, 0, gs}, {&t, g * d, gs}, {&t, (g + 1) * d, gs}};
}

// What both directions of attention_qkv check: the shape, the lengths, qkv, out and stats (`out_is` and
// `stats_are` say what they must be in the message). Returns the lengths (null: no padding).
const std::int64_t* check_fused(const char* op, const kernels::AttentionShape& s, const Tensor& qkv, const Tensor& out,
                                const Tensor& stats, std::span<const std::int64_t> kv_valid, const char* out_is,
                                const char* stats_are) {
  validate_self_attention(s, op);
  const std::int64_t* lengths = valid_lengths(op, s, kv_valid);
  const std::int64_t tokens = s.batch * s.seq_q, width = s.kv_heads * (s.heads / s.kv_heads + 2) * s.head_dim;
  check_operand(qkv, op, "qkv", tokens, width, "batch x seq, kv_heads x (heads / kv_heads + 2) x head_dim");
  check_operand(out, op, "out", tokens, s.heads * s.head_dim, out_is);
  check_stats(stats, op, "stats", tokens * 2 * s.heads, stats_are);
  return lengths;
}
}  // namespace

void attention_qkv(const kernels::AttentionShape& s, const Tensor& qkv, const Tensor& out, const Tensor& stats,
                   std::span<const std::int64_t> kv_valid) {
  const char* op = "attention_qkv";
  const std::int64_t* lengths =
      check_fused(op, s, qkv, out, stats, kv_valid, "batch x seq, heads x head_dim", "2 per token and head");
  same_device(op, {&qkv, &out, &stats});
  const FusedOperands in = fused_operands(s, qkv);
  if (backend_ran(out, "attention", [&] { return backend_attention_forward(s, in.q, in.k, in.v, out, stats, kv_valid); })) {
    return;
  }
  if (values(out)) {
    const Rows rx = rows_of(qkv, true), ro = rows_of(out, false);
    const FusedQkv f = fused_views(s, rx.data(), qkv.dtype(), rx.stride());
    std::vector<float> st(static_cast<std::size_t>(stats.numel()));
    kernels::attention_forward(s, f.q, f.k, f.v, ro.out(), st.data(), lengths);
    ro.store();
    stats.copy_from_host_f32(st.data(), stats.numel());
  }
  const std::uint64_t tiles = static_cast<std::uint64_t>((s.seq_q + 127) / 128);
  const std::uint64_t kv_bytes = qkv.nbytes() / static_cast<std::uint64_t>(s.heads / s.kv_heads + 2) * 2;
  account_attention(out, "attention", s, 2.0 * static_cast<double>(s.head_dim), 5.0,
                    qkv.nbytes() - kv_bytes + tiles * kv_bytes, out.nbytes() + stats.nbytes());
}

void attention_qkv_backward(const kernels::AttentionShape& s, const Tensor& qkv, const Tensor& out,
                            const Tensor& stats, const Tensor& dout, const Tensor& dqkv,
                            std::span<const std::int64_t> kv_valid) {
  const char* op = "attention_qkv_backward";
  const std::int64_t* lengths =
      check_fused(op, s, qkv, out, stats, kv_valid, "the forward's output", "the forward's statistics");
  const std::int64_t tokens = s.batch * s.seq_q, width = s.kv_heads * (s.heads / s.kv_heads + 2) * s.head_dim;
  check_operand(dout, op, "dout", tokens, s.heads * s.head_dim, "out's gradient");
  check_operand(dqkv, op, "dqkv", tokens, width, "qkv's gradient");
  same_device(op, {&qkv, &out, &stats, &dout, &dqkv});
  const FusedOperands in = fused_operands(s, qkv), grad = fused_operands(s, dqkv);
  if (backend_ran(dqkv, "attention backward", [&] {
        return backend_attention_backward(s, in.q, in.k, in.v, {&out, 0, 0}, stats, {&dout, 0, 0}, grad.q, grad.k,
                                          grad.v, kv_valid);
      })) {
    return;
  }
  if (values(dqkv)) {
    const Rows rx = rows_of(qkv, true), ro = rows_of(out, true), rdo = rows_of(dout, true), rd = rows_of(dqkv, false);
    const FusedQkv f = fused_views(s, rx.data(), qkv.dtype(), rx.stride());
    const FusedQkv g = fused_views(s, rd.data(), dqkv.dtype(), rd.stride());
    const std::vector<float> st = f32_of(stats);
    auto mut = [](kernels::AttentionBuffer b) {
      return kernels::MutableAttentionBuffer{const_cast<void*>(b.data), b.dtype, b.row_stride, b.group_stride};
    };
    kernels::attention_backward(s, f.q, f.k, f.v, ro.in(), st.data(), rdo.in(), mut(g.q), mut(g.k), mut(g.v),
                                lengths);
    rd.store();
  }
  const std::uint64_t tiles = static_cast<std::uint64_t>((s.seq_k + 127) / 128);
  account_attention(dqkv, "attention backward", s, 5.0 * static_cast<double>(s.head_dim), 6.0,
                    qkv.nbytes() + tiles * (out.nbytes() + dout.nbytes() + stats.nbytes()), dqkv.nbytes());
}

void rotary_qkv(const kernels::AttentionShape& s, const Tensor& qkv, double base, bool inverse) {
  const char* op = inverse ? "rotary_qkv backward" : "rotary_qkv";
  validate_self_attention(s, op);
  const std::int64_t tokens = s.batch * s.seq_q, g = s.heads / s.kv_heads, d = s.head_dim,
                     width = s.kv_heads * (g + 2) * d;
  check_operand(qkv, op, "qkv", tokens, width, "batch x seq, kv_heads x (heads / kv_heads + 2) x head_dim");
  try {
    kernels::rotary_table(1, d, base);  // checks head_dim and base (the table itself: where values are computed)
  } catch (const std::invalid_argument& e) {
    throw RuntimeError(fmt::format("{}: {}", op, e.what()));
  }
  if (values(qkv) && !on_backend(op, {.kind = RK::rotary, .x = &qkv, .out = &qkv, .shape = s, .rotary_base = base,
                                       .inverse = inverse})) {
    const kernels::RotaryTable table = kernels::rotary_table(s.seq_q, d, base);
    const Rows r = rows_of(qkv, true);
    auto* base_ptr = static_cast<std::uint8_t*>(r.data());
    const std::size_t es = dtype_size(qkv.dtype());
    const kernels::MutableAttentionBuffer q{base_ptr, qkv.dtype(), r.stride(), (g + 2) * d},
        k{base_ptr + static_cast<std::size_t>(g * d) * es, qkv.dtype(), r.stride(), (g + 2) * d};
    kernels::rotary_apply(s, q, s.heads, g, table, inverse);
    kernels::rotary_apply(s, k, s.kv_heads, 1, table, inverse);
    r.store();
  }
  const double elems = static_cast<double>(tokens * (s.heads + s.kv_heads) * d);
  const std::uint64_t bytes = static_cast<std::uint64_t>(elems) * dtype_size(qkv.dtype());
  OpCost c{OpCost::Kind::elementwise, op, 0, 0, 0, qkv.dtype(), bytes, bytes, 3 * elems, true};
  account(qkv, c);
}

namespace {
void check_norm(const char* op, const Tensor& x, std::initializer_list<std::pair<const Tensor*, const char*>> same,
                std::initializer_list<std::pair<const Tensor*, const char*>> vectors,
                std::initializer_list<std::pair<const Tensor*, const char*>> stats) {
  if (x.dim() != 2) throw RuntimeError(fmt::format("{}: x must be 2-D [rows, n], got {}", op, x.describe()));
  const std::int64_t rows = x.shape()[0], n = x.shape()[1];
  check_operand(x, op, "x", rows, n, "rows, n");
  for (auto [t, what] : same) check_operand(*t, op, what, rows, n, "x's shape");
  for (auto [t, what] : vectors) check_vector(*t, op, what, n);
  for (auto [t, what] : stats) check_stats(*t, op, what, rows, "one per row of x");
  for (auto [t, what] : same) same_rank(x, *t, op);
  for (auto [t, what] : vectors) same_rank(x, *t, op);
  for (auto [t, what] : stats) same_rank(x, *t, op);
}

void account_norm(const Tensor& out, const char* name, double flops_per, std::uint64_t rd, std::uint64_t wr) {
  OpCost c{OpCost::Kind::elementwise, name, 0, 0, 0, out.dtype(), rd, wr, flops_per * static_cast<double>(out.numel()),
           true};
  account(out, c);
}
}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& rstd, float eps) {
  const char* op = "rms_norm";
  check_norm(op, x, {{&y, "y"}}, {{&weight, "weight"}}, {{&rstd, "rstd"}});
  if (values(y) && !on_backend(op, {.kind = RK::rms_norm, .x = &x, .w = &weight, .out = &y, .rstd = &rstd, .eps = eps})) {
    const Rows rx = rows_of(x, true), rw = rows_of(weight, true), ry = rows_of(y, false);
    std::vector<float> rs(static_cast<std::size_t>(x.shape()[0]));
    kernels::rms_norm_forward(rx.norm(), rw.norm(), ry.mnorm(), rs.data(), x.shape()[0], x.shape()[1], eps);
    ry.store();
    rstd.copy_from_host_f32(rs.data(), rstd.numel());
  }
  account_norm(y, op, 4, x.nbytes() + weight.nbytes(), y.nbytes() + rstd.nbytes());
}

void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight) {
  const char* op = "rms_norm_backward";
  check_norm(op, x, {{&dy, "dy"}, {&dx, "dx"}}, {{&weight, "weight"}, {&dweight, "dweight"}}, {{&rstd, "rstd"}});
  if (values(dx) && !on_backend(op, {.kind = RK::rms_norm_backward, .x = &x, .w = &weight, .dy = &dy, .out = &dx,
                                     .dw = &dweight, .rstd = &rstd})) {
    const Rows rx = rows_of(x, true), rw = rows_of(weight, true), rdy = rows_of(dy, true), rdx = rows_of(dx, false),
               rdw = rows_of(dweight, false);
    const std::vector<float> rs = f32_of(rstd);
    kernels::rms_norm_backward(rx.norm(), rw.norm(), rdy.norm(), rs.data(), rdx.mnorm(), rdw.mnorm(), x.shape()[0],
                               x.shape()[1]);
    rdx.store();
    rdw.store();
  }
  account_norm(dx, op, 8, x.nbytes() + dy.nbytes() + weight.nbytes() + rstd.nbytes(), dx.nbytes() + dweight.nbytes());
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
                const Tensor& rstd, float eps) {
  const char* op = "layer_norm";
  check_norm(op, x, {{&y, "y"}}, {{&weight, "weight"}, {&bias, "bias"}}, {{&mean, "mean"}, {&rstd, "rstd"}});
  if (values(y) && !on_backend(op, {.kind = RK::layer_norm, .x = &x, .w = &weight, .b = &bias, .out = &y, .mean = &mean,
                                    .rstd = &rstd, .eps = eps})) {
    const Rows rx = rows_of(x, true), rw = rows_of(weight, true), rb = rows_of(bias, true), ry = rows_of(y, false);
    std::vector<float> mu(static_cast<std::size_t>(x.shape()[0])), rs(mu.size());
    kernels::layer_norm_forward(rx.norm(), rw.norm(), rb.norm(), ry.mnorm(), mu.data(), rs.data(), x.shape()[0],
                                x.shape()[1], eps);
    ry.store();
    mean.copy_from_host_f32(mu.data(), mean.numel());
    rstd.copy_from_host_f32(rs.data(), rstd.numel());
  }
  account_norm(y, op, 6, x.nbytes() + weight.nbytes() + bias.nbytes(), y.nbytes() + mean.nbytes() + rstd.nbytes());
}

void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const char* op = "layer_norm_backward";
  check_norm(op, x, {{&dy, "dy"}, {&dx, "dx"}}, {{&weight, "weight"}, {&dweight, "dweight"}, {&dbias, "dbias"}},
             {{&mean, "mean"}, {&rstd, "rstd"}});
  if (values(dx) && !on_backend(op, {.kind = RK::layer_norm_backward, .x = &x, .w = &weight, .dy = &dy, .out = &dx,
                                     .dw = &dweight, .db = &dbias, .mean = &mean, .rstd = &rstd})) {
    const Rows rx = rows_of(x, true), rw = rows_of(weight, true), rdy = rows_of(dy, true), rdx = rows_of(dx, false),
               rdw = rows_of(dweight, false), rdb = rows_of(dbias, false);
    const std::vector<float> mu = f32_of(mean), rs = f32_of(rstd);
    kernels::layer_norm_backward(rx.norm(), rw.norm(), rdy.norm(), mu.data(), rs.data(), rdx.mnorm(), rdw.mnorm(),
                                 rdb.mnorm(), x.shape()[0], x.shape()[1]);
    rdx.store();
    rdw.store();
    rdb.store();
  }
  account_norm(dx, op, 10, x.nbytes() + dy.nbytes() + weight.nbytes() + mean.nbytes() + rstd.nbytes(),
               dx.nbytes() + dweight.nbytes() + dbias.nbytes());
}

// ---- the vocabulary ------------------------------------------------------------------------------

namespace {
void check_ids(const char* op, const char* what, std::span<const std::int64_t> ids, std::int64_t tokens) {
  if (static_cast<std::int64_t>(ids.size()) != tokens) {
    throw RuntimeError(fmt::format("{}: {} has {} ids for {} token rows; give one per row", op, what, ids.size(), tokens));
  }
}
void check_rows2d(const Tensor& t, const char* op, const char* what) {
  if (t.dim() != 2) throw RuntimeError(fmt::format("{}: {} must be 2-D, got {}", op, what, t.describe()));
  check_operand(t, op, what, t.shape()[0], t.shape()[1], "rows, columns");
}
}  // namespace

void embedding(const Tensor& weight, std::int64_t vocab_start, std::span<const std::int64_t> ids, const Tensor& out) {
  const char* op = "embedding";
  check_rows2d(weight, op, "weight");
  const std::int64_t tokens = static_cast<std::int64_t>(ids.size()), hidden = weight.shape()[1];
  check_operand(out, op, "out", tokens, hidden, "one row per id, hidden");
  same_device(op, {&weight, &out});
  if (values(out) &&
      !on_backend(op, {.kind = RK::embedding, .x = &weight, .out = &out, .ids = ids, .vocab_start = vocab_start})) {
    const Rows rw = rows_of(weight, true), ro = rows_of(out, false);
    kernels::embedding_forward(rw.norm(), weight.shape()[0], vocab_start, ids.data(), tokens, hidden, ro.mnorm());
    ro.store();
  }
  OpCost c{OpCost::Kind::copy, op, 0, 0, 0, out.dtype(), out.nbytes(), out.nbytes(), 0, true};
  account(out, c);
}

void embedding_backward(const Tensor& dy, std::span<const std::int64_t> ids, std::int64_t vocab_start,
                        const Tensor& dweight) {
  const char* op = "embedding_backward";
  check_rows2d(dweight, op, "dweight");
  const std::int64_t tokens = static_cast<std::int64_t>(ids.size()), hidden = dweight.shape()[1];
  check_operand(dy, op, "dy", tokens, hidden, "one row per id, hidden");
  same_device(op, {&dy, &dweight});
  if (values(dweight) && !on_backend(op, {.kind = RK::embedding_backward, .dy = &dy, .out = &dweight, .ids = ids,
                                          .vocab_start = vocab_start})) {
    const Rows rd = rows_of(dy, true), rw = rows_of(dweight, false);
    kernels::embedding_backward(rd.norm(), ids.data(), tokens, hidden, dweight.shape()[0], vocab_start, rw.mnorm());
    rw.store();
  }
  OpCost c{OpCost::Kind::elementwise, op, 0, 0, 0, dy.dtype(), dy.nbytes(), dweight.nbytes(),
           static_cast<double>(dy.numel()), true};
  account(dweight, c);
}

void cross_entropy_max(const Tensor& logits, const Tensor& max) {
  const char* op = "cross_entropy_max";
  check_rows2d(logits, op, "logits");
  check_stats(max, op, "max", logits.shape()[0], "one per row of the logits");
  same_device(op, {&logits, &max});
  if (values(max) && !on_backend(op, {.kind = RK::cross_entropy_max, .x = &logits, .out = &max})) {
    const Rows rl = rows_of(logits, true);
    std::vector<float> m(static_cast<std::size_t>(logits.shape()[0]));
    kernels::cross_entropy_max(rl.norm(), logits.shape()[0], logits.shape()[1], m.data());
    max.copy_from_host_f32(m.data(), max.numel());
  }
  OpCost c{OpCost::Kind::reduce, op, 0, 0, 0, logits.dtype(), logits.nbytes(), max.nbytes(),
           static_cast<double>(logits.numel()), true};
  account(max, c);
}

void cross_entropy_partials(const Tensor& logits, const Tensor& max, std::span<const std::int64_t> targets,
                            std::int64_t vocab_start, const Tensor& partials) {
  const char* op = "cross_entropy_partials";
  check_rows2d(logits, op, "logits");
  const std::int64_t tokens = logits.shape()[0];
  check_ids(op, "targets", targets, tokens);
  check_stats(max, op, "max", tokens, "one per row of the logits");
  check_stats(partials, op, "partials", 2 * tokens, "two per row of the logits");
  same_device(op, {&logits, &max, &partials});
  if (values(partials) && !on_backend(op, {.kind = RK::cross_entropy_partials, .x = &logits, .out = &partials,
                                           .max = &max, .ids = targets, .vocab_start = vocab_start})) {
    const Rows rl = rows_of(logits, true);
    const std::vector<float> m = f32_of(max);
    std::vector<float> p(static_cast<std::size_t>(2 * tokens));
    kernels::cross_entropy_partials(rl.norm(), tokens, logits.shape()[1], m.data(), targets.data(), vocab_start,
                                    p.data());
    partials.copy_from_host_f32(p.data(), partials.numel());
  }
  OpCost c{OpCost::Kind::reduce, op, 0, 0, 0, logits.dtype(), logits.nbytes(), partials.nbytes(),
           22 * static_cast<double>(logits.numel()), true};
  account(partials, c);
}

void cross_entropy_loss(const Tensor& partials, const Tensor& max, const Tensor& loss) {
  const char* op = "cross_entropy_loss";
  const std::int64_t tokens = max.numel();
  check_stats(max, op, "max", tokens, "one per token");
  check_stats(partials, op, "partials", 2 * tokens, "two per token");
  check_stats(loss, op, "loss", tokens, "one per token");
  same_device(op, {&partials, &max, &loss});
  if (values(loss) &&
      !on_backend(op, {.kind = RK::cross_entropy_loss, .out = &loss, .max = &max, .partials = &partials})) {
    const std::vector<float> p = f32_of(partials), m = f32_of(max);
    std::vector<float> l(static_cast<std::size_t>(tokens));
    for (std::size_t t = 0; t < l.size(); ++t) l[t] = kernels::cross_entropy_loss(p[2 * t], m[t], p[2 * t + 1]);
    loss.copy_from_host_f32(l.data(), loss.numel());
  }
  OpCost c{OpCost::Kind::elementwise, op, 0, 0, 0, DType::f32, partials.nbytes() + max.nbytes(), loss.nbytes(),
           30 * static_cast<double>(tokens), true};
  account(loss, c);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& max, const Tensor& partials,
                            std::span<const std::int64_t> targets, std::int64_t vocab_start, const Tensor& dloss,
                            const Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  check_rows2d(logits, op, "logits");
  const std::int64_t tokens = logits.shape()[0];
  check_ids(op, "targets", targets, tokens);
  check_stats(max, op, "max", tokens, "one per row of the logits");
  check_stats(partials, op, "partials", 2 * tokens, "two per row of the logits");
  check_stats(dloss, op, "dloss", tokens, "one per row of the logits");
  check_operand(dlogits, op, "dlogits", tokens, logits.shape()[1], "the logits' shape");
  same_device(op, {&logits, &max, &partials, &dloss, &dlogits});
  if (values(dlogits) && !on_backend(op, {.kind = RK::cross_entropy_backward, .x = &logits, .dy = &dloss,
                                          .out = &dlogits, .max = &max, .partials = &partials, .ids = targets,
                                          .vocab_start = vocab_start})) {
    const Rows rl = rows_of(logits, true), rd = rows_of(dlogits, false);
    const std::vector<float> m = f32_of(max), p = f32_of(partials), dl = f32_of(dloss);
    kernels::cross_entropy_backward(rl.norm(), tokens, logits.shape()[1], m.data(), p.data(), targets.data(),
                                    vocab_start, dl.data(), rd.mnorm());
    rd.store();
  }
  OpCost c{OpCost::Kind::elementwise, op, 0, 0, 0, logits.dtype(), logits.nbytes(), dlogits.nbytes(),
           23 * static_cast<double>(logits.numel()), true};
  account(dlogits, c);
}

// ---- SwiGLU ---------------------------------------------------------------------------------------

namespace {
void check_swiglu(const char* op, const Tensor& x, const Tensor& y, const char* what) {
  if (x.dim() != 2 || x.shape()[1] % 2 != 0) {
    throw RuntimeError(fmt::format("{}: x {} must be 2-D [rows, 2 x f] (gate and up interleaved)", op, x.describe()));
  }
  check_operand(x, op, "x", x.shape()[0], x.shape()[1], "rows, 2 x f");
  check_operand(y, op, what, x.shape()[0], x.shape()[1] / 2, "rows, f: half of x's columns");
  same_rank(x, y, op);
}
}  // namespace

void swiglu(const Tensor& x, const Tensor& y) {
  const char* op = "swiglu";
  check_swiglu(op, x, y, "y");
  if (values(y) && !on_backend(op, {.kind = RK::swiglu, .x = &x, .out = &y})) {
    const Rows rx = rows_of(x, true), ry = rows_of(y, false);
    const std::int64_t rows = x.shape()[0], f = y.shape()[1];
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < f; ++i) {
        const float g = load_f32(rx.data(), x.dtype(), r * rx.stride() + 2 * i);
        const float u = load_f32(rx.data(), x.dtype(), r * rx.stride() + 2 * i + 1);
        store_f32(ry.data(), y.dtype(), r * ry.stride() + i, kernels::swiglu(g, u));
      }
    ry.store();
  }
  OpCost c{OpCost::Kind::elementwise, op, 0, 0, 0, y.dtype(), x.nbytes(), y.nbytes(), 25 * static_cast<double>(y.numel()),
           true};
  account(y, c);
}

void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const char* op = "swiglu_backward";
  check_swiglu(op, x, dy, "dy");
  check_operand(dx, op, "dx", x.shape()[0], x.shape()[1], "x's shape");
  same_rank(x, dx, op);
  if (values(dx) && !on_backend(op, {.kind = RK::swiglu_backward, .x = &x, .dy = &dy, .out = &dx})) {
    const Rows rx = rows_of(x, true), rd = rows_of(dy, true), ro = rows_of(dx, false);
    const std::int64_t rows = x.shape()[0], f = dy.shape()[1];
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < f; ++i) {
        const float g = load_f32(rx.data(), x.dtype(), r * rx.stride() + 2 * i);
        const float u = load_f32(rx.data(), x.dtype(), r * rx.stride() + 2 * i + 1);
        const kernels::SwigluGrad d = kernels::swiglu_backward(g, u, load_f32(rd.data(), dy.dtype(), r * rd.stride() + i));
        store_f32(ro.data(), dx.dtype(), r * ro.stride() + 2 * i, d.dg);
        store_f32(ro.data(), dx.dtype(), r * ro.stride() + 2 * i + 1, d.du);
      }
    ro.store();
  }
  OpCost c{OpCost::Kind::elementwise, op, 0, 0, 0, dx.dtype(), x.nbytes() + dy.nbytes(), dx.nbytes(),
           35 * static_cast<double>(dy.numel()), true};
  account(dx, c);
}

}  // namespace cubesim::rt
