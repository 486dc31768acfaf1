// transfer.h — what System::transfer returns and what it promises about time.
//
// A transfer moves bytes from one memory to another through stages: the source memory (read),
// the PE's DMA channel when a TCM is involved, the links of the route, the destination memory
// (write). The message is cut into chunks; each chunk passes the stages in order, each stage a
// FIFO server, with virtual cut-through: a chunk starts on the next stage once its head has
// arrived (after the stage's fixed delay) and cannot finish there before its tail has arrived.
// The source injects chunks at the pace of the slowest stage, so an uncontended transfer of B
// bytes takes exactly
//     alpha + (chunks - 1) * chunk_time + (last chunk at the slowest stage)
// where alpha is the sum of fixed delays (source read latency, per hop overhead + latency, DMA
// request overhead). Concurrent transfers interleave chunk by chunk on shared servers. The bytes
// land at the destination when the last chunk has landed, not before.
//
//   TransferHandle h = sys.start_transfer(src, dst, bytes);   // returns at once
//   ... other work ...
//   h.wait();                                                 // blocks this process until landed
//   PathFigures f = sys.path_figures(src.memory, dst.memory); // alpha, bandwidth: alpha-beta model
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sim/core/time.h"

namespace cubesim::hw {

struct TransferRecord;

// One stage of a path: a link, a DMA channel, or a memory of `channels` interleaved channels.
struct StageFigures {
  std::string name;               // "cube0.hbm (read)", "link c0->c1", "cube0.pe3.dma.read"
  sim::Bandwidth bandwidth;       // all channels together
  std::uint32_t channels = 1;
  std::uint64_t interleave = 0;   // bytes per channel before the next (memories)
  sim::Duration fixed = 0;        // delays before and after it (read latency, overhead, wire latency)
  // A cache in front of the memory (an L2 read stage, all misses): the cache's bandwidth, which the
  // bytes pass as well as the memory's channels; time() is the slower of the two. 0: no cache.
  sim::Bandwidth cache;

  // A stage's figures before it has a name and delays: bandwidth, channels, interleave.
  static StageFigures of(sim::Bandwidth bw, std::uint32_t channels = 1, std::uint64_t interleave = 0) {
    StageFigures f;
    f.bandwidth = bw;
    f.channels = channels;
    f.interleave = interleave;
    return f;
  }

  // The time `bytes` occupy the stage: on a memory, the busiest channel's share (the bytes start on
  // a channel boundary), so a small access runs at one channel's rate; behind a cache, the longer of
  // that and the bytes at the cache's bandwidth.
  sim::Duration time(std::uint64_t bytes) const;
};

// The alpha-beta figures of the path between two memories, and its exact uncontended time.
struct PathFigures {
  sim::Duration alpha = 0;          // sum of fixed delays
  sim::Bandwidth bandwidth;         // of the slowest stage: beta = 1 / bandwidth for large messages
  std::uint64_t chunk_bytes = 0;
  sim::Duration chunk_time = 0;     // a full chunk at the slowest stage: the injection pace
  int hops = 0;                     // links crossed
  std::vector<int> links;           // their ids, in order
  std::vector<StageFigures> stages;

  // The time a transfer of `bytes` takes on an idle path (0 for 0 bytes), when its addresses start
  // on channel boundaries: alpha + (chunks - 1) * chunk_time + the last chunk at its slowest stage.
  sim::Duration time(std::uint64_t bytes) const;
  std::vector<std::string> stage_names() const;
};

// A transfer's bytes on the links per byte of payload: a protocol that sends flags or headers with
// the data (NCCL's LL: 16 wire bytes per 8 of data; LL128: 128 per 120) occupies each link for
// wire/data times the payload's time. Memories and DMA channels see the payload. {1, 1}: the payload.
struct WireScale {
  std::uint32_t wire = 1, data = 1;
  bool identity() const { return wire == data; }
  std::uint64_t of(std::uint64_t payload) const { return identity() ? payload : (payload * wire + data - 1) / data; }
};

// What a transfer calls once it has landed (after waking the processes that wait on its handle),
// from its landing event: completion-driven code that keeps no process per transfer (the runtime's
// messages). fn == nullptr: nothing.
struct OnLanded {
  void (*fn)(void* arg) = nullptr;
  void* arg = nullptr;
};

class TransferHandle {
 public:
  TransferHandle() = default;  // an empty transfer: already done
  // True once the bytes have landed.
  bool done() const;
  // Blocks the calling process until the bytes have landed; returns the time they did (now).
  sim::Time wait();
  std::uint64_t id() const { return id_; }

 private:
  friend class System;
  TransferHandle(TransferRecord* r, std::uint64_t id) : rec_(r), id_(id) {}
  TransferRecord* rec_ = nullptr;
  std::uint64_t id_ = 0;
};

// Blocks until every transfer has landed.
void wait_all(std::span<TransferHandle> transfers);

}  // namespace cubesim::hw
