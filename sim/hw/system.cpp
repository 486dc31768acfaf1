// The System: building the hardware from a Topology, and the transfer engine.
//
// The engine's cost model, in events: a chunk is injected by one event (at its injection time plus
// the fixed delays before the first link, so that event happens when the chunk's head reaches the
// first link); each further link is one event at the chunk's head arrival there; the transfer's
// landing is one event. Local stages (memories, DMA channels) are served arithmetically inside
// those events: in the order chunks reach the cube's port rather than the exact order they reach
// the memory. Links, where flows from different cubes meet, are always served in true arrival order.
#include "sim/hw/system.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/hw/engine.h"
#include "sim/hw/errors.h"
#include "sim/hw/format.h"

namespace cubesim::hw {

using sim::Duration;
using sim::Time;

// ---------------------------------------------------------------- chunk-level events

// The simulator events: small enough for the event queue's inline callbacks.
struct ChunkInject {
  TransferRecord* r;
  std::uint64_t chunk;
  void operator()() const { r->sys->inject(r, chunk); }
};
struct ChunkStep {
  TransferRecord* r;
  Time tail;
  std::uint64_t chunk;
  std::uint32_t stage;
  void operator()() const { r->sys->advance(r, chunk, stage, r->sys->sim_->now(), tail); }
};
struct TransferLanded {
  TransferRecord* r;
  void operator()() const { r->sys->land(r); }
};
// The flow level's last chunk of a message, its head leaving the source at `t`.
struct ChunkTail {
  TransferRecord* r;
  Time t;
  void operator()() const { r->sys->advance(r, r->nchunks - 1, 0, t, t); }
};

// ---------------------------------------------------------------- PathFigures, handles

Duration StageFigures::time(std::uint64_t bytes) const {
  const Duration through_cache = cache.bytes_per_s > 0 ? sim::transfer_time(bytes, cache) : 0;
  if (channels <= 1) return std::max(through_cache, sim::transfer_time(bytes, bandwidth));
  // Blocks go round the channels; the busiest gets every full round plus at most one more block.
  const std::uint64_t stripe = interleave * channels;
  const std::uint64_t busiest = bytes / stripe * interleave + std::min(bytes % stripe, interleave);
  return std::max(through_cache, sim::transfer_time(busiest, sim::Bandwidth{bandwidth.bytes_per_s / channels}));
}

Duration PathFigures::time(std::uint64_t bytes) const {
  if (bytes == 0) return 0;
  const std::uint64_t n = (bytes + chunk_bytes - 1) / chunk_bytes;
  const std::uint64_t last = bytes - (n - 1) * chunk_bytes;
  Duration slowest = 0;
  for (const StageFigures& s : stages) slowest = std::max(slowest, s.time(last));
  return alpha + (n - 1) * chunk_time + slowest;
}

std::vector<std::string> PathFigures::stage_names() const {
  std::vector<std::string> v;
  for (const StageFigures& s : stages) v.push_back(s.name);
  return v;
}

bool TransferHandle::done() const { return rec_ == nullptr || rec_->id != id_ || rec_->done; }

Time TransferHandle::wait() {
  if (!done()) {
    if (!rec_->event) rec_->event = std::make_unique<sim::Event>("transfer");  // made only when someone waits
    rec_->event->wait();
  }
  if (rec_) return rec_->sys->simulator().now();
  sim::Simulator* s = sim::Simulator::active();
  return s ? s->now() : 0;
}

void wait_all(std::span<TransferHandle> transfers) {
  for (TransferHandle& h : transfers) h.wait();
}

// ---------------------------------------------------------------- construction

System::System(sim::Simulator& sim, Topology topology, SystemOptions options)
    : sim_(&sim), topo_(std::move(topology)), opts_(options), hazard_tracker_(sim, options.hazards), router_(topo_) {
  if (opts_.timing == TimingModel::flow && opts_.functional) {
    throw std::invalid_argument(
        "flow-level timing keeps no values: a flow is a rate through the path, its bytes never move chunk by chunk; "
        "use it with functional = false (timing only), or chunk-level timing for values");
  }
  auto memory = [&](MemorySetup setup) {
    setup.functional = opts_.functional;
    setup.check_uninitialized = opts_.check_uninitialized;
    memories_.push_back(std::make_unique<Memory>(*sim_, hazard_tracker_, std::move(setup)));
    register_unit(*memories_.back());
    return memories_.back().get();
  };
  for (const CubeSpec& spec : topo_.cubes) {
    const int c = spec.id;
    Memory* hbm = memory(MemorySetup{.kind = MemoryKind::kHbm,
                                     .cube = c,
                                     .capacity = spec.hbm.capacity_bytes,
                                     .bandwidth = spec.hbm.bandwidth,
                                     .latency = spec.hbm.latency,
                                     .channels = spec.hbm.channels,
                                     .interleave = spec.hbm.interleave_bytes,
                                     .hashed = spec.hbm.channel_hash});
    auto cube = std::make_unique<Cube>(spec, *hbm);
    if (spec.l2.present) cube->l2_ = &own(std::make_unique<L2Cache>(c, spec.l2, *hbm));
    for (int p = 0; p < spec.pes; ++p) {
      Memory* tcm = memory(MemorySetup{.kind = MemoryKind::kTcm,
                                       .cube = c,
                                       .pe = p,
                                       .capacity = spec.pe.tcm.capacity_bytes,
                                       .bandwidth = spec.pe.tcm.bandwidth,
                                       .latency = spec.pe.tcm.latency,
                                       .channels = 1,
                                       .interleave = spec.pe.tcm.capacity_bytes});
      cube->pes_.push_back(std::make_unique<Pe>(*sim_, c, p, spec.pe, *tcm));
      Pe& pe = *cube->pes_.back();
      for (Unit* u : std::initializer_list<Unit*>{&pe.dma().read, &pe.dma().write, &pe.mac(), &pe.vector()}) {
        register_unit(*u);
      }
    }
    cubes_.push_back(std::move(cube));
  }
  if (topo_.host.present) {
    host_ = memory(MemorySetup{.kind = MemoryKind::kHost,
                               .capacity = topo_.host.capacity_bytes,
                               .bandwidth = topo_.host.bandwidth,
                               .latency = topo_.host.latency,
                               .channels = 1,
                               .interleave = topo_.host.capacity_bytes});
  }
  // Local stages of a transfer may be booked up to this long before the simulator reaches the
  // time they are ready (see advance()); bookings older than that can be forgotten.
  for (const auto& m : memories_) lookback_ = std::max(lookback_, m->latency());
  for (const CubeSpec& c : topo_.cubes) lookback_ = std::max(lookback_, c.pe.dma.overhead);
  // An L2 books the HBM for its misses a hit latency after the chunk's head arrives.
  for (const CubeSpec& c : topo_.cubes) {
    if (c.l2.present) lookback_ = std::max(lookback_, c.l2.latency + c.hbm.latency);
  }
  for (std::size_t i = 0; i < topo_.links.size(); ++i) {
    const LinkSpec& l = topo_.links[i];
    const Duration extra = l.from == kSwitchNode ? topo_.switch_latency : 0;
    links_.push_back(std::make_unique<Link>(static_cast<int>(i), l, extra));
    register_unit(*links_.back());
    if (l.from >= 0) cubes_[static_cast<std::size_t>(l.from)]->ports_.push_back(static_cast<int>(i));
  }
  if (topo_.has_switch_ports()) {
    // Each cube's port groups on the switch: in (from the cube), then out (to it).
    sim::Bandwidth bw = topo_.switch_port;
    bw.bytes_per_s *= static_cast<std::uint64_t>(topo_.switch_links_per_cube);
    for (int c = 0; c < num_cubes(); ++c) {
      for (bool in : {true, false}) {
        switch_ports_.push_back(&own(std::make_unique<SwitchPort>(c, in, bw)));
      }
    }
  }
  if (opts_.timing == TimingModel::flow) flows_ = std::make_unique<FlowEngine>(*this);
}

std::string_view timing_model_name(TimingModel m) { return m == TimingModel::flow ? "flow" : "chunk"; }

TimingModel parse_timing_model(std::string_view s, std::string_view what) {
  if (s == "chunk") return TimingModel::chunk;
  if (s == "flow") return TimingModel::flow;
  throw std::invalid_argument(fmt::format("{} '{}' is not a timing model; use 'chunk' (every chunk through every "
                                          "stage, the reference) or 'flow' (flows through FIFO queues of fluid, "
                                          "timing only)",
                                          what, s));
}

SwitchPort& System::switch_port(int cube, bool in) {
  if (switch_ports_.empty()) {
    throw TopologyError(fmt::format("topology '{}' has no switch ports (network.switch.port)", topo_.name));
  }
  this->cube(cube);  // range check
  return *switch_ports_[static_cast<std::size_t>(2 * cube + (in ? 0 : 1))];
}

System::~System() = default;

void System::register_unit(Unit& u) {
  u.id_ = UnitId{static_cast<std::uint32_t>(units_.size())};
  units_.push_back(&u);
}

Cube& System::cube(int id) {
  if (id < 0 || id >= num_cubes()) {
    throw std::out_of_range(fmt::format("cube {} does not exist in topology '{}'; cube ids are 0..{}", id, topo_.name,
                                        num_cubes() - 1));
  }
  return *cubes_[static_cast<std::size_t>(id)];
}

Memory& System::host_memory() {
  if (!host_) {
    throw TopologyError(fmt::format("topology '{}' has no host; add a \"host\" section (memory and link) to use one",
                                    topo_.name));
  }
  return *host_;
}

std::uint64_t System::resident_bytes() const {
  std::uint64_t b = 0;
  for (const auto& m : memories_) b += m->resident_bytes();
  return b;
}

std::vector<UnitUsage> System::usage() const {
  std::vector<UnitUsage> v;
  v.reserve(units_.size());
  for (const Unit* u : units_) v.push_back(u->usage());
  return v;
}

std::shared_ptr<const std::vector<UnitInfo>> System::units() const {
  if (!catalog_) {
    auto v = std::make_shared<std::vector<UnitInfo>>();
    v->reserve(units_.size());
    for (const Unit* u : units_) v->push_back(u->info());
    catalog_ = std::move(v);
  }
  return catalog_;
}

std::vector<UnitCounters> System::counters() const {
  std::vector<UnitCounters> v;
  v.reserve(units_.size());
  for (const Unit* u : units_) v.push_back(u->counters());
  return v;
}

void System::declare_tracks(int cubes) {
  std::vector<int> ids(static_cast<std::size_t>(std::clamp(cubes, 0, num_cubes())));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  declare_tracks(ids);
}

void System::declare_tracks(std::span<const int> cubes) {
  sim::Trace& tr = sim_->trace();
  auto used = [&](int node) { return std::find(cubes.begin(), cubes.end(), node) != cubes.end(); };
  for (int c : cubes) {
    this->cube(c);  // range check
    Cube& cube = *cubes_[static_cast<std::size_t>(c)];
    cube.hbm().declare_tracks(tr);
    if (L2Cache* l2 = cube.l2()) l2->declare_tracks(tr);
    for (int p = 0; p < cube.num_pes(); ++p) {
      Pe& pe = cube.pe(p);
      for (Unit* u : std::initializer_list<Unit*>{&pe.mac(), &pe.vector(), &pe.dma().read, &pe.dma().write}) {
        u->declare_tracks(tr);
      }
    }
  }
  // Links among those cubes and the switch (host links only when used).
  auto among = [&](int node) { return node == kSwitchNode || (node >= 0 && used(node)); };
  for (const auto& l : links_) {
    if (among(l->from()) && among(l->to())) l->declare_tracks(tr);
  }
  for (SwitchPort* p : switch_ports_) {
    if (used(p->cube())) p->declare_tracks(tr);
  }
}

// ---------------------------------------------------------------- paths

const Path& System::path(Memory& src, Memory& dst) {
  // The path last used into dst, else the map: a PE's tile loads come from one HBM.
  if (dst.path_src_ == &src) return *dst.path_;
  Path& p = path_of(src, dst);
  dst.path_src_ = &src;
  dst.path_ = &p;
  return p;
}

Path& System::path_of(Memory& src, Memory& dst) {
  const std::uint64_t key = (static_cast<std::uint64_t>(src.id().value) << 32) | dst.id().value;
  auto it = paths_.find(key);
  if (it != paths_.end()) return *it->second;
  std::unique_ptr<Path> p = build_path(src, dst);
  if (path_stages_ + p->stages.size() > opts_.path_cache_stages) evict_paths();
  path_stages_ += p->stages.size();
  return *paths_.emplace(key, std::move(p)).first->second;
}

void System::evict_paths() {
  // Paths are pure functions of their two memories: one evicted is rebuilt when next asked for, and
  // times do not change. Those in use by a transfer in flight stay.
  for (auto it = paths_.begin(); it != paths_.end();) {
    Path& p = *it->second;
    if (p.users > 0) {
      ++it;
      continue;
    }
    if (p.dst->path_ == &p) {
      p.dst->path_src_ = nullptr;
      p.dst->path_ = nullptr;
    }
    path_stages_ -= p.stages.size();
    it = paths_.erase(it);
  }
  if (flows_) flows_->paths_evicted();  // a new path may take an evicted one's address
}

std::string stage_label(const Stage& s) {
  const UnitKind k = s.unit->kind();
  if (k == UnitKind::memory || k == UnitKind::l2) return fmt::format("{} ({})", s.unit->name(), s.src_side ? "read" : "write");
  return s.unit->name();
}

std::unique_ptr<Path> System::build_path(Memory& src, Memory& dst) {
  auto p = std::make_unique<Path>();
  p->dst = &dst;
  auto stage = [&](PathUnit& u, Duration pre, Duration post, bool src_side) {
    p->stages.push_back(Stage{.unit = &u,
                              .pre = pre,
                              .post = post,
                              .src_side = src_side,
                              .arrival = u.order() == PathUnit::Order::arrival,
                              // (Memory and Link are the only units of these kinds.)
                              .serve = u.kind() == UnitKind::memory ? Stage::Serve::memory
                                       : u.kind() == UnitKind::link ? Stage::Serve::link
                                                                    : Stage::Serve::other,
                              .fig = &unit_figures(u, false)});
  };
  // Reads pay the memory's latency; writes are posted: they cost bandwidth, not latency. A cube's
  // HBM behind an L2 is reached through it: the L2 stands in the HBM's place and books the HBM for
  // its misses (l2_cache.h).
  auto memory_stage = [&](Memory& m, bool read) {
    if (m.memory_kind() == MemoryKind::kHbm) {
      if (L2Cache* l2 = cube(m.cube()).l2()) {
        stage(*l2, read ? l2->latency() : 0, 0, read);
        p->l2 = true;
        if (read) {
          p->stages.back().cache_read = l2;
          p->stages.back().fig = &unit_figures(*l2, true);
        }
        return;
      }
    }
    stage(m, read ? m.latency() : 0, 0, read);
  };
  auto dma_stage = [&](Pe& pe, bool read_channel) {
    DmaChannel& ch = read_channel ? pe.dma().read : pe.dma().write;
    stage(ch, 0, 0, false);
    if (!p->injector) {
      p->injector = &ch;
      p->injector_overhead = pe.spec().dma.overhead;
      p->chunk = pe.spec().dma.chunk_bytes;
    }
  };
  auto link_stage = [&](int id) {
    Link& l = *links_.at(static_cast<std::size_t>(id));
    stage(l, l.entry_delay(), l.latency(), false);
    ++p->figures.hops;
  };

  Pe* src_pe = src.memory_kind() == MemoryKind::kTcm ? &pe(src.cube(), src.pe()) : nullptr;
  Pe* dst_pe = dst.memory_kind() == MemoryKind::kTcm ? &pe(dst.cube(), dst.pe()) : nullptr;
  memory_stage(src, true);
  if (src_pe) dma_stage(*src_pe, false);
  const bool src_host = src.memory_kind() == MemoryKind::kHost, dst_host = dst.memory_kind() == MemoryKind::kHost;
  if (src_host && !dst_host) {
    link_stage(router_.link_between(kHostNode, dst.cube()));
  } else if (dst_host && !src_host) {
    link_stage(router_.link_between(src.cube(), kHostNode));
  } else if (!src_host && src.cube() != dst.cube()) {
    for (int li : router_.route(src.cube(), dst.cube())) {
      link_stage(li);
      // Through a switch with ports: the sender's in ports after its link up, then the
      // receiver's out ports before the link down.
      if (!switch_ports_.empty() && topo_.links[static_cast<std::size_t>(li)].to == kSwitchNode) {
        for (bool in : {true, false}) {
          SwitchPort& sp = switch_port(in ? src.cube() : dst.cube(), in);
          stage(sp, 0, 0, false);
        }
      }
    }
  }
  if (dst_pe) dma_stage(*dst_pe, true);
  memory_stage(dst, false);
  // Exactly its stages: a barrier over thousands of ranks holds thousands of paths thousands of hops
  // long at once, where growth's spare capacity was a third of the peak memory.
  p->stages.shrink_to_fit();

  const bool has_links = p->figures.hops > 0;
  if (has_links || !p->injector) p->chunk = topo_.chunk_bytes;

  PathFigures& f = p->figures;
  f.chunk_bytes = p->chunk;
  f.alpha = p->injector_overhead;
  bool first = true, before_link = true;
  for (const Stage& s : p->stages) {
    if (s.arrival) before_link = false;
    if (before_link && has_links) p->d_pre += s.pre + s.post;
    // The figures of an L2 read are its misses': the HBM's latency and channels too (a chunk that
    // hits is faster; the injection event still comes at the hit's d_pre, and a chunk that missed
    // reaches its first link by a later event).
    const Duration miss = s.cache_read ? s.cache_read->memory().latency() : 0;
    f.alpha += s.pre + s.post + miss;
    const StageFigures& sf = *s.fig;
    if (first || sf.bandwidth.bytes_per_s < f.bandwidth.bytes_per_s) f.bandwidth = sf.bandwidth;
    first = false;
    // Sources inject at the pace of the slowest stage's service of a full chunk.
    p->pace = std::max(p->pace, sf.time(p->chunk));
  }
  f.chunk_time = p->pace;
  p->flow_delays = f.alpha - p->injector_overhead;
  // A chunk is injected by an event d_pre after its head left the source, so local stages before
  // the first link book up to d_pre in the past: bookings younger than that must not be forgotten.
  if (p->d_pre > lookback_) {
    throw std::logic_error(fmt::format("path {} -> {}: its stages before the first link delay a chunk by {}, more than "
                                       "the booking lookback {}: widen System::lookback_ (system.cpp) to cover the "
                                       "new unit's delay",
                                       src.name(), dst.name(), sim::format_time(p->d_pre), sim::format_time(lookback_)));
  }
  return p;
}

PathFigures System::path_figures(Memory& src, Memory& dst) {
  const Path& p = path(src, dst);
  PathFigures f = p.figures;
  for (const Stage& s : p.stages) {
    StageFigures sf = *s.fig;
    sf.name = stage_label(s);
    sf.fixed = s.pre + s.post + (s.cache_read ? s.cache_read->memory().latency() : 0);
    f.stages.push_back(std::move(sf));
    if (s.unit->kind() == UnitKind::link) f.links.push_back(static_cast<const Link&>(*s.unit).index());
  }
  return f;
}

const StageFigures& System::unit_figures(PathUnit& u, bool cold_read) {
  // Built on first use and kept: a unit's figures never change, and a path's stages point here.
  const std::size_t i = 2 * static_cast<std::size_t>(u.id().value) + (cold_read ? 1 : 0);
  if (i >= unit_figures_.size()) unit_figures_.resize(std::max(i + 1, 2 * static_cast<std::size_t>(num_units())));
  std::unique_ptr<StageFigures>& f = unit_figures_[i];
  if (!f) {
    f = std::make_unique<StageFigures>(cold_read ? static_cast<L2Cache&>(u).cold_read_figures() : u.figures());
    f->name.clear();
    f->name.shrink_to_fit();
  }
  return *f;
}

// ---------------------------------------------------------------- transfers

TransferHandle System::start_transfer(MemRef src, MemRef dst, std::uint64_t bytes) {
  if (!src.memory || !dst.memory) throw TransferError("transfer: a MemRef with no memory (use memory.at(addr))");
  return start_transfer(*src.memory, Region::contiguous(src.addr, bytes), *dst.memory,
                        Region::contiguous(dst.addr, bytes));
}

TransferHandle System::start_transfer(MemRef src, MemRef dst, std::uint64_t bytes, WireScale wire, OnLanded landed) {
  if (wire.data == 0 || wire.wire < wire.data) {
    throw TransferError(fmt::format("transfer: wire scale {}/{} is not valid; give wire >= data >= 1", wire.wire, wire.data));
  }
  if (!src.memory || !dst.memory) throw TransferError("transfer: a MemRef with no memory (use memory.at(addr))");
  TransferHandle h = start_transfer(*src.memory, Region::contiguous(src.addr, bytes), *dst.memory,
                                    Region::contiguous(dst.addr, bytes), wire, landed);
  if (!h.rec_ && landed.fn) landed.fn(landed.arg);  // nothing to move
  return h;
}

TransferHandle System::start_transfer(Memory& src, const Region& sr, Memory& dst, const Region& dr, WireScale wire,
                                      OnLanded landed) {
  if (&src.hazard_tracker() != &hazard_tracker_ || &dst.hazard_tracker() != &hazard_tracker_) {
    throw TransferError(fmt::format("transfer {} -> {}: a memory of another System", src.name(), dst.name()));
  }
  for (const auto* r : {&sr, &dr}) {
    if (r->rows > 1 && r->pitch < r->row_bytes) {
      throw TransferError(fmt::format("transfer {} -> {}: region {} has pitch {} < row_bytes {}; rows must not overlap",
                                      src.name(), dst.name(), format_region(*r), r->pitch, r->row_bytes));
    }
  }
  if (sr.bytes() != dr.bytes()) {
    throw TransferError(fmt::format("transfer {} -> {}: the source holds {} bytes ({}) but the destination {} ({}); "
                                    "they must hold the same number",
                                    src.name(), dst.name(), sr.bytes(), format_region(sr), dr.bytes(), format_region(dr)));
  }
  // (A region of one row inside the memory, the common case, passes without the call.)
  auto inside = [](const Memory& m, const Region& r) { return r.rows == 1 && m.contains(r.addr, r.row_bytes); };
  if (!inside(src, sr)) src.check_region(sr, "transfer source");
  if (!inside(dst, dr)) dst.check_region(dr, "transfer destination");
  if (&src == &dst && sr.overlaps(dr)) {
    throw TransferError(fmt::format("transfer within {}: source {} and destination {} overlap; DMA engines do not "
                                    "promise memmove order, so give disjoint regions",
                                    src.name(), format_region(sr), format_region(dr)));
  }
  const std::uint64_t bytes = sr.bytes();
  if (bytes == 0) return {};

  TransferRecord* r = alloc_record();
  // Until the transfer is scheduled, an exception hands the record back.
  struct Guard {
    System* sys;
    TransferRecord* r;
    ~Guard() {
      if (r) {
        r->next_free = sys->free_records_;
        sys->free_records_ = r;
      }
    }
  } guard{this, r};
  r->sys = this;
  r->id = next_transfer_id_++;
  r->src = &src;
  r->dst = &dst;
  r->src_unit = &src;
  r->dst_unit = &dst;
  r->src_region = sr;
  r->dst_region = dr;
  r->issued = sim_->now();
  const bool tracking = hazard_tracker_.enabled();
  if (tracking || (opts_.functional && opts_.check_uninitialized)) hazard_tracker_.actor_into(r->issuer);
  if (tracking) {
    hazard_tracker_.check(src, src.in_flight_, sr, false, r);
    hazard_tracker_.check(dst, dst.in_flight_, dr, true, r);
  }
  if (opts_.functional && opts_.check_uninitialized) {
    for (std::uint64_t row = 0; row < sr.rows; ++row) {
      if (auto u = src.store_.first_unwritten(sr.row_addr(row), sr.row_bytes)) {
        const std::string msg = fmt::format(
            "{}: transfer {} issued by {} at {} reads its source {} but byte {:#x} was never written (to {}); write "
            "the source first, or set check_uninitialized off to read zeros (Context(check_uninitialized=False) in "
            "Python)",
            src.name(), r->id, r->issuer, sim::format_time(r->issued), format_region(sr), *u, dst.name());
        throw UninitializedReadError(msg, *u);
      }
    }
  }
  Path& p = const_cast<Path&>(path(src, dst));
  r->path = &p;
  r->bytes = bytes;
  r->wire = wire;
  r->landed_cb = landed;
  r->chunk = p.chunk;
  r->nchunks = (bytes + p.chunk - 1) / p.chunk;
  r->landed = 0;
  r->landing = 0;
  r->done = false;
  if (r->event && r->event->triggered()) r->event->reset();  // a waiter of an earlier use made it
  Time first = r->issued;
  if (p.injector) {
    // The channel is busy for the full chunks at the path's pace and the last chunk for its own bytes.
    first = std::max(first, p.injector->next_inject) + p.injector_overhead;
    const std::uint64_t last = bytes - (r->nchunks - 1) * p.chunk;
    Duration last_pace = p.pace;
    if (last < p.chunk) {
      last_pace = 0;
      for (const Stage& st : p.stages) last_pace = std::max(last_pace, st.fig->time(last));
    }
    p.injector->next_inject = first + (r->nchunks - 1) * p.pace + last_pace;
  }
  r->first_inject = first;
  if (tracking) {
    src.in_flight_.add(r, sr, false);
    dst.in_flight_.add(r, dr, true);
  }
  ++started_;
  if (flows_ && !flows_->by_chunks(r)) {
    guard.r = nullptr;
    ++p.users;  // until it lands (or the run is abandoned)
    flows_->start(r);
    return TransferHandle(r, r->id);
  }
  sim_->at(first + p.d_pre, ChunkInject{r, 0});
  guard.r = nullptr;
  ++p.users;  // until it lands (or the run is abandoned)
  return TransferHandle(r, r->id);
}

void System::abandon_transfers() {
  for (auto& m : memories_) m->in_flight_.clear();
  if (flows_) flows_->abandon();
  for (auto& [key, p] : paths_) p->users = 0;  // the abandoned records are never used again
  completed_ = started_;  // none is in flight any more (bytes_transferred() counts landed ones only)
}

TransferRecord* System::alloc_record() {
  if (free_records_) {
    TransferRecord* r = free_records_;
    free_records_ = r->next_free;
    return r;
  }
  records_.push_back(std::make_unique<TransferRecord>());
  return records_.back().get();
}

void System::inject(TransferRecord* r, std::uint64_t chunk) {
  const Path& p = *r->path;
  const Time t = r->first_inject + chunk * p.pace;
  advance(r, chunk, 0, t, t);
  if (chunk + 1 < r->nchunks) sim_->at(t + p.pace + p.d_pre, ChunkInject{r, chunk + 1});
}

void System::advance(TransferRecord* r, std::uint64_t chunk, std::size_t stage, Time head, Time tail) {
  Path& p = *r->path;
  const std::uint64_t off = chunk * r->chunk;
  const Time now = sim_->now();
  sim::Trace& tr = sim_->trace();
  ChunkVisit v{.transfer = r->id,
               .from = r->src_unit,
               .to = r->dst_unit,
               .chunk = chunk,
               .offset = off,
               .bytes = std::min(r->chunk, r->bytes - off),
               // Local stages may be booked up to lookback_ ahead of their ready time (see the constructor).
               .forget_before = now > lookback_ ? now - lookback_ : 0,
               .trace = tr.enabled() ? &tr : nullptr};
  const std::uint64_t payload = v.bytes;
  const bool scaled = !r->wire.identity();
  const Stage* const first = p.stages.data();
  const Stage* const end = first + p.stages.size();
  for (const Stage* s = first + stage; s != end; ++s) {
    const Stage& st = *s;
    // An arrival-ordered unit (a link) is served when the chunk's head reaches it, so chunks from
    // different flows meet in arrival order.
    if (st.arrival && head > now) {
      sim_->at(head, ChunkStep{r, tail, chunk, static_cast<std::uint32_t>(s - first)});
      return;
    }
    if (scaled) v.bytes = st.arrival ? r->wire.of(payload) : payload;
    v.region = st.src_side ? &r->src_region : &r->dst_region;
    v.read = st.src_side;
    v.head = head;
    v.tail = tail;
    v.pre = st.pre;
    v.post = st.post;
    Passage out;
    switch (st.serve) {
      case Stage::Serve::memory: out = static_cast<Memory*>(st.unit)->serve_chunk(v); break;
      case Stage::Serve::link: out = static_cast<Link*>(st.unit)->serve(v); break;
      case Stage::Serve::other: out = st.unit->serve(v); break;
    }
    head = out.head;
    tail = out.tail;
  }
  r->landing = std::max(r->landing, tail);
  if (++r->landed == r->nchunks) sim_->at(r->landing, TransferLanded{r});
}

void System::inject_tail(TransferRecord* r, Duration after) {
  // As inject() would the last chunk: by an event d_pre after its head leaves the source, `after` from now.
  const Time t = sim_->now() + after;
  r->landed = r->nchunks - 1;
  r->landing = t;
  sim_->at(t + r->path->d_pre, ChunkTail{r, t});
}

void System::land_after(TransferRecord* r, Duration d) {
  if (d == 0) {
    land(r);
  } else {
    sim_->at(sim_->now() + d, TransferLanded{r});
  }
}

void System::land(TransferRecord* r) {
  if (opts_.functional) {
    // The bytes land now, all at once: nobody could read them earlier without a hazard.
    const Region& s = r->src_region;
    const Region& d = r->dst_region;
    std::uint64_t srow = 0, soff = 0, drow = 0, doff = 0, left = r->bytes;
    while (left > 0) {
      const std::uint64_t n = std::min({s.row_bytes - soff, d.row_bytes - doff, left});
      r->dst->store_.copy_from(r->src->store_, s.row_addr(srow) + soff, d.row_addr(drow) + doff, n);
      left -= n;
      if ((soff += n) == s.row_bytes) soff = 0, ++srow;
      if ((doff += n) == d.row_bytes) doff = 0, ++drow;
    }
    if (faults_.armed()) faults_.on_landed(*r);
  }
  if (hazard_tracker_.enabled()) {
    r->src->in_flight_.remove(r, false);
    r->dst->in_flight_.remove(r, true);
  }
  ++completed_;
  --r->path->users;
  bytes_moved_ += r->bytes;
  r->done = true;
  if (r->event) r->event->trigger();
  const OnLanded cb = r->landed_cb;
  r->next_free = free_records_;
  free_records_ = r;
  if (cb.fn) cb.fn(cb.arg);  // after the record is free: the callback may start transfers
}

}  // namespace cubesim::hw
