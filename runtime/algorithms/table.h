// table.h — the collective algorithms, one row each: the one place an algorithm is named.
//
// A row holds the algorithm's id, its name (what parse_algorithm, Python and the CLI accept), a
// one-line summary and, per collective, the body that runs it on one rank (null where the
// algorithm does not do that collective) with what that body needs of the group. Parsing, names,
// validation and dispatch (runtime/collectives.cpp), `cubesim.algorithms()` and the CLI's
// `cubesim algorithms` and `--algorithm` all read it.
//
//   const algo::Row& r = algo::row(Algorithm::halving_doubling);
//   algo::require_group(r, Collective::all_gather, comm, m.size());  // throws on 3 ranks
//   r.all_gather.run(comm, m, flat, params);
//
// Rows are in the order of enum Algorithm (a static_assert in table.cpp checks it), so finding a
// row is an index. A new algorithm is a value in enum Algorithm (collective_types.h), its file pair
// in this directory, its .cpp in runtime/CMakeLists.txt and its row in table.cpp.
#pragma once

#include <span>
#include <string_view>

#include "runtime/algorithms/members.h"
#include "runtime/backend.h"
#include "runtime/collective_types.h"

namespace cubesim::rt::algo {

using Collective = CollectiveRequest::Kind;
inline constexpr Collective kCollectives[] = {Collective::all_reduce, Collective::reduce_scatter,
                                              Collective::all_gather, Collective::broadcast};

// What a body needs of the group, checked on the member count just before the body runs (where a
// body would check it itself), so the error comes at the same simulated time in the same process.
enum class GroupNeed { any, power_of_two };

// A body runs one collective on one rank over `m`, in place on `flat`, laid out as
// CollectiveRequest (backend.h) describes for that collective.
using ReduceBody = void (*)(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, const Params& p);
using MoveBody = void (*)(Comm& c, const Members& m, const Tensor& flat, const Params& p);

template <class Fn>
struct Body {
  Fn run = nullptr;  // null: the algorithm does not do this collective
  GroupNeed needs = GroupNeed::any;
  explicit operator bool() const { return run != nullptr; }
};

struct Row {
  Algorithm id;
  std::string_view name;
  std::string_view summary;  // one line, for `cubesim algorithms`
  // A row names only the collectives its algorithm does; the others stay null.
  Body<ReduceBody> all_reduce = {};
  Body<ReduceBody> reduce_scatter = {};
  Body<MoveBody> all_gather = {};
  Body<MoveBody> broadcast = {};

  bool supports(Collective k) const;
  GroupNeed needs(Collective k) const;
};

// Every row, in enum order.
std::span<const Row> rows();
const Row& row(Algorithm a);
// The row named `name`, or nullptr.
const Row* find_row(std::string_view name);

// "ring, direct, tree": the algorithms that do k, for messages that list the valid choices.
std::string supported_names(Collective k);

// Throws RuntimeError when a group of `members` does not meet what r's body for k needs: the
// message names the call (c.name()), the algorithm, the group size and the algorithms that would do.
void require_group(const Row& r, Collective k, const Comm& c, int members);
// The same check before any rank runs (Context.run_collective): `who` names the call.
void require_group_size(const Row& r, Collective k, int members, std::string_view who);

}  // namespace cubesim::rt::algo
