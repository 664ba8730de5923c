#pragma once
/// \file collective_order.hpp
/// The agreed issue order of jobs on one *issue line*: one stream of one
/// executing actor (a device's compute lane, its communication queue or a
/// copy queue), shared by every plan whose queues run there. Every queue of a
/// plan with collectives issues in that order (launch_queue::in_job_order
/// says why). A line's collective_issue_order is owned by its executing
/// actor, actors/stream_actor.cpp (no locking: one actor, one thread at a
/// time); the turns are dealt by the runtime's issue_lines (below, one lock).
///
/// NCCL (and any rendezvous collective: the in-stream parts, the one-shot
/// kernel) needs every member of a group to issue the group's collectives in
/// one order. Concurrent jobs become ready in different orders on different
/// members (their `ready` messages race), so a line issues the steps of the
/// job holding turn n (job_context::turns, drawn once a job holds all its
/// arenas) only after every job holding a turn below n there issued all of
/// its steps there or was cancelled. Within a job a queue issues in queue
/// position order, and every member's queue lists the group's collectives at
/// the same positions, so all members issue them in (turn, position) order.
///
/// Across plans (since session 89; until then each plan numbered its own
/// jobs): a job draws its turn on every line its ordered queues run on at
/// once, under one lock, so two jobs that share lines meet them in the same
/// order on every line, whatever plans they belong to. Per plan, two plans'
/// jobs on the same devices (a generator's prompt and decode plans, several
/// sequences in flight) could take one communicator, one stream or one
/// in-stream inbox in different orders on different members: NCCL would
/// pair one plan's all-reduce with the other's, and a stream holding a part
/// that waits for a peer in front of the part that peer waits for closes a
/// cycle on the GPUs. No deadlock: the draws are one total order, and a job
/// only waits on a line for jobs that drew before it (which hold all their
/// arenas and never wait for it).

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

namespace ag::actors {

/// Test hook, process-wide: while false, every line issues at once (turns
/// are still counted, so the order holds again once it is back on). Only
/// tests set it, with no job in flight, to show the hazard the order prevents.
inline std::atomic<bool>& collective_order_enforced_for_testing() {
  static std::atomic<bool> on{true};
  return on;
}

/// Whether a cancelled or failed job still issues, in its turn and with no
/// waits, the paired collective parts its queues had not issued
/// (stream_actor.cpp, issue_owed_parts). NCCL pairs a communicator's parts
/// by their place in each member's order alone, so a job cancelled after
/// one member issued its part and before another did would leave the first
/// member's part to pair with the next job's (docs/ARCHITECTURE.md,
/// "Cancelled jobs and NCCL's pairing"). Such a part is void
/// (gpu::collective_launch::void_part): it touches none of its job's memory.
/// Process-wide, on unless the environment sets
/// AG_OWE_CANCELLED_COLLECTIVES=0 or a test turns it off (to show the
/// hazard it closes).
inline std::atomic<bool>& owe_cancelled_collectives() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("AG_OWE_CANCELLED_COLLECTIVES");
    return !(v != nullptr && v[0] == '0');
  }()};
  return on;
}

/// `Job` names a parked job for its resumption (an id, or the actor's own
/// job-and-queue key).
template <class Job = uint64_t>
class collective_issue_order {
 public:
  /// Follows the test hook (collective_order_enforced_for_testing).
  collective_issue_order() = default;
  /// `enforce` false turns the order off (may_issue always says yes): a test
  /// hook that shows the hazard the order prevents. The runtime never does.
  explicit collective_issue_order(bool enforce) : fixed_(enforce ? 1 : 0) {}

  /// Whether the job holding turn `seq` may issue its next step now. When
  /// not, `job` (an opaque id) is parked until finish() hands it back.
  bool may_issue(uint64_t seq, const Job& job) {
    if (seq == next_) return true;  // the common case: no read of the test hook on the issue path
    const bool enforce =
        fixed_ < 0 ? collective_order_enforced_for_testing().load(std::memory_order_relaxed) : fixed_ == 1;
    if (!enforce) return true;
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

  /// Whether job number `seq` finished its turn here.
  bool finished(uint64_t seq) const { return seq < next_ || done_ahead_.count(seq) != 0; }

  /// The job number whose turn it is.
  uint64_t next() const noexcept { return next_; }
  /// How many jobs wait for their turn.
  std::size_t parked() const noexcept { return parked_.size(); }

 private:
  int fixed_ = -1;                      // -1: follow the hook; 0: off; 1: on
  uint64_t next_ = 0;                   // the job number whose turn it is
  std::set<uint64_t> done_ahead_;       // numbers above next_ already finished here
  std::map<uint64_t, Job> parked_;      // job number -> job, waiting for their turn
};

/// One issue line: a stream lane of one executing actor.
struct issue_line {
  uint64_t actor = 0;  ///< the actor's id (caf::actor::id(); 0: no line, an unordered queue)
  int lane = 0;        ///< the stream lane within that actor (launch_program::lane_on_copy)
  friend bool operator<(const issue_line& a, const issue_line& b) noexcept {
    return a.actor != b.actor ? a.actor < b.actor : a.lane < b.lane;
  }
};

/// The runtime's dealer of turns on its issue lines (one per runtime_core;
/// thread-safe). A line's turns run 0, 1, 2, ... without gaps, and a line's
/// actor must see each of them finished (collective_issue_order::finish), or
/// the jobs after it wait for ever; a line that is new here starts at 0,
/// as does its actor's order (a respawned actor has a new id: a new line).
class issue_lines {
 public:
  /// Deals one turn on each line of `lines` (by queue; actor 0: none, its
  /// turn left 0) into `turns`, all under one lock, so every line sees the
  /// draws in one order. Returns the draw's number (the job's place in the
  /// runtime-wide order, for logs).
  uint64_t draw(const std::vector<issue_line>& lines, std::vector<uint64_t>& turns) {
    turns.assign(lines.size(), 0);
    std::lock_guard<std::mutex> lk(mu_);
    for (std::size_t q = 0; q < lines.size(); ++q)
      if (lines[q].actor != 0) turns[q] = next_[lines[q]]++;
    return draws_++;
  }

 private:
  std::mutex mu_;
  std::map<issue_line, uint64_t> next_;  // the next turn of each line
  uint64_t draws_ = 0;
};

}  // namespace ag::actors
