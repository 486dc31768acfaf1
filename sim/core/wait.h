// wait.h — waiting on several events at once.
//
//   Event a("a"), b("b");
//   wait_all({&a, &b});                  // returns when both have triggered
//   std::size_t i = wait_any({&a, &b});  // index of the first to trigger (lowest index if several
//                                        // already have)
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>

#include "sim/core/event.h"

namespace cubesim::sim {

std::size_t wait_any_impl(Event* const* events, std::size_t n, bool all);

inline void wait_all(std::span<Event* const> events) { wait_any_impl(events.data(), events.size(), true); }
inline void wait_all(std::initializer_list<Event*> events) { wait_any_impl(events.begin(), events.size(), true); }
inline std::size_t wait_any(std::span<Event* const> events) {
  return wait_any_impl(events.data(), events.size(), false);
}
inline std::size_t wait_any(std::initializer_list<Event*> events) {
  return wait_any_impl(events.begin(), events.size(), false);
}

}  // namespace cubesim::sim
