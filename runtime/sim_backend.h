// sim_backend.h — the simulated backend: ranks are cubes of a topology.
//
// Rank r runs on cube r, or on cubes[r] when SimBackendOptions::cubes places the ranks (a 4-GPU
// machine that is half of an 8-GPU board: h200x8 with cubes {0, 1, 2, 3}). Rank r's tensors live
// in its cube's HBM (real bytes, sparsely backed); Backend::copy is a
// hw::System transfer through the simulated route; GEMMs run tile by tile on the cube's PEs
// (operands through TCM by DMA, kernels/sim_pe_gemm.h); other compute is done on the host by the
// same kernels as the host backend (so the values are bit-identical) and its time is charged from
// the cube's figures (a roofline of the PEs' vector rate against HBM). With timing_only, no values are kept and every time is unchanged;
// timing = flow (timing only) times transfers as flows through FIFO queues of fluid instead of chunk
// by chunk: faster for large messages, within a few percent (docs/PERFORMANCE.md has the table).
//
//   auto ctx = make_sim_context({.trace = true}, hw::load_topology("ring4"));
//   // sweeps: make_sim_context({}, hw::load_topology("ring4", {{"network.link.bandwidth_GBps", 64}}),
//   //                          {.timing_only = true});
//   auto rep = ctx->spawn(4, [&](int r) { ... all_reduce(t) ... });
//   // rep.sim_time, rep.ranks[r].compute / .comm; ctx->trace().save("run.json")
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/backend.h"
#include "runtime/context.h"
#include "sim/hw/system.h"

namespace cubesim::rt {

// The topology a sim context runs when none is given (the smallest shipped system).
inline constexpr const char* kDefaultTopology = "single_cube";

// How the backend runs; what it runs on is the hw::Topology given next to these (built once, by
// hw::load_topology with any overrides, by whoever chose it).
struct SimBackendOptions {
  bool timing_only = false;
  // How transfers are timed: chunk by chunk (the reference) or as flows through FIFO queues of
  // fluid (hw::TimingModel; flow needs timing_only, RuntimeError otherwise).
  hw::TimingModel timing = hw::TimingModel::chunk;
  bool check_uninitialized = false;  // reading HBM never written is an error
  hw::HazardMode hazards = hw::HazardMode::kThrow;
  // Rank placement: rank r runs on cube cubes[r]; empty: rank r on cube r, one rank per cube.
  // Each cube at most once and within the topology (RuntimeError otherwise, naming the option
  // `cubes`, Python's ranks_on and the CLI's --cubes).
  std::vector<int> cubes = {};
};

// Checks a rank placement against a topology: RuntimeError naming `what` (the option, argument or
// flag), the bad entry and the topology's cube range.
void check_placement(const std::vector<int>& cubes, const hw::Topology& topo, std::string_view what);

class SimStorage final : public Storage {
 public:
  SimStorage(int rank, std::uint64_t bytes, hw::Memory& mem, std::uint64_t addr);
  ~SimStorage() override;
  void read(std::uint64_t offset, void* dst, std::uint64_t n) const override;
  void write(std::uint64_t offset, const void* src, std::uint64_t n) override;
  std::string where() const override;
  hw::MemRef at(std::uint64_t offset) const { return hw::MemRef{mem_, addr_ + offset}; }
  hw::Memory& memory() const { return *mem_; }
  std::uint64_t addr() const { return addr_; }

 private:
  hw::Memory* mem_;
  std::uint64_t addr_;
};

class SimBackend final : public Backend {
 public:
  SimBackend(hw::Topology topo, SimBackendOptions opts);
  void attach(sim::Simulator& sim) override;
  std::string_view name() const override { return "sim"; }
  const hw::Topology* topology() const override { return &topo_; }
  int ranks() const override {
    return static_cast<int>(opts_.cubes.empty() ? topo_.cubes.size() : opts_.cubes.size());
  }
  int device_of(int rank) const override {
    return opts_.cubes.empty() ? rank : opts_.cubes.at(static_cast<std::size_t>(rank));
  }
  std::string describe() const override;
  std::shared_ptr<Storage> allocate(int rank, std::uint64_t bytes, std::string_view what) override;
  void copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n) override;
  void start_copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n,
                  hw::WireScale wire, hw::OnLanded landed) override;
  bool simulates_time() const override { return true; }
  void delay(int rank, sim::Duration d, std::string_view what) override;
  void charge(int rank, const OpCost& cost, sim::Duration overlapped_with) override;
  // dst = op(dst, src) in the simulated memory's pages, with no copy out and back (hw::Memory::combine).
  bool reduce(const Tensor& dst, const Tensor& src, ReduceOp op) override;
  sim::Duration charge_time(int rank, const OpCost& cost) const override { return cost_time(rank, cost); }
  // GEMMs run on the rank's cube's PEs (kernels/sim_pe_gemm.h): tiles through TCM by DMA.
  bool gemm(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) override;
  // On the PEs of the rank's cube (kernels/sim_pe_attention.h); values from the host definition.
  bool attention(const AttentionRequest& r) override;
  bool timing_only() const override { return opts_.timing_only; }
  hw::TimingModel timing() const { return opts_.timing; }
  std::shared_ptr<const std::vector<hw::UnitInfo>> units() const override { return system_->units(); }
  std::vector<hw::UnitCounters> counters() const override { return system_->counters(); }
  void declare_tracks(int ranks) override;
  int rank_of_helper(std::string_view process_name) const override;  // "cube3.pe0/..." -> the rank on cube 3
  void abandon_run() override;
  // Reductions reach the system's fault injector (hw::FaultSite::reduce) here; GEMM tiles reach it
  // from the PEs (kernels/sim_pe_gemm.h).
  void fault_point(FaultPoint p, const Tensor& t) override;
  FaultReplay* fault_replay() override { return nullptr; }  // faults go to system().faults()

  hw::System& system() { return *system_; }
  // The time `cost` takes on rank `rank`'s cube (roofline of its PEs' MAC or vector rate against HBM).
  sim::Duration cost_time(int rank, const OpCost& cost) const;

 private:
  hw::Topology topo_;
  SimBackendOptions opts_;
  std::unique_ptr<hw::System> system_;
  sim::Simulator* sim_ = nullptr;
};

// A context on a simulated topology; world_size 0 means one rank per cube.
std::unique_ptr<Context> make_sim_context(ContextOptions ctx_opts, hw::Topology topology, SimBackendOptions sim_opts = {});

}  // namespace cubesim::rt
