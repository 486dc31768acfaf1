// members.h — the sub-ring or sub-group an algorithm runs over, and what the algorithms share
// (internal).
//
// Algorithms address group members by index. `order` lists the members taking part (in ring or
// tree order) and `pos` is the caller's position in it; `phase` keeps the message tags of nested
// runs (hierarchical runs rings inside rings) apart.
//
//   ring_all_reduce(comm, Members::whole(comm), flat, ReduceOp::sum);
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm.h"

namespace cubesim::rt::algo {

struct Members {
  std::vector<int> order;  // group indices
  int pos = 0;             // the caller's position in `order`
  std::uint64_t phase = 0;

  int size() const { return static_cast<int>(order.size()); }
  int at(int p) const { return order[static_cast<std::size_t>(mod(p, size()))]; }
  // a mod m in [0, m) for negative a too (ring positions counted back).
  static int mod(int a, int m) { return ((a % m) + m) % m; }
  static Members whole(const Comm& c, std::uint64_t phase = 0);
};

// The parameters a collective call passes to every algorithm body besides the buffer and the op.
// Only some algorithms read each field; carrying them all in one struct gives every body of a
// collective one signature, so the table (table.h) can hold plain function pointers.
struct Params {
  int hierarchy = 0;  // hierarchical: ranks per inner group (0: default_hierarchy)
};

// Tags: phase (16 bits) | a (24 bits) | b (24 bits).
inline std::uint64_t tag(std::uint64_t phase, std::uint64_t a, std::uint64_t b = 0) {
  return (phase << 48) | ((a & 0xffffff) << 24) | (b & 0xffffff);
}

// The contiguous flat region [r.begin, r.begin + r.count) of a flat tensor.
inline Tensor region(const Tensor& flat, Range r) { return flat.narrow(0, r.begin, r.count); }
// The same into a tensor a loop keeps: no allocation per step.
inline const Tensor& region(Tensor& out, const Tensor& flat, Range r) {
  flat.narrow_into(out, 0, r.begin, r.count);
  return out;
}

// Pipelining slices for tree and chain algorithms: a message of `bytes` travels in
// ceil(bytes / kSliceBytes) slices (at most kMaxSlices, at least 1), cut with chunk_range.
inline constexpr std::uint64_t kSliceBytes = 1 << 20;
inline constexpr int kMaxSlices = 64;
int slices_for(std::uint64_t bytes);

}  // namespace cubesim::rt::algo
