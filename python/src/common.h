// common.h — what the binding translation units share: the GIL discipline for code that runs
// inside simulated processes, the Python-side holders of tensors and run reports, and conversions
// (dtype names, numpy arrays, JSON documents).
//
// GIL rules (the reason this file exists):
//   - every binding that may run a simulation or block a simulated process (spawn, collectives,
//     ops, layers, Work.wait) releases the GIL with ReleaseGil, never with py::gil_scoped_release:
//     a rank function written in Python runs in a fiber with a Python thread state of its own, and
//     pybind11 finds "this thread's" state through a thread-local that ReleaseGil saves and restores
//     per fiber (see bind_runtime.cpp, py_spawn);
//   - a binding that blocks while holding the GIL would deadlock the other ranks: when in doubt,
//     release.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "runtime/context.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"
#include "sim/core/trace.h"

namespace cubesim::pyb {

namespace py = pybind11;

// pybind11's thread-local state, which must follow a fiber rather than the OS thread: the thread
// state gil_scoped_acquire uses, and the stack of argument-loader frames of the calls in progress
// (each bound call pushes one and checks, on return, that it is on top).
#if PYBIND11_VERSION_MAJOR >= 3
#if PYBIND11_VERSION_HEX < 0x03000200
#error "cubesim's bindings take pybind11 2.10 and later 2.x, or 3.0.2 and later (3.0.0 and 3.0.1 keep the loader frames elsewhere)"
#endif
// pybind11 3.0.2+ keeps the loader frames' top in a C++ thread_local behind a private accessor of
// loader_life_support; module.cpp reaches it once, through an explicit instantiation (which may name
// a private member), and hands it out here (the GPU machine's Python 3.12 has pybind11 3.x; Debian's
// 3.11 has 2.10).
using LoaderFrameFn = py::detail::loader_life_support*& (*)();
LoaderFrameFn loader_frame_fn();
#endif

struct PybindThreadLocals {
  void* tstate = nullptr;
  void* loader_stack = nullptr;

#if PYBIND11_VERSION_MAJOR >= 3
  static PybindThreadLocals get() {
    return {py::detail::get_internals().tstate.get(), loader_frame_fn()()};
  }
  void set() const {
    py::detail::get_internals().tstate.set(static_cast<PyThreadState*>(tstate));
    loader_frame_fn()() = static_cast<py::detail::loader_life_support*>(loader_stack);
  }
#else
  static auto& loader_key() {
#if PYBIND11_INTERNALS_VERSION == 4
    return py::detail::get_local_internals().loader_life_support_tls_key;
#else
    return py::detail::get_internals().loader_life_support_tls_key;
#endif
  }
  static PybindThreadLocals get() {
    return {PYBIND11_TLS_GET_VALUE(py::detail::get_internals().tstate), PYBIND11_TLS_GET_VALUE(loader_key())};
  }
  void set() const {
    PYBIND11_TLS_REPLACE_VALUE(py::detail::get_internals().tstate, tstate);
    PYBIND11_TLS_REPLACE_VALUE(loader_key(), loader_stack);
  }
#endif
};

// Releases the GIL for the duration of a C++ call; afterwards restores the calling fiber's (or
// thread's) Python thread state and pybind11's thread-locals as they were.
class ReleaseGil {
 public:
  ReleaseGil() : saved_(PybindThreadLocals::get()), state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    PyEval_RestoreThread(state_);
    saved_.set();
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PybindThreadLocals saved_;
  PyThreadState* state_;
};

// A tensor as Python holds it: the tensor plus its context, which owns the memory it lives in
// (so a tensor keeps its context alive, never the other way round).
struct PyTensor {
  rt::Tensor t;
  std::shared_ptr<rt::Context> ctx;
  ~PyTensor() { t = rt::Tensor(); }  // the storage goes back to the context's memory before the context may go
};

// "f32" | "bf16" | "f16" (and the aliases parse_dtype in base/dtype.h takes); ValueError otherwise.
DType dtype_arg(const std::string& name);
std::string dtype_str(DType d);

// Host values of an array in `dtype`'s storage format (bytes, row-major), following the documented
// rules: uint16 arrays are bf16/f16 bit patterns, uint32 arrays f32 bit patterns, every other
// numeric array is converted by value (to f32, then rounded to nearest even to dtype).
std::vector<std::uint8_t> array_to_bytes(const py::array& a, DType dtype, const char* what);
// A sequence of arrays of one shape (one per rank) as bytes each, by array_to_bytes's rules, into
// `out`; returns the shape ([1] for scalars). TypeError for an item that is not array-like,
// ValueError for one whose shape differs from the first's.
std::vector<std::int64_t> arrays_to_bytes(const py::sequence& arrays, DType dtype, const char* what,
                                          std::vector<std::vector<std::uint8_t>>& out);
// The inverse: float32 values (exact widening), or with bits=true the raw bit patterns
// (uint16 for bf16/f16, uint32 for f32).
py::array bytes_to_array(const std::vector<std::uint8_t>& bytes, DType dtype, const std::vector<std::int64_t>& shape,
                         bool bits);

// Integer arguments taken as Python objects, so a value out of range is a ValueError naming the
// argument and the valid range (pybind11's own casts say only "incompatible function arguments"):
// int_arg: an int in [lo, hi]; u64_arg: an int in [0, 2^64-1]; shape_arg: a sequence of ints, each
// in [0, 2^63-1] (the tensor byte limit, rt::kMaxTensorBytes, is checked where the tensor is made).
// TypeError for a value that is not an int (bool is refused too).
std::int64_t int_arg(const py::handle& h, const char* what, std::int64_t lo, std::int64_t hi);
std::uint64_t u64_arg(const py::handle& h, const char* what);
std::vector<std::int64_t> shape_arg(const py::handle& h, const char* what);

// JSON <-> Python (dict, list, str, int, float, bool, None; numpy scalars and arrays by value).
// to_json names `what` (the argument: "doc", "value", "overrides['x']") and the path inside it in
// every error: ValueError for a cycle, nesting deeper than kMaxJsonDepth or an int outside
// [-2^63, 2^64); TypeError for a value of another type or a key that is not a string.
inline constexpr int kMaxJsonDepth = 64;
nlohmann::json to_json(const py::handle& h, const char* what);
py::object from_json(const nlohmann::json& j);
// Topology overrides from Python: None, a dict {dotted path: value} (in insertion order), or a
// sequence of (path, value) pairs.
std::vector<std::pair<std::string, nlohmann::json>> overrides_arg(const py::handle& h);

// The Python exception class a rank's cancelled Python code unwinds with (a BaseException, so
// `except Exception` does not stop it).
py::handle unwind_exception_type();

// Sets Python's RankError for `e` (its `failures` attribute lists (rank, message) pairs), with
// `cause` (may be null) as __cause__: the Python exception a rank function raised.
void set_rank_error(const rt::RankError& e, py::handle cause);

// A trace track's statistics as a dict: {"group", "name", "spans", "busy_ps"}.
inline py::dict track_stats_dict(const sim::Trace::TrackStats& s) {
  py::dict d;
  d["group"] = s.group;
  d["name"] = s.name;
  d["spans"] = s.spans;
  d["busy_ps"] = s.busy;
  return d;
}

}  // namespace cubesim::pyb
