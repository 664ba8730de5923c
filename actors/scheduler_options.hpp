#pragma once
/// \file scheduler_options.hpp
/// runtime_options' CAF scheduler settings (scheduler_threads,
/// tuned_scheduler, scheduler_max_throughput, scheduler_idle_steal_us) and
/// why they matter: docs/ARCHITECTURE.md, "Actors and messages".

#include <caf/actor_system_config.hpp>

#include "actors/actorgraph.hpp"

namespace ag::actors {

/// Idle-worker spin polls in effect (work-stealing.aggressive-poll-attempts):
/// runtime_options::scheduler_spin_polls resolved by core count (-1), then
/// the AG_SCHED_SPIN_POLLS environment variable when set; 0 when the
/// scheduler is untuned or does not spin (CAF's default applies).
int spinning_polls(const runtime_options& o);

/// Idle-worker spin polls of runtime_options::scheduler_spin_polls = -1 on
/// a machine with 16 or more hardware threads: about 20 ms of spinning after
/// a worker's last message. At 20000 (about 1 ms) the workers were asleep
/// again when the next job of a 6 ms layer came, and the first GPU of a
/// tensor-parallel job started 29-37 us before the second (their run_job
/// waited for a condition variable's wake-up); at 400000, 2-10 us, and the
/// LLaMA-7B-shaped decode step took 1.5-3% less on 1 GPU and at degree 2
/// (docs/BENCHMARKS.md, session 38).
inline constexpr int default_spin_polls = 400000;

/// Spinning CAF workers per device when runtime_options::scheduler_threads
/// is 0 (auto). A device keeps few actors busy at once (its compute actor,
/// its copy engines, the jobs' actors), and each spinning worker costs a
/// core and probes the others' queues: on a 16-core H200 host a tiny job's
/// round trip took 38 us with 16 spinning workers, 35 with 8 and 31 with 4
/// (p99 840-1280 / 90-310 / 115-133 us; docs/BENCHMARKS.md, session 32).
inline constexpr int spinning_workers_per_device = 4;

/// The CAF scheduler's worker count for a runtime of `devices` devices: the
/// AG_SCHED_THREADS environment variable when set above 0, else
/// runtime_options::scheduler_threads when above 0, else (auto) CAF's default
/// max(hardware threads, 4), capped at max(4, 4 x devices) where the idle
/// workers spin.
int scheduler_thread_count(const runtime_options& o, int devices);

/// Writes the scheduler settings of `o` into `cfg`, before the actor system
/// is built from it (the public runtime does this on the creating thread).
/// `devices`: how many the runtime drives (scheduler_thread_count).
void apply_scheduler_options(const runtime_options& o, caf::actor_system_config& cfg, int devices = 1);

}  // namespace ag::actors
