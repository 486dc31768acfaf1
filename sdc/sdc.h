// sdc.h — the silent-data-corruption model: layers that must all compute the same thing, four exact
// checksums per layer, and a verdict that says where a corruption entered (comm or compute, layer, rank).
//
// Every layer shares the same weights (drawn from weight_seed) and gets the same reference input
// (input_seed), so every layer's tensors are bitwise identical and any difference is corruption, not
// numerical noise. Two modes:
//
// `fsdp`: W [ffn, hidden]; rank r's input x [tokens, hidden] (input_seed + r). Each layer
//   comm:    all_gather of the rank's weight shard (rows [r·ffn/p, (r+1)·ffn/p) of W) into the full W
//   compute: h = gelu(x · Wᵀ)
// with checksums at comm_input (the shard), comm_output (the gathered W, per chunk: chunk j is rank
// j's shard), compute_input (x) and compute_output (h).
//
// `tp`: Megatron's ParallelMLP: W1 [ffn, hidden] split by rows (column-parallel), W2 [hidden, ffn]
//   split by columns (row-parallel); x [tokens, hidden] the same on every rank. Each layer
//   compute: y_r = gelu(x · W1_rᵀ) · W2_rᵀ          (the rank's partial sum, [tokens, hidden])
//   comm:    y = all_reduce(y_r)                     (in place, the recipe's algorithm run by the
//                                                     runtime: a backend running NCCL is refused)
// with checksums at compute_input (x, W1_r and W2_r as one), compute_output (the column layer's
// output h = gelu(x · W1_rᵀ) and y_r as one), comm_input (y_r, the all-reduce's input), inside the
// reduction (after every reduction
// step on the rank: the chunk that arrived and the chunk after the step, rt::ReduceTap) and at
// comm_output (y, per chunk of the algorithm's chunking: chunk j is the one rank j reduces last).
// The reduction order is the algorithm's, replayed on the host, so y is checked exactly, and every
// rank's y must be the same bits.
//
// Checksums (kernels/checksum.h, both kinds) are taken where the data lives, the moment each is
// ready. A step first runs the rank-fill check: an all_gather of buffers whose every word names its
// rank and position, verified exactly.
//
// The expected checksums come from a replay on the host backend (the numerics contract makes every
// backend's bits equal), so a checksum is compared exactly, not within a tolerance. The verdict is
// the first divergence in program order (fsdp: comm_input, comm_output, compute_input,
// compute_output; tp: compute_input, compute_output, the reduction steps, comm_output): an input
// that differs means the data was corrupted at rest (`memory`); a compute_output that differs while
// the inputs match means compute (`compute`); a comm_output chunk (or, in tp, a reduction step) that
// differs while what went into the collective matches means the collective (`comm`). Its rank: in
// tp, the rank of the earliest reduction step that differs (a chunk that arrived corrupted, or a
// step that corrupted its result); else where the chunk first differs along the forwarding order
// from its owner (ring: owner, owner+1, ...; direct: straight from the owner).
//
//   sdc::Recipe r = sdc::parse_recipe(json, "recipe.json");
//   auto ctx = rt::make_sim_context({}, hw::load_topology("ring4"));
//   sdc::Result res = sdc::run(*ctx, r);
//   fmt::print("{}\n", res.verdict.text);   // "corruption in comm at layer 3 on rank 2"
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/checksum.h"
#include "kernels/elementwise.h"
#include "runtime/collective_types.h"
#include "runtime/context.h"
#include "sim/hw/fault.h"

namespace cubesim::sdc {

enum class Mode { fsdp, tp };
std::string_view mode_name(Mode m);  // "fsdp", "tp"
// The model's tensors of each layer on a rank, as recipes aim at-rest faults at them:
// fsdp: shard, full, input, output; tp: input, w1, w2, hidden, output.
const std::vector<std::string>& tensor_names(Mode m);
enum class Point { comm_input, comm_output, compute_input, compute_output };
inline constexpr Point kPoints[] = {Point::comm_input, Point::comm_output, Point::compute_input,
                                    Point::compute_output};
std::string_view point_name(Point p);  // "comm_input", ...

// A fault of the recipe: a hw::FaultSpec, with at-rest faults optionally aimed at one of the model's
// tensors (tensor_names(mode) of a layer on a rank) instead of an address.
struct RecipeFault {
  hw::FaultSpec spec;
  double at_us = -1;  // from the start of the run (< 0: none)
  std::string tensor;  // hbm only: aim at this tensor (empty: spec.address/bytes)
  int layer = 0, rank = 0;
};

struct Recipe {
  Mode mode = Mode::fsdp;
  int layers = 8;
  std::int64_t tokens = 16, hidden = 128, ffn = 256;
  DType dtype = DType::bf16;
  int ranks = 0;  // 0: every device of the context
  rt::Algorithm algorithm = rt::Algorithm::ring;
  std::uint64_t weight_seed = 1, input_seed = 2;
  kernels::GeluKind gelu = kernels::GeluKind::tanh;
  bool rank_fill = true;
  std::vector<RecipeFault> faults;  // simulator only
};

// The recipe as JSON, every field present (what --dry-run prints and overrides apply to).
nlohmann::json recipe_to_json(const Recipe& r);
// Reads a recipe document: unknown keys, wrong types and invalid values throw std::invalid_argument
// naming `origin`, the dotted path and what would be valid. Missing keys take the defaults above.
Recipe parse_recipe(const nlohmann::json& doc, std::string_view origin);
// Applies "path=value" overrides (dotted paths into the recipe's JSON, array indices as numbers:
// "faults.0.nth=3"; the value is JSON, or a string when it is not JSON) to a document. A path that
// the full recipe does not have is refused, naming the closest key.
void apply_overrides(nlohmann::json& doc, const std::vector<std::string>& sets, std::string_view origin);

// Checksums of one layer on one rank: [point] for word and mix; comm_output also per chunk.
struct Checks {
  std::array<std::uint64_t, 4> word{}, mix{};
  std::vector<std::uint64_t> chunk_word, chunk_mix;  // comm_output's chunks (one per rank of the group)
  // tp: the reduction steps on this rank, in order: [2s] the chunk that arrived at step s, [2s + 1]
  // the chunk after step s (empty where the backend ran the collective itself: NCCL).
  std::vector<std::uint64_t> step_word, step_mix;
};

struct Divergence {
  int layer = 0;  // -1: the rank-fill check
  int rank = 0;
  Point point = Point::comm_output;
  int chunk = -1;  // comm_output: the chunk (its owner's rank)
  int step = -1;   // tp, comm_output: a reduction step on `rank` (then chunk is -1)
  bool reduced = false;  // the step's result differs (else what arrived at it)
  bool word = false, mix = false;  // which checksums differ (neither: the rank-fill pattern saw it)
};

struct Verdict {
  enum class Kind { clean, comm, compute, memory };
  Kind kind = Kind::clean;
  int layer = -1;  // -1: the rank-fill check (comm)
  int rank = -1;
  std::string text;  // "clean", "corruption in comm at layer 3 on rank 2", ...
};
std::string_view verdict_kind_name(Verdict::Kind k);  // "clean", "comm", "compute", "memory"

// Checksums and reference tensors of a clean run (the host replay); reused across runs of a recipe.
struct Golden {
  std::vector<Checks> checks;  // per rank (every layer is the same)
  // Per rank, the bytes of each tensor (tensor_names(mode)).
  std::vector<std::vector<std::vector<std::uint8_t>>> tensors;
};

struct Result {
  Recipe recipe;
  int ranks = 0;
  std::vector<int> cubes;  // rank r ran on cube cubes[r] (the simulator; the rank itself elsewhere)
  rt::RunReport report;
  std::vector<std::vector<Checks>> checks;      // [layer][rank]
  std::vector<std::vector<sim::Time>> starts;   // [rank][layer + 1]: when the rank began the rank-fill check (0) and each layer
  std::vector<std::string> rank_fill_errors;    // "rank 2, chunk 1: word 17 is 0x... (expected 0x...)"
  std::vector<std::pair<int, int>> rank_fill_bad;  // (rank, chunk) of each error
  std::vector<Divergence> divergences;          // program order: layer, then point, then rank
  Verdict verdict;
  // Activation: the tensors (per layer and rank) whose bytes differ from the reference at the end.
  std::vector<std::string> changed_tensors;     // "layer 3 rank 1 full"
  std::vector<std::string> non_finite;          // "layer 3 rank 1 output: 2 NaN, 0 Inf"
  std::vector<hw::FaultRecord> faults;          // as injected (simulator) or replayed (host, cuda)
  std::vector<int> fault_layers;                // replayed faults: the layer each struck in (-1: rank-fill); empty on sim
  std::vector<std::string> faults_not_fired;    // "faults.0 (link, nth 9): never fired; the run ended at ..."
  std::vector<std::uint64_t> fault_operations;  // per recipe fault: the matching operations it saw
};

// Checks a recipe before any work, as run() would: ranks against the context's `world_size`, ffn
// divisible by the ranks, and every fault against `topo` (null: a backend without a simulated system,
// which replays gemm_tile, reduce and link faults only). RuntimeError naming the field and what would be valid.
void validate(const Recipe& r, int world_size, const hw::Topology* topo);

// The reference of a recipe for `ranks` ranks (a host context, no faults); `nccl`: the simulated
// topology's section when the recipe's algorithm is nccl (its chunking follows it).
Golden golden(const Recipe& r, int ranks, const hw::NcclSpec* nccl = nullptr);
// Runs the recipe on ctx. Faults need values: on the sim backend they are injected into its system;
// host and cuda replay gemm_tile, reduce and link faults at the runtime's points (runtime/fault_replay.h:
// `cube` names a rank, `nth` counts its GEMM outputs or reduction steps) and refuse the other sites;
// RuntimeError otherwise; a recipe too large for the context (ranks, ffn not divisible by ranks) is refused
// naming the field. `ref`: the recipe's golden for the same rank count (made when null).
Result run(rt::Context& ctx, const Recipe& r, const Golden* ref = nullptr);

// The time of each of `steps` fault-free steps (every layer once), with or without the checksums:
// measured on backends that measure (cuda: the slowest rank's GPU time of the step, checksums' device
// reductions included, the one read per step after it), else simulated (sim: the slowest rank's).
// Nothing is compared or read back: for the checksums' overhead (benches/bench_sdc).
std::vector<double> step_seconds(rt::Context& ctx, const Recipe& r, int steps, bool checksums);

// The verdict of a result's checks against the golden (run() calls it; exposed for tests).
void judge(Result& res, const Golden& ref);

// Where a fault that fired should be found: the rank whose memory it changed (its cube's rank), the
// layer that rank was in then (-1: the rank-fill check), and `comm` for a link or a reduction step, `compute` for a GEMM
// tile or a DMA channel (the PEs' operand and tile traffic), `memory` at rest. A fault on a cube no
// rank runs on gives rank -1.
struct Truth {
  Verdict::Kind kind = Verdict::Kind::clean;
  int layer = -1, rank = -1;
};
// `fault`: an index into r.faults. A replayed fault (host, cuda: no simulated time) takes the rank
// and layer the backend stamped on it (fault_layers).
Truth truth_of(const Result& r, std::size_t fault);

nlohmann::json result_to_json(const Result& r);

}  // namespace cubesim::sdc
