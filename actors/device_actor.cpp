#include "actors/device_actor.hpp"

#include <deque>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/plan_memory.hpp"
#include "messages/atoms.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

namespace {

struct arena_pool {
  std::shared_ptr<plan_memory> mem;  // its free list: plan_memory::put_free / take_for_request
  std::deque<msg::acquire_arena> queue;
};

struct device_state {
  gpu::device_ptr dev;
  int index = -1;
  int cap = 1;
  caf::actor runtime;
  // Out of service: dead (device_fault) or quarantined (device_stalled)
  // until reset_device. Acquires are refused with `death` meanwhile.
  bool dead = false;
  error death;
  int64_t last_reset_ns = -1;  // actor clock; stall reports about older steps are stale
  std::unordered_map<uint64_t, arena_pool> pools;

  static constexpr const char* name = "ag.device";
};

using device_actor_t = caf::stateful_actor<device_state>;

// Every acquire_arena gets exactly one answer; it counts as answered for the
// submit fast path (plan_memory::request_answered) once sent.
void grant(device_actor_t* self, arena_pool& pool, const msg::acquire_arena& req, int arena) {
  pool.mem->request_answered();
  self->send(req.reply_to, msg::arena_reply{req.job, self->state.index, arena, {}});
}

void refuse(device_actor_t* self, arena_pool* pool, const msg::acquire_arena& req, error e) {
  if (pool) pool->mem->request_answered();
  self->send(req.reply_to, msg::arena_reply{req.job, self->state.index, -1, std::move(e)});
}

caf::behavior device_actor_fn(device_actor_t* self, gpu::device_ptr dev, int cap, caf::actor runtime) {
  auto& st = self->state;
  st.dev = std::move(dev);
  st.index = st.dev->index();
  st.cap = cap < 1 ? 1 : cap;
  st.runtime = std::move(runtime);
  return {
      [self](const msg::register_plan& m) {
        // Every plan_memory_ref of this process is a plan_memory (runtime_core::compile).
        auto mem = std::static_pointer_cast<plan_memory>(m.memory);
        auto& pool = self->state.pools[mem->plan_key()];
        // compile() allocated the first arena and put it in the free list
        // (plan_memory::put_free); the others are allocated here on demand
        // (counted in plan_memory::allocated_arenas).
        pool.mem = std::move(mem);
      },
      [self](const msg::unload_plan& m) {
        auto& st = self->state;
        auto it = st.pools.find(m.plan_key);
        if (it == st.pools.end()) return;
        for (auto& req : it->second.queue)
          refuse(self, &it->second, req, {errc::internal, "plan unloaded while a job waited", st.index});
        st.pools.erase(it);
      },
      [self](const msg::acquire_arena& req) {
        auto& st = self->state;
        auto it = st.pools.find(req.plan_key);
        arena_pool* found = it == st.pools.end() ? nullptr : &it->second;
        if (st.dead) return refuse(self, found, req, st.death);
        if (!found)
          return refuse(self, nullptr, req,
                        {errc::internal, "plan not loaded on device '" + st.dev->spec().name + "'", st.index});
        auto& pool = *found;
        // An arena of the job's expected lane: a free one, else a new one
        // while the pool may grow, else any free one (plan_memory::lane_of).
        const bool can_grow = pool.mem->may_grow();
        if (const int a = pool.mem->take_for_request(req.expected_lane, can_grow); a >= 0)
          return grant(self, pool, req, a);
        if (can_grow) {
          // Lazily grow the pool; when memory runs out the pool just stops growing.
          auto p = st.dev->allocate(pool.mem->arena_bytes > 0 ? pool.mem->arena_bytes : 1);
          const int a = pool.mem->first_unallocated(req.expected_lane);
          if (p && !pool.mem->allocate_window(static_cast<std::size_t>(a))) {
            // Its host window did not fit: as if the arena had not.
            st.dev->deallocate(*p);
            p = error{errc::out_of_memory, "its host window of " + std::to_string(pool.mem->window_bytes) +
                                               " bytes: host memory ran out"};
          }
          if (p) {
            pool.mem->arenas[static_cast<std::size_t>(a)] = *p;
            pool.mem->allocated_arenas.fetch_add(1, std::memory_order_release);
            return grant(self, pool, req, a);
          }
          if (pool.mem->allocated_arenas.load(std::memory_order_relaxed) == 0) {
            const auto& e = p.err();
            return refuse(self, &pool, req, {e.code,
                                      "device '" + st.dev->spec().name + "': activation arena of " +
                                          std::to_string(pool.mem->arena_bytes) + " bytes: " + e.message,
                                      st.index});
          }
        }
        if (const int a = pool.mem->take_for_request(-1, false); a >= 0) return grant(self, pool, req, a);  // another lane's
        pool.queue.push_back(req);
      },
      [self](const msg::release_arena& m) {
        auto& st = self->state;
        auto it = st.pools.find(m.plan_key);
        if (it == st.pools.end()) return;
        auto& pool = it->second;
        if (!pool.queue.empty() && !st.dead) {
          auto req = std::move(pool.queue.front());
          pool.queue.pop_front();
          return grant(self, pool, req, m.arena);
        }
        pool.mem->put_free(m.arena);
      },
      [self](const msg::withdraw_arena& m) {
        auto it = self->state.pools.find(m.plan_key);
        if (it == self->state.pools.end()) return;
        // Exactly one arena_reply per acquire: if the request still waits,
        // refuse it now; else its grant or refusal is already on the way.
        auto& q = it->second.queue;
        for (auto i = q.begin(); i != q.end(); ++i)
          if (i->job == m.job) {
            auto req = std::move(*i);
            q.erase(i);
            refuse(self, &it->second, req, {errc::cancelled, "withdrawn"});
            break;
          }
      },
      [self](const msg::device_fault& m) {
        auto& st = self->state;
        if (st.dead) return;
        // A fault notice that was still on its way when the device was
        // reset (runtime::reset_device): the device is alive again.
        if (st.dev->alive()) return;
        st.dead = true;
        // A backend that names this device in its fault says so in the
        // error's device field; otherwise the device is named here.
        st.death = m.err;
        st.death.code = errc::device_failed;
        if (st.death.device != st.index) {
          st.death.message = "device '" + st.dev->spec().name + "' failed: " + st.death.message;
          st.death.device = st.index;
        }
        for (auto& [key, pool] : st.pools) {
          for (auto& req : pool.queue) refuse(self, &pool, req, st.death);
          pool.queue.clear();
        }
        self->send(st.runtime, msg::device_down{st.index, st.death, {}, 0});
      },
      [self](const msg::device_stalled& m) {
        auto& st = self->state;
        if (st.dead) return;  // the first cause stays
        if (m.since_ns <= st.last_reset_ns) return;  // about work a reset abandoned
        st.dead = true;
        // Jobs using the device fail with the stall (errc::timeout, device
        // and step set); jobs submitted later are refused at once.
        const error& stall = m.err;
        st.death = error{errc::device_failed,
                         "device '" + st.dev->spec().name + "' is quarantined until runtime::reset_device(" +
                             std::to_string(st.index) + "): " + stall.message,
                         st.index};
        for (auto& [key, pool] : st.pools) {
          for (auto& req : pool.queue) refuse(self, &pool, req, st.death);
          pool.queue.clear();
        }
        self->send(st.runtime, msg::device_down{st.index, stall, st.death, m.plan_key});
      },
      [self](const msg::reset_device& m) {
        auto& st = self->state;
        if (!st.dead && st.dev->alive()) {
          if (m.done) m.done({});  // in service: nothing to reset
          return;
        }
        // The reset makes the abandoned work's notifications report "reset
        // with this work pending". Every job the death or stall failed must
        // have its fail_job queued before that: the runtime actor handled
        // our device_down (same sender, in order) once it answers this.
        self->request(st.runtime, caf::infinite, msg::stats_atom::value).then([self, done = m.done](int64_t) {
          auto& st = self->state;
          if (!st.dead && st.dev->alive()) {  // another reset got there first
            if (done) done({});
            return;
          }
          if (error e = st.dev->reset()) {
            if (done) done(e);  // stays out of service (a dead CUDA device)
            return;
          }
          st.dead = false;
          st.death = {};
          st.last_reset_ns =
              std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
          // Through the runtime actor, after the device_down sent before.
          self->send(st.runtime, msg::device_up{st.index, done});
        });
      },
  };
}

}  // namespace

caf::actor spawn_device_actor(caf::actor_system& sys, gpu::device_ptr dev, int arenas_per_device,
                              caf::actor runtime_actor) {
  return sys.spawn(device_actor_fn, std::move(dev), arenas_per_device, std::move(runtime_actor));
}

}  // namespace ag::actors
