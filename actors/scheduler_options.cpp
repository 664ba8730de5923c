#include "actors/scheduler_options.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

#include <caf/all.hpp>

namespace ag::actors {

void apply_scheduler_options(const runtime_options& o, caf::actor_system_config& cfg) {
  if (o.scheduler_threads > 0) cfg.set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
  if (!o.tuned_scheduler) return;
  cfg.set("work-stealing.moderate-poll-attempts", static_cast<size_t>(0));
  if (o.scheduler_max_throughput > 0)
    cfg.set("scheduler.max-throughput", static_cast<size_t>(o.scheduler_max_throughput));
  int spin = o.scheduler_spin_polls;
  if (spin < 0) spin = std::thread::hardware_concurrency() >= 16 ? 20000 : 0;
  if (const char* env = std::getenv("AG_SCHED_SPIN_POLLS")) spin = std::atoi(env);
  if (spin > 0) cfg.set("work-stealing.aggressive-poll-attempts", static_cast<size_t>(spin));
  if (o.scheduler_idle_steal_us > 0)
    cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::microseconds(o.scheduler_idle_steal_us)});
}

}  // namespace ag::actors
