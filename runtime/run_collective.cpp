#include "runtime/run_collective.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/algorithms/table.h"
#include "runtime/collectives.h"
#include "runtime/errors.h"

namespace cubesim::rt {

namespace {

using Kind = CollectiveRequest::Kind;

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check_case(const Context& ctx, const CollectiveCase& c, int p, bool values) {
  const int given = static_cast<int>(c.inputs.size());
  if (p < 1 || p > ctx.world_size()) {
    if (c.ranks == 0) {
      throw RuntimeError(fmt::format("run_collective: {} inputs given; give one array per rank, 1 to {} (the "
                                     "context's ranks)",
                                     given, ctx.world_size()));
    }
    throw RuntimeError(fmt::format("run_collective: ranks {} is not valid; use 1 to {} (the context's ranks)", c.ranks,
                                   ctx.world_size()));
  }
  // What the algorithm needs of the group size, refused here, before any rank runs.
  const Algorithm a = c.options.algorithm ? *c.options.algorithm : ctx.options().algorithm;
  const algo::Row& row = algo::row(a);
  if (row.supports(c.collective)) {
    algo::require_group_size(row, c.collective, p,
                             fmt::format("run_collective {}", collective_kind_name(c.collective)));
  }
  if (c.root < 0 || c.root >= p) {
    throw RuntimeError(fmt::format("run_collective: root {} is not a rank 0..{}", c.root, p - 1));
  }
  if (c.count < 0) {
    throw RuntimeError(fmt::format("run_collective: count {} is not valid; give the elements of each rank's input "
                                   "(0 or more)",
                                   c.count));
  }
  if (given && c.make_input) {
    throw RuntimeError("run_collective: both inputs and make_input given; give the inputs one way");
  }
  if (values && !c.make_input) {
    if (given != p) {
      throw RuntimeError(fmt::format("run_collective: {} inputs given for {} ranks; the context keeps values, so give "
                                     "one input per rank (or make_input)",
                                     given, p));
    }
    const std::uint64_t want = static_cast<std::uint64_t>(c.count) * dtype_size(c.dtype);
    for (int k = 0; k < p; ++k) {
      const auto have = c.inputs[static_cast<std::size_t>(k)].size();
      if (have != want) {
        throw RuntimeError(fmt::format("run_collective: input {} has {} bytes; every rank gives count {} x {} = {} bytes",
                                       k, have, c.count, dtype_name(c.dtype), want));
      }
    }
  }
  if (c.collective == Kind::reduce_scatter && c.count % p != 0) {
    throw RuntimeError(fmt::format("run_collective: reduce_scatter over {} ranks needs inputs whose size is a multiple "
                                   "of {}; got {} elements",
                                   p, p, c.count));
  }
}

}  // namespace

CollectiveRequest::Kind parse_collective_kind(std::string_view s) {
  std::vector<std::string_view> names;
  for (Kind k : algo::kCollectives) {
    if (s == collective_kind_name(k)) return k;
    names.push_back(collective_kind_name(k));
  }
  throw RuntimeError(fmt::format("'{}' is not a collective; use one of {}", s, fmt::join(names, ", ")));
}

Algorithm parse_algorithm_for(CollectiveRequest::Kind k, std::string_view s) {
  const Algorithm a = parse_algorithm(s);
  if (algo::row(a).supports(k)) return a;
  throw RuntimeError(
      fmt::format("{} has no algorithm '{}'; valid: {}", collective_kind_name(k), s, algo::supported_names(k)));
}

std::int64_t collective_output_count(Kind k, std::int64_t count, int ranks) {
  switch (k) {
    case Kind::all_reduce:
    case Kind::broadcast: return count;
    case Kind::all_gather: return count * ranks;
    case Kind::reduce_scatter: return count / ranks;
  }
  return count;
}

Shape collective_output_shape(Kind k, Shape input, int ranks) {
  if (input.empty()) input.push_back(1);
  switch (k) {
    case Kind::all_reduce:
    case Kind::broadcast: return input;
    case Kind::all_gather: input[0] *= ranks; return input;
    case Kind::reduce_scatter: {
      if (input[0] % ranks == 0) {
        input[0] /= ranks;
        return input;
      }
      std::int64_t n = 1;
      for (auto d : input) n *= d;
      return {n / ranks};
    }
  }
  return input;
}

CollectiveOutcome run_collective(Context& ctx, const CollectiveCase& c) {
  const bool values = !ctx.backend().timing_only();
  const int p = c.ranks ? c.ranks : static_cast<int>(c.inputs.size());
  check_case(ctx, c, p, values);
  const std::int64_t n_out = collective_output_count(c.collective, c.count, p);
  const bool in_place = c.collective == Kind::all_reduce || c.collective == Kind::broadcast;
  ProcessGroup* g = &ctx.world();
  if (p < ctx.world_size()) {
    std::vector<int> members(static_cast<std::size_t>(p));
    for (int k = 0; k < p; ++k) members[static_cast<std::size_t>(k)] = k;
    g = &ctx.new_group(members);
  }
  // Only a context with values gets inputs and poison: a timing-only sweep moves no host bytes.
  std::vector<float> poison;
  if (values && !in_place) poison.assign(static_cast<std::size_t>(n_out), std::numeric_limits<float>::quiet_NaN());
  const bool read = c.read_outputs;

  CollectiveOutcome res;
  if (read) res.outputs.resize(static_cast<std::size_t>(p));
  if (c.timed) {
    res.start.resize(static_cast<std::size_t>(p));
    res.end.resize(static_cast<std::size_t>(p));
  }
  double w0 = 0, w1 = 0;
  res.report = ctx.spawn(p, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    Tensor in = ctx.empty(r, {c.count}, c.dtype, "input");
    if (values && c.make_input) {
      std::vector<std::uint8_t> bytes(in.nbytes());
      c.make_input(r, bytes);
      in.copy_from_host_bytes(bytes.data(), bytes.size());
    } else if (values) {
      in.copy_from_host_bytes(c.inputs[i].data(), c.inputs[i].size());
    }
    Tensor out = in;
    if (!in_place) {
      out = ctx.empty(r, {n_out}, c.dtype, "output");
      if (values) out.copy_from_host_f32(poison.data(), n_out);
    }
    if (c.timed) {
      barrier(g);
      if (r == 0) w0 = wall_seconds();
      res.start[i] = ctx.simulator().now();
    }
    Work w;
    switch (c.collective) {
      case Kind::all_reduce: w = all_reduce(in, c.op, g, c.options); break;
      case Kind::broadcast: w = broadcast(in, c.root, g, c.options); break;
      case Kind::all_gather: w = all_gather(out, in, g, c.options); break;
      case Kind::reduce_scatter: w = reduce_scatter(out, in, c.op, g, c.options); break;
    }
    if (c.options.async_op) w.wait();
    if (c.timed) {
      res.end[i] = ctx.simulator().now();
      w1 = wall_seconds();  // the rank whose collective ends last (in host time) writes last
      barrier(g);
    }
    if (read) res.outputs[i] = out.to_host_bytes();
  });
  res.wall_s = w1 - w0;
  return res;
}

}  // namespace cubesim::rt
