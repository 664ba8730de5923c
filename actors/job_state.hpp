#pragma once
/// \file job_state.hpp
/// job::shared_state: what a job handle and its job actor share. The job
/// actor is the only writer of the result; user threads read it after
/// ready() (acquire) or under the mutex; wait()/wait_for() block on the
/// condition variable (the one place a user thread blocks on a job).

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include <caf/actor.hpp>

#include "actors/actorgraph.hpp"

namespace ag {

struct job::shared_state {
  uint64_t id = 0;
  std::atomic<job_state> state{job_state::queued};
  std::mutex m;
  std::condition_variable cv;
  std::optional<job_result> result;  // set once, under m
  job_times times;                   // under m
  std::vector<std::function<void(const job_result&)>> continuations;  // under m
  /// The job actor while the job runs (cancel() sends to it); reset when ready.
  caf::actor actor;
  /// cancel() came before the job actor started (under m).
  bool cancel_requested = false;
  /// The continuations fulfil() took have all returned (under m): from then
  /// on only job handles read the result.
  bool continuations_ran = false;
  /// Live job handles (class job) on this state. wait() && moves the result
  /// out when it is the last one and continuations_ran.
  std::atomic<int> handles{0};

  /// Sets the result and final state, runs continuations (on the calling
  /// thread, outside the lock), then wakes the threads blocked in wait() (a
  /// wait() that starts meanwhile sees the result and returns at once). Only
  /// the first call counts.
  /// `settled` runs under the lock once the result is set, before waiters
  /// wake (the runtime's in-flight count drops there, so jobs_in_flight()
  /// is 0 as soon as every wait() returned).
  void fulfil(job_result r, job_state final_state, const std::function<void()>& settled = {});
  void mark_started(int64_t ns);
};

namespace actors {

/// True on a thread that is running a job's continuations (job::then
/// callbacks run by the runtime). Such a thread may be a device's worker or a
/// CAF worker that other jobs need: blocking it on another job can deadlock,
/// so job::wait() / wait_for() / runtime::wait_idle() do not block there.
bool inside_continuation() noexcept;


/// Reaches the shared state behind a job handle (the runtime, tests).
struct job_access {
  static const std::shared_ptr<job::shared_state>& state(const job& j) noexcept { return j.s_; }
};

}  // namespace actors

}  // namespace ag
