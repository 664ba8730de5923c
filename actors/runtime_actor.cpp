#include "actors/runtime_actor.hpp"

#include <algorithm>
#include <unordered_map>

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

namespace {

struct runtime_state {
  std::unordered_map<uint64_t, msg::job_started> jobs;
  std::vector<int> dead_devices;
  static constexpr const char* name = "ag.runtime";
};

using runtime_actor_t = caf::stateful_actor<runtime_state>;

caf::behavior runtime_actor_fn(runtime_actor_t* self) {
  return {
      [self](const msg::job_started& m) {
        auto& st = self->state;
        // A job that registers after its device died is failed at once.
        for (int d : m.devices)
          if (std::find(st.dead_devices.begin(), st.dead_devices.end(), d) != st.dead_devices.end()) {
            self->send(m.who, msg::fail_job{{errc::device_failed, "device " + std::to_string(d) + " is dead"}});
            return;
          }
        st.jobs.emplace(m.job, m);
      },
      [self](msg::job_gone_atom, uint64_t job) { self->state.jobs.erase(job); },
      [self](const msg::device_down& m) {
        auto& st = self->state;
        st.dead_devices.push_back(m.device);
        for (auto& [id, j] : st.jobs)
          if (std::find(j.devices.begin(), j.devices.end(), m.device) != j.devices.end())
            self->send(j.who, msg::fail_job{m.err});
      },
      [self](msg::stats_atom) -> int64_t { return static_cast<int64_t>(self->state.jobs.size()); },
  };
}

}  // namespace

caf::actor spawn_runtime_actor(caf::actor_system& sys) { return sys.spawn(runtime_actor_fn); }

}  // namespace ag::actors
