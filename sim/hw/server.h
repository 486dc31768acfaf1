// server.h — a server that chunks occupy: one direction of a link, a DMA channel, a memory channel.
//
// A server is a bandwidth plus a record of when it is busy; serving is arithmetic done inside the
// transfer engine's events, so a server costs no process and no event of its own. Two disciplines:
//   FIFO (links): `free` is when the last chunk leaves; the next starts no earlier. The engine
//     serves link chunks in the order they arrive, so this is exact.
//   Booking (memories, DMA channels): reservations [start, end) kept in time order; a chunk's work
//     fills the gaps from its ready time on, split across gaps if need be. The engine books local
//     stages a little ahead of time (a chunk's destination write when it crosses its last link), and
//     booking lets a later-booked but earlier-ready access use the idle time in between, as a
//     memory controller interleaving requests would; the work is conserved, so a saturated memory
//     still delays everyone.
// Statistics (bytes, chunks, busy time) are kept whether or not tracing is on.
//
//   Server s{Bandwidth::GBps(128)};
//   Time start = std::max(arrival, s.free);  s.free = start + s.duration(bytes);   // FIFO
//   auto [first, last] = s.book(forget_before, ready, s.duration(bytes));            // booking
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "sim/core/time.h"
#include "sim/core/trace.h"

namespace cubesim::hw {

using sim::Time;

struct Server {
  static constexpr sim::Trace::TrackId kNoTrack = std::numeric_limits<sim::Trace::TrackId>::max();

  sim::Bandwidth bandwidth;
  Time free = 0;  // FIFO: busy until. Booking: the end of the latest reservation.

  // Statistics: bytes served, chunks served, time occupied.
  std::uint64_t bytes = 0;
  std::uint64_t chunks = 0;
  sim::Duration busy = 0;

  // Where spans go when tracing (created on the first traced span), and the end of the last span
  // recorded there: split bookings can overlap in [first, last], and a track's spans must not.
  sim::Trace::TrackId track = kNoTrack;
  Time traced_until = 0;

  // bytes / bandwidth, rounded up to a picosecond; the last size asked for is remembered, since a
  // transfer asks for the same chunk size over and over.
  sim::Duration duration(std::uint64_t b) {
    if (b != memo_bytes_) {
      memo_bytes_ = b;
      memo_duration_ = sim::transfer_time(b, bandwidth);
    }
    return memo_duration_;
  }

  // Booking discipline: books d of work from `ready` on, in the gaps between earlier bookings
  // (work may be split across gaps, as a memory controller interleaves requests). Returns the
  // start of the first piece and the end of the last. Bookings that ended at or before
  // `forget_before` are dropped first (no request will be ready that early again).
  std::pair<Time, Time> book(Time forget_before, Time ready, sim::Duration d) {
    auto& v = booked_;
    if (head_ < v.size() && v[head_].second <= forget_before) forget(forget_before);
    if (d == 0) return {ready, ready};
    // Two cases a stream of chunks mostly is, without the bisection and gap walk (book_in_gaps):
    // ready after every booking (booked from ready on, after the last or joined to it), or ready
    // inside the last booking (queued behind it: joined to its end). Inline: the chunk level books
    // twice a chunk.
    if (v.size() == head_ || v.back().second <= ready) {
      if (v.size() > head_ && v.back().second == ready) {
        v.back().second = ready + d;
      } else {
        v.emplace_back(ready, ready + d);
      }
      if (ready + d > free) free = ready + d;
      return {ready, ready + d};
    }
    if (v.back().first <= ready) {
      const Time start = v.back().second;
      v.back().second = start + d;
      if (start + d > free) free = start + d;
      return {start, start + d};
    }
    return book_in_gaps(ready, d);
  }
  // Drops bookings that ended at or before t.
  [[gnu::noinline]] void forget(Time t) {
    while (head_ < booked_.size() && booked_[head_].second <= t) ++head_;
    if (head_ == booked_.size()) {
      booked_.clear();
      head_ = 0;
    } else if (head_ > 64 && head_ * 2 > booked_.size()) {
      booked_.erase(booked_.begin(), booked_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  std::size_t bookings() const { return booked_.size() - head_; }
  // Makes this server's bookings a copy of another's (a memory splitting its striped view into
  // channels).
  void copy_bookings(const Server& o) {
    booked_.assign(o.booked_.begin() + static_cast<std::ptrdiff_t>(o.head_), o.booked_.end());
    head_ = 0;
    if (o.free > free) free = o.free;
  }

  void account(std::uint64_t b, sim::Duration occupied) {
    bytes += b;
    ++chunks;
    busy += occupied;
  }

 private:
  // book()'s general case: `ready` before the last booking's start.
  [[gnu::noinline]] std::pair<Time, Time> book_in_gaps(Time ready, sim::Duration d) {
    auto& v = booked_;
    // Bookings are disjoint and sorted, so their ends are sorted too: find the first that ends
    // after `ready` by bisection (a congested link can leave thousands booked ahead).
    std::size_t i = static_cast<std::size_t>(
        std::upper_bound(v.begin() + static_cast<std::ptrdiff_t>(head_), v.end(), ready,
                         [](Time t, const std::pair<Time, Time>& b) { return t < b.second; }) -
        v.begin());
    Time t = ready, first = 0;
    bool started = false;
    sim::Duration left = d;
    while (left > 0) {
      if (i > head_ && v[i - 1].second > t) t = v[i - 1].second;
      while (i < v.size() && v[i].first <= t) {
        t = std::max(t, v[i].second);
        ++i;
      }
      const Time gap_end = i < v.size() ? v[i].first : std::numeric_limits<Time>::max();
      const sim::Duration take = std::min<sim::Duration>(left, gap_end - t);
      if (!started) {
        first = t;
        started = true;
      }
      // Book [t, t + take) in the gap before v[i], merging with touching neighbours.
      const bool join_prev = i > head_ && v[i - 1].second == t;
      const bool join_next = i < v.size() && v[i].first == t + take;
      if (join_prev && join_next) {
        v[i - 1].second = v[i].second;
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (join_prev) {
        v[i - 1].second = t + take;
      } else if (join_next) {
        v[i].first = t;
      } else {
        v.insert(v.begin() + static_cast<std::ptrdiff_t>(i), {t, t + take});
        ++i;
      }
      t += take;
      left -= take;
    }
    if (t > free) free = t;
    return {first, t};
  }

  std::uint64_t memo_bytes_ = std::numeric_limits<std::uint64_t>::max();
  sim::Duration memo_duration_ = 0;
  std::vector<std::pair<Time, Time>> booked_;  // [head_, size): live bookings
  std::size_t head_ = 0;
};

}  // namespace cubesim::hw
