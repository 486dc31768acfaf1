// run_collective.h — one owner of "run one collective on every rank from host inputs": the job
// behind Context.run_collective in Python, the collective test harness and bench_collectives.
//
//   CollectiveCase c{.collective = parse_collective_kind("all_gather"), .dtype = DType::bf16, .count = 1024,
//                    .ranks = 4, .inputs = bytes_per_rank};          // 4 x 1024 bf16 values
//   CollectiveOutcome out = run_collective(ctx, c);
//   // out.outputs[r]: rank r's 4096 gathered values, bf16 bytes; out.report: the spawn's report
//
// Ranks 0..ranks-1 take part: the world group when that is every rank, else the group of those
// ranks. Each rank places its input (count elements); all_reduce and broadcast work in place,
// all_gather writes count·ranks elements and reduce_scatter count/ranks. Those two outputs are
// poisoned with NaN first, so an element the collective fails to write shows.
//
// On a timing-only context there are no values: inputs are not needed (nor read), nothing is
// copied in, and outputs read back as zeros; a sweep turns read_outputs off and pays for the
// collective alone. With `timed`, a barrier on the group brackets
// the collective: every rank records its simulated start and end, and the host wall time runs from
// rank 0 leaving the first barrier to the last rank leaving the collective (the simulator's cost
// of the collective alone; neither barrier counted).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/collective_types.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace cubesim::rt {

// "all_reduce" | "all_gather" | "reduce_scatter" | "broadcast"; else RuntimeError listing them.
CollectiveRequest::Kind parse_collective_kind(std::string_view s);
// An algorithm name (parse_algorithm) that collective k has; else RuntimeError listing those it has.
Algorithm parse_algorithm_for(CollectiveRequest::Kind k, std::string_view s);

struct CollectiveCase {
  CollectiveRequest::Kind collective = CollectiveRequest::Kind::all_reduce;
  DType dtype = DType::f32;
  std::int64_t count = 0;  // elements of each rank's input
  ReduceOp op = ReduceOp::sum;
  int root = 0;  // broadcast: the rank whose input every rank gets
  CollectiveOptions options = {};
  int ranks = 0;  // ranks 0..ranks-1 take part; 0: one per input
  // Per rank, its input as bytes of dtype (count elements); none on a timing-only context.
  std::vector<std::vector<std::uint8_t>> inputs = {};
  // Instead of inputs, for data too large to hold for every rank at once (64 ranks of 64 MiB):
  // writes rank r's input bytes into the buffer, on the rank, just before it places them.
  std::function<void(int rank, std::span<std::uint8_t> input)> make_input = {};
  bool read_outputs = true;  // read every rank's output back (a benchmark need not)
  bool timed = false;        // barriers around the collective, start/end and wall time recorded
};

struct CollectiveOutcome {
  std::vector<std::vector<std::uint8_t>> outputs;  // per rank, bytes of dtype (with read_outputs)
  RunReport report;
  // With `timed`: per rank, simulated time when it entered and left the collective, and the host
  // seconds from rank 0 leaving the barrier before it to the last rank leaving the collective (the
  // barrier after it, there to keep the ranks' ends apart from what follows, is not counted).
  std::vector<sim::Time> start, end;
  double wall_s = 0;
};

// Elements of each rank's output for an input of `count` elements on `ranks` ranks.
std::int64_t collective_output_count(CollectiveRequest::Kind k, std::int64_t count, int ranks);
// The output's shape for inputs of shape `input` (a scalar: [1]): all_gather stacks the inputs
// along the first dimension; reduce_scatter splits it, or gives a flat chunk when ranks do not
// divide it.
Shape collective_output_shape(CollectiveRequest::Kind k, Shape input, int ranks);

// Runs the case; throws RuntimeError naming the field for ranks outside 1..world size (or inputs
// that do not match them), a root outside the ranks, inputs of the wrong size, or a reduce_scatter
// count that the ranks do not divide. What the collective itself refuses (an algorithm it does not
// have, a group its algorithm cannot run on) fails in the ranks, as for any caller: a RankError.
CollectiveOutcome run_collective(Context& ctx, const CollectiveCase& c);

}  // namespace cubesim::rt
