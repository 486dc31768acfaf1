// Python bindings of kernels/ (dtype conversions, det_gemm and its backward helpers, on numpy
// arrays) and tp/ (parallel_state, Column/RowParallelLinear, ParallelMLP, the equivalence check,
// and run_mlp, one forward and backward step for timing).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "runtime/algorithms/table.h"
#include "kernels/abft.h"
#include "kernels/det_gemm.h"
#include "kernels/elementwise.h"
#include "tp/equivalence.h"
#include "tp/gpt_step.h"
#include "tp/layers.h"
#include "tp/mlp_step.h"
#include "tp/parallel_state.h"

namespace py = pybind11;
using namespace cubesim;
using namespace cubesim::pyb;

namespace {

using CtxPtr = std::shared_ptr<rt::Context>;

// ---- kernels ------------------------------------------------------------------------------------

// A numpy operand as a kernel view: used in place when its dtype already is the kernel's (float32
// for f32, float16 for f16, uint16/uint32 bit patterns), else converted into an owned buffer.
struct Operand {
  py::array keep;
  std::vector<std::uint8_t> owned;
  DType dtype = DType::f32;
  std::int64_t rows = 0, cols = 0, rs = 0, cs = 0;
  const void* data = nullptr;

  kernels::MatrixView matrix() const { return {data, dtype, rows, cols, rs, cs}; }
  kernels::VectorView vector() const { return {data, dtype, cols, cs}; }
};

Operand operand(const py::handle& h, std::optional<DType> want, int ndim, const char* what) {
  py::array a = py::array::ensure(h);
  if (!a) throw py::type_error(fmt::format("det_gemm: {} is not array-like", what));
  if (a.ndim() != ndim) {
    std::vector<py::ssize_t> sh(a.shape(), a.shape() + a.ndim());
    throw py::value_error(fmt::format("det_gemm: {} must be {}-D, got shape ({})", what, ndim, fmt::join(sh, ", ")));
  }
  Operand o;
  o.rows = ndim == 2 ? a.shape(0) : 1;
  o.cols = a.shape(ndim - 1);
  const char kind = a.dtype().kind();
  const auto size = a.itemsize();
  std::optional<DType> native;
  if (kind == 'f' && size == 4 && (!want || *want == DType::f32)) native = DType::f32;
  else if (kind == 'f' && size == 2 && (!want || *want == DType::f16)) native = DType::f16;
  else if (kind == 'u' && size == 2 && want && *want != DType::f32) native = *want;
  else if (kind == 'u' && size == 4 && want && *want == DType::f32) native = DType::f32;
  else if (kind == 'u' && size == 2 && !want) {
    throw py::value_error(fmt::format("det_gemm: {} is a uint16 array (bf16 or f16 bit patterns): say which with "
                                      "dtype='bf16' or dtype='f16'",
                                      what));
  }
  bool in_place = native.has_value();
  std::int64_t rs = 0, cs = 0;
  if (in_place) {
    const auto s0 = ndim == 2 ? a.strides(0) : 0;
    const auto s1 = a.strides(ndim - 1);
    in_place = s0 % size == 0 && s1 % size == 0;
    rs = s0 / size;
    cs = s1 / size;
  }
  if (in_place) {
    o.keep = a;
    o.dtype = *native;
    o.data = a.data();
    o.rs = rs;
    o.cs = cs;
  } else {
    o.dtype = want.value_or(DType::f32);
    o.owned = array_to_bytes(a, o.dtype, what);
    o.data = o.owned.data();
    o.rs = o.cols;
    o.cs = 1;
  }
  return o;
}

std::optional<DType> opt_dtype(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  return dtype_arg(*s);
}

kernels::GemmOptions gemm_opts(int threads) {
  if (threads < 1) throw py::value_error(fmt::format("det_gemm: threads must be >= 1, got {}", threads));
  kernels::GemmOptions o;
  o.threads = threads;
  return o;
}

py::array det_gemm_py(const py::handle& a, const py::handle& b, const py::object& bias, const std::optional<std::string>& dtype,
                      const std::string& out_dtype, int threads, bool reference, bool bits) {
  const auto want = opt_dtype(dtype);
  Operand A = operand(a, want, 2, "a"), B = operand(b, want, 2, "b");
  std::optional<Operand> bias_op;
  if (!bias.is_none()) bias_op = operand(bias, std::nullopt, 1, "bias");
  const DType od = dtype_arg(out_dtype);
  const auto opts = gemm_opts(threads);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(A.rows * B.cols) * dtype_size(od));
  {
    ReleaseGil nogil;
    const auto C = kernels::MutableMatrixView::row_major(out.data(), od, A.rows, B.cols);
    kernels::VectorView bv;
    if (bias_op) bv = bias_op->vector();
    if (reference) kernels::det_gemm_reference(A.matrix(), B.matrix(), bias_op ? &bv : nullptr, C);
    else kernels::det_gemm(A.matrix(), B.matrix(), bias_op ? &bv : nullptr, C, opts);
  }
  return bytes_to_array(out, od, {A.rows, B.cols}, bits);
}

// Huang-Abraham checks of C against A and B (kernels/abft.h).
py::dict abft_check_py(const py::handle& a, const py::handle& b, const py::handle& c, const py::object& bias,
                       const std::optional<std::string>& dtype, const std::string& out_dtype, double z) {
  const auto want = opt_dtype(dtype);
  Operand A = operand(a, want, 2, "a"), B = operand(b, want, 2, "b");
  const DType od = dtype_arg(out_dtype);
  Operand C = operand(c, od, 2, "c");
  std::optional<Operand> bias_op;
  if (!bias.is_none()) bias_op = operand(bias, std::nullopt, 1, "bias");
  kernels::AbftResult r;
  {
    ReleaseGil nogil;
    kernels::VectorView bv;
    if (bias_op) bv = bias_op->vector();
    const auto enc = kernels::abft_encode(A.matrix(), B.matrix(), bias_op ? &bv : nullptr, od, {.z = z});
    r = kernels::abft_verify(enc, C.matrix());
  }
  py::dict d;
  d["ok"] = r.ok;
  d["bad_rows"] = r.bad_rows;
  d["bad_cols"] = r.bad_cols;
  d["located"] = r.located;
  d["worst_ratio"] = r.worst_ratio;
  return d;
}

// ---- tp -----------------------------------------------------------------------------------------

struct PyColumn {
  CtxPtr ctx;
  std::shared_ptr<tp::ColumnParallelLinear> l;
};
struct PyRow {
  CtxPtr ctx;
  std::shared_ptr<tp::RowParallelLinear> l;
};
struct PyMlp {
  CtxPtr ctx;
  std::shared_ptr<tp::ParallelMLP> mlp;
};

py::object tensor_or_none(const CtxPtr& ctx, const rt::Tensor& t) {
  if (!t.defined()) return py::none();
  return py::cast(PyTensor{t, ctx});
}

py::tuple linear_output(const CtxPtr& ctx, const tp::LinearOutput& o) {
  return py::make_tuple(PyTensor{o.output, ctx}, tensor_or_none(ctx, o.bias));
}

tp::LinearOptions linear_opts(bool bias, bool gather_output, bool input_is_parallel, bool skip_bias_add,
                              bool sequence_parallel, const std::string& dtype, std::uint64_t seed,
                              std::uint64_t layer_id, float init_std) {
  tp::LinearOptions o;
  o.bias = bias;
  o.gather_output = gather_output;
  o.input_is_parallel = input_is_parallel;
  o.skip_bias_add = skip_bias_add;
  o.sequence_parallel = sequence_parallel;
  o.dtype = dtype_arg(dtype);
  o.seed = seed;
  o.layer_id = layer_id;
  o.init_std = init_std;
  return o;
}

tp::MlpOptions mlp_opts(std::int64_t hidden, std::int64_t ffn, const std::string& gelu, bool bias, bool sp,
                        const std::string& dtype, std::uint64_t seed) {
  tp::MlpOptions o;
  o.hidden = hidden;
  o.ffn = ffn;
  o.gelu = kernels::parse_gelu_kind(gelu);
  o.bias = bias;
  o.sequence_parallel = sp;
  o.dtype = dtype_arg(dtype);
  o.seed = seed;
  return o;
}

// The collectives a ParallelMLP step runs on its tp group (all_reduce; with sequence parallelism
// all_gather and reduce_scatter) checked against the context's algorithm before any rank runs, so
// halving_doubling on 3 ranks is a ValueError naming the algorithm, the rank count and the valid
// choices rather than a RankError after the run.
void check_mlp_algorithm(const rt::Context& ctx, int tpsize, bool sp, const char* who) {
  if (tpsize < 1) return;  // the job's own check names it
  const rt::algo::Row& row = rt::algo::row(ctx.options().algorithm);
  std::vector<rt::algo::Collective> used{rt::algo::Collective::all_reduce};
  if (sp) used = {rt::algo::Collective::all_gather, rt::algo::Collective::reduce_scatter};
  for (rt::algo::Collective k : used) {
    const std::string call = fmt::format("{} (tp {}{})", who, tpsize, sp ? ", sequence parallel" : "");
    if (!row.supports(k)) {
      throw rt::RuntimeError(fmt::format("{}: algorithm '{}' does no {}; valid: {}", call, row.name,
                                         rt::collective_kind_name(k), rt::algo::supported_names(k)));
    }
    rt::algo::require_group_size(row, k, tpsize, call);
  }
}

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();

struct PyEquivalence {
  std::vector<tp::TensorCheck> checks;
  bool passed = false;
  rt::RunReport run;
  double mean_loss = 0;
};

// The MLP arguments both jobs take, range-checked (a ValueError naming the argument).
struct MlpArgs {
  std::uint64_t seed, data_seed;
  int tp;
  std::int64_t tokens, hidden, ffn;
};

MlpArgs mlp_args(const py::object& tp_arg, const py::object& tokens_arg, const py::object& hidden_arg,
                 const py::object& ffn_arg, const py::object& seed_arg, const py::object& data_seed_arg) {
  return MlpArgs{.seed = u64_arg(seed_arg, "seed"),
                 .data_seed = u64_arg(data_seed_arg, "data_seed"),
                 .tp = static_cast<int>(int_arg(tp_arg, "tp", 1, kIntMax)),
                 .tokens = int_arg(tokens_arg, "tokens", 1, kI64Max),
                 .hidden = int_arg(hidden_arg, "hidden", 1, kI64Max),
                 .ffn = int_arg(ffn_arg, "ffn", 1, kI64Max)};
}

PyEquivalence check_equivalence(const CtxPtr& ctx, const py::object& tp_arg, const py::object& tokens_arg,
                                const py::object& hidden_arg, const py::object& ffn_arg, const std::string& dtype,
                                const std::string& gelu, bool bias, bool sp, const py::object& seed_arg,
                                const py::object& data_seed_arg) {
  const MlpArgs a = mlp_args(tp_arg, tokens_arg, hidden_arg, ffn_arg, seed_arg, data_seed_arg);
  check_mlp_algorithm(*ctx, a.tp, sp, "check_mlp_equivalence");
  tp::MlpCheckOptions o;
  o.mlp = mlp_opts(a.hidden, a.ffn, gelu, bias, sp, dtype, a.seed);
  o.tokens = a.tokens;
  o.tp = a.tp;
  o.data_seed = a.data_seed;
  tp::EquivalenceReport rep;
  {
    ReleaseGil nogil;
    rep = tp::check_mlp_equivalence(*ctx, o);
  }
  return PyEquivalence{rep.checks, rep.pass, rep.run};
}

rt::RunReport run_mlp(const CtxPtr& ctx, const py::object& tp_arg, const py::object& tokens_arg,
                      const py::object& hidden_arg, const py::object& ffn_arg, const std::string& dtype,
                      const std::string& gelu, bool bias, bool sp, const py::object& seed_arg,
                      const py::object& data_seed_arg) {
  const MlpArgs a = mlp_args(tp_arg, tokens_arg, hidden_arg, ffn_arg, seed_arg, data_seed_arg);
  check_mlp_algorithm(*ctx, a.tp, sp, "run_mlp");
  const tp::MlpStepOptions o{.mlp = mlp_opts(a.hidden, a.ffn, gelu, bias, sp, dtype, a.seed),
                             .tokens = a.tokens,
                             .tp = a.tp,
                             .data_seed = a.data_seed};
  rt::RunReport rep;
  {
    ReleaseGil nogil;
    rep = tp::run_mlp_step(*ctx, o).report;
  }
  return rep;
}

// The GPT model's arguments, range-checked (a ValueError naming the argument).
tp::GptOptions gpt_opts(const py::object& vocab, const py::object& hidden, const py::object& heads,
                        const py::object& kv_heads, const py::object& ffn, const py::object& seq, const py::object& layers,
                        const std::string& norm, const std::string& dtype, const std::string& gelu, bool swiglu,
                        bool rotary, bool bias, bool sp, bool tie, const py::object& seed) {
  tp::GptOptions o;
  o.vocab = int_arg(vocab, "vocab", 1, kI64Max);
  o.hidden = int_arg(hidden, "hidden", 1, kI64Max);
  o.heads = int_arg(heads, "heads", 1, kI64Max);
  o.kv_heads = kv_heads.is_none() ? 0 : int_arg(kv_heads, "kv_heads", 1, kI64Max);
  o.ffn = int_arg(ffn, "ffn", 1, kI64Max);
  o.seq = int_arg(seq, "seq", 1, kI64Max);
  o.layers = static_cast<int>(int_arg(layers, "layers", 1, 1 << 16));
  o.norm = tp::parse_norm_kind(norm);
  o.dtype = dtype_arg(dtype);
  o.gelu = kernels::parse_gelu_kind(gelu);
  o.swiglu = swiglu;
  o.rotary = rotary;
  o.bias = bias;
  o.sequence_parallel = sp;
  o.tie_embeddings = tie;
  o.seed = u64_arg(seed, "seed");
  return o;
}

// The GPT step's collectives on its tp group: all_reduce (the attention and MLP outputs without
// sequence parallelism, the loss's max and sums, the norms' gradients with it), all_gather and
// reduce_scatter with sequence parallelism.
void check_gpt_algorithm(const rt::Context& ctx, int tpsize, bool sp, const char* who) {
  if (tpsize < 1) return;
  check_mlp_algorithm(ctx, tpsize, false, who);
  if (sp) check_mlp_algorithm(ctx, tpsize, true, who);
}

// The GPT jobs' arguments, in the order of their keyword list (bind_kernels_tp's gpt_kwargs).
#define GPT_ARGS                                                                                                 \
  const py::object &tp_arg, const py::object &batch, const py::object &vocab, const py::object &hidden,          \
      const py::object &heads, const py::object &kv_heads, const py::object &ffn, const py::object &seq,         \
      const py::object &layers, const std::string &norm, const std::string &dtype, const std::string &gelu,      \
      bool swiglu, bool rotary, bool bias, bool sp, bool tie, const py::object &seed, const py::object &data_seed,  \
      const py::object &lengths
#define GPT_ARG_NAMES                                                                                           \
  tp_arg, batch, vocab, hidden, heads, kv_heads, ffn, seq, layers, norm, dtype, gelu, swiglu, rotary, bias, sp, tie, \
      seed, data_seed, lengths

tp::GptStepOptions gpt_step_args(const rt::Context& ctx, const char* who, GPT_ARGS) {
  tp::GptStepOptions o;
  o.model = gpt_opts(vocab, hidden, heads, kv_heads, ffn, seq, layers, norm, dtype, gelu, swiglu, rotary, bias, sp, tie,
                     seed);
  o.tp = static_cast<int>(int_arg(tp_arg, "tp", 1, kIntMax));
  o.batch = int_arg(batch, "batch", 1, kI64Max);
  o.data_seed = u64_arg(data_seed, "data_seed");
  if (!lengths.is_none()) {
    o.lengths = shape_arg(lengths, "lengths");
    if (o.lengths.empty()) throw py::value_error("lengths: give one length per sequence (real tokens), or None");
    try {
      tp::check_lengths(who, o.lengths, o.batch, o.model.seq);
    } catch (const rt::RuntimeError& e) {
      throw py::value_error(e.what());
    }
  }
  check_gpt_algorithm(ctx, o.tp, sp && o.tp > 1, who);
  return o;
}

struct PyGptStep {
  rt::RunReport run;
  double mean_loss = 0;
};

}  // namespace

void bind_kernels_tp(py::module_& m) {
  // ---- dtype conversions ----
  m.def("round_to",
        [](const std::string& dtype, const py::array& a) {
          const DType d = dtype_arg(dtype);
          const auto bytes = array_to_bytes(a, d, "round_to");
          return bytes_to_array(bytes, d, std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim()), false);
        },
        py::arg("dtype"), py::arg("array"),
        "float32 values rounded to dtype (nearest even, as CUDA) and widened back: what a dtype store keeps.");
  m.def("to_bits",
        [](const py::array& a, const std::string& dtype) {
          const DType d = dtype_arg(dtype);
          const auto bytes = array_to_bytes(a, d, "to_bits");
          return bytes_to_array(bytes, d, std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim()), true);
        },
        py::arg("array"), py::arg("dtype"),
        "The bit patterns of the values in dtype: uint16 for bf16/f16 (rounded to nearest even; NaN -> 0x7fff), "
        "uint32 for f32.");
  m.def("from_bits",
        [](const py::array& a, const std::string& dtype) {
          const DType d = dtype_arg(dtype);
          const auto bytes = array_to_bytes(a, d, "from_bits");
          return bytes_to_array(bytes, d, std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim()), false);
        },
        py::arg("bits"), py::arg("dtype"),
        "float32 values of bit patterns (uint16 for bf16/f16, uint32 for f32); the widening is exact.");

  // ---- det_gemm ----
  const char* operand_doc =
      "\n\nOperands are numpy arrays, strided views allowed (w.T costs no copy). dtype is the input dtype of a "
      "and b: float32 arrays are used in place as f32, float16 arrays as f16, uint16 arrays as bf16/f16 bit "
      "patterns (dtype required); other arrays, or a dtype that differs from the array's, are converted by "
      "value (rounded to nearest even). The result is rounded to out_dtype and returned as float32 values, or "
      "as bit patterns with bits=True. threads split M and N only, never K: the bits never depend on them. "
      "reference=True runs the scalar definition.";
  m.def("det_gemm", &det_gemm_py, py::arg("a"), py::arg("b"), py::arg("bias") = py::none(), py::kw_only(),
        py::arg("dtype") = py::none(), py::arg("out_dtype") = "f32", py::arg("threads") = 1,
        py::arg("reference") = false, py::arg("bits") = false,
        (std::string("C[M,N] = A[M,K] . B[K,N] (+ bias[N]) under the numerics contract: each element accumulates "
                     "fma over k ascending in f32 from +0, bias added after the sum, one rounding to out_dtype. A "
                     "row of C is bitwise the same whatever the other rows are.") +
         operand_doc)
            .c_str());
  m.def("det_gemm_backward_input",
        [](const py::handle& dc, const py::handle& b, const std::optional<std::string>& dtype, const std::string& out_dtype,
           int threads, bool reference, bool bits) {
          const auto want = opt_dtype(dtype);
          Operand DC = operand(dc, want, 2, "dc"), B = operand(b, want, 2, "b");
          const DType od = dtype_arg(out_dtype);
          const auto opts = gemm_opts(threads);
          std::vector<std::uint8_t> out(static_cast<std::size_t>(DC.rows * B.rows) * dtype_size(od));
          {
            ReleaseGil nogil;
            const auto dA = kernels::MutableMatrixView::row_major(out.data(), od, DC.rows, B.rows);
            if (reference) kernels::det_gemm_backward_input_reference(DC.matrix(), B.matrix(), dA);
            else kernels::det_gemm_backward_input(DC.matrix(), B.matrix(), dA, opts);
          }
          return bytes_to_array(out, od, {DC.rows, B.rows}, bits);
        },
        py::arg("dc"), py::arg("b"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("out_dtype") = "f32",
        py::arg("threads") = 1, py::arg("reference") = false, py::arg("bits") = false,
        (std::string("dA[M,K] = dC[M,N] . B^T, where b is the forward's [K,N] operand; each element sums over n "
                     "ascending.") +
         operand_doc)
            .c_str());
  m.def("det_gemm_backward_weight",
        [](const py::handle& a, const py::handle& dc, const std::optional<std::string>& dtype, const std::string& out_dtype,
           int threads, bool reference, bool bits) {
          const auto want = opt_dtype(dtype);
          Operand A = operand(a, want, 2, "a"), DC = operand(dc, want, 2, "dc");
          const DType od = dtype_arg(out_dtype);
          const auto opts = gemm_opts(threads);
          std::vector<std::uint8_t> out(static_cast<std::size_t>(A.cols * DC.cols) * dtype_size(od));
          {
            ReleaseGil nogil;
            const auto dB = kernels::MutableMatrixView::row_major(out.data(), od, A.cols, DC.cols);
            if (reference) kernels::det_gemm_backward_weight_reference(A.matrix(), DC.matrix(), dB);
            else kernels::det_gemm_backward_weight(A.matrix(), DC.matrix(), dB, opts);
          }
          return bytes_to_array(out, od, {A.cols, DC.cols}, bits);
        },
        py::arg("a"), py::arg("dc"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("out_dtype") = "f32",
        py::arg("threads") = 1, py::arg("reference") = false, py::arg("bits") = false,
        (std::string("dB[K,N] = A^T . dC, where a is the forward's [M,K] operand; each element sums over m "
                     "ascending.") +
         operand_doc)
            .c_str());
  m.def("det_gemm_bias_grad",
        [](const py::handle& dc, const std::optional<std::string>& dtype, const std::string& out_dtype, bool bits) {
          Operand DC = operand(dc, opt_dtype(dtype), 2, "dc");
          const DType od = dtype_arg(out_dtype);
          std::vector<std::uint8_t> out(static_cast<std::size_t>(DC.cols) * dtype_size(od));
          {
            ReleaseGil nogil;
            kernels::det_gemm_bias_grad(DC.matrix(), kernels::MutableVectorView::contiguous(out.data(), od, DC.cols));
          }
          return bytes_to_array(out, od, {DC.cols}, bits);
        },
        py::arg("dc"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("out_dtype") = "f32", py::arg("bits") = false,
        "dbias[N] = column sums of dC, m ascending from +0, rounded once to out_dtype.");
  m.def("abft_check", &abft_check_py, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("bias") = py::none(),
        py::kw_only(), py::arg("dtype") = py::none(), py::arg("out_dtype") = "f32", py::arg("z") = 10.0,
        (std::string("Algorithm-based fault tolerance for C = A . B (+ bias) (kernels/abft.h): Huang-Abraham row and "
                     "column checksums from A and B in f64, against C's row and column sums, each within z standard "
                     "deviations of the modelled rounding (f32 accumulation over K, C's dtype). Returns {ok, bad_rows, "
                     "bad_cols, located: [(row, col)], worst_ratio: the largest |residual| / threshold}. c is read in "
                     "out_dtype (uint16 arrays as bf16/f16 bits).") + operand_doc).c_str());
  m.def("cpu_has_avx2_fma", &kernels::cpu_has_avx2_fma, "Whether det_gemm's AVX2/FMA micro-kernel runs on this CPU.");

  // ---- tp ----
  auto t = m.def_submodule("tp",
                           "Megatron-style tensor parallelism: parallel_state, ColumnParallelLinear, "
                           "RowParallelLinear, ParallelMLP (inside Context.spawn), and whole-run helpers "
                           "(check_mlp_equivalence, run_mlp).");
  t.def("initialize_model_parallel", &tp::initialize_model_parallel, py::arg("tensor_model_parallel_size"),
        py::call_guard<ReleaseGil>(),
        "Call on every rank inside spawn: tensor-parallel groups are contiguous ranks; the rest is data parallel.");
  t.def("destroy_model_parallel", &tp::destroy_model_parallel);
  t.def("model_parallel_is_initialized", &tp::model_parallel_is_initialized);
  t.def("get_tensor_model_parallel_rank", &tp::get_tensor_model_parallel_rank);
  t.def("get_tensor_model_parallel_world_size", &tp::get_tensor_model_parallel_world_size);
  t.def("get_tensor_model_parallel_group", &tp::get_tensor_model_parallel_group, py::return_value_policy::reference);
  t.def("get_data_parallel_rank", &tp::get_data_parallel_rank);
  t.def("get_data_parallel_world_size", &tp::get_data_parallel_world_size);
  t.def("get_data_parallel_group", &tp::get_data_parallel_group, py::return_value_policy::reference);
  t.def("master_value", &tp::master_value, py::arg("seed"), py::arg("layer_id"), py::arg("i"), py::arg("j"),
        py::arg("cols"), py::arg("stddev"),
        "Element (i, j) of a layer's master weight [out, in] (j = -1: element i of its bias).");
  t.def("tp_tolerance", [](const std::string& d, int p) { return tp::tp_tolerance(dtype_arg(d), p); }, py::arg("dtype"),
        py::arg("tp"), "Relative-norm tolerance for results that sum tp partials, each rounded to dtype.");

  py::class_<PyColumn>(t, "ColumnParallelLinear",
                       "Y = X . W^T + b with W [out, in]; rank r holds rows [r*out/tp, (r+1)*out/tp) of W and b. "
                       "Make it inside a rank function. forward(x) returns (output, bias) where bias is a Tensor "
                       "only with skip_bias_add.")
      .def(py::init([](const CtxPtr& ctx, std::int64_t in, std::int64_t out, bool bias, bool gather_output,
                       bool skip_bias_add, bool sp, const std::string& dtype, const py::object& seed_arg,
                       const py::object& layer_arg,
                       float init_std) {
             const auto o = linear_opts(bias, gather_output, false, skip_bias_add, sp, dtype, u64_arg(seed_arg, "seed"),
                                        u64_arg(layer_arg, "layer_id"), init_std);
             ReleaseGil nogil;
             return PyColumn{ctx, std::make_shared<tp::ColumnParallelLinear>(*ctx, in, out, o)};
           }),
           py::arg("ctx"), py::arg("in_features"), py::arg("out_features"), py::kw_only(), py::arg("bias") = true,
           py::arg("gather_output") = false, py::arg("skip_bias_add") = false, py::arg("sequence_parallel") = false,
           py::arg("dtype") = "bf16", py::arg("seed") = 1234, py::arg("layer_id") = 0, py::arg("init_std") = 0.02f)
      .def("forward", [](PyColumn& c, const PyTensor& x) {
             tp::LinearOutput o;
             {
               ReleaseGil nogil;
               o = c.l->forward(x.t);
             }
             return linear_output(c.ctx, o);
           }, py::arg("x"))
      .def("backward", [](PyColumn& c, const PyTensor& dy) {
             rt::Tensor dx;
             {
               ReleaseGil nogil;
               dx = c.l->backward(dy.t);
             }
             return PyTensor{dx, c.ctx};
           }, py::arg("dy"), "Returns dX; sets weight_grad and bias_grad.")
      .def_property_readonly("in_features", [](const PyColumn& c) { return c.l->in_features; })
      .def_property_readonly("out_features", [](const PyColumn& c) { return c.l->out_features; })
      .def_property_readonly("out_per_rank", [](const PyColumn& c) { return c.l->out_per_rank; })
      .def_property_readonly("weight", [](const PyColumn& c) { return tensor_or_none(c.ctx, c.l->weight); })
      .def_property_readonly("bias", [](const PyColumn& c) { return tensor_or_none(c.ctx, c.l->bias); })
      .def_property_readonly("weight_grad", [](const PyColumn& c) { return tensor_or_none(c.ctx, c.l->weight_grad); })
      .def_property_readonly("bias_grad", [](const PyColumn& c) { return tensor_or_none(c.ctx, c.l->bias_grad); });

  py::class_<PyRow>(t, "RowParallelLinear",
                    "Y = X . W^T + b with W [out, in]; rank r holds columns [r*in/tp, (r+1)*in/tp) of W and the "
                    "whole b; the partial outputs are all-reduced (reduce-scattered with sequence_parallel). Make it "
                    "inside a rank function. forward(x) returns (output, bias).")
      .def(py::init([](const CtxPtr& ctx, std::int64_t in, std::int64_t out, bool bias, bool input_is_parallel,
                       bool skip_bias_add, bool sp, const std::string& dtype, const py::object& seed_arg,
                       const py::object& layer_arg,
                       float init_std) {
             const auto o = linear_opts(bias, false, input_is_parallel, skip_bias_add, sp, dtype,
                                        u64_arg(seed_arg, "seed"), u64_arg(layer_arg, "layer_id"), init_std);
             ReleaseGil nogil;
             return PyRow{ctx, std::make_shared<tp::RowParallelLinear>(*ctx, in, out, o)};
           }),
           py::arg("ctx"), py::arg("in_features"), py::arg("out_features"), py::kw_only(), py::arg("bias") = true,
           py::arg("input_is_parallel") = false, py::arg("skip_bias_add") = false, py::arg("sequence_parallel") = false,
           py::arg("dtype") = "bf16", py::arg("seed") = 1234, py::arg("layer_id") = 0, py::arg("init_std") = 0.02f)
      .def("forward", [](PyRow& r, const PyTensor& x) {
             tp::LinearOutput o;
             {
               ReleaseGil nogil;
               o = r.l->forward(x.t);
             }
             return linear_output(r.ctx, o);
           }, py::arg("x"))
      .def("backward", [](PyRow& r, const PyTensor& dy) {
             rt::Tensor dx;
             {
               ReleaseGil nogil;
               dx = r.l->backward(dy.t);
             }
             return PyTensor{dx, r.ctx};
           }, py::arg("dy"))
      .def_property_readonly("in_features", [](const PyRow& r) { return r.l->in_features; })
      .def_property_readonly("out_features", [](const PyRow& r) { return r.l->out_features; })
      .def_property_readonly("in_per_rank", [](const PyRow& r) { return r.l->in_per_rank; })
      .def_property_readonly("weight", [](const PyRow& r) { return tensor_or_none(r.ctx, r.l->weight); })
      .def_property_readonly("bias", [](const PyRow& r) { return tensor_or_none(r.ctx, r.l->bias); })
      .def_property_readonly("weight_grad", [](const PyRow& r) { return tensor_or_none(r.ctx, r.l->weight_grad); })
      .def_property_readonly("bias_grad", [](const PyRow& r) { return tensor_or_none(r.ctx, r.l->bias_grad); });

  py::class_<PyMlp>(t, "ParallelMLP",
                    "Megatron's MLP: ColumnParallelLinear(hidden -> ffn, skip_bias_add) -> bias + GELU -> "
                    "RowParallelLinear(ffn -> hidden, input_is_parallel). Make it inside a rank function after "
                    "initialize_model_parallel(tp). Weights are shards of one master weight (seed), the same "
                    "for every tp.")
      .def(py::init([](const CtxPtr& ctx, std::int64_t hidden, std::int64_t ffn, const std::string& gelu, bool bias,
                       bool sp, const std::string& dtype, std::uint64_t seed) {
             const auto o = mlp_opts(hidden, ffn, gelu, bias, sp, dtype, seed);
             ReleaseGil nogil;
             return PyMlp{ctx, std::make_shared<tp::ParallelMLP>(*ctx, o)};
           }),
           py::arg("ctx"), py::arg("hidden") = 1024, py::arg("ffn") = 4096, py::kw_only(), py::arg("gelu") = "tanh",
           py::arg("bias") = true, py::arg("sequence_parallel") = false, py::arg("dtype") = "bf16",
           py::arg("seed") = 1234)
      .def("forward", [](PyMlp& p, const PyTensor& x) {
             rt::Tensor y;
             {
               ReleaseGil nogil;
               y = p.mlp->forward(x.t);
             }
             return PyTensor{y, p.ctx};
           }, py::arg("x"))
      .def("backward", [](PyMlp& p, const PyTensor& dy) {
             rt::Tensor dx;
             {
               ReleaseGil nogil;
               dx = p.mlp->backward(dy.t);
             }
             return PyTensor{dx, p.ctx};
           }, py::arg("dy"), "Returns dX; fc1/fc2 weight_grad and bias_grad then hold the gradients.")
      .def_property_readonly("fc1", [](const PyMlp& p) {
        return PyColumn{p.ctx, std::shared_ptr<tp::ColumnParallelLinear>(p.mlp, &p.mlp->fc1)};
      })
      .def_property_readonly("fc2", [](const PyMlp& p) {
        return PyRow{p.ctx, std::shared_ptr<tp::RowParallelLinear>(p.mlp, &p.mlp->fc2)};
      })
      .def_property_readonly("pre_activation", [](const PyMlp& p) { return tensor_or_none(p.ctx, p.mlp->pre_activation); },
                             "fc1's output plus its bias (this rank's features), after forward.")
      .def_property_readonly("activation", [](const PyMlp& p) { return tensor_or_none(p.ctx, p.mlp->activation); });

  py::class_<tp::TensorCheck>(t, "TensorCheck", "One comparison of the equivalence check.")
      .def_readonly("tensor", &tp::TensorCheck::tensor, "'output', 'input_grad', 'fc1.weight_grad', ...")
      .def_readonly("against", &tp::TensorCheck::against, "'unsharded', 'host replay' or 'ranks'")
      .def_readonly("bitwise_claim", &tp::TensorCheck::bitwise_claim,
                    "True where the contract fixes the order (bitwise equality claimed), else a tolerance claim.")
      .def_readonly("bitwise", &tp::TensorCheck::bitwise)
      .def_readonly("max_abs", &tp::TensorCheck::max_abs)
      .def_readonly("rel_norm", &tp::TensorCheck::rel_norm)
      .def_readonly("tolerance", &tp::TensorCheck::tolerance)
      .def_readonly("passed", &tp::TensorCheck::pass)
      .def("to_dict", [](const tp::TensorCheck& c) {
        py::dict d;
        d["tensor"] = c.tensor;
        d["against"] = c.against;
        d["claim"] = c.bitwise_claim ? "bitwise" : "tolerance";
        d["bitwise"] = c.bitwise;
        d["max_abs"] = c.max_abs;
        d["rel_norm"] = c.rel_norm;
        d["tolerance"] = c.tolerance;
        d["pass"] = c.pass;
        return d;
      })
      .def("__repr__", [](const tp::TensorCheck& c) {
        return fmt::format("<TensorCheck {} vs {}: {} (max abs {:.3g}, rel norm {:.3g})>", c.tensor, c.against,
                           c.pass ? "pass" : "FAIL", c.max_abs, c.rel_norm);
      });

  py::class_<PyEquivalence>(t, "EquivalenceReport",
                            "Result of check_mlp_equivalence: every TensorCheck, whether all passed, and the "
                            "RunReport of the tensor-parallel run on the given context.")
      .def_readonly("checks", &PyEquivalence::checks)
      .def_readonly("passed", &PyEquivalence::passed)
      .def_readonly("run", &PyEquivalence::run)
      .def_readonly("mean_loss", &PyEquivalence::mean_loss, "check_gpt_equivalence: the mean loss of the tp run.")
      .def_property_readonly("max_abs", [](const PyEquivalence& e) {
        double m = 0;
        for (const auto& c : e.checks) m = std::max(m, c.max_abs);
        return m;
      }, "The largest max_abs over all checks.")
      .def("__repr__", [](const PyEquivalence& e) {
        return fmt::format("<EquivalenceReport {} ({} checks)>", e.passed ? "pass" : "FAIL", e.checks.size());
      });

  t.def("check_mlp_equivalence", &check_equivalence, py::arg("ctx"), py::kw_only(), py::arg("tp") = 1,
        py::arg("tokens") = 64, py::arg("hidden") = 1024, py::arg("ffn") = 4096, py::arg("dtype") = "bf16",
        py::arg("gelu") = "tanh", py::arg("bias") = true, py::arg("sequence_parallel") = false, py::arg("seed") = 1234,
        py::arg("data_seed") = 99,
        "Runs ParallelMLP forward and backward with tp ranks on ctx, the unsharded model on the host, and (when ctx "
        "is not the host) the same tp program on the host, and compares: bitwise where the contract fixes the "
        "order (fc1's output, every weight and bias gradient; everything against the host replay; replicated "
        "tensors across ranks), within tp_tolerance(dtype, tp) for the output and input gradient, which sum tp "
        "partials. The GIL is released while it runs.");
  t.def("run_mlp", &run_mlp, py::arg("ctx"), py::kw_only(), py::arg("tp") = 1, py::arg("tokens") = 64,
        py::arg("hidden") = 1024, py::arg("ffn") = 4096, py::arg("dtype") = "bf16", py::arg("gelu") = "tanh",
        py::arg("bias") = true, py::arg("sequence_parallel") = false, py::arg("seed") = 1234, py::arg("data_seed") = 99,
        "One ParallelMLP forward and backward with tp ranks on ctx (tp::run_mlp_step: seeded random inputs, none "
        "on a timing-only context), for its RunReport. The GIL is released while it runs.");
  py::class_<PyGptStep>(t, "GptStep", "Result of run_gpt: the RunReport and the mean loss (NaN when timing-only).")
      .def_readonly("run", &PyGptStep::run)
      .def_readonly("mean_loss", &PyGptStep::mean_loss);
  // Both GPT jobs take the same keyword arguments (gpt_step_args parses them).
  const auto gpt_kwargs = std::make_tuple(
      py::arg("tp") = 1, py::arg("batch") = 1, py::arg("vocab") = 1024, py::arg("hidden") = 256, py::arg("heads") = 8,
      py::arg("kv_heads") = py::none(), py::arg("ffn") = 1024, py::arg("seq") = 128, py::arg("layers") = 2,
      py::arg("norm") = "layer_norm", py::arg("dtype") = "bf16", py::arg("gelu") = "tanh", py::arg("swiglu") = false,
      py::arg("rotary") = false, py::arg("bias") = true, py::arg("sequence_parallel") = false,
      py::arg("tie_embeddings") = true, py::arg("seed") = 1234, py::arg("data_seed") = 99,
      py::arg("lengths") = py::none());
  std::apply(
      [&](auto... kw) {
        t.def(
            "check_gpt_equivalence",
            [](const CtxPtr& ctx, GPT_ARGS) {
              const tp::GptStepOptions so = gpt_step_args(*ctx, "check_gpt_equivalence", GPT_ARG_NAMES);
              const tp::GptCheckOptions o{.model = so.model, .batch = so.batch, .tp = so.tp, .data_seed = so.data_seed,
                                          .lengths = so.lengths};
              tp::EquivalenceReport rep;
              {
                ReleaseGil nogil;
                rep = tp::check_gpt_equivalence(*ctx, o);
              }
              return PyEquivalence{rep.checks, rep.pass, rep.run, rep.mean_loss};
            },
            py::arg("ctx"), py::kw_only(), kw...,
            "Runs a GPTModel step (embedding, layers transformer layers, final norm, LM head, vocab-parallel "
            "cross-entropy; forward and backward) with tp ranks on ctx, the unsharded model on the host and, when ctx "
            "is not the host, the same tp program on the host, and compares the per-token loss and every gradient: "
            "bitwise at tp 1, within gpt_tolerance above (everything is downstream of a sum of tp partials), bitwise "
            "against the host replay and across ranks. kv_heads: query groups (None: heads); lengths: right padding "
            "per sequence (None: none). The GIL is released "
            "while it runs.");
        t.def(
            "run_gpt",
            [](const CtxPtr& ctx, GPT_ARGS) {
              const tp::GptStepOptions o = gpt_step_args(*ctx, "run_gpt", GPT_ARG_NAMES);
              PyGptStep r;
              {
                ReleaseGil nogil;
                const tp::GptStepResult res = tp::run_gpt_step(*ctx, o);
                r.run = res.report;
                r.mean_loss = res.mean_loss;
              }
              return r;
            },
            py::arg("ctx"), py::kw_only(), kw...,
            "One GPTModel forward and backward with tp ranks on ctx (tp::run_gpt_step: seeded random tokens), for "
            "its RunReport and mean loss. lengths: each sequence's real tokens (right padding with Megatron's loss "
            "mask: the mean over real tokens; None: none padded). The GIL is released while it runs.");
      },
      gpt_kwargs);
  t.def("gpt_tolerance", [](const std::string& d, int p, int layers) { return tp::gpt_tolerance(dtype_arg(d), p, layers); },
        py::arg("dtype"), py::arg("tp"), py::arg("layers"));
  t.def("valid_tp_sizes",
        [](int devices, std::int64_t ffn, std::int64_t tokens, bool sp) {
          return tp::valid_tp_sizes({.ffn = ffn, .sequence_parallel = sp}, tokens, devices);
        },
        py::arg("devices"), py::arg("ffn"), py::arg("tokens"), py::arg("sequence_parallel") = false,
        "The tp values 1..devices a model allows: tp divides ffn and, with sequence_parallel, tokens.");
}
