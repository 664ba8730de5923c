#include "actors/runtime_core.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>

#include <caf/all.hpp>

#include "actors/copy_engine_actor.hpp"
#include "actors/device_actor.hpp"
#include "actors/hop_probe.hpp"
#include "actors/job_actor.hpp"
#include "actors/job_state.hpp"
#include "actors/runtime_actor.hpp"
#include "actors/stream_actor.hpp"
#include "graph/reference.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

/// Lets plan handles outlive the runtime: unload messages go out only while it lives.
struct liveness {
  std::mutex m;
  bool alive = true;
  std::vector<caf::actor> device_actors;
};

/// Forwards backend fault callbacks to a device actor while the runtime lives.
struct fault_sink {
  std::mutex m;
  caf::actor target;
};

namespace {

std::atomic<uint64_t> next_plan_key{1};

/// Deleter of the plan pointer compile() returns: holds the loaded plan and,
/// when the last user copy goes (so no job of the plan is left: each job
/// holds a copy), unloads it from the device actors and the queue actors.
struct plan_deleter {
  std::shared_ptr<const loaded_plan> lp;
  std::shared_ptr<liveness> live;
  void operator()(const plan*) const {
    std::lock_guard<std::mutex> lk(live->m);
    if (!live->alive) return;
    for (int d : lp->program->used_devices())
      caf::anon_send(live->device_actors[static_cast<std::size_t>(d)], msg::unload_plan{lp->key});
    // Every job lane's actors (a communication queue's copies are actors of
    // their own); an actor listed twice forgets the plan twice, harmlessly.
    for (int l = 0; l < lp->program->job_lanes(); ++l)
      for (std::size_t q = 0; q < lp->queue_actors.size(); ++q)
        if (l == 0 || lp->program->copied(static_cast<int>(q)))
          caf::anon_send(lp->actors_of(l)[q], msg::unload_plan{lp->key});
  }
};

/// Runs task(0) .. task(n - 1), task 0 on this thread and the others on
/// threads of their own (here, after it, where no thread can be had), and
/// returns the first task's error once all are done.
error run_in_parallel(int n, const std::function<error(int)>& task) {
  std::vector<error> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> helpers;
  std::vector<int> here;
  for (int i = 1; i < n; ++i) {
    try {
      helpers.emplace_back([&, i] { errors[static_cast<std::size_t>(i)] = task(i); });
    } catch (const std::system_error&) {
      here.push_back(i);
    }
  }
  if (n > 0) errors[0] = task(0);
  for (int i : here) errors[static_cast<std::size_t>(i)] = task(i);
  for (std::thread& t : helpers) t.join();
  for (error& e : errors)
    if (e) return std::move(e);
  return {};
}

/// Reads rows [begin, end) (along dim 0) of `w` into `dst` in pieces of
/// whole rows on up to `upload_read_threads` threads, at least 4 MiB a
/// piece (a source may be read from several threads at once,
/// graph/weight_source.hpp): a mapped checkpoint's page faults and a scaled
/// weight's products (a norm folded into it, make_scaled_weight) run on the
/// host's cores together. One thread read a folded LLaMA-1B at 2.1-2.2 GB/s
/// against 4.3-5.4 unfolded (two H200s' host, docs/BENCHMARKS.md session 44).
constexpr int upload_read_threads = 8;
error read_rows_in_parallel(const weight_source& w, int64_t begin, int64_t end, int64_t row_bytes, std::byte* dst,
                            int max_threads) {
  const int64_t rows = end - begin;
  const int64_t by_size = std::max<int64_t>(1, rows * row_bytes / (int64_t{4} << 20));
  const int pieces = static_cast<int>(std::min({rows, by_size, int64_t{std::max(1, max_threads)}}));
  if (pieces <= 1) return w.read_slice(0, begin, end, dst);
  return run_in_parallel(pieces, [&](int i) {
    const int64_t a = begin + rows * i / pieces, b = begin + rows * (i + 1) / pieces;
    return w.read_slice(0, a, b, dst + (a - begin) * row_bytes);
  });
}

/// Uploads a weight that is not in host memory (a mapped checkpoint, a
/// tensor-parallel shard of one, a weight scaled by a folded norm) in chunks
/// of whole rows along dim 0, each read by the source straight into
/// `staging` (the device's host memory, pinned on CUDA, when it has one; on
/// several threads, read_rows_in_parallel) and then copied to the device:
/// the host holds at most one chunk of the model besides the page cache
/// behind the mapping. `staging` grows to one row when a row is larger than
/// the chunk. `read_threads` caps read_rows_in_parallel's threads.
error upload_in_chunks(gpu::device& dev, std::byte* dst, const weight_source& w, int64_t chunk_bytes,
                       host_tensor& staging, int read_threads) {
  const int64_t rows = w.dims()[0];
  const int64_t row_bytes = rows > 0 ? w.bytes() / rows : 0;
  if (row_bytes == 0) return {};
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / row_bytes);
  const int64_t need = std::min(rows, rows_per_chunk) * row_bytes;
  if (static_cast<int64_t>(staging.bytes()) < need) {
    try {
      staging = host_tensor::uninitialized(dtype::f32, {(need + 3) / 4}, dev.host_memory());
    } catch (const std::bad_alloc&) {
      return error{errc::out_of_memory, "no host memory for an upload staging buffer of " + std::to_string(need) + " bytes"};
    }
  }
  for (int64_t r = 0; r < rows; r += rows_per_chunk) {
    const int64_t end = std::min(rows, r + rows_per_chunk);
    if (error e = read_rows_in_parallel(w, r, end, row_bytes, staging.data(), read_threads)) return e;
    if (error e = dev.upload(dst + r * row_bytes, staging.data(), (end - r) * row_bytes)) return e;
  }
  return {};
}

/// The weights one device of a plan loads: each node's values to its slot.
struct device_uploads {
  gpu::device* dev = nullptr;
  int device = -1;
  std::vector<std::pair<const node*, std::byte*>> weights;
};

/// Uploads one device's weights: in-memory ones straight from the graph,
/// others in chunks through one staging buffer. Errors name the device and
/// the weight.
error upload_weights(const device_uploads& u, int64_t chunk_bytes, int read_threads) {
  const std::string dname = "device '" + u.dev->spec().name + "'";
  host_tensor staging;  // upload_in_chunks' buffer, reused for the device's weights
  for (const auto& [n, dst] : u.weights) {
    const int64_t bytes = n->data->bytes();
    if (const host_tensor* values = n->data->in_memory()) {
      if (auto e = u.dev->upload(dst, values->data(), bytes))
        return error{e.code, dname + ": uploading weight '" + n->name + "': " + e.message, u.device, -1, n->name};
    } else if (auto e = upload_in_chunks(*u.dev, dst, *n->data, chunk_bytes, staging, read_threads)) {
      return error{e.code, dname + ": uploading weight '" + n->name + "' (" + n->data->origin() + "): " + e.message,
                   u.device, -1, n->name};
    }
  }
  return {};
}

/// Every device's uploads at once, a thread per device (each reading on
/// up to its share of the host's cores, at most upload_read_threads): a
/// plan over N devices loaded them one after the other, at one device's
/// rate. Returns the first device's error, after every thread is done.
error upload_all_weights(const std::vector<device_uploads>& all, int64_t chunk_bytes) {
  std::vector<const device_uploads*> busy;
  for (const auto& u : all)
    if (!u.weights.empty()) busy.push_back(&u);
  if (busy.empty()) return {};
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int read_threads = std::min(upload_read_threads, std::max(1, cores / static_cast<int>(busy.size())));
  return run_in_parallel(static_cast<int>(busy.size()), [&](int i) {
    return upload_weights(*busy[static_cast<std::size_t>(i)], chunk_bytes, read_threads);
  });
}

/// Zeroes `bytes` of device memory at `dst` through one zeroed host buffer
/// of at most `chunk_bytes` (a fresh state slot reads as zeros: a KV cache's
/// unwritten rows must hold no NaN for the attention mask to hide).
error zero_device_memory(gpu::device& dev, std::byte* dst, int64_t bytes, int64_t chunk_bytes) {
  const int64_t chunk = std::max<int64_t>(1, std::min(bytes, chunk_bytes));
  std::vector<std::byte> zeros;
  try {
    zeros.assign(static_cast<std::size_t>(chunk), std::byte{0});
  } catch (const std::bad_alloc&) {
    return error{errc::out_of_memory, "no host memory for a zero buffer of " + std::to_string(chunk) + " bytes"};
  }
  for (int64_t off = 0; off < bytes; off += chunk)
    if (error e = dev.upload(dst + off, zeros.data(), std::min(chunk, bytes - off))) return e;
  return {};
}

}  // namespace

runtime_core::runtime_core(caf::actor_system& sys, std::vector<gpu::device_ptr> devices, runtime_options opts)
    : sys_(sys), devices_(std::move(devices)), opts_(opts), trace_(opts.trace_max_records) {
  for (const auto& d : devices_) specs_.push_back(d->spec());
  runtime_actor_ = spawn_runtime_actor(sys_, jobs_);
  live_ = std::make_shared<liveness>();
  lanes_.resize(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    auto& dev = devices_[i];
    auto da = spawn_device_actor(sys_, dev, opts_.arenas_per_device, runtime_actor_);
    device_actors_.push_back(da);
    const stall_watch w = watch_of(i);
    lanes_[i].push_back(spawn_stream_actor(sys_, dev, 0, w));
    // Indexed by step kind - 1 (queue_actor()).
    copy_actors_.push_back({spawn_copy_engine(sys_, dev, step_kind::copy_h2d, w),
                            spawn_copy_engine(sys_, dev, step_kind::copy_d2h, w),
                            spawn_copy_engine(sys_, dev, step_kind::copy_peer, w)});
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
  for (int k = 0; k < opts_.spare_job_actors; ++k) spares_.push_back(spawn_spare_job_actor(sys_, this));
}

std::size_t runtime_core::spare_job_actors() const {
  std::lock_guard<std::mutex> lk(spares_m_);
  return spares_.size();
}

runtime_core::~runtime_core() { shutdown(); }

stall_watch runtime_core::watch_of(std::size_t device) const {
  stall_watch w;
  w.factor = opts_.stall_factor;
  w.min_seconds = opts_.stall_min_seconds;
  w.device_actor = device_actors_[device];
  return w;
}

void runtime_core::reset_device(int index, std::function<void(const error&)> done) {
  if (index < 0 || static_cast<std::size_t>(index) >= devices_.size()) {
    done(error{errc::invalid_argument, "reset_device(" + std::to_string(index) + "): no such device (the runtime has " +
                                           std::to_string(devices_.size()) + ", 0.." +
                                           std::to_string(static_cast<int>(devices_.size()) - 1) + ")"});
    return;
  }
  if (stopped_ || stopping_) {
    done(error{errc::shutting_down, "reset_device: the runtime is stopping", index});
    return;
  }
  caf::anon_send(device_actors_[static_cast<std::size_t>(index)], msg::reset_device{std::move(done)});
}

bool runtime_core::device_in_service(int index) const {
  if (index < 0 || static_cast<std::size_t>(index) >= devices_.size()) return false;
  return jobs_->in_service(index);
}

caf::actor runtime_core::queue_actor(int device, step_kind kind, int lane) {
  const auto d = static_cast<std::size_t>(device);
  switch (kind) {
    case step_kind::compute: {
      // One actor serves every lane of the device unless asked otherwise
      // (runtime_options::actor_per_lane): it makes a stream per lane.
      if (!opts_.actor_per_lane) lane = 0;
      std::lock_guard<std::mutex> lk(lanes_m_);
      auto& v = lanes_[d];
      while (static_cast<int>(v.size()) <= lane)
        v.push_back(spawn_stream_actor(sys_, devices_[d], static_cast<int>(v.size()), watch_of(d)));
      return v[static_cast<std::size_t>(lane)];
    }
    case step_kind::copy_h2d:
    case step_kind::copy_d2h:
    case step_kind::copy_peer: return copy_actors_[d][static_cast<std::size_t>(kind) - 1];
    case step_kind::collective: {
      // The device's communication queue (collective parts of every plan),
      // spawned on the first plan that needs it; lane l > 0: its copy for
      // job lane l (launch_program::job_lanes).
      std::lock_guard<std::mutex> lk(lanes_m_);
      if (comm_actors_.size() < devices_.size()) comm_actors_.resize(devices_.size());
      auto& v = comm_actors_[d];
      if (static_cast<int>(v.size()) <= lane) v.resize(static_cast<std::size_t>(lane) + 1);
      auto& a = v[static_cast<std::size_t>(lane)];
      if (!a) a = spawn_exec_actor(sys_, devices_[d], step_kind::collective, lane, watch_of(d));
      return a;
    }
  }
  return {};
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
  auto program = lower(p);
  if (!program) return program.err();

  auto lp = std::make_shared<loaded_plan>();
  lp->key = next_plan_key.fetch_add(1);
  lp->program = std::move(*program);
  lp->core = this;
  const launch_program& prog = *lp->program;
  // Bind each queue to its executing actor, once per loaded plan.
  lp->queue_actors.reserve(prog.queues().size());
  for (const auto& q : prog.queues()) lp->queue_actors.push_back(queue_actor(q.device, q.kind, q.lane));
  for (int l = 1; l < prog.job_lanes(); ++l) {
    std::vector<caf::actor> actors;
    for (std::size_t q = 0; q < prog.queues().size(); ++q) {
      const auto& lq = prog.queues()[q];
      actors.push_back(prog.copied(static_cast<int>(q))
                           ? queue_actor(lq.device, lq.kind, prog.lane_on_copy(static_cast<int>(q), l))
                           : lp->queue_actors[q]);
    }
    lp->other_lanes_actors.push_back(std::move(actors));
  }
  // The issue line of every ordered queue on each job lane: its actor's
  // stream lane, shared with other plans' queues there.
  if (std::any_of(prog.queues().begin(), prog.queues().end(), [](const launch_queue& q) { return q.in_job_order; }))
    for (int l = 0; l < std::max(1, prog.job_lanes()); ++l) {
      std::vector<issue_line> lines(prog.queues().size());
      for (std::size_t q = 0; q < prog.queues().size(); ++q)
        if (prog.queues()[q].in_job_order)
          lines[q] = issue_line{lp->actors_of(l)[q].id(), prog.lane_on_copy(static_cast<int>(q), l)};
      lp->order_lines.push_back(std::move(lines));
    }
  lp->output_memory.assign(gr.outputs().size(), nullptr);
  if (opts_.pinned_outputs)
    for (step_id s : prog.completion_steps()) {
      const lowered_step& ls = prog.steps()[static_cast<std::size_t>(s)];
      if (ls.kind == step_kind::copy_d2h && ls.copy.window_offset < 0)  // a window's copy lands in pinned memory already
        lp->output_memory[static_cast<std::size_t>(ls.copy.io_index)] =
            devices_[static_cast<std::size_t>(ls.device)]->output_memory();
    }
  lp->input_memory.assign(gr.inputs().size(), nullptr);
  lp->input_home.assign(gr.inputs().size(), nullptr);
  for (const lowered_step& ls : prog.steps()) {
    if (ls.kind != step_kind::copy_h2d || ls.copy.window_offset >= 0) continue;  // copied into a window, not pinned per job
    const auto k = static_cast<std::size_t>(ls.copy.io_index);
    if (!lp->input_home[k]) lp->input_home[k] = devices_[static_cast<std::size_t>(ls.device)]->output_memory();
    if (lp->input_memory[k] || gr.at(gr.inputs()[k]).own_bytes() > opts_.pinned_inputs_max_bytes) continue;
    lp->input_memory[k] = devices_[static_cast<std::size_t>(ls.device)]->host_memory();
  }

  // plan_options::share_state_with / share_weights_with: those plans as
  // this runtime loaded them.
  std::shared_ptr<const loaded_plan> shared_state, shared_weights;
  for (auto [other, into, what] : {std::tuple{&p->options().share_state_with, &shared_state, "share_state_with"},
                                   std::tuple{&p->options().share_weights_with, &shared_weights, "share_weights_with"}}) {
    if (!*other) continue;
    const std::shared_ptr<const loaded_plan>* here = loaded_here(*other);
    if (!here)
      return error{errc::invalid_argument,
                   std::string("compile: plan_options::") + what + " names a plan this runtime did not compile"};
    *into = *here;
  }
  // Device memory: weights uploaded now (every device's at once, after the
  // allocations), the first arena allocated now (so a plan that does not fit
  // fails here), the others when jobs need them.
  lp->memory.resize(ndev);
  std::vector<device_uploads> uploads;
  const int cap = std::max(1, opts_.arenas_per_device);
  for (int d : prog.used_devices()) {
    auto& dev = devices_[static_cast<std::size_t>(d)];
    const auto& mem = p->memory()[static_cast<std::size_t>(d)];
    auto m = std::make_shared<plan_memory>(lp->key, dev, cap);
    m->weight_bytes = mem.weight_bytes;
    m->arena_bytes = mem.arena_bytes;
    const std::string dname = "device '" + dev->spec().name + "'";
    if (mem.weights_shared) {
      // The other plan's weights, each of ours at its offset there (memory_plan.cpp offsets_in).
      const auto& owner = shared_weights ? shared_weights->memory[static_cast<std::size_t>(d)] : nullptr;
      if (!owner || !owner->weights || owner->weight_bytes != mem.weight_bytes)
        return error{errc::internal, dname + ": the plan named by share_weights_with keeps no matching weights here", d};
      m->weights = owner->weights;
      m->weight_owner = owner;
    } else if (mem.weight_bytes > 0) {
      auto w = dev->allocate(mem.weight_bytes);
      if (!w)
        return error{w.err().code, dname + ": weights of " + std::to_string(mem.weight_bytes) + " bytes: " + w.err().message,
                     d};
      m->weights = *w;
      device_uploads& mine = uploads.emplace_back();
      mine.dev = dev.get();
      mine.device = d;
      for (const auto& slot : mem.slots) {
        if (slot.where != region::weights) continue;
        const node& n = gr.at(slot.node);
        if (!n.data) return error{errc::internal, dname + ": weight '" + n.name + "' has no data", d, -1, n.name};
        const int64_t bytes = n.data->bytes();
        if (bytes > slot.bytes || slot.offset + bytes > mem.weight_bytes)
          return error{errc::internal,
                       dname + ": weight '" + n.name + "' (" + std::to_string(bytes) + " bytes) does not fit its slot of " +
                           std::to_string(slot.bytes),
                       d, -1, n.name};
        mine.weights.emplace_back(&n, static_cast<std::byte*>(m->weights) + slot.offset);
      }
    }
    if (mem.state_bytes > 0 && shared_state) {
      // Another plan's state region (the planner laid this plan's state out at its offsets).
      const auto& owner = shared_state->memory[static_cast<std::size_t>(d)];
      if (!owner || !owner->states || owner->state_bytes != mem.state_bytes)
        return error{errc::internal, dname + ": the plan named by share_state_with keeps no matching state here", d};
      m->states = owner->states;
      m->state_bytes = owner->state_bytes;
      m->state_owner = owner;
      lp->state_slots = shared_state->state_slots;
    } else if (mem.state_bytes > 0) {
      // The plan's state: state_slots slots, zeroed (planner checked the product fits).
      const int64_t bytes = mem.state_bytes * p->options().state_slots;
      auto s = dev->allocate(bytes);
      if (!s)
        return error{s.err().code,
                     dname + ": state of " + std::to_string(p->options().state_slots) + " slot(s) x " +
                         std::to_string(mem.state_bytes) + " bytes: " + s.err().message,
                     d};
      m->states = *s;
      m->state_bytes = mem.state_bytes;
      if (error e = zero_device_memory(*dev, static_cast<std::byte*>(m->states), bytes, opts_.upload_chunk_bytes))
        return error{e.code, dname + ": zeroing its state: " + e.message, d};
      lp->state_slots = p->options().state_slots;
    }
    auto a = dev->allocate(mem.arena_bytes > 0 ? mem.arena_bytes : 1);
    if (!a)
      return error{a.err().code,
                   dname + ": activation arena of " + std::to_string(mem.arena_bytes) + " bytes (after " +
                       std::to_string(mem.weight_bytes) + " bytes of weights): " + a.err().message,
                   d};
    m->arenas[0] = *a;
    m->window_bytes = prog.window_bytes(d);
    m->window_memory = dev->host_memory();
    if (!m->allocate_window(0))
      return error{errc::out_of_memory, dname + ": host window of " + std::to_string(m->window_bytes) +
                                            " bytes for its first arena: host memory ran out", d};
    m->job_lanes = prog.job_lanes();
    m->allocated_arenas.store(1, std::memory_order_release);
    m->put_free(0);  // free for the first job (start on submit), before the device actor hears of it
    lp->memory[static_cast<std::size_t>(d)] = std::move(m);
  }
  if (error e = upload_all_weights(uploads, opts_.upload_chunk_bytes)) return e;
  if (lp->state_slots > 0)  // one job at a time per slot, across the plans sharing the state
    lp->slots = shared_state ? shared_state->slots : std::make_shared<slot_table>(lp->state_slots);
  if (auto one = single_lane_of(*p))  // (device, lane) names the stream the lane's actor issues on
    lp->stream_key = (uint64_t{1} << 63) | (static_cast<uint64_t>(one->device) << 32) | static_cast<uint32_t>(one->lane);
  // Collective groups: a communicator per group is made now (NCCL on CUDA),
  // so a group that cannot run fails the load, not the first job.
  std::set<std::vector<int>> groups;
  for (const lowered_step& ls : prog.steps())
    if (ls.kind == step_kind::collective) groups.insert(ls.coll.member_devices);
  for (const auto& members : groups) {
    std::vector<gpu::device*> devs;
    for (int d : members) devs.push_back(devices_[static_cast<std::size_t>(d)].get());
    if (error e = devs.front()->prepare_collective_group(devs, prog.job_lanes()))
      return error{e.code, "collective group of device '" + devs.front()->spec().name + "': " + e.message,
                   members.front()};
  }
  for (int d : prog.used_devices())
    caf::anon_send(device_actors_[static_cast<std::size_t>(d)],
                   msg::register_plan{lp->memory[static_cast<std::size_t>(d)]});
  return std::shared_ptr<const plan>(p.get(), plan_deleter{std::move(lp), live_});
}

namespace {

/// Whether a job of `lp` may name state slot `slot`, or why not.
error check_state_slot(const loaded_plan& lp, int slot) {
  if (lp.state_slots == 0) {
    if (slot < 0) return {};
    return error{errc::invalid_argument, "submit: state_slot " + std::to_string(slot) +
                                             " names a state slot, but the plan keeps no state (no store_rows node)"};
  }
  if (slot < 0 || slot >= lp.state_slots)
    return error{errc::invalid_argument,
                 "submit: the plan keeps state in " + std::to_string(lp.state_slots) +
                     " slot(s) (store_rows nodes): submit_options::state_slot must be 0.." +
                     std::to_string(lp.state_slots - 1) + ", got " + std::to_string(slot)};
  return {};
}

}  // namespace

job runtime_core::submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs,
                         const submit_options& options) {
  auto ss = std::make_shared<job::shared_state>();
  ss->id = next_job_.fetch_add(1);
  ss->times.submitted_ns = gpu::host_clock_ns();
  AG_HOP_PROBE(submit, ss->id);
  // Before the job can run anywhere: its completion thread runs it.
  if (options.on_done) ss->continuations.push_back(options.on_done);
  job j(ss);
  // Counted alive before the stop flag is read, as stop_submissions() sets
  // the flag before wait_idle() reads the count: either this submit sees the
  // flag, or the destructor waits for this job (it could otherwise spawn a
  // job actor after the device actors stopped, and the actor system would
  // wait for it forever).
  // Two counts: the job's (its actor's job_gone(), or the early returns
  // below) and this call's own, held until it returns, so that no teardown
  // runs while it still spawns a spare job actor after sending the job.
  alive_.fetch_add(2);
  struct call_count {
    runtime_core* core;
    ~call_count() { core->job_gone(); }
  } const this_call{this};
  if (stopped_ || stopping_) {
    job_gone();
    ss->fulfil(error{errc::shutting_down, "runtime is stopping: it takes no new jobs"}, job_state::failed);
    return j;
  }
  const std::shared_ptr<const loaded_plan>* here = loaded_here(p);
  if (!here) {
    job_gone();
    ss->fulfil(error{errc::invalid_argument, "submit: the plan was not compiled by this runtime"}, job_state::failed);
    return j;
  }
  if (auto e = check_inputs(p->source(), inputs)) {
    job_gone();
    ss->fulfil(std::move(e), job_state::failed);
    return j;
  }
  const auto& lp = *here;
  if (auto e = check_state_slot(*lp, options.state_slot)) {
    job_gone();
    ss->fulfil(std::move(e), job_state::failed);
    return j;
  }
  in_flight_.fetch_add(1);
  auto ctx = make_job_context(this, ss, lp, p, std::move(inputs), options.state_slot);
  AG_HOP_PROBE(context_made, ss->id);
  const auto& used = lp->program->used_devices();
  // A job of a state slot takes its turn on the slot in submission order:
  // at once when the slot is free, else after the slot's earlier jobs (its
  // actor then asks for arenas when msg::slot_atom says its turn came).
  // Spawned under the slot table's lock, so no turn can come before the
  // actor exists; the actor starts lazily (on its first message), so its
  // context is finished here, before anything is sent to it.
  bool its_turn = true, started = false, took_spare = false;
  error dead;
  auto spawn = [&](bool now) {
    its_turn = now;
    ctx->start = used.empty() ? job_start::no_devices : now ? job_start::asked : job_start::waiting_slot;
    // A spare actor when there is one (not for a plan without devices: a
    // spare starts on a message only), else CAF's spawn here.
    std::optional<spare_job_actor> spare;
    if (!used.empty()) {
      std::lock_guard<std::mutex> lk(spares_m_);
      if (!spares_.empty()) {
        spare = std::move(spares_.back());
        spares_.pop_back();
      }
    }
    took_spare = spare.has_value();
    caf::actor a = spare ? bind_spare_job_actor(std::move(*spare), ss, ctx) : spawn_job_actor(sys_, this, ss, ctx);
    ctx->job_actor = a;
    AG_HOP_PROBE(actor_bound, ss->id);
    {
      // cancel() must be able to reach the actor before it first runs.
      std::lock_guard<std::mutex> lk(ss->m);
      ss->actor = a;
    }
    // Start on submit: with every arena free the job is readied here, and
    // ctx->start settled, before registering makes it reachable (a device
    // fault reaches registered jobs' actors).
    if (now && !used.empty() && opts_.start_jobs_on_submit) started = take_arenas_now(*ctx);
    // Registered before anything can run it (device_down finds it there); a
    // device that died already fails the job. (A job on no device has
    // nothing to fail, and its actor may have finished already.)
    if (!used.empty()) dead = jobs().add(ss->id, a, lp);
    AG_HOP_PROBE(registered, ss->id);
    if (dead && !started) ctx->start = job_start::failing;
    return a;
  };
  caf::actor ja = options.state_slot >= 0 ? lp->slots->acquire(options.state_slot, ss->id, lp->stream_key, spawn) : spawn(true);
  if (dead) {
    // A readied job (job_start::running) is cancelled on its queues by its
    // actor, which then releases its arenas; it was never sent.
    caf::anon_send(ja, msg::fail_job{std::move(dead)});
  } else if (started) {
    start_from_submit(*ctx);
    AG_HOP_PROBE(run_job_sent, ss->id);
  } else if (its_turn && !used.empty()) {
    // The first arena request goes out from here, not from the job actor:
    // CAF starts freshly spawned actors in no particular order (work
    // stealing runs the newest first), so jobs would queue for their first
    // device out of submission order. Sent from the submitting thread, the
    // requests of one thread reach the device in submission order (FIFO
    // back-pressure).
    lp->memory[static_cast<std::size_t>(used.front())]->note_request();
    caf::anon_send(device_actors_[static_cast<std::size_t>(used.front())],
                   msg::acquire_arena{lp->key, ss->id, ja, ctx->expected_lane});
  }
  if (options.deadline.count() > 0) {
    // The job actor fails the job as a cancel would (begin_fail), in any
    // phase; after the job finished the message finds no actor.
    const double ms = static_cast<double>(options.deadline.count()) / 1e6;
    char text[96];
    std::snprintf(text, sizeof text, "job %llu passed its deadline (%.3f ms after submission)",
                  static_cast<unsigned long long>(ss->id), ms);
    caf::delayed_anon_send(ja, options.deadline, msg::fail_job{error{errc::timeout, text}});
  }
  if (took_spare) {
    // The replacement, now that the job is on its way: CAF's spawn costs
    // the submitting thread its microseconds after the job's first message,
    // not before it. Not once shutdown() dismissed the spares.
    spare_job_actor fresh = spawn_spare_job_actor(sys_, this);
    std::unique_lock<std::mutex> lk(spares_m_);
    if (!stopped_.load()) {
      spares_.push_back(std::move(fresh));
    } else {
      lk.unlock();
      caf::anon_send_exit(fresh.actor, caf::exit_reason::user_shutdown);
    }
  }
  return j;
}

std::vector<caf::actor> runtime_core::exec_actors() {
  std::lock_guard<std::mutex> lk(lanes_m_);
  std::vector<caf::actor> r;
  for (const auto& v : lanes_) r.insert(r.end(), v.begin(), v.end());
  for (const auto& arr : copy_actors_) r.insert(r.end(), arr.begin(), arr.end());
  for (const auto& v : comm_actors_)
    for (const auto& a : v)
      if (a) r.push_back(a);
  return r;
}

std::shared_ptr<const loaded_plan> runtime_core::loaded(const std::shared_ptr<const plan>& p) {
  const plan_deleter* d = p ? std::get_deleter<plan_deleter>(p) : nullptr;
  return d ? d->lp : nullptr;
}

const std::shared_ptr<const loaded_plan>* runtime_core::loaded_here(const std::shared_ptr<const plan>& p) const {
  const plan_deleter* d = p ? std::get_deleter<plan_deleter>(p) : nullptr;
  return d && d->live == live_ ? &d->lp : nullptr;
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

void replay_counters::note(replay_outcome o, const std::string& why) {
  switch (o) {
    case replay_outcome::plain: plain_.fetch_add(1, std::memory_order_relaxed); break;
    case replay_outcome::captured: captured_.fetch_add(1, std::memory_order_relaxed); break;
    case replay_outcome::replayed: replayed_.fetch_add(1, std::memory_order_relaxed); break;
    case replay_outcome::fallback:
      fallbacks_.fetch_add(1, std::memory_order_relaxed);
      if (!why.empty()) {
        std::lock_guard<std::mutex> lk(why_m_);
        last_fallback_ = why;
      }
      break;
    case replay_outcome::none: break;
  }
}

replay_stats replay_counters::read() const {
  replay_stats r;
  r.plain = plain_.load(std::memory_order_relaxed);
  r.captured = captured_.load(std::memory_order_relaxed);
  r.replayed = replayed_.load(std::memory_order_relaxed);
  r.fallbacks = fallbacks_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(why_m_);
  r.last_fallback = last_fallback_;
  return r;
}

trace runtime_core::take_trace() {
  trace t;
  for (const auto& s : specs_) t.device_names.push_back(s.name);
  t.records = trace_.take(&t.dropped_records);
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
  {
    // Unbound spares quit on this, their first message (spare_job_actor_fn).
    std::lock_guard<std::mutex> lk(spares_m_);
    for (auto& sp : spares_) stop(sp.actor);
    spares_.clear();
  }
  std::lock_guard<std::mutex> lk(lanes_m_);
  for (auto& v : lanes_)
    for (auto& a : v) stop(a);
  for (auto& arr : copy_actors_)
    for (auto& a : arr) stop(a);
  for (auto& v : comm_actors_)
    for (auto& a : v) stop(a);
}

}  // namespace ag::actors
