// collective_harness.h — runs a collective on every rank of a context made by a factory, with
// random inputs, and returns every rank's output bytes (through rt::run_collective,
// runtime/run_collective.h). The same cases run on every backend; a backend plugs in by providing
// a factory.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/collectives.h"
#include "runtime/context.h"
#include "runtime/run_collective.h"

namespace cubesim::rt::testing {

using Factory = std::function<std::unique_ptr<Context>(int ranks)>;

// What f throws (what()), or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// The host backend with `ranks` ranks: the reference every other backend is compared with.
std::unique_ptr<Context> host_context(int ranks);

struct CollCase {
  std::string coll;  // all_reduce, reduce_scatter, all_gather, broadcast
  Algorithm algo;
  DType dtype;
  int ranks;
  std::int64_t n;    // elements per rank input (all_reduce, broadcast, all_gather) or per output (reduce_scatter)
  ReduceOp op = ReduceOp::sum;
  bool acc_f32 = false;
  int root = 0;
  std::uint64_t seed = 1;

  std::string name() const;
};

// Random values of dtype `d` (as f32, exactly representable in d), never constant.
std::vector<float> random_values(std::int64_t n, DType d, std::mt19937_64& rng);

struct CollResult {
  std::vector<std::vector<float>> inputs;   // per rank, as given
  std::vector<std::vector<std::uint8_t>> out_bytes;  // per rank
  std::vector<std::vector<float>> out;      // per rank, widened to f32
  RunReport report;
};

CollResult run_collective(const Factory& make, const CollCase& c);

// Every collective x supported algorithm x dtype x group size, with a few lengths (even, uneven, n < ranks).
std::vector<CollCase> all_cases();

}  // namespace cubesim::rt::testing
