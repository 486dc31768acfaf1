#include "runtime/process_group.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace cubesim::rt {

ProcessGroup::ProcessGroup(int id, std::vector<int> ranks, std::string name)
    : id_(id), ranks_(std::move(ranks)), seq_(ranks_.size(), 0), name_(std::move(name)) {
  int mx = -1;
  for (int r : ranks_) mx = std::max(mx, r);
  index_.assign(static_cast<std::size_t>(mx + 1), -1);
  for (std::size_t i = 0; i < ranks_.size(); ++i) index_[static_cast<std::size_t>(ranks_[i])] = static_cast<int>(i);
}

int ProcessGroup::index_of(int r) const {
  if (r < 0 || static_cast<std::size_t>(r) >= index_.size()) return -1;
  return index_[static_cast<std::size_t>(r)];
}

}  // namespace cubesim::rt
