// The public runtime (actorgraph.hpp): one CAF actor system + one runtime_core.
#include <chrono>
#include <future>

#include <caf/all.hpp>

#include "actors/hop_probe.hpp"
#include "actors/job_state.hpp"
#include "actors/runtime_core.hpp"
#include "actors/scheduler_options.hpp"
#include "actors/validate_options.hpp"
#include "messages/registration.hpp"

namespace ag {

struct runtime::impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<actors::runtime_core> core;

  ~impl() {
    if (core) {
      // New jobs are refused first: continuations that keep submitting would
      // otherwise keep the runtime busy forever.
      core->stop_submissions();
      core->wait_idle();
      core->shutdown();
      core.reset();  // drops every actor handle before the system goes
    }
    sys.reset();     // waits for all actors to terminate
  }
};

expected<std::unique_ptr<runtime>> runtime::create(const std::string& device_spec, runtime_options options) {
  if (error e = validate(options)) return e;
  auto devs = gpu::make_devices(device_spec, options.backend);
  if (!devs) return devs.err();
  if (devs->empty()) return error{errc::bad_device_spec, "device spec '" + device_spec + "' names no device"};
  auto p = std::make_unique<impl>();
  msg::register_message_types(p->cfg);
  actors::apply_scheduler_options(options, p->cfg, static_cast<int>(devs->size()));
  try {
    p->sys = std::make_unique<caf::actor_system>(p->cfg);
  } catch (const std::exception& e) {
    return error{errc::internal, std::string("starting the actor system: ") + e.what()};
  }
  p->core = std::make_unique<actors::runtime_core>(*p->sys, std::move(*devs), options);
  return std::unique_ptr<runtime>(new runtime(std::move(p)));
}

runtime::runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
runtime::~runtime() = default;

const std::vector<device_spec>& runtime::devices() const noexcept { return impl_->core->specs(); }

expected<std::shared_ptr<const plan>> runtime::compile(std::shared_ptr<const graph> g, plan_options options) {
  return impl_->core->compile(std::move(g), options);
}

expected<std::shared_ptr<const plan>> runtime::compile(graph g, plan_options options) {
  return impl_->core->compile(std::make_shared<const graph>(std::move(g)), options);
}

job runtime::submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs) {
  return impl_->core->submit(p, std::move(inputs));
}

job runtime::submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs,
                    const submit_options& options) {
  return impl_->core->submit(p, std::move(inputs), options);
}

std::vector<job> runtime::submit_batch(const std::shared_ptr<const plan>& p, std::vector<std::vector<host_tensor>> inputs) {
  std::vector<job> r;
  r.reserve(inputs.size());
  for (auto& in : inputs) r.push_back(impl_->core->submit(p, std::move(in)));
  return r;
}

int64_t runtime::jobs_in_flight() const noexcept { return impl_->core->jobs_in_flight(); }
void runtime::wait_idle() {
  if (actors::inside_continuation()) return;  // it would wait for the job running it
  impl_->core->wait_idle();
}
trace runtime::take_trace() { return impl_->core->take_trace(); }
replay_stats runtime::replay_statistics() const { return impl_->core->replays().read(); }

error runtime::reset_device(int index) {
  // It blocks for the device actor's answer: on a runtime thread that could
  // be the thread the answer needs.
  if (actors::inside_continuation())
    return error{errc::invalid_argument, "reset_device(" + std::to_string(index) +
                                             ") inside a continuation: it blocks; call it from another thread"};
  auto done = std::make_shared<std::promise<error>>();
  auto result = done->get_future();
  impl_->core->reset_device(index, [done](const error& e) { done->set_value(e); });
  // The answer takes two actor messages; a minute means the actors are gone.
  if (result.wait_for(std::chrono::minutes(1)) != std::future_status::ready)
    return error{errc::timeout, "reset_device(" + std::to_string(index) + "): the device actor did not answer in 60 s",
                 index};
  try {
    return result.get();
  } catch (const std::future_error&) {
    // The message was dropped with its callback unanswered: the actor stopped.
    return error{errc::shutting_down, "reset_device(" + std::to_string(index) + "): the runtime is stopping", index};
  }
}

host_memory_resource* runtime::input_memory(const std::shared_ptr<const plan>& p, std::size_t index) const {
  const auto* lp = impl_->core->loaded_here(p);
  if (!lp || index >= (*lp)->input_home.size()) return nullptr;
  return (*lp)->input_home[index];
}

bool runtime::device_in_service(int index) const { return impl_->core->device_in_service(index); }

gpu::device_ptr runtime::device(int index) const {
  const auto& d = impl_->core->devices();
  if (index < 0 || static_cast<std::size_t>(index) >= d.size()) return nullptr;
  return d[static_cast<std::size_t>(index)];
}

std::string hop_probe_report() { return actors::hop_probe::report(); }

}  // namespace ag
