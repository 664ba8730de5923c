#include <algorithm>
#include <map>
#include <tuple>

#include <caf/all.hpp>

#include "actors/copy_engine_actor.hpp"
#include "actors/device_actor.hpp"
#include "actors/internal.hpp"
#include "actors/job_actor.hpp"
#include "actors/job_state.hpp"
#include "actors/runtime_actor.hpp"
#include "actors/stream_actor.hpp"
#include "graph/reference.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

const char* lane_name(exec_kind k, int lane) {
  static const char* compute[] = {"compute0", "compute1", "compute2", "compute3",
                                  "compute4", "compute5", "compute6", "compute7"};
  switch (k) {
    case exec_kind::compute: return lane >= 0 && lane < 8 ? compute[lane] : "compute";
    case exec_kind::h2d: return "h2d";
    case exec_kind::d2h: return "d2h";
    case exec_kind::peer: return "peer";
  }
  return "?";
}

device_plan::~device_plan() {
  if (!dev) return;
  if (weights) dev->deallocate(weights);
  for (void* a : arenas)
    if (a) dev->deallocate(a);
}

void trace_buffer::push(std::vector<trace_record>&& recs) {
  std::lock_guard<std::mutex> lk(m_);
  if (recs_.empty()) {
    recs_ = std::move(recs);
  } else {
    recs_.insert(recs_.end(), std::make_move_iterator(recs.begin()), std::make_move_iterator(recs.end()));
  }
}

std::vector<trace_record> trace_buffer::take() {
  std::lock_guard<std::mutex> lk(m_);
  return std::exchange(recs_, {});
}

void apply_scheduler_options(const runtime_options& o, caf::actor_system_config& cfg) {
  if (o.scheduler_threads > 0) cfg.set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
  if (!o.tuned_scheduler) return;
  cfg.set("work-stealing.moderate-poll-attempts", static_cast<size_t>(0));
  if (o.scheduler_max_throughput > 0)
    cfg.set("scheduler.max-throughput", static_cast<size_t>(o.scheduler_max_throughput));
  if (o.scheduler_idle_steal_us > 0)
    cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::microseconds(o.scheduler_idle_steal_us)});
}

error job_registry::add(uint64_t id, caf::actor who, std::shared_ptr<const loaded_plan> lp) {
  std::lock_guard<std::mutex> lk(m_);
  for (int d : lp->used_devices)
    if (auto it = dead_.find(d); it != dead_.end()) return it->second;
  jobs_.insert_or_assign(id, entry{std::move(who), std::move(lp)});
  return {};
}

void job_registry::remove(uint64_t id) {
  std::lock_guard<std::mutex> lk(m_);
  jobs_.erase(id);
}

std::vector<caf::actor> job_registry::mark_dead(int device, const error& why) {
  std::lock_guard<std::mutex> lk(m_);
  dead_.try_emplace(device, why);
  std::vector<caf::actor> r;
  for (const auto& [id, e] : jobs_) {
    const auto& used = e.lp->used_devices;
    if (std::find(used.begin(), used.end(), device) != used.end()) r.push_back(e.who);
  }
  return r;
}

std::size_t job_registry::size() {
  std::lock_guard<std::mutex> lk(m_);
  return jobs_.size();
}

/// Lets plan handles outlive the runtime: unload messages go out only while it lives.
struct liveness {
  std::mutex m;
  bool alive = true;
  std::vector<caf::actor> device_actors;
};

namespace {

std::atomic<uint64_t> next_plan_key{1};

/// Deleter of the plan pointer compile() returns: holds the loaded plan and
/// unloads it from the device actors when the last user copy goes.
struct plan_deleter {
  std::shared_ptr<loaded_plan> lp;
  std::shared_ptr<liveness> live;
  void operator()(const plan*) const {
    std::lock_guard<std::mutex> lk(live->m);
    if (!live->alive) return;
    for (int d : lp->used_devices)
      caf::anon_send(live->device_actors[static_cast<std::size_t>(d)], msg::unload_plan{lp->key});
  }
};

exec_kind kind_of(step_kind k) {
  switch (k) {
    case step_kind::compute: return exec_kind::compute;
    case step_kind::copy_h2d: return exec_kind::h2d;
    case step_kind::copy_d2h: return exec_kind::d2h;
    case step_kind::copy_peer: return exec_kind::peer;
  }
  return exec_kind::compute;
}

expected<prepared_arg> prepare(const plan& p, node_id id, int device) {
  auto loc = p.locate(id, device);
  if (!loc) return loc.err();
  const node& n = p.source().at(id);
  prepared_arg a;
  a.where = loc->where;
  a.byte_offset = loc->byte_offset;
  a.proto.type = n.type;
  a.proto.dims = n.dims;
  a.proto.stride = loc->stride;
  return a;
}

/// Simulates the plan's launch order: each actor launches its steps in list
/// order, a step only after its deps. A plan whose lane orders contradict
/// its deps would hang every job; refuse it at compile time instead.
error check_launch_order(const plan& p, const std::vector<exec_actor>& actors, const std::vector<step_info>& info) {
  std::vector<char> done(p.steps().size(), 0);
  std::vector<std::size_t> pos(actors.size(), 0);
  std::size_t left = p.steps().size();
  bool progress = true;
  while (left > 0 && progress) {
    progress = false;
    for (std::size_t a = 0; a < actors.size(); ++a) {
      while (pos[a] < actors[a].steps.size()) {
        const step& s = p.at(actors[a].steps[pos[a]]);
        bool ok = true;
        for (step_id d : s.deps) ok = ok && done[static_cast<std::size_t>(d)];
        if (!ok) break;
        done[static_cast<std::size_t>(s.id)] = 1;
        ++pos[a];
        --left;
        progress = true;
      }
    }
  }
  if (left == 0) return {};
  for (std::size_t a = 0; a < actors.size(); ++a)
    if (pos[a] < actors[a].steps.size())
      return {errc::internal, "plan's lane order deadlocks: step " + std::to_string(actors[a].steps[pos[a]]) + " on " +
                                  lane_name(actors[a].kind, actors[a].lane) + " of device " +
                                  std::to_string(actors[a].device) + " waits for a step queued behind it"};
  return {errc::internal, "plan's lane order deadlocks"};
}

}  // namespace

runtime_core::runtime_core(caf::actor_system& sys, std::vector<gpu::device_ptr> devices, runtime_options opts)
    : sys_(sys), devices_(std::move(devices)), opts_(opts) {
  for (const auto& d : devices_) specs_.push_back(d->spec());
  runtime_actor_ = spawn_runtime_actor(sys_, jobs_);
  live_ = std::make_shared<liveness>();
  lanes_.resize(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    auto& dev = devices_[i];
    auto da = spawn_device_actor(sys_, dev, opts_.arenas_per_device, runtime_actor_);
    device_actors_.push_back(da);
    lanes_[i].push_back(spawn_stream_actor(sys_, dev, 0));
    copy_actors_.push_back({spawn_copy_engine(sys_, dev, exec_kind::h2d), spawn_copy_engine(sys_, dev, exec_kind::d2h),
                            spawn_copy_engine(sys_, dev, exec_kind::peer)});
    auto sink = std::make_shared<fault_sink>();
    sink->target = da;
    fault_sinks_.push_back(sink);
    dev->on_fault([w = std::weak_ptr<fault_sink>(sink)](const error& e) {
      if (auto s = w.lock()) {
        std::lock_guard<std::mutex> lk(s->m);
        if (s->target) caf::anon_send(s->target, msg::device_fault{e});
      }
    });
  }
  live_->device_actors = device_actors_;
}

runtime_core::~runtime_core() { shutdown(); }

std::vector<caf::actor> runtime_core::ensure_lanes(int d, int lanes) {
  std::lock_guard<std::mutex> lk(lanes_m_);
  auto& v = lanes_[static_cast<std::size_t>(d)];
  while (static_cast<int>(v.size()) < lanes)
    v.push_back(spawn_stream_actor(sys_, devices_[static_cast<std::size_t>(d)], static_cast<int>(v.size())));
  return v;
}

expected<std::shared_ptr<const plan>> runtime_core::compile(std::shared_ptr<const graph> g, plan_options options) {
  if (stopped_) return error{errc::shutting_down, "runtime is stopping"};
  if (!g) return error{errc::invalid_argument, "compile: null graph"};
  auto compiled = ag::compile(g, specs_, options);
  if (!compiled) return compiled.err();
  std::shared_ptr<const plan> p = std::move(*compiled);
  const graph& gr = p->source();
  const std::size_t ndev = devices_.size();
  if (p->devices().size() != ndev)
    return error{errc::internal, "planner returned a plan for " + std::to_string(p->devices().size()) +
                                     " devices, runtime has " + std::to_string(ndev)};

  auto lp = std::make_shared<loaded_plan>();
  lp->key = next_plan_key.fetch_add(1);
  lp->p = p;
  lp->core = this;
  lp->used_devices = p->used_devices();
  std::sort(lp->used_devices.begin(), lp->used_devices.end());
  lp->steps.resize(p->steps().size());

  // Executing actors: one per (device, kind, lane) the plan uses.
  std::vector<int> lanes(ndev, 0);
  for (const auto& s : p->steps()) {
    if (s.device < 0 || static_cast<std::size_t>(s.device) >= ndev ||
        (s.kind == step_kind::copy_peer && (s.src_device < 0 || static_cast<std::size_t>(s.src_device) >= ndev)))
      return error{errc::internal, "step " + std::to_string(s.id) + " names a device out of range"};
    if (s.kind == step_kind::compute) lanes[static_cast<std::size_t>(s.device)] = std::max(lanes[static_cast<std::size_t>(s.device)], s.lane + 1);
  }
  std::map<std::tuple<int, int, int>, int> index;
  for (const auto& s : p->steps()) {
    const exec_kind k = kind_of(s.kind);
    const int lane = k == exec_kind::compute ? s.lane : 0;
    auto key = std::make_tuple(s.device, static_cast<int>(k), lane);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, static_cast<int>(lp->actors.size())).first;
      exec_actor a;
      a.device = s.device;
      a.kind = k;
      a.lane = lane;
      if (k == exec_kind::compute)
        a.handle = ensure_lanes(s.device, lanes[static_cast<std::size_t>(s.device)])[static_cast<std::size_t>(lane)];
      else
        a.handle = copy_actors_[static_cast<std::size_t>(s.device)][static_cast<std::size_t>(k) - 1];
      lp->actors.push_back(std::move(a));
    }
    lp->actors[static_cast<std::size_t>(it->second)].steps.push_back(s.id);
    lp->steps[static_cast<std::size_t>(s.id)].actor = it->second;
  }
  for (auto& a : lp->actors) {
    std::sort(a.steps.begin(), a.steps.end(), [&](step_id x, step_id y) {
      return std::make_pair(p->at(x).lane_seq, x) < std::make_pair(p->at(y).lane_seq, y);
    });
    for (std::size_t i = 0; i < a.steps.size(); ++i) lp->steps[static_cast<std::size_t>(a.steps[i])].pos = static_cast<int>(i);
  }
  if (auto e = check_launch_order(*p, lp->actors, lp->steps)) return e;

  // Per-step tables: remote deps, consumer actors, resolved operands.
  lp->output_memory.assign(gr.outputs().size(), nullptr);
  for (const auto& s : p->steps()) {
    auto& si = lp->steps[static_cast<std::size_t>(s.id)];
    for (step_id d : s.deps)
      if (lp->steps[static_cast<std::size_t>(d)].actor != si.actor) {
        ++si.remote_deps;
        si.remote_dep_ids.push_back(d);
      }
    for (step_id c : s.consumers) {
      const int ca = lp->steps[static_cast<std::size_t>(c)].actor;
      if (ca != si.actor && std::find(si.consumer_actors.begin(), si.consumer_actors.end(), ca) == si.consumer_actors.end())
        si.consumer_actors.push_back(ca);
    }
    // A step whose op may fail on its values (get_rows ids) reports too, so
    // that failure reaches the job (op_failed) instead of a "done" job.
    si.completion = s.kind == step_kind::copy_d2h || s.consumers.empty() || may_fail_on_values(*p, s);
    if (si.completion) lp->completion_steps.push_back(s.id);
    const auto where = [&](const std::string& what) {
      return "step " + std::to_string(s.id) + " (" + to_string(s.kind) + " on device " + std::to_string(s.device) + ") " + what;
    };
    if (s.kind == step_kind::compute) {
      for (node_id id : s.ops) {
        const node& n = gr.at(id);
        if (is_view_op(n.op) || is_leaf_op(n.op)) continue;
        prepared_op op;
        op.op = &n;
        auto out = prepare(*p, id, s.device);
        if (!out) return error{out.err().code, where("op '" + n.name + "': " + out.err().message)};
        op.out = *out;
        for (node_id in : n.inputs) {
          auto a = prepare(*p, in, s.device);
          if (!a) return error{a.err().code, where("op '" + n.name + "' input '" + gr.at(in).name + "': " + a.err().message)};
          op.inputs.push_back(*a);
        }
        gpu::op_launch l;
        l.op = op.op;
        l.source = &gr;
        l.out = op.out.proto;
        for (const auto& a : op.inputs) l.inputs.push_back(a.proto);
        si.launches.push_back(std::move(l));
        si.ops.push_back(std::move(op));
      }
      if (!s.ops.empty())
        si.label = s.ops.size() == 1 ? gr.at(s.ops.front()).name
                                     : gr.at(s.ops.front()).name + ".." + gr.at(s.ops.back()).name;
    } else {
      if (s.ops.size() != 1) return error{errc::internal, where("copies " + std::to_string(s.ops.size()) + " nodes, expected 1")};
      const node_id id = s.ops.front();
      const node& n = gr.at(id);
      si.label = n.name;
      si.bytes = n.dims.numel() * static_cast<int64_t>(dtype_size(n.type));
      const int src_dev = s.kind == step_kind::copy_peer ? s.src_device : s.device;
      if (s.kind != step_kind::copy_h2d) {
        auto a = prepare(*p, id, src_dev);
        if (!a) return error{a.err().code, where("source '" + n.name + "': " + a.err().message)};
        if (!is_contiguous(n.dims, a->proto.stride)) {
          // A non-contiguous view output: copy its storage, gather on the host.
          const node& sn = gr.at(n.storage);
          if (s.kind != step_kind::copy_d2h || !n.is_view())
            return error{errc::internal, where("copies '" + n.name + "', which is not contiguous on its source device")};
          a = prepare(*p, n.storage, src_dev);
          if (!a) return error{a.err().code, where("storage '" + sn.name + "': " + a.err().message)};
          si.gather = true;
          si.bytes = sn.own_bytes();
        }
        si.src = *a;
      }
      if (s.kind != step_kind::copy_d2h) {
        auto a = prepare(*p, id, s.device);
        if (!a) return error{a.err().code, where("destination '" + n.name + "': " + a.err().message)};
        if (!is_contiguous(n.dims, a->proto.stride))
          return error{errc::internal, where("copies '" + n.name + "' into a non-contiguous destination")};
        si.dst = *a;
      }
      if (s.kind == step_kind::copy_h2d &&
          (s.io_index < 0 || static_cast<std::size_t>(s.io_index) >= gr.inputs().size()))
        return error{errc::internal, where("names input " + std::to_string(s.io_index))};
      if (s.kind == step_kind::copy_d2h &&
          (s.io_index < 0 || static_cast<std::size_t>(s.io_index) >= gr.outputs().size()))
        return error{errc::internal, where("names output " + std::to_string(s.io_index))};
      if (s.kind == step_kind::copy_d2h && opts_.pinned_outputs)
        lp->output_memory[static_cast<std::size_t>(s.io_index)] =
            devices_[static_cast<std::size_t>(s.device)]->host_memory();
    }
  }

  // Device memory: weights uploaded now, the first arena allocated now (so a
  // plan that does not fit fails here), the others when jobs need them.
  lp->mem.resize(ndev);
  const int cap = std::max(1, opts_.arenas_per_device);
  for (int d : lp->used_devices) {
    auto& dev = devices_[static_cast<std::size_t>(d)];
    const auto& mem = p->memory()[static_cast<std::size_t>(d)];
    auto m = std::make_shared<device_plan>();
    m->plan_key = lp->key;
    m->device = d;
    m->dev = dev;
    m->weight_bytes = mem.weight_bytes;
    m->arena_bytes = mem.arena_bytes;
    m->arenas.assign(static_cast<std::size_t>(cap), nullptr);
    const std::string dname = "device '" + dev->spec().name + "'";
    if (mem.weight_bytes > 0) {
      auto w = dev->allocate(mem.weight_bytes);
      if (!w) return error{w.err().code, dname + ": weights of " + std::to_string(mem.weight_bytes) + " bytes: " + w.err().message};
      m->weights = *w;
      for (const auto& slot : mem.slots) {
        if (slot.where != region::weights) continue;
        const node& n = gr.at(slot.node);
        if (!n.data) return error{errc::internal, dname + ": weight '" + n.name + "' has no data"};
        const int64_t bytes = n.data->bytes();
        if (bytes > slot.bytes || slot.offset + bytes > mem.weight_bytes)
          return error{errc::internal, dname + ": weight '" + n.name + "' (" + std::to_string(bytes) +
                                           " bytes) does not fit its slot of " + std::to_string(slot.bytes)};
        // In-memory weights upload straight from the graph; others (a mapped
        // checkpoint) are read into a host buffer first.
        auto values = n.data->in_memory() ? expected<host_tensor>(host_tensor{}) : read_all(*n.data);
        if (!values)
          return error{values.err().code, dname + ": weight '" + n.name + "' (" + n.data->origin() + "): " + values.err().message};
        const std::byte* src = n.data->in_memory() ? n.data->in_memory()->data() : values->data();
        if (auto e = dev->upload(static_cast<std::byte*>(m->weights) + slot.offset, src, bytes))
          return error{e.code, dname + ": uploading weight '" + n.name + "': " + e.message};
      }
    }
    auto a = dev->allocate(mem.arena_bytes > 0 ? mem.arena_bytes : 1);
    if (!a)
      return error{a.err().code, dname + ": activation arena of " + std::to_string(mem.arena_bytes) +
                                     " bytes (after " + std::to_string(mem.weight_bytes) + " bytes of weights): " + a.err().message};
    m->arenas[0] = *a;
    lp->mem[static_cast<std::size_t>(d)] = std::move(m);
  }
  for (int d : lp->used_devices)
    caf::anon_send(device_actors_[static_cast<std::size_t>(d)], msg::register_plan{lp->mem[static_cast<std::size_t>(d)]});
  return std::shared_ptr<const plan>(p.get(), plan_deleter{lp, live_});
}

job runtime_core::submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs) {
  auto ss = std::make_shared<job::shared_state>();
  ss->id = next_job_.fetch_add(1);
  ss->times.submitted_ns = gpu::host_clock_ns();
  job j(ss);
  if (stopped_) {
    ss->fulfil(error{errc::shutting_down, "runtime is stopping"}, job_state::failed);
    return j;
  }
  const plan_deleter* d = p ? std::get_deleter<plan_deleter>(p) : nullptr;
  if (!d || d->live != live_) {
    ss->fulfil(error{errc::invalid_argument, "submit: the plan was not compiled by this runtime"}, job_state::failed);
    return j;
  }
  if (auto e = check_inputs(p->source(), inputs)) {
    ss->fulfil(std::move(e), job_state::failed);
    return j;
  }
  in_flight_.fetch_add(1);
  alive_.fetch_add(1);
  const auto& lp = d->lp;
  caf::actor ja = spawn_job_actor(sys_, this, ss, lp, p, std::move(inputs));
  {
    // The job actor starts lazily (on its first message): cancel() must be
    // able to reach it before then. Nobody else holds the handle yet.
    std::lock_guard<std::mutex> lk(ss->m);
    ss->actor = ja;
  }
  // The first arena request goes out from here, not from the job actor: CAF
  // starts freshly spawned actors in no particular order (work stealing runs
  // the newest first), so jobs would queue for their first device out of
  // submission order. Sent from the submitting thread, the requests of one
  // thread reach the device in submission order (FIFO back-pressure).
  if (!lp->used_devices.empty())
    caf::anon_send(device_actors_[static_cast<std::size_t>(lp->used_devices.front())],
                   msg::acquire_arena{lp->key, ss->id, ja});
  return j;
}

std::vector<caf::actor> runtime_core::exec_actors() {
  std::lock_guard<std::mutex> lk(lanes_m_);
  std::vector<caf::actor> r;
  for (const auto& v : lanes_) r.insert(r.end(), v.begin(), v.end());
  for (const auto& arr : copy_actors_) r.insert(r.end(), arr.begin(), arr.end());
  return r;
}

std::shared_ptr<const loaded_plan> runtime_core::loaded(const std::shared_ptr<const plan>& p) {
  const plan_deleter* d = p ? std::get_deleter<plan_deleter>(p) : nullptr;
  return d ? d->lp : nullptr;
}

void runtime_core::job_ready() noexcept { in_flight_.fetch_sub(1); }

void runtime_core::job_gone() noexcept {
  std::lock_guard<std::mutex> lk(idle_m_);
  if (alive_.fetch_sub(1) == 1) idle_cv_.notify_all();
}

void runtime_core::wait_idle() {
  std::unique_lock<std::mutex> lk(idle_m_);
  idle_cv_.wait(lk, [this] { return alive_.load() == 0; });
}

trace runtime_core::take_trace() {
  trace t;
  for (const auto& s : specs_) t.device_names.push_back(s.name);
  t.records = trace_.take();
  return t;
}

void runtime_core::shutdown() {
  if (stopped_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lk(live_->m);
    live_->alive = false;
    live_->device_actors.clear();
  }
  for (auto& s : fault_sinks_) {
    std::lock_guard<std::mutex> lk(s->m);
    s->target = nullptr;
  }
  auto stop = [](caf::actor& a) {
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    a = nullptr;
  };
  stop(runtime_actor_);
  for (auto& a : device_actors_) stop(a);
  std::lock_guard<std::mutex> lk(lanes_m_);
  for (auto& v : lanes_)
    for (auto& a : v) stop(a);
  for (auto& arr : copy_actors_)
    for (auto& a : arr) stop(a);
}

}  // namespace ag::actors
