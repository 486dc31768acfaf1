// The _cubesim extension module: the C++ simulator exposed to Python. Errors raised in C++ arrive
// as Python exceptions carrying the same message: std::invalid_argument (the runtime's
// RuntimeError, shape and dtype mistakes) is ValueError, std::runtime_error is RuntimeError, and
// cubesim's own classes are TopologyError (a ValueError), RankError, CollectiveError and
// BackendUnavailableError (RuntimeErrors).
//
// This file also holds the helpers common.h declares (dtype names, numpy and JSON conversions).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "runtime/errors.h"
#include "sim/core/simulator.h"
#include "sim/core/time.h"
#include "sim/hw/errors.h"

namespace py = pybind11;

void bind_sim_core(py::module_& m);
void bind_topology(py::module_& m);
void bind_runtime(py::module_& m);
void bind_kernels_tp(py::module_& m);

namespace cubesim::pyb {

namespace {
// Exception classes live for the whole process (never decref'd at exit, after the interpreter).
PyObject* g_topology_error = nullptr;
PyObject* g_rank_error = nullptr;
PyObject* g_collective_error = nullptr;
PyObject* g_backend_error = nullptr;
PyObject* g_unwind = nullptr;

PyObject* new_exception(py::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qual = std::string("cubesim.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qual.c_str(), doc, base, nullptr);
  if (!t) throw py::error_already_set();
  m.attr(name) = py::handle(t);  // the module holds a reference; ours is never released
  return t;
}
}  // namespace

py::handle unwind_exception_type() { return g_unwind; }

void set_rank_error(const rt::RankError& e, py::handle cause) {
  py::object inst = py::reinterpret_steal<py::object>(PyObject_CallFunction(g_rank_error, "s", e.what()));
  if (!inst) throw py::error_already_set();
  py::list failures;
  for (const auto& f : e.failures()) failures.append(py::make_tuple(f.rank, f.message));
  inst.attr("failures") = failures;
  if (cause) PyException_SetCause(inst.ptr(), py::reinterpret_borrow<py::object>(cause).release().ptr());
  PyErr_SetObject(g_rank_error, inst.ptr());
}

DType dtype_arg(const std::string& name) { return parse_dtype(name); }
std::string dtype_str(DType d) { return std::string(dtype_name(d)); }

std::vector<std::uint8_t> array_to_bytes(const py::array& a, DType dtype, const char* what) {
  const char kind = a.dtype().kind();
  const auto itemsize = a.itemsize();
  const auto n = static_cast<std::size_t>(a.size());
  std::vector<std::uint8_t> out(n * dtype_size(dtype));
  if (kind == 'u' && (itemsize == 2 || itemsize == 4)) {  // bit patterns
    const std::size_t want = dtype_size(dtype);
    if (static_cast<std::size_t>(itemsize) != want) {
      throw py::value_error(std::string(what) + ": a uint" + std::to_string(itemsize * 8) +
                            " array holds bit patterns, which for dtype " + dtype_str(dtype) + " must be uint" +
                            std::to_string(want * 8) + " (or pass float values to have them converted)");
    }
    if (itemsize == 2) {
      auto c = py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast>::ensure(a);
      if (n) std::memcpy(out.data(), c.data(), n * 2);
    } else {
      auto c = py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>::ensure(a);
      if (n) std::memcpy(out.data(), c.data(), n * 4);
    }
    return out;
  }
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b') {
    throw py::type_error(std::string(what) + ": cannot convert an array of dtype '" +
                         py::str(a.dtype()).cast<std::string>() +
                         "'; give float or integer values, or uint16/uint32 bit patterns");
  }
  auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!f) throw py::error_already_set();
  if (n) convert_from_f32(f.data(), out.data(), dtype, n);
  return out;
}

std::vector<std::int64_t> arrays_to_bytes(const py::sequence& arrays, DType dtype, const char* what,
                                          std::vector<std::vector<std::uint8_t>>& out) {
  std::vector<std::int64_t> shape0;
  const auto n = py::len(arrays);
  for (std::size_t k = 0; k < n; ++k) {
    py::array a = py::array::ensure(arrays[k]);
    if (!a) throw py::type_error(fmt::format("{}: input {} is not array-like", what, k));
    std::vector<std::int64_t> sh(a.shape(), a.shape() + a.ndim());
    if (sh.empty()) sh.push_back(1);
    if (k == 0) {
      shape0 = sh;
    } else if (sh != shape0) {
      throw py::value_error(fmt::format("{}: input {} has shape ({}) but input 0 has ({}); every rank contributes the "
                                        "same shape",
                                        what, k, fmt::join(sh, ", "), fmt::join(shape0, ", ")));
    }
    out.push_back(array_to_bytes(a, dtype, what));
  }
  return shape0;
}

py::array bytes_to_array(const std::vector<std::uint8_t>& bytes, DType dtype, const std::vector<std::int64_t>& shape,
                         bool bits) {
  std::vector<py::ssize_t> sh(shape.begin(), shape.end());
  const std::size_t n = bytes.size() / dtype_size(dtype);
  if (bits) {
    if (dtype == DType::f32) {
      py::array_t<std::uint32_t> a(sh);
      if (n) std::memcpy(a.mutable_data(), bytes.data(), n * 4);
      return a;
    }
    py::array_t<std::uint16_t> a(sh);
    if (n) std::memcpy(a.mutable_data(), bytes.data(), n * 2);
    return a;
  }
  py::array_t<float> a(sh);
  if (n) convert_to_f32(bytes.data(), dtype, a.mutable_data(), n);
  return a;
}

nlohmann::json to_json(const py::handle& h) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    if (overflow == 0) return v;
    if (overflow > 0) return h.cast<unsigned long long>();
    throw py::value_error("integer " + py::str(h).cast<std::string>() + " does not fit a JSON number");
  }
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::dict>(h)) {
    nlohmann::json o = nlohmann::json::object();
    for (auto kv : h.cast<py::dict>()) {
      if (!py::isinstance<py::str>(kv.first)) {
        throw py::type_error("JSON object keys must be strings, got " + py::repr(kv.first).cast<std::string>());
      }
      o[kv.first.cast<std::string>()] = to_json(kv.second);
    }
    return o;
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    nlohmann::json a = nlohmann::json::array();
    for (auto v : h) a.push_back(to_json(v));
    return a;
  }
  if (py::hasattr(h, "item") && py::hasattr(h, "dtype")) return to_json(h.attr("item")());  // numpy scalars
  throw py::type_error("cannot convert " + py::repr(h).cast<std::string>() +
                       " to JSON; use dict, list, str, int, float, bool or None");
}

py::object from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return py::none();
    case nlohmann::json::value_t::boolean: return py::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return py::int_(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return py::int_(j.get<std::uint64_t>());
    case nlohmann::json::value_t::number_float: return py::float_(j.get<double>());
    case nlohmann::json::value_t::string: return py::str(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      py::list l;
      for (const auto& v : j) l.append(from_json(v));
      return l;
    }
    case nlohmann::json::value_t::object: {
      py::dict d;
      for (const auto& [k, v] : j.items()) d[py::str(k)] = from_json(v);
      return d;
    }
    default: return py::none();
  }
}

std::vector<std::pair<std::string, nlohmann::json>> overrides_arg(const py::handle& h) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  if (h.is_none()) return out;
  if (py::isinstance<py::dict>(h)) {
    for (auto kv : h.cast<py::dict>()) out.emplace_back(py::str(kv.first).cast<std::string>(), to_json(kv.second));
    return out;
  }
  if (py::isinstance<py::str>(h)) {
    throw py::type_error("overrides: give a dict {\"dotted.path\": value} or a list of (path, value) pairs, not a string");
  }
  for (auto item : h) {
    auto t = py::reinterpret_borrow<py::sequence>(item);
    if (py::len(t) != 2) {
      throw py::type_error("overrides: each entry must be a (path, value) pair, got " + py::repr(item).cast<std::string>());
    }
    out.emplace_back(py::str(t[0]).cast<std::string>(), to_json(t[1]));
  }
  return out;
}

void register_exceptions(py::module_& m) {
  g_topology_error = new_exception(m, "TopologyError", PyExc_ValueError,
                                   "An invalid topology file or document; the message names the file, the dotted "
                                   "JSON path, the value and what would be valid.");
  g_rank_error = new_exception(m, "RankError", PyExc_RuntimeError,
                               "One or more ranks failed inside Context.spawn (or a helper that spawns); the message "
                               "names each rank and its cause, `failures` lists (rank, message) pairs, and __cause__ "
                               "is the Python exception a rank function raised, if any.");
  g_collective_error = new_exception(m, "CollectiveError", PyExc_RuntimeError,
                                     "Ranks called mismatched collectives (the message names both calls).");
  g_backend_error = new_exception(m, "BackendUnavailableError", PyExc_RuntimeError,
                                  "The backend asked for is not part of this build (e.g. cuda).");
  g_unwind = new_exception(m, "_Unwind", PyExc_BaseException,
                           "Raised inside a rank function while the run is torn down (a sibling rank failed); "
                           "do not catch it.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sim::detail::ProcessUnwind&) {
      PyErr_SetString(g_unwind, "the run is being torn down (another rank failed)");
    } catch (const hw::TopologyError& e) {
      PyErr_SetString(g_topology_error, e.what());
    } catch (const rt::RankError& e) {
      set_rank_error(e, py::handle());
    } catch (const rt::CollectiveError& e) {
      PyErr_SetString(g_collective_error, e.what());
    } catch (const rt::BackendUnavailableError& e) {
      PyErr_SetString(g_backend_error, e.what());
    } catch (const rt::InterruptedError& e) {
      // Ctrl-C: the SIGINT handler of the run passed the signal on to Python's (sim/core/interrupt.h);
      // take that pending KeyboardInterrupt and raise one that says how far the run got.
      if (PyErr_CheckSignals() != 0) PyErr_Clear();
      PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    }
  });
}

}  // namespace cubesim::pyb

PYBIND11_MODULE(_cubesim, m) {
  m.doc() = "cubesim: a discrete-event simulator of accelerator systems with a tensor-parallel runtime";
  cubesim::pyb::register_exceptions(m);
  bind_sim_core(m);
  bind_topology(m);
  bind_runtime(m);
  bind_kernels_tp(m);
}
