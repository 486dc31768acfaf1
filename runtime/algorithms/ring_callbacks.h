// ring_callbacks.h — the ring algorithms of a timing-only run, driven by callbacks instead of the
// ranks' own code (internal).
//
// In a timing-only run (no values) a ring collective's messages need no rank code in between: what
// a rank does next depends only on which of its messages have landed. So the ring's steps (ring.h:
// the same chunks, peers, order and reductions) are run by one shared state machine per call, fed
// by the transfers' landings. Each rank's process arrives, starts its part and sleeps until its
// part is over: two context switches per rank per collective instead of three events, a mailbox
// and a fiber resumption per message, and no per-rank stack walked on every step (what made a
// 1024-rank ring memory-bound).
//
// The same events happen at the same simulated times, in the same order, as the ranks' code makes
// them: a landing wakes its receiver by an event due now (as a process is woken), a reduction that
// outlasts its receive delays the next step by the difference (as charge() sleeps), a phase ends
// when the rank's sends have landed (as wait_all()), the staging buffers are allocated from the
// same allocator in the same order, and the landing of a rank's last receive wakes its process,
// which finishes its part as the rank's code does. So a run has the same events one for one (one
// more per rank only where its last chunk is empty, fewer elements than ranks: an empty transfer
// lands at once, and the rank's code goes on without an event). RingCallbacks tests (tests/runtime)
// check times, unit counters and event counts against the ranks' code.
//
// Used when the context allows it (ContextOptions::callback_collectives, default on), the backend
// simulates time without values and no trace is recorded (the ranks' code records per-step spans);
// otherwise false and the caller runs the ranks' code. The ring may be the whole group or a part of
// it (hierarchical's inner and outer rings): each ring of a call is its own state machine, told
// apart by its members, their order, its tag and its phases.
#pragma once

#include "runtime/algorithms/members.h"

namespace cubesim::rt::algo {

enum class RingPhases { reduce_scatter, all_gather, all_reduce };

// Runs the calling rank's part of a ring collective over `m` on `flat` by callbacks and returns
// true once it is over; false (nothing done) when this run needs the ranks' code.
bool ring_by_callbacks(Comm& c, const Members& m, const Tensor& flat, ReduceOp op, RingPhases phases);

}  // namespace cubesim::rt::algo
