// Python bindings of the runtime: Context (sim and host backends), Tensor (numpy in and out),
// spawn with a Python rank function, process groups, collectives, ops, run reports and trace, and
// Context.run_collective, a thin wrapper of rt::run_collective (runtime/run_collective.h).
//
// Rank functions written in Python run inside simulated processes (fibers on this thread). Each
// rank gets a Python thread state of its own, so the interpreter's per-thread state (frame stack,
// recursion depth, exception state) is never shared by two fibers; every binding that can block
// releases the GIL (ReleaseGil), so while one rank waits another can run Python.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "runtime/algorithms/nccl.h"
#include "runtime/algorithms/table.h"
#include "runtime/backend_registry.h"
#include "runtime/collectives.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "runtime/run_collective.h"
#include "runtime/sim_backend.h"
#include "sim/core/time.h"
#include "sim/hw/topology.h"
#include "sim/hw/utilisation.h"
#ifdef CUBESIM_PY_HAVE_CUDA
#include "runtime/cuda_backend.h"
#endif

namespace py = pybind11;
using namespace cubesim;
using namespace cubesim::pyb;

namespace {

using CtxPtr = std::shared_ptr<rt::Context>;
constexpr std::int64_t kIntMin = std::numeric_limits<int>::min();
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();

// Context(backend, ...): the backend's registry row makes it (runtime/backend_registry.h). The
// backend's own options go by name, only those the caller gave (None: the backend's default), so
// a backend rejects an option it does not take.
std::shared_ptr<rt::Context> make_context(const std::string& backend, const py::object& world_size_arg,
                                          const py::object& topology,
                                          const py::object& overrides, std::optional<bool> timing_only,
                                          std::optional<bool> check_uninitialized, std::optional<std::string> hazards,
                                          bool trace, const std::string& algorithm, bool accumulate_f32,
                                          const py::object& hierarchy_arg, const py::object& stack_size_arg,
                                          bool record_ops, std::optional<std::string> gemm_mode,
                                          std::optional<std::string> cuda_collectives,
                                          std::optional<std::vector<int>> ranks_on, std::optional<std::string> timing,
                                          std::optional<std::string> gemm_numerics, std::optional<bool> share_gpus) {
  const int world_size = static_cast<int>(int_arg(world_size_arg, "Context: world_size", 0, 1 << 20));
  const int hierarchy = static_cast<int>(int_arg(hierarchy_arg, "Context: hierarchy", 0, 1 << 20));
  const auto stack_size =
      static_cast<std::size_t>(int_arg(stack_size_arg, "Context: stack_size", 16 * 1024, std::int64_t{1} << 32));
  const rt::BackendInfo& info = rt::find_backend(backend);
  rt::ContextOptions o;
  o.world_size = world_size;
  o.trace = trace;
  o.algorithm = rt::parse_algorithm(algorithm);
  o.accumulate_f32 = accumulate_f32;
  o.hierarchy = hierarchy;
  o.stack_size = stack_size;
  o.record_ops = record_ops;
  rt::BackendArgs args;
  if (timing_only) args.options["timing_only"] = *timing_only;
  if (timing) args.options["timing"] = *timing;
  if (gemm_numerics) args.options["gemm_numerics"] = *gemm_numerics;
  if (check_uninitialized) args.options["check_uninitialized"] = *check_uninitialized;
  if (hazards) args.options["hazards"] = *hazards;
  if (gemm_mode) args.options["gemm_mode"] = *gemm_mode;
  if (cuda_collectives) args.options["collectives"] = *cuda_collectives;
  if (share_gpus) args.options["share_gpus"] = *share_gpus;
  if (ranks_on) args.options["cubes"] = *ranks_on;  // sim: rank r on cube ranks_on[r]
  // A Topology is used as it is (the caller loaded and validated it); a name or path is loaded here,
  // once, with the overrides (which, without a topology, apply to the sim backend's default).
  std::optional<hw::Topology> given;
  std::string name;
  if (py::isinstance<hw::Topology>(topology)) {
    if (!overrides.is_none()) {
      throw py::value_error("Context: overrides apply to a topology name or path; this topology is a Topology object, "
                            "already built: pass the overrides to load_topology(name, overrides=...) instead");
    }
    given = topology.cast<hw::Topology>();
  } else if (py::isinstance<py::str>(topology)) {
    name = topology.cast<std::string>();
  } else if (!topology.is_none()) {
    throw py::type_error(fmt::format("Context: topology must be a name, a path or a Topology, not {}",
                                     py::str(py::type::of(topology).attr("__name__")).cast<std::string>()));
  } else if (!overrides.is_none()) {
    if (!info.simulates) {
      throw py::value_error(fmt::format("Context: overrides change a topology, and backend '{}' simulates none; give "
                                        "them to a simulating backend (see backend_info())",
                                        info.name));
    }
    name = rt::kDefaultTopology;
  }
  const auto ov = overrides_arg(overrides);
  std::unique_ptr<rt::Context> c;
  {
    ReleaseGil nogil;  // loading and building a large topology takes a while
    if (!name.empty()) given = hw::load_topology(name, ov);
    args.topology = given ? &*given : nullptr;
    c = info.make(o, args);
  }
  // Tearing a simulation down (its units, stores and fiber stacks) takes a while and touches no
  // Python object: the last reference's owner lets other threads run Python meanwhile (a thread
  // sweep's workers each drop a Context a case). Held by a fiber's own thread state, or not at all,
  // the GIL stays as it is.
  return CtxPtr(c.release(), [](rt::Context* p) {
    if (PyGILState_Check()) {
      ReleaseGil nogil;
      delete p;
    } else {
      delete p;
    }
  });
}

rt::CollectiveOptions coll_opts(const std::optional<std::string>& algorithm, std::optional<bool> accumulate_f32,
                                const py::object& hierarchy_arg, bool async_op) {
  const int hierarchy = static_cast<int>(int_arg(hierarchy_arg, "hierarchy", 0, 1 << 20));
  rt::CollectiveOptions o;
  if (algorithm) o.algorithm = rt::parse_algorithm(*algorithm);
  o.accumulate_f32 = accumulate_f32;
  o.hierarchy = hierarchy;
  o.async_op = async_op;
  return o;
}


PyTensor wrap(const CtxPtr& ctx, rt::Tensor t) { return PyTensor{std::move(t), ctx}; }

// "ValueError: boom (at model.py:12 in rank_fn)"
std::string describe_python_error(const py::error_already_set& e) {
  std::string msg;
  try {
    msg = py::str(e.type().attr("__name__")).cast<std::string>();
    const std::string text = py::str(e.value()).cast<std::string>();
    if (!text.empty()) msg += ": " + text;
    py::list tb = e.trace() ? py::list(py::module_::import("traceback").attr("extract_tb")(e.trace())) : py::list();
    if (py::len(tb) > 0) {
      py::object last = tb[py::len(tb) - 1];
      msg += fmt::format(" (at {}:{} in {})", py::str(last.attr("filename")).cast<std::string>(),
                         last.attr("lineno").cast<int>(), py::str(last.attr("name")).cast<std::string>());
    }
  } catch (...) {
    msg = "a Python exception (it could not be described)";
  }
  return msg;
}

// A rank function must take one positional argument, the rank: checked before the run, so a wrong
// signature is a TypeError naming the function rather than a failure of every rank. Callables
// inspect cannot describe (some builtins) are left to the call.
void check_rank_function(const py::object& fn, const char* where) {
  py::object sig;
  try {
    sig = py::module_::import("inspect").attr("signature")(fn);
  } catch (py::error_already_set&) {
    return;
  }
  try {
    sig.attr("bind")(0);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    const std::string name = py::str(py::getattr(fn, "__qualname__", py::getattr(fn, "__name__", py::repr(fn))));
    throw py::type_error(fmt::format("{}: the rank function {}{} cannot be called as {}(rank) ({}); give a function "
                                     "of one positional argument, the rank: def {}(rank): ...",
                                     where, name, py::str(sig).cast<std::string>(), name,
                                     py::str(e.value()).cast<std::string>(), name));
  }
}

// ctx.spawn(fn): fn(rank) for every rank, as a simulated process, in Python.
rt::RunReport py_spawn(const CtxPtr& ctx, const py::object& fn_arg, const py::object& nprocs_arg) {
  if (!PyCallable_Check(fn_arg.ptr())) {
    throw py::type_error(fmt::format("Context.spawn(): fn must be a function of the rank, def fn(rank): ..., not a {}",
                                     py::type::of(fn_arg).attr("__name__").cast<std::string>()));
  }
  const auto fn = py::reinterpret_borrow<py::function>(fn_arg);
  const int nprocs = nprocs_arg.is_none() ? ctx->world_size()
                                          : static_cast<int>(int_arg(nprocs_arg, "spawn: nprocs", kIntMin, kIntMax));
  if (nprocs < 1 || nprocs > ctx->world_size()) {
    throw py::value_error(fmt::format("spawn: nprocs {} is not valid; the context has {} ranks; spawn between 1 and {}",
                                      nprocs, ctx->world_size(), ctx->world_size()));
  }
  check_rank_function(fn, "Context.spawn()");
  PyInterpreterState* interp = PyThreadState_Get()->interp;
  std::vector<PyThreadState*> states(static_cast<std::size_t>(nprocs));
  for (auto& s : states) s = PyThreadState_New(interp);
  std::vector<py::object> causes(static_cast<std::size_t>(nprocs));  // what each rank's fn raised
  const py::handle unwind = unwind_exception_type();
  rt::RunReport rep;
  std::exception_ptr failure;
  {
    ReleaseGil nogil;
    try {
      rep = ctx->spawn(nprocs, [&](int rank) {
        PyThreadState* ts = states[static_cast<std::size_t>(rank)];
        PyEval_RestoreThread(ts);
        PybindThreadLocals{ts, nullptr}.set();  // this fiber's thread state; no bound call in progress yet
        std::string message;
        bool unwinding = false;
        try {
          fn(rank);
        } catch (py::error_already_set& e) {
          if (e.matches(unwind)) {
            unwinding = true;
          } else {
            message = describe_python_error(e);
            causes[static_cast<std::size_t>(rank)] = e.value();
          }
        }  // e is released here, with this rank's thread state current
        PyEval_SaveThread();
        if (unwinding) throw sim::detail::ProcessUnwind{};
        if (!message.empty()) throw std::runtime_error(message);
      });
    } catch (...) {
      failure = std::current_exception();
    }
  }
  for (auto* s : states) {
    PyThreadState_Clear(s);
    PyThreadState_Delete(s);
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const rt::RankError& e) {
      py::handle cause;
      for (const auto& f : e.failures()) {
        if (f.rank >= 0 && f.rank < nprocs && causes[static_cast<std::size_t>(f.rank)]) {
          cause = causes[static_cast<std::size_t>(f.rank)];
          break;
        }
      }
      set_rank_error(e, cause);
      throw py::error_already_set();
    }
  }
  return rep;
}

struct CollectiveResult {
  py::list outputs;
  rt::RunReport report;
};

CollectiveResult run_collective(const CtxPtr& ctx, const std::string& name, const py::sequence& inputs,
                                const std::string& dtype_name, const std::string& op_name,
                                const py::object& root_arg,
                                const std::optional<std::string>& algorithm, std::optional<bool> accumulate_f32,
                                const py::object& hierarchy, bool bits) {
  const int root = static_cast<int>(int_arg(root_arg, "run_collective: root", 0, kIntMax));
  rt::CollectiveCase c{.collective = rt::parse_collective_kind(name),
                       .dtype = dtype_arg(dtype_name),
                       .op = rt::parse_reduce_op(op_name),
                       .root = root,
                       .options = coll_opts(std::nullopt, accumulate_f32, hierarchy, false)};
  if (algorithm) c.options.algorithm = rt::parse_algorithm_for(c.collective, *algorithm);
  const rt::Shape shape = arrays_to_bytes(inputs, c.dtype, "run_collective", c.inputs);
  c.count = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  rt::CollectiveOutcome out;
  {
    ReleaseGil nogil;
    out = rt::run_collective(*ctx, c);
  }
  const rt::Shape out_shape = rt::collective_output_shape(c.collective, shape, static_cast<int>(c.inputs.size()));
  CollectiveResult res;
  for (const auto& b : out.outputs) res.outputs.append(bytes_to_array(b, c.dtype, out_shape, bits));
  res.report = out.report;
  return res;
}

py::dict usage_dict(const hw::UnitUsage& u) {
  py::dict d;
  d["id"] = u.id.value;
  d["kind"] = std::string(hw::unit_kind_name(u.kind));
  d["name"] = u.name;
  d["cube"] = u.place.cube;
  d["pe"] = u.place.pe;
  d["from"] = u.place.from;
  d["to"] = u.place.to;
  d["bytes"] = u.bytes;
  d["pieces"] = u.pieces;
  d["busy_ps"] = u.busy;
  d["channel_busy_ps"] = u.channel_busy;
  d["hits"] = u.hits;
  d["misses"] = u.misses;
  d["fill_bytes"] = u.fill_bytes;
  d["writeback_bytes"] = u.writeback_bytes;
  return d;
}

// The share of the run's simulated time each unit of the first `cubes` cubes was busy, as the
// CLI's hardware table and its JSON show it (sim/hw/utilisation.h).
py::dict utilisation_dict(const rt::RunReport& r, const py::object& cubes) {
  // An int: the first `cubes` cubes; a list: those cubes (where a placement put the ranks).
  const hw::Utilisation u = py::isinstance<py::int_>(cubes)
                                ? hw::utilisation(r.usage(), r.sim_time, cubes.cast<int>())
                                : hw::utilisation(r.usage(), r.sim_time, cubes.cast<std::vector<int>>());
  py::list cs;
  for (const auto& c : u.cubes) {
    py::dict d;
    d["cube"] = c.cube;
    d["pe_mac"] = c.pe_mac;
    d["pe_vector"] = c.pe_vector;
    d["pe_dma_read"] = c.pe_dma_read;
    d["pe_dma_write"] = c.pe_dma_write;
    d["hbm_busiest_channel"] = c.hbm_busiest_channel;
    // The cube's L2 (no key where the cube has none): busy share, sectors read that hit and missed.
    if (c.has_l2) {
      py::dict l2;
      l2["busy"] = c.l2_busy;
      l2["hits"] = c.l2_hits;
      l2["misses"] = c.l2_misses;
      l2["hit_rate"] = c.l2_hits + c.l2_misses > 0 ? py::object(py::float_(c.l2_hit_rate)) : py::object(py::none());
      d["l2"] = l2;
    }
    cs.append(d);
  }
  py::dict links;
  links["directions"] = u.links.directions;
  links["active"] = u.links.active;
  links["busiest"] = u.links.busiest.empty() ? py::object(py::none()) : py::object(py::str(u.links.busiest));
  links["busiest_busy"] = u.links.busiest_busy;
  links["mean_busy_active"] = u.links.mean_busy_active;
  py::dict d;
  d["cubes"] = cs;
  d["links"] = links;
  py::dict ports;  // a switch's port groups (directions 0 without them)
  ports["directions"] = u.switch_ports.directions;
  ports["active"] = u.switch_ports.active;
  ports["busiest"] =
      u.switch_ports.busiest.empty() ? py::object(py::none()) : py::object(py::str(u.switch_ports.busiest));
  ports["busiest_busy"] = u.switch_ports.busiest_busy;
  ports["mean_busy_active"] = u.switch_ports.mean_busy_active;
  d["switch_ports"] = ports;
  return d;
}

py::dict report_dict(const rt::RunReport& r) {
  py::dict d;
  d["sim_time_ps"] = r.sim_time;
  d["wall_s"] = r.wall_s;
  d["events"] = r.events;
  d["event_hash"] = r.event_hash;
  py::list ranks;
  for (const auto& t : r.ranks) {
    py::dict x;
    x["rank"] = t.rank;
    x["compute_ps"] = t.compute;
    x["comm_ps"] = t.comm;
    x["finish_ps"] = t.finish;
    ranks.append(x);
  }
  d["ranks"] = ranks;
  py::list tracks;
  for (const auto& s : r.tracks) tracks.append(pyb::track_stats_dict(s));
  d["tracks"] = tracks;
  py::list usage;
  for (const auto& u : r.usage()) usage.append(usage_dict(u));
  d["usage"] = usage;
  d["notes"] = r.notes;
  return d;
}

}  // namespace

void bind_runtime(py::module_& m) {
  using sim::Trace;

  py::class_<rt::RankTimeline>(m, "RankTimeline", "Simulated time one rank spent, split by what it was doing.")
      .def_readonly("rank", &rt::RankTimeline::rank)
      .def_readonly("compute_ps", &rt::RankTimeline::compute, "Charged compute (GEMMs, elementwise), picoseconds.")
      .def_readonly("comm_ps", &rt::RankTimeline::comm,
                    "Inside collectives and send/recv (waiting included), picoseconds. Asynchronous collectives "
                    "overlap compute, so compute + comm can exceed finish.")
      .def_readonly("finish_ps", &rt::RankTimeline::finish, "When the rank's function returned, picoseconds.")
      .def("__repr__", [](const rt::RankTimeline& t) {
        return fmt::format("<RankTimeline rank {}: compute {}, comm {}, finish {}>", t.rank, sim::format_time(t.compute),
                           sim::format_time(t.comm), sim::format_time(t.finish));
      });

  py::class_<Trace::TrackStats>(m, "TrackStats", "Activity on one trace track: span count and busy time.")
      .def_readonly("name", &Trace::TrackStats::name)
      .def_readonly("group", &Trace::TrackStats::group, "'rank3', 'cube0', 'links', ...")
      .def_readonly("spans", &Trace::TrackStats::spans)
      .def_readonly("busy_ps", &Trace::TrackStats::busy, "Sum of span lengths, picoseconds.")
      .def("__repr__", [](const Trace::TrackStats& s) {
        return fmt::format("<TrackStats {}/{}: {} spans, busy {}>", s.group, s.name, s.spans, sim::format_time(s.busy));
      });

  py::class_<rt::RunReport>(m, "RunReport",
                          "What a run produced: simulated time (picoseconds), host wall time, events executed, "
                          "each rank's compute/communication split, and the per-track statistics of this run.")
      .def_property_readonly("sim_time_ps", [](const rt::RunReport& r) { return r.sim_time; },
                             "Simulated time when the last rank finished, picoseconds (0 on the host backend).")
      .def_property_readonly("sim_time_us", [](const rt::RunReport& r) { return sim::to_us(r.sim_time); })
      .def_property_readonly("wall_s", [](const rt::RunReport& r) { return r.wall_s; })
      .def_property_readonly("events", [](const rt::RunReport& r) { return r.events; })
      .def_property_readonly("event_hash", [](const rt::RunReport& r) { return r.event_hash; },
                             "The simulator's event-order fingerprint after the run: equal runs give equal hashes.")
      .def_property_readonly("ranks", [](const rt::RunReport& r) { return r.ranks; })
      .def_property_readonly("notes", [](const rt::RunReport& r) { return r.notes; },
                             "What the backend said about this run, each thing once: e.g. a tensor-core GEMM "
                             "whose operand the cuda backend could not read in place (repacked first, and why).")
      .def_property_readonly("tracks", [](const rt::RunReport& r) { return r.tracks; },
                             "Tracks with activity during this run (spans and busy time counted over this run).")
      .def_property_readonly("usage",
                             [](const rt::RunReport& r) {
                               py::list l;
                               for (const auto& u : r.usage()) l.append(usage_dict(u));
                               return l;
                             },
                             "What each hardware unit did during this run, from the units' counters (no trace "
                             "needed): one dict per unit (id, kind 'memory'|'dma_read'|'dma_write'|'link'|"
                             "'mac'|'vector', name, cube, pe, from, to, bytes (operations on a "
                             "compute unit), pieces, busy_ps (a memory: its busiest channel), channel_busy_ps, "
                             "hits, misses). Empty on backends that simulate no hardware.")
      .def("utilisation", &utilisation_dict, py::arg("cubes"),
           "How busy the hardware of the cubes was (an int: the first `cubes` cubes; a list: those cubes, e.g. "
           "ctx.ranks_on), as shares of sim_time_ps: per cube the mean over "
           "its PEs of the MAC array, vector unit and DMA channels and its busiest HBM channel; for the links "
           "among those cubes (and the switch) and the switch's port groups facing them (switch_ports), "
           "directions, active, busiest, busiest_busy, mean_busy_active.")
      .def("to_dict", &report_dict, "The report as plain values (for JSON).")
      .def("__repr__", [](const rt::RunReport& r) {
        return fmt::format("<RunReport sim_time {} ({} ranks, {} events, {:.3f} s wall)>", sim::format_time(r.sim_time),
                           r.ranks.size(), r.events, r.wall_s);
      });

  py::class_<rt::ProcessGroup>(m, "ProcessGroup",
                               "A set of ranks that run collectives together (Context.world(), Context.new_group()).")
      .def_property_readonly("id", &rt::ProcessGroup::id)
      .def_property_readonly("name", &rt::ProcessGroup::name)
      .def_property_readonly("ranks", &rt::ProcessGroup::ranks)
      .def_property_readonly("size", &rt::ProcessGroup::size)
      .def("index_of", &rt::ProcessGroup::index_of, py::arg("rank"), "Position of a global rank in the group, or -1.")
      .def("__contains__", &rt::ProcessGroup::contains)
      .def_property(
          "default_algorithm",
          [](const rt::ProcessGroup& g) -> std::optional<std::string> {
            if (!g.default_algorithm) return std::nullopt;
            return std::string(rt::algorithm_name(*g.default_algorithm));
          },
          [](rt::ProcessGroup& g, const std::optional<std::string>& a) {
            if (a) g.default_algorithm = rt::parse_algorithm(*a);
            else g.default_algorithm.reset();
          },
          "The algorithm collectives on this group use when a call names none (None: the context's).")
      .def("__repr__", [](const rt::ProcessGroup& g) { return "<ProcessGroup " + g.name() + ">"; });

  py::class_<rt::Work>(m, "Work", "The handle of a collective; a synchronous call returns a completed one.")
      .def("wait", &rt::Work::wait, py::call_guard<ReleaseGil>(),
           "Blocks the calling rank until the collective finished.")
      .def("is_completed", &rt::Work::is_completed);

  py::class_<PyTensor>(m, "Tensor",
                       "A strided view of f32/bf16/f16 elements on one rank (made by Context.tensor/empty/zeros, "
                       "or returned by layers).\n\n"
                       "numpy(): float32 values (exact widening of bf16/f16); numpy(bits=True): the stored bit "
                       "patterns, uint16 for bf16/f16 and uint32 for f32 (view uint16 f16 bits as numpy.float16 "
                       "with .view(numpy.float16)). Host access is untimed.")
      .def_property_readonly("shape", [](const PyTensor& t) { return py::tuple(py::cast(t.t.shape())); })
      .def_property_readonly("strides", [](const PyTensor& t) { return py::tuple(py::cast(t.t.strides())); },
                             "In elements.")
      .def_property_readonly("dtype", [](const PyTensor& t) { return dtype_str(t.t.dtype()); })
      .def_property_readonly("device", [](const PyTensor& t) { return t.t.device(); }, "The rank it lives on.")
      .def_property_readonly("numel", [](const PyTensor& t) { return t.t.numel(); })
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.t.nbytes(); })
      .def_property_readonly("ndim", [](const PyTensor& t) { return t.t.dim(); })
      .def("is_contiguous", [](const PyTensor& t) { return t.t.is_contiguous(); })
      .def("numpy", [](const PyTensor& t, bool bits) { return bytes_to_array(t.t.to_host_bytes(), t.t.dtype(), t.t.shape(), bits); },
           py::arg("bits") = false,
           "The values as a numpy array: float32 (exact), or with bits=True the raw bit patterns.")
      .def("__array__", [](const PyTensor& t, py::object dtype) {
             py::array a = bytes_to_array(t.t.to_host_bytes(), t.t.dtype(), t.t.shape(), false);
             return dtype.is_none() ? a : py::array(a.attr("astype")(dtype));
           }, py::arg("dtype") = py::none())
      .def("copy_from",
           [](const PyTensor& t, const py::object& src) {
             // numpy arrays, torch tensors (CPU), anything with __array__ or __dlpack__, nested lists.
             const std::string kind = py::type::of(src).attr("__name__").cast<std::string>();
             py::module_ np = py::module_::import("numpy");
             py::object arr;
             try {
               if (py::isinstance<py::array>(src)) {
                 arr = src;
               } else if (py::hasattr(src, "__array__") || !py::hasattr(src, "__dlpack__")) {
                 arr = np.attr("asarray")(src);
               } else {
                 arr = np.attr("from_dlpack")(src);
               }
             } catch (py::error_already_set& e) {
               throw py::type_error(fmt::format("copy_from: cannot read values from the source ({}: {}); give a "
                                                "numpy array, a CPU torch tensor or any object with __array__ or "
                                                "__dlpack__",
                                                kind, py::str(e.value()).cast<std::string>().substr(0, 200)));
             }
             const py::array a = py::reinterpret_borrow<py::array>(arr);
             const char k = a.dtype().kind();
             if (k != 'f' && k != 'i' && k != 'u' && k != 'b') {
               throw py::type_error(fmt::format("copy_from: cannot read numeric values from the source ({}, as numpy "
                                                "dtype '{}'); give a numpy array, a CPU torch tensor or any object "
                                                "with __array__ or __dlpack__ holding numbers",
                                                kind, py::str(a.dtype()).cast<std::string>()));
             }
             const rt::Shape shape(a.shape(), a.shape() + a.ndim());
             if (shape != t.t.shape()) {
               throw py::value_error(fmt::format("copy_from: the source ({}) has shape {} but the tensor {} has shape "
                                                 "{}; give values of the same shape (reshape or transpose the source "
                                                 "first: a transposed weight is not taken silently)",
                                                 kind, rt::shape_str(shape), t.t.describe(),
                                                 rt::shape_str(t.t.shape())));
             }
             const auto bytes = array_to_bytes(a, t.t.dtype(), "copy_from");
             t.t.copy_from_host_bytes(bytes.data(), bytes.size());
           },
           py::arg("array"),
           "Writes values into the tensor (untimed), converted to its dtype by the rules of Context.tensor. The "
           "source (a numpy array, a CPU torch tensor, or any object with __array__ or __dlpack__) must have the "
           "tensor's shape, like torch's Tensor.copy_ without broadcasting.")
      .def("narrow",
           [](const PyTensor& t, const py::object& d, const py::object& s, const py::object& n) {
             return PyTensor{t.t.narrow(int_arg(d, "narrow: dim", -64, 63), int_arg(s, "narrow: start", 0, kI64Max),
                                        int_arg(n, "narrow: length", 0, kI64Max)),
                             t.ctx};
           },
           py::arg("dim"), py::arg("start"), py::arg("length"), "A view of `length` entries of dimension `dim`.")
      .def("chunk",
           [](const PyTensor& t, const py::object& n, const py::object& d) {
             std::vector<PyTensor> out;
             for (auto& c : t.t.chunk(int_arg(n, "chunk: n", 1, kI64Max), int_arg(d, "chunk: dim", -64, 63))) {
               out.push_back(PyTensor{c, t.ctx});
             }
             return out;
           },
           py::arg("n"), py::arg("dim") = 0, "n equal views along dim (its size must divide by n).")
      .def("reshape",
           [](const PyTensor& t, const py::object& s) {
             return PyTensor{t.t.reshape(shape_arg(s, "reshape: shape")), t.ctx};
           },
           py::arg("shape"), "Contiguous tensors only.")
      .def("t", [](const PyTensor& t) { return PyTensor{t.t.t(), t.ctx}; }, "The transposed view of a 2-D tensor.")
      .def_property_readonly("T", [](const PyTensor& t) { return PyTensor{t.t.t(), t.ctx}; })
      .def("flatten", [](const PyTensor& t) { return PyTensor{t.t.flatten(), t.ctx}; })
      .def("__repr__", [](const PyTensor& t) { return "<cubesim.Tensor " + t.t.describe() + ">"; });

  py::class_<CollectiveResult>(m, "CollectiveResult", "Outputs of Context.run_collective, one array per rank, and the run report.")
      .def_readonly("outputs", &CollectiveResult::outputs)
      .def_readonly("report", &CollectiveResult::report);

  py::class_<rt::Context, CtxPtr>(m, "Context",
                                  "A backend plus the ranks that run on it: the runtime's entry point.\n\n"
                                  "  ctx = cubesim.Context('sim', topology='ring4')      # one rank per cube\n"
                                  "  ctx = cubesim.Context('host', world_size=4)         # the reference, no time\n"
                                  "  report = ctx.spawn(lambda rank: ...)                # fn(rank) on every rank\n\n"
                                  "backend: a name from backend_info() (one that cannot run here raises "
                                  "BackendUnavailableError saying why). world_size 0 (sim): one rank per "
                                  "cube. topology (sim only): a name, a path or a Topology (from load_topology; "
                                  "default single_cube); overrides (dict of dotted paths) go with a name or path. "
                                  "Backend options (None: the backend's default; a backend rejects those it does not "
                                  "take): timing_only (no values, same times), timing ('chunk' | 'flow': transfers as flows through "
                                  "FIFO queues of fluid, faster for large messages; needs timing_only), check_uninitialized, hazards ('throw' "
                                  "| 'record' | 'off') and ranks_on (a list of cube ids: rank r runs on cube ranks_on[r]; default rank r "
                                  "on cube r) for sim; gemm_mode ('exact' | 'tensor_core') and "
                                  "cuda_collectives ('ring' | 'nccl') and share_gpus (more ranks than GPUs: rank r on GPU "
                                  "r % GPUs, each its own stream) for cuda. gemm_numerics ('f32_fma_seq' | "
                                  "'pairwise' | 'bf16_acc' | 'hopper_tc') for sim and host: the GEMMs' accumulator "
                                  "model (kernels/accumulator.h; f32_fma_seq is the numerics contract). trace records "
                                  "spans for save_trace(). "
                                  "algorithm, accumulate_f32, hierarchy: collective defaults. stack_size: bytes per "
                                  "rank process (Python rank functions need room; 1 MiB by default). record_ops keeps "
                                  "a record of every GEMM and collective (op_records()).")
      .def(py::init(&make_context), py::arg("backend") = "sim", py::arg("world_size") = 0, py::kw_only(),
           py::arg("topology") = py::none(), py::arg("overrides") = py::none(), py::arg("timing_only") = py::none(),
           py::arg("check_uninitialized") = py::none(), py::arg("hazards") = py::none(), py::arg("trace") = false,
           py::arg("algorithm") = "ring", py::arg("accumulate_f32") = false, py::arg("hierarchy") = 0,
           py::arg("stack_size") = 1024 * 1024, py::arg("record_ops") = false, py::arg("gemm_mode") = py::none(),
           py::arg("cuda_collectives") = py::none(), py::arg("ranks_on") = py::none(), py::arg("timing") = py::none(),
           py::arg("gemm_numerics") = py::none(), py::arg("share_gpus") = py::none())
      .def_property_readonly("backend", [](rt::Context& c) { return std::string(c.backend().name()); })
      .def_property_readonly("world_size", &rt::Context::world_size)
      .def_property_readonly("timing_only", [](rt::Context& c) { return c.backend().timing_only(); })
      .def_property_readonly(
          "timing",
          [](rt::Context& c) -> py::object {
            auto* sb = dynamic_cast<rt::SimBackend*>(&c.backend());
            if (!sb) return py::none();
            return py::str(std::string(hw::timing_model_name(sb->timing())));
          },
          "How transfers are timed on a sim context: 'chunk' or 'flow' (None on backends that simulate nothing).")
      .def_property_readonly("measures_time", [](rt::Context& c) { return c.backend().measures_time(); },
                             "Whether the backend measures real time (cuda: CUDA events; see measured_totals()).")
      .def_property_readonly("trace_enabled", [](rt::Context& c) { return c.trace().enabled(); })
      .def_property_readonly("now_ps", [](rt::Context& c) { return c.simulator().now(); },
                             "Simulated time so far (runs follow one another on one clock).")
      .def_property_readonly("topology",
                             [](rt::Context& c) -> py::object {
                               const hw::Topology* t = c.backend().topology();
                               return t ? py::cast(*t) : py::object(py::none());
                             },
                             "The Topology of a sim context (None for host).")
      .def_property_readonly("ranks_on",
                             [](rt::Context& c) {
                               std::vector<int> v;
                               for (int r = 0; r < c.world_size(); ++r) v.push_back(c.backend().device_of(r));
                               return v;
                             },
                             "The device (sim: cube) each rank runs on, by rank.")
      .def("describe", [](rt::Context& c) { return c.backend().describe(); })
      .def("__repr__", [](rt::Context& c) {
        return fmt::format("<cubesim.Context {} ({} ranks)>", c.backend().describe(), c.world_size());
      })
      .def("spawn", &py_spawn, py::arg("fn"), py::arg("nprocs") = py::none(),
           "Runs fn(rank) for rank in range(nprocs) (default: every rank), each as a simulated process, and returns "
           "a RunReport. Blocking calls inside fn (collectives, ops, layers, Work.wait) yield to the other ranks; "
           "the GIL is released while C++ runs. An exception in any rank stops its siblings and raises RankError "
           "naming each failing rank, with the rank's Python exception as __cause__.")
      .def("empty",
           [](const CtxPtr& c, const py::object& rank, const py::object& shape, const std::string& dtype) {
             const int r = static_cast<int>(int_arg(rank, "empty: rank", 0, c->world_size() - 1));
             return wrap(c, c->empty(r, shape_arg(shape, "empty: shape"), dtype_arg(dtype), "empty"));
           },
           py::arg("rank"), py::arg("shape"), py::arg("dtype") = "f32",
           "An uninitialised tensor on `rank`. A shape of more than 2^48 bytes (cubesim's largest tensor) raises "
           "ValueError.")
      .def("zeros",
           [](const CtxPtr& c, const py::object& rank, const py::object& shape, const std::string& dtype) {
             const int r = static_cast<int>(int_arg(rank, "zeros: rank", 0, c->world_size() - 1));
             return wrap(c, c->zeros(r, shape_arg(shape, "zeros: shape"), dtype_arg(dtype), "zeros"));
           },
           py::arg("rank"), py::arg("shape"), py::arg("dtype") = "f32", "A tensor of zeros on `rank` (as empty).")
      .def("tensor",
           [](const CtxPtr& c, int rank, const py::array& a, const std::optional<std::string>& dtype) {
             DType dt = DType::f32;
             if (dtype) dt = dtype_arg(*dtype);
             else if (a.dtype().kind() == 'f' && a.itemsize() == 2) dt = DType::f16;
             else if (a.dtype().kind() == 'u' && a.itemsize() == 2) {
               throw py::value_error("tensor: a uint16 array holds bf16 or f16 bit patterns; say which with "
                                     "dtype='bf16' or dtype='f16'");
             }
             const auto bytes = array_to_bytes(a, dt, "tensor");
             rt::Shape shape(a.shape(), a.shape() + a.ndim());
             return wrap(c, c->from_host_bytes(rank, shape, dt, bytes.data(), bytes.size()));
           },
           py::arg("rank"), py::arg("array"), py::arg("dtype") = py::none(),
           "A tensor on `rank` holding the array's values (untimed).\n\n"
           "Conversion: float and integer arrays are converted by value: to float32 first (float64 rounds once "
           "there), then rounded to nearest even to dtype (bf16/f16, as CUDA's __float2bfloat16_rn/"
           "__float2half_rn). uint16 arrays are taken as bf16/f16 bit patterns and uint32 arrays as f32 bit "
           "patterns, unchanged. dtype defaults to 'f16' for float16 arrays and 'f32' otherwise.")
      .def("world", &rt::Context::world, py::return_value_policy::reference_internal)
      .def("new_group", &rt::Context::new_group, py::arg("ranks"), py::return_value_policy::reference_internal,
           "The group of these global ranks (the same ranks again return the same group). Like "
           "torch.distributed.new_group, the ranks are sorted: new_group([3, 1]).ranks is [1, 3], and all_gather "
           "and reduce_scatter on it lay out rank 1's chunk before rank 3's.")
      .def("run_collective", &run_collective, py::arg("name"), py::arg("inputs"), py::kw_only(), py::arg("dtype") = "f32",
           py::arg("op") = "sum", py::arg("root") = 0, py::arg("algorithm") = py::none(),
           py::arg("accumulate_f32") = py::none(), py::arg("hierarchy") = 0, py::arg("bits") = false,
           "Runs one collective ('all_reduce', 'all_gather', 'reduce_scatter', 'broadcast') on ranks "
           "0..len(inputs)-1, rank k contributing inputs[k] (numpy arrays of one shape, converted to dtype as "
           "Context.tensor does), and returns a CollectiveResult: outputs (one float32 array per rank, or bit "
           "patterns with bits=True) and report. all_gather concatenates along the first dimension; reduce_scatter "
           "gives rank k chunk k of the reduction.")
      .def("op_records",
           [](rt::Context& c) {
             py::list l;
             for (const auto& r : c.op_records()) {
               py::dict d;
               d["rank"] = r.rank;
               d["kind"] = r.kind;
               d["name"] = r.name;
               d["detail"] = r.detail;
               d["start_ps"] = r.start;
               d["end_ps"] = r.end;
               const double s = r.region ? c.backend().measured_seconds(r.region) : -1.0;
               d["measured_s"] = s >= 0 ? py::object(py::float_(s)) : py::object(py::none());
               l.append(d);
             }
             return l;
           },
           "With record_ops=True: every GEMM and collective of the last run, per rank in program order, as dicts "
           "(rank, kind 'gemm'|'collective', name, detail, start_ps, end_ps in simulated time, measured_s: seconds "
           "measured by CUDA events on the cuda backend, else None).")
      .def("measured_totals",
           [](rt::Context& c, int ranks) {
             py::list l;
             for (const auto& m : c.measured_totals(ranks)) {
               py::dict d;
               d["rank"] = m.rank;
               d["gemm_s"] = m.gemm_s;
               d["gemms"] = m.gemms;
               d["collective_s"] = m.collective_s;
               d["collectives"] = m.collectives;
               l.append(d);
             }
             return l;
           },
           py::arg("ranks"),
           "With record_ops=True on a backend that measures (cuda): per rank 0..ranks-1 of the last run, the "
           "seconds CUDA events measured for its GEMMs and collectives, and how many (dicts: rank, gemm_s, gemms, "
           "collective_s, collectives).")
      .def("trace_stats", [](rt::Context& c) { return c.trace().stats(); },
           "Every track's statistics since the context was made (kept even when trace=False).")
      .def("save_trace", [](rt::Context& c, const std::string& path) { c.trace().save(path); }, py::arg("path"),
           "Writes the recorded spans as Chrome/Perfetto trace JSON (open in ui.perfetto.dev): a process row per "
           "group (rankN, cubeN, links), a thread row per track.")
      .def("declare_tracks", &rt::Context::declare_tracks,
           "Names the tracks of every rank and of the hardware they run on (each cube's HBM, each PE's MAC, "
           "vector unit and DMA read/write channels, the links among the ranks' cubes and the switch), so a saved "
           "trace shows the whole machine; spans appear only where something ran.")
      .def("declare_hardware_tracks", &rt::Context::declare_tracks, "The former name of declare_tracks().");

  m.def("backends", [] {
    py::dict d;
    for (const rt::BackendInfo* b : rt::backends()) d[py::str(std::string(b->name))] = b->unavailable().empty();
    return d;
  }, "Which backends can run here, by name (the registry: runtime/backend_registry.h); backend_info() says why not.");
  m.attr("DEFAULT_TOPOLOGY") = rt::kDefaultTopology;
  m.def("backend_info", [] {
    py::list l;
    for (const rt::BackendInfo* b : rt::backends()) {
      py::dict d;
      d["name"] = std::string(b->name);
      d["summary"] = std::string(b->summary);
      d["options"] = std::string(b->options);
      d["simulates"] = b->simulates;
      d["devices"] = b->devices();
      const std::string why = b->unavailable();
      d["available"] = why.empty();
      d["why_not"] = why.empty() ? py::object(py::none()) : py::object(py::str(why));
      l.append(d);
    }
    return l;
  }, "Every backend of the registry: name, summary, the options it takes, simulates (it takes a topology and its "
     "ranks are the cubes), devices (ranks it offers here without a topology; -1: any number), whether it can run "
     "here and why not.");
  m.def("cuda_built", [] {
#ifdef CUBESIM_PY_HAVE_CUDA
    return true;
#else
    return false;
#endif
  }, "Whether this build has the cuda backend.");
  m.def("cuda_device_count", [] {
#ifdef CUBESIM_PY_HAVE_CUDA
    return rt::cuda_device_count();
#else
    return 0;
#endif
  }, "GPUs the cuda backend can use (0 without a CUDA build, driver or GPU).");

  // ---- collectives: called from inside a rank function ----
  m.def("all_reduce",
        [](const PyTensor& t, const std::string& op, rt::ProcessGroup* g, std::optional<std::string> alg,
           std::optional<bool> acc, const py::object& hier, bool async_op) {
          const auto o = coll_opts(alg, acc, hier, async_op);
          const auto rop = rt::parse_reduce_op(op);
          ReleaseGil nogil;
          return rt::all_reduce(t.t, rop, g, o);
        },
        py::arg("tensor"), py::arg("op") = "sum", py::arg("group") = nullptr, py::arg("algorithm") = py::none(),
        py::arg("accumulate_f32") = py::none(), py::arg("hierarchy") = 0, py::arg("async_op") = false,
        "In place: every member's tensor becomes the reduction ('sum' or 'max') over the group (default: the "
        "world). algorithm: a name from algorithms(). Returns Work.");
  m.def("all_gather",
        [](const PyTensor& out, const PyTensor& in, rt::ProcessGroup* g, std::optional<std::string> alg,
           std::optional<bool> acc, const py::object& hier, bool async_op) {
          const auto o = coll_opts(alg, acc, hier, async_op);
          ReleaseGil nogil;
          return rt::all_gather(out.t, in.t, g, o);
        },
        py::arg("out"), py::arg("input"), py::arg("group") = nullptr, py::arg("algorithm") = py::none(),
        py::arg("accumulate_f32") = py::none(), py::arg("hierarchy") = 0, py::arg("async_op") = false,
        "out (p*n elements) = the members' inputs (n elements each) in group order.");
  m.def("reduce_scatter",
        [](const PyTensor& out, const PyTensor& in, const std::string& op, rt::ProcessGroup* g,
           std::optional<std::string> alg, std::optional<bool> acc, const py::object& hier, bool async_op) {
          const auto o = coll_opts(alg, acc, hier, async_op);
          const auto rop = rt::parse_reduce_op(op);
          ReleaseGil nogil;
          return rt::reduce_scatter(out.t, in.t, rop, g, o);
        },
        py::arg("out"), py::arg("input"), py::arg("op") = "sum", py::arg("group") = nullptr,
        py::arg("algorithm") = py::none(), py::arg("accumulate_f32") = py::none(), py::arg("hierarchy") = 0,
        py::arg("async_op") = false, "out (n elements) = this member's chunk of the reduction of the inputs (p*n each).");
  m.def("broadcast",
        [](const PyTensor& t, const py::object& root_arg, rt::ProcessGroup* g, std::optional<std::string> alg,
           bool async_op) {
          const int root = static_cast<int>(int_arg(root_arg, "broadcast: root", 0, kIntMax));
          const auto o = coll_opts(alg, std::nullopt, py::int_(0), async_op);
          ReleaseGil nogil;
          return rt::broadcast(t.t, root, g, o);
        },
        py::arg("tensor"), py::arg("root"), py::arg("group") = nullptr, py::arg("algorithm") = py::none(),
        py::arg("async_op") = false, "Every member's tensor becomes the root's (root: a global rank).");
  m.def("barrier", &rt::barrier, py::arg("group") = nullptr, py::call_guard<ReleaseGil>());
  m.def("send", [](const PyTensor& t, const py::object& dst_arg, const py::object& tag_arg, rt::ProcessGroup* g) {
          const int dst = static_cast<int>(int_arg(dst_arg, "send: dst", 0, kIntMax));
          const int tag = static_cast<int>(int_arg(tag_arg, "send: tag", kIntMin, kIntMax));
          ReleaseGil nogil;
          rt::send(t.t, dst, tag, g);
        },
        py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, py::arg("group") = nullptr,
        "Blocks until the data has landed at dst's matching recv.");
  m.def("recv", [](const PyTensor& t, const py::object& src_arg, const py::object& tag_arg, rt::ProcessGroup* g) {
          const int src = static_cast<int>(int_arg(src_arg, "recv: src", 0, kIntMax));
          const int tag = static_cast<int>(int_arg(tag_arg, "recv: tag", kIntMin, kIntMax));
          ReleaseGil nogil;
          rt::recv(t.t, src, tag, g);
        },
        py::arg("tensor"), py::arg("src"), py::arg("tag") = 0, py::arg("group") = nullptr);
  m.def("algorithms",
        [] {
          py::list rows;
          for (const rt::algo::Row& r : rt::algo::rows()) {
            py::list colls;
            for (rt::algo::Collective k : rt::algo::kCollectives) {
              if (r.supports(k)) colls.append(std::string(rt::collective_kind_name(k)));
            }
            py::dict d;
            d["name"] = std::string(r.name);
            d["collectives"] = colls;
            d["summary"] = std::string(r.summary);
            rows.append(d);
          }
          return rows;
        },
        "The collective algorithms, one dict per row of runtime/algorithms/table.h: name, collectives (those it "
        "does), summary.");
  m.def("supported_algorithms",
        [](const std::string& coll) {
          std::vector<std::string> v;
          for (auto a : rt::supported_algorithms(coll)) v.emplace_back(rt::algorithm_name(a));
          return v;
        },
        py::arg("collective"), "Algorithms a collective supports, e.g. supported_algorithms('all_gather').");
  m.def("nccl_plan",
        [](const std::string& coll, const py::object& ranks_arg, const py::object& bytes_arg,
           const py::object& topology) {
          const int ranks = static_cast<int>(int_arg(ranks_arg, "nccl_plan: ranks", 1, 1 << 20));
          const std::uint64_t bytes = u64_arg(bytes_arg, "nccl_plan: bytes");
          const rt::CollectiveRequest::Kind k = rt::parse_collective_kind(coll);
          std::optional<hw::Topology> t;
          if (py::isinstance<hw::Topology>(topology)) t = topology.cast<hw::Topology>();
          else if (py::isinstance<py::str>(topology)) t = hw::load_topology(topology.cast<std::string>());
          const hw::NcclSpec& spec = t && t->nccl.present ? t->nccl : hw::NcclSpec::defaults();
          const rt::algo::NcclPlan pl = rt::algo::nccl_plan(k, ranks, bytes, spec);
          py::dict d;
          d["algorithm"] = std::string(rt::algo::nccl_algo_name(pl.algo));
          d["protocol"] = std::string(hw::nccl_protocol_name(pl.protocol));
          d["channels"] = pl.channels;
          d["predicted_us"] = pl.predicted_us;
          d["plan"] = pl.describe();
          return d;
        },
        py::arg("collective"), py::arg("ranks"), py::arg("bytes"), py::arg("topology") = py::none(),
        "What the nccl algorithm runs for one call (runtime/algorithms/nccl.h): a dict of algorithm ('ring', "
        "'tree'), protocol ('LL', 'LL128', 'Simple'), channels, predicted_us (NCCL's model) and plan, from the "
        "topology's nccl section (a name, a path or a Topology; none or no section: NCCL's defaults). bytes: the "
        "buffer (all_gather: the gathered one, reduce_scatter: the whole input).");
  m.def("current_rank", [] { return rt::Context::current_rank("cubesim.current_rank()"); },
        "The calling rank, inside a rank function.");

  // ---- ops: inside a rank function; time is charged on sim ----
  m.def("matmul",
        [](const PyTensor& a, const PyTensor& b, const PyTensor& c, const PyTensor* bias, const std::string& name) {
          ReleaseGil nogil;
          rt::matmul(a.t, b.t, bias ? &bias->t : nullptr, c.t, name.c_str());
        },
        py::arg("a"), py::arg("b"), py::arg("out"), py::arg("bias") = nullptr, py::arg("name") = "gemm",
        "out[M,N] = a[M,K] . b[K,N] (+ bias[N]) under the numerics contract (det_gemm). Views work: "
        "matmul(x, w.t(), y) is y = x . w^T.");
  m.def("bias_grad", [](const PyTensor& dy, const PyTensor& db) {
          ReleaseGil nogil;
          rt::bias_grad(dy.t, db.t);
        },
        py::arg("dy"), py::arg("db"), "db[n] = sum over m of dy[m, n], ascending m.");
  m.def("gelu", [](const PyTensor& x, const PyTensor& y, const std::string& kind) {
          const auto k = kernels::parse_gelu_kind(kind);
          ReleaseGil nogil;
          rt::gelu(k, x.t, y.t);
        },
        py::arg("x"), py::arg("out"), py::arg("kind") = "tanh", "out = gelu(x); kind 'tanh' or 'erf'.");
  m.def("gelu_backward", [](const PyTensor& x, const PyTensor& dy, const PyTensor& dx, const std::string& kind) {
          const auto k = kernels::parse_gelu_kind(kind);
          ReleaseGil nogil;
          rt::gelu_backward(k, x.t, dy.t, dx.t);
        },
        py::arg("x"), py::arg("dy"), py::arg("dx"), py::arg("kind") = "tanh");
  m.def("add_bias", [](const PyTensor& x, const PyTensor& b, const PyTensor& y) {
          ReleaseGil nogil;
          rt::add_bias(x.t, b.t, y.t);
        },
        py::arg("x"), py::arg("bias"), py::arg("out"), "out = x + bias (per column).");
  m.def("add", [](const PyTensor& a, const PyTensor& b, const PyTensor& y) {
          ReleaseGil nogil;
          rt::add(a.t, b.t, y.t);
        },
        py::arg("a"), py::arg("b"), py::arg("out"));
  m.def("copy", [](const PyTensor& src, const PyTensor& dst) {
          ReleaseGil nogil;
          rt::copy(src.t, dst.t);
        },
        py::arg("src"), py::arg("dst"), "A timed device copy (same shape and dtype).");
}
