#pragma once
/// \file ring.hpp
/// The cpu backend's ring collectives (all_reduce, all_gather,
/// reduce_scatter; gpu/device.hpp's collective_launch), for messages above
/// the one-shot size (collective_launch::algo == ring).
///
/// The message is cut into one chunk per member (reduce_scatter: each rank's
/// slice; all_gather: each rank's operand; all_reduce: equal parts). A
/// reduction runs t-1 reduce-scatter steps (member r adds its own operand to
/// the partial sum of one chunk that its left neighbour r-1 made in the
/// previous step, reading it from r-1's memory), then, for all_reduce, t-1
/// all-gather steps (r copies the finished chunk that r-1 received in the
/// previous step). So each member moves 2 (t-1)/t of the message instead of
/// the one-shot's (t-1) x, and the sums run in the dtype, in ring order
/// (rounded to the dtype after every step: not bit-equal to the reference's
/// double sum; i32 sums are exact, saturated like the reference's).
///
/// The parts meet without a host barrier and without a central loop: each
/// part runs on its own member's communication stream (the stream's worker
/// thread is the member's "copy engine": it pulls the neighbour's chunk
/// itself, no compute lane is involved) and publishes its progress in a
/// host event (gpu/host/host_stream.hpp's event_state, one generation per
/// finished step). A step waits only for its neighbours' events: the left
/// one's previous step (the data it reads) and, before overwriting a chunk,
/// the right one's read of it; a part finishes once its right neighbour no
/// longer reads its memory. Parts of one collective find each other by the
/// job's cancellation flag and the operand addresses (unique among the
/// collectives in flight: the memory plan keeps operands busy until every
/// part completed).
///
/// Threading: run_ring_collective blocks its calling thread (a host stream
/// worker) until the part is done or aborted; thread-safe across parts.

#include <functional>

#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cpu {

/// Asked (about every millisecond) while a part waits for a neighbour: a
/// non-empty error stops the part with it (the caller's device died or its
/// stream is being destroyed, a member died: device_failed naming it). The
/// ring itself adds errc::cancelled when the launch's `cancelled` flag is
/// set, and the error of any other part of the same collective that stopped
/// (its neighbours would wait for it forever otherwise).
using ring_abort = std::function<error()>;

/// Runs this member's part of `c` as a ring (see the file comment). The
/// caller has checked `c` (check_collective) and guarantees every operand's
/// producer completed. Returns the error that stopped it, or ok.
error run_ring_collective(const collective_launch& c, const ring_abort& should_abort);

/// Ring collectives whose parts are in flight in this process (tests: none
/// is left behind after a failed or cancelled collective).
int ring_sessions_in_flight() noexcept;

}  // namespace ag::gpu::cpu
