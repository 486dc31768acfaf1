// The nccl family: NCCL's choice of algorithm and protocol, and its channels and slices, over
// Comm, in the chunking and reduction order nccl.h documents.
#include "runtime/algorithms/nccl.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "sim/core/event.h"

namespace cubesim::rt::algo {

std::string_view nccl_algo_name(NcclAlgo a) {
  switch (a) {
    case NcclAlgo::ring: return "ring";
    case NcclAlgo::tree: return "tree";
  }
  return "?";
}

std::string NcclPlan::describe() const {
  return fmt::format("{}/{} x{}", nccl_algo_name(algo), hw::nccl_protocol_name(protocol), channels);
}

namespace {

constexpr NcclAlgo kAlgos[] = {NcclAlgo::ring, NcclAlgo::tree};
constexpr int kMaxNcclSlices = 1024;

double us(sim::Duration d) { return static_cast<double>(d) / 1e6; }
int algo_index(NcclAlgo a) { return a == NcclAlgo::ring ? 0 : 1; }

int nsteps(Collective k, int p) {
  switch (k) {
    case Collective::all_reduce: return 2 * (p - 1);
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::broadcast: return p - 1;
  }
  return p - 1;
}

bool allowed(Collective k, NcclAlgo a, const hw::NcclSpec& s) {
  switch (a) {
    case NcclAlgo::ring: return s.ring;
    case NcclAlgo::tree: return s.tree && k == Collective::all_reduce;
  }
  return false;
}

}  // namespace

double nccl_predicted_us(Collective k, int p, std::uint64_t bytes, NcclAlgo a, hw::NcclProtocol proto,
                         const hw::NcclSpec& spec) {
  const hw::NcclProtocolSpec& f = spec.protocol(proto);
  if (!allowed(k, a, spec) || !f.enabled) return -1;
  const int ai = algo_index(a);
  const double fixed = us(spec.launch_latency) + us(f.base_latency[ai]);
  if (p <= 1) return fixed;
  double bus = spec.channels * spec.channel_bandwidth_GBps * f.data_bytes / f.wire_bytes;
  if (f.max_bus_GBps > 0) bus = std::min(bus, f.max_bus_GBps);
  const int steps = nsteps(k, p);
  double alg = 0;
  int lat_steps = 0;
  switch (a) {
    case NcclAlgo::ring:
      alg = k == Collective::broadcast ? bus : bus * p / steps;
      lat_steps = steps;
      break;
    case NcclAlgo::tree:
      alg = bus * f.tree_bandwidth_factor / 2;
      lat_steps = 2 * (p - 1);
      break;
  }
  // GB/s = 1e3 bytes per microsecond.
  return fixed + lat_steps * us(f.hop_latency[ai]) + static_cast<double>(bytes) / (alg * 1e3);
}

NcclPlan nccl_plan(Collective k, int p, std::uint64_t bytes, const hw::NcclSpec& spec) {
  NcclPlan best;
  bool found = false;
  for (NcclAlgo a : kAlgos) {
    for (hw::NcclProtocol proto : hw::kNcclProtocols) {
      const double t = nccl_predicted_us(k, p, bytes, a, proto, spec);
      if (t < 0) continue;
      if (!found || t < best.predicted_us) {
        best.algo = a;
        best.protocol = proto;
        best.predicted_us = t;
        found = true;
      }
    }
  }
  if (!found) {
    std::vector<std::string> protos;
    for (hw::NcclProtocol proto : hw::kNcclProtocols) {
      if (spec.protocol(proto).enabled) protos.emplace_back(hw::nccl_protocol_name(proto));
    }
    throw RuntimeError(fmt::format(
        "nccl {}: the topology's nccl section allows no algorithm for it (nccl.algorithms: {}{}; enabled protocols: "
        "{}); all_reduce may run ring or tree, the other collectives only ring: add \"ring\" to nccl.algorithms",
        collective_kind_name(k), spec.ring ? "ring" : "", spec.tree ? (spec.ring ? ", tree" : "tree") : "",
        fmt::join(protos, ", ")));
  }
  best.channels = nccl_channels(best.algo, best.protocol, p, bytes, spec);
  return best;
}

int nccl_channels(NcclAlgo a, hw::NcclProtocol proto, int p, std::uint64_t bytes, const hw::NcclSpec& spec) {
  const hw::NcclProtocolSpec& f = spec.protocol(proto);
  const std::uint64_t per_channel =
      static_cast<std::uint64_t>(f.max_threads) * f.thread_threshold * (a == NcclAlgo::ring ? std::max(p, 1) : 1);
  if (per_channel == 0) return spec.channels;
  return static_cast<int>(std::clamp<std::uint64_t>(bytes / per_channel, 1, static_cast<std::uint64_t>(spec.channels)));
}

const hw::NcclSpec& nccl_spec_of(Comm& c) {
  const hw::Topology* t = c.context().backend().topology();
  if (t && t->nccl.present) return t->nccl;
  const std::optional<hw::NcclSpec>& given = c.context().options().nccl;
  return given ? *given : hw::NcclSpec::defaults();
}

bool nccl_copies_in_loop(Comm& c) {
  const hw::NcclSpec& s = nccl_spec_of(c);
  for (const hw::NcclProtocolSpec& f : s.protocols) {
    if (f.enabled && f.copy_GBps > 0) return true;
  }
  return false;
}

namespace {

// One call's plan and what its sends carry.
struct Run {
  NcclPlan plan;
  sim::Duration hop = 0;       // before every send (send_latency, else the tuning hop latency)
  hw::WireScale wire;
  std::uint64_t slice_bytes = 1;
  sim::Bandwidth send_bw;      // a channel's send loop, wire bytes
  sim::Bandwidth copy_bw;      // a channel's copy of a received slice into the output (0: free)
  int chunk_slices = 1;
  sim::Time t0 = 0;
};

// Plans the call, names it on the Comm and charges the launch and base latency.
Run begin(Comm& c, Collective k, int p, const Tensor& flat) {
  const hw::NcclSpec& spec = nccl_spec_of(c);
  Run r;
  r.plan = nccl_plan(k, p, flat.nbytes(), spec);
  const hw::NcclProtocolSpec& f = spec.protocol(r.plan.protocol);
  const int ai = algo_index(r.plan.algo);
  r.hop = f.has_send_latency ? f.send_latency : f.hop_latency[ai];
  r.wire = hw::WireScale{f.wire_bytes, f.data_bytes};
  r.slice_bytes = f.slice_bytes;
  r.send_bw = sim::Bandwidth::GBps(f.send_GBps > 0 ? f.send_GBps : spec.channel_bandwidth_GBps);
  if (f.copy_GBps > 0) r.copy_bw = sim::Bandwidth::GBps(f.copy_GBps);
  r.chunk_slices = f.chunk_slices;
  c.plan = "nccl " + r.plan.describe();
  r.t0 = c.context().simulator().now();
  const sim::Duration fixed = f.has_fixed_latency ? f.fixed_latency : f.base_latency[ai];
  c.context().backend().delay(c.rank(), spec.launch_latency + fixed, "nccl launch");
  return r;
}

void end(Comm& c, const Run& r) {
  c.wait_all();
  Context& ctx = c.context();
  auto& tr = ctx.trace();
  if (tr.enabled()) tr.span(ctx.comm_track(c.rank()), c.plan, r.t0, ctx.simulator().now());
}

int slices_of(std::uint64_t bytes, std::uint64_t slice_bytes) {
  const std::uint64_t s = (bytes + slice_bytes - 1) / slice_bytes;
  return static_cast<int>(std::clamp<std::uint64_t>(s, 1, kMaxNcclSlices));
}

// Runs fn(lane) for lanes 0..lanes-1 concurrently: lane 0 in the calling process, the others in
// helper processes of the rank.
template <class Fn>
void run_lanes(Comm& c, int lanes, const Fn& fn) {
  std::vector<std::shared_ptr<sim::Event>> done;
  done.reserve(static_cast<std::size_t>(lanes > 0 ? lanes - 1 : 0));
  for (int l = 1; l < lanes; ++l) {
    auto e = std::make_shared<sim::Event>("nccl channel");
    c.context().spawn_for_rank(c.rank(), fmt::format("rank{}/nccl ch{}", c.rank(), l), [&fn, l, e] {
      fn(l);
      e->trigger();
    });
    done.push_back(std::move(e));
  }
  if (lanes > 0) fn(0);
  for (auto& e : done) e->wait();
}

// Channels for a ring over M members of n elements: every channel gets at least one element of
// every chunk where there are enough (the results do not depend on it: nccl.h).
int ring_channels(int C, std::int64_t n, int M) {
  return static_cast<int>(std::clamp<std::int64_t>(n / M, 1, C));
}

// Channel ch of a ring: reduce-scatter (rs) and/or all-gather (ag) steps, slice by slice.
// R: the channel's ring order (positions in m), or null for m's own order.
void ring_channel(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, int C, int ch, const Run& r, bool rs,
                  bool ag, const std::vector<int>* R) {
  const int M = m.size();
  const std::int64_t n = flat.numel();
  // Ring position x is member position at(x) of m; it owns m's chunk at(x).
  auto at = [&](int x) { return R ? (*R)[static_cast<std::size_t>(Members::mod(x, M))] : Members::mod(x, M); };
  int j = m.pos;
  if (R) j = static_cast<int>(std::find(R->begin(), R->end(), m.pos) - R->begin());
  const int next = m.at(at(j + 1)), prev = m.at(at(j - 1));
  auto piece = [&](int i) {
    const Range ci = chunk_range(n, M, i);
    const Range pc = chunk_range(ci.count, C, ch);
    return Range{ci.begin + pc.begin, pc.count};
  };
  const int S = slices_of(static_cast<std::uint64_t>(piece(0).count) * dtype_size(flat.dtype()), r.slice_bytes);
  auto slice = [&](int x, int k) {  // ring position x's chunk
    const Range pc = piece(at(x));
    const Range sl = chunk_range(pc.count, S, k);
    return region(flat, Range{pc.begin + sl.begin, sl.count});
  };
  const std::uint64_t ph = m.phase * 4;
  // A channel is one SM's loop over the ring's steps (nccl.h, "channel"): it puts at most send_bw
  // of wire bytes per second on its way out, and a slice it only receives (the last step) it then
  // copies into the output at copy_bw; a send waits until the channel has done the previous work.
  sim::Simulator& sim = c.context().simulator();
  sim::Time ch_free = sim.now();
  auto pace = [&](const Tensor& sl) {
    const sim::Time now = sim.now();
    if (ch_free > now) c.context().backend().delay(c.rank(), ch_free - now, "nccl channel");
    ch_free = std::max(now, ch_free) + sim::transfer_time(r.wire.of(sl.nbytes()), r.send_bw);
    return sl;
  };
  auto copy_out = [&](const Tensor& sl) {
    if (r.copy_bw.bytes_per_s <= 0) return;
    ch_free = std::max(sim.now(), ch_free) + sim::transfer_time(sl.nbytes(), r.copy_bw);
  };
  // The channel's steps: reduce-scatter's M-1 (receives reduce), then all-gather's M-1. Step t
  // sends ring position x's chunk and receives position y's under tag (phase, t).
  const int nrs = rs ? M - 1 : 0, T = nrs + (ag ? M - 1 : 0);
  auto send_of = [&](int t, int k) { return t < nrs ? slice(Members::mod(j - t - 1, M), k) : slice(Members::mod(j - (t - nrs), M), k); };
  auto tag_of = [&](int t, int k) {
    const int s = t < nrs ? t : t - nrs;
    return tag(t < nrs ? ph : ph + 1, static_cast<std::uint64_t>(ch), static_cast<std::uint64_t>(k) * M + s);
  };
  auto recv_slice = [&](int t, int k) {
    return t < nrs ? slice(Members::mod(j - t - 2, M), k) : slice(Members::mod(j - (t - nrs) - 1, M), k);
  };
  // Chunk by chunk (chunk_slices slices, NCCL's chunk): every step sends the chunk's slices, each
  // after its receive of the step before. With more than one slice per chunk the receiver posts the
  // step's slices (its FIFO slots) before it works on them, so a step's slices pipeline down the
  // ring; with one, it posts each slice as it waits for it.
  const int G = std::max(1, r.chunk_slices);
  std::vector<Comm::Posted> posted(static_cast<std::size_t>(G > 1 ? 2 * G : 0));  // two steps' slots
  auto post = [&](int t, int k) {
    Comm::Posted& p = posted[static_cast<std::size_t>((t % 2) * G + (k % G))];
    p = t < nrs ? c.post_reduce(prev, recv_slice(t, k), op, tag_of(t, k)) : c.post(prev, recv_slice(t, k), tag_of(t, k));
  };
  auto receive = [&](int t, int k) {
    if (G == 1) {
      if (t < nrs) {
        c.recv_reduce(prev, recv_slice(t, k), op, tag_of(t, k));
      } else {
        c.recv(prev, recv_slice(t, k), tag_of(t, k));
      }
    } else {
      c.complete(posted[static_cast<std::size_t>((t % 2) * G + (k % G))]);
    }
    if (t == T - 1) copy_out(recv_slice(t, k));
  };
  for (int k0 = 0; k0 < S; k0 += G) {
    const int k1 = std::min(S, k0 + G);
    for (int t = 0; t < T; ++t) {
      if (G > 1) {
        for (int k = k0; k < k1; ++k) post(t, k);
      }
      for (int k = k0; k < k1; ++k) {
        if (t > 0) receive(t - 1, k);
        c.isend(next, pace(send_of(t, k)), tag_of(t, k), r.hop, r.wire);
      }
    }
    for (int k = k0; k < k1; ++k) receive(T - 1, k);
  }
  // The channel ends when its last copy does (without copies: when its sends and receives do).
  if (r.copy_bw.bytes_per_s > 0 && ch_free > sim.now()) {
    c.context().backend().delay(c.rank(), ch_free - sim.now(), "nccl channel");
  }
}

void ring_collective(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Run& r, bool rs, bool ag) {
  const int C = ring_channels(r.plan.channels, flat.numel(), m.size());
  const hw::NcclSpec& spec = nccl_spec_of(c);
  run_lanes(c, C, [&](int ch) { ring_channel(c, m, flat, op, C, ch, r, rs, ag, spec.ring_order(m.size(), ch)); });
}

// One lane of a binary tree over member positions L (L[i]'s children at 2i+1, 2i+2; i the
// caller's index): reduce up, then broadcast down, slice by slice (tree.h's order).
void tree_lane(Comm& c, const std::vector<int>& L, int i, const Tensor& part, ReduceOp op, std::uint64_t phase,
               int lane, const Run& r) {
  const int M = static_cast<int>(L.size());
  const int parent = i > 0 ? (i - 1) / 2 : -1;
  const int kids[2] = {2 * i + 1, 2 * i + 2};
  const int S = slices_of(part.nbytes(), r.slice_bytes);
  std::vector<Comm::Send> up(static_cast<std::size_t>(S));
  auto at = [&](int x) { return L[static_cast<std::size_t>(x)]; };
  const auto a = static_cast<std::uint64_t>(lane);
  for (int k = 0; k < S; ++k) {
    const Tensor sl = region(part, chunk_range(part.numel(), S, k));
    for (int ch : kids) {
      if (ch < M) c.recv_reduce(at(ch), sl, op, tag(phase, a, 2 * static_cast<std::uint64_t>(k)));
    }
    if (parent >= 0) {
      up[static_cast<std::size_t>(k)] = c.isend(at(parent), sl, tag(phase, a, 2 * static_cast<std::uint64_t>(k)), r.hop, r.wire);
    }
  }
  for (int k = 0; k < S; ++k) {
    const Tensor sl = region(part, chunk_range(part.numel(), S, k));
    if (parent >= 0) {
      c.wait(up[static_cast<std::size_t>(k)]);
      c.recv(at(parent), sl, tag(phase, a, 2 * static_cast<std::uint64_t>(k) + 1));
    }
    for (int ch : kids) {
      if (ch < M) c.isend(at(ch), sl, tag(phase, a, 2 * static_cast<std::uint64_t>(k) + 1), r.hop, r.wire);
    }
  }
}

void tree_all_reduce_lanes(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Run& r) {
  const int M = m.size();
  const std::vector<int> L[2] = {m.order, std::vector<int>(m.order.rbegin(), m.order.rend())};
  const int idx[2] = {m.pos, M - 1 - m.pos};
  const Tensor half[2] = {region(flat, chunk_range(flat.numel(), 2, 0)), region(flat, chunk_range(flat.numel(), 2, 1))};
  const int per = std::max(1, r.plan.channels / 2);
  run_lanes(c, 2 * per, [&](int lane) {
    const int t = lane / per, ch = lane % per;
    const Tensor part = region(half[t], chunk_range(half[t].numel(), per, ch));
    tree_lane(c, L[t], idx[t], part, op, m.phase * 4 + 3, lane, r);
  });
}

}  // namespace

void nccl_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  if (m.size() == 1) return;
  const Run r = begin(c, Collective::all_reduce, m.size(), flat);
  switch (r.plan.algo) {
    case NcclAlgo::ring: ring_collective(c, m, flat, op, r, true, true); break;
    case NcclAlgo::tree: tree_all_reduce_lanes(c, m, flat, op, r); break;
  }
  end(c, r);
}

void nccl_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params&) {
  if (m.size() == 1) return;
  const Run r = begin(c, Collective::reduce_scatter, m.size(), flat);
  ring_collective(c, m, flat, op, r, true, false);
  end(c, r);
}

void nccl_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  if (m.size() == 1) return;
  const Run r = begin(c, Collective::all_gather, m.size(), flat);
  ring_collective(c, m, flat, ReduceOp::sum, r, false, true);
  end(c, r);
}

void nccl_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params&) {
  const int M = m.size();
  if (M == 1) return;
  const Run r = begin(c, Collective::broadcast, M, flat);
  const int j = m.pos;
  const std::int64_t n = flat.numel();
  const int C = static_cast<int>(std::clamp<std::int64_t>(n, 1, r.plan.channels));
  run_lanes(c, C, [&](int ch) {
    const Tensor piece = region(flat, chunk_range(n, C, ch));
    const int S = slices_of(piece.nbytes(), r.slice_bytes);
    for (int k = 0; k < S; ++k) {
      const Tensor sl = region(piece, chunk_range(piece.numel(), S, k));
      const std::uint64_t t = tag(m.phase * 4 + 2, static_cast<std::uint64_t>(ch), static_cast<std::uint64_t>(k));
      if (j > 0) c.recv(m.at(j - 1), sl, t);
      if (j < M - 1) c.isend(m.at(j + 1), sl, t, r.hop, r.wire);
    }
  });
  end(c, r);
}

}  // namespace cubesim::rt::algo
