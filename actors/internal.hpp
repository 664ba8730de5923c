#pragma once
/// \file internal.hpp
/// Internal interface of the actor runtime (not installed, not for apps):
/// the per-plan tables the actors share, the job context, and runtime_core,
/// which builds every actor of a runtime on a given caf::actor_system. The
/// public runtime (actorgraph.hpp) owns one actor system and one core; tests
/// build a core on CAF's deterministic test coordinator instead.
///
/// Ownership and threads:
///  - loaded_plan and device_plan are immutable after compile (except
///    device_plan::arenas, see there) and shared by jobs and actors;
///  - job_context is built by its job actor, then shared read-only; the
///    mutable parts (step slots, outputs, cancelled) are each written by one
///    actor and read after a message or a device notification that orders
///    the write before the read.

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/actorgraph.hpp"
#include "actors/job_state.hpp"
#include "gpu/device.hpp"
#include "graph/plan.hpp"

namespace ag::actors {

class runtime_core;
struct liveness;

/// Kinds of executing actors: one stream actor per compute lane, one
/// copy-engine actor per direction.
enum class exec_kind : uint8_t { compute = 0, h2d = 1, d2h = 2, peer = 3 };
const char* lane_name(exec_kind k, int lane);  // "compute0", "h2d", ...

/// One plan's memory on one device: the weight region (uploaded at compile)
/// and the arena pool's bases. Frees its memory when the last holder (the
/// plan, a job, the device actor) lets go.
struct device_plan {
  uint64_t plan_key = 0;
  int device = -1;
  gpu::device_ptr dev;
  void* weights = nullptr;
  int64_t weight_bytes = 0;
  int64_t arena_bytes = 0;
  /// Arena bases by handle. Fixed size (arenas_per_device); entry i is
  /// written only by the device actor, before it first grants handle i, and
  /// read by stream actors that got i through a job context (a message
  /// orders the write before the read).
  std::vector<void*> arenas;
  ~device_plan();
};

/// A tensor operand resolved at compile time up to its region base.
struct prepared_arg {
  region where = region::arena;
  int64_t byte_offset = 0;
  gpu::tensor_arg proto;  ///< data == nullptr; type, dims, stride filled
};
struct prepared_op {
  const node* op = nullptr;
  prepared_arg out;
  std::vector<prepared_arg> inputs;
};

/// Everything an actor needs to run one step, computed once per plan.
struct step_info {
  int actor = -1;                   ///< index into loaded_plan::actors
  int pos = -1;                     ///< position in that actor's step list
  int remote_deps = 0;              ///< deps run by other actors
  std::vector<step_id> remote_dep_ids;
  std::vector<int> consumer_actors; ///< distinct other actors consuming this step
  bool completion = false;          ///< host notification when done (sinks, dead ends)
  std::vector<prepared_op> ops;     ///< compute steps (views and leaves dropped)
  /// One launch record per entry of `ops`, filled at compile time except for
  /// the data pointers. Owned by the executing actor of this step (`actor`):
  /// only it reads or writes them, patching the pointers in place for each
  /// job, so a launch copies no shapes or strides.
  mutable std::vector<gpu::op_launch> launches;
  prepared_arg src, dst;            ///< copies
  int64_t bytes = 0;                ///< copies
  /// d2h of a non-contiguous view output: the storage's whole buffer lands in
  /// job_context::staging and the job actor gathers the view on the host.
  bool gather = false;
  std::string label;                ///< trace label
};

struct exec_actor {
  caf::actor handle;
  int device = -1;
  exec_kind kind = exec_kind::compute;
  int lane = 0;
  std::vector<step_id> steps;       ///< this plan's steps it runs, in launch order
};

/// A plan loaded on a runtime: tables shared by all its jobs.
struct loaded_plan {
  uint64_t key = 0;
  std::shared_ptr<const plan> p;
  std::vector<std::shared_ptr<device_plan>> mem;  ///< by device index; null if unused
  std::vector<step_info> steps;
  std::vector<exec_actor> actors;
  std::vector<step_id> completion_steps;
  /// By output: where its host buffer comes from (the host_memory() of the
  /// device that copies it out, when runtime_options::pinned_outputs); null: heap.
  std::vector<host_memory_resource*> output_memory;
  std::vector<int> used_devices;                  ///< ascending
  std::vector<caf::actor> device_actors;          ///< by used_devices position
  runtime_core* core = nullptr;
};

/// Per step and job: the events the step recorded and when it was enqueued.
struct step_slot {
  std::shared_ptr<gpu::event> start;  ///< timing runs only
  std::shared_ptr<gpu::event> end;
  int64_t enqueue_ns = 0;
};

/// Whether the job actor sends run_job to executing actor `actor` of `lp`:
/// only when its first step has no remote dep. The others start on the first
/// ready message (which names the job's context too), saving a message and
/// an actor activation per job and actor.
inline bool needs_run_job(const loaded_plan& lp, int actor) noexcept {
  const auto& a = lp.actors[static_cast<std::size_t>(actor)];
  return a.steps.empty() || lp.steps[static_cast<std::size_t>(a.steps.front())].remote_deps == 0;
}

/// One job's shared context (see messages.hpp: sent as shared_ptr<const>).
struct job_context : std::enable_shared_from_this<job_context> {
  uint64_t id = 0;
  std::shared_ptr<const loaded_plan> lp;
  std::shared_ptr<const plan> user_plan;  ///< keeps the plan loaded while the job lives
  std::vector<int> arenas;                ///< arena handle by device index (-1 unused)
  std::vector<host_tensor> inputs;
  caf::actor job_actor;
  bool timing = false;
  // Written by the actor that runs step i (slot i) or the d2h of output i;
  // read by the job actor after the sinks completed.
  mutable std::vector<step_slot> slots;
  mutable std::vector<host_tensor> outputs;
  mutable std::vector<host_tensor> staging;  ///< by output index, gathered outputs only
  /// Set by the job actor before it sends cancel_job: actors drop the job's
  /// unlaunched steps and ignore its late ready messages.
  mutable std::atomic<bool> cancelled{false};

  // Host completion fast path (complete_from_backend): the notify callback of
  // the last completion step to finish without error fulfils the handle
  // directly on the backend thread, so "GPU done -> future ready" costs no
  // actor-scheduler wake-up. The job actor still releases the arenas after.
  runtime_core* core = nullptr;
  std::shared_ptr<job::shared_state> handle;
  mutable std::atomic<int> completions_left{0};   ///< set before run_job is sent
  mutable std::atomic<bool> fulfilled_early{false};

  /// Base of `where` on `device` for this job.
  std::byte* base(region where, int device) const noexcept {
    const auto& m = *lp->mem[static_cast<std::size_t>(device)];
    return static_cast<std::byte*>(where == region::weights ? m.weights
                                                            : m.arenas[static_cast<std::size_t>(arenas[static_cast<std::size_t>(device)])]);
  }
};

/// Reaches the shared state behind a job handle (tests, the runtime).
struct job_access {
  static const std::shared_ptr<job::shared_state>& state(const job& j) noexcept { return j.s_; }
};

/// Thread-safe trace buffer (owned by runtime_core).
class trace_buffer {
 public:
  void push(std::vector<trace_record>&& recs);
  std::vector<trace_record> take();
 private:
  std::mutex m_;
  std::vector<trace_record> recs_;
};

/// Writes runtime_options' scheduler settings (scheduler_threads,
/// tuned_scheduler, scheduler_max_throughput, scheduler_idle_steal_us) into a
/// CAF config, before the actor system is built from it.
void apply_scheduler_options(const runtime_options& o, caf::actor_system_config& cfg);

/// Forwards backend fault callbacks to a device actor while the runtime lives.
struct fault_sink {
  std::mutex m;
  caf::actor target;
};

/// The jobs in flight and the devices each one uses, for the runtime actor's
/// device_down. Thread-safe (one mutex): job actors add and remove
/// themselves directly, two short critical sections per job instead of two
/// messages to the runtime actor.
class job_registry {
 public:
  /// Registers job `id` (its actor `who`, its plan's used devices). If one of
  /// them is dead already, registers nothing and returns the error the job
  /// fails with.
  error add(uint64_t id, caf::actor who, std::shared_ptr<const loaded_plan> lp);
  void remove(uint64_t id);
  /// Marks `device` dead with the error `why` (later add()s of jobs using it
  /// fail with it); returns the actors of the registered jobs using it.
  std::vector<caf::actor> mark_dead(int device, const error& why);
  std::size_t size();

 private:
  struct entry {
    caf::actor who;
    std::shared_ptr<const loaded_plan> lp;
  };
  std::mutex m_;
  std::unordered_map<uint64_t, entry> jobs_;
  std::unordered_map<int, error> dead_;  ///< device index -> its death error
};

/// Builds and owns the actors of one runtime on a given actor system.
/// Methods are thread-safe. The system must outlive the core's shutdown().
class runtime_core {
 public:
  runtime_core(caf::actor_system& sys, std::vector<gpu::device_ptr> devices, runtime_options opts);
  ~runtime_core();

  const std::vector<gpu::device_ptr>& devices() const noexcept { return devices_; }
  const std::vector<device_spec>& specs() const noexcept { return specs_; }
  const runtime_options& options() const noexcept { return opts_; }
  caf::actor_system& system() noexcept { return sys_; }
  caf::actor runtime_actor() const { return runtime_actor_; }
  job_registry& jobs() noexcept { return *jobs_; }
  /// Every stream and copy-engine actor (tests).
  std::vector<caf::actor> exec_actors();
  /// The tables behind a plan this runtime compiled (tests); null for others.
  static std::shared_ptr<const loaded_plan> loaded(const std::shared_ptr<const plan>& p);
  caf::actor device_actor(int i) const { return device_actors_[static_cast<std::size_t>(i)]; }

  expected<std::shared_ptr<const plan>> compile(std::shared_ptr<const graph> g, plan_options options);
  job submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs);

  int64_t jobs_in_flight() const noexcept { return in_flight_.load(); }
  void wait_idle();
  /// Called by a job actor once its job is ready.
  /// A job's handle became ready (jobs_in_flight() counts these down).
  void job_ready() noexcept;
  /// A job actor is done with the runtime (wait_idle() and teardown wait for these).
  void job_gone() noexcept;
  trace take_trace();
  trace_buffer& traces() noexcept { return trace_; }

  /// Stops every actor (call after wait_idle). Idempotent.
  void shutdown();
  bool stopped() const noexcept { return stopped_.load(); }

 private:
  /// Stream actors of device d, at least `lanes` of them (spawns missing ones).
  std::vector<caf::actor> ensure_lanes(int d, int lanes);

  caf::actor_system& sys_;
  std::vector<gpu::device_ptr> devices_;
  std::vector<device_spec> specs_;
  runtime_options opts_;
  std::shared_ptr<job_registry> jobs_ = std::make_shared<job_registry>();
  caf::actor runtime_actor_;
  std::vector<caf::actor> device_actors_;
  std::mutex lanes_m_;
  std::vector<std::vector<caf::actor>> lanes_;          // [device][lane]
  std::vector<std::array<caf::actor, 3>> copy_actors_;  // [device][h2d, d2h, peer]
  std::vector<std::shared_ptr<fault_sink>> fault_sinks_;
  std::atomic<uint64_t> next_job_{1};
  std::atomic<int64_t> in_flight_{0};  ///< submitted, handle not yet ready
  std::atomic<int64_t> alive_{0};      ///< submitted, job actor not yet finished
  mutable std::mutex idle_m_;
  std::condition_variable idle_cv_;
  std::atomic<bool> stopped_{false};
  trace_buffer trace_;
  std::shared_ptr<liveness> live_;
};

}  // namespace ag::actors
