// What the algorithms share: Members and the pipelining slices (members.h).
#include "runtime/algorithms/members.h"

#include <algorithm>

namespace cubesim::rt::algo {

Members Members::whole(const Comm& c, std::uint64_t phase) {
  Members m;
  m.order.resize(static_cast<std::size_t>(c.size()));
  for (int i = 0; i < c.size(); ++i) m.order[static_cast<std::size_t>(i)] = i;
  m.pos = c.me();
  m.phase = phase;
  return m;
}

int slices_for(std::uint64_t bytes) {
  const std::uint64_t s = (bytes + kSliceBytes - 1) / kSliceBytes;
  return static_cast<int>(std::clamp<std::uint64_t>(s, 1, kMaxSlices));
}

}  // namespace cubesim::rt::algo
