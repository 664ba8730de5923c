#include "actors/scheduler_options.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <caf/all.hpp>

namespace ag::actors {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

}  // namespace

int spinning_polls(const runtime_options& o) {
  if (!o.tuned_scheduler) return 0;
  int spin = o.scheduler_spin_polls;
  if (spin < 0) spin = std::thread::hardware_concurrency() >= 16 ? default_spin_polls : 0;
  return env_int("AG_SCHED_SPIN_POLLS", spin);
}

int scheduler_thread_count(const runtime_options& o, int devices) {
  const int asked = env_int("AG_SCHED_THREADS", o.scheduler_threads);
  if (asked > 0) return asked;
  const int caf_default = std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
  if (spinning_polls(o) <= 0) return caf_default;
  return std::min(caf_default, std::max(4, spinning_workers_per_device * std::max(devices, 1)));
}

void apply_scheduler_options(const runtime_options& o, caf::actor_system_config& cfg, int devices) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(scheduler_thread_count(o, devices)));
  if (!o.tuned_scheduler) return;
  cfg.set("work-stealing.moderate-poll-attempts", static_cast<size_t>(0));
  if (o.scheduler_max_throughput > 0)
    cfg.set("scheduler.max-throughput", static_cast<size_t>(o.scheduler_max_throughput));
  if (const int spin = spinning_polls(o); spin > 0)
    cfg.set("work-stealing.aggressive-poll-attempts", static_cast<size_t>(spin));
  // A/B runs: how many polls of its own queue a spinning worker makes
  // between steal attempts (CAF: 10).
  if (const int steal = env_int("AG_SCHED_STEAL_INTERVAL", 0); steal > 0)
    cfg.set("work-stealing.aggressive-steal-interval", static_cast<size_t>(steal));
  if (o.scheduler_idle_steal_us > 0)
    cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::microseconds(o.scheduler_idle_steal_us)});
}

}  // namespace ag::actors
