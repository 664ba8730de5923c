#include "actors/runtime_actor.hpp"

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

namespace {

struct runtime_state {
  std::shared_ptr<job_registry> jobs;
  static constexpr const char* name = "ag.runtime";
};

using runtime_actor_t = caf::stateful_actor<runtime_state>;

caf::behavior runtime_actor_fn(runtime_actor_t* self, std::shared_ptr<job_registry> jobs) {
  self->state.jobs = std::move(jobs);
  return {
      [self](const msg::device_down& m) {
        // Jobs that register from now on see the device dead (job_registry::add).
        const error& refuse = m.refuse ? m.refuse : m.err;
        for (auto& u : self->state.jobs->mark_dead(m.device, refuse)) {
          error e = m.err;
          // The step id names a step of the stalled job's plan only.
          if (m.plan_key != 0 && u.plan_key != m.plan_key) e.step = -1;
          self->send(u.who, msg::fail_job{std::move(e)});
        }
      },
      [self](const msg::device_up& m) {
        // After the device_down it follows (same sender, in order).
        self->state.jobs->revive(m.device);
        if (m.done) m.done({});
      },
      [self](msg::stats_atom) -> int64_t { return static_cast<int64_t>(self->state.jobs->size()); },
  };
}

}  // namespace

caf::actor spawn_runtime_actor(caf::actor_system& sys, std::shared_ptr<job_registry> jobs) {
  return sys.spawn(runtime_actor_fn, std::move(jobs));
}

}  // namespace ag::actors
