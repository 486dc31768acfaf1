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

#include "sim/hw/errors.h"
#include "sim/hw/format.h"

namespace cubesim::hw {

using sim::Duration;
using sim::Time;

// ---------------------------------------------------------------- engine structures

struct Stage {
  enum Kind : std::uint8_t { kMemory, kDma, kLink };
  Kind kind = kMemory;
  Server* servers = nullptr;
  std::uint32_t nservers = 1;
  std::uint64_t interleave = 0;
  sim::Bandwidth ideal;  // all servers together
  Duration pre = 0;      // before the chunk occupies the stage (read latency, port overhead)
  Duration post = 0;     // after it leaves (wire latency)
  bool src_side = false; // memory stage: addresses come from the source region
  Memory* memory = nullptr;
  Pe* pe = nullptr;
  Link* link = nullptr;
  std::string label;
};

struct Path {
  std::vector<Stage> stages;
  DmaChannel* injector = nullptr;  // requests through it serialize
  Duration injector_overhead = 0;
  std::uint64_t chunk = 0;
  Duration pace = 0;   // a full chunk at the slowest stage
  Duration d_pre = 0;  // fixed delays before the first link (0 without links)
  PathFigures figures;
};

struct TransferRecord {
  System* sys = nullptr;
  std::uint64_t id = 0;
  Memory* src = nullptr;
  Memory* dst = nullptr;
  Region src_region, dst_region;
  Path* path = nullptr;
  std::uint64_t bytes = 0, chunk = 0, nchunks = 0, landed = 0;
  Time issued = 0, first_inject = 0, landing = 0;
  bool done = true;
  std::optional<sim::Event> event;
  std::string issuer;
  TransferRecord* next_free = nullptr;
};

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

namespace {

std::uint64_t region_addr(const Region& r, std::uint64_t off) {
  if (r.rows == 1) return r.addr + off;
  return r.row_addr(off / r.row_bytes) + off % r.row_bytes;
}

// Calls f(channel, bytes) for each channel that [addr, addr + len) touches, with blocks of
// `interleave` bytes going to channels round robin.
template <class F>
void for_each_piece(std::uint64_t addr, std::uint64_t len, std::uint64_t interleave, std::uint32_t n, F&& f) {
  const std::uint64_t b0 = addr / interleave, b1 = (addr + len - 1) / interleave;
  if (b1 - b0 + 1 <= n) {  // each block on its own channel
    std::uint32_t ch = static_cast<std::uint32_t>(b0 % n);
    for (std::uint64_t b = b0; b <= b1; ++b) {
      const std::uint64_t lo = std::max(addr, b * interleave), hi = std::min(addr + len, (b + 1) * interleave);
      f(ch, hi - lo);
      if (++ch == n) ch = 0;
    }
    return;
  }
  // More blocks than channels: every channel gets q or q + 1 whole blocks (the q + 1 ones follow
  // the first block's channel round the ring), less the cut-off parts of the first and last block.
  const std::uint64_t nb = b1 - b0 + 1, q = nb / n, rem = nb % n;
  const std::uint32_t c0 = static_cast<std::uint32_t>(b0 % n), c1 = static_cast<std::uint32_t>(b1 % n);
  const std::uint64_t cut_front = addr - b0 * interleave, cut_back = (b1 + 1) * interleave - (addr + len);
  for (std::uint32_t ch = 0; ch < n; ++ch) {
    const std::uint32_t from_first = ch >= c0 ? ch - c0 : ch + n - c0;
    std::uint64_t bytes = (q + (from_first < rem ? 1 : 0)) * interleave;
    if (ch == c0) bytes -= cut_front;
    if (ch == c1) bytes -= cut_back;
    f(ch, bytes);
  }
}

std::string region_string(const Region& r) {
  if (r.rows == 1) return fmt::format("[{:#x}, {:#x})", r.addr, r.addr + r.row_bytes);
  return fmt::format("[{:#x}: {} rows of {} B, pitch {}]", r.addr, r.rows, r.row_bytes, r.pitch);
}

std::string_view hazard_kind_name(HazardKind k) {
  switch (k) {
    case HazardKind::kReadDuringWrite: return "read during write";
    case HazardKind::kWriteDuringWrite: return "write during write";
    case HazardKind::kWriteDuringRead: return "write during read";
  }
  return "?";
}

}  // namespace

// ---------------------------------------------------------------- PathFigures, handles

Duration StageFigures::time(std::uint64_t bytes) const {
  if (channels <= 1) return sim::transfer_time(bytes, bandwidth);
  // Blocks go round the channels; the busiest gets every full round plus at most one more block.
  const std::uint64_t stripe = interleave * channels;
  const std::uint64_t busiest = bytes / stripe * interleave + std::min(bytes % stripe, interleave);
  return sim::transfer_time(busiest, sim::Bandwidth{bandwidth.bytes_per_s / channels});
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
  if (!done()) rec_->event->wait();
  if (rec_) return rec_->sys->simulator().now();
  sim::Simulator* s = sim::Simulator::active();
  return s ? s->now() : 0;
}

void wait_all(std::span<TransferHandle> transfers) {
  for (TransferHandle& h : transfers) h.wait();
}

// ---------------------------------------------------------------- construction

System::System(sim::Simulator& sim, Topology topology, SystemOptions options)
    : sim_(&sim), topo_(std::move(topology)), opts_(options), router_(topo_) {
  for (const CubeSpec& spec : topo_.cubes) {
    const int c = spec.id;
    auto hbm = std::make_unique<Memory>(*this, MemoryKind::kHbm, static_cast<int>(memories_.size()), c, -1,
                                        fmt::format("cube{}.hbm", c), spec.hbm.capacity_bytes, spec.hbm.bandwidth,
                                        spec.hbm.latency, spec.hbm.channels, spec.hbm.interleave_bytes);
    auto cube = std::make_unique<Cube>(spec, *hbm);
    memories_.push_back(std::move(hbm));
    for (int p = 0; p < spec.pes; ++p) {
      auto tcm = std::make_unique<Memory>(*this, MemoryKind::kTcm, static_cast<int>(memories_.size()), c, p,
                                          fmt::format("cube{}.pe{}.tcm", c, p), spec.pe.tcm.capacity_bytes,
                                          spec.pe.tcm.bandwidth, spec.pe.tcm.latency, 1, spec.pe.tcm.capacity_bytes);
      cube->pes_.push_back(std::make_unique<Pe>(*this, c, p, spec.pe, *tcm));
      memories_.push_back(std::move(tcm));
    }
    cubes_.push_back(std::move(cube));
  }
  if (topo_.host.present) {
    auto h = std::make_unique<Memory>(*this, MemoryKind::kHost, static_cast<int>(memories_.size()), -1, -1, "host",
                                      topo_.host.capacity_bytes, topo_.host.bandwidth, topo_.host.latency, 1,
                                      topo_.host.capacity_bytes);
    host_ = h.get();
    memories_.push_back(std::move(h));
  }
  // Local stages of a transfer may be booked up to this long before the simulator reaches the
  // time they are ready (see advance()); bookings older than that can be forgotten.
  for (const auto& m : memories_) lookback_ = std::max(lookback_, m->latency());
  for (const CubeSpec& c : topo_.cubes) lookback_ = std::max(lookback_, c.pe.dma.overhead);
  for (std::size_t i = 0; i < topo_.links.size(); ++i) {
    const LinkSpec& l = topo_.links[i];
    const Duration extra = l.from == kSwitchNode ? topo_.switch_latency : 0;
    links_.push_back(std::make_unique<Link>(static_cast<int>(i), l, extra));
    if (l.from >= 0) cubes_[static_cast<std::size_t>(l.from)]->ports_.push_back(static_cast<int>(i));
  }
}

System::~System() = default;

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

std::string System::actor() const {
  if (const sim::Process* p = sim_->current()) return fmt::format("'{}'", p->name());
  return "a callback";
}

// ---------------------------------------------------------------- paths

const Path& System::path(Memory& src, Memory& dst) {
  const std::uint64_t key = (static_cast<std::uint64_t>(src.id()) << 32) | static_cast<std::uint32_t>(dst.id());
  auto it = paths_.find(key);
  if (it != paths_.end()) return *it->second;
  return *paths_.emplace(key, build_path(src, dst)).first->second;
}

std::unique_ptr<Path> System::build_path(Memory& src, Memory& dst) {
  auto p = std::make_unique<Path>();
  auto memory_stage = [&](Memory& m, bool read) {
    Stage s;
    s.kind = Stage::kMemory;
    s.servers = m.channels_.data();
    s.nservers = m.channels();
    s.interleave = m.interleave_bytes();
    s.ideal = m.bandwidth();
    s.pre = read ? m.latency() : 0;  // writes are posted: they cost bandwidth, not latency
    s.src_side = read;
    s.memory = &m;
    s.label = fmt::format("{} ({})", m.name(), read ? "read" : "write");
    p->stages.push_back(std::move(s));
  };
  auto dma_stage = [&](Pe& pe, bool read_channel) {
    DmaChannel& ch = read_channel ? pe.dma().read : pe.dma().write;
    Stage s;
    s.kind = Stage::kDma;
    s.servers = &ch.server;
    s.ideal = ch.server.bandwidth;
    s.pe = &pe;
    s.src_side = read_channel;  // for the trace: which channel
    s.label = fmt::format("{}.dma.{}", pe.name(), read_channel ? "read" : "write");
    p->stages.push_back(std::move(s));
    if (!p->injector) {
      p->injector = &ch;
      p->injector_overhead = pe.spec().dma.overhead;
      p->chunk = pe.spec().dma.chunk_bytes;
    }
  };
  auto link_stage = [&](int id) {
    Link& l = *links_.at(static_cast<std::size_t>(id));
    Stage s;
    s.kind = Stage::kLink;
    s.servers = &l.server();
    s.ideal = l.bandwidth();
    s.pre = l.entry_delay();
    s.post = l.latency();
    s.link = &l;
    s.label = fmt::format("link {}", l.name());
    p->stages.push_back(std::move(s));
    p->figures.links.push_back(id);
  };

  Pe* src_pe = src.kind() == MemoryKind::kTcm ? &pe(src.cube(), src.pe()) : nullptr;
  Pe* dst_pe = dst.kind() == MemoryKind::kTcm ? &pe(dst.cube(), dst.pe()) : nullptr;
  memory_stage(src, true);
  if (src_pe) dma_stage(*src_pe, false);
  const bool src_host = src.kind() == MemoryKind::kHost, dst_host = dst.kind() == MemoryKind::kHost;
  if (src_host && !dst_host) {
    link_stage(router_.link_between(kHostNode, dst.cube()));
  } else if (dst_host && !src_host) {
    link_stage(router_.link_between(src.cube(), kHostNode));
  } else if (!src_host && src.cube() != dst.cube()) {
    for (int li : router_.route(src.cube(), dst.cube())) link_stage(li);
  }
  if (dst_pe) dma_stage(*dst_pe, true);
  memory_stage(dst, false);

  const bool has_links = !p->figures.links.empty();
  if (has_links || !p->injector) p->chunk = topo_.chunk_bytes;

  PathFigures& f = p->figures;
  f.chunk_bytes = p->chunk;
  f.hops = static_cast<int>(f.links.size());
  f.alpha = p->injector_overhead;
  f.bandwidth = p->stages.front().ideal;
  bool before_link = true;
  for (const Stage& s : p->stages) {
    if (s.kind == Stage::kLink) before_link = false;
    if (before_link && has_links) p->d_pre += s.pre + s.post;
    f.alpha += s.pre + s.post;
    if (s.ideal.bytes_per_s < f.bandwidth.bytes_per_s) f.bandwidth = s.ideal;
    StageFigures sf{s.label, s.ideal, s.nservers, s.interleave, s.pre + s.post};
    // Sources inject at the pace of the slowest stage's service of a full chunk.
    p->pace = std::max(p->pace, sf.time(p->chunk));
    f.stages.push_back(std::move(sf));
  }
  f.chunk_time = p->pace;
  return p;
}

PathFigures System::path_figures(Memory& src, Memory& dst) { return path(src, dst).figures; }

// ---------------------------------------------------------------- transfers

TransferHandle System::start_transfer(MemRef src, MemRef dst, std::uint64_t bytes) {
  if (!src.memory || !dst.memory) throw TransferError("transfer: a MemRef with no memory (use memory.at(addr))");
  return start_transfer(*src.memory, Region::contiguous(src.addr, bytes), *dst.memory,
                        Region::contiguous(dst.addr, bytes));
}

TransferHandle System::start_transfer(Memory& src, const Region& sr, Memory& dst, const Region& dr) {
  if (&src.system() != this || &dst.system() != this) {
    throw TransferError(fmt::format("transfer {} -> {}: a memory of another System", src.name(), dst.name()));
  }
  for (const auto* r : {&sr, &dr}) {
    if (r->rows > 1 && r->pitch < r->row_bytes) {
      throw TransferError(fmt::format("transfer {} -> {}: region {} has pitch {} < row_bytes {}; rows must not overlap",
                                      src.name(), dst.name(), region_string(*r), r->pitch, r->row_bytes));
    }
  }
  if (sr.bytes() != dr.bytes()) {
    throw TransferError(fmt::format("transfer {} -> {}: the source holds {} bytes ({}) but the destination {} ({}); "
                                    "they must hold the same number",
                                    src.name(), dst.name(), sr.bytes(), region_string(sr), dr.bytes(), region_string(dr)));
  }
  src.check_region(sr, "transfer source");
  dst.check_region(dr, "transfer destination");
  if (&src == &dst && sr.overlaps(dr)) {
    throw TransferError(fmt::format("transfer within {}: source {} and destination {} overlap; DMA engines do not "
                                    "promise memmove order, so give disjoint regions",
                                    src.name(), region_string(sr), region_string(dr)));
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
  r->src_region = sr;
  r->dst_region = dr;
  r->issued = sim_->now();
  const bool tracking = opts_.hazards != HazardMode::kOff;
  if (tracking || (opts_.functional && opts_.check_uninitialized)) r->issuer = actor();
  if (tracking) {
    check_hazards(src, sr, false, r);
    check_hazards(dst, dr, true, r);
  }
  if (opts_.functional && opts_.check_uninitialized) {
    for (std::uint64_t row = 0; row < sr.rows; ++row) {
      if (auto u = src.store_.first_unwritten(sr.row_addr(row), sr.row_bytes)) {
        const std::string msg = fmt::format(
            "{}: transfer {} issued by {} at {} reads its source {} but byte {:#x} was never written (to {}); write "
            "the source first, or set SystemOptions::check_uninitialized = false to read zeros",
            src.name(), r->id, r->issuer, sim::format_time(r->issued), region_string(sr), *u, dst.name());
        throw UninitializedReadError(msg, *u);
      }
    }
  }
  Path& p = const_cast<Path&>(path(src, dst));
  r->path = &p;
  r->bytes = bytes;
  r->chunk = p.chunk;
  r->nchunks = (bytes + p.chunk - 1) / p.chunk;
  r->landed = 0;
  r->landing = 0;
  r->done = false;
  r->event.reset();
  r->event.emplace("transfer");
  Time first = r->issued;
  if (p.injector) {
    first = std::max(first, p.injector->next_inject) + p.injector_overhead;
    p.injector->next_inject = first + r->nchunks * p.pace;
  }
  r->first_inject = first;
  if (tracking) {
    src.in_flight_.push_back({r, sr, false});
    dst.in_flight_.push_back({r, dr, true});
  }
  ++started_;
  sim_->at(first + p.d_pre, ChunkInject{r, 0});
  guard.r = nullptr;
  return TransferHandle(r, r->id);
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
  const std::uint64_t c = std::min(r->chunk, r->bytes - off);
  const Time now = sim_->now();
  for (std::size_t i = stage; i < p.stages.size(); ++i) {
    Stage& st = p.stages[i];
    // A link is served when the chunk's head reaches it, so chunks from different flows meet in
    // arrival order.
    if (st.kind == Stage::kLink && head > now) {
      sim_->at(head, ChunkStep{r, tail, chunk, static_cast<std::uint32_t>(i)});
      return;
    }
    std::tie(head, tail) = serve(st, *r, off, c, chunk, head, tail);
  }
  r->landing = std::max(r->landing, tail);
  if (++r->landed == r->nchunks) sim_->at(r->landing, TransferLanded{r});
}

std::pair<Time, Time> System::serve(Stage& st, const TransferRecord& r, std::uint64_t offset, std::uint64_t bytes,
                                    std::uint64_t chunk, Time head, Time tail) {
  const bool tracing = sim_->trace().enabled();
  if (st.kind == Stage::kLink) {
    Server& s = *st.servers;
    const Time start = std::max(head + st.pre, s.free);
    // Cut-through: the chunk may not finish on this link before its tail has arrived.
    const Time end = std::max(start + s.duration(bytes), tail + st.pre);
    s.free = end;
    s.account(bytes, end - start);
    if (tracing) trace_stage(st, s, 0, r, chunk, start, end, bytes);
    return {start + st.post, end + st.post};
  }
  // Memories and DMA channels: each server does its piece's work in the gaps from the head's
  // arrival on; the chunk leaves once the work is done and its tail has arrived.
  const Time forget = sim_->now() > lookback_ ? sim_->now() - lookback_ : 0;
  Time first = sim::kTimeMax, last = 0;
  // Books n bytes of work (each of `servers` channels doing n; `total` in all) on s.
  auto piece_on = [&](Server& s, std::uint64_t ch, std::uint64_t n, std::uint64_t total) {
    const sim::Duration d = s.duration(n);
    const auto [start, end] = s.book(forget, head + st.pre, d);
    s.account(total, d);
    first = std::min(first, start);
    last = std::max(last, end);
    if (tracing) trace_stage(st, s, ch, r, chunk, start, end, total);
  };
  auto piece = [&](std::uint32_t ch, std::uint64_t n) { piece_on(st.servers[ch], ch, n, n); };
  if (st.nservers == 1) {
    piece(0, bytes);
  } else {
    Memory& m = *st.memory;
    const std::uint64_t addr = region_addr(st.src_side ? r.src_region : r.dst_region, offset);
    const std::uint64_t stripe = st.interleave * st.nservers;
    const bool even = addr % st.interleave == 0 && bytes % stripe == 0;
    if (even && !m.uniform_) {
      // The channels may have drifted back into step: all idle again.
      bool idle = true;
      for (Server& c : m.channels_) {
        c.forget(forget);
        idle = idle && c.bookings() == 0;
      }
      if (idle) {
        m.stripe_.forget(sim::kTimeMax);
        m.uniform_ = true;
      }
    }
    if (even && m.uniform_) {
      piece_on(m.stripe_, sim::kTimeMax, bytes / st.nservers, bytes);
    } else {
      if (m.uniform_) {
        m.stripe_.forget(forget);
        for (Server& c : m.channels_) c.copy_bookings(m.stripe_);
        m.uniform_ = false;
      }
      for_each_piece(addr, bytes, st.interleave, st.nservers, piece);
    }
  }
  return {first + st.post, std::max(last, tail + st.pre) + st.post};
}

void System::trace_stage(Stage& st, Server& s, std::uint64_t channel, const TransferRecord& r, std::uint64_t chunk,
                         Time start, Time end, std::uint64_t bytes) {
  sim::Trace& tr = sim_->trace();
  if (s.track == Server::kNoTrack) {
    std::string group, name;
    switch (st.kind) {
      case Stage::kLink:
        group = "links";
        name = st.label;
        break;
      case Stage::kDma:
        group = fmt::format("cube{}", st.pe->cube());
        name = fmt::format("pe{}.dma.{}", st.pe->index(), st.src_side ? "read" : "write");
        break;
      case Stage::kMemory: {
        const Memory& m = *st.memory;
        group = m.kind() == MemoryKind::kHost ? "host" : fmt::format("cube{}", m.cube());
        const std::string base = m.kind() == MemoryKind::kTcm ? fmt::format("pe{}.tcm", m.pe())
                                 : m.kind() == MemoryKind::kHbm ? "hbm" : "memory";
        // Evenly striped chunks go on the memory's own track, others on their channel's.
        name = st.nservers > 1 && channel != sim::kTimeMax ? fmt::format("{}.ch{}", base, channel) : base;
        break;
      }
    }
    s.track = tr.track(name, group);
  }
  start = std::max(start, s.traced_until);
  if (end <= start) return;
  s.traced_until = end;
  tr.span(s.track, fmt::format("t{}", r.id), start, end,
          {{"bytes", bytes}, {"chunk", chunk}, {"from", r.src->name()}, {"to", r.dst->name()}});
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
  }
  for (Memory* m : {r->src, r->dst}) {
    auto& v = m->in_flight_;
    v.erase(std::remove_if(v.begin(), v.end(), [r](const Memory::InFlight& f) { return f.rec == r; }), v.end());
  }
  ++completed_;
  bytes_moved_ += r->bytes;
  r->done = true;
  r->event->trigger();
  r->next_free = free_records_;
  free_records_ = r;
}

// ---------------------------------------------------------------- hazards

void System::check_hazards(Memory& m, const Region& region, bool write, const TransferRecord* self) {
  if (opts_.hazards == HazardMode::kOff) return;
  for (std::size_t i = 0; i < m.in_flight_.size(); ++i) {
    const Memory::InFlight f = m.in_flight_[i];
    if (f.rec == self || (!write && !f.write) || !f.region.overlaps(region)) continue;
    HazardReport h;
    h.kind = write ? (f.write ? HazardKind::kWriteDuringWrite : HazardKind::kWriteDuringRead) : HazardKind::kReadDuringWrite;
    h.time = sim_->now();
    h.memory = m.name();
    h.actor = self ? fmt::format("transfer {} issued by {}", self->id, self->issuer) : actor();
    h.region = region;
    const TransferRecord& o = *f.rec;
    h.other_transfer = o.id;
    h.other_region = f.region;
    h.other_actor = fmt::format("transfer {} issued by {} at {} ({} {} -> {} {})", o.id, o.issuer,
                                sim::format_time(o.issued), o.src->name(), region_string(o.src_region), o.dst->name(),
                                region_string(o.dst_region));
    const bool landed_known = o.landed == o.nchunks;
    h.message = fmt::format(
        "hazard ({}) at {} in {}: {} {} {} while {} is still {} {}{}; wait for that transfer before touching these bytes",
        hazard_kind_name(h.kind), sim::format_time(h.time), h.memory, h.actor, write ? "writes" : "reads",
        region_string(region), h.other_actor, f.write ? "writing" : "reading", region_string(f.region),
        landed_known ? fmt::format(" (it lands at {})", sim::format_time(o.landing)) : std::string());
    if (opts_.hazards == HazardMode::kThrow) throw HazardError(std::move(h));
    hazards_.push_back(std::move(h));
  }
}

}  // namespace cubesim::hw
