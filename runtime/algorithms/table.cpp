// The algorithm table (table.h), and the lookups of collective_types.h and collectives.h that read
// it: algorithm_name, parse_algorithm, supported_algorithms.
#include "runtime/algorithms/table.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/algorithms/direct.h"
#include "runtime/algorithms/halving_doubling.h"
#include "runtime/algorithms/hierarchical.h"
#include "runtime/algorithms/nccl.h"
#include "runtime/algorithms/ring.h"
#include "runtime/algorithms/tree.h"
#include "runtime/collectives.h"
#include "runtime/errors.h"

namespace cubesim::rt {
namespace algo {

namespace {

constexpr Row kRows[] = {
    {.id = Algorithm::ring,
     .name = "ring",
     .summary = "NCCL's ring: reduce-scatter then all-gather, 2(p-1) steps; broadcast: a pipelined chain",
     .all_reduce = {ring_all_reduce},
     .reduce_scatter = {ring_reduce_scatter},
     .all_gather = {ring_all_gather},
     .broadcast = {ring_broadcast}},
    {.id = Algorithm::direct,
     .name = "direct",
     .summary = "one shot: every chunk goes straight to its owner, reduced there in member order",
     .all_reduce = {direct_all_reduce},
     .reduce_scatter = {direct_reduce_scatter},
     .all_gather = {direct_all_gather},
     .broadcast = {direct_broadcast}},
    {.id = Algorithm::tree,
     .name = "tree",
     .summary = "NCCL's double binary tree, in pipelined slices; broadcast: down one binary tree",
     .all_reduce = {tree_all_reduce},
     .broadcast = {tree_broadcast}},
    {.id = Algorithm::halving_doubling,
     .name = "halving_doubling",
     .summary = "Rabenseifner: recursive halving, then doubling; reduce_scatter, all_gather need 2^k ranks",
     .all_reduce = {hd_all_reduce},
     .reduce_scatter = {hd_reduce_scatter, GroupNeed::power_of_two},
     .all_gather = {hd_all_gather, GroupNeed::power_of_two}},
    {.id = Algorithm::hierarchical,
     .name = "hierarchical",
     .summary = "rings inside groups of `hierarchy` consecutive ranks, then rings across the groups",
     .all_reduce = {hierarchical_all_reduce}},
    {.id = Algorithm::nccl,
     .name = "nccl",
     .summary = "as NCCL runs it: its choice of ring/tree and LL/LL128/Simple per call, over channels (topology 'nccl')",
     .all_reduce = {nccl_all_reduce},
     .reduce_scatter = {nccl_reduce_scatter},
     .all_gather = {nccl_all_gather},
     .broadcast = {nccl_broadcast}},
};

// row() indexes kRows by the enum's value.
constexpr bool rows_in_enum_order() {
  for (std::size_t i = 0; i < std::size(kRows); ++i) {
    if (static_cast<std::size_t>(kRows[i].id) != i) return false;
  }
  return true;
}
static_assert(rows_in_enum_order(), "kRows must list the algorithms in the order of enum Algorithm");

struct BodyInfo {
  bool present;
  GroupNeed needs;
};

BodyInfo body_info(const Row& r, Collective k) {
  switch (k) {
    case Collective::all_reduce: return {static_cast<bool>(r.all_reduce), r.all_reduce.needs};
    case Collective::reduce_scatter: return {static_cast<bool>(r.reduce_scatter), r.reduce_scatter.needs};
    case Collective::all_gather: return {static_cast<bool>(r.all_gather), r.all_gather.needs};
    case Collective::broadcast: return {static_cast<bool>(r.broadcast), r.broadcast.needs};
  }
  return {false, GroupNeed::any};
}

bool meets(GroupNeed need, int members) {
  switch (need) {
    case GroupNeed::any: return true;
    case GroupNeed::power_of_two: return members > 0 && (members & (members - 1)) == 0;
  }
  return false;
}

std::string_view need_text(GroupNeed need) {
  switch (need) {
    case GroupNeed::any: return "any group";
    case GroupNeed::power_of_two: return "a power-of-two group (1, 2, 4, 8, ... ranks)";
  }
  return "?";
}

// "ring or direct": the algorithms that do collective k on a group of any size.
std::string any_group_alternatives(Collective k) {
  std::vector<std::string_view> names;
  for (const Row& r : kRows) {
    if (r.supports(k) && r.needs(k) == GroupNeed::any) names.push_back(r.name);
  }
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

}  // namespace

bool Row::supports(Collective k) const { return body_info(*this, k).present; }
GroupNeed Row::needs(Collective k) const { return body_info(*this, k).needs; }

std::span<const Row> rows() { return kRows; }

const Row& row(Algorithm a) {
  const auto i = static_cast<std::size_t>(a);
  if (i >= std::size(kRows)) {
    throw std::logic_error(fmt::format("collective algorithm #{} has no row in runtime/algorithms/table.cpp", i));
  }
  return kRows[i];
}

const Row* find_row(std::string_view name) {
  for (const Row& r : kRows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

void require_group(const Row& r, Collective k, const Comm& c, int members) {
  require_group_size(r, k, members, c.name());
}

void require_group_size(const Row& r, Collective k, int members, std::string_view who) {
  const GroupNeed need = r.needs(k);
  if (meets(need, members)) return;
  throw RuntimeError(fmt::format("{}: {} {} needs {}, not {} ranks; use {}", who, r.name,
                                 collective_kind_name(k), need_text(need), members, any_group_alternatives(k)));
}

std::string supported_names(Collective k) {
  std::vector<std::string_view> names;
  for (const Row& r : rows()) {
    if (r.supports(k)) names.push_back(r.name);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace algo

std::string_view algorithm_name(Algorithm a) { return algo::row(a).name; }

Algorithm parse_algorithm(std::string_view s) {
  if (const algo::Row* r = algo::find_row(s)) return r->id;
  std::vector<std::string_view> names;
  for (const algo::Row& r : algo::rows()) names.push_back(r.name);
  throw RuntimeError(fmt::format("unknown collective algorithm '{}': valid are {}", s, fmt::join(names, ", ")));
}

std::vector<Algorithm> supported_algorithms(std::string_view collective) {
  std::vector<Algorithm> out;
  for (algo::Collective k : algo::kCollectives) {
    if (collective != collective_kind_name(k)) continue;
    for (const algo::Row& r : algo::rows()) {
      if (r.supports(k)) out.push_back(r.id);
    }
  }
  return out;
}

}  // namespace cubesim::rt
