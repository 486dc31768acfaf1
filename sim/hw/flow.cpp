// Flow-level timing: a transfer is one flow of fluid through its path's units, each a FIFO queue
// as at the chunk level (engine.h has the model).
//
// Units are settled at the simulated times where something changes there: a flow's arrival rate (it
// starts, its source stops, or the unit before it changed the rate it leaves at), a change reaching
// the head of the unit's backlog, the backlog draining. Settling a unit takes its backlog to now,
// takes in the changes that reached the head, queues the new arrivals behind the backlog (or takes
// them in at once when there is none) and works out each flow's leaving rate, which is its arrival
// rate at its next unit, settled at this same time. Rates are doubles computed in a fixed order (the
// order units and flows changed), so a run gives the same bits every time.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "sim/hw/engine.h"
#include "sim/hw/l2_cache.h"
#include "sim/hw/system.h"

namespace cubesim::hw {

namespace {

// Float slack: a unit is over capacity, a rate has changed, beyond this relative margin (rounding
// must not count a unit one flow fills exactly as congested, nor send a change on for nothing).
constexpr double kSlack = 1e-9;
// Settling one time: a change goes on from unit to unit along its flows' paths; where paths make a
// cycle of congested units, the changes shrink round it (each congested unit passes on a part) but
// need not vanish, so past this many settlements of units at one time a change below this margin is
// no longer sent on.
constexpr std::size_t kSettlePerUnit = 64;
constexpr double kLooseSlack = 1e-6;

struct FlowStart {
  FlowEngine* e;
  TransferRecord* r;
  void operator()() const { e->start(r); }
};
struct FlowStop {
  FlowEngine* e;
  TransferRecord* r;
  std::uint32_t generation;
  void operator()() const { e->stop(r, generation); }
};
struct FlowUnshared {
  FlowEngine* e;
  TransferRecord* r;
  void operator()() const { e->finish_unshared(r); }
};
struct FlowWake {
  FlowEngine* e;
  FlowResource* res;
  std::uint32_t drain_gen;
  bool drain;
  void operator()() const { e->wake(res, drain_gen, drain); }
};
struct FlowHop {
  FlowEngine* e;
  TransferRecord* r;
  sim::Time tail;
  std::uint32_t index;
  void operator()() const { e->hop_due(r, index, tail); }
};
struct FlowPacketOut {
  FlowEngine* e;
  TransferRecord* r;
  void operator()() const { e->packet_out(r); }
};
struct FlowSettle {
  FlowEngine* e;
  void operator()() const { e->settle(); }
};
// After every other event at its time: the changes at that time are all known.
constexpr int kSettleLast = 32767;

bool differs(double a, double b, double slack) {
  if (a == b) return false;
  if (a == 0 || b == 0) return true;
  return std::abs(a - b) > slack * std::max(a, b);
}

// The time `bytes` occupy stage s of path p (on a link: the wire bytes; an L2 read that hits: the
// L2's own figures, not the cold path's).
sim::Duration stage_time(const Path& p, std::size_t s, std::uint64_t bytes, WireScale wire, bool l2_hit) {
  const Stage& st = p.stages[s];
  if (st.cache_read && l2_hit) return st.cache_read->figures().time(bytes);
  return st.fig->time(st.arrival ? wire.of(bytes) : bytes);
}

// Whether every byte of `r` is in the L2 now.
bool held(const L2Cache& l2, const Region& r) {
  for (std::uint64_t row = 0; row < r.rows; ++row) {
    if (!l2.holds(r.row_addr(row), r.row_bytes)) return false;
  }
  return true;
}

}  // namespace

FlowEngine::FlowEngine(System& sys) : sys_(&sys) {}

const Path::FlowTimes& FlowEngine::times(const TransferRecord* r) {
  Path& p = *r->path;
  const bool memo = p.stages.size() <= kMemoStages;
  Path::FlowTimes& t = memo ? p.flow_times : times_scratch_;
  const std::uint64_t last = r->bytes - (r->nchunks - 1) * r->chunk;
  if ((memo || scratch_path_ == &p) && t.chunk == r->chunk && t.last == last && t.wire.wire == r->wire.wire &&
      t.wire.data == r->wire.data) {
    return t;
  }
  if (!memo) scratch_path_ = &p;
  t.chunk = r->chunk;
  t.last = last;
  t.wire = r->wire;
  t.pace = t.slowest = 0;
  t.each.resize(p.stages.size());
  for (std::size_t s = 0; s < p.stages.size(); ++s) {
    const Stage& st = p.stages[s];
    t.each[s] = {.chunk = stage_time(p, s, r->chunk, r->wire, false),
                 .last = stage_time(p, s, last, r->wire, false),
                 .counters = st.unit->kind() == UnitKind::l2 ? nullptr : &st.unit->flow_counters(),
                 .res = &resource(*st.unit),
                 .arrival = st.arrival};
    t.pace = std::max(t.pace, t.each[s].chunk);
    t.slowest = std::max(t.slowest, t.each[s].last);
  }
  return t;
}

void FlowEngine::add_leg(TransferRecord* r, FlowResource& e, double w) {
  if (e.leg_mark == leg_stamp_) {
    r->legs[e.leg].weight += w;  // a copy within one memory reads and writes it
  } else {
    e.leg_mark = leg_stamp_;
    e.leg = static_cast<std::uint32_t>(r->legs.size());
    r->legs.push_back(FlowLeg{&e, w, 0});
  }
}

FlowResource& FlowEngine::resource(PathUnit& u) {
  if (res_.empty()) res_.resize(static_cast<std::size_t>(sys_->num_units()));
  FlowResource& e = res_[u.id().value];
  if (!e.unit) {
    e.unit = &u;
    const std::uint64_t bw = u.figures().bandwidth.bytes_per_s;
    e.ps_per_byte = static_cast<double>(sim::kPsPerS) / static_cast<double>(bw);
  }
  return e;
}

bool FlowEngine::by_chunks(const TransferRecord* r) {
  if (r->nchunks > kByChunks) return false;
  // The slowest stage decides whether it is latency-bound (a flow outside the queues).
  const Path::FlowTimes& t = times(r);
  return static_cast<sim::Duration>(r->nchunks - 1) * t.pace + t.slowest > kLatencyBound;
}

void FlowEngine::start(TransferRecord* r) {
  sim::Simulator& sim = sys_->simulator();
  if (r->first_inject > sim.now()) {
    sim.at(r->first_inject, FlowStart{this, r});
    return;
  }
  const Path& p = *r->path;
  // An L2 on the path keeps its state as at the chunk level: the whole transfer is looked up (and
  // filled, or allocated by a write) now, and a source it holds entirely is read at the L2's figures
  // without the HBM's latency. (Its counters, hits and misses come from that lookup.) The chunk level
  // times the last chunk of such a message (engine.h).
  r->l2_hit = false;
  r->delays = p.flow_delays;
  r->path_l2 = p.l2;
  const std::uint64_t body = r->nchunks > 1 ? (r->nchunks - 1) * r->chunk : r->bytes;
  // What each L2 of the path moves to and from its HBM for this body (fills and write-backs): the
  // flow uses the HBM for them, as the chunk level books its channels (at most two L2s: each end).
  struct Below {
    const L2Cache* l2;
    std::uint64_t bytes;
  };
  std::array<Below, 2> below{};
  std::size_t belows = 0;
  if (p.l2) {  // most paths have none: no walk over their stages' units
    // Its L2 stages in path order; a copy within one cube has its L2 twice (read, then write).
    std::array<const Stage*, 4> l2s{};
    std::size_t n = 0;
    bool twice = false;
    for (const Stage& st : p.stages) {
      if (st.unit->kind() != UnitKind::l2 || n == l2s.size()) continue;
      for (std::size_t k = 0; k < n; ++k) twice = twice || l2s[k]->unit == st.unit;
      l2s[n++] = &st;
    }
    std::array<std::uint64_t, 2> before{};
    for (std::size_t k = 0; k < n; ++k) {
      auto& l2 = static_cast<L2Cache&>(*l2s[k]->unit);
      const Region& reg = l2s[k]->src_side ? r->src_region : r->dst_region;
      if (l2s[k]->cache_read && held(l2, reg)) {
        r->l2_hit = true;
        r->delays -= l2.memory().latency();
      }
      std::size_t i = 0;
      while (i < belows && below[i].l2 != &l2) ++i;
      if (i == belows && belows < below.size()) {
        below[belows] = {&l2, 0};
        before[belows++] = l2.below_bytes();
      }
    }
    const sim::Time now = sim.now();
    auto visit = [&](const Stage& st, std::uint64_t chunk, std::uint64_t off, std::uint64_t bytes) {
      auto& l2 = static_cast<L2Cache&>(*st.unit);
      const Region& reg = st.src_side ? r->src_region : r->dst_region;
      l2.serve(ChunkVisit{.transfer = r->id, .from = r->src_unit, .to = r->dst_unit, .chunk = chunk, .region = &reg,
                          .offset = off, .bytes = bytes, .head = now, .tail = now, .pre = st.pre,
                          .forget_before = now, .read = st.src_side});
    };
    if (!twice) {
      for (std::size_t k = 0; k < n; ++k) visit(*l2s[k], 0, 0, body);
    } else {
      // Chunk by chunk, read then write, as the chunk level looks them up: the order decides which
      // lines are dirty when they are evicted (a copy larger than the L2 writes back what it wrote).
      std::uint64_t c = 0;
      for (std::uint64_t off = 0; off < body; off += r->chunk, ++c) {
        for (std::size_t k = 0; k < n; ++k) visit(*l2s[k], c, off, std::min(r->chunk, body - off));
      }
    }
    for (std::size_t i = 0; i < belows; ++i) below[i].bytes = below[i].l2->below_bytes() - before[i];
  }
  // The idle time: every full chunk at the pace of the slowest stage, the last at its own. The
  // source injects at one rate over it (the last chunk's bytes spread over the flow). A protocol's
  // wire scale does not slow the source (the chunk level injects at the path's pace for the payload,
  // and its links queue the wire bytes): such a flow's links then build a backlog of it even alone,
  // which drains in the idle time (to the picosecond per chunk), and beside others it takes the
  // share of a link its wire bytes arrive at, as at the chunk level.
  sim::Duration pace = 0, slowest = 0;
  const Path::FlowTimes& memo = times(r);  // (its stage times, and each stage's unit state for the legs)
  if (!r->wire.identity()) {
    const std::uint64_t last = r->bytes - (r->nchunks - 1) * r->chunk;
    for (std::size_t s = 0; s < p.stages.size(); ++s) {
      pace = std::max(pace, stage_time(p, s, r->chunk, WireScale{}, r->l2_hit));
      slowest = std::max(slowest, stage_time(p, s, last, WireScale{}, r->l2_hit));
    }
  } else if (!r->l2_hit) {
    pace = memo.pace;
    slowest = memo.slowest;
  } else {
    const std::uint64_t last = r->bytes - (r->nchunks - 1) * r->chunk;
    for (std::size_t s = 0; s < p.stages.size(); ++s) {
      pace = std::max(pace, stage_time(p, s, r->chunk, r->wire, true));
      slowest = std::max(slowest, stage_time(p, s, last, r->wire, true));
    }
  }
  // The source injects the chunks but the last at the pace; the last chunk follows as one piece
  // (engine.h), or, where nothing on the path is congested by then, lands its idle time later.
  const sim::Duration whole = std::max<sim::Duration>(1, static_cast<sim::Duration>(r->nchunks - 1) * pace + slowest);
  r->full = r->nchunks > 1 ? static_cast<sim::Duration>(r->nchunks - 1) * pace : whole;
  r->tail = r->nchunks > 1 ? slowest : 0;
  r->cap = static_cast<double>(body) / static_cast<double>(r->full);
  r->split = r->packet = false;
  r->body_done = r->packet_done = false;
  r->started = sim.now();
  r->legs.clear();
  ++r->generation;
  if (whole <= kLatencyBound) {  // latency-bound: outside the queues
    r->full = whole;
    r->tail = 0;
    sim.at(sim.now() + whole, FlowUnshared{this, r});
    return;
  }
  if (++leg_stamp_ == 0) {
    for (FlowResource& e : res_) e.leg_mark = 0;
    leg_stamp_ = 1;
  }
  // Each stage's unit state from the path's memo (not through the unit: one line fewer per stage).
  for (const Path::FlowTimes::Each& each : memo.each) {
    FlowResource& e = *each.res;
    const double w = e.ps_per_byte * (each.arrival && !r->wire.identity()
                                          ? static_cast<double>(r->wire.wire) / static_cast<double>(r->wire.data)
                                          : 1.0);
    add_leg(r, e, w);
  }
  r->hops = static_cast<std::uint32_t>(r->legs.size());
  // Behind each L2, its HBM: the bytes the L2 fills and writes back for this flow, per byte of the
  // flow. Fluid that loads the HBM (a copy larger than the L2 waits for its write-backs there, as at
  // the chunk level), after the path's legs: the last chunk does not pass it as a hop.
  for (std::size_t i = 0; i < belows; ++i) {
    if (below[i].bytes == 0) continue;
    FlowResource& m = resource(below[i].l2->memory());
    add_leg(r, m, m.ps_per_byte * static_cast<double>(below[i].bytes) / static_cast<double>(body));
  }
  // Fast path: no unit of its path has a backlog or is over capacity with it: its rate passes every
  // unit unchanged and nobody else's changes (what settling would find, without it). Entered at its
  // rate, taken back to nothing where that does not hold (rare: contention).
  bool fast = true;
  for (std::uint32_t i = 0; i < r->legs.size(); ++i) {
    FlowLeg& l = r->legs[i];
    FlowResource& e = *l.res;
    l.slot = static_cast<std::uint32_t>(e.flows.size());
    const double load = l.weight * r->cap;
    e.flows.push_back({.flow = r, .weight = l.weight, .leg = &l, .index = i, .in = r->cap, .head = r->cap, .out = r->cap});
    e.load_in += load;
    e.load_head += load;
    fast = fast && !e.dirty && !e.queued() && e.load_in <= 1.0 + kSlack;
  }
  r->quiet = fast ? marks_ : 0;
  if (!fast) {
    for (const FlowLeg& l : r->legs) {
      FlowResource& e = *l.res;
      FlowResource::Entry& x = e.flows[l.slot];
      e.load_in -= l.weight * r->cap;
      e.load_head -= l.weight * r->cap;
      x.in = x.head = x.out = 0;
    }
  }
  if (!fast) arrive(r, 0, r->cap);
  sim.at(sim.now() + r->full, FlowStop{this, r, r->generation});
}

void FlowEngine::stop(TransferRecord* r, std::uint32_t generation) {
  if (r->generation != generation) return;  // (safety: a failed run's events are dropped with it)
  // Fast path: no unit of its path has a backlog or is over capacity: the fluid's last byte passes
  // them all now, its leaving changes nobody's rate, and the last chunk takes its idle time (or, on
  // a path through an L2, the chunk level's).
  // (Nothing marked since it started on the fast path: every unit of its path is as then, or was
  // touched only by other flows on the fast path, which keep it within capacity.)
  bool fast = r->quiet == marks_;
  if (!fast) {
    fast = true;
    for (const FlowLeg& l : r->legs) {
      const FlowResource& e = *l.res;
      fast = fast && !e.dirty && !e.queued() && e.load_head <= 1.0 + kSlack;
    }
  }
  if (fast) {
    r->split = r->tail > 0 && r->path_l2;
    body_out(r);
    return;
  }
  arrive(r, 0, 0.0, true);
  if (r->tail > 0) {
    r->packet = true;
    if (r->path->l2) look_up_last(r);
    hops_.push_back({.r = r, .index = 0, .tail = sys_->simulator().now()});
  }
}

void FlowEngine::look_up_last(TransferRecord* r) {
  // As the chunk level's last chunk would: looked up (and filled) now, read without the HBM's
  // latency where the L2 holds it.
  const sim::Time now = sys_->simulator().now();
  const std::uint64_t off = (r->nchunks - 1) * r->chunk, last = r->bytes - off;
  for (const Stage& st : r->path->stages) {
    if (st.unit->kind() != UnitKind::l2) continue;
    auto& l2 = static_cast<L2Cache&>(*st.unit);
    const Region& reg = st.src_side ? r->src_region : r->dst_region;
    if (st.cache_read) {
      const bool hit = reg.rows == 1 ? l2.holds(reg.addr + off, last) : held(l2, reg);
      if (hit != r->l2_hit) r->delays += hit ? -l2.memory().latency() : l2.memory().latency();
    }
    l2.serve(ChunkVisit{.transfer = r->id, .from = r->src_unit, .to = r->dst_unit, .chunk = r->nchunks - 1,
                        .region = &reg, .offset = off, .bytes = last, .head = now, .tail = now, .pre = st.pre,
                        .forget_before = now, .read = st.src_side});
  }
}

void FlowEngine::finish_unshared(TransferRecord* r) {
  body_out(r);
}

void FlowEngine::hop_due(TransferRecord* r, std::uint32_t index, sim::Time tail) {
  hops_.push_back({.r = r, .index = index, .tail = tail});
  settle_soon();
}

void FlowEngine::hop(const Hop& h) {
  sim::Simulator& sim = sys_->simulator();
  const sim::Time now = sim.now();
  const FlowLeg& l = h.r->legs[h.index];
  FlowResource& e = *l.res;
  if (e.backlog_at < now) {
    e.backlog = std::max(0.0, e.backlog + (e.load_in - 1.0) * static_cast<double>(now - e.backlog_at));
    e.backlog_at = now;
  }
  const double work = l.weight * static_cast<double>(h.r->bytes - (h.r->nchunks - 1) * h.r->chunk);
  // Its place in the queue: behind the backlog (FIFO). A congested unit counts its work in the
  // backlog, so what arrives later waits for it too; a unit with room passes it beside its fluid
  // (counting it there would make the unit look congested and speed its fluid up to drain it).
  const bool congested = e.queued() || e.load_in > 1.0 + kSlack;
  if (!congested) e.backlog = 0;
  sim::Time start = now + static_cast<sim::Duration>(std::ceil(e.backlog + (congested && e.unit->order() == PathUnit::Order::arrival ? in_round(e, h.r) : 0.0)));
  // FIFO among last chunks too: one that comes later is served after the one before it (whose start
  // may lie beyond the backlog by the others' chunks still arriving, which the backlog does not
  // count), so a unit's pauses follow one another in time order.
  if (e.pause_head < e.pauses.size()) start = std::max(start, e.pauses.back().second);
  const sim::Time end = std::max(start + static_cast<sim::Duration>(std::ceil(work)), h.tail);
  if (congested) {
    e.backlog += work;
    const sim::Time served = start + static_cast<sim::Duration>(std::ceil(work));
    e.pauses.push_back({start, served});
    if (start > now) sim.at(start, FlowWake{.e = this, .res = &e, .drain_gen = 0, .drain = false});
    sim.at(served, FlowWake{.e = this, .res = &e, .drain_gen = 0, .drain = false});  // its fluid resumes
    mark(e);  // (its drain moves)
  }
  if (h.index + 1 < h.r->hops) {
    if (start > now) {
      sim.at(start, FlowHop{.e = this, .r = h.r, .tail = end, .index = h.index + 1});
    } else {
      hops_.push_back({.r = h.r, .index = h.index + 1, .tail = end});
    }
  } else {
    sim.at(std::max(end, now + 1), FlowPacketOut{this, h.r});
  }
}

double FlowEngine::in_round(const FlowResource& e, const TransferRecord* r) const {
  // At a link the chunk level queues a chunk whole when its head arrives; here the others' chunks
  // arrive as fluid over their source's chunk time, so part of a chunk whose head came before r's is
  // still to arrive: r's last chunk waits for it too. Counted only for transfers between the same
  // two memories (a collective's channels, one pair's messages): their chunks come on a beat with
  // the same fixed delays as r's, so the phase is known; a head arriving together with r's is ahead
  // when its transfer was issued first. (From other sources the phase is off by the difference of
  // the fixed delays, which the flow level leaves out: counting those made dgx_h100x8's tree 18%
  // slow, docs/PERFORMANCE.md.) Only flows arriving at their source's pace (held back nowhere
  // before this unit) keep the beat.
  const sim::Time now = sys_->simulator().now();
  double work = 0;
  for (const FlowResource::Entry& x : e.flows) {
    const TransferRecord* f = x.flow;
    if (f == r || f->path != r->path || f->nchunks < 2 || differs(x.in, f->cap, kSlack)) continue;
    const sim::Duration pace = f->full / static_cast<sim::Duration>(f->nchunks - 1);
    if (pace == 0) continue;
    const sim::Duration phase = (now - f->started) % pace;
    const sim::Duration left = phase > 0 ? pace - phase : f->id < r->id ? pace : 0;
    work += x.weight * x.in * static_cast<double>(left);
  }
  return work;
}

void FlowEngine::packet_out(TransferRecord* r) {
  r->packet_done = true;
  if (r->body_done) complete(r);
}

void FlowEngine::arrive(TransferRecord* r, std::uint32_t index, double rate, bool last) {
  FlowResource& e = *r->legs[index].res;
  e.inbox.push_back({.depart = 0, .flow = r, .index = index, .rate = rate, .last = last});
  mark(e);
}

void FlowEngine::mark(FlowResource& e) {
  marks_ += 2;
  if (!e.dirty) {
    e.dirty = true;
    dirty_.push_back(&e);
  }
  settle_soon();
}

void FlowEngine::settle_soon() {
  if (!settle_due_) {
    settle_due_ = true;
    sys_->simulator().at(sys_->simulator().now(), FlowSettle{this}, kSettleLast);
  }
}

void FlowEngine::wake(FlowResource* e, std::uint32_t drain_gen, bool drain) {
  if (drain) {
    if (drain_gen != e->drain_gen) {  // its arrivals changed since: a later event drains it
      sys_->simulator().note_noop_event();  // (and this one does not move the end of a run)
      return;
    }
    e->drain_pending = false;
  }
  mark(*e);
}

void FlowEngine::settle() {
  // Units in the order they changed; one settled again when a change comes back to it (paths that
  // meet again further on, or a cycle of congested units: see kSettlePerUnit). Last chunks reaching
  // a unit now queue once its arrivals are settled (behind its own fluid's last byte).
  const std::size_t loose_after = kSettlePerUnit * (dirty_.size() + 16);
  std::size_t i = 0;
  for (;;) {
    for (; i < dirty_.size(); ++i) {
      FlowResource& e = *dirty_[i];
      e.dirty = false;
      slack_ = i < loose_after ? kSlack : kLooseSlack;
      settle_unit(e);
    }
    if (hops_.empty()) break;
    hop_scratch_.swap(hops_);
    for (const Hop& h : hop_scratch_) hop(h);
    hop_scratch_.clear();
  }
  dirty_.clear();
  settle_due_ = false;
  for (std::size_t k = 0; k < done_.size(); ++k) body_out(done_[k]);  // may start flows (a landing's callback)
  done_.clear();
}

void FlowEngine::settle_unit(FlowResource& e) {
  sim::Simulator& sim = sys_->simulator();
  const sim::Time now = sim.now();
  if (e.backlog_at < now) {
    e.backlog = std::max(0.0, e.backlog + (e.load_in - 1.0) * static_cast<double>(now - e.backlog_at));
    e.backlog_at = now;
  }
  // Changes that reached the head: the bytes leaving now arrived at those rates.
  auto entry = [](const FlowResource::Change& c) -> FlowResource::Entry& {
    const FlowLeg& l = c.flow->legs[c.index];
    return l.res->flows[l.slot];
  };
  while (e.pending_head < e.pending.size() && e.pending[e.pending_head].depart <= now) {
    const FlowResource::Change& c = e.pending[e.pending_head++];
    FlowResource::Entry& x = entry(c);
    x.head = c.rate;
    x.ended = x.ended || c.last;
  }
  if (e.pending_head == e.pending.size()) {
    e.pending.clear();
    e.pending_head = 0;
  } else if (e.pending_head > 64 && 2 * e.pending_head > e.pending.size()) {
    e.pending.erase(e.pending.begin(), e.pending.begin() + static_cast<std::ptrdiff_t>(e.pending_head));
    e.pending_head = 0;
  }
  const bool backlog = e.queued();
  if (!backlog) e.backlog = 0;
  if (!e.inbox.empty()) {
    // New arrival rates: behind the backlog, they reach the head once the work queued before them
    // is done; without one, at once.
    // (Each settlement's changes depart after the last one's, by a picosecond if need be, so a flow's
    // rate never rises and falls back within one departure and its last byte is always seen to leave.)
    const sim::Time depart = std::max(now + static_cast<sim::Duration>(std::ceil(e.backlog)), e.wake_at + 1);
    for (const FlowResource::Change& c : e.inbox) {
      FlowResource::Entry& x = entry(c);
      x.in = c.rate;
      if (backlog) {
        e.pending.push_back({.depart = depart, .flow = c.flow, .index = c.index, .rate = c.rate, .last = c.last});
      } else {
        x.head = c.rate;
        x.ended = x.ended || c.last;
      }
    }
    e.inbox.clear();
    if (backlog) {
      e.wake_at = depart;
      sim.at(depart, FlowWake{.e = this, .res = &e, .drain_gen = 0, .drain = false});
    }
  }
  double in = 0, head = 0;
  for (const FlowResource::Entry& x : e.flows) {
    in += x.weight * x.in;
    head += x.weight * x.head;
  }
  e.load_in = in;
  e.load_head = head;
  // Leaving rates: as they arrived, or, with a backlog (or over capacity as one starts), the unit's
  // full rate shared in proportion to the rates at the head; nothing while it serves a last chunk.
  while (e.pause_head < e.pauses.size() && e.pauses[e.pause_head].second <= now) ++e.pause_head;
  if (e.pause_head == e.pauses.size()) {
    e.pauses.clear();
    e.pause_head = 0;
  }
  const bool paused = e.pause_head < e.pauses.size() && e.pauses[e.pause_head].first <= now;
  const bool full = backlog || head > 1.0 + kSlack;
  const double scale = paused ? 0.0 : !full ? 1.0 : head > 0 ? 1.0 / head : 0.0;
  for (FlowResource::Entry& x : e.flows) {
    const double out = x.head * scale;
    TransferRecord* f = x.flow;
    if (x.ended && !x.passed) {  // its last byte leaves (FIFO: the work before it is done)
      x.passed = true;
      x.out = 0;
      if (x.index + 1 < f->legs.size()) {
        arrive(f, x.index + 1, 0.0, true);
      } else {
        done_.push_back(f);  // its last byte has left its last unit
      }
      continue;
    }
    if (x.passed || !differs(out, x.out, slack_)) continue;
    x.out = out;
    if (x.index + 1 < f->legs.size()) arrive(f, x.index + 1, out);
  }
  if (e.backlog > 0 && in < 1.0 - kSlack) {
    // (Arrivals a hair under the unit's rate put the drain far ahead; a later change of arrivals
    // supersedes it. Clamped so that the time stays representable.)
    const double t = std::min(std::ceil(e.backlog / (1.0 - in)), static_cast<double>(sim::kTimeMax / 4));
    const sim::Time at = sim::add(now, static_cast<sim::Duration>(t));
    // A drain already due at that very time stays current: no second event (under many flows a
    // unit is settled again and again with the same drain ahead; each new event left the last one
    // in the queue as a no-op: 36% of the drain events of a hierarchical all-reduce on a 1-D ring).
    // The unit's mark() then comes from the earlier event, among the events of that time: the
    // order units settle in may change, so results could in principle; the sweep's 837 rows did not.
    if (!e.drain_pending || e.drain_at != at) {
      ++e.drain_gen;
      e.drain_pending = true;
      e.drain_at = at;
      // (A departure's wake-up due then settles the unit as the drain would: none of its own.)
      if (e.wake_at != at) sim.at(at, FlowWake{.e = this, .res = &e, .drain_gen = e.drain_gen, .drain = true});
    }
  } else {
    ++e.drain_gen;  // the queued drain, if any, is void
    e.drain_pending = false;
  }
}

void FlowEngine::body_out(TransferRecord* r) {
  for (const FlowLeg& l : r->legs) {
    FlowResource& e = *l.res;
    auto& v = e.flows;
    FlowResource::Entry& x = v[l.slot];
    e.load_in -= x.weight * x.in;  // (a flow on the fast path leaves at its rate; others at zero)
    e.load_head -= x.weight * x.head;
    v[l.slot] = v.back();
    v.pop_back();
    if (l.slot < v.size()) v[l.slot].leg->slot = l.slot;  // the flow moved into the slot
    if (v.empty()) e.load_in = e.load_head = 0;  // no rounding left behind
  }
  r->body_done = true;
  if (!r->packet || r->packet_done) complete(r);
}

void FlowEngine::complete(TransferRecord* r) {
  sim::Simulator& sim = sys_->simulator();
  // Counters: the transfer's bytes on each unit (wire bytes on links), the chunks it stands for, and
  // the time it takes the unit at full rate; a split flow's last chunk counts where it passes.
  const std::uint64_t last = r->split ? 0 : r->bytes - (r->nchunks - 1) * r->chunk;
  const std::uint64_t chunks = r->split ? r->nchunks - 1 : r->nchunks;
  const std::uint64_t bytes = (r->nchunks - 1) * r->chunk + last;
  for (const Path::FlowTimes::Each& e : times(r).each) {
    if (!e.counters) continue;  // an L2: counted by its lookup when the flow started
    const sim::Duration busy = static_cast<sim::Duration>(r->nchunks - 1) * e.chunk + (r->split ? 0 : e.last);
    PathUnit::flow_account(*e.counters, e.arrival ? r->wire.of(bytes) : bytes, chunks, busy);
  }
  if (sim.trace().enabled()) trace_flow(r, bytes);
  if (r->split) {
    sys_->inject_tail(r, 0);
    return;
  }
  // The bytes land once the path's fixed delays have passed (the injection overhead was paid before
  // the flow started), after the last chunk's idle time on the fast path.
  const sim::Duration after = r->delays + (r->packet ? 0 : r->tail);
  r->landing = sim.now() + after;
  r->landed = r->nchunks;
  sys_->land_after(r, after);
}

void FlowEngine::abandon() {
  for (FlowResource& e : res_) {
    e.flows.clear();
    e.pending.clear();
    e.pending_head = 0;
    e.inbox.clear();
    e.pauses.clear();
    e.pause_head = 0;
    e.load_in = e.load_head = e.backlog = 0;
    e.backlog_at = 0;
    e.wake_at = 0;
    ++e.drain_gen;
    e.drain_pending = false;  // the queue was cleared: a drain at drain_at would never come
    e.drain_at = 0;
    e.dirty = false;
  }
  dirty_.clear();
  done_.clear();
  hops_.clear();
  settle_due_ = false;  // the failed run's events are gone
}

void FlowEngine::trace_flow(TransferRecord* r, std::uint64_t bytes) {
  sim::Trace& tr = sys_->simulator().trace();
  const sim::Time now = sys_->simulator().now();
  for (const Stage& st : r->path->stages) {  // a unit twice (a copy within a memory): one span
    FlowResource& e = resource(*st.unit);
    if (e.track == Server::kNoTrack) e.track = tr.track(e.unit->track_name(), e.unit->track_group());
    // A track's spans must not overlap: a flow sharing the unit shows from where the last one ended.
    const sim::Time from = std::max(r->started, e.traced_until);
    if (now <= from) continue;
    e.traced_until = now;
    tr.span(e.track, fmt::format("t{}", r->id), from, now,
            {{"bytes", bytes}, {"from", r->src_unit->name()}, {"to", r->dst_unit->name()}, {"flow", std::int64_t{1}}});
  }
}

}  // namespace cubesim::hw
