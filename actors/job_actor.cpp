#include "actors/job_actor.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>

#include <caf/all.hpp>

#include "actors/hop_probe.hpp"
#include "actors/runtime_core.hpp"
#include "messages/atoms.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

namespace {

enum class phase : uint8_t { acquiring, withdrawing, running, cancelling, finished };

struct job_actor_state {
  runtime_core* core = nullptr;
  std::shared_ptr<job::shared_state> ss;
  std::shared_ptr<job_context> ctx;
  phase ph = phase::acquiring;
  std::size_t acq = 0;     // position in used_devices being acquired
  std::size_t remaining = 0;
  std::size_t acks = 0;
  bool asked = false;      // an acquire for used_devices[acq] is outstanding
  bool waiting_slot = false;  // queued for its state slot's turn (slot_table): no acquire yet
  error err;

  static constexpr const char* name = "ag.job";
};

using job_actor_t = caf::stateful_actor<job_actor_state>;

void release_arenas(job_actor_t* self) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  for (std::size_t d = 0; d < ctx.arenas.size(); ++d) {
    if (ctx.arenas[d] < 0) continue;
    self->send(st.core->device_actor(static_cast<int>(d)), msg::release_arena{ctx.lp->key, ctx.arenas[d]});
    ctx.arenas[d] = -1;
  }
}

void finish(job_actor_t* self, job_result r, job_state final_state) {
  auto& st = self->state;
  st.ph = phase::finished;
  release_arenas(self);
  st.ctx->release_state_slot();  // before the handle: a continuation may submit the slot's next job
  st.core->jobs().remove(st.ctx->id());
  auto ss = std::move(st.ss);
  auto* core = st.core;
  st.ctx.reset();
  self->quit();
  ss->fulfil(std::move(r), final_state, [core] { core->job_ready(); });
  // The last touch of the runtime: once no job actor is alive, the runtime
  // may be destroyed (its actor system then waits for this actor to quit).
  core->job_gone();
}

void fail_now(job_actor_t* self) {
  auto& st = self->state;
  const job_state s = st.err.code == errc::cancelled ? job_state::cancelled : job_state::failed;
  error e = st.err;
  finish(self, std::move(e), s);
}

void begin_fail(job_actor_t* self, error e) {
  auto& st = self->state;
  switch (st.ph) {
    case phase::acquiring: {
      st.err = std::move(e);
      const auto& used = st.ctx->program().used_devices();
      if (st.asked && st.acq < used.size()) {
        // Our request is queued or its answer is on the way: wait for it.
        st.ph = phase::withdrawing;
        self->send(st.core->device_actor(used[st.acq]), msg::withdraw_arena{st.ctx->lp->key, st.ctx->id()});
        return;
      }
      return fail_now(self);
    }
    case phase::running: {
      st.err = std::move(e);
      st.ph = phase::cancelling;
      st.ctx->cancelled.store(true, std::memory_order_release);
      const auto& actors = st.ctx->queue_actors();
      st.acks = actors.size();
      msg::job_ref_ptr ref = st.ctx;
      for (const auto& a : actors) self->send(a, msg::cancel_job{ref});
      if (st.acks == 0) return fail_now(self);
      // A deadline must not wait for the work already on a device (a stalled
      // device may hold it for long): the handle gets the timeout now; the
      // arenas are released once the queues acknowledge, as for any failure.
      if (st.err.code == errc::timeout) {
        auto* core = st.core;
        st.ss->fulfil(st.err, job_state::failed, [core] { core->job_ready(); });
      }
      return;
    }
    default:
      return;  // the first error wins
  }
}

void collect_trace(const job_context& ctx) {
  const auto& prog = ctx.program();
  std::vector<trace_record> recs;
  recs.reserve(prog.steps().size());
  for (std::size_t s = 0; s < prog.steps().size(); ++s) {
    const auto& slot = ctx.slots[s];
    if (!slot.start || !slot.end) continue;
    const lowered_step& ls = prog.steps()[s];
    const launch_queue& q = prog.queues()[static_cast<std::size_t>(ls.queue)];
    trace_record r;
    r.job = ctx.id();
    r.device = q.device;
    r.lane = lane_name(q.kind, ctx.lane_of(ls.queue));
    r.step = static_cast<step_id>(s);
    r.label = ls.label;
    if (slot.replay != replay_outcome::none)
      r.label += " [graph replay: " + std::string(to_string(slot.replay)) + ", " + std::to_string(ls.replay_steps) +
                 " steps, " + std::to_string(ls.replay_kernels) + " kernels" +
                 (ls.replay_lanes > 1 ? ", " + std::to_string(ls.replay_lanes) + " lanes" : std::string()) + "]";
    r.enqueue_ns = slot.enqueue_ns;
    r.start_ns = slot.start->completion_ns();
    r.end_ns = slot.end->completion_ns();
    recs.push_back(std::move(r));
  }
  ctx.core->traces().push(std::move(recs));
}

/// Outputs copied into the arenas' host windows (copy_desc::window_offset)
/// go to the job's output buffers; non-contiguous view outputs: pick the
/// view's elements out of the copied storage.
void gather_outputs(const job_context& ctx) {
  const launch_program& prog = ctx.program();
  for (step_id s : prog.window_outputs()) {
    const lowered_step& ls = prog.steps()[static_cast<std::size_t>(s)];
    std::memcpy(ctx.outputs[static_cast<std::size_t>(ls.copy.io_index)].data() + ls.copy.host_offset, ctx.window_of(ls),
                static_cast<std::size_t>(ls.copy.bytes));
  }
  const graph& g = ctx.lp->source().source();
  for (std::size_t i = 0; i < ctx.staging.size(); ++i) {
    const auto& src = ctx.staging[i];
    if (src.bytes() == 0) continue;
    auto& out = ctx.outputs[i];
    const node& n = g.at(g.outputs()[i]);
    const std::size_t es = dtype_size(n.type);
    const int rank = n.dims.rank();
    std::array<int64_t, max_rank> idx{};
    const int64_t total = n.dims.numel();
    for (int64_t flat = 0; flat < total; ++flat) {
      int64_t off = n.offset;
      for (int k = 0; k < rank; ++k) off += idx[static_cast<std::size_t>(k)] * n.stride[static_cast<std::size_t>(k)];
      std::memcpy(out.data() + flat * static_cast<int64_t>(es), src.data() + off * static_cast<int64_t>(es), es);
      for (int k = rank - 1; k >= 0; --k) {
        if (++idx[static_cast<std::size_t>(k)] < n.dims[k]) break;
        idx[static_cast<std::size_t>(k)] = 0;
      }
    }
  }
}

/// The job's per-step slots and output buffers (and the storage copies of
/// non-contiguous outputs). Throws when host memory runs out.
void allocate_job_buffers(job_context& ctx) {
  const auto& lp = *ctx.lp;
  const auto& prog = *lp.program;
  const graph& g = prog.source().source();
  ctx.slots.resize(prog.steps().size());
  AG_HOP_PROBE(slots_sized, ctx.id());
  ctx.outputs.reserve(g.outputs().size());
  // Every output is written in full (by its d2h copy, or by the gather from
  // its storage's copy), so no zero-fill: on a fresh buffer that pass alone
  // cost about 0.5 ms per MiB of page faults.
  for (std::size_t k = 0; k < g.outputs().size(); ++k) {
    const node& o = g.at(g.outputs()[k]);
    ctx.outputs.push_back(host_tensor::uninitialized(o.type, o.dims, lp.output_memory[k]));
  }
  AG_HOP_PROBE(outputs_made, ctx.id());
  ctx.staging.resize(g.outputs().size());
  for (step_id s : prog.completion_steps()) {
    const lowered_step& ls = prog.steps()[static_cast<std::size_t>(s)];
    if (ls.kind != step_kind::copy_d2h || !ls.copy.gather) continue;
    const auto io = static_cast<std::size_t>(ls.copy.io_index);
    const node& sn = g.at(g.at(g.outputs()[io]).storage);
    ctx.staging[io] = host_tensor::uninitialized(sn.type, sn.dims, lp.output_memory[io]);
  }
}

/// The job's first device's arena `arena` decides its job lane (prepare_run):
/// its other devices' arena requests prefer that lane from now on.
void prefer_lane_of_first_arena(job_context& ctx, int arena) {
  if (ctx.expected_lane < 0) return;  // one lane
  ctx.expected_lane = ctx.lp->memory[static_cast<std::size_t>(ctx.lp->program->used_devices().front())]->lane_of(arena);
}

/// Readies `ctx` to run once it holds every arena and its buffers (its
/// collective order, the completion count); returns how many completion
/// steps it waits for. On the job actor, or on the submitting thread
/// (take_arenas_now) before the job is registered.
std::size_t prepare_run(job_context& ctx) {
  const auto& lp = *ctx.lp;
  const auto& prog = *lp.program;
  // The job's turns in the agreed issue order (collective_order.hpp): drawn
  // now that it holds every arena, so a job never waits for one drawn after
  // it (and after anything that may throw: a turn drawn by a job that never
  // runs would stall the jobs after it on its lines). Its job lane is its
  // first device's arena's (plan_memory::lane_of), so that an arena always
  // meets the same lane's captured graphs.
  const auto& used = prog.used_devices();
  const auto first = used.empty() ? std::size_t{0} : static_cast<std::size_t>(used.front());
  const int lane = used.empty() ? 0 : std::max(0, lp.memory[first]->lane_of(ctx.arenas[first]));  // -1: one lane
  ctx.job_lane = lane;
  if (!lp.order_lines.empty()) {
    ctx.collective_seq = lp.core->issue_order().draw(lp.order_lines[static_cast<std::size_t>(lane)], ctx.turns);
    ctx.generations.resize(lp.memory.size());
    for (std::size_t d = 0; d < lp.memory.size(); ++d)
      ctx.generations[d] = lp.memory[d] ? lp.memory[d]->dev->generation() : 0;
  }
  // Inputs whose copies replay inside graphs go to the arenas' host windows.
  for (step_id s : prog.window_inputs()) {
    const lowered_step& ls = prog.steps()[static_cast<std::size_t>(s)];
    std::memcpy(ctx.window_of(ls),
                ctx.inputs[static_cast<std::size_t>(ls.copy.io_index)].data(), static_cast<std::size_t>(ls.copy.bytes));
  }
  const std::size_t remaining = prog.completion_steps().size();
  ctx.completions_left.store(static_cast<int>(remaining), std::memory_order_relaxed);
  ctx.handle->mark_started(gpu::host_clock_ns());
  return remaining;
}

/// Sends run_job to the actor of every queue that starts the job
/// (launch_queue::starts_itself). The queues that start the job start on
/// different scheduler threads. self->send puts an idle receiver on this
/// thread's own queue, which runs the last one first and then its whole
/// chain of ready messages (depth first) before the next: on 2 GPUs GPU 0's
/// first upload was enqueued 230-550 us after GPU 1's in every job, and GPU
/// 1 then waited at the first all-reduce. anon_send schedules the receiver
/// through the coordinator, which hands it to another thread (round robin,
/// waking it). From the job actor (`self`) the last starting queue stays on
/// this thread; from a submitting thread (no self) every one is anon_send.
void send_run_jobs(const job_context& ctx, job_actor_t* self) {
  const auto& queues = ctx.program().queues();
  const auto& actors = ctx.queue_actors();
  msg::job_ref_ptr ref = ctx.shared_from_this();
  std::size_t last = queues.size();
  for (std::size_t q = 0; q < queues.size(); ++q)
    if (queues[q].starts_itself) last = q;
  for (std::size_t q = 0; q < queues.size(); ++q) {
    if (!queues[q].starts_itself) continue;
    if (self && q == last) self->send(actors[q], msg::run_job{ref, static_cast<int>(q)});
    else caf::anon_send(actors[q], msg::run_job{ref, static_cast<int>(q)});
  }
}

void start_run(job_actor_t* self) {
  auto& st = self->state;
  allocate_job_buffers(*st.ctx);
  st.remaining = prepare_run(*st.ctx);
  st.ph = phase::running;
  send_run_jobs(*st.ctx, self);
  if (st.remaining == 0) finish(self, std::move(st.ctx->outputs), job_state::done);
}

/// A job readied by take_arenas_now (every arena, its buffers, its place in
/// the collective order) waits for its completion steps from now on.
void enter_running_readied(job_actor_state& st) {
  st.ph = phase::running;
  st.remaining = st.ctx->program().completion_steps().size();
}

void acquire_next(job_actor_t* self) {
  auto& st = self->state;
  const auto& lp = *st.ctx->lp;
  const auto& used = lp.program->used_devices();
  if (st.acq >= used.size()) return start_run(self);
  st.asked = true;
  lp.memory[static_cast<std::size_t>(used[st.acq])]->note_request();
  self->send(st.core->device_actor(used[st.acq]),
             msg::acquire_arena{lp.key, st.ctx->id(), caf::actor_cast<caf::actor>(self), st.ctx->expected_lane});
}

caf::behavior job_actor_fn(job_actor_t* self, runtime_core* core, std::shared_ptr<job::shared_state> ss,
                           std::shared_ptr<job_context> ctx) {
  auto& st = self->state;
  st.core = core;
  st.ss = std::move(ss);
  st.ctx = std::move(ctx);
  const job_start start = st.ctx->start;
  bool cancel_requested = false;
  {
    std::lock_guard<std::mutex> lk(st.ss->m);
    cancel_requested = st.ss->cancel_requested;
  }
  switch (start) {
    case job_start::asked:  // runtime_core::submit asked the first device (in submission order)
      st.asked = true;
      break;
    case job_start::waiting_slot:  // msg::slot_atom says when its state slot's turn comes
      st.waiting_slot = true;
      break;
    case job_start::failing:  // a fail_job is on its way
      break;
    case job_start::running:  // take_arenas_now readied it; submit sends run_job (unless it failed to register)
      enter_running_readied(st);
      break;
    case job_start::no_devices:
      break;
  }
  if (cancel_requested)
    begin_fail(self, {errc::cancelled, "job " + std::to_string(st.ctx->id()) + " cancelled"});
  else if (start == job_start::no_devices)
    acquire_next(self);  // nothing to acquire: runs at once
  return {
      [self](msg::slot_atom) {
        // The state slot's earlier jobs are done: this job's turn. (A job
        // that failed while it waited left the queue and quit.) With every
        // arena free and nobody asking, it takes them here, as submit does,
        // instead of asking device by device (a request and a reply per
        // device: the hops a pipelined decode step's turn used to pay).
        auto& st = self->state;
        if (st.ph != phase::acquiring || !st.waiting_slot) return;
        st.waiting_slot = false;
        if (st.core->options().start_jobs_on_submit && take_arenas_now(*st.ctx)) {
          enter_running_readied(st);
          send_run_jobs(*st.ctx, self);
          return;
        }
        acquire_next(self);
      },
      [self](const msg::arena_reply& m) {
        auto& st = self->state;
        st.asked = false;
        if (st.ph == phase::acquiring) {
          if (m.err) return begin_fail(self, m.err);
          st.ctx->arenas[static_cast<std::size_t>(m.device)] = m.arena;
          if (st.acq == 0) prefer_lane_of_first_arena(*st.ctx, m.arena);
          ++st.acq;
          return acquire_next(self);
        }
        if (m.arena >= 0) {
          st.ctx->arenas[static_cast<std::size_t>(m.device)] = m.arena;  // released by finish()
        }
        if (st.ph == phase::withdrawing) fail_now(self);
      },
      [self](const msg::step_done& m) {
        auto& st = self->state;
        if (st.ph != phase::running) return;
        if (m.err) {
          // The device reported the failure asynchronously: name the step's
          // device, queue and tensor/op as the executing actor would have.
          const auto& prog = st.ctx->program();
          const lowered_step& ls = prog.steps()[static_cast<std::size_t>(m.step)];
          const launch_queue& q = prog.queues()[static_cast<std::size_t>(ls.queue)];
          std::string where = "device '" + st.core->specs()[static_cast<std::size_t>(q.device)].name + "' step " +
                              std::to_string(m.step) + " (" + lane_name(q.kind, q.lane);
          if (!ls.label.empty()) where += ", " + ls.label;
          where += ")";
          // An error that concerns another device (one that died upstream of
          // this step) leads with that device's own message, so the failure
          // names the device at fault first, whichever step saw it.
          const bool elsewhere = m.err.device >= 0 && m.err.device != q.device;
          std::string text = elsewhere ? m.err.message + " (seen by " + where + ")" : where + ": " + m.err.message;
          std::string op = !m.err.op.empty() ? m.err.op : ls.subject ? ls.subject->name : std::string{};
          return begin_fail(self, {m.err.code, std::move(text), m.err.device >= 0 ? m.err.device : q.device, m.step,
                                   std::move(op)});
        }
        if (--st.remaining == 0) {
          // complete_from_backend() ran before this message was sent and
          // fulfilled the handle; finish() then only releases memory.
          if (st.ctx->fulfilled_early.load(std::memory_order_acquire))
            return finish(self, error{errc::internal, "already fulfilled"}, job_state::done);
          if (st.ctx->timing) collect_trace(*st.ctx);
          gather_outputs(*st.ctx);
          auto outputs = std::move(st.ctx->outputs);
          finish(self, std::move(outputs), job_state::done);
        }
      },
      [self](const msg::step_failed& m) { begin_fail(self, m.err); },
      [self](const msg::fail_job& m) { begin_fail(self, m.err); },
      [self](msg::cancel_atom) {
        begin_fail(self, {errc::cancelled, "job " + std::to_string(self->state.ctx ? self->state.ctx->id() : 0) +
                                               " cancelled"});
      },
      [self](const msg::cancel_ack& m) {
        auto& st = self->state;
        if (st.ph != phase::cancelling) return;
        if (--st.acks == 0) fail_now(self);
      },
  };
}

}  // namespace

void complete_from_backend(const job_context& ctx) noexcept {
  if (ctx.completions_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Cancelling or failing: the job actor settles the job (first result wins anyway).
  if (ctx.cancelled.load(std::memory_order_acquire)) return;
  try {
    if (ctx.timing) collect_trace(ctx);
    gather_outputs(ctx);
    auto* core = ctx.core;
    ctx.release_state_slot();  // every step of the job is done
    ctx.handle->fulfil(std::move(ctx.outputs), job_state::done, [core] { core->job_ready(); });
    ctx.fulfilled_early.store(true, std::memory_order_release);
  } catch (...) {
    // out of memory while gathering: leave it to the job actor's slow path
  }
}

error dead_device_error(const job_context& ctx) {
  for (int d : ctx.program().used_devices()) {
    auto& dev = *ctx.lp->memory[static_cast<std::size_t>(d)]->dev;
    if (dev.alive()) continue;
    // A dead device refuses everything with its own death error (its reason,
    // error::device set): an empty download asks for it and, on a live
    // device, does nothing.
    error e = dev.download(nullptr, nullptr, 0);
    if (!e) e = error{errc::device_failed, "device died while the job ran", d};
    e.code = errc::device_failed;
    if (e.device < 0) e.device = d;
    return e;
  }
  return {};
}

error in_stream_fault(const job_context& ctx) {
  if (!ctx.program().has_in_stream_parts()) return {};
  for (int d : ctx.program().used_devices())
    if (error e = ctx.lp->memory[static_cast<std::size_t>(d)]->dev->collective_fault(ctx.id())) {
      // Where every member was, so the report names who never arrived.
      for (int m : ctx.program().used_devices())
        if (std::string p = ctx.lp->memory[static_cast<std::size_t>(m)]->dev->collective_progress(); !p.empty())
          e.message += "; " + p;
      return e;
    }
  return {};
}

std::shared_ptr<job_context> make_job_context(runtime_core* core, const std::shared_ptr<job::shared_state>& ss,
                                              std::shared_ptr<const loaded_plan> lp,
                                              std::shared_ptr<const plan> user_plan, std::vector<host_tensor> inputs,
                                              int state_slot) {
  auto ctx = std::make_shared<job_context>(ss->id);
  ctx->lp = std::move(lp);
  ctx->expected_lane = ctx->lp->draw_expected_lane();
  ctx->user_plan = std::move(user_plan);
  ctx->arenas.assign(core->devices().size(), -1);
  ctx->inputs = std::move(inputs);
  for (std::size_t k = 0; k < ctx->inputs.size(); ++k) {
    // A small input goes to its device's pinned host memory here, so the
    // device copies it without staging (runtime_options::pinned_inputs_max_bytes).
    host_memory_resource* pinned = ctx->lp->input_memory[k];
    host_tensor& in = ctx->inputs[k];
    if (!pinned || in.memory() == pinned) continue;
    auto copy = host_tensor::create_uninitialized(in.type(), in.dims(), pinned);
    if (!copy || copy->bytes() != in.bytes()) continue;  // no pinned memory: the device stages it
    std::memcpy(copy->data(), in.data(), in.bytes());
    in = std::move(*copy);
  }
  ctx->state_slot = state_slot;
  ctx->in_slot_table.store(state_slot >= 0);  // runtime_core::submit entered it
  ctx->timing = core->options().trace;
  ctx->core = core;
  ctx->handle = ss;
  return ctx;
}

caf::actor spawn_job_actor(caf::actor_system& sys, runtime_core* core, std::shared_ptr<job::shared_state> ss,
                           std::shared_ptr<job_context> ctx) {
  // lazy_init: the actor starts on its first message (the first arena_reply,
  // a step_done, or cancel), which saves the scheduler a run of its own per
  // job. A plan without devices gets no message: that job actor starts at once.
  if (ctx->start == job_start::no_devices) return sys.spawn(job_actor_fn, core, std::move(ss), std::move(ctx));
  return sys.spawn<caf::lazy_init>(job_actor_fn, core, std::move(ss), std::move(ctx));
}

struct job_binding {
  std::shared_ptr<job::shared_state> ss;  // both set once, by bind_spare_job_actor, before any message
  std::shared_ptr<job_context> ctx;
};

namespace {
caf::behavior spare_job_actor_fn(job_actor_t* self, runtime_core* core, std::shared_ptr<job_binding> b) {
  // Runs on the first message. The sender bound the job before sending (the
  // mailbox orders the binding's writes before this read).
  if (!b->ctx) {
    self->quit();  // dismissed unbound (runtime_core::shutdown)
    return {};
  }
  auto ss = std::move(b->ss);
  auto ctx = std::move(b->ctx);
  return job_actor_fn(self, core, std::move(ss), std::move(ctx));
}
}  // namespace

spare_job_actor spawn_spare_job_actor(caf::actor_system& sys, runtime_core* core) {
  auto b = std::make_shared<job_binding>();
  caf::actor a = sys.spawn<caf::lazy_init>(spare_job_actor_fn, core, b);
  return {std::move(a), std::move(b)};
}

caf::actor bind_spare_job_actor(spare_job_actor spare, std::shared_ptr<job::shared_state> ss,
                                std::shared_ptr<job_context> ctx) {
  spare.binding->ss = std::move(ss);
  spare.binding->ctx = std::move(ctx);
  return std::move(spare.actor);
}

bool take_arenas_now(job_context& ctx) {
  const auto& lp = *ctx.lp;
  const auto& used = lp.program->used_devices();
  if (used.empty() || lp.program->completion_steps().empty()) return false;
  std::size_t taken = 0;
  for (; taken < used.size(); ++taken) {
    const int d = used[taken];
    const int a = lp.memory[static_cast<std::size_t>(d)]->try_take_arena(ctx.expected_lane);
    if (a < 0) break;
    ctx.arenas[static_cast<std::size_t>(d)] = a;
    if (taken == 0) prefer_lane_of_first_arena(ctx, a);
  }
  // Gives back what was taken (through the device actors, which hand an
  // arena to a request that waits first); the job then asks as usual.
  auto give_back = [&] {
    for (std::size_t k = 0; k < taken; ++k) {
      const auto d = static_cast<std::size_t>(used[k]);
      caf::anon_send(ctx.core->device_actor(used[k]), msg::release_arena{lp.key, ctx.arenas[d]});
      ctx.arenas[d] = -1;
    }
    return false;
  };
  if (taken < used.size()) return give_back();
  AG_HOP_PROBE(arenas_taken, ctx.id());
  try {
    allocate_job_buffers(ctx);
    AG_HOP_PROBE(buffers_ready, ctx.id());
  } catch (...) {
    // submit() must not throw: the job actor tries again, and fails the job
    // if its host memory is still short.
    ctx.outputs.clear();
    ctx.staging.clear();
    return give_back();
  }
  prepare_run(ctx);
  AG_HOP_PROBE(prepared, ctx.id());
  ctx.start = job_start::running;
  return true;
}

void start_from_submit(const job_context& ctx) { send_run_jobs(ctx, nullptr); }

const char* to_string(replay_outcome o) noexcept {
  switch (o) {
    case replay_outcome::none: return "none";
    case replay_outcome::plain: return "plain";
    case replay_outcome::captured: return "captured";
    case replay_outcome::replayed: return "replayed";
    case replay_outcome::fallback: return "fallback";
  }
  return "?";
}

}  // namespace ag::actors
