// Flow-level timing: a transfer is one flow sharing its path's units max-min fairly (engine.h).
//
// Each unit is a constraint: the sum over its flows of weight x rate is at most 1 (a weight is the
// unit's time per payload byte of that flow: wire bytes over bandwidth). Each flow is also capped at
// its idle rate, bytes / full, where full is exactly the chunk level's time for the transfer on an
// idle path less its fixed delays: so an uncontended transfer lands when the chunk level says, and
// contended ones share as the chunk level's FIFO interleaving does, up to the pipelining the flow
// level leaves out (the chunks of a message filling a path one after another).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "sim/hw/engine.h"
#include "sim/hw/l2_cache.h"
#include "sim/hw/system.h"

namespace cubesim::hw {

namespace {

// Float slack: a unit is full, a flow at its cap, within this relative margin. Rates are doubles
// computed in a fixed order, so the same run gives the same bits; the margin only keeps rounding from
// counting a unit one flow fills exactly as one that limits.
constexpr double kSlack = 1e-9;

struct FlowStart {
  FlowEngine* e;
  TransferRecord* r;
  void operator()() const { e->start(r); }
};
struct FlowReshare {
  FlowEngine* e;
  void operator()() const { e->reshare(); }
};
// A flow whose remaining time at its rate is this long (10^6 s) or more, or infinite at rate 0, is
// starved: it waits for the next recomputation instead of an end event.
constexpr double kStarved = 1e18;

// Whether a unit can hold a flow below its cap: its flows' caps together exceed it.
bool limits(const FlowResource& e) { return e.demand > 1.0 + kSlack; }

// After every other event at its time: the flows that start and end then are all known.
constexpr int kReshareLast = 32767;
// After the flows ending at its time have ended, before their rates are reshared.
constexpr int kTailAfterEnds = kReshareLast - 1;
struct FlowTail {
  FlowEngine* e;
  TransferRecord* r;
  void operator()() const { e->start_tail(r); }
};
struct FlowRelease {
  FlowEngine* e;
  TransferRecord* r;
  std::uint32_t generation;
  void operator()() const {
    if (r->generation == generation) e->release(r);  // else it landed (and was released) already
  }
};
struct FlowEnd {
  FlowEngine* e;
  TransferRecord* r;
  std::uint32_t generation;
  void operator()() const { e->end(r, generation); }
};

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
                 .arrival = st.arrival};
    t.pace = std::max(t.pace, t.each[s].chunk);
    t.slowest = std::max(t.slowest, t.each[s].last);
  }
  return t;
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

double FlowEngine::fill_level(const FlowResource& e) {
  // Every flow's rate rises alike, each stopping at its cap: the level at which the unit is full.
  level_scratch_.clear();
  for (const FlowResource::Entry& x : e.flows) level_scratch_.push_back({x.cap, x.weight});
  std::sort(level_scratch_.begin(), level_scratch_.end());
  double below = 0, wrest = 0;  // weight x cap of the flows capped below the level; weight of the rest
  for (const auto& [cap, w] : level_scratch_) wrest += w;
  for (const auto& [cap, w] : level_scratch_) {
    if (below + wrest * cap >= 1.0) return (1.0 - below) / wrest;
    below += w * cap;
    wrest -= w;
  }
  return std::numeric_limits<double>::infinity();
}

void FlowEngine::refresh_demand(FlowResource& e) {
  double d = 0;
  for (const FlowResource::Entry& x : e.flows) d += x.weight * x.cap;
  e.demand = d;
}

bool FlowEngine::by_chunks(const TransferRecord* r) {
  if (r->nchunks != 1) return false;
  // One chunk: the last is the message; the slowest stage decides whether it is latency-bound (a flow
  // outside the sharing).
  return times(r).slowest > kLatencyBound;
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
  // without the HBM's latency. (Its counters, hits and misses come from that lookup.)
  r->l2_hit = false;
  r->delays = p.figures.alpha - p.injector_overhead;
  r->split = r->nchunks > 1;  // the flow is the chunks but the last (engine.h); the chunk level does that one
  const std::uint64_t body = r->split ? (r->nchunks - 1) * r->chunk : r->bytes;
  r->l2_path = false;
  for (const Stage& st : p.stages) {
    if (!p.l2) break;  // most paths have none: no walk over their stages' units
    if (st.unit->kind() != UnitKind::l2) continue;
    r->l2_path = true;
    auto& l2 = static_cast<L2Cache&>(*st.unit);
    const Region& reg = st.src_side ? r->src_region : r->dst_region;
    if (st.cache_read && held(l2, reg)) {
      r->l2_hit = true;
      r->delays -= l2.memory().latency();
    }
    const sim::Time now = sim.now();
    l2.serve(ChunkVisit{.transfer = r->id, .from = r->src_name, .to = r->dst_name, .region = &reg, .bytes = body,
                        .head = now, .tail = now, .pre = st.pre, .forget_before = now, .read = st.src_side});
  }
  // The idle time: every full chunk at the pace of the slowest stage, the last at its own. A split
  // flow is the full chunks; the last one follows (tail).
  sim::Duration pace = 0, slowest = 0;
  if (!r->l2_hit) {
    const Path::FlowTimes& t = times(r);
    pace = t.pace;
    slowest = t.slowest;
  } else {
    const std::uint64_t last = r->bytes - (r->nchunks - 1) * r->chunk;
    for (std::size_t s = 0; s < p.stages.size(); ++s) {
      pace = std::max(pace, stage_time(p, s, r->chunk, r->wire, true));
      slowest = std::max(slowest, stage_time(p, s, last, r->wire, true));
    }
  }
  r->tail = r->split ? slowest : 0;
  r->full = std::max<sim::Duration>(1, static_cast<sim::Duration>(r->nchunks - 1) * pace + (r->split ? 0 : slowest));
  r->cap = static_cast<double>(body) / static_cast<double>(r->full);
  r->throttled = false;
  r->rate = 0;
  r->remaining = static_cast<double>(body);
  r->started = r->updated = sim.now();
  r->legs.clear();
  if (r->full <= kLatencyBound) {  // latency-bound: outside the sharing
    r->rate = r->cap;
    reschedule(r);  // at its idle time, the chunk level's
    return;
  }
  if (++leg_stamp_ == 0) {
    for (FlowResource& e : res_) e.leg_mark = 0;
    leg_stamp_ = 1;
  }
  for (const Stage& st : p.stages) {
    FlowResource& e = resource(*st.unit);
    const double w = e.ps_per_byte * (st.arrival && !r->wire.identity()
                                          ? static_cast<double>(r->wire.wire) / static_cast<double>(r->wire.data)
                                          : 1.0);
    if (e.leg_mark == leg_stamp_) {
      r->legs[e.leg].weight += w;  // a copy within one memory reads and writes it
    } else {
      e.leg_mark = leg_stamp_;
      e.leg = static_cast<std::uint32_t>(r->legs.size());
      r->legs.push_back(FlowLeg{&e, w, 0});
    }
  }
  bool limited = false;
  for (std::size_t i = 0; i < r->legs.size(); ++i) {
    FlowLeg& l = r->legs[i];
    l.slot = static_cast<std::uint32_t>(l.res->flows.size());
    l.res->flows.push_back({r, l.weight, r->cap, &l});
    l.res->demand += l.weight * r->cap;
    limited = limited || limits(*l.res);
  }
  if (limited) {
    changed(r);
    return;
  }
  // No unit of its path can hold anyone below their cap, even with it: it runs at its cap and
  // nobody's rate changes (what the recomputation would find, without it).
  r->rate = r->cap;
  reschedule(r);
}

void FlowEngine::end(TransferRecord* r, std::uint32_t generation) {
  if (r->generation != generation) return;  // its rate changed since: a later event ends it
  sim::Simulator& sim = sys_->simulator();
  r->remaining = 0;
  ++r->generation;
  const bool by_chunks = r->split && (r->throttled || r->l2_path);
  if (by_chunks) {
    r->tailing = true;  // keeps its rate and its place on its units until its last chunk has passed
  } else {
    r->rate = 0;
    if (leave(r)) changed(r);
  }
  // Counters: the transfer's bytes on each unit (wire bytes on links), the chunks it stands for, and
  // the time it takes the unit at full rate; the last chunk of a flow split at a tail that the chunk
  // level times counts where it passes.
  const std::uint64_t last = by_chunks ? 0 : r->bytes - (r->nchunks - 1) * r->chunk;
  const std::uint64_t chunks = by_chunks ? r->nchunks - 1 : r->nchunks;
  const std::uint64_t bytes = (r->nchunks - 1) * r->chunk + last;
  for (const Path::FlowTimes::Each& e : times(r).each) {
    if (!e.counters) continue;  // an L2: counted by its lookup when the flow started
    const sim::Duration busy = static_cast<sim::Duration>(r->nchunks - 1) * e.chunk + (by_chunks ? 0 : e.last);
    PathUnit::flow_account(*e.counters, e.arrival ? r->wire.of(bytes) : bytes, chunks, busy);
  }
  if (sim.trace().enabled()) trace_flow(r, bytes);
  if (by_chunks) {
    sim.at(sim.now(), FlowTail{this, r}, kTailAfterEnds);
    return;
  }
  // The bytes land once the path's fixed delays have passed (the injection overhead was paid
  // before the flow started).
  // (A split flow that no unit ever held below its cap is still followed by its last chunk at the
  // chunk level's idle time for it.)
  const sim::Duration after = r->tail + r->delays;
  r->landing = sim.now() + after;
  r->landed = r->nchunks;
  sys_->land_after(r, after);
}

bool FlowEngine::leave(TransferRecord* r) {
  bool limited = false;  // a unit of its path could hold flows below their cap: they may speed up now
  for (const FlowLeg& l : r->legs) {  // none for a latency-bound flow
    limited = limited || limits(*l.res);
    auto& v = l.res->flows;
    v[l.slot] = v.back();
    v.pop_back();
    if (l.slot < v.size()) v[l.slot].leg->slot = l.slot;  // the flow moved into the slot
    refresh_demand(*l.res);
  }
  return limited;
}

void FlowEngine::start_tail(TransferRecord* r) {
  // The last chunk is served at what the other flows on each unit leave of it, at their rates from
  // before this time's reshare (flows that ended together with r are gone; the last chunks of others
  // waiting or passing meet this one at the chunk level): beside a flow that shared a link half and
  // half it takes two chunk times, as when the chunk level's round robin serves one chunk of the
  // other first; after contenders that all ended now, it takes one, and the chunk level orders those
  // last chunks among themselves. Where the others leave it less than a turn in a round of them all
  // (one chunk each, as the chunk level's FIFO serves chunks of equal flows), it gets that. Until the
  // chunk has passed its slowest stage the flow keeps its rate on its units, so the others do not
  // take its share while its last chunk still uses it.
  const double last = static_cast<double>(r->bytes - (r->nchunks - 1) * r->chunk);
  double idle = 0, slow = 0;
  for (const FlowLeg& l : r->legs) {
    double used = 0;
    std::size_t others = 0;
    for (const FlowResource::Entry& x : l.res->flows) {
      if (x.flow->tailing) continue;
      used += x.weight * x.flow->rate;
      ++others;
    }
    const double left = std::max(1.0 - used, 1.0 / static_cast<double>(1 + others));
    idle = std::max(idle, l.weight * last);
    slow = std::max(slow, l.weight * last / left);
  }
  const auto wait = static_cast<sim::Duration>(std::max(0.0, std::ceil(slow - idle)));
  sys_->simulator().at(sys_->simulator().now() + wait + r->tail, FlowRelease{this, r, r->generation});
  sys_->inject_tail(r, wait);
}

void FlowEngine::release(TransferRecord* r) {
  if (!r->tailing) return;
  r->tailing = false;
  r->rate = 0;
  if (leave(r)) changed(r);
}

void FlowEngine::abandon() {
  for (FlowResource& e : res_) {
    e.flows.clear();
    e.demand = 0;
    e.changed = false;
  }
  changed_.clear();
  reshare_due_ = false;  // the failed run's events are gone
}

void FlowEngine::changed(const TransferRecord* r) {
  for (const FlowLeg& l : r->legs) {
    if (!l.res->changed) {
      l.res->changed = true;
      changed_.push_back(l.res);
    }
  }
  if (!reshare_due_) {
    reshare_due_ = true;
    sys_->simulator().at(sys_->simulator().now(), FlowReshare{this}, kReshareLast);
  }
}

void FlowEngine::reshare() {
  reshare_due_ = false;
  // The flows whose rates may change: every flow on the changed flow's units, then, through units
  // that can limit (demand above bandwidth), the flows there that the unit can hold below their cap:
  // those whose cap is above the level at which the unit fills when all its flows rise alike (a flow
  // capped below that level never waits for the unit, whatever the others do). Flows left out keep
  // their rates; their share of a unit in the computation is taken off its bandwidth first.
  if (++stamp_ == 0) {
    for (FlowResource& e : res_) e.mark = 0;
    stamp_ = 1;
  }
  comp_flows_.clear();
  comp_res_.clear();
  auto take_flows = [&](FlowResource& e) {
    for (const FlowResource::Entry& x : e.flows) {
      if (x.flow->mark != stamp_ && !x.flow->tailing) {  // a flow's last chunk keeps its rate: left out
        x.flow->mark = stamp_;
        comp_flows_.push_back(x.flow);
      }
    }
  };
  for (FlowResource* c : changed_) {
    FlowResource& e = *c;
    e.changed = false;
    if (e.mark == stamp_) continue;
    e.mark = stamp_;
    if (limits(e)) comp_res_.push_back(&e);
    take_flows(e);
  }
  for (std::size_t i = 0; i < comp_flows_.size(); ++i) {
    for (const FlowLeg& l : comp_flows_[i]->legs) {
      FlowResource& e = *l.res;
      if (e.mark == stamp_ || !limits(e)) continue;
      e.mark = stamp_;
      comp_res_.push_back(&e);
      const double level = fill_level(e);
      for (const FlowResource::Entry& x : e.flows) {
        if (x.cap > level * (1.0 - kSlack) && x.flow->mark != stamp_ && !x.flow->tailing) {
          x.flow->mark = stamp_;
          comp_flows_.push_back(x.flow);
        }
      }
    }
  }
  changed_.clear();
  if (comp_flows_.empty()) return;

  // Progressive filling: every unsettled flow's rate grows alike until a limiting unit is full
  // (its flows settle) or the flow reaches its cap (it settles).
  for (TransferRecord* f : comp_flows_) {
    f->fill = 0;
    f->frozen = false;
  }
  for (FlowResource* e : comp_res_) {
    e->used = 0;  // what the flows left out take of it
    for (const FlowResource::Entry& x : e->flows) {
      if (x.flow->mark != stamp_) e->used += x.weight * x.flow->rate;
    }
    e->saturated = false;
  }
  std::size_t unsettled = comp_flows_.size();
  while (unsettled > 0) {
    double delta = std::numeric_limits<double>::infinity();
    for (const TransferRecord* f : comp_flows_) {
      if (!f->frozen) delta = std::min(delta, f->cap - f->fill);
    }
    for (FlowResource* e : comp_res_) {
      e->wsum = 0;
      if (e->saturated) continue;
      for (const FlowResource::Entry& x : e->flows) {
        if (x.flow->mark == stamp_ && !x.flow->frozen) e->wsum += x.weight;
      }
      if (e->wsum > 0) delta = std::min(delta, (1.0 - e->used) / e->wsum);
    }
    delta = std::max(delta, 0.0);
    for (TransferRecord* f : comp_flows_) {
      if (!f->frozen) f->fill += delta;
    }
    for (FlowResource* e : comp_res_) {
      if (e->wsum == 0) continue;
      e->used += delta * e->wsum;
      if (e->used >= 1.0 - kSlack) {
        e->saturated = true;
        for (const FlowResource::Entry& x : e->flows) {
          if (x.flow->mark == stamp_ && !x.flow->frozen) {
            x.flow->frozen = true;
            --unsettled;
          }
        }
      }
    }
    for (TransferRecord* f : comp_flows_) {
      if (!f->frozen && f->fill >= f->cap * (1.0 - kSlack)) {
        f->fill = f->cap;
        f->frozen = true;
        --unsettled;
      }
    }
  }
  const sim::Time now = sys_->simulator().now();
  for (TransferRecord* f : comp_flows_) {
    if (f->rate > 0 && std::abs(f->fill - f->rate) <= kSlack * f->rate) continue;  // unchanged: its end stands
    f->remaining = std::max(0.0, f->remaining - f->rate * static_cast<double>(now - f->updated));
    f->updated = now;
    f->rate = f->fill;
    f->throttled = f->throttled || f->fill < f->cap * (1.0 - kSlack);
    reschedule(f);
  }
}

void FlowEngine::reschedule(TransferRecord* f) {
  sim::Simulator& sim = sys_->simulator();
  const sim::Time now = sim.now();
  const std::uint64_t body = f->split ? (f->nchunks - 1) * f->chunk : f->bytes;
  sim::Duration left;
  if (f->rate == f->cap && f->remaining == static_cast<double>(body)) {
    left = f->full;  // idle all along so far: exactly the chunk level's time
  } else {
    const double t = std::ceil(f->remaining / f->rate * (1.0 - 1e-12));
    if (!(t < kStarved)) {
      // Held at (next to) nothing by the last chunks of flows that keep their share until those
      // have passed: no end until their release recomputes its rate (any earlier end is void).
      ++f->generation;
      return;
    }
    left = static_cast<sim::Duration>(t);
  }
  sim.at(now + left, FlowEnd{this, f, ++f->generation});
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
            {{"bytes", bytes}, {"from", *r->src_name}, {"to", *r->dst_name}, {"flow", std::int64_t{1}}});
  }
}

}  // namespace cubesim::hw
