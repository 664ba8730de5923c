#pragma once
/// \file collective_order.hpp
/// The agreed issue order of one plan's jobs on one queue: a communication
/// queue, and since session 24 every queue of a plan with collectives
/// (launch_queue::in_job_order says why). Owned by that queue's executing
/// actor, actors/stream_actor.cpp; no locking: one actor, one thread at a
/// time.
///
/// NCCL (and any rendezvous collective) needs every member of a group to
/// issue the group's collectives in one order. Concurrent jobs become ready in
/// different orders on different members (their `ready` messages race), so a
/// queue issues the collectives of job number n (job_context::collective_seq,
/// drawn once a job holds all its arenas) only after every job numbered below
/// n issued all of its collectives there or was cancelled. Within a job a
/// queue issues in queue position order, and every member's queue lists the
/// group's collectives at the same positions, so all members issue them in
/// (job number, position) order. No deadlock: a job only waits for lower
/// numbers, which never wait for it.

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

namespace ag::actors {

/// Test hook, process-wide: while false, orders made from then on (one per
/// plan per communication actor, on the plan's first collective there) are
/// off. Only tests set it, to show the hazard the order prevents.
inline std::atomic<bool>& collective_order_enforced_for_testing() {
  static std::atomic<bool> on{true};
  return on;
}

/// `Job` names a parked job for its resumption (an id, or the actor's own
/// job-and-queue key).
template <class Job = uint64_t>
class collective_issue_order {
 public:
  collective_issue_order() : enforce_(collective_order_enforced_for_testing().load(std::memory_order_relaxed)) {}
  /// `enforce` false turns the order off (may_issue always says yes): a test
  /// hook that shows the hazard the order prevents. The runtime never does.
  explicit collective_issue_order(bool enforce) : enforce_(enforce) {}

  /// Whether job number `seq` may issue its next collective now. When not,
  /// `job` (an opaque id) is parked until finish() hands it back.
  bool may_issue(uint64_t seq, const Job& job) {
    if (!enforce_ || seq == next_) return true;
    parked_[seq] = job;
    return false;
  }

  /// Job number `seq` issued all its collectives here, or was cancelled
  /// (then also call forget). Returns the parked job whose turn has come, if
  /// any: the caller resumes it. Idempotent per `seq`.
  std::optional<Job> finish(uint64_t seq) {
    if (seq < next_) return std::nullopt;  // already counted (finished, then cancelled)
    if (seq != next_) {
      done_ahead_.insert(seq);
      return std::nullopt;
    }
    ++next_;
    while (!done_ahead_.empty() && *done_ahead_.begin() == next_) {
      done_ahead_.erase(done_ahead_.begin());
      ++next_;
    }
    auto p = parked_.find(next_);
    if (p == parked_.end()) return std::nullopt;
    const Job job = p->second;
    parked_.erase(p);
    return job;
  }

  /// A cancelled job is no longer waiting for its turn.
  void forget(uint64_t seq) { parked_.erase(seq); }

  /// The job number whose turn it is.
  uint64_t next() const noexcept { return next_; }
  /// How many jobs wait for their turn.
  std::size_t parked() const noexcept { return parked_.size(); }

 private:
  bool enforce_;
  uint64_t next_ = 0;                   // the job number whose turn it is
  std::set<uint64_t> done_ahead_;       // numbers above next_ already finished here
  std::map<uint64_t, Job> parked_;      // job number -> job, waiting for their turn
};

}  // namespace ag::actors
