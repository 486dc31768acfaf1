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
  const std::int64_t in_n = c.coll == "reduce_scatter" ? c.n * c.ranks : c.n;
  const std::int64_t out_n = c.coll == "all_gather" ? c.n * c.ranks : c.n;
  for (int k = 0; k < c.ranks; ++k) r.inputs.push_back(random_values(in_n, c.dtype, rng));
  r.out_bytes.resize(static_cast<std::size_t>(c.ranks));
  r.out.resize(static_cast<std::size_t>(c.ranks));
  CollectiveOptions o;
  o.algorithm = c.algo;
  o.accumulate_f32 = c.acc_f32;
  r.report = ctx->spawn(c.ranks, [&](int rank) {
    Tensor in = ctx->from_host_f32(rank, {in_n}, c.dtype, r.inputs[static_cast<std::size_t>(rank)]);
    Tensor out;
    if (c.coll == "all_reduce") {
      all_reduce(in, c.op, nullptr, o);
      out = in;
    } else if (c.coll == "broadcast") {
      broadcast(in, c.root, nullptr, o);
      out = in;
    } else {
      // Poison the output so unwritten elements show.
      std::vector<float> nan(static_cast<std::size_t>(out_n), std::numeric_limits<float>::quiet_NaN());
      out = ctx->from_host_f32(rank, {out_n}, c.dtype, nan);
      if (c.coll == "all_gather") {
        all_gather(out, in, nullptr, o);
      } else {
        reduce_scatter(out, in, c.op, nullptr, o);
      }
    }
    r.out_bytes[static_cast<std::size_t>(rank)] = out.to_host_bytes();
    r.out[static_cast<std::size_t>(rank)] = out.to_host_f32();
  });
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
