// process_group.h — a set of ranks that run collectives together (like torch.distributed groups).
//
// Created by Context::world() and Context::new_group(ranks); calling new_group with the same
// ranks again (from every rank, as torch requires) returns the same group. Members are ordered as
// given; a collective's "index" of a rank is its position here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/collective_types.h"

namespace cubesim::rt {

class ProcessGroup {
 public:
  ProcessGroup(int id, std::vector<int> ranks, std::string name);

  int id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  int rank_at(int index) const { return ranks_.at(static_cast<std::size_t>(index)); }
  // Position of a global rank in the group, or -1.
  int index_of(int global_rank) const;
  bool contains(int global_rank) const { return index_of(global_rank) >= 0; }

  // Used when a call names no algorithm.
  std::optional<Algorithm> default_algorithm;

  // Per-member count of collectives issued (the next call's sequence number).
  std::uint64_t next_sequence(int index) { return seq_[static_cast<std::size_t>(index)]++; }
  // Every spawn starts counting afresh (after a failed run, ranks may have stopped at different calls).
  void reset_sequences() { std::fill(seq_.begin(), seq_.end(), 0); }

 private:
  int id_;
  std::vector<int> ranks_;
  std::vector<int> index_;  // global rank -> index, -1 if absent
  std::vector<std::uint64_t> seq_;
  std::string name_;
};

}  // namespace cubesim::rt
