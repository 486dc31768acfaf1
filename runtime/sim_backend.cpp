#include "runtime/sim_backend.h"

#include <algorithm>

#include <map>

#include <fmt/format.h>

#include "kernels/sim_pe_attention.h"
#include "kernels/reduce.h"
#include "kernels/sim_pe_gemm.h"
#include "runtime/backend_info.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"

namespace cubesim::rt {

SimStorage::SimStorage(int rank, std::uint64_t bytes, hw::Memory& mem, std::uint64_t addr)
    : Storage(rank, bytes), mem_(&mem), addr_(addr) {}

SimStorage::~SimStorage() { mem_->free(addr_); }

void SimStorage::read(std::uint64_t offset, void* dst, std::uint64_t n) const {
  if (n) mem_->read(addr_ + offset, std::span<std::byte>(static_cast<std::byte*>(dst), n));
}
void SimStorage::write(std::uint64_t offset, const void* src, std::uint64_t n) {
  if (n) mem_->write(addr_ + offset, std::span<const std::byte>(static_cast<const std::byte*>(src), n));
}
std::string SimStorage::where() const { return fmt::format("{} @ {:#x}", mem_->name(), addr_); }

void check_placement(const std::vector<int>& cubes, const hw::Topology& topo, std::string_view what) {
  const int n = static_cast<int>(topo.cubes.size());
  for (std::size_t r = 0; r < cubes.size(); ++r) {
    const int c = cubes[r];
    if (c < 0 || c >= n) {
      throw RuntimeError(fmt::format("{}: cube {} (for rank {}) does not exist; topology '{}' has cubes 0 to {}", what, c,
                                     r, topo.name, n - 1));
    }
    for (std::size_t q = 0; q < r; ++q) {
      if (cubes[q] == c) {
        throw RuntimeError(fmt::format("{}: cube {} is named twice (ranks {} and {}); each rank needs a cube of its own, "
                                       "0 to {} in topology '{}'",
                                       what, c, q, r, n - 1, topo.name));
      }
    }
  }
}

SimBackend::SimBackend(hw::Topology topo, SimBackendOptions opts) : topo_(std::move(topo)), opts_(std::move(opts)) {
  check_placement(opts_.cubes, topo_, "backend 'sim': option cubes (ranks_on in Python, --cubes in the CLI)");
  if (opts_.timing == hw::TimingModel::flow && !opts_.timing_only) {
    throw RuntimeError(
        "backend 'sim': timing 'flow' needs timing_only: the flow level times a message as one flow sharing its "
        "links and memories, and moves no bytes, so it cannot give values; add timing_only=True (--timing-only), or "
        "use timing 'chunk' (the default) for a run with values");
  }
}

void SimBackend::declare_tracks(int ranks) {
  std::vector<int> cubes;
  for (int r = 0; r < std::min(ranks, this->ranks()); ++r) cubes.push_back(device_of(r));
  system_->declare_tracks(cubes);
}

void SimBackend::attach(sim::Simulator& sim) {
  sim_ = &sim;
  hw::SystemOptions so;
  so.functional = !opts_.timing_only;
  so.check_uninitialized = opts_.check_uninitialized;
  so.hazards = opts_.hazards;
  so.timing = opts_.timing;
  system_ = std::make_unique<hw::System>(sim, topo_, so);
}

int SimBackend::rank_of_helper(std::string_view name) const {
  // The PE kernel names its processes after the PE ("cube3.pe0/gemm"): the rank placed on that cube.
  if (!name.starts_with("cube")) return -1;
  int cube = 0;
  std::size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && cube < (1 << 24); ++i) {
    cube = cube * 10 + (name[i] - '0');
  }
  if (i < name.size() && name[i] != '.' && name[i] != '/') return -1;
  for (int r = 0; r < ranks(); ++r) {
    if (device_of(r) == cube) return r;
  }
  return -1;
}

void SimBackend::abandon_run() {
  if (system_) system_->abandon_transfers();
}

std::string SimBackend::describe() const {
  return fmt::format("simulated '{}' ({} cubes{}{})", topo_.name, topo_.cubes.size(),
                     opts_.timing_only ? ", timing only" : "", opts_.timing == hw::TimingModel::flow ? ", flow level" : "");
}

std::shared_ptr<Storage> SimBackend::allocate(int rank, std::uint64_t bytes, std::string_view what) {
  if (rank < 0 || rank >= ranks()) {
    throw RuntimeError(fmt::format("allocation '{}' on rank {}: the ranks on topology '{}' are 0 to {}", what, rank,
                                   topo_.name, ranks() - 1));
  }
  hw::Memory& hbm = system_->hbm(device_of(rank));
  const std::uint64_t addr = hbm.allocate(std::max<std::uint64_t>(bytes, 1), 256, what);
  return std::make_shared<SimStorage>(rank, bytes, hbm, addr);
}

void SimBackend::copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off, std::uint64_t n) {
  const auto& s = static_cast<const SimStorage&>(src);
  auto& d = static_cast<SimStorage&>(dst);
  if (n == 0) return;
  system_->transfer(s.at(src_off), d.at(dst_off), n);
}

void SimBackend::start_copy(const Storage& src, std::uint64_t src_off, Storage& dst, std::uint64_t dst_off,
                            std::uint64_t n, hw::WireScale wire, hw::OnLanded landed) {
  const auto& s = static_cast<const SimStorage&>(src);
  auto& d = static_cast<SimStorage&>(dst);
  system_->start_transfer(s.at(src_off), d.at(dst_off), n, wire, landed);
}

void SimBackend::delay(int, sim::Duration d, std::string_view) {
  if (d > 0) sim::this_process::sleep(d);
}

sim::Duration SimBackend::cost_time(int rank, const OpCost& c) const {
  auto& sys = const_cast<hw::System&>(*system_);
  hw::Cube& cube = sys.cube(device_of(rank));
  const int pes = cube.num_pes();
  const DType d = c.dtype;
  const hw::CubeSpec& spec = cube.spec();
  sim::Duration mem;
  if (c.kind == OpCost::Kind::gemm || !spec.hbm.rw_model()) {
    mem = sim::transfer_time(c.bytes_read + c.bytes_written, cube.hbm().bandwidth());
  } else {
    // Reads at the read rate, writes at the write rate, one after the other on the bus; with a copy
    // rate, the bytes read and written alike move at it (the bus turning around between them) and
    // only the surplus of one direction at that direction's rate (hw::HbmSpec).
    const hw::HbmSpec& h = spec.hbm;
    auto rate = [&](sim::Bandwidth b) { return b.bytes_per_s ? b : h.bandwidth; };
    const std::uint64_t both = h.copy.bytes_per_s ? std::min(c.bytes_read, c.bytes_written) : 0;
    mem = (both ? sim::transfer_time(2 * both, h.copy) : 0) + sim::transfer_time(c.bytes_read - both, rate(h.read)) +
          sim::transfer_time(c.bytes_written - both, rate(h.write));
  }
  sim::Duration work = 0;
  if (pes > 0) {
    hw::Pe& pe = cube.pe(0);
    if (c.kind == OpCost::Kind::gemm) {
      const auto macs = static_cast<std::uint64_t>(c.m) * static_cast<std::uint64_t>(c.n) * static_cast<std::uint64_t>(c.k);
      work = pe.mac().time((macs + pes - 1) / pes, d);
    } else if (c.flops > 0) {
      work = pe.vector().time((static_cast<std::uint64_t>(c.flops) + pes - 1) / pes, d);
    }
  }
  sim::Duration t = std::max(mem, work);
  if (c.kernel) {  // hw::KernelSpec: zeros without a "kernel" section
    t += spec.kernel.launch_gap;
    if (c.kind == OpCost::Kind::reduce) t += spec.kernel.reduction;
  }
  return t;
}

bool SimBackend::reduce(const Tensor& dst, const Tensor& src, ReduceOp op) {
  if (!dst.is_contiguous() || !src.is_contiguous() || dst.nbytes() != src.nbytes()) return false;
  auto& d = static_cast<SimStorage&>(dst.storage());
  auto& s = static_cast<SimStorage&>(src.storage());
  struct How {
    DType dtype;
    ReduceOp op;
  } how{dst.dtype(), op};
  // Pieces end at page boundaries of either tensor, both element-aligned: whole elements each.
  d.memory().combine(
      s.memory(), s.addr() + src.byte_offset(), d.addr() + dst.byte_offset(), dst.nbytes(),
      [](std::byte* a, const std::byte* b, std::uint64_t n, void* x) {
        const auto& h = *static_cast<const How*>(x);
        kernels::reduce_values(reinterpret_cast<std::uint8_t*>(a), reinterpret_cast<const std::uint8_t*>(b), h.dtype,
                               static_cast<std::int64_t>(n / dtype_size(h.dtype)), h.op);
      },
      &how);
  return true;
}

void SimBackend::charge(int rank, const OpCost& c, sim::Duration overlapped_with) {
  const sim::Duration t = sim_->off_stack([&] { return cost_time(rank, c); });  // see Comm::isend
  if (t <= overlapped_with) return;
  const sim::Time t0 = sim_->now();
  sim::this_process::sleep(t - overlapped_with);
  auto& tr = sim_->trace();
  if (tr.enabled()) {
    tr.span(tr.track(c.kind == OpCost::Kind::reduce ? "reduce" : "compute", fmt::format("rank{}", rank)), c.name, t0,
            sim_->now());
  }
}

namespace {
// A 2-D view of simulated HBM as the PE kernel takes it; false when the layout is not row- or
// column-major (the runtime then falls back to host compute and a roofline charge).
bool hbm_matrix(const Tensor& t, kernels::HbmMatrix* out) {
  if (t.dim() != 2 || (t.strides()[0] != 1 && t.strides()[1] != 1)) return false;
  const auto& st = static_cast<const SimStorage&>(t.storage());
  *out = kernels::HbmMatrix{&st.memory(), st.addr() + t.byte_offset(), t.dtype(), t.shape()[0], t.shape()[1],
                            t.strides()[0], t.strides()[1]};
  return true;
}
}  // namespace

bool SimBackend::gemm(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name) {
  kernels::HbmMatrix ha, hb, hc;
  if (!hbm_matrix(a, &ha) || !hbm_matrix(b, &hb) || !hbm_matrix(c, &hc)) return false;
  if (bias && !bias->is_contiguous()) return false;
  kernels::HbmVector hv;
  if (bias) {
    const auto& st = static_cast<const SimStorage&>(bias->storage());
    hv = kernels::HbmVector{&st.memory(), st.addr() + bias->byte_offset(), bias->dtype(), bias->numel()};
  }
  kernels::sim_pe_gemm(*system_, ha, hb, bias ? &hv : nullptr, hc,
                       {.cubes = {device_of(c.device())}, .label = name, .numerics = gemm_numerics()});
  return true;
}

bool SimBackend::attention(const AttentionRequest& r) {
  const AttentionRequest::Operand* ops[] = {&r.q, &r.k, &r.v, &r.out, &r.dout, &r.dq, &r.dk, &r.dv};
  for (const AttentionRequest::Operand* o : ops) {
    if (o->t && (o->t->dim() != 2 || (o->t->cols() > 1 && o->t->strides()[1] != 1) || o->t->strides()[0] < 0)) return false;
  }
  auto hbm = [](const AttentionRequest::Operand& o) {
    const auto& st = static_cast<const SimStorage&>(o.t->storage());
    return kernels::HbmAttention{&st.memory(),
                                 st.addr() + o.t->byte_offset() + static_cast<std::uint64_t>(o.col) * o.t->element_size(),
                                 o.t->dtype(), o.t->strides()[0], o.group_stride};
  };
  const Tensor& stats = *r.stats;
  const auto& sst = static_cast<const SimStorage&>(stats.storage());
  const kernels::HbmAttention hs{&sst.memory(), sst.addr() + stats.byte_offset(), DType::f32, 2 * r.shape.heads, 0};
  const kernels::SimAttentionOptions opts{.cubes = {device_of(stats.device())},
                                          .label = r.backward ? "attention backward" : "attention"};
  if (timing_only()) {
    if (r.backward) {
      kernels::sim_pe_attention_backward(*system_, r.shape, hbm(r.q), hbm(r.k), hbm(r.v), hbm(r.dout), hbm(r.dq),
                                         hbm(r.dk), hbm(r.dv), {}, opts);
    } else {
      kernels::sim_pe_attention_forward(*system_, r.shape, hbm(r.q), hbm(r.k), hbm(r.v), hbm(r.out), hs, {}, opts);
    }
    return true;
  }
  // The values: the host definition on copies of the operands' spans (one read per tensor), written
  // by the PEs' output tiles at their simulated times.
  std::map<const Storage*, std::vector<std::uint8_t>> spans;  // each storage's bytes, read once
  // An output's storage is not read (it may hold bytes never written); an input's is.
  // (Inputs are read before any output's copy is made, so an output sharing an input's storage
  // still sees the input's bytes.)
  auto span_of = [&](const Tensor& t, bool load) -> std::vector<std::uint8_t>& {
    auto it = spans.find(&t.storage());
    if (it != spans.end()) return it->second;
    auto& e = spans[&t.storage()];
    e.resize(t.storage().bytes());
    if (load) t.storage().read(0, e.data(), e.size());
    return e;
  };
  auto host = [&](const AttentionRequest::Operand& o, bool load) {
    std::vector<std::uint8_t>& sp = span_of(*o.t, load);
    return kernels::MutableAttentionBuffer{
        sp.data() + o.t->byte_offset() + static_cast<std::uint64_t>(o.col) * o.t->element_size(), o.t->dtype(),
        o.t->strides()[0], o.group_stride};
  };
  auto bytes_of = [&](const AttentionRequest::Operand& o) {
    const auto& st = static_cast<const SimStorage&>(o.t->storage());
    return kernels::HostBytes{span_of(*o.t, false).data(), st.addr()};
  };
  const auto q = host(r.q, true), k = host(r.k, true), v = host(r.v, true);
  if (!r.backward) {
    const auto out = host(r.out, false);
    std::vector<float> st(static_cast<std::size_t>(stats.numel()));
    kernels::attention_forward(r.shape, q, k, v, out, st.data(), r.kv_valid.empty() ? nullptr : r.kv_valid.data());
    kernels::AttentionValues vals;
    vals.out = bytes_of(r.out);
    vals.stats = {reinterpret_cast<const std::uint8_t*>(st.data()), hs.addr};
    kernels::sim_pe_attention_forward(*system_, r.shape, hbm(r.q), hbm(r.k), hbm(r.v), hbm(r.out), hs, vals, opts);
    return true;
  }
  std::vector<float> st(static_cast<std::size_t>(stats.numel()));
  stats.storage().read(stats.byte_offset(), st.data(), st.size() * sizeof(float));
  const auto out = host(r.out, true), dout = host(r.dout, true);
  const auto dq = host(r.dq, false), dk = host(r.dk, false), dv = host(r.dv, false);
  kernels::attention_backward(r.shape, q, k, v, out, st.data(), dout, dq, dk, dv,
                              r.kv_valid.empty() ? nullptr : r.kv_valid.data());
  kernels::AttentionValues vals;
  vals.dq = bytes_of(r.dq);
  vals.dk = bytes_of(r.dk);
  vals.dv = bytes_of(r.dv);
  kernels::sim_pe_attention_backward(*system_, r.shape, hbm(r.q), hbm(r.k), hbm(r.v), hbm(r.dout), hbm(r.dq), hbm(r.dk),
                                     hbm(r.dv), vals, opts);
  return true;
}

void SimBackend::fault_point(FaultPoint p, const Tensor& t) {
  if (p != FaultPoint::reduce || !system_->faults().armed() || !t.is_contiguous()) return;
  const auto& st = static_cast<const SimStorage&>(t.storage());
  system_->faults().on_reduce(device_of(t.device()), st.memory(), st.addr() + t.byte_offset(), t.nbytes());
}

std::unique_ptr<Context> make_sim_context(ContextOptions ctx_opts, hw::Topology topology, SimBackendOptions sim_opts) {
  return std::make_unique<Context>(ctx_opts, std::make_unique<SimBackend>(std::move(topology), std::move(sim_opts)));
}

namespace {
std::unique_ptr<Context> make_sim(ContextOptions o, const BackendArgs& a) {
  OptionReader r("sim", a.options);
  SimBackendOptions so;
  so.timing_only = r.flag("timing_only", false);
  so.timing = hw::parse_timing_model(r.choice("timing", "chunk", {"chunk", "flow"}));
  so.check_uninitialized = r.flag("check_uninitialized", false);
  so.hazards = hw::parse_hazard_mode(r.choice("hazards", "throw", {"throw", "record", "off"}));
  so.cubes = r.int_list("cubes");
  const auto numerics = kernels::parse_accumulator_model(
      r.choice("gemm_numerics", "f32_fma_seq", {"f32_fma_seq", "pairwise", "bf16_acc", "hopper_tc"}));
  r.finish();
  auto with = [&](std::unique_ptr<Context> c) {
    c->backend().set_gemm_numerics(numerics);
    return c;
  };
  if (a.topology) return with(make_sim_context(o, *a.topology, so));
  return with(make_sim_context(o, hw::load_topology(kDefaultTopology), so));
}
}  // namespace

extern const BackendInfo kSimBackendInfo;
const BackendInfo kSimBackendInfo{
    .name = "sim",
    .summary = "simulated cubes of a topology: real bytes through simulated HBM, TCM and links at simulated times",
    .options = "timing_only (bool), timing ('chunk' | 'flow': flows through FIFO queues of fluid, timing only), "
               "check_uninitialized (bool), hazards ('throw' | 'record' | 'off'), gemm_numerics ('f32_fma_seq' | 'pairwise' | "
               "'bf16_acc' | 'hopper_tc': the PEs' accumulator model), cubes (list of "
               "cube ids: rank r on cubes[r]; default rank r on cube r); a topology (default single_cube)",
    .simulates = true,
    .devices = [] { return -1; },
    .unavailable = [] { return std::string(); },
    .make = &make_sim};

}  // namespace cubesim::rt
