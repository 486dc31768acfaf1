// nccl.h — collectives as NCCL runs them: the `nccl` algorithm family.
//
// Per call, the `nccl` algorithm does what NCCL's enqueue does: it estimates the time of every
// allowed (algorithm, protocol) pair from the figures of the topology's "nccl" section and runs
// the fastest, over `channels` parallel rings (or trees), each pipelined in the protocol's slices.
//
// Figures (hw::NcclSpec, topology "nccl" section; topologies/README.md has the schema). A topology
// without the section uses NcclSpec::defaults() — NCCL's own tuning constants for Hopper over
// NVLink (src/graph/tuning.cc, src/graph/topo.h, src/include/device.h, src/init.cc) — and so does a
// backend without a topology (the host reference) unless its ContextOptions::nccl gives the
// figures: a host replay of a simulated run takes the topology's section there (tp's
// check_mlp_equivalence does), so it plans exactly as the simulated run did. The bits depend only
// on whether a call runs a ring or a tree (below): reduce_scatter, all_gather and broadcast give
// ring's bits whatever the figures.
//
// Selection (NCCL's rule: the smallest predicted time; nccl_plan() below):
//   candidates  all_reduce: ring, tree; all_gather, reduce_scatter, broadcast: ring — those the
//               section's "algorithms" allows — times every enabled protocol (LL, LL128, Simple).
//   nsteps      all_reduce 2(p-1); all_gather, reduce_scatter p-1; broadcast p-1 (the chain's hops).
//   bus bw      channels x channel_bandwidth x data_bytes / wire_bytes, capped at the protocol's
//               max_bus_bandwidth_GBps when given (NCCL's llMaxBw, per-channel LL128 caps).
//   alg bw      ring: bus bw x p / nsteps (broadcast: bus bw); tree (all_reduce): bus bw x the
//               protocol's tree_bandwidth_factor / 2 (NCCL's 0.92, LL 1/3.8, LL128 7/9 on one node).
//   latency     launch_latency + base_latency[algo] + nsteps x hop_latency[algo] (tree:
//               2(p-1) x hop, NCCL's intra-node chain).
//   time        latency + bytes / alg bw, bytes = the whole buffer (all_gather: the gathered one).
//   The minimum wins; ties go to the earlier candidate in the order ring, tree x LL, LL128,
//   Simple. Pure arithmetic on the figures: every rank computes the same plan.
//   Channels (NCCL's reduction for small calls, after the choice): the largest nc <= channels with
//   bytes >= nc x max_threads x thread_threshold_bytes (a ring's threshold x p), at least 1; NCCL's
//   512 x 8 (LL), 640 x 8 (LL128), 512 x 64 (Simple) by default (nccl_channels()).
//   NCCL's refinements not modelled: the tree correction factors per size, per-channel caps, the ring "plateau"
//   factor (multi-node only), the thread count of a one-channel call, the grain that leaves NCCL 22 channels
//   where the rule gives 24 at a few sizes (2 ranks 256 KiB).
//
// Data path (what runs, on every backend; the same per-rank code, so the host replays the bits):
//   Ring (all_reduce, reduce_scatter, all_gather). The buffer's p chunks are exactly ring.h's
//   (chunk_range(n, p, i), member i owns chunk i); channel c (0 <= c < C) takes piece c of every
//   chunk (chunk_range(len_i, C, c) inside chunk i), and each piece travels in S slices
//   (chunk_range(piece, S, k); S = ceil(largest piece's bytes / slice_bytes), 1..kMaxSlices, the
//   same S for every piece of the channel). Each channel is a concurrent process of the rank; it
//   runs chunk by chunk (G = the protocol's chunk_slices slices, NCCL's chunk), and for each chunk
//   all the ring steps (reduce-scatter's p-1, then all-gather's p-1), as NCCL's primitives do: a
//   step sends the chunk's slices, each after its receive of the step before, so chunk k+1 follows
//   chunk k down the ring. With G > 1 the receiver posts a step's G slices (its FIFO slots) before
//   it works on them, so the slices of a step pipeline; with G = 1 it posts each as it waits.
//   Ring orders: channel c uses R = the (c mod k)-th of the section's k "rings" of length p
//   (member indices; none: the group order 0, 1, ..., p-1). Ring position i is member R[i], sends
//   to R[i+1] and owns chunk R[i] (so reduce_scatter's member k still ends with chunk k).
//   Channels in use: of the plan's channels (above),
//   min(channels, n / p) (at least 1), so that a channel has an element of every chunk; broadcast
//   min(channels, n); a tree all_reduce max(1, channels / 2) per tree. The plan names the plan's
//   channel count.
//   Reduction order, element by element, of chunk c on channel ch (R[i] = c): ((x[R[i+1]] +
//   x[R[i+2]]) + ...) + x[c] — whatever S or the protocol. With group-order rings that is ring.h's
//   order whatever C, so `nccl` gives bitwise the results of `ring` when it picks a ring (and of
//   `tree` when it picks a tree); with "rings" the order is fixed by (p, C, the rings).
//   Tree (all_reduce). tree.h's two trees and halves; half t is cut into max(1, C/2) channel pieces,
//   each piece pipelined in slices; per slice and node: acc = own; acc = op(acc, child0); acc =
//   op(acc, child1) — tree.h's order, bitwise tree's results.
//   Broadcast: ring.h's chain from the root over the group order, per channel piece and slice.
//
// Time (simulating backends; the host charges nothing). The tuning figures above choose; what a
// call costs comes from the protocol's physical figures where the section gives them
// (fixed_latency, send_latency, send_bandwidth, copy_bandwidth, chunk_slices), else from the tuning
// figures (so a section without them simulates as before they existed):
//   - launch_latency + fixed_latency (default base_latency[algo][proto]): a fixed delay on the
//     calling rank before any data moves (the kernel launch and the protocol's fixed cost).
//   - every send waits send_latency (default hop_latency[algo][proto]) before its bytes start (the
//     protocol's per-step handshake); sends of different slices overlap, so a ring pays it once
//     per step on its critical path.
//   - the bytes move as System transfers HBM -> HBM over the links, with wire_bytes / data_bytes
//     as the transfer's wire scale (hw::WireScale): a link carries LL's 16 bytes per 8 of data and
//     LL128's 128 per 120, so the payload takes that much longer on the links (memories see the
//     payload). Channels share links through the link servers.
//   - a ring channel is one SM's copy loop: it pushes at most send_bandwidth (default
//     channel_bandwidth) of wire bytes per second, so its next send waits until the previous one's
//     wire bytes / send_bandwidth has passed (a pace per channel; the links' own bandwidth still
//     applies, so a channel rate above the link's share changes nothing). With copy_bandwidth, each
//     slice it receives in the last step (all_gather's and all_reduce's final receive,
//     reduce_scatter's final reduction) then costs the channel its bytes / copy_bandwidth before its
//     next send (NCCL's recv / recvReduceCopy op), and the channel ends when its last copy does; the
//     runtime's staging copies around the call are then untimed (nccl_copies_in_loop).
//   - reductions stream with the receives (comm.h).
//   So one ring step of B payload bytes over one idle link (latency a, bandwidth b), one slice:
//     T = launch + base + hop + a + B x wire/data / b
//   (tests/runtime/nccl_test.cpp checks this by hand for Simple, LL and LL128); channels on one
//   link share its bandwidth, so more channels do not make one link faster.
//   Not modelled: NCCL's ring search (the orders come from the section: h200x4 lists the six
//   directed cycles of its full mesh), NVLS, multi-node (net) figures.
//
// The plan of every call shows in the trace (a span "nccl ring/Simple x16" on the rank's comm
// track) and in op records (record_ops: the detail ends with the plan).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/algorithms/members.h"
#include "runtime/backend.h"
#include "sim/hw/topology.h"

namespace cubesim::rt::algo {

using Collective = CollectiveRequest::Kind;

// What NCCL would run for one call.
enum class NcclAlgo { ring, tree };
std::string_view nccl_algo_name(NcclAlgo a);

struct NcclPlan {
  NcclAlgo algo = NcclAlgo::ring;
  hw::NcclProtocol protocol = hw::NcclProtocol::simple;
  int channels = 1;
  double predicted_us = 0;  // the model's time for this choice
  std::string describe() const;  // "ring/Simple x16"
};

// The fastest allowed (algorithm, protocol) for collective k over p ranks moving `bytes`
// (all_reduce, broadcast: the buffer; reduce_scatter, all_gather: the whole p-chunk buffer). Throws
// RuntimeError when the figures allow no candidate for k, naming the section's fields.
NcclPlan nccl_plan(Collective k, int p, std::uint64_t bytes, const hw::NcclSpec& spec);
// NCCL's channel count for a call of `bytes` over p ranks on the chosen algorithm and protocol
// (the reduction for small calls above).
int nccl_channels(NcclAlgo a, hw::NcclProtocol proto, int p, std::uint64_t bytes, const hw::NcclSpec& spec);
// The model's predicted time of one candidate (microseconds), or a negative value when the
// candidate is not allowed for k.
double nccl_predicted_us(Collective k, int p, std::uint64_t bytes, NcclAlgo a, hw::NcclProtocol proto,
                         const hw::NcclSpec& spec);

// The figures a call plans with: the topology's section, else ContextOptions::nccl, else
// NcclSpec::defaults().
const hw::NcclSpec& nccl_spec_of(Comm& c);

// True when the figures model the channel loop's own copies (a protocol gives copy_bandwidth_GBps):
// NCCL's all_gather stores the caller's part into the output in its first step's send, and its
// reduce_scatter reads the input and writes the output in its loop, so the runtime's staging
// copies around such a call (collectives.cpp) move the bytes without charging time.
bool nccl_copies_in_loop(Comm& c);

void nccl_all_reduce(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void nccl_reduce_scatter(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& = {});
void nccl_all_gather(Comm& c, const Members& m, const Tensor& flat, const Params& = {});
void nccl_broadcast(Comm& c, const Members& m, const Tensor& flat, const Params& = {});

}  // namespace cubesim::rt::algo
