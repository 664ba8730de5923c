#include "actors/stream_actor.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/collective_order.hpp"
#include "actors/hop_probe.hpp"
#include "actors/job_actor.hpp"
#include "actors/job_context.hpp"
#include "actors/runtime_core.hpp"
#include "messages/atoms.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

namespace {

/// A job's queue on this actor: an actor may run several queues of one
/// program (a device's compute lanes share one actor).
struct job_key {
  uint64_t job = 0;
  int queue = -1;
  bool operator==(const job_key&) const noexcept = default;
};
struct job_key_hash {
  std::size_t operator()(const job_key& k) const noexcept {
    return std::hash<uint64_t>{}(k.job * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(k.queue));
  }
};

/// A stream of this actor: one per lane it serves (copy engines: lane 0).
struct lane_stream {
  std::unique_ptr<gpu::stream> stream;  // null when create_stream failed
  error err;                            // why it failed
};

/// One job's queue as seen by one executing actor.
struct exec_job {
  msg::job_ref_ptr ref;                 // keeps the job alive while it is here
  const job_context* ctx = nullptr;     // == &job_of(*ref)
  int queue = -1;                       // the queue this actor runs for the job's program
  int next = 0;                         // position of the next step to launch
  std::vector<int> waiting;             // remote deps not yet ready, by position
  gpu::op_launch* launches = nullptr;   // this actor's records of the queue (exec_state::scratch)
  // No run_job is still to come: it arrived, or this queue gets none (its
  // first step waits for a remote dep, so a ready message starts it).
  bool got_run = false;
  // A launch failed here, or the job was cancelled: ignore its messages
  // until cancel_job (which always follows) forgets it.
  bool dropped = false;
  // The step at `next` was tried and its launch failed (it counts as issued).
  bool failed = false;
  // The job was cancelled or failed and this queue still owes the paired
  // collective parts it had not issued (issue_owed_parts): it issues them,
  // with no waits, in its turn on the line, then ends its turn.
  bool owing = false;
};

/// A job being cancelled on this actor while some of its queues here still
/// owe paired parts: its cancel_acks wait for them.
struct owed_cancel {
  int owing_queues = 0;  // queues of the job here still owing parts
  int acks = 0;          // cancel_job messages answered once they are issued
};

/// Graph replay of one segment (launch_program.hpp's lowered_step::replay_*)
/// on this actor: one graph per set of job buffers.
struct replay_entry {
  /// Ran once plainly here: the stream's per-stream resources (cuBLAS handle
  /// and workspace) exist, so a capture allocates nothing outside the graph.
  bool seen = false;
  bool refused = false;  ///< the device refused a capture: plain launches from now on
  /// Some op of the segment reads or writes the state region: its graphs are
  /// per state slot too (else the slot is not part of the key).
  bool uses_state = false;
  struct captured {
    const std::byte* arena = nullptr;    ///< the job's arena base on this device
    const std::byte* weights = nullptr;  ///< the plan's weights base on this device
    const std::byte* state = nullptr;    ///< the job's state slot on this device (nullptr: none)
    /// In-stream collective parts read the other members' operands: the
    /// job's arena base on every device of the plan (empty otherwise).
    std::vector<const std::byte*> peers;
    std::unique_ptr<gpu::replay_graph> graph;
  };
  std::vector<captured> graphs;
};
/// Graphs kept per segment: one per arena of the plan on this device
/// (runtime_options::arenas_per_device, 8 by default) and state slot; a job
/// whose buffers find no graph once the limit is reached runs plainly.
constexpr std::size_t max_graphs_per_segment = 64;
/// A launched step under the stall watch (stall_watch, stream_actor.hpp).
struct watched_step {
  std::shared_ptr<const loaded_plan> lp;  // its program: label and estimate for the report
  step_id step = -1;
  std::shared_ptr<gpu::event> end;        // held: the pool cannot reuse it while watched
  std::vector<std::shared_ptr<gpu::event>> deps;  // remote deps' end events
  int64_t limit_ns = 0;
  int64_t since_ns = -1;  // actor clock when first seen running; -1: not yet
  bool reported = false;
};

struct exec_state {
  gpu::device_ptr dev;
  int device = -1;
  step_kind kind = step_kind::compute;
  // By (loaded plan key, first step of the segment). Declared before the
  // streams so that it is destroyed after them: a stream drains its work
  // when destroyed, and a graph must not be destroyed while it runs.
  std::unordered_map<job_key, replay_entry, job_key_hash> replays;
  // Capture lanes 1.. of folded queues' graphs (device::capture_lanes), by
  // capture lane, made on the first capture that needs them: nothing is
  // enqueued on them, only the kernels of the graphs' branches use their
  // resources (cuBLAS workspace, attention counters), so they serve those
  // graphs alone, which all replay on lane 0's stream one after another.
  // Declared before `streams`: destroyed after them, once the graphs that
  // use their resources drained with lane 0's stream.
  std::vector<lane_stream> fold_streams;
  // By lane, made on the first step of that lane (lane 0 at spawn).
  std::vector<lane_stream> streams;
  using job_map = std::unordered_map<job_key, exec_job, job_key_hash>;
  job_map jobs;
  // Map nodes of finished jobs, kept for the next jobs: a node and its
  // `waiting` vector are reused, so taking a job allocates nothing once the
  // actor has seen as many jobs in flight as it will see.
  std::vector<job_map::node_type> spare;
  // By (loaded plan key, queue): this actor's copy of the queue's launch
  // records (launch_program::launch_records), made on the plan's first job
  // here and dropped on unload_plan. Only the data pointers are written, per job.
  std::unordered_map<job_key, std::vector<gpu::op_launch>, job_key_hash> scratch;
  // Event pools (timing and plain). An event is reused only when the pool
  // holds its last reference (no job context names it) and it completed.
  std::vector<std::shared_ptr<gpu::event>> pool[2];
  std::size_t cursor[2] = {0, 0};
  // The agreed issue order of each of its issue lines (collective_order.hpp),
  // by stream lane: every plan's ordered queues (launch_queue::in_job_order)
  // on that lane take their turns there, dealt by the runtime's issue_lines.
  // An actor may run several lines (a device's compute lanes); each counts
  // its own turns. Kept across plans: a line's turns outlive any one plan.
  std::unordered_map<int, collective_issue_order<job_key>> order;
  // By job id: cancelled jobs whose queues here still owe paired parts.
  std::unordered_map<uint64_t, owed_cancel> owed;
  std::vector<std::vector<step_id>> out;  // ready batch per consumer queue
  std::vector<int> touched;
  std::vector<int> local;  // consumer queues of the job run by this actor itself (advance)
  stall_watch stall;
  // By lane: launched steps not known to be finished, in stream order.
  std::vector<std::deque<watched_step>> watch;
  bool check_armed = false;  // a stall_atom is on its way

  static constexpr const char* name = "ag.exec";
};

using exec_actor_t = caf::stateful_actor<exec_state>;

/// AG_DEBUG_COLLECTIVE_ORDER=1 (a diagnostic switch): every ordered queue
/// reports on stderr when a job waits for its turn, gets it, and launches
/// an in-stream part or a segment holding some, so a hang's log shows which
/// member's host never enqueued what.
bool order_log_on() {
  static const bool on = [] {
    const char* v = std::getenv("AG_DEBUG_COLLECTIVE_ORDER");
    return v && v[0] == '1';
  }();
  return on;
}
/// `seq`: the job's turn on the line where it waits or finishes its turn,
/// else its runtime-wide draw number (job_context::collective_seq).
void order_log(const exec_state& st, const char* what, uint64_t job, uint64_t seq, long long extra) {
  std::fprintf(stderr, "[order %lld us] %s %s: job %llu seq %llu %s %lld\n",
               static_cast<long long>(gpu::host_clock_ns() / 1000), st.dev->spec().name.c_str(), to_string(st.kind),
               static_cast<unsigned long long>(job), static_cast<unsigned long long>(seq), what, extra);
}

/// Stream `lane` of `streams` (of kind `kind`), made on first use; null
/// with `err` set when the device refused it (every later call for that
/// lane then fails with the same error).
gpu::stream* lazy_stream(exec_state& st, std::vector<lane_stream>& streams, int lane, step_kind kind,
                         const error** err) {
  if (streams.size() <= static_cast<std::size_t>(lane)) streams.resize(static_cast<std::size_t>(lane) + 1);
  auto& ls = streams[static_cast<std::size_t>(lane)];
  if (!ls.stream && !ls.err) {
    if (auto s = st.dev->create_stream(kind)) ls.stream = std::move(*s);
    else ls.err = s.err();
  }
  *err = &ls.err;
  return ls.stream.get();
}

/// The stream of `lane` (every step of that lane fails with its error when
/// the device refused it).
gpu::stream* stream_of(exec_state& st, int lane, const error** err) {
  return lazy_stream(st, st.streams, lane, st.kind, err);
}

/// The capture stream of lane `lane` (>= 1) of folded graphs (exec_state::
/// fold_streams).
gpu::stream* fold_stream_of(exec_state& st, int lane, const error** err) {
  return lazy_stream(st, st.fold_streams, lane, step_kind::compute, err);
}

expected<std::shared_ptr<gpu::event>> take_event(exec_state& st, bool timing) {
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
  auto fresh = st.dev->create_event(timing);
  if (!fresh) return fresh.err();
  pool.push_back(std::shared_ptr<gpu::event>(std::move(*fresh)));
  return pool.back();
}

/// The job's error for a failure of step `ls` on this actor: names device,
/// step (queue and label) and, where one is concerned, the op; keeps the
/// cause's code and any field the cause set itself.
error step_error(const exec_state& st, int lane, const lowered_step& ls, const std::string& what, const error& cause,
                 const node* op = nullptr) {
  std::string m = "device '" + st.dev->spec().name + "' step " + std::to_string(ls.id) + " (" + lane_name(st.kind, lane);
  if (!ls.label.empty()) m += ", " + ls.label;
  m += ")";
  if (op) m += " op '" + op->name + "' (" + to_string(op->op) + ")";
  if (!what.empty()) m += " " + what;
  m += ": " + cause.message;
  const node* subject = op ? op : ls.subject;
  error r{cause.code, std::move(m), cause.device >= 0 ? cause.device : st.device, ls.id,
          cause.op.empty() && subject ? subject->name : cause.op};
  return r;
}

/// Enqueues step `s` of `e`'s job on the actor's stream: waits for its
/// remote deps' end events, its work, its end event; a host notification
/// for completion steps; and queues the ready messages for its consumers.
/// Returns the job's error when the device refuses any of it.
/// Region bases of a job on this actor's device, by region (arena,
/// weights, the job's state slot).
struct region_bases {
  std::byte* base[3] = {nullptr, nullptr, nullptr};
  std::byte* window = nullptr;  // the arena's host window (operand::in_window)
  const job_context* job = nullptr;  // for operands on other devices (in-stream collective parts)
  region_bases(const exec_state& st, const job_context& ctx) : job(&ctx) {
    static_assert(static_cast<int>(region::arena) == 0 && static_cast<int>(region::weights) == 1 &&
                  static_cast<int>(region::state) == 2);
    const bool has_arena = ctx.arenas[static_cast<std::size_t>(st.device)] >= 0;
    base[0] = has_arena ? ctx.base(region::arena, st.device) : nullptr;
    base[1] = ctx.base(region::weights, st.device);
    base[2] = ctx.base(region::state, st.device);
    if (has_arena) window = ctx.window(st.device);
  }
  void* at(const operand& a) const {
    if (a.in_window) return window + a.byte_offset;
    if (a.device >= 0) return job->base(a.where, a.device) + a.byte_offset;
    return base[static_cast<int>(a.where)] + a.byte_offset;
  }
  /// Writes the job's buffers into the launch records of compute step `ls`.
  void patch(const lowered_step& ls, gpu::op_launch* rec) const {
    for (std::size_t k = 0; k < ls.ops.size(); ++k) {
      const lowered_op& op = ls.ops[k];
      rec[k].out.data = at(op.out);
      for (std::size_t i = 0; i < op.inputs.size(); ++i) rec[k].inputs[i].data = at(op.inputs[i]);
      for (std::size_t i = 0; i < op.extra_outs.size(); ++i) rec[k].extra_outs[i].data = at(op.extra_outs[i]);
    }
  }
};

/// A step's prologue on `stream`: waits for its remote deps' end events
/// (but those in `paired`: a collective part whose backend pairs the
/// members on the device skips the deps another member's part orders
/// before it joins) and, when timing, its start event.
error begin_step(exec_state& st, const job_context& ctx, const lowered_step& ls, int lane, gpu::stream& stream,
                 const std::vector<step_id>* paired = nullptr) {
  auto& slot = ctx.slots[static_cast<std::size_t>(ls.id)];
  if (ctx.timing) slot.enqueue_ns = gpu::host_clock_ns();
  for (step_id d : ls.remote_deps) {
    const auto& ev = ctx.slots[static_cast<std::size_t>(d)].end;
    if (!ev) continue;
    if (paired && std::find(paired->begin(), paired->end(), d) != paired->end()) continue;
    if (error err = st.dev->wait(stream, *ev)) return step_error(st, lane, ls, "waiting for step " + std::to_string(d), err);
  }
  // A step absorbed into a decode-step record launches nothing: no timing
  // events (the trace leaves it out), only what its consumers wait for.
  if (ctx.timing && ls.absorbed_into < 0) {
    auto ev = take_event(st, true);
    if (!ev) return step_error(st, lane, ls, "creating its start event", ev.err());
    slot.start = std::move(*ev);
    if (error err = st.dev->record(*slot.start, stream)) return step_error(st, lane, ls, "recording its start", err);
  }
  return {};
}

/// What a completion step's notification runs on the backend's thread once
/// the step's work is done: it settles the job (complete_from_backend) and
/// tells the job actor. `keep` holds the job context until then. A
/// notification that cannot be registered arrives as its error (device.hpp).
std::function<void(const error&)> completion_callback(const job_context& ctx, step_id step) {
  return [keep = ctx.shared_from_this(), step](const error& notified) {
    // A dead device upstream let this step run on unwritten values
    // (dead_device_error, job_actor.hpp): the job fails with its death.
    // So does an in-stream collective part that gave up waiting.
    AG_HOP_PROBE(poller_saw_it, keep->id());
    error ne = notified ? notified : dead_device_error(*keep);
    if (!ne) ne = in_stream_fault(*keep);
    if (!ne) complete_from_backend(*keep);
    AG_HOP_PROBE(fulfilled, keep->id());
    caf::anon_send(keep->job_actor, msg::step_done{keep->id(), step, ne});
  };
}

/// A step's epilogue on `stream` once its work is enqueued: its end event
/// (when `record_end`), a host notification for completion steps, and the
/// ready messages for its consumers (batched in st.out).
/// `segment_start`: the slot of a replayed segment's first step, which
/// the trace shows as the segment's record: it gets this (the segment's
/// last) step's end event too, before the notification that may collect
/// the trace.
error end_step(exec_state& st, const job_context& ctx, const lowered_step& ls, int lane, gpu::stream& stream,
               bool record_end, step_slot* segment_start = nullptr) {
  auto& slot = ctx.slots[static_cast<std::size_t>(ls.id)];
  if (record_end) {
    auto end = take_event(st, ctx.timing);
    if (!end) return step_error(st, lane, ls, "creating its end event", end.err());
    slot.end = std::move(*end);
    if (error re = st.dev->record(*slot.end, stream)) return step_error(st, lane, ls, "recording its end", re);
    if (segment_start) segment_start->end = slot.end;
  }
  if (ls.completion) {
    AG_HOP_PROBE(notify_called, ctx.id());
    st.dev->notify(stream, completion_callback(ctx, ls.id));
  }
  for (int q : ls.consumer_queues) {
    auto& v = st.out[static_cast<std::size_t>(q)];
    if (v.empty()) st.touched.push_back(q);
    v.push_back(ls.id);
  }
  return {};
}

/// The backend's description of collective part `ls` of the job `ctx` on
/// `device`: its output, every member's operand where it lives, the members.
gpu::collective_launch collective_part(const job_context& ctx, const lowered_step& ls, int device) {
  const collective_desc& c = ls.coll;
  gpu::collective_launch l;
  l.op = ls.subject;
  l.rank = c.rank;
  l.algo = c.algo;
  l.bytes = c.bytes;
  l.communicator = ctx.job_lane;  // each job lane's collectives on a communicator of their own
  // Aliases the job context: the flag (and the job) live while the part does.
  l.cancelled = std::shared_ptr<const std::atomic<bool>>(ctx.shared_from_this(), &ctx.cancelled);
  l.out = c.out.proto;
  l.out.data = ctx.base(c.out.where, device) + c.out.byte_offset;
  l.inputs.reserve(c.inputs.size());
  l.members.reserve(c.inputs.size());
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    const int dev = c.member_devices[k];
    gpu::tensor_arg a = c.inputs[k].proto;
    a.data = ctx.base(c.inputs[k].where, dev) + c.inputs[k].byte_offset;
    l.inputs.push_back(std::move(a));
    l.members.push_back(ctx.lp->memory[static_cast<std::size_t>(dev)]->dev.get());
    if (!ctx.generations.empty()) l.generations.push_back(ctx.generations[static_cast<std::size_t>(dev)]);
  }
  return l;
}

/// An in-stream collective part: launched like a compute step's kernel, under
/// the job's tag (device::set_collective_tag).
bool in_stream_step(const lowered_step& ls) {
  return ls.kind == step_kind::collective && ls.coll.algo == collective_algo::in_stream;
}

error launch_step(exec_state& st, exec_job& e, step_id s) {
  const job_context& ctx = *e.ctx;
  const launch_program& prog = ctx.program();
  const lowered_step& ls = prog.steps()[static_cast<std::size_t>(s)];
  const int lane = ctx.lane_of(ls.queue);
  const error* stream_err = nullptr;
  gpu::stream* sp = stream_of(st, lane, &stream_err);
  if (!sp) return step_error(st, lane, ls, "has no stream", *stream_err);
  gpu::stream& stream = *sp;
  // A collective part is described first: whether its backend pairs the
  // members on the device decides which waits its prologue enqueues.
  gpu::collective_launch coll;
  const std::vector<step_id>* paired = nullptr;
  const bool in_stream = in_stream_step(ls);
  // A part absorbed into a decode-step record (lowered_step::absorbed_into)
  // keeps its waits and events but issues nothing.
  const bool absorbed = ls.absorbed_into >= 0;
  if (ls.kind == step_kind::collective && !in_stream && !absorbed) {
    coll = collective_part(ctx, ls, st.device);
    if (!ls.coll.peer_ordered_deps.empty() && st.dev->collective_syncs_members(coll)) paired = &ls.coll.peer_ordered_deps;
  }
  if (error err = begin_step(st, ctx, ls, lane, stream, paired)) return err;
  error err;
  // The executor: one case per step kind (the lowering's other half,
  // launch_program.cpp's lower_step).
  switch (ls.kind) {
    case step_kind::compute: {
      gpu::op_launch* rec = e.launches + ls.first_launch;
      region_bases(st, ctx).patch(ls, rec);
      // A tensor-parallel decode step's ranks meet on the devices under the job's tag.
      if (ls.job_tag)
        if (error te = st.dev->set_collective_tag(stream, ctx.id())) return step_error(st, lane, ls, {}, te, ls.ops[0].op);
      for (std::size_t k = 0; k < ls.ops.size(); ++k)
        if (error le = st.dev->launch(stream, rec[k])) return step_error(st, lane, ls, {}, le, ls.ops[k].op);
      break;
    }
    case step_kind::copy_h2d: {
      const copy_desc& c = ls.copy;
      if (c.in_place) break;  // its readers read the window itself
      void* dst = ctx.base(c.dst.where, st.device) + c.dst.byte_offset;
      const std::byte* src =
          c.window_offset >= 0 ? ctx.window_of(ls) : ctx.inputs[static_cast<std::size_t>(c.io_index)].data();
      err = st.dev->copy_h2d(stream, dst, src, c.bytes);
      break;
    }
    case step_kind::copy_d2h: {
      const copy_desc& c = ls.copy;
      if (c.in_place) break;  // its producer wrote the window itself
      const void* src = ctx.base(c.src.where, st.device) + c.src.byte_offset;
      auto& host = c.gather ? ctx.staging[static_cast<std::size_t>(c.io_index)]
                            : ctx.outputs[static_cast<std::size_t>(c.io_index)];
      if (c.window_offset >= 0)
        err = st.dev->copy_d2h(stream, ctx.window_of(ls), src, c.bytes);
      else if (c.host_blocks > 1)
        err = st.dev->copy_d2h_blocks(stream, host.data() + c.host_offset, c.host_pitch, src,
                                      c.bytes / c.host_blocks, c.host_blocks);
      else
        err = st.dev->copy_d2h(stream, host.data() + c.host_offset, src, c.bytes);
      break;
    }
    case step_kind::copy_peer: {
      const copy_desc& c = ls.copy;
      void* dst = ctx.base(c.dst.where, st.device) + c.dst.byte_offset;
      const void* src = ctx.base(c.src.where, c.src_device) + c.src.byte_offset;
      auto& src_dev = *ctx.lp->memory[static_cast<std::size_t>(c.src_device)]->dev;
      err = st.dev->copy_peer(stream, dst, src_dev, src, c.bytes);
      break;
    }
    case step_kind::collective: {
      if (absorbed) break;  // the decode-step record's kernels exchange it
      if (in_stream) {
        // Its record is the queue's next; the members meet on the devices.
        gpu::op_launch* rec = e.launches + ls.first_launch;
        region_bases(st, ctx).patch(ls, rec);
        if (error te = st.dev->set_collective_tag(stream, ctx.id())) return step_error(st, lane, ls, {}, te, ls.subject);
        if (order_log_on()) order_log(st, "launches its in-stream part, step", ctx.id(), ctx.collective_seq, ls.id);
        if (error le = st.dev->launch(stream, rec[0])) return step_error(st, lane, ls, {}, le, ls.subject);
        break;
      }
      // This member's part (collective_part, above): the remote deps, or the
      // backend's pairing, waited for all the operands' producers.
      if (error ce = st.dev->collective(stream, coll)) return step_error(st, lane, ls, {}, ce, ls.subject);
      break;
    }
  }
  if (err) return step_error(st, lane, ls, {}, err);
  // The end event is read by the waits of consumers on other queues and by
  // the trace; a step with neither (the last of a chain on one queue, a
  // decode step's tail) records none: one event record fewer per step.
  const bool timed = ctx.timing && ls.absorbed_into < 0;
  return end_step(st, ctx, ls, lane, stream, timed || !ls.consumer_queues.empty() || st.stall.factor > 0);
}

/// The graph of `entry` for the job's buffers `b`, capturing it now when it
/// has none yet (nullptr: run plainly; `outcome` says why).
/// `capture()` captures the segment (called only when capturing).
template <typename Capture>
gpu::replay_graph* graph_for(replay_entry& entry, const region_bases& b, const Capture& capture,
                             replay_outcome& outcome, std::string& why, const std::vector<const std::byte*>& peers) {
  if (!entry.seen || entry.refused) {
    outcome = entry.refused ? replay_outcome::fallback : replay_outcome::plain;
    entry.seen = true;
    return nullptr;
  }
  for (auto& c : entry.graphs)
    if (c.arena == b.base[0] && c.weights == b.base[1] && c.state == (entry.uses_state ? b.base[2] : nullptr) &&
        c.peers == peers) {
      outcome = replay_outcome::replayed;
      return c.graph.get();
    }
  if (entry.graphs.size() >= max_graphs_per_segment) {
    outcome = replay_outcome::plain;
    return nullptr;
  }
  auto g = capture();
  if (!g) {
    entry.refused = true;
    outcome = replay_outcome::fallback;
    why = g.err().message;
    return nullptr;
  }
  outcome = replay_outcome::captured;
  entry.graphs.push_back({b.base[0], b.base[1], entry.uses_state ? b.base[2] : nullptr, peers, std::move(*g)});
  return entry.graphs.back().graph.get();
}

/// The ops of the replay segment of `n` steps (`step_at(i)`) of `e`'s job,
/// in queue order, into `ops`: each step's kernels, or its host copy
/// (through the arena's host window). In a folded queue's segment each op
/// runs on its step's capture lane, and a step's first op follows the ops
/// of its segment deps on other lanes (segment_op::after, indices kept in
/// `after`); a step with no op (views only, a copy in place) passes its
/// own predecessors on to the steps that depend on it.
template <typename StepAt>
void segment_ops_on_lanes(const exec_state& st, const job_context& ctx, const exec_job& e, int n, const StepAt& step_at,
                          std::vector<gpu::segment_op>& ops, std::vector<int32_t>& after) {
  const bool lanes = step_at(0).replay_lanes > 1;
  // By segment position: the ops that whatever depends on the step must follow.
  thread_local std::vector<std::vector<int32_t>> frontier;
  thread_local std::vector<int32_t> last_on_lane, waits;
  thread_local std::vector<std::pair<std::size_t, std::size_t>> after_range;  // by op: (start, count) in `after`
  frontier.assign(static_cast<std::size_t>(n), {});
  last_on_lane.assign(static_cast<std::size_t>(step_at(0).replay_lanes), -1);
  after_range.clear();
  const auto position = [&](step_id s) {
    for (int j = 0; j < n; ++j)
      if (step_at(j).id == s) return j;
    return -1;
  };
  for (int i = 0; i < n; ++i) {
    const lowered_step& ls = step_at(i);
    const int lane = lanes ? ls.capture_lane : 0;
    waits.clear();
    for (step_id d : ls.segment_deps) {
      const int j = position(d);
      if (j < 0) continue;
      for (int32_t o : frontier[static_cast<std::size_t>(j)])
        if (ops[static_cast<std::size_t>(o)].lane != lane) waits.push_back(o);
    }
    std::sort(waits.begin(), waits.end());
    waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
    const std::size_t first_op = ops.size();
    const copy_desc& c = ls.copy;
    if (c.in_place) {
      // nothing to move: its kernels use the window
    } else if (ls.kind == step_kind::copy_h2d) {
      ops.push_back({gpu::segment_op::kind::copy_h2d, nullptr, ctx.base(c.dst.where, st.device) + c.dst.byte_offset,
                     ctx.window_of(ls), c.bytes});
    } else if (ls.kind == step_kind::copy_d2h) {
      ops.push_back({gpu::segment_op::kind::copy_d2h, nullptr, ctx.window_of(ls),
                     ctx.base(c.src.where, st.device) + c.src.byte_offset, c.bytes});
    } else {
      for (std::size_t k = 0; k < ls.ops.size(); ++k)
        ops.push_back({gpu::segment_op::kind::launch, e.launches + ls.first_launch + k, nullptr, nullptr, 0});
    }
    after_range.resize(ops.size(), {0, 0});
    for (std::size_t k = first_op; k < ops.size(); ++k) ops[k].lane = lane;
    auto& mine = frontier[static_cast<std::size_t>(i)];
    if (ops.size() > first_op) {
      after_range[first_op] = {after.size(), waits.size()};
      after.insert(after.end(), waits.begin(), waits.end());
      last_on_lane[static_cast<std::size_t>(lane)] = static_cast<int32_t>(ops.size() - 1);
      mine.push_back(static_cast<int32_t>(ops.size() - 1));
    } else {
      // Its dependents follow what it followed: its deps' ops on every lane
      // and its own lane's ops before it.
      for (step_id d : ls.segment_deps)
        if (const int j = position(d); j >= 0)
          mine.insert(mine.end(), frontier[static_cast<std::size_t>(j)].begin(), frontier[static_cast<std::size_t>(j)].end());
      if (last_on_lane[static_cast<std::size_t>(lane)] >= 0) mine.push_back(last_on_lane[static_cast<std::size_t>(lane)]);
    }
  }
  // `after` no longer grows: point the ops into it.
  for (std::size_t k = 0; k < ops.size(); ++k)
    if (after_range[k].second > 0) {
      ops[k].after = after.data() + after_range[k].first;
      ops[k].after_count = static_cast<int>(after_range[k].second);
    }
}

/// Whether the replay segment of `n` steps from `first` is the tail of its
/// job's work on its queue, with only its last step's notification to
/// issue after the graph: no step feeds another queue (no end event to
/// record), only the last is a completion step, no trace (its records need
/// end events) and no in-stream parts (whose launch order across the
/// members the actors keep: collective_order.hpp).
template <typename StepAt>
bool ends_its_work_here(const job_context& ctx, const lowered_step& first, int n, const StepAt& step_at) {
  if (ctx.timing || first.replay_in_stream) return false;
  for (int i = 0; i < n; ++i) {
    const lowered_step& ls = step_at(i);
    if (!ls.consumer_queues.empty() || ls.completion != (i + 1 == n)) return false;
  }
  return true;
}

/// Launches the replay segment that starts at step `s` of `e` (its
/// lowered_step::replay_steps steps, which have no remote deps but the
/// first's, in queue order) as one graph where the device captures: the
/// first run here and a refused capture launch its steps one by one
/// instead. Returns the number of steps launched, or the job's error.
expected<int> launch_segment(exec_state& st, exec_job& e, step_id s) {
  const job_context& ctx = *e.ctx;
  const launch_program& prog = ctx.program();
  const lowered_step& first = prog.steps()[static_cast<std::size_t>(s)];
  const launch_queue& q = prog.queues()[static_cast<std::size_t>(first.queue)];
  const int lane = ctx.lane_of(first.queue);
  const int n = first.replay_steps;
  const error* stream_err = nullptr;
  gpu::stream* sp = stream_of(st, lane, &stream_err);
  if (!sp) return step_error(st, lane, first, "has no stream", *stream_err);
  gpu::stream& stream = *sp;
  const region_bases bases(st, ctx);
  const auto step_at = [&](int i) -> const lowered_step& {
    return prog.steps()[static_cast<std::size_t>(q.steps[static_cast<std::size_t>(first.pos + i)])];
  };
  // Per job lane too: a graph keeps its stream's resources (cuBLAS
  // workspace, attention counters), which another lane's stream must not
  // share while both run.
  replay_entry& entry =
      st.replays[job_key{ctx.lp->key, s + ctx.job_lane * static_cast<int>(prog.steps().size())}];
  if (!entry.seen)
    for (int i = 0; i < n; ++i)
      for (const lowered_op& op : step_at(i).ops) {
        entry.uses_state |= op.out.where == region::state;
        for (const operand& a : op.inputs) entry.uses_state |= a.where == region::state;
      }
  replay_outcome outcome = replay_outcome::plain;
  std::string why;
  // Pointers are patched before capture: a graph is keyed by the buffers it was captured with.
  for (int i = 0; i < n; ++i) bases.patch(step_at(i), e.launches + step_at(i).first_launch);
  // A segment with in-stream parts reads the other members' arenas too.
  thread_local std::vector<const std::byte*> peers;
  peers.clear();
  if (first.replay_in_stream)
    for (int d : prog.used_devices())
      peers.push_back(ctx.arenas[static_cast<std::size_t>(d)] >= 0 ? ctx.base(region::arena, d) : nullptr);
  // What the graph holds, in stream order: each step's kernels, or its
  // host copy (through the arena's host window); over several capture
  // lanes where the queue is folded (segment_ops_on_lanes).
  const auto capture = [&]() -> expected<std::unique_ptr<gpu::replay_graph>> {
    thread_local std::vector<gpu::segment_op> ops;
    thread_local std::vector<int32_t> after;
    ops.clear();
    after.clear();
    segment_ops_on_lanes(st, ctx, e, n, step_at, ops, after);
    if (first.replay_lanes <= 1) return st.dev->capture_segment(stream, ops.data(), ops.size());
    thread_local std::vector<gpu::stream*> lanes;
    lanes.assign(1, &stream);
    for (int l = 1; l < first.replay_lanes; ++l) {
      const error* fold_err = nullptr;
      gpu::stream* ls = fold_stream_of(st, l, &fold_err);
      if (!ls) return error(errc::unsupported_op, "no stream for capture lane " + std::to_string(l) + ": " + fold_err->message);
      lanes.push_back(ls);
    }
    return st.dev->capture_lanes(lanes.data(), first.replay_lanes, ops.data(), ops.size());
  };
  gpu::replay_graph* g = graph_for(entry, bases, capture, outcome, why, peers);
  AG_HOP_PROBE(graph_found, ctx.id());
  ctx.core->replays().note(outcome, why);
  // Set before any step of the segment is issued: a completion step's
  // notification may collect the trace, which reads it, at once.
  ctx.slots[static_cast<std::size_t>(s)].replay = outcome;
  if (!g) {
    // Kernel by kernel, each step with its own events and trace record.
    for (int i = 0; i < n; ++i)
      if (error err = launch_step(st, e, step_at(i).id)) return err;
    return n;
  }
  if (error err = begin_step(st, ctx, first, lane, stream)) return err;
  if (first.replay_in_stream) {
    if (error err = st.dev->set_collective_tag(stream, ctx.id())) return step_error(st, lane, first, {}, err);
    if (order_log_on()) order_log(st, "replays its in-stream segment from step", ctx.id(), ctx.collective_seq, s);
  }
  // The device names the op that failed (err.op) where it knows it: the
  // error then names its step and op, as a plain launch's would.
  const auto replay_failed = [&](const error& err) {
    const lowered_step* at = &first;
    const node* op = nullptr;
    for (int i = 0; i < n && !err.op.empty() && !op; ++i)
      for (const lowered_op& o : step_at(i).ops)
        if (o.op && o.op->name == err.op) {
          at = &step_at(i);
          op = o.op;
          break;
        }
    return step_error(st, lane, *at, "replaying its graph", err, op);
  };
  AG_HOP_PROBE(replay_called, ctx.id());
  if (ends_its_work_here(ctx, first, n, step_at)) {
    // Its launch and its notification are all that is left to issue: one
    // hand-over, which the backend may make from a thread of its own.
    const lowered_step& last = step_at(n - 1);
    if (error err = st.dev->replay_and_notify(stream, *g, completion_callback(ctx, last.id))) return replay_failed(err);
    AG_HOP_PROBE(notify_registered, ctx.id());
    return n;
  }
  if (error err = st.dev->replay(stream, *g)) return replay_failed(err);
  AG_HOP_PROBE(launched, ctx.id());
  auto& first_slot = ctx.slots[static_cast<std::size_t>(s)];
  for (int i = 0; i < n; ++i) {
    const lowered_step& ls = step_at(i);
    const bool last = i + 1 == n;
    // The trace shows the segment as one record on its first step.
    if (error err = end_step(st, ctx, ls, lane, stream, !ls.consumer_queues.empty() || (last && ctx.timing),
                             last && ctx.timing && n > 1 ? &first_slot : nullptr))
      return err;
  }
  AG_HOP_PROBE(notify_registered, ctx.id());
  return n;
}

std::vector<gpu::op_launch>& scratch_for(exec_state& st, const job_context& ctx, int queue) {
  auto [it, fresh] = st.scratch.try_emplace(job_key{ctx.lp->key, queue});
  if (fresh) {
    it->second = ctx.program().launch_records(queue);
    // In-stream collective parts name their members' devices (fixed per plan).
    for (gpu::op_launch& l : it->second)
      for (int k = 0; k < l.collective.members; ++k)
        l.collective.devices[static_cast<std::size_t>(k)] =
            ctx.lp->memory[static_cast<std::size_t>(l.collective.device_index[static_cast<std::size_t>(k)])]->dev.get();
  }
  return it->second;
}

exec_job& entry_for(exec_state& st, const msg::job_ref_ptr& ref, int queue) {
  const job_key id{ref->job_id(), queue};
  if (auto it = st.jobs.find(id); it != st.jobs.end()) return it->second;
  exec_state::job_map::iterator it;
  if (!st.spare.empty()) {
    auto node = std::move(st.spare.back());
    st.spare.pop_back();
    node.key() = id;
    it = st.jobs.insert(std::move(node)).position;
  } else {
    it = st.jobs.try_emplace(id).first;
  }
  exec_job& e = it->second;
  const job_context& ctx = job_of(*ref);
  e.ref = ref;
  e.ctx = &ctx;
  e.queue = queue;
  e.next = 0;
  e.dropped = false;
  e.failed = false;
  e.owing = false;
  const launch_queue& q = ctx.program().queues()[static_cast<std::size_t>(queue)];
  e.waiting.assign(q.remote_dep_counts.begin(), q.remote_dep_counts.end());  // keeps capacity
  e.got_run = !q.starts_itself;
  e.launches = scratch_for(st, ctx, queue).data();
  return e;
}

/// Forgets job queue `id`, keeping its map node for a later job (entry_for).
void forget_job(exec_state& st, job_key id) {
  auto node = st.jobs.extract(id);
  if (node.empty()) return;
  node.mapped().ref.reset();  // the job context may go now
  node.mapped().ctx = nullptr;
  // Bounded: at most one node per job this actor ever held at once.
  st.spare.push_back(std::move(node));
}

void advance(exec_actor_t* self, exec_job& e);

int64_t clock_ns(exec_actor_t* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

/// Drops the finished steps at the front of a lane's watch list.
void prune(std::deque<watched_step>& q) {
  while (!q.empty() && q.front().end->query()) q.pop_front();
}

void arm_stall_check(exec_actor_t* self) {
  auto& st = self->state;
  if (st.check_armed) return;
  st.check_armed = true;
  const auto period = std::chrono::nanoseconds(static_cast<int64_t>(st.stall.min_seconds * 0.5e9));
  self->delayed_send(self, period, msg::stall_atom::value);
}

/// The step's stall limit: max(floor, factor x estimate x device time scale).
int64_t stall_limit_ns(const exec_state& st, const launch_program& prog, step_id s) {
  const double est = prog.source().at(s).est_seconds * st.dev->time_scale();
  const double limit = std::max(st.stall.min_seconds, st.stall.factor * est);
  return static_cast<int64_t>(std::clamp(limit * 1e9, 0.0, 1e18));
}

/// Puts step `s` (just launched, with its end event) under the stall watch.
void watch_step(exec_actor_t* self, const job_context& ctx, step_id s) {
  auto& st = self->state;
  const launch_program& prog = ctx.program();
  const lowered_step& ls = prog.steps()[static_cast<std::size_t>(s)];
  const auto& slot = ctx.slots[static_cast<std::size_t>(s)];
  if (!slot.end) return;
  const auto lane = static_cast<std::size_t>(ctx.lane_of(ls.queue));
  if (st.watch.size() <= lane) st.watch.resize(lane + 1);
  auto& q = st.watch[lane];
  prune(q);  // keeps the list as short as the stream's unfinished work
  watched_step w;
  w.lp = ctx.lp;
  w.step = s;
  w.end = slot.end;
  for (step_id d : ls.remote_deps)
    if (const auto& ev = ctx.slots[static_cast<std::size_t>(d)].end) w.deps.push_back(ev);
  w.limit_ns = stall_limit_ns(st, prog, s);
  q.push_back(std::move(w));
  arm_stall_check(self);
}

/// The oldest unfinished step of `lane` ran past its limit: the device
/// actor quarantines the device and fails the jobs using it.
void report_stall(exec_actor_t* self, int lane, const watched_step& w, int64_t now) {
  auto& st = self->state;
  const launch_program& prog = *w.lp->program;
  const lowered_step& ls = prog.steps()[static_cast<std::size_t>(w.step)];
  char text[256];
  std::snprintf(text, sizeof text,
                "stalled: running for %.3f s, past its limit of %.3f s (cost-model estimate %.3g s; stall_factor %g, "
                "stall_min_seconds %g); the device is quarantined until runtime::reset_device(%d)",
                static_cast<double>(now - w.since_ns) / 1e9, static_cast<double>(w.limit_ns) / 1e9,
                prog.source().at(w.step).est_seconds * st.dev->time_scale(), st.stall.factor, st.stall.min_seconds,
                st.device);
  error e = step_error(st, lane, ls, {}, error{errc::timeout, text});
  self->send(st.stall.device_actor, msg::device_stalled{std::move(e), w.lp->key, w.since_ns});
}

/// stall_atom: each lane's oldest unfinished step counts as running from the
/// first check that finds its remote deps complete (so never longer than it
/// really ran), and is reported once when it passed its limit.
void check_stalls(exec_actor_t* self) {
  auto& st = self->state;
  st.check_armed = false;
  const int64_t now = clock_ns(self);
  bool watching = false;
  for (std::size_t lane = 0; lane < st.watch.size(); ++lane) {
    auto& q = st.watch[lane];
    prune(q);
    if (q.empty()) continue;
    watching = true;
    watched_step& h = q.front();
    if (h.since_ns < 0) {
      if (std::all_of(h.deps.begin(), h.deps.end(), [](const auto& ev) { return ev->query(); })) h.since_ns = now;
    } else if (!h.reported && now - h.since_ns > h.limit_ns) {
      h.reported = true;
      report_stall(self, static_cast<int>(lane), h, now);
    }
  }
  if (watching) arm_stall_check(self);  // idle actors get no timer
}

/// Issue line `line` (a stream lane of this actor): the job holding `turn`
/// is done here (issued all its steps, or was cancelled); the next parked
/// job in the agreed order gets its turn.
void finish_turn(exec_actor_t* self, int line, uint64_t turn) {
  auto& st = self->state;
  auto& order = st.order[line];
  const std::optional<job_key> job = order.finish(turn);
  if (order_log_on()) order_log(st, "finished its turn on line", 0, turn, line);
  if (!job) return;
  if (order_log_on()) order_log(st, "resumes on line", job->job, order.next(), line);
  auto it = st.jobs.find(*job);  // the parked job's entry for this queue
  if (it != st.jobs.end() && !it->second.dropped) advance(self, it->second);
}

/// Whether queue `q` of `prog` issues its jobs in the agreed order
/// (launch_queue::in_job_order: every queue of a plan with collectives).
bool ordered_queue(const launch_program& prog, int q) { return prog.queue(q).in_job_order; }

/// Whether `e`'s job may issue its next step now (always on queues that are
/// not ordered_queue).
bool my_turn(exec_state& st, exec_job& e) {
  if (!ordered_queue(e.ctx->program(), e.queue)) return true;
  auto& order = st.order[e.ctx->lane_of(e.queue)];
  const bool mine = order.may_issue(e.ctx->turn_on(e.queue), job_key{e.ctx->id(), e.queue});
  if (!mine && order_log_on())
    order_log(st, "waits for its turn at step", e.ctx->id(), e.ctx->turn_on(e.queue), e.next);
  return mine;
}

/// Whether `ls` is a collective part that meets the other members' parts by
/// its place in their issue order (NCCL's kernels; the host backends check
/// the same rule, gpu/host/collective_sequence.hpp): every part on the
/// communication queue. In-stream parts and a decode-step record's absorbed
/// parts meet under the job's tag instead (abort_collectives stops them).
bool paired_part(const lowered_step& ls) {
  return ls.kind == step_kind::collective && !in_stream_step(ls) && ls.absorbed_into < 0;
}

/// Answers `acks` cancel_job messages of `ctx` once the work launched on
/// this actor's streams so far has finished (the job's memory may go then).
void ack_when_drained(exec_actor_t* self, const job_context& ctx, int acks) {
  auto& st = self->state;
  std::vector<gpu::stream*> live;
  for (auto& l : st.streams)
    if (l.stream) live.push_back(l.stream.get());
  if (live.empty()) {
    for (int k = 0; k < acks; ++k) self->send(ctx.job_actor, msg::cancel_ack{ctx.id()});  // nothing was launched here
    return;
  }
  // Launched work of this job is before this point of every stream.
  auto left = std::make_shared<std::atomic<int>>(static_cast<int>(live.size()));
  for (gpu::stream* s : live)
    st.dev->notify(*s, [left, acks, who = ctx.job_actor, job = ctx.id()](const error&) {
      if (left->fetch_sub(1, std::memory_order_acq_rel) == 1)
        for (int k = 0; k < acks; ++k) caf::anon_send(who, msg::cancel_ack{job});
    });
}

/// A cancelled or failed job's queue `e` still owes paired parts (a member
/// may have issued its part of them already, and NCCL pairs by order alone:
/// a part left out would pair that member's with the next job's, or wait
/// for ever). In the job's turn on the line it issues each of them with no
/// waits (its operands' producers may never run: the sums are void, the job
/// has failed), then ends its turn; the job's cancel_acks here go once every
/// owing queue is done and those parts finished. Parked until its turn.
void issue_owed_parts(exec_actor_t* self, exec_job& e) {
  auto& st = self->state;
  if (!my_turn(st, e)) return;  // finish_turn resumes it
  const msg::job_ref_ptr ref = e.ref;  // keeps the job alive past forget_job
  const job_context& ctx = *e.ctx;
  const launch_program& prog = ctx.program();
  const auto& mine = prog.queues()[static_cast<std::size_t>(e.queue)].steps;
  const int lane = ctx.lane_of(e.queue);
  const error* no_stream = nullptr;
  gpu::stream* stream = stream_of(st, lane, &no_stream);
  for (; stream && e.next < static_cast<int>(mine.size()); ++e.next) {
    const lowered_step& ls = prog.steps()[static_cast<std::size_t>(mine[static_cast<std::size_t>(e.next)])];
    if (!paired_part(ls)) continue;
    if (order_log_on()) order_log(st, "issues an owed part, step", ctx.id(), ctx.turn_on(e.queue), ls.id);
    // The job failed already: an error here (a dead member) changes nothing.
    gpu::collective_launch part = collective_part(ctx, ls, st.device);
    part.void_part = true;
    (void)st.dev->collective(*stream, part);
  }
  const int queue = e.queue;
  forget_job(st, job_key{ctx.id(), queue});
  if (auto it = st.owed.find(ctx.id()); it != st.owed.end() && --it->second.owing_queues == 0) {
    const int acks = it->second.acks;
    st.owed.erase(it);
    ack_when_drained(self, ctx, acks);
  }
  finish_turn(self, lane, ctx.turn_on(queue));
}

/// Launches every step of `e` whose remote deps all arrived, in order; then
/// sends the batched ready messages. A consumer queue that this actor runs
/// itself (another compute lane of the device) gets no message: its waiting
/// counts drop here and it advances in the same turn (`st.local`).
void advance_one(exec_actor_t* self, exec_job& e, const msg::job_ref_ptr& ref) {
  if (e.owing) return issue_owed_parts(self, e);
  auto& st = self->state;
  const job_context& ctx = *e.ctx;
  const launch_program& prog = ctx.program();
  const auto& mine = prog.queues()[static_cast<std::size_t>(e.queue)].steps;
  if (st.out.size() < prog.queues().size()) st.out.resize(prog.queues().size());
  while (e.next < static_cast<int>(mine.size()) && e.waiting[static_cast<std::size_t>(e.next)] == 0) {
    if (ctx.cancelled.load(std::memory_order_acquire)) {
      e.dropped = true;
      break;
    }
    if (!my_turn(st, e)) break;
    const step_id s = mine[static_cast<std::size_t>(e.next)];
    // Graph replay; not under the stall watch, which times each step by its own
    // end event (a replayed segment's steps all end with the graph).
    if (prog.steps()[static_cast<std::size_t>(s)].replay_steps > 0 && st.dev->captures() && st.stall.factor <= 0) {
      auto launched = launch_segment(st, e, s);
      if (!launched) {
        self->send(ctx.job_actor, msg::step_failed{ctx.id(), s, launched.err()});
        e.dropped = true;
        e.failed = true;
        break;
      }
      e.next += *launched;
      continue;
    }
    if (error err = launch_step(st, e, s)) {
      self->send(ctx.job_actor, msg::step_failed{ctx.id(), s, std::move(err)});
      e.dropped = true;
      e.failed = true;
      break;
    }
    if (st.stall.factor > 0) watch_step(self, ctx, s);
    ++e.next;
  }
  // Steps already launched (even before a failure) are announced: their
  // consumers may be needed for nothing, but nobody waits on a lost ready.
  const auto& steps = prog.steps();
  for (int q : st.touched) {
    auto& v = st.out[static_cast<std::size_t>(q)];
    const auto& to = ctx.queue_actors()[static_cast<std::size_t>(q)];
    if (to.address() == self->address()) {
      // Cannot be e's own queue (consumers on the same queue are not remote).
      exec_job& c = entry_for(st, ref, q);
      if (!c.dropped) {
        for (step_id p : v)
          for (const queue_pos& cp : steps[static_cast<std::size_t>(p)].remote_consumers)
            if (cp.queue == q) --c.waiting[static_cast<std::size_t>(cp.pos)];
        st.local.push_back(q);
      }
    } else {
      // Another device's queue is scheduled through CAF's coordinator
      // (anon_send: another worker thread, woken if asleep), a queue of this
      // device on this thread. self->send puts an idle receiver on this
      // worker's own queue, so the devices' launches ran on one thread, one
      // after another: on 4 H200s the trace of a decode step at degree 4
      // showed the four devices' launches about 25 us apart in turn, and the
      // step took 9.82 ms against 5.64 on one GPU (7.64 ms with this; the
      // workers' spin, runtime_options::scheduler_spin_polls, did the rest:
      // 4.7). Either way the message enters the mailbox now, so the order
      // per receiver is kept.
      const bool other_device = prog.queues()[static_cast<std::size_t>(q)].device != st.device;
      for (std::size_t i = 0; i < v.size(); i += msg::ready::max_steps) {
        msg::ready r{ref, q};
        r.count = static_cast<int>(std::min<std::size_t>(msg::ready::max_steps, v.size() - i));
        std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(i), r.count, r.steps.begin());
        if (other_device) caf::anon_send(to, std::move(r));
        else self->send(to, std::move(r));
      }
    }
    v.clear();  // keeps its capacity: no allocation on the next batch
  }
  st.touched.clear();
  if (!e.dropped && e.got_run && e.next == static_cast<int>(mine.size())) {
    // A plan on one stream: the job is issued in full, so the stream orders
    // it before the slot's next job, which may start now.
    ctx.leave_slot_issued();
    const bool ordered = ordered_queue(prog, e.queue);
    const int queue = e.queue;
    forget_job(st, job_key{ctx.id(), queue});
    if (ordered) finish_turn(self, ctx.lane_of(queue), ctx.turn_on(queue));
  }
}

/// advance_one for `e`, then for the queues of the same job on this actor
/// that it unblocked, until none is left.
void advance(exec_actor_t* self, exec_job& e) {
  auto& st = self->state;
  const msg::job_ref_ptr ref = e.ref;  // keeps the job alive past a forget_job
  // finish_turn may advance another job from inside advance_one: each call
  // works off only the queues it added itself.
  const std::size_t base = st.local.size();
  advance_one(self, e, ref);
  while (st.local.size() > base) {
    const int q = st.local.back();
    st.local.pop_back();
    exec_job& c = entry_for(st, ref, q);
    if (!c.dropped) advance_one(self, c, ref);
  }
}

/// A handler threw (out of memory): the job fails with an internal error
/// naming this actor's device; the actor keeps serving.
void report_exception(exec_actor_t* self, const msg::job_ref_ptr& ref, const std::exception& ex) {
  self->state.local.clear();  // queues of the interrupted advance (they name its job)
  const job_context& ctx = job_of(*ref);
  self->send(ctx.job_actor,
             msg::step_failed{ctx.id(), -1,
                              {errc::internal,
                               "device '" + self->state.dev->spec().name + "' " +
                                   to_string(self->state.kind) + " actor: " + ex.what(),
                               self->state.device}});
}

caf::behavior exec_actor_fn(exec_actor_t* self, gpu::device_ptr dev, step_kind kind, int lane, stall_watch watch) {
  auto& st = self->state;
  st.stall = std::move(watch);
  st.dev = std::move(dev);
  st.device = st.dev->index();
  st.kind = kind;
  const error* ignored = nullptr;
  (void)stream_of(st, lane, &ignored);  // a failure fails every step of the lane, naming why
  return {
      [self](const msg::run_job& m) {
        try {
          AG_HOP_PROBE(actor_has_it, m.job->job_id());
          if (job_of(*m.job).cancelled.load(std::memory_order_acquire)) return;
          auto& e = entry_for(self->state, m.job, m.queue);
          if (e.dropped) return;
          e.got_run = true;
          advance(self, e);
        } catch (const std::exception& ex) {
          report_exception(self, m.job, ex);
        }
      },
      [self](const msg::ready& m) {
        try {
          const job_context& ctx = job_of(*m.job);
          if (ctx.cancelled.load(std::memory_order_acquire)) return;
          auto& e = entry_for(self->state, m.job, m.queue);
          if (e.dropped) return;
          const auto& steps = ctx.program().steps();
          for (int k = 0; k < m.count; ++k)
            for (const queue_pos& c : steps[static_cast<std::size_t>(m.steps[static_cast<std::size_t>(k)])].remote_consumers)
              if (c.queue == m.queue) --e.waiting[static_cast<std::size_t>(c.pos)];
          advance(self, e);
        } catch (const std::exception& ex) {
          report_exception(self, m.job, ex);
        }
      },
      [self](const msg::cancel_job& m) {
        // One cancel_job per queue of the job (the job counts one ack per
        // queue): the first settles all of the job's queues here.
        auto& st = self->state;
        const job_context& ctx = job_of(*m.job);
        const launch_program& prog = ctx.program();
        if (prog.has_in_stream_parts()) st.dev->abort_collectives(ctx.id());  // peers' parts stop waiting here
        if (auto it = st.owed.find(ctx.id()); it != st.owed.end()) {
          ++it->second.acks;  // answered with the others once the owed parts are issued
          return;
        }
        std::vector<int> owing;
        for (std::size_t qi = 0; qi < prog.queues().size(); ++qi) {
          const int q = static_cast<int>(qi);
          if (ctx.queue_actors()[qi].address() != self->address()) continue;
          const job_key k{ctx.id(), q};
          auto it = st.jobs.find(k);
          if (!prog.queues()[qi].in_job_order) {
            forget_job(st, k);
            continue;
          }
          // A queue whose turn ended issued all its steps (or already paid
          // what it owed); one that has not owes the paired parts from its
          // next step on (from its first where no step came here yet).
          const int line = ctx.lane_of(q);
          if (st.order[line].finished(ctx.turn_on(q))) {
            forget_job(st, k);
            continue;
          }
          int from = 0;
          if (it != st.jobs.end()) from = it->second.next + (it->second.failed ? 1 : 0);
          const auto& mine = prog.queues()[qi].steps;
          const bool owes =
              owe_cancelled_collectives().load(std::memory_order_relaxed) &&
              std::any_of(mine.begin() + std::min<std::ptrdiff_t>(from, static_cast<std::ptrdiff_t>(mine.size())),
                          mine.end(), [&](step_id s) { return paired_part(prog.steps()[static_cast<std::size_t>(s)]); });
          if (!owes) {
            forget_job(st, k);
            // The job's turn ends here.
            st.order[line].forget(ctx.turn_on(q));
            finish_turn(self, line, ctx.turn_on(q));
            continue;
          }
          exec_job& e = entry_for(st, m.job, q);
          e.next = from;
          e.dropped = false;
          e.owing = true;
          owing.push_back(q);
        }
        if (owing.empty()) return ack_when_drained(self, ctx, 1);
        st.owed[ctx.id()] = owed_cancel{static_cast<int>(owing.size()), 1};
        // Each issues now if its turn has come, else when it comes (the
        // entry may be gone by the time a later one is looked at: an
        // earlier one's finish_turn can resume it).
        for (int q : owing) {
          auto it = st.jobs.find(job_key{ctx.id(), q});
          if (it != st.jobs.end() && it->second.owing) advance(self, it->second);
        }
      },
      [self](const msg::unload_plan& m) {
        auto& sc = self->state.scratch;
        for (auto it = sc.begin(); it != sc.end();) it = it->first.job == m.plan_key ? sc.erase(it) : std::next(it);
        // No job of the plan is left, so no launch of its graphs is still running.
        auto& rp = self->state.replays;
        for (auto it = rp.begin(); it != rp.end();) it = it->first.job == m.plan_key ? rp.erase(it) : std::next(it);
      },
      [self](msg::stall_atom) { check_stalls(self); },
      // Tests: the number of jobs this actor still holds state for.
      [self](msg::stats_atom) -> int64_t { return static_cast<int64_t>(self->state.jobs.size()); },
  };
}

}  // namespace

caf::actor spawn_exec_actor(caf::actor_system& sys, gpu::device_ptr dev, step_kind kind, int lane, stall_watch watch) {
  return sys.spawn(exec_actor_fn, std::move(dev), kind, lane, std::move(watch));
}

caf::actor spawn_stream_actor(caf::actor_system& sys, gpu::device_ptr dev, int lane, stall_watch watch) {
  return spawn_exec_actor(sys, std::move(dev), step_kind::compute, lane, std::move(watch));
}

}  // namespace ag::actors
