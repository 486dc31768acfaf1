// l2_cache.h — a cube's L2 cache: a memory-side cache in front of its HBM, shared by the cube's PEs
// and by link traffic to and from that HBM (as on NVIDIA GPUs), built when the topology's cube has
// an "l2" section (L2Spec, topology.h). A cube without one has no L2 unit and its transfers are
// exactly as before.
//
// On a transfer's path the L2 stands where the HBM stage was: System::build_path puts the cube's
// L2 in place of each HBM read or write stage, and the L2 books the HBM below for what it misses.
//
//   L2Cache* l2 = sys.cube(0).l2();          // null when the cube has no L2
//   sys.transfer(sys.hbm(0).at(a), sys.tcm(0, 1).at(0), n);   // the HBM read passes cube0.l2
//   l2->counters().hits;                      // sectors read from the cache
//
// The model (every figure from the topology):
//   Geometry: sets = capacity / (line_bytes * ways); each line holds line_bytes / sector_bytes
//     sectors (at most 8), each valid or not, each dirty or not. With line = address / line_bytes,
//     q = line / sets and r = line % sets, a line's set is (r + h(q)) % sets, h(q) =
//     floor(mix(q) * sets / 2^64) and mix the 64-bit finalizer of MurmurHash3: consecutive lines
//     fill consecutive sets, and rows of a matrix whose pitch is a multiple of sets lines (a
//     power-of-two pitch with power-of-two sets) still spread, as real GPUs hash their L2 set index.
//     The sets need not be a power of two. A line's tag is q + 1 (32 bits: the topology loader
//     checks that the HBM's lines / sets fit). Replacement: true LRU within a set (an empty way
//     first).
//   Lookups use the real addresses of each chunk (a strided region: per row segment), also in
//     timing-only mode. Every sector the chunk touches is looked up; a sector partly touched counts
//     whole.
//   Read: hit sectors are served from the cache; missed sectors are fetched from the HBM (booked on
//     its channels by address, in runs of contiguous missed sectors, from the head's arrival plus the
//     hit latency on, paying the HBM's read latency) and filled into the cache. The whole chunk then
//     passes the L2 at its bandwidth: from the head's arrival plus the hit latency when any sector
//     hit, else from when the first missed bytes arrive from the HBM; it leaves once that work is
//     done, its tail has arrived, and every missed byte has come from the HBM. An all-hit chunk costs
//     exactly what an HBM read stage would with the L2's bandwidth and latency.
//   Write: write-back with write-allocate: the written sectors become valid and dirty, nothing is
//     fetched (a partly written sector counts as written whole, as byte-masked GPU L2s keep
//     partial sectors without fetching), and the chunk passes the L2 at its bandwidth, posted (no
//     latency). A line evicted with dirty sectors writes them to the HBM then (booked on its
//     channels from the chunk's head on; it delays no one but later users of those channels).
//     Dirty lines still in the cache when the run ends are never written back.
//   The stage's figures (PathFigures, the time on an idle system) are the cold path's: a read pays
//     the hit latency plus the HBM's latency and occupies the slower of the HBM's channels and the
//     L2's bandwidth (a chunk that misses everything takes exactly that); a write, the L2's
//     bandwidth. Reads that hit are faster than the figures by up to the HBM's latency and time.
//
// Counters (UnitCounters): bytes/pieces/busy of the L2's own server (every chunk, hits and misses);
// hits and misses count SECTORS read (reads only: a write never misses to the HBM); fill_bytes the
// bytes fetched from the HBM (missed sectors x sector_bytes), writeback_bytes the dirty bytes
// written to it. The HBM unit's own counters include both. Trace: one track "l2" in the cube's
// group, a span per chunk with its hit and missed sectors as args.
//
// Cost: one flat, zeroed array of sets allocated on the first access (huge pages where offered).
// A set is a block of `ways` entries kept in recency order (most recent first, empty ones last), so
// the LRU line is the last and no ages are kept; an entry packs the tag, the valid and the dirty
// sector masks into 4 bytes when every tag fits 16 bits (the HBM's lines / sets < 65535: a
// 16-way set is one 64-byte host cache line, 1.9 MiB for a 60 MiB L2), else into 8 bytes. A
// lookup compares the set's tags with SSE2 (the set found by a multiplication and, once per
// quotient, a hash) and moves the line to the front; the sets of the next lines a chunk touches
// are prefetched (the rows of a strided region land in scattered sets of a table of megabytes).
// No allocation per chunk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/hw/memory.h"
#include "sim/hw/path_unit.h"
#include "sim/hw/server.h"
#include "sim/hw/topology.h"

namespace cubesim::hw {

class L2Cache final : public PathUnit {
 public:
  // The L2 of cube `cube`, in front of `hbm` (which must outlive it).
  L2Cache(int cube, const L2Spec& spec, Memory& hbm);

  const L2Spec& spec() const { return spec_; }
  Memory& memory() const { return *hbm_; }  // the HBM below
  int cube() const { return place().cube; }
  std::uint64_t sets() const { return sets_; }
  std::uint32_t ways() const { return spec_.ways; }
  std::uint32_t sectors_per_line() const { return sectors_; }
  sim::Duration latency() const { return spec_.latency; }
  // The set that the line holding byte `addr` maps to (tests use it to build conflicting addresses).
  std::uint64_t set_of(std::uint64_t addr) const { return locate(addr >> line_shift_).set; }
  // Whether every sector of [addr, addr + len) is in the cache now (no effect on LRU or counters).
  bool holds(std::uint64_t addr, std::uint64_t len) const;
  // Bits of a tag in a set entry: 16 (4-byte entries) when every tag of the HBM fits, else 32.
  std::uint32_t tag_bits() const { return narrow_ ? 16 : 32; }
  // Line lookups so far (reads and writes; a line is looked up once per row segment that touches
  // it): what a micro-benchmark of lookups per second counts.
  std::uint64_t lines_looked_up() const { return line_lookups_; }
  // Bytes moved to and from the HBM below so far: missed sectors fetched, dirty sectors written back
  // (the flow level weighs a flow's use of the HBM by its share of them).
  std::uint64_t below_bytes() const { return fill_bytes_ + writeback_bytes_; }

  // ---- as a unit on transfer paths ----
  // v.read: a read stage (misses go to the HBM) or a write (posted, write-allocate); v.pre: the
  // stage's fixed delay (the hit latency on reads).
  Passage serve(const ChunkVisit& v) override;
  // Figures: a write (and a read that hits) passes the L2 alone at its bandwidth; a cold read also
  // passes the HBM's channels (cold_read_figures: the HBM's figures, the L2's bandwidth as `cache`).
  StageFigures figures() const override { return StageFigures::of(spec_.bandwidth); }
  StageFigures cold_read_figures() const {
    StageFigures f = hbm_->figures();
    f.cache = spec_.bandwidth;
    return f;
  }
  void declare_tracks(sim::Trace& trace) override;
  std::string track_group() const override;  // "cube3"
  std::string track_name() const override;   // "l2"

 private:
  struct Run {
    std::uint64_t addr, len;
  };
  void count(UnitCounters& u) const override;
  Server& flow_server() override { return server_; }
  struct Probe {
    std::uint64_t line;
    std::uint64_t set;
    std::uint32_t tag;   // line / sets + 1 (0 marks an empty way)
    std::uint32_t mask;  // the sectors touched
  };
  // Where a line lives: q = line / sets, r = line % sets; set = (r + h(q)) % sets with h a hash of
  // q, tag q + 1. A set's lines differ in q, so the tag tells them apart, and the line comes back
  // from (set, tag) for a write-back.
  Probe locate(std::uint64_t line) const;
  void split(std::uint64_t line, std::uint64_t& q, std::uint64_t& r) const;  // q = line / sets, r = line % sets
  Probe at(std::uint64_t line, std::uint64_t q, std::uint64_t r) const;      // locate() with q and r known
  std::uint64_t hash_of_quotient(std::uint64_t q) const;
  std::uint64_t line_of(std::uint64_t set, std::uint32_t tag) const;
  // Lists the lines of [addr, addr + len) (one row segment) and the sectors touched in each.
  void probe(std::uint64_t addr, std::uint64_t len);
  void probe(std::uint64_t addr, std::uint64_t len, std::uint64_t q, std::uint64_t r);  // q, r: of addr's line
  // Looks up the listed lines in order (prefetching the sets of those a few ahead: the table is
  // megabytes, and the rows of a strided region land in scattered sets), collecting missed sectors
  // (reads) and evicted dirty sectors into the runs. E: the set entry (narrow_: uint32_t).
  template <class E>
  void look_up_probes(bool write);
  template <class E>
  void lookup(const Probe& p, bool write);
  template <class E>
  bool holds_line(const Probe& p) const;
  // Set s's block: ways entries of type E (tag | valid << T | dirty << (T + 8), T the tag bits; 0:
  // empty), most recently used first, the empty ones last.
  template <class E>
  E* entries_of(std::uint64_t s) const {
    return reinterpret_cast<E*>(sets_mem_ + s * block_words_);
  }
  void allocate_sets();
  struct Free {
    void operator()(std::uint64_t* p) const;
  };
  static void add_run(std::vector<Run>& runs, std::uint64_t addr, std::uint64_t len);
  void add_sectors(std::vector<Run>& runs, std::uint64_t line, std::uint32_t mask);

  L2Spec spec_;
  Memory* hbm_;
  std::uint64_t sets_;
  std::uint32_t sectors_;
  std::uint32_t line_shift_, sector_shift_;
  std::uint64_t sets_inverse_ = 0;             // floor(2^64 / sets): locate() divides by multiplying
  mutable std::uint64_t last_q_ = 0, last_hash_ = 0;  // the last quotient located and its hash
  bool narrow_;                                // 4-byte entries with 16-bit tags (else 8 bytes, 32 bits)
  std::uint64_t block_words_;                  // a set's block, in 8-byte words (a multiple of 8)
  std::unique_ptr<std::uint64_t[], Free> sets_storage_;  // null until the first access
  std::uint64_t* sets_mem_ = nullptr;
  std::vector<Run> misses_run_, writeback_run_;  // reused by every chunk
  std::vector<Probe> probes_;
  Server server_;
  std::uint64_t hits_ = 0, misses_ = 0, fill_bytes_ = 0, writeback_bytes_ = 0, line_lookups_ = 0;
  std::uint64_t chunk_hits_ = 0, chunk_misses_ = 0;  // the chunk being served
};

}  // namespace cubesim::hw
