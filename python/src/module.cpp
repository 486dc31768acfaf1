// The _cubesim extension module: the C++ simulator exposed to Python. Errors raised in C++ arrive
// as Python exceptions carrying the same message (pybind11 maps std::invalid_argument to
// ValueError, std::range_error to ValueError, std::runtime_error to RuntimeError).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "sim/core/time.h"

namespace py = pybind11;
using namespace cubesim::sim;

void bind_sim_core(py::module_& m);

PYBIND11_MODULE(_cubesim, m) {
  m.doc() = "cubesim: a discrete-event simulator of accelerator systems with a tensor-parallel runtime";
  bind_sim_core(m);
}
