#include "actors/stream_actor.hpp"

#include <algorithm>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/job_actor.hpp"
#include "messages/atoms.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

namespace {

/// One job as seen by one executing actor.
struct exec_job {
  msg::job_ctx_ptr ctx;
  int actor = -1;
  int next = 0;                 // position of the next step to launch
  std::vector<int> waiting;     // remote deps not yet ready, by position
  // No run_job is still to come: it arrived, or this actor gets none (its
  // first step waits for a remote dep, so a ready message starts it).
  bool got_run = false;
  bool launched = false;
};

struct exec_state {
  gpu::device_ptr dev;
  int device = -1;
  exec_kind kind = exec_kind::compute;
  int lane = 0;
  std::unique_ptr<gpu::stream> stream;
  std::unordered_map<uint64_t, exec_job> jobs;
  // Event pools (timing and plain). An event is reused only when the pool
  // holds its last reference (no job context names it) and it completed.
  std::vector<std::shared_ptr<gpu::event>> pool[2];
  std::size_t cursor[2] = {0, 0};
  std::vector<std::vector<step_id>> out;     // ready batch per consumer actor
  std::vector<int> touched;

  static constexpr const char* name = "ag.exec";
};

using exec_actor_t = caf::stateful_actor<exec_state>;

std::shared_ptr<gpu::event> take_event(exec_state& st, bool timing) {
  auto& pool = st.pool[timing ? 1 : 0];
  auto& cur = st.cursor[timing ? 1 : 0];
  const std::size_t n = pool.size();
  for (std::size_t i = 0; i < n && i < 8; ++i) {
    const std::size_t idx = (cur + i) % n;
    auto& e = pool[idx];
    if (e.use_count() == 1 && e->query()) {
      cur = idx + 1;
      return e;
    }
  }
  pool.push_back(std::shared_ptr<gpu::event>(st.dev->create_event(timing)));
  return pool.back();
}

std::string describe_step(const exec_state& st, const job_context& ctx, step_id s) {
  std::string r = "device '" + st.dev->spec().name + "' step " + std::to_string(s) + " (" +
                  lane_name(st.kind, st.lane);
  const auto& label = ctx.lp->steps[static_cast<std::size_t>(s)].label;
  if (!label.empty()) r += ", " + label;
  r += ")";
  return r;
}

/// Enqueues step `s` on the actor's stream. Returns an error naming device,
/// step and op when the device refuses it.
error launch_step(exec_state& st, const job_context& ctx, step_id s) {
  const auto& lp = *ctx.lp;
  const auto& si = lp.steps[static_cast<std::size_t>(s)];
  const step& sp = lp.p->at(s);
  auto& slot = ctx.slots[static_cast<std::size_t>(s)];
  if (ctx.timing) slot.enqueue_ns = gpu::host_clock_ns();
  for (step_id d : si.remote_dep_ids) {
    const auto& ev = ctx.slots[static_cast<std::size_t>(d)].end;
    if (ev) st.dev->wait(*st.stream, *ev);
  }
  if (ctx.timing) {
    slot.start = take_event(st, true);
    st.dev->record(*slot.start, *st.stream);
  }
  error err;
  switch (sp.kind) {
    case step_kind::compute: {
      // Region bases of this job on this device, by region (weights, arena).
      const bool has_arena = ctx.arenas[static_cast<std::size_t>(st.device)] >= 0;
      std::byte* const base[2] = {ctx.base(region::weights, st.device),
                                  has_arena ? ctx.base(region::arena, st.device) : nullptr};
      const auto at = [&base](const prepared_arg& a) {
        return static_cast<void*>(base[a.where == region::weights ? 0 : 1] + a.byte_offset);
      };
      for (std::size_t k = 0; k < si.ops.size(); ++k) {
        const auto& op = si.ops[k];
        auto& l = si.launches[k];
        l.out.data = at(op.out);
        for (std::size_t i = 0; i < op.inputs.size(); ++i) l.inputs[i].data = at(op.inputs[i]);
        err = st.dev->launch(*st.stream, l);
        if (err) {
          return {err.code, describe_step(st, ctx, s) + " op '" + op.op->name + "' (" + to_string(op.op->op) +
                                "): " + err.message};
        }
      }
      break;
    }
    case step_kind::copy_h2d: {
      void* dst = ctx.base(si.dst.where, st.device) + si.dst.byte_offset;
      err = st.dev->copy_h2d(*st.stream, dst, ctx.inputs[static_cast<std::size_t>(sp.io_index)].data(), si.bytes);
      break;
    }
    case step_kind::copy_d2h: {
      const void* src = ctx.base(si.src.where, st.device) + si.src.byte_offset;
      auto& host = si.gather ? ctx.staging[static_cast<std::size_t>(sp.io_index)]
                             : ctx.outputs[static_cast<std::size_t>(sp.io_index)];
      err = st.dev->copy_d2h(*st.stream, host.data(), src, si.bytes);
      break;
    }
    case step_kind::copy_peer: {
      void* dst = ctx.base(si.dst.where, st.device) + si.dst.byte_offset;
      const void* src = ctx.base(si.src.where, sp.src_device) + si.src.byte_offset;
      auto& src_dev = *lp.mem[static_cast<std::size_t>(sp.src_device)]->dev;
      err = st.dev->copy_peer(*st.stream, dst, src_dev, src, si.bytes);
      break;
    }
    case step_kind::collective:  // runtime_core::compile refuses such plans for now
      err = {errc::unsupported_op, "collective steps are not executed yet"};
      break;
  }
  if (err) return {err.code, describe_step(st, ctx, s) + ": " + err.message};
  slot.end = take_event(st, ctx.timing);
  st.dev->record(*slot.end, *st.stream);
  if (si.completion) {
    // `keep` holds the job context until the callback ran (it may outlive the
    // job actor's interest in it only by this callback).
    st.dev->notify(*st.stream, [keep = ctx.shared_from_this(), s](const error& e) {
      if (!e) complete_from_backend(*keep);
      caf::anon_send(keep->job_actor, msg::step_done{keep->id, s, e});
    });
  }
  for (int a : si.consumer_actors) {
    auto& v = st.out[static_cast<std::size_t>(a)];
    if (v.empty()) st.touched.push_back(a);
    v.push_back(s);
  }
  return {};
}

exec_job& entry_for(exec_state& st, const msg::job_ctx_ptr& ctx, int actor) {
  auto [it, fresh] = st.jobs.try_emplace(ctx->id);
  auto& e = it->second;
  if (fresh) {
    e.ctx = ctx;
    e.actor = actor;
    const auto& mine = ctx->lp->actors[static_cast<std::size_t>(actor)].steps;
    e.waiting.resize(mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i)
      e.waiting[i] = ctx->lp->steps[static_cast<std::size_t>(mine[i])].remote_deps;
    e.got_run = !needs_run_job(*ctx->lp, actor);
  }
  return e;
}

/// Launches every step of `e` whose remote deps all arrived, in order; then
/// sends the batched ready messages.
void advance(exec_actor_t* self, exec_job& e) {
  auto& st = self->state;
  const auto ctx = e.ctx;  // keeps the context alive past an erase
  const auto& lp = *ctx->lp;
  const auto& mine = lp.actors[static_cast<std::size_t>(e.actor)].steps;
  if (st.out.size() < lp.actors.size()) st.out.resize(lp.actors.size());
  bool drop = false;
  while (e.next < static_cast<int>(mine.size()) && e.waiting[static_cast<std::size_t>(e.next)] == 0) {
    if (ctx->cancelled.load(std::memory_order_acquire)) {
      drop = true;
      break;
    }
    const step_id s = mine[static_cast<std::size_t>(e.next)];
    error err = launch_step(st, *ctx, s);
    e.launched = true;
    if (err) {
      self->send(ctx->job_actor, msg::step_failed{ctx->id, s, std::move(err)});
      drop = true;
      break;
    }
    ++e.next;
  }
  // Steps already launched (even before a failure) are announced: their
  // consumers may be needed for nothing, but nobody waits on a lost ready.
  for (int a : st.touched) {
    auto& v = st.out[static_cast<std::size_t>(a)];
    const auto& to = lp.actors[static_cast<std::size_t>(a)].handle;
    for (std::size_t i = 0; i < v.size(); i += msg::ready::max_steps) {
      msg::ready r{ctx, a};
      r.count = static_cast<int>(std::min<std::size_t>(msg::ready::max_steps, v.size() - i));
      std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(i), r.count, r.steps.begin());
      self->send(to, std::move(r));
    }
    v.clear();  // keeps its capacity: no allocation on the next batch
  }
  st.touched.clear();
  if (drop || (e.got_run && e.next == static_cast<int>(mine.size()))) st.jobs.erase(ctx->id);
}

caf::behavior exec_actor_fn(exec_actor_t* self, gpu::device_ptr dev, exec_kind kind, int lane) {
  auto& st = self->state;
  st.dev = std::move(dev);
  st.device = st.dev->index();
  st.kind = kind;
  st.lane = lane;
  const gpu::stream_role role = kind == exec_kind::compute ? gpu::stream_role::compute
                                : kind == exec_kind::h2d   ? gpu::stream_role::h2d
                                : kind == exec_kind::d2h   ? gpu::stream_role::d2h
                                                           : gpu::stream_role::peer;
  st.stream = st.dev->create_stream(role);
  return {
      [self](const msg::run_job& m) {
        try {
          if (m.ctx->cancelled.load(std::memory_order_acquire)) return;
          auto& e = entry_for(self->state, m.ctx, m.actor);
          e.got_run = true;
          advance(self, e);
        } catch (const std::exception& ex) {
          self->send(m.ctx->job_actor, msg::step_failed{m.ctx->id, -1, {errc::internal, ex.what()}});
        }
      },
      [self](const msg::ready& m) {
        try {
          if (m.ctx->cancelled.load(std::memory_order_acquire)) return;
          auto& e = entry_for(self->state, m.ctx, m.actor);
          const auto& lp = *m.ctx->lp;
          for (int k = 0; k < m.count; ++k) {
            const step_id p = m.steps[static_cast<std::size_t>(k)];
            for (step_id c : lp.p->at(p).consumers) {
              const auto& ci = lp.steps[static_cast<std::size_t>(c)];
              if (ci.actor == m.actor) --e.waiting[static_cast<std::size_t>(ci.pos)];
            }
          }
          advance(self, e);
        } catch (const std::exception& ex) {
          self->send(m.ctx->job_actor, msg::step_failed{m.ctx->id, -1, {errc::internal, ex.what()}});
        }
      },
      // Tests: the number of jobs this actor still holds state for.
      [self](msg::stats_atom) -> int64_t { return static_cast<int64_t>(self->state.jobs.size()); },
      [self](const msg::cancel_job& m) {
        auto& st = self->state;
        st.jobs.erase(m.ctx->id);
        // Launched work of this job is before this point of the stream.
        st.dev->notify(*st.stream, [who = m.ctx->job_actor, job = m.ctx->id](const error&) {
          caf::anon_send(who, msg::cancel_ack{job});
        });
      },
  };
}

}  // namespace

caf::actor spawn_exec_actor(caf::actor_system& sys, gpu::device_ptr dev, exec_kind kind, int lane) {
  return sys.spawn(exec_actor_fn, std::move(dev), kind, lane);
}

caf::actor spawn_stream_actor(caf::actor_system& sys, gpu::device_ptr dev, int lane) {
  return spawn_exec_actor(sys, std::move(dev), exec_kind::compute, lane);
}

}  // namespace ag::actors
