#pragma once
/// \file hop_probe.hpp
/// Host timestamps of a job's hand-overs, from entering submit() to its
/// handle being fulfilled: where a tiny job's round trip goes
/// (docs/BENCHMARKS.md, session 34). A developer's tool: compiled in only
/// with the CMake option ACTORGRAPH_HOP_PROBES=ON; otherwise AG_HOP_PROBE is
/// nothing and report() is empty.
///
/// Threads: stamp() is called on the submitting thread, the executing
/// actors' threads and the backend's completion thread, each writing its own
/// points of a job's row (relaxed atomics; rows are reused by job id modulo
/// the table size). report() reads the table after the jobs finished.

#include <cstdint>
#include <string>

namespace ag::actors::hop_probe {

/// The hand-overs, in the order a tiny one-device job passes them.
enum class point : int {
  submit,             ///< runtime_core::submit entered (the job has its id)
  context_made,       ///< inputs checked, job context built
  actor_bound,        ///< its job actor bound (a spare) or spawned
  arenas_taken,       ///< take_arenas_now holds every arena
  slots_sized,        ///< its per-step slots allocated
  outputs_made,       ///< its output host tensors allocated
  buffers_ready,      ///< allocate_job_buffers returned
  prepared,           ///< prepare_run: inputs in the host windows
  registered,         ///< in the job registry
  run_job_sent,       ///< run_job sent to the queues that start it
  actor_has_it,       ///< an executing actor got run_job
  graph_found,        ///< a replay segment's graph found (or captured)
  replay_called,      ///< device::replay about to be called
  launched,           ///< device::replay returned
  notify_called,      ///< a completion step's notify about to be called
  notify_registered,  ///< the segment's steps ended (notify returned)
  poller_saw_it,      ///< the completion callback entered
  fulfilled,          ///< the completion callback fulfilled the handle
  count
};

/// Stamps `p` of job `job` with the host clock.
void stamp(point p, uint64_t job) noexcept;

/// A table of each point's median, in us after `submit`, over the jobs that
/// stamped `submit` and `fulfilled` (a point some of them passed by says
/// over how many); empty when the probes are not compiled in. Clears the table.
std::string report();

}  // namespace ag::actors::hop_probe

#ifdef AG_HOP_PROBES
#define AG_HOP_PROBE(p, job) ::ag::actors::hop_probe::stamp(::ag::actors::hop_probe::point::p, (job))
#else
#define AG_HOP_PROBE(p, job) ((void)0)
#endif
