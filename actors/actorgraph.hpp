#pragma once
/// \file actorgraph.hpp
/// The one header a user includes. Create a runtime over a device spec,
/// compile graphs into plans, submit jobs and get handles back at once:
///
///     auto rt = ag::runtime::create("sim:4").value();
///     auto g  = ag::models::build_transformer(cfg).value();
///     auto p  = rt->compile(std::move(g), {.pipeline_stages = 4}).value();
///     ag::job j = rt->submit(p, {tokens});
///     j.then([](const ag::job_result& r) { ... });   // or j.wait()
///
/// Threading: every method of `runtime` and `job` may be called from any
/// thread. Work runs on the runtime's CAF actors (one per device, stream and
/// copy engine); the caller's thread never blocks except in wait()/wait_for()
/// and, for compile(), while weights are uploaded.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"
#include "graph/plan.hpp"
#include "gpu/device.hpp"

namespace ag {

namespace actors {
struct job_access;  // internal (actors/job_state.hpp): reaches a job's shared state
}

struct runtime_options {
  gpu::backend_options backend;  ///< sim / cpu / cuda parameters
  /// Activation arenas per device and plan: the number of jobs of one plan
  /// that may hold memory on a device at once. More jobs wait (back-pressure).
  int arenas_per_device = 8;
  /// CAF scheduler threads. 0 (auto): CAF's default, max(cores, 4), except
  /// where the idle workers spin (scheduler_spin_polls below): then at most
  /// 4 per device (at least 4), because spinning workers beyond what the
  /// devices keep busy only slow the rest (a tiny job's round trip on a
  /// 16-core H200 host: 38 us with 16 workers, 31 with 4). The environment
  /// variable AG_SCHED_THREADS, when set above 0, overrides it.
  int scheduler_threads = 0;
  /// Sets work-stealing.moderate-poll-attempts=0: an idle CAF worker sleeps on
  /// a condition variable at once, so a message from outside the scheduler
  /// (the CUDA poller, the user's thread) wakes it in 10 us instead of 32 us
  /// median. Also applies the two settings below; false: CAF's defaults.
  bool tuned_scheduler = true;
  /// Messages an actor handles before its CAF worker turns to other ready
  /// actors (scheduler.max-throughput; CAF's default is unlimited). A message
  /// one actor sends to another from inside a handler waits in the sender's
  /// worker queue until the sender lets go of that worker (or another worker
  /// steals it): with no limit that is when the sender's mailbox is empty,
  /// which for a stream actor with 32 queued splits of 100 kernel launches
  /// each is milliseconds. 1 bounds it by one handler.
  int scheduler_max_throughput = 1;
  /// How often an idle worker wakes to steal queued actors from busy workers
  /// (work-stealing.relaxed-sleep-duration, CAF's default 10 ms), in us.
  /// Shorter: a message stuck behind a long handler is picked up sooner, at
  /// some idle CPU (16 idle workers: 2% of a core at 10 ms, 8% at 1 ms).
  int scheduler_idle_steal_us = 1000;
  /// Queue polls an idle CAF worker spins through before it starts to sleep
  /// (work-stealing.aggressive-poll-attempts; 0: CAF's default, 100). A
  /// worker that spins picks up a message sent to it through the
  /// coordinator at once; a sleeping one waits for the kernel to wake it
  /// (tens of us). Spinning costs a core per idle worker while it lasts
  /// (about 50 ns a poll), so it is for machines with cores to spare. -1
  /// (the default): actors::default_spin_polls (400000, about 20 ms) where
  /// the machine has at least 16 hardware threads, else CAF's default. On 4
  /// H200s (64 cores) spinning took a LLaMA-7B-shaped decode step at
  /// tensor-parallel degree 4 from 7.72 to 4.36 ms (its 64 all-reduces are
  /// each a hop to the other GPUs' actors); 400000 rather than 20000 keeps
  /// the workers awake between jobs of a few ms, so that a tensor-parallel
  /// job's GPUs start 2-10 us apart instead of 29-37 (scheduler_options.hpp).
  /// The environment variable AG_SCHED_SPIN_POLLS, when set, overrides it.
  int scheduler_spin_polls = -1;
  bool trace = true;  ///< record a trace entry per step
  /// One executing actor per compute lane of a device (true), or one actor
  /// for all compute lanes of a device (false, the default): then a step
  /// that feeds another lane of its device sends no message, the consumer
  /// lane advances in the same actor turn, and only the streams differ (the
  /// device still runs the lanes concurrently). Copy engines keep their own
  /// actors either way.
  bool actor_per_lane = false;
  /// A job whose plan finds an arena free on every device it uses starts on
  /// the submitting thread: submit takes the arenas and sends the first
  /// steps to their executing actors itself, two actor hops (device actor,
  /// job actor) fewer between submit() and the first launch. A job that
  /// must wait, or any job when this is off, asks each device actor for its
  /// arena in turn, and jobs still get their arenas in submission order.
  bool start_jobs_on_submit = true;
  /// Job actors the runtime spawns ahead of their jobs (0..1024): submit()
  /// binds a spare one to its job instead of spawning it (4.3-4.7 us of an
  /// H200 host's time before the job's first message), and spawns the
  /// replacement after the job is on its way. Each spare is an idle actor
  /// (about a kilobyte); 0: every job actor is spawned by its submit().
  int spare_job_actors = 2;
  /// Trace records kept until take_trace(): a ring of the newest ones (about
  /// 100 bytes each plus labels); older ones are dropped and counted in
  /// trace::dropped_records. Bounds tracing's memory in long runs.
  int64_t trace_max_records = 262144;
  /// Job outputs copied out of a device that offers memory for them
  /// (gpu::device::output_memory(): CUDA's pinned pool; a cpu device's cache
  /// of large buffers on huge pages) are allocated there: a GPU copies into
  /// them directly, without a staging copy, a cpu device without faulting in
  /// fresh pages, and a buffer returns to its pool when the last host_tensor
  /// holding it is destroyed (copies of an output are heap memory). False:
  /// outputs are heap memory.
  bool pinned_outputs = true;
  /// A job input of at most this many bytes that a device offering host
  /// memory of its own (CUDA's pinned pool) copies in is first copied into
  /// that memory by submit(), on the submitting thread: the device then
  /// copies it straight from there instead of through its staging (a pool
  /// buffer and an event per copy, 15 us of the copying actor's time per
  /// copy on an H100). The job keeps the copy until it ends. 0: never.
  int64_t pinned_inputs_max_bytes = int64_t{64} << 10;
  /// Weights that are not in host memory (a memory-mapped checkpoint) are
  /// uploaded by compile() in chunks of whole rows of at most this many
  /// bytes (one row when a row is larger), read straight into one staging
  /// buffer per device from the device's host memory (pinned on CUDA).
  int64_t upload_chunk_bytes = int64_t{64} << 20;
  /// Stall detection; 0 (the default) turns it off. A step (a split, a
  /// copy or a collective part) that has been running on its device for
  /// longer than max(stall_min_seconds, stall_factor x its cost-model
  /// estimate x the device's time_scale) is reported as stalled: every job
  /// using that device fails with errc::timeout naming the device and the
  /// step, and the device is quarantined (new jobs using it fail at once)
  /// until reset_device(). "Running" starts when the step's inputs are ready
  /// and the steps before it on its stream finished, as the executing actor
  /// sees it (checked on CAF timers every stall_min_seconds / 2 while the
  /// actor has work on its device; nothing runs when idle). Off by default
  /// because the cost model is calibrated for the sim and for the GPUs it
  /// was measured on: on the cpu backend or an unmeasured GPU a healthy step
  /// can exceed its estimate many times, and a false stall takes a device
  /// out of service. Suggested when on: 50-100, with a floor above the
  /// slowest expected one-off delay (first-launch module loading: seconds).
  double stall_factor = 0;
  /// The floor of the stall limit, in seconds (> 0; at least 1 ms).
  double stall_min_seconds = 1.0;
};

enum class job_state : uint8_t { queued, running, done, failed, cancelled };
const char* to_string(job_state s) noexcept;

/// Outputs in graph.outputs() order, or the error that says what failed where.
using job_result = expected<std::vector<host_tensor>>;

/// What graph replay (plan_options::graph_replay) did so far, summed over
/// every device of a runtime: one count per replay segment run. A segment's
/// first run on its executing actor is plain (kernel by kernel: the stream's
/// resources are made then); later runs capture one graph per set of job
/// buffers (arena) and replay it; a capture the device refuses makes that
/// segment run plainly from then on (a fallback, also marked in the trace).
/// Devices that do not capture (cpu) never count.
struct replay_stats {
  int64_t plain = 0;      ///< runs launched kernel by kernel (first runs, no graph slot left)
  int64_t captured = 0;   ///< graphs captured (and launched)
  int64_t replayed = 0;   ///< launches of a graph captured earlier
  int64_t fallbacks = 0;  ///< runs launched plainly because a capture was refused
  std::string last_fallback;  ///< why the last refused capture was refused ("" when none)
};

/// Per-job options of runtime::submit.
struct submit_options {
  /// Time from submission after which the job fails with errc::timeout
  /// (message: the job and its deadline), wherever it is: waiting for an
  /// arena, or running (steps not yet started are dropped, work already on a
  /// device finishes, memory is released, as for cancel()). A job that
  /// finished first keeps its result. Zero or negative: no deadline.
  std::chrono::nanoseconds deadline{0};
  /// For a plan with state (store_rows nodes, e.g. a KV cache): the state
  /// slot (0 .. plan_options::state_slots - 1) the job reads and stores into.
  /// Jobs of one slot run one at a time, in the order they were submitted
  /// (across the plans sharing the state, plan_options::share_state_with):
  /// each sees what the previous one stored (zeros in a fresh slot); a job
  /// whose slot is busy waits for its turn before it takes any memory, and
  /// a job that fails or is cancelled while it waits leaves the queue. Jobs
  /// of different slots run concurrently. -1 (none) for a plan without
  /// state; required with it (errc::invalid_argument at submit otherwise).
  int state_slot = -1;
  /// Runs once with the job's result when it finishes, like job::then(), but
  /// registered before the job can start: it runs on the runtime thread that
  /// finishes the job, never on the submitting thread, however fast the job
  /// ends (then() on a job that is already ready runs at once, on the caller's
  /// thread). Only a job refused by submit() itself (bad inputs or slot, a
  /// plan of another runtime, a stopping runtime) runs it at once, on the
  /// submitting thread, before submit() returns.
  std::function<void(const job_result&)> on_done;
};

/// When a job passed its milestones (host_clock_ns; 0 = not yet).
struct job_times {
  int64_t submitted_ns = 0;
  int64_t started_ns = 0;  ///< arenas acquired, steps sent
  int64_t finished_ns = 0;
};

/// Handle to a submitted job. Copyable; all copies refer to the same job.
class job {
 public:
  job() = default;
  uint64_t id() const noexcept;
  job_state state() const noexcept;
  /// True once the job finished (done, failed or cancelled). Never blocks.
  bool ready() const noexcept;
  /// Blocks until ready; returns the result (valid as long as a handle lives).
  /// Inside a continuation (a then() callback the runtime runs) on a job
  /// that is not ready, it does not block: the thread may be the one that job
  /// needs (a device's worker), so it returns errc::invalid_argument saying
  /// so at once (it used to deadlock that device).
  const job_result& wait() const&;
  /// On a temporary handle (`rt.submit(p, in).wait()`, `std::move(j).wait()`):
  /// blocks until ready and returns the result by value, so that nothing
  /// refers into a job state the temporary's end may free. When this is the
  /// job's last handle (no copy of it lives), the outputs are moved out once
  /// the job's continuations have run, not copied: a loop of
  /// `rt.submit(p, in).wait()` pays no copy of its outputs. With other handles
  /// alive it returns a copy, and they still see the result.
  job_result wait() &&;
  /// Waits at most `d`; true if ready. Inside a continuation it does not
  /// wait (see wait()): it only says whether the job is ready.
  bool wait_for(std::chrono::nanoseconds d) const;
  /// Runs `fn` once the job is ready (at once, on this thread, if it already
  /// is; else on a runtime thread: keep it short and non-blocking). Either
  /// way `fn` runs as a continuation: wait() on a job not ready fails there.
  void then(std::function<void(const job_result&)> fn) const;
  /// Asks the runtime to cancel: steps not yet started are dropped, work
  /// already on a device finishes, memory is released, and the result becomes
  /// errc::cancelled (unless the job finished first). Non-blocking.
  void cancel() const;
  job_times times() const noexcept;

  struct shared_state;  ///< implementation detail (actors/job_state.hpp)
  explicit job(std::shared_ptr<shared_state> s);
  job(const job& o);
  job(job&& o) noexcept;
  job& operator=(const job& o);
  job& operator=(job&& o) noexcept;
  ~job();

 private:
  friend struct actors::job_access;
  /// Counts this handle in s_->handles (the user's handles: the runtime's own
  /// references to the state are not jobs), so wait() && knows when it holds
  /// the last one.
  void retain() noexcept;
  void release() noexcept;
  std::shared_ptr<shared_state> s_;
};

/// One executed step (a split or a copy) in a trace.
struct trace_record {
  uint64_t job = 0;
  int device = 0;
  std::string lane;       ///< "compute0", "compute1", "h2d", "d2h", "peer"
  step_id step = -1;
  std::string label;      ///< first/last op names of a split, or the copied tensor
  int64_t enqueue_ns = 0; ///< the actor enqueued it (host)
  int64_t start_ns = 0;   ///< the device began it
  int64_t end_ns = 0;     ///< the device finished it
};

struct trace {
  std::vector<std::string> device_names;
  std::vector<trace_record> records;
  /// Records dropped since the last take_trace() because the ring
  /// (runtime_options::trace_max_records) was full: the oldest go first.
  uint64_t dropped_records = 0;
  /// Chrome trace JSON (chrome://tracing, Perfetto): a process per device, a
  /// thread per lane, a complete event ("X") per record.
  std::string to_chrome_json() const;
  /// Busy fraction of each (device, lane) over [first start, last end].
  double utilisation(int device) const;
};

/// The front door: owns the actor system, the devices and their actors.
class runtime {
 public:
  /// Creates devices from `device_spec` (see gpu::make_devices for the
  /// grammar: "sim:4", "cpu:2", "sim:2,cpu:1", "cuda:all") and starts the actors.
  static expected<std::unique_ptr<runtime>> create(const std::string& device_spec,
                                                   runtime_options options = {});
  /// Cancels nothing: first refuses new jobs (a submit from then on, e.g.
  /// from a continuation, fails at once with errc::shutting_down), then waits
  /// for the jobs in flight, then stops every actor. Must not run inside a
  /// continuation of one of its own jobs.
  ~runtime();
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  const std::vector<device_spec>& devices() const noexcept;

  /// Plans `g` over this runtime's devices and uploads its weights to every
  /// device that needs them (blocks for the upload). The plan stays loaded
  /// while any copy of the returned pointer lives.
  expected<std::shared_ptr<const plan>> compile(std::shared_ptr<const graph> g, plan_options options = {});
  expected<std::shared_ptr<const plan>> compile(graph g, plan_options options = {});

  /// Submits one job; returns at once. Wrong input count, dtype or shape,
  /// a plan of another runtime or a stopped runtime give a failed job whose
  /// error says which input and what was expected; the runtime keeps serving.
  /// A runtime being destroyed fails the job at once with errc::shutting_down.
  job submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs);
  /// The same, with per-job options (a deadline).
  job submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs, const submit_options& options);
  /// Submits several jobs of one plan together (micro-batches).
  std::vector<job> submit_batch(const std::shared_ptr<const plan>& p,
                                std::vector<std::vector<host_tensor>> inputs);

  /// Where input `index` of plan `p` is best built before submit()
  /// (host_tensor::uninitialized(type, dims, memory)): the memory the
  /// device that copies it in reads directly (CUDA's pinned pool: one DMA,
  /// no copy through staging, and the copy may be part of a replayed graph)
  /// or, for a computing host device, the process's cache of buffers on huge
  /// pages (no page faults for a fresh buffer: about 0.5 ms a MiB). Buffers
  /// go back to their pool when the last host_tensor holding them is gone.
  /// Null: the heap is as good (a sim device that computes no values, an
  /// input a window takes or nothing reads, an index out of range, a plan
  /// of another runtime). Any thread; the plan must stay alive meanwhile.
  host_memory_resource* input_memory(const std::shared_ptr<const plan>& p, std::size_t index) const;

  /// Jobs submitted and not yet ready.
  int64_t jobs_in_flight() const noexcept;
  /// Blocks until no job is in flight. Inside a continuation it returns at
  /// once (the job running it is still in flight: it would wait for itself).
  void wait_idle();
  /// Returns and clears the trace records gathered so far (jobs that are ready).
  trace take_trace();
  /// Graph replay counters since the runtime started (thread-safe; the
  /// executing actors add to them as they launch).
  replay_stats replay_statistics() const;

  /// Takes device `index` out of quarantine (a stalled step, see
  /// runtime_options::stall_factor) or revives it after it died, so that
  /// new jobs may use it again. The device's pending work is abandoned: it
  /// does not run, and jobs still waiting on it (all of them already failed
  /// when the stall or death was reported) only release their memory. A sim
  /// or cpu device comes back alive with its memory and loaded plans intact
  /// (a die_after_ops fault is spent). A CUDA device that died of a sticky
  /// error cannot come back in this process: the call returns
  /// errc::device_failed saying so and the device stays dead (the process
  /// and the other devices carry on). Resetting a healthy device does
  /// nothing. Blocks until the device's actor and the job registry agree
  /// (microseconds), then jobs submitted afterwards may use the device.
  /// Errors: an index out of range (errc::invalid_argument), a call inside a
  /// continuation (errc::invalid_argument: it would block a runtime thread),
  /// a runtime being destroyed (errc::shutting_down).
  error reset_device(int index);
  /// Whether device `index` takes jobs: false while quarantined or dead
  /// (out of range: false). Non-blocking; a stall or death being reported
  /// right now may not show yet.
  bool device_in_service(int index) const;

  /// Advanced: the device objects (e.g. to inject faults into a sim device in tests).
  gpu::device_ptr device(int index) const;

  struct impl;

 private:
  explicit runtime(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Developer diagnostics, process-wide. In a library configured with
/// -DACTORGRAPH_HOP_PROBES=ON: a table of the median host time (us after
/// submit was entered) at which the jobs since the last call passed each
/// hand-over (context made, arenas taken, run_job sent, graph launched,
/// notification registered, handle fulfilled...), over the jobs that passed
/// them all (a tiny job's path); the table is then cleared. Otherwise an
/// empty string. Any thread, once those jobs are ready.
std::string hop_probe_report();

}  // namespace ag
