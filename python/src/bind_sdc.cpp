// Silent-data-corruption bindings (sdc/sdc.h, sdc/campaign.h, kernels/checksum.h): recipes, results
// and campaigns cross as JSON documents (Python dicts), so this unit instantiates little of pybind11.
// cubesim.sdc (python/cubesim/sdc.py) is the Python API over these.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include "common.h"
#include "kernels/checksum.h"
#include "runtime/backend_registry.h"
#include "sdc/campaign.h"
#include "sdc/sdc.h"
#include "sim/hw/fault.h"

namespace py = pybind11;
using namespace cubesim;
using namespace cubesim::pyb;

namespace {

sdc::Recipe recipe_arg(const py::handle& doc, const char* origin) {
  return sdc::parse_recipe(to_json(doc, "recipe"), origin);
}

}  // namespace

void bind_sdc(py::module_& m) {
  m.def("_sdc_default_recipe", [] { return from_json(sdc::recipe_to_json(sdc::Recipe{})); });
  m.def(
      "_sdc_recipe",
      [](const py::handle& doc, const std::vector<std::string>& sets, const std::string& origin) {
        nlohmann::json d = to_json(doc, "recipe");
        sdc::apply_overrides(d, sets, origin);
        return from_json(sdc::recipe_to_json(sdc::parse_recipe(d, origin)));
      },
      py::arg("doc"), py::arg("sets"), py::arg("origin"));
  m.def(
      "_sdc_validate",
      [](const py::handle& doc, int world_size, const hw::Topology* topo) {
        sdc::validate(recipe_arg(doc, "recipe"), world_size, topo);
      },
      py::arg("recipe"), py::arg("world_size"), py::arg("topology"));
  m.def(
      "_sdc_run",
      [](const std::shared_ptr<rt::Context>& ctx, const py::handle& doc, const std::string& origin) {
        const sdc::Recipe r = recipe_arg(doc, origin.c_str());
        nlohmann::json out;
        {
          ReleaseGil nogil;
          out = sdc::result_to_json(sdc::run(*ctx, r));
        }
        return from_json(out);
      },
      py::arg("ctx"), py::arg("recipe"), py::arg("origin"));
  m.def(
      "_sdc_campaign",
      [](const hw::Topology& topo, const py::handle& doc, const py::handle& faults, const py::handle& seed,
         const py::handle& clean_runs, const py::handle& threads, const std::vector<std::string>& sites,
         const py::object& progress, bool outcomes, const std::string& backend, const py::handle& world_size,
         const py::dict& backend_options) {
        const sdc::Recipe r = recipe_arg(doc, "recipe");
        sdc::CampaignOptions o;
        if (backend != "sim") {
          const rt::BackendInfo& info = rt::find_backend(backend);  // RuntimeError listing the names
          if (info.simulates)
            throw py::value_error(fmt::format("campaign: backend '{}' simulates a system: give it as the topology's "
                                              "campaign (backend 'sim')", backend));
          rt::ContextOptions co;
          co.world_size = static_cast<int>(int_arg(world_size, "world_size", 0, 1 << 16));
          rt::BackendArgs args;
          args.options = to_json(backend_options, "backend_options");
          // A context reused over thousands of runs: no timing events piling up (cuda keeps them).
          if (info.name == "cuda" && !args.options.contains("measure")) args.options["measure"] = false;
          o.make_context = [name = std::string(info.name), co, args] { return rt::make_context(name, co, args); };
        }
        o.faults = static_cast<std::uint64_t>(int_arg(faults, "faults", 0, 10'000'000));
        o.seed = u64_arg(seed, "seed");
        o.clean_runs = static_cast<std::uint64_t>(int_arg(clean_runs, "clean_runs", 0, 1'000'000));
        o.threads = static_cast<int>(int_arg(threads, "threads", 0, 1024));
        if (backend == "cuda") o.threads = 1;  // one context on the GPUs, run after run
        o.sites.clear();
        for (const auto& s : sites) o.sites.push_back(hw::parse_fault_site(s, "sites"));
        if (!progress.is_none()) {
          o.progress = [&progress](std::uint64_t done, std::uint64_t total) {
            py::gil_scoped_acquire gil;
            progress(done, total);
          };
        }
        nlohmann::json out;
        {
          ReleaseGil nogil;
          out = sdc::campaign_to_json(sdc::run_campaign(topo, r, o), outcomes);
        }
        return from_json(out);
      },
      py::arg("topology"), py::arg("recipe"), py::arg("faults"), py::arg("seed"), py::arg("clean_runs"),
      py::arg("threads"), py::arg("sites"), py::arg("progress"), py::arg("outcomes"), py::arg("backend") = "sim",
      py::arg("world_size") = 0, py::arg("backend_options") = py::dict());
  m.def(
      "checksum",
      [](const py::array& a, const std::string& dtype, const std::string& kind, const py::handle& base) {
        const DType d = dtype_arg(dtype);
        const kernels::ChecksumKind k = kernels::parse_checksum_kind(kind);
        const auto bytes = array_to_bytes(a, d, "checksum");
        return kernels::checksum(bytes.data(), d, static_cast<std::int64_t>(bytes.size() / dtype_size(d)), k,
                                 u64_arg(base, "base"));
      },
      py::arg("array"), py::arg("dtype"), py::arg("kind") = "word", py::arg("base") = 0,
      "The exact checksum of an array's elements in dtype (kernels/checksum.h): 'word' sums the words "
      "(16-bit as int16, f32 as int32) modulo 2^64; 'mix' is position-sensitive (catches swapped words). "
      "Arrays convert as det_gemm's operands do (uint16: bf16/f16 bits, uint32: f32 bits, others by value). "
      "base: the index of the first element in a larger tensor (mix sums of pieces add up to the whole's).");
}
