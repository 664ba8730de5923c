#include "gpu/sim/sim_device.hpp"

#include <algorithm>

#include <cmath>

namespace ag::gpu::sim {

namespace {

host::host_device_config config_of(const sim_options& o) {
  host::host_device_config c;
  c.compute = o.compute_values;
  c.timed = !o.zero_delay;
  c.inline_streams = o.zero_delay && !o.compute_values;
  c.lazy_memory = !o.compute_values;
  c.time_scale = o.time_scale;
  return c;
}

double bytes_of(const tensor_arg& t) {
  return static_cast<double>(t.dims.numel()) * static_cast<double>(dtype_size(t.type));
}

/// Whether admit_op must draw numbers for `f` (op errors or stalls).
bool draws_faults(const fault_config& f) { return f.op_error_rate > 0 || f.op_stall_rate > 0; }

}  // namespace

op_cost cost_of_launch(const op_launch& l) {
  // Mirrors graph/cost_model.cpp's cost_of (tests/gpu check they agree).
  op_cost c;
  if (!l.op || is_view_op(l.op->op) || is_leaf_op(l.op->op)) return c;
  const double out_bytes = bytes_of(l.out);
  const double n = static_cast<double>(l.out.dims.numel());
  double in_bytes = 0;
  for (const auto& in : l.inputs) in_bytes += bytes_of(in);
  switch (l.op->op) {
    case op_kind::matmul: {
      if (l.inputs.empty() || l.inputs[0].dims.rank() < 2) break;
      const auto& a = l.inputs[0].dims;
      c.flops = 2.0 * n * static_cast<double>(l.op->attrs.trans_a ? a[-2] : a[-1]);
      c.bytes = in_bytes + out_bytes;
      break;
    }
    case op_kind::get_rows:
      c.bytes = (l.inputs.size() > 1 ? bytes_of(l.inputs[1]) : 0.0) + 2 * out_bytes;
      break;
    case op_kind::store_rows:
      c.bytes = in_bytes + (l.inputs.empty() ? 0.0 : bytes_of(l.inputs[0]));
      break;
    default: {
      double per = 0;
      switch (l.op->op) {
        case op_kind::add: case op_kind::mul: case op_kind::scale: case op_kind::argmax: case op_kind::range_mask:
          per = 1;
          break;
        case op_kind::silu: case op_kind::rope: per = 4; break;
        case op_kind::gelu: per = 8; break;
        case op_kind::rms_norm: case op_kind::layer_norm: case op_kind::softmax: per = 5; break;
        default: break;
      }
      c.flops = per * n;
      c.bytes = in_bytes + out_bytes;
      break;
    }
  }
  return c;
}

namespace {

/// The sim's replay_graph: the captured launch records and host copies
/// (sim_device::capture_segment), in segment order.
class sim_replay_graph final : public replay_graph {
 public:
  struct item {
    segment_op::kind what = segment_op::kind::launch;
    op_launch launch;  ///< kind::launch
    void* dst = nullptr;
    const void* src = nullptr;
    int64_t bytes = 0;
    int lane = 0;                  ///< capture_lanes: index into `lanes`
    std::vector<std::size_t> after;  ///< items on other lanes it follows (indices into `items`)
    event* done = nullptr;         ///< recorded after it: another lane's item follows it
  };
  const sim_device* owner = nullptr;
  std::vector<item> items;
  int kernel_count = 0;
  /// capture_lanes: the streams of lanes 1.. (lanes[0] is replay()'s own),
  /// the fork and join events and those of items others follow.
  std::vector<stream*> lanes;
  std::vector<std::unique_ptr<event>> events;
  int kernels() const noexcept override { return kernel_count; }
};

}  // namespace

expected<std::unique_ptr<replay_graph>> sim_device::capture_lanes(stream* const* lanes, int count,
                                                                  const segment_op* ops, std::size_t n) {
  if (count <= 1) return device::capture_lanes(lanes, count, ops, n);
  for (int l = 0; l < count; ++l)
    if (!lanes[l]) return error(errc::invalid_argument, "device '" + spec().name + "': capture lane without a stream", index());
  auto g = capture_segment(*lanes[0], ops, n);
  if (!g) return g;
  auto& sg = static_cast<sim_replay_graph&>(**g);
  sg.lanes.assign(lanes, lanes + count);
  const auto fresh_event = [&]() -> event* {
    auto e = create_event(false);
    if (!e) return nullptr;
    sg.events.push_back(std::move(*e));
    return sg.events.back().get();
  };
  // capture_segment dropped views and leaves: map each op to its item, a
  // dropped one to the last item of its lane before it (what following it
  // means; -1: nothing of its lane ran before it, the fork is enough).
  std::vector<std::ptrdiff_t> item_of(n, -1);
  std::vector<std::ptrdiff_t> last_on_lane(static_cast<std::size_t>(count), -1);
  std::vector<std::ptrdiff_t> follower(n, -1);  // the item an op's waits go to: its own, or the lane's next
  std::vector<char> kept(n);
  for (std::size_t i = 0, k = 0; i < n; ++i) {
    if (ops[i].lane < 0 || ops[i].lane >= count)
      return error(errc::invalid_argument, "device '" + spec().name + "': capture lane out of range", index());
    auto& last = last_on_lane[static_cast<std::size_t>(ops[i].lane)];
    kept[i] = ops[i].what != segment_op::kind::launch || !(is_view_op(ops[i].launch->op->op) || is_leaf_op(ops[i].launch->op->op));
    if (kept[i]) {
      last = static_cast<std::ptrdiff_t>(k);
      sg.items[k++].lane = ops[i].lane;
    }
    item_of[i] = last;
  }
  // A dropped op's waits go to the next item of its lane.
  std::vector<std::ptrdiff_t> next_on_lane(static_cast<std::size_t>(count), -1);
  for (std::size_t i = n, k = sg.items.size(); i-- > 0;) {
    if (kept[i]) next_on_lane[static_cast<std::size_t>(ops[i].lane)] = static_cast<std::ptrdiff_t>(--k);
    follower[i] = next_on_lane[static_cast<std::size_t>(ops[i].lane)];
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (int a = 0; a < ops[i].after_count; ++a) {
      const auto from = static_cast<std::size_t>(ops[i].after[a]);
      if (ops[i].after[a] < 0 || from >= i)
        return error(errc::invalid_argument, "device '" + spec().name + "': an op follows a later one", index());
      if (ops[from].lane == ops[i].lane) continue;  // the lane's own order
      if (item_of[from] < 0 || follower[i] < 0) continue;  // nothing ran before it, or nothing runs after
      auto& src = sg.items[static_cast<std::size_t>(item_of[from])];
      if (!src.done && !(src.done = fresh_event()))
        return error(errc::unsupported_op, "device '" + spec().name + "': no event for a capture lane", index());
      auto& waits = sg.items[static_cast<std::size_t>(follower[i])].after;
      if (std::find(waits.begin(), waits.end(), static_cast<std::size_t>(item_of[from])) == waits.end())
        waits.push_back(static_cast<std::size_t>(item_of[from]));
    }
  }
  // The fork, then one join per lane.
  for (int l = 0; l < count; ++l)
    if (!fresh_event()) return error(errc::unsupported_op, "device '" + spec().name + "': no event for a capture lane", index());
  return g;
}

expected<std::unique_ptr<replay_graph>> sim_device::capture_segment(stream&, const segment_op* ops, std::size_t n) {
  if (!alive()) return error(errc::device_failed, "device '" + spec().name + "' is dead: nothing to capture", index());
  bool refuse = false;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    refuse = faults_.refuse_capture;
  }
  if (refuse)
    return error(errc::unsupported_op, "device '" + spec().name + "' refused the capture (injected fault)", index());
  auto g = std::make_unique<sim_replay_graph>();
  g->owner = this;
  for (std::size_t i = 0; i < n; ++i) {
    sim_replay_graph::item it;
    it.what = ops[i].what;
    if (ops[i].what != segment_op::kind::launch) {
      it.dst = ops[i].dst;
      it.src = ops[i].src;
      it.bytes = ops[i].bytes;
      g->items.push_back(it);
      continue;
    }
    const op_launch* l = ops[i].launch;
    if (!l || !l->op) return error(errc::invalid_argument, "device '" + spec().name + "': capture of a launch without a node", index());
    if (is_view_op(l->op->op) || is_leaf_op(l->op->op)) continue;
    it.launch = *l;
    it.launch.launch_paid_by_replay = g->kernel_count++ > 0;
    g->items.push_back(std::move(it));
  }
  return std::unique_ptr<replay_graph>(std::move(g));
}

error sim_device::replay(stream& s, replay_graph& g) {
  auto* sg = dynamic_cast<sim_replay_graph*>(&g);
  if (!sg || sg->owner != this)
    return error(errc::invalid_argument, "device '" + spec().name + "': replay of a graph another device captured", index());
  const std::size_t lanes = sg->lanes.size();
  // Several lanes: the last `lanes` events are the fork and the lanes' joins.
  const auto fork_join = [&](std::size_t l) -> event& { return *sg->events[sg->events.size() - lanes + l]; };
  if (lanes > 1) {
    if (error e = record(fork_join(0), s)) return e;
    for (std::size_t l = 1; l < lanes; ++l)
      if (error e = wait(*sg->lanes[l], fork_join(0))) return e;
  }
  for (const auto& it : sg->items) {
    stream& on = it.lane == 0 ? s : *sg->lanes[static_cast<std::size_t>(it.lane)];
    for (std::size_t a : it.after)
      if (error e = wait(on, *sg->items[a].done)) return e;
    error e;
    switch (it.what) {
      case segment_op::kind::launch: e = launch(on, it.launch); break;
      case segment_op::kind::copy_h2d: e = copy_h2d(on, it.dst, it.src, it.bytes); break;
      case segment_op::kind::copy_d2h: e = copy_d2h(on, it.dst, it.src, it.bytes); break;
    }
    if (e) return e;
    if (it.done)
      if (error re = record(*it.done, on)) return re;
  }
  for (std::size_t l = 1; l < lanes; ++l) {
    if (error e = record(fork_join(l), *sg->lanes[l])) return e;
    if (error e = wait(s, fork_join(l))) return e;
  }
  return {};
}

sim_device::sim_device(device_spec spec, int index, const sim_options& options)
    : host_device(std::move(spec), index, config_of(options)),
      options_(options),
      rng_(options.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index) + 1),
      faults_(options.faults),
      die_at_(options.faults.die_after_ops) {
  faults_possible_.store(draws_faults(options.faults));
  if (die_at_ == 0) kill("configured to die after 0 ops (injected fault)");
}

void sim_device::kill(const std::string& why) {
  die(error(errc::device_failed, "device '" + spec().name + "' died: " + why, index()));
}

void sim_device::set_faults(const fault_config& f) {
  std::lock_guard<std::mutex> lk(mutex_);
  faults_ = f;
  faults_possible_.store(draws_faults(f));
  die_at_ = f.die_after_ops < 0 ? -1 : ops_run() + f.die_after_ops;
}

double sim_device::modelled_seconds() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return modelled_;
}

double sim_device::jitter_factor() {
  if (options_.jitter <= 0) return 1.0;
  // Lognormal with mean 1 and relative stddev `jitter`.
  const double sigma2 = std::log1p(options_.jitter * options_.jitter);
  return std::exp(std::sqrt(sigma2) * rng_.normal() - 0.5 * sigma2);
}

error sim_device::admit_op(host::host_stream& s, const op_launch& l, host::work_timing& t) {
  // A zero-delay device with no faults to draw models nothing: skip the cost
  // model and the generator, so that dispatch benchmarks measure the runtime,
  // not the simulator's bookkeeping.
  if (options_.zero_delay && !faults_possible_.load(std::memory_order_relaxed)) {
    t = {};
    return {};
  }
  double cost = 0, tail = 0;
  if (l.source) {
    cost = estimate_seconds(spec(), *l.source, *l.op);
    tail = estimate_wave_tail_seconds(spec(), *l.source, *l.op);  // 0 unless spec().gemm_sms
    cost += tail;
  } else if (!is_view_op(l.op->op) && !is_leaf_op(l.op->op))
    cost = estimate_seconds(spec(), cost_of_launch(l), l.op->type);
  // A kernel replayed inside a captured segment pays no launch of its own:
  // its launch latency becomes the device-side kernel latency, most of which
  // holds only its stream (host_device::occupy); its issue interval holds the
  // device with the kernel's work (spec.kernel_issue_interval).
  double latency = 0;
  if (l.launch_paid_by_replay && cost > 0) {
    cost = estimate_replayed_seconds(spec(), cost);
    latency = std::min(cost, replayed_kernel_overlap_seconds(spec()));
  }
  std::lock_guard<std::mutex> lk(mutex_);
  // Draw every number for every op, so the sequence does not depend on rates.
  const double u_err = rng_.uniform();
  const double u_stall = rng_.uniform();
  const double factor = jitter_factor();
  if (u_err < faults_.op_error_rate)
    return error(errc::op_failed, "device '" + spec().name + "': op '" + l.op->name + "' (" +
                                      to_string(l.op->op) + ") failed (injected fault)");
  t.seconds = cost * factor;
  if (cost > 0 && !l.launch_paid_by_replay) t.launch_seconds = std::min(cost, spec().launch_latency) * factor;
  t.latency_seconds = latency * factor;
  t.tail_seconds = std::min(tail, cost - latency) * factor;
  modelled_ += t.seconds;
  if (u_stall < faults_.op_stall_rate) t.extra_wall_seconds = faults_.stall_seconds;
  if (options_.zero_delay) t = {};
  return {};
}

host::work_timing sim_device::copy_timing(host::host_stream& s, host::copy_kind k, int64_t bytes,
                                          const device* src) {
  if (options_.zero_delay) return {};  // nothing to model (see admit_op)
  const double cost = k == host::copy_kind::peer && src
                          ? estimate_peer_copy_seconds(src->spec(), spec(), bytes)
                          : estimate_host_copy_seconds(spec(), bytes);
  std::lock_guard<std::mutex> lk(mutex_);
  host::work_timing t;
  t.seconds = cost * jitter_factor();
  modelled_ += t.seconds;
  return t;
}

host::work_timing sim_device::collective_timing(host::host_stream&, const collective_launch& c) {
  if (options_.zero_delay || !c.op) return {};
  std::vector<const device_spec*> specs;
  specs.reserve(c.members.size());
  for (const device* m : c.members) specs.push_back(&m->spec());
  const double cost = estimate_collective_seconds(c.op->op, c.algo, specs, c.bytes);
  std::lock_guard<std::mutex> lk(mutex_);
  host::work_timing t;
  t.seconds = cost * jitter_factor();
  modelled_ += t.seconds;
  return t;
}

void sim_device::op_executed(int64_t count) {
  const int64_t die_at = die_at_.load(std::memory_order_relaxed);  // every op: no lock
  if (die_at >= 0 && count >= die_at)
    kill("died after " + std::to_string(count) + " ops (injected fault)");
}

void sim_device::revived() {
  std::lock_guard<std::mutex> lk(mutex_);
  die_at_ = -1;
}

device_ptr make_sim_device(int ordinal, int index, const sim_options& options) {
  device_spec spec = options.spec;
  spec.name = "sim" + std::to_string(ordinal);
  spec.kind = device_kind::sim;
  spec.ordinal = ordinal;
  return std::make_shared<sim_device>(std::move(spec), index, options);
}

}  // namespace ag::gpu::sim
