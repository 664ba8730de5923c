// plan's lookups and printing. Built by planner.cpp / memory_plan.cpp.

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "graph/planner_internal.hpp"

namespace ag {

const char* to_string(sequence_parallel_mode m) noexcept {
  switch (m) {
    case sequence_parallel_mode::off: return "off";
    case sequence_parallel_mode::on: return "on";
    case sequence_parallel_mode::automatic: return "auto";
  }
  return "?";
}

bool parse_sequence_parallel_mode(const std::string& text, sequence_parallel_mode& out) noexcept {
  if (text == "off") out = sequence_parallel_mode::off;
  else if (text == "on") out = sequence_parallel_mode::on;
  else if (text == "auto") out = sequence_parallel_mode::automatic;
  else return false;
  return true;
}

const char* to_string(batch_chunks_mode m) noexcept {
  switch (m) {
    case batch_chunks_mode::off: return "off";
    case batch_chunks_mode::on: return "on";
    case batch_chunks_mode::automatic: return "auto";
  }
  return "?";
}

bool parse_batch_chunks_mode(const std::string& text, batch_chunks_mode& out) noexcept {
  if (text == "off") out = batch_chunks_mode::off;
  else if (text == "on") out = batch_chunks_mode::on;
  else if (text == "auto") out = batch_chunks_mode::automatic;
  else return false;
  return true;
}

bool plan::runs_nothing(node_id id) const {
  const node& n = graph_->at(id);
  return is_view_op(n.op) || is_leaf_op(n.op) ||
         (static_cast<std::size_t>(id) < elided_.size() && elided_[static_cast<std::size_t>(id)] != 0);
}

bool plan::materialised(node_id id) const {
  const auto root = static_cast<std::size_t>(storage_root(*graph_, id));
  return root >= fused_inside_.size() || fused_inside_[root] == 0;
}

expected<tensor_location> plan::locate(node_id id, int device) const {
  if (!graph_ || id < 0 || static_cast<std::size_t>(id) >= graph_->size())
    return error(errc::internal, "locate: node id " + std::to_string(id) + " is not in the plan's graph");
  if (device < 0 || static_cast<std::size_t>(device) >= slot_index_.size())
    return error(errc::internal, "locate: device " + std::to_string(device) + " is not in the plan");
  const node& n = graph_->at(id);
  const node_id sn = storage_root(*graph_, id);
  const int32_t si = slot_index_[static_cast<std::size_t>(device)][static_cast<std::size_t>(sn)];
  if (si < 0)
    return error(errc::internal, "locate: '" + n.name + "' (storage '" + graph_->at(sn).name +
                                     "') is not resident on device " + std::to_string(device));
  const buffer_slot& slot = memory_[static_cast<std::size_t>(device)].slots[static_cast<std::size_t>(si)];
  tensor_location loc;
  loc.node = id;
  loc.device = device;
  loc.where = slot.where;
  // Storage is copied whole, so a view resolves the same way on every device.
  if (sn == id) {
    loc.byte_offset = slot.offset;
    loc.stride = contiguous_strides(n.dims);
  } else {
    loc.byte_offset = slot.offset + n.offset * static_cast<int64_t>(dtype_size(n.type));
    loc.stride = n.stride;
  }
  return loc;
}

int64_t plan::bytes_moved() const {
  int64_t b = 0;
  for (const step& s : steps_)
    if (s.kind != step_kind::compute && s.kind != step_kind::collective) b += s.bytes;
  return b;
}

double plan::est_seconds(int device) const {
  double t = 0;
  for (const step& s : steps_)
    if (s.kind == step_kind::compute && s.device == device) t += s.est_seconds;
  return t;
}

namespace {

std::string fmt_bytes(int64_t b) {
  char buf[64];
  const double x = static_cast<double>(b);
  if (b >= (1LL << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1LL << 30));
  else if (b >= (1LL << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", x / (1LL << 20));
  else if (b >= (1LL << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", x / (1LL << 10));
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

std::string fmt_us(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

std::string dot_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}

std::string device_label(const std::vector<device_spec>& devs, int d) {
  if (d < 0 || static_cast<std::size_t>(d) >= devs.size()) return "host";
  return std::to_string(d) + ":" + devs[static_cast<std::size_t>(d)].name;
}

}  // namespace

std::string plan::describe() const {
  std::ostringstream os;
  const graph& g = *graph_;
  const std::vector<replay_segment> segments =
      options_.graph_replay == graph_replay_mode::off ? std::vector<replay_segment>{} : replay_segments(*this);
  const std::vector<int> folded = folded_lanes(*this);
  os << "plan: " << g.size() << " nodes, " << steps_.size() << " steps over " << used_devices_.size() << " of "
     << devices_.size() << " device(s), ";
  int lanes_used = 1;
  for (const step& s : steps_)
    if (s.kind == step_kind::compute) lanes_used = std::max(lanes_used, s.lane + 1);
  if (options_.lanes_per_device == 0) os << "auto lanes: " << lanes_used << " used per device at most\n";
  else os << options_.lanes_per_device << " lane(s) per device allowed, " << lanes_used << " used at most\n";
  if (options_.job_lanes > 1)
    os << "job lanes: " << options_.job_lanes
       << " asked (the runtime takes them where the plan has collectives and neither state nor in-stream parts)\n";
  else if (options_.job_lanes == 1)
    os << "job lanes: off\n";
  for (int d : used_devices_) {
    const device_spec& spec = devices_[static_cast<std::size_t>(d)];
    os << "device " << d << " '" << spec.name << "' (" << to_string(spec.kind) << ")\n";
    for (const step& s : steps_) {
      if (s.device != d) continue;
      if (s.kind == step_kind::compute) {
        int nops = 0;
        node_id first = no_node, last = no_node;
        for (node_id id : s.ops) {
          if (runs_nothing(id)) continue;
          if (first == no_node) first = id;
          last = id;
          ++nops;
        }
        os << "  split #" << s.id << " lane " << s.lane << " seq " << s.lane_seq << ": "
           << (first == no_node ? std::string("-") : g.at(first).name) << " .. "
           << (last == no_node ? std::string("-") : g.at(last).name) << " (" << nops << " ops, " << fmt_us(s.est_seconds)
           << ")\n";
      } else if (s.kind == step_kind::collective) {
        const node& n = g.at(s.ops.at(0));
        os << "  coll  #" << s.id << " " << to_string(n.op) << " '" << n.name << "' rank " << n.attrs.rank << " of "
           << s.peers.size() << " " << fmt_bytes(s.bytes) << " " << to_string(s.algo) << " (" << fmt_us(s.est_seconds)
           << ")\n";
      } else {
        const node& n = g.at(s.ops.at(0));
        const std::string src = s.kind == step_kind::copy_h2d ? "host" : device_label(devices_, s.kind == step_kind::copy_peer ? s.src_device : s.device);
        std::string dst = s.kind == step_kind::copy_d2h ? "host" : device_label(devices_, s.device);
        if (s.kind == step_kind::copy_d2h && g.outputs()[static_cast<std::size_t>(s.io_index)] != n.id)
          dst += " (piece of output '" + g.at(g.outputs()[static_cast<std::size_t>(s.io_index)]).name + "' at byte " +
                 std::to_string(s.host_offset) +
                 (s.host_blocks > 1 ? ", " + std::to_string(s.host_blocks) + " runs" : std::string{}) + ")";
        os << "  copy  #" << s.id << " " << to_string(s.kind) << " '" << n.name << "' " << src << " -> " << dst << " "
           << fmt_bytes(s.bytes) << " (" << fmt_us(s.est_seconds) << ")";
        if (s.on_compute_stream) os << " inline on lane " << s.lane << " seq " << s.lane_seq;
        os << "\n";
      }
    }
    const device_memory& m = memory_[static_cast<std::size_t>(d)];
    os << "  compute " << fmt_us(est_seconds(d)) << "; arena " << fmt_bytes(m.arena_bytes) << " peak vs "
       << fmt_bytes(m.sum_tensor_bytes) << " sum of tensors; weights " << fmt_bytes(m.weight_bytes)
       << (m.weights_shared ? " (another plan's upload, shared)" : "");
    if (m.state_bytes > 0)
      os << "; state " << options_.state_slots << " slot(s) x " << fmt_bytes(m.state_bytes);
    os << "\n";
    int elided = 0;
    for (const elided_concat& e : elided_concats_) elided += e.device == d;
    if (elided > 0)
      os << "  " << elided << " concat(s) elided: their inputs are written in place (plan_options::elide_concats)\n";
    int stores = 0;
    for (node_id id = 0; id < static_cast<node_id>(elided_.size()); ++id)
      stores += elided_[static_cast<std::size_t>(id)] && graph_->at(id).op == op_kind::store_rows &&
                placement_[static_cast<std::size_t>(id)] == d;
    if (stores > 0) os << "  " << stores << " store_rows storing nothing run no kernel (a read of the state slot)\n";
    if (options_.graph_replay != graph_replay_mode::off) {
      int nseg = 0, kernels = 0, copies = 0;
      for (const replay_segment& seg : segments)
        if (seg.device == d) ++nseg, kernels += seg.kernels, copies += seg.copies;
      os << "  graph replay " << to_string(options_.graph_replay) << ": " << nseg << " segment(s), " << kernels
         << " kernels";
      if (copies > 0) os << ", " << copies << " host copies (through the arenas' host windows)";
      if (const int lanes = folded[static_cast<std::size_t>(d)]; lanes > 0)
        os << "; its " << lanes << " compute lanes run from one queue, as one graph per segment whose branches are the"
           << " lanes (plan_options::fold_lanes; the segments above count per lane)";
      if (!replays_on(options_.graph_replay, spec.kind)) os << "; not applied on cpu (plain calls)";
      else
        os << "; saves " << fmt_us(replay_launch_seconds_saved(*this, segments, d))
           << " of launches per job (model); each segment of 2+ kernels and copies runs plainly on its first job, then is captured"
              " once per arena and replayed; a refused capture falls back to plain launches (trace label, "
              "runtime::replay_statistics)";
      os << "\n";
    }
    // Fused kernels on this device (plan_options::fuse_ops, fuse_projections).
    int attention = 0, cached = 0, qkv = 0, gated = 0, residual = 0, normed = 0, roped = 0, saved = 0;
    for (const attention_fusion& f : fusions_)
      if (steps_[static_cast<std::size_t>(f.step)].device == d) {
        ++attention;
        cached += f.k_store != no_node ? 1 : 0;
        saved += static_cast<int>(f.ops().size()) - 1;
      }
    for (const projection_fusion& f : projection_fusions_) {
      if (steps_[static_cast<std::size_t>(f.step)].device != d) continue;
      saved += static_cast<int>(f.ops.size()) - 1;
      (f.kind == projection_kind::shared_input ? qkv : f.kind == projection_kind::gated ? gated : residual) += 1;
      normed += f.norm_prologue ? 1 : 0;
      roped += f.ropes;
    }
    if (saved > 0)
      os << "  fused: " << attention << " attention chain(s) (" << cached << " with their KV cache's stores and ropes), " << qkv << " shared-input projection group(s), " << gated
         << " gated-MLP group(s), " << residual << " projection + residual group(s); " << normed
         << " group(s) with their rms_norm" << (roped > 0 ? ", " + std::to_string(roped) + " rope(s) in their groups" : "")
         << ": " << saved << " launches fewer per job\n";
    // The lowering decides (it matches the fused records), so only say it may.
    if (options_.fuse_decode_step && spec.kind == device_kind::cuda && cached > 0 && qkv > 0 && !tp_ &&
        used_devices_.size() == 1)
      os << "  decode step: may run as one kernel where the lowering finds the whole step's pattern and shapes "
            "(plan_options::fuse_decode_step; actors::launch_program::decode_step_note() says whether)\n";
  }
  int64_t peer = 0, host = 0;
  for (const step& s : steps_)
    if (s.kind == step_kind::copy_peer) peer += s.bytes;
    else if (s.kind == step_kind::copy_h2d || s.kind == step_kind::copy_d2h) host += s.bytes;
  os << "moved: " << fmt_bytes(bytes_moved()) << " (peer " << fmt_bytes(peer) << ", host " << fmt_bytes(host) << ")\n";
  if (builder_order_seconds_ > 0) {
    if (kept_order_seconds_ < builder_order_seconds_)
      os << "step order: by the cost model's search (plan_options::order_steps_by_model), one job modelled at "
         << fmt_us(kept_order_seconds_) << " against " << fmt_us(builder_order_seconds_) << " in the builder's order\n";
    else
      os << "step order: the builder's (the cost model's search found nothing 0.1% faster than "
         << fmt_us(builder_order_seconds_) << " per job)\n";
  }
  if (tp_) describe_tensor_parallel(os);
  return os.str();
}

void plan::describe_tensor_parallel(std::ostream& os) const {
  const tensor_parallel_info& tp = *tp_;
  const graph& a = *tp.analysed;
  os << "tensor parallel: " << tp.stages << " stage(s) x " << tp.degree << " device(s), shares";
  for (double r : tp.ratios) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.3g", r);
    os << buf;
  }
  os << "\n";
  for (std::size_t st = 0; st < tp.devices.size(); ++st) {
    os << "  stage " << st << ": devices";
    for (int d : tp.devices[st]) os << " " << d;
    os << "\n";
  }
  os << "weights (split state):\n";
  for (const node& n : a.nodes())
    if (n.op == op_kind::weight && !tp.local[static_cast<std::size_t>(n.id)].empty())
      os << "  " << n.name << " " << n.dims.to_string() << " " << tp.state[static_cast<std::size_t>(n.id)].to_string() << "\n";
  std::map<node_id, const step*> step_of;
  for (const step& s : steps_)
    if (s.kind == step_kind::collective) step_of[s.ops[0]] = &s;
  int64_t total = 0;
  for (const tp_collective& c : tp.collectives) total += c.bytes;
  os << "collectives: " << tp.collectives.size() << ", " << fmt_bytes(total) << "\n";
  for (const tp_collective& c : tp.collectives) {
    const step* s = c.parts.empty() ? nullptr : step_of[c.parts[0]];
    os << "  " << to_string(c.op) << " '" << c.name << "' stage " << c.group << " layer " << c.layer << " "
       << fmt_bytes(c.bytes);
    if (s) os << " " << to_string(s->algo) << " (" << fmt_us(s->est_seconds) << ")";
    os << "\n";
  }
  if (!tp.chunked.empty()) {
    os << "overlapped (row-parallel matmul in chunks):";
    for (const auto& [name, chunks] : tp.chunked) {
      os << " " << name << " x" << chunks;
      if (std::find(tp.chunked_by_batch.begin(), tp.chunked_by_batch.end(), name) != tp.chunked_by_batch.end())
        os << " by batch";
    }
    os << "\n";
  }
  os << "weight bytes per device:";
  for (std::size_t d = 0; d < memory_.size(); ++d) os << " " << d << ": " << fmt_bytes(memory_[d].weight_bytes) << ";";
  os << "\n";
}

std::string plan::to_dot() const {
  std::ostringstream os;
  const graph& g = *graph_;
  os << "digraph plan {\n  rankdir=LR;\n  node [shape=box, fontname=\"monospace\"];\n";
  for (int d : used_devices_) {
    os << "  subgraph cluster_dev" << d << " {\n    label=\"" << dot_escape(device_label(devices_, d)) << "\";\n";
    for (const step& s : steps_) {
      if (s.device != d) continue;
      std::string text;
      if (s.kind == step_kind::compute) {
        text = "#" + std::to_string(s.id) + " lane " + std::to_string(s.lane) + "\\n";
        int shown = 0;
        for (node_id id : s.ops) {
          if (runs_nothing(id)) continue;
          if (shown++ < 6) text += dot_escape(g.at(id).name) + "\\n";
        }
        if (shown > 6) text += "(+" + std::to_string(shown - 6) + " ops)";
        os << "    s" << s.id << " [label=\"" << text << "\"];\n";
      } else {
        text = "#" + std::to_string(s.id) + " " + to_string(s.kind) + "\\n" + dot_escape(g.at(s.ops.at(0)).name) +
               "\\n" + fmt_bytes(s.bytes);
        os << "    s" << s.id << " [shape=ellipse, label=\"" << text << "\"];\n";
      }
    }
    os << "  }\n";
  }
  for (const step& s : steps_)
    for (step_id d : s.deps) os << "  s" << d << " -> s" << s.id << ";\n";
  os << "}\n";
  return os.str();
}

bool may_fail_on_values(const plan& p, const step& s) {
  if (s.kind != step_kind::compute) return false;
  for (node_id id : s.ops)
    if (may_fail_on_values(p.source().at(id).op)) return true;
  return false;
}

bool met_on_device(const plan& p, const step& s, step_id d) {
  return runs_in_stream(s) && p.at(d).device != s.device;
}

std::vector<std::vector<step_id>> waited_deps(const plan& p) {
  std::vector<std::vector<step_id>> out(p.steps().size());
  // Per compute lane (device, lane): deps on other queues some step of the
  // lane waited for so far. Steps come in id order, which is lane order.
  std::map<std::pair<int, int>, std::set<step_id>> waited_on_lane;
  for (const step& s : p.steps()) {
    const bool lane = on_compute_lane(s);
    auto& seen = waited_on_lane[{lane ? s.device : -1 - s.device, lane ? s.lane : -1}];
    auto& mine = out[static_cast<std::size_t>(s.id)];
    for (step_id d : s.deps) {
      if (met_on_device(p, s, d)) continue;
      const step& ds = p.at(d);
      const bool same_lane = on_compute_lane(ds) && ds.device == s.device && ds.lane == s.lane;
      if (lane && !same_lane && !seen.insert(d).second) continue;  // an earlier step of the lane waited for it
      mine.push_back(d);
    }
  }
  return out;
}

}  // namespace ag

namespace ag {

std::optional<single_lane> single_lane_of(const plan& p) {
  std::optional<single_lane> one;
  for (const step& s : p.steps()) {
    if (!on_compute_lane(s) || runs_in_stream(s)) return std::nullopt;
    if (!one) one = single_lane{s.device, s.lane};
    else if (one->device != s.device || one->lane != s.lane) return std::nullopt;
  }
  return one;
}

}  // namespace ag
