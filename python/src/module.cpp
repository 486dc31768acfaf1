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
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "runtime/errors.h"
#include "sim/core/simulator.h"
#include "sim/core/time.h"
#include "sim/hw/errors.h"

namespace py = pybind11;

#if PYBIND11_VERSION_MAJOR >= 3
namespace cubesim::pyb {
// The one explicit instantiation (common.h): it defines stolen_loader_frame() to return the private
// loader_life_support::tls_current_frame, which loader_frame_fn() hands out.
LoaderFrameFn stolen_loader_frame();
template <LoaderFrameFn F>
struct LoaderFrameAccess {
  friend LoaderFrameFn stolen_loader_frame() { return F; }
};
template struct LoaderFrameAccess<&py::detail::loader_life_support::tls_current_frame>;
LoaderFrameFn loader_frame_fn() { return stolen_loader_frame(); }
}  // namespace cubesim::pyb
#endif

void bind_sim_core(py::module_& m);
void bind_topology(py::module_& m);
void bind_runtime(py::module_& m);
void bind_kernels_tp(py::module_& m);
void bind_sdc(py::module_& m);

namespace cubesim::pyb {

namespace {
// Exception classes live for the whole process (never decref'd at exit, after the interpreter).
PyObject* g_topology_error = nullptr;
PyObject* g_rank_error = nullptr;
PyObject* g_collective_error = nullptr;
PyObject* g_backend_error = nullptr;
PyObject* g_oom_error = nullptr;
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

namespace {
std::string type_name(const py::handle& h) { return py::type::of(h).attr("__name__").cast<std::string>(); }

// The int value of h as a Python int object (an int, or a numpy integer); TypeError otherwise.
py::int_ as_int(const py::handle& h, const char* what) {
  if (py::isinstance<py::bool_>(h) || !(py::isinstance<py::int_>(h) || PyIndex_Check(h.ptr()))) {
    throw py::type_error(fmt::format("{}: expected an int, got a {}", what, type_name(h)));
  }
  return py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
}

std::string range_text(std::int64_t v) {
  if (v == std::numeric_limits<std::int64_t>::max()) return "2^63-1";
  if (v == std::numeric_limits<std::int64_t>::min()) return "-2^63";
  return std::to_string(v);
}
}  // namespace

std::int64_t int_arg(const py::handle& h, const char* what, std::int64_t lo, std::int64_t hi) {
  py::int_ i = as_int(h, what);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || v < lo || v > hi) {
    std::string shown = py::str(i).cast<std::string>();
    if (shown.size() > 40) shown = shown.substr(0, 20) + "..." + shown.substr(shown.size() - 10);
    throw py::value_error(fmt::format("{}: {} is out of range; valid: {} to {}", what, shown, range_text(lo),
                                      range_text(hi)));
  }
  return v;
}

std::uint64_t u64_arg(const py::handle& h, const char* what) {
  py::int_ i = as_int(h, what);
  const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    std::string shown = py::str(i).cast<std::string>();
    if (shown.size() > 40) shown = shown.substr(0, 20) + "..." + shown.substr(shown.size() - 10);
    throw py::value_error(fmt::format("{}: {} is out of range; valid: 0 to 2^64-1 ({})", what, shown,
                                      std::numeric_limits<std::uint64_t>::max()));
  }
  return v;
}

std::vector<std::int64_t> shape_arg(const py::handle& h, const char* what) {
  if (py::isinstance<py::str>(h) || !(py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h))) {
    if (!py::isinstance<py::str>(h) && (py::isinstance<py::int_>(h) || PyIndex_Check(h.ptr()))) {
      return {int_arg(h, what, 0, std::numeric_limits<std::int64_t>::max())};  // a single dimension
    }
    throw py::type_error(fmt::format("{}: expected a list or tuple of ints, got a {}", what, type_name(h)));
  }
  std::vector<std::int64_t> out;
  std::size_t i = 0;
  for (auto d : h) {
    const std::string w = fmt::format("{}[{}]", what, i++);
    out.push_back(int_arg(d, w.c_str(), 0, std::numeric_limits<std::int64_t>::max()));
  }
  return out;
}

namespace {
// What to_json is converting, for messages: the argument's name and the path inside it
// ("doc['cube']['hbm'][2]"), and the containers open above the current value (cycle detection).
struct JsonWalk {
  const char* what;
  std::vector<std::string> path;
  std::vector<PyObject*> open;
  std::string where() const {
    std::string s = what;
    for (const auto& p : path) s += p;
    return s;
  }
};

std::string short_repr(const py::handle& h) {
  std::string r;
  try {
    r = py::repr(h).cast<std::string>();
  } catch (py::error_already_set&) {
    r = "<unprintable>";
  }
  if (r.size() > 60) r = r.substr(0, 57) + "...";
  return r;
}

nlohmann::json to_json_at(const py::handle& h, JsonWalk& w);

// A str as UTF-8; ValueError naming `where` for one that has none (a lone surrogate).
std::string utf8_of(const py::handle& h, const std::string& where) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
  if (p == nullptr) {
    PyErr_Clear();
    throw py::value_error(fmt::format("{}: the string {} cannot be encoded as UTF-8 (a lone surrogate); JSON text is "
                                      "UTF-8",
                                      where, short_repr(h)));
  }
  return std::string(p, static_cast<std::size_t>(n));
}

// Enters a container: refuses a cycle and nesting past kMaxJsonDepth before recursing.
struct Open {
  JsonWalk& w;
  Open(JsonWalk& walk, const py::handle& h) : w(walk) {
    for (PyObject* o : w.open) {
      if (o == h.ptr()) {
        throw py::value_error(fmt::format("{}: the value contains itself (a cycle through this {}); give a tree of "
                                          "dicts and lists",
                                          w.where(), py::type::of(h).attr("__name__").cast<std::string>()));
      }
    }
    if (static_cast<int>(w.open.size()) >= kMaxJsonDepth) {
      throw py::value_error(fmt::format("{}: nested deeper than {} dicts and lists, the limit for a JSON document "
                                        "given from Python",
                                        w.where(), kMaxJsonDepth));
    }
    w.open.push_back(h.ptr());
  }
  ~Open() { w.open.pop_back(); }
};

nlohmann::json to_json_at(const py::handle& h, JsonWalk& w) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    if (overflow == 0) return v;
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(h.ptr());
      if (!PyErr_Occurred()) return u;
      PyErr_Clear();
    }
    throw py::value_error(fmt::format("{}: integer {} is out of range; JSON numbers given from Python are integers "
                                      "from -2^63 to 2^64-1, or floats",
                                      w.where(), short_repr(h)));
  }
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::str>(h)) return utf8_of(h, w.where());
  if (py::isinstance<py::dict>(h)) {
    Open guard(w, h);
    nlohmann::json o = nlohmann::json::object();
    for (auto kv : h.cast<py::dict>()) {
      if (!py::isinstance<py::str>(kv.first)) {
        throw py::type_error(fmt::format("{}: JSON object keys must be strings, got {} ({})", w.where(),
                                         short_repr(kv.first), type_name(kv.first)));
      }
      std::string key = utf8_of(kv.first, w.where() + " (a key)");
      w.path.push_back("['" + (key.size() > 40 ? key.substr(0, 37) + "..." : key) + "']");
      o[key] = to_json_at(kv.second, w);
      w.path.pop_back();
    }
    return o;
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    Open guard(w, h);
    nlohmann::json a = nlohmann::json::array();
    std::size_t i = 0;
    for (auto v : h) {
      w.path.push_back(fmt::format("[{}]", i++));
      a.push_back(to_json_at(v, w));
      w.path.pop_back();
    }
    return a;
  }
  if (py::hasattr(h, "tolist") && py::hasattr(h, "dtype")) {  // numpy scalars and arrays
    py::object v = h.attr("tolist")();
    if (v.ptr() != h.ptr() && !py::hasattr(v, "dtype")) return to_json_at(v, w);
  }
  throw py::type_error(fmt::format("{}: cannot convert {} (a {}) to JSON; use dict, list, str, int, float, bool or "
                                   "None",
                                   w.where(), short_repr(h), type_name(h)));
}
}  // namespace

nlohmann::json to_json(const py::handle& h, const char* what) {
  JsonWalk w{what, {}, {}};
  return to_json_at(h, w);
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
  auto path_of = [](const py::handle& k) {
    if (!py::isinstance<py::str>(k)) {
      throw py::type_error(fmt::format("overrides: a path must be a string like \"cube.hbm.bandwidth_GBps\", got {} "
                                       "(a {})",
                                       short_repr(k), py::type::of(k).attr("__name__").cast<std::string>()));
    }
    return utf8_of(k, "overrides: a path");
  };
  if (py::isinstance<py::dict>(h)) {
    for (auto kv : h.cast<py::dict>()) {
      const std::string path = path_of(kv.first);
      const std::string what = "overrides['" + (path.size() > 40 ? path.substr(0, 37) + "..." : path) + "']";
      out.emplace_back(path, to_json(kv.second, what.c_str()));
    }
    return out;
  }
  if (py::isinstance<py::str>(h) || !(py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h))) {
    throw py::type_error(fmt::format("overrides: give a dict {{\"dotted.path\": value}} or a list of (path, value) "
                                     "pairs, not a {}",
                                     py::type::of(h).attr("__name__").cast<std::string>()));
  }
  std::size_t i = 0;
  for (auto item : h) {
    if (!(py::isinstance<py::list>(item) || py::isinstance<py::tuple>(item)) || py::len(item) != 2) {
      throw py::type_error(fmt::format("overrides[{}]: each entry must be a (path, value) pair, got {}", i,
                                       short_repr(item)));
    }
    auto t = py::reinterpret_borrow<py::sequence>(item);
    const std::string what = fmt::format("overrides[{}][1]", i);
    out.emplace_back(path_of(t[0]), to_json(t[1], what.c_str()));
    ++i;
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
  g_oom_error = new_exception(m, "OutOfMemoryError", PyExc_RuntimeError,
                              "A device memory (a simulated HBM or TCM, a GPU's memory) cannot hold an allocation; "
                              "the message names the memory, the allocation and the memory's statistics. A "
                              "RuntimeError, as torch.OutOfMemoryError is.");
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
    } catch (const hw::OutOfMemoryError& e) {
      PyErr_SetString(g_oom_error, e.what());
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
  bind_sdc(m);
}
