// fault.h — seeded fault injection: a unit corrupts what passes through it, and every fault is logged.
//
// A FaultSpec names a site, a moment and a fault model:
//   site   link       the bytes of a transfer that crosses link `link` land corrupted (a chunk in flight)
//          dma        the bytes of a transfer through a DMA channel of `cube` (`pe`: -1 any) land corrupted
//          hbm, tcm   a region [address, address + bytes) of `cube`'s HBM (`pe`'s TCM) at rest, at time `at`
//          gemm_tile  a PE's GEMM output tile in TCM, after it is computed and before it is written back
//          reduce     the output of one reduction step of a collective on `cube` (the runtime reports them)
//   moment the `nth` matching operation (1-based) at or after time `at` (at rest: exactly at `at`)
//   model  bit_flip    one bit of one word
//          multi_bit   `bits` adjacent bits of one word (a burst inside a word)
//          stuck_at    every bit of one word forced to `stuck_value` (0 or 1)
//          word_burst  one bit flipped in each of `words` consecutive words
// Which word and bits are drawn from `seed` (the same spec corrupts the same bits every run). Words are
// `word_bytes` wide (2: bf16/f16, 4: f32), aligned within the corrupted span.
//
//   hw::FaultSpec f{.site = hw::FaultSite::link, .link = 3, .nth = 2, .seed = 7};
//   sys.faults().add(f);      // validated against the system: FaultError naming the field
//   ... sim.run() ...
//   for (const auto& r : sys.faults().log()) fmt::print("{}\n", hw::describe(r));
//
// Values must be kept (SystemOptions::functional): a timing-only system has no bytes to corrupt and
// add() refuses. The injector costs one predictable branch per landed transfer when nothing is armed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/time.h"

namespace cubesim::hw {

class System;
class Memory;
struct TransferRecord;

// A fault spec that cannot be: names the field and what would be valid.
struct FaultError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

enum class FaultSite : std::uint8_t { link, dma, hbm, tcm, gemm_tile, reduce };
enum class FaultModel : std::uint8_t { bit_flip, multi_bit, stuck_at, word_burst };
inline constexpr FaultSite kFaultSites[] = {FaultSite::link, FaultSite::dma,       FaultSite::hbm,
                                            FaultSite::tcm,  FaultSite::gemm_tile, FaultSite::reduce};
inline constexpr FaultModel kFaultModels[] = {FaultModel::bit_flip, FaultModel::multi_bit, FaultModel::stuck_at,
                                              FaultModel::word_burst};
std::string_view fault_site_name(FaultSite s);    // "link", "dma", "hbm", "tcm", "gemm_tile", "reduce"
std::string_view fault_model_name(FaultModel m);  // "bit_flip", "multi_bit", "stuck_at", "word_burst"
// FaultError naming `what` and the valid names otherwise.
FaultSite parse_fault_site(std::string_view s, std::string_view what = "site");
FaultModel parse_fault_model(std::string_view s, std::string_view what = "model");

struct FaultSpec {
  FaultSite site = FaultSite::link;
  FaultModel model = FaultModel::bit_flip;
  int link = -1;  // link: its index (System::link, Topology::links); required
  int cube = -1;  // dma, gemm_tile, reduce: -1 any cube; hbm, tcm: required
  int pe = -1;    // dma, gemm_tile: -1 any PE; tcm: required
  std::uint64_t address = 0, bytes = 0;  // hbm, tcm: the region at rest (bytes > 0)
  std::optional<sim::Time> at;           // at rest: when (required); others: from when on (none: from 0)
  std::uint64_t nth = 1;                 // others: the nth matching operation from `at` on (>= 1)
  int bits = 2;         // multi_bit: adjacent bits flipped (2 .. word bits)
  int words = 2;        // word_burst: consecutive words (>= 2)
  int word_bytes = 2;   // 2 or 4
  int stuck_value = 0;  // stuck_at: 0 or 1
  std::uint64_t seed = 0;
};

// One fault as it happened.
struct FaultRecord {
  std::size_t spec = 0;  // index in FaultInjector::specs()
  FaultSite site = FaultSite::link;
  FaultModel model = FaultModel::bit_flip;
  sim::Time time = 0;
  std::string unit;           // the site's unit: "link c0->c1", "cube0.pe3.dma.write", "cube0.hbm",
                              // "cube0.pe3.mac (GEMM tile)", "cube0 reduction step"
  std::string memory;         // the memory whose bytes changed: "cube1.hbm"
  int cube = -1;              // that memory's cube (-1: the host)
  std::uint64_t address = 0;  // its first byte changed (or looked at: a stuck-at that changed nothing)
  std::uint64_t bytes = 0;    // the bytes the model touched
  std::uint64_t offset = 0;   // their offset in the corrupted span (the transfer, tile, region)
  std::uint32_t bits_changed = 0;  // bits whose value changed (0: a stuck-at the word already held)
  std::uint64_t operation = 0;     // the matching operation's number (1-based; 0 at rest)
};
// "link c0->c1 at 12.5 us: bit_flip changing 1 bit in cube1.hbm [0x1000, 0x1002)"
std::string describe(const FaultRecord& r);

// The model applied to a span of bytes (host memory): draws the words and bits from `seed`, changes
// them and returns the record's offset, bytes and bits_changed (the rest left default). Backends
// without a memory model (cuda) apply the same spec this way to a copy of the words.
FaultRecord apply_fault_model(const FaultSpec& spec, std::span<std::byte> span);
// Where apply_fault_model would touch a span of `span_bytes`: {offset, bytes}.
std::pair<std::uint64_t, std::uint64_t> fault_window(const FaultSpec& spec, std::uint64_t span_bytes);
// The model's own fields (word_bytes, bits, words, stuck_value, nth): FaultError naming the field
// (prefixed by `where`, e.g. "faults[2]") and what would be valid.
void check_fault_model(const FaultSpec& spec, std::string_view where);

class FaultInjector {
 public:
  explicit FaultInjector(System& sys) : sys_(&sys) {}

  // Checks the spec against the system (site in range, link index, cube, PE, region inside the
  // memory, a model it can apply): FaultError naming `where`.field and what would be valid. An
  // at-rest fault is scheduled now for its time (which must not be in the past).
  void add(const FaultSpec& spec, std::string_view where = "fault");
  // Drops every spec and the log.
  void clear();
  bool armed() const { return armed_ > 0; }
  const std::vector<FaultSpec>& specs() const { return specs_; }
  const std::vector<FaultRecord>& log() const { return log_; }
  // The specs that have not fired (a moment past the end of a run, a site nothing used).
  std::vector<std::size_t> pending() const;
  // The operations spec i has matched so far (from its `at` on): a spec whose nth is never reached
  // counts a site's operations (a census for drawing faults).
  std::uint64_t seen(std::size_t i) const { return state_.at(i).seen; }

  // ---- sites (the System and the kernels call these) ----
  // A transfer's bytes have landed at its destination.
  void on_landed(const TransferRecord& r);
  // A PE of `cube` computed an output tile at tcm[addr, addr + bytes).
  void on_gemm_tile(int cube, int pe, Memory& tcm, std::uint64_t addr, std::uint64_t bytes);
  // A reduction step wrote its output at mem[addr, addr + bytes) on `cube`.
  void on_reduce(int cube, Memory& mem, std::uint64_t addr, std::uint64_t bytes);

 private:
  struct Armed {
    bool fired = false;
    std::uint64_t seen = 0;  // matching operations so far
  };
  // Counts a matching operation for spec i; true when it is the one to corrupt.
  bool due(std::size_t i);
  template <class Map>
  void corrupt(std::size_t i, std::string unit, Memory& mem, std::uint64_t span_bytes, Map address_of);
  void fire_at_rest(std::size_t i);

  System* sys_;
  std::vector<FaultSpec> specs_;
  std::vector<Armed> state_;
  std::vector<FaultRecord> log_;
  std::size_t armed_ = 0;
  std::uint64_t generation_ = 0;  // clear() disowns at-rest events already scheduled
};

}  // namespace cubesim::hw
