#include "collective_harness.h"

#include <fmt/format.h>

namespace cubesim::rt::testing {

std::unique_ptr<Context> host_context(int ranks) {
  ContextOptions o;
  o.world_size = ranks;
  o.stack_size = 64 * 1024;
  return std::make_unique<Context>(o);
}

std::string CollCase::name() const {
  return fmt::format("{}_{}_{}_{}ranks_n{}_{}{}_seed{}", coll, algorithm_name(algo), dtype_name(dtype), ranks, n,
                     reduce_op_name(op), acc_f32 ? "_accf32" : "", seed);
}

std::vector<float> random_values(std::int64_t n, DType d, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    x = round_to(d, u(rng));
  }
  return v;
}

CollResult run_collective(const Factory& make, const CollCase& c) {
  auto ctx = make(c.ranks);
  std::mt19937_64 rng(c.seed);
  CollResult r;
  const CollectiveRequest::Kind kind = parse_collective_kind(c.coll);
  const std::int64_t in_n = kind == CollectiveRequest::Kind::reduce_scatter ? c.n * c.ranks : c.n;
  CollectiveCase cc{.collective = kind,
                    .dtype = c.dtype,
                    .count = in_n,
                    .op = c.op,
                    .root = c.root,
                    .options = {.algorithm = c.algo, .accumulate_f32 = c.acc_f32},
                    .ranks = c.ranks};
  for (int k = 0; k < c.ranks; ++k) {
    r.inputs.push_back(random_values(in_n, c.dtype, rng));
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(in_n) * dtype_size(c.dtype));
    convert_from_f32(r.inputs.back().data(), bytes.data(), c.dtype, r.inputs.back().size());
    cc.inputs.push_back(std::move(bytes));
  }
  CollectiveOutcome o = rt::run_collective(*ctx, cc);
  r.report = o.report;
  r.out_bytes = std::move(o.outputs);
  for (const auto& b : r.out_bytes) {
    std::vector<float> v(b.size() / dtype_size(c.dtype));
    convert_to_f32(b.data(), c.dtype, v.data(), v.size());
    r.out.push_back(std::move(v));
  }
  return r;
}

std::vector<CollCase> all_cases() {
  std::vector<CollCase> cases;
  std::uint64_t seed = 100;
  for (const char* coll : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
    for (Algorithm a : supported_algorithms(coll)) {
      for (DType d : {DType::f32, DType::bf16, DType::f16}) {
        for (int p : {2, 3, 4, 6, 8}) {
          const bool pow2 = (p & (p - 1)) == 0;
          if (a == Algorithm::halving_doubling && !pow2 && std::string(coll) != "all_reduce") continue;
          for (std::int64_t n : {std::int64_t{1031}, std::int64_t{p - 1 > 0 ? p - 1 : 1}}) {
            CollCase c{coll, a, d, p, n};
            c.seed = ++seed;
            c.root = p - 1;
            cases.push_back(c);
          }
        }
      }
    }
  }
  // Max, and f32 accumulation, on a subset.
  for (Algorithm a : supported_algorithms("all_reduce")) {
    CollCase c{"all_reduce", a, DType::bf16, 6, 777, ReduceOp::max};
    c.seed = ++seed;
    cases.push_back(c);
    CollCase f{"all_reduce", a, DType::bf16, 4, 777, ReduceOp::sum, true};
    f.seed = ++seed;
    cases.push_back(f);
  }
  return cases;
}

}  // namespace cubesim::rt::testing
