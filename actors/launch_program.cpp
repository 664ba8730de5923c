#include "actors/launch_program.hpp"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <queue>
#include <tuple>

namespace ag::actors {

namespace {

expected<operand> resolve(const plan& p, node_id id, int device) {
  if (!p.materialised(id)) {
    // Inside a fused attention chain: no memory. Its records are replaced
    // by the chain's one record (apply_fusions), which never names it.
    const node& n = p.source().at(id);
    operand none;
    none.proto.type = n.type;
    none.proto.dims = n.dims;
    none.proto.stride = contiguous_strides(n.dims);
    return none;
  }
  auto loc = p.locate(id, device);
  if (!loc) return loc.err();
  const node& n = p.source().at(id);
  operand a;
  a.where = loc->where;
  a.byte_offset = loc->byte_offset;
  a.proto.type = n.type;
  a.proto.dims = n.dims;
  a.proto.stride = loc->stride;
  return a;
}

/// Builds errors about step `s` (device, step and op fields set).
struct step_errors {
  const step& s;
  error operator()(const std::string& what, const std::string& op = {}) const {
    return {errc::internal,
            "step " + std::to_string(s.id) + " (" + to_string(s.kind) + " on device " + std::to_string(s.device) + ") " +
                what,
            s.device, s.id, op};
  }
  /// Wraps an error of a lookup for this step.
  error wrap(const error& e, const std::string& what, const std::string& op = {}) const {
    error r = (*this)(what + ": " + e.message, op);
    r.code = e.code;
    return r;
  }
};

/// The lane of the queue that runs `s`: steps on a compute lane (compute
/// steps, in-stream collective parts, inlined copies) run on theirs; the
/// copy kinds have one queue per device, and so do collectives (a device's
/// communication queue).
int queue_lane(const step& s) { return on_compute_lane(s) ? s.lane : 0; }

/// The kind of the queue that runs `s`: its own, but compute for an
/// in-stream collective part and an inlined copy.
step_kind queue_kind(const step& s) { return on_compute_lane(s) ? step_kind::compute : s.kind; }

// ---- fusion ----
//
// The plan's fused chains (graph/fusion.hpp, plan::fusions()) of this step
// become one record each, at the chain's last op: a decode step's attention
// (scores, mask add, softmax, weighted sum) is one kernel on CUDA. The
// memory plan kept q, k and the mask live until that op.
error apply_fusions(const plan& p, const step& s, lowered_step& ls) {
  const step_errors err{s};
  for (const attention_fusion& f : p.fusions()) {
    if (f.step != s.id) continue;
    auto at = [&](node_id id) {
      return std::find_if(ls.ops.begin(), ls.ops.end(), [&](const lowered_op& o) { return o.op->id == id; });
    };
    const auto first = at(f.scores), last = at(f.out), sm = at(f.softmax);
    const auto add = f.mask_add == no_node ? ls.ops.end() : at(f.mask_add);
    const std::ptrdiff_t span = f.mask_add == no_node ? 2 : 3;
    if (first == ls.ops.end() || last == ls.ops.end() || sm == ls.ops.end() || last - first != span ||
        (f.mask_add != no_node && add == ls.ops.end()))
      return err("has a fusion whose ops are not consecutive in it", p.source().at(f.out).name);
    // The prologue's records (graph/fusion.hpp) are the ones right before.
    const auto n_pro = static_cast<std::ptrdiff_t>(f.prologue_ops());
    if (first - ls.ops.begin() < n_pro)
      return err("has a fusion whose prologue is not right before its chain", p.source().at(f.out).name);
    const auto pro = first - n_pro;
    const auto role = [&](node_id id) -> lowered_op* {
      for (auto it = pro; it != first; ++it)
        if (it->op->id == id) return &*it;
      return nullptr;
    };
    lowered_op* k_store = role(f.k_store);
    lowered_op* v_store = role(f.v_store);
    lowered_op* k_rope = role(f.k_rope);
    lowered_op* q_rope = role(f.q_rope);
    if ((f.k_store != no_node && !k_store) || (f.v_store != no_node && !v_store) || (f.k_rope != no_node && !k_rope) ||
        (f.q_rope != no_node && !q_rope))
      return err("has a fusion whose prologue is not right before its chain", p.source().at(f.out).name);
    lowered_op fused;
    fused.op = last->op;
    fused.out = last->out;
    fused.inputs = {first->inputs.at(0), first->inputs.at(1), last->inputs.at(1)};
    fused.fused = gpu::op_launch::fusion::attention;
    fused.attention.scale = sm->op->attrs.scale;
    fused.attention.causal = sm->op->attrs.causal;
    fused.attention.softmax_rows = sm->op->dims[-2];
    if (add != ls.ops.end()) {
      fused.attention.masked = true;
      fused.inputs.push_back(add->inputs.at(1));
      const node& mask = p.source().at(p.source().at(add->op->inputs.at(1)).storage);
      fused.attention.rows_apart = mask.op == op_kind::range_mask && mask.attrs.rows_apart;
    }
    if (k_store) {
      // A rope's output read through a view, as the same view of its input:
      // the rope writes its input's layout (both contiguous, same dims).
      const auto before_rope = [&](operand viewed, const lowered_op& rope, operand& pre) {
        const operand &in = rope.inputs.at(0), &out = rope.out;
        if (viewed.where != out.where || in.proto.dims != out.proto.dims || in.proto.stride != out.proto.stride ||
            viewed.device != out.device || in.device != out.device)
          return false;
        pre = viewed;
        pre.where = in.where;
        pre.byte_offset = in.byte_offset + (viewed.byte_offset - out.byte_offset);
        return true;
      };
      operand k_new = k_store->inputs.at(0);
      if (q_rope && !before_rope(fused.inputs[0], *q_rope, fused.inputs[0]))
        return err("has a fused rope whose input and output layouts differ", q_rope->op->name);
      if (k_rope && !before_rope(k_store->inputs.at(0), *k_rope, k_new))
        return err("has a fused rope whose input and output layouts differ", k_rope->op->name);
      fused.inputs.push_back(k_new);
      fused.inputs.push_back(v_store->inputs.at(0));
      fused.inputs.push_back(k_store->inputs.at(1));
      fused.attention.store_new_rows = true;
      fused.attention.rope_q = q_rope != nullptr;
      fused.attention.rope_k = k_rope != nullptr;
      if (q_rope || k_rope) {
        const lowered_op& r = q_rope ? *q_rope : *k_rope;
        fused.inputs.push_back(r.inputs.at(1));
        fused.attention.rope_theta = r.op->attrs.theta;
        fused.attention.rope_scale = r.op->attrs.rope_scale;
      }
    }
    *pro = std::move(fused);
    ls.ops.erase(pro + 1, first + 1 + span);
  }
  // Projection groups: one GEMV record at the group's first op (its ops are
  // consecutive records), reading and writing what graph/fusion.hpp says.
  for (const projection_fusion& f : p.projection_fusions()) {
    if (f.step != s.id) continue;
    const auto first = std::find_if(ls.ops.begin(), ls.ops.end(),
                                    [&](const lowered_op& o) { return o.op->id == f.ops.front(); });
    const auto n = static_cast<std::ptrdiff_t>(f.ops.size());
    bool consecutive = first != ls.ops.end() && ls.ops.end() - first >= n;
    for (std::ptrdiff_t k = 0; consecutive && k < n; ++k) consecutive = first[k].op->id == f.ops[static_cast<std::size_t>(k)];
    if (!consecutive) return err("has a projection group whose ops are not consecutive in it", p.source().at(f.ops.back()).name);
    lowered_op fused;
    fused.op = first[n - 1].op;
    fused.fused = gpu::op_launch::fusion::projections;
    fused.projection = f.kind;
    // With a norm prologue the matmuls start one record later and x is the
    // norm's input; the norm's weight, if any, goes last.
    const auto mm = f.norm_prologue ? first + 1 : first;
    const std::ptrdiff_t n_mm = n - (f.norm_prologue ? 1 : 0) - f.ropes;
    fused.inputs = {f.norm_prologue ? first->inputs.at(0) : mm->inputs.at(0), mm->inputs.at(1)};
    switch (f.kind) {
      case projection_kind::shared_input: {
        // Output k is the matmul's, or its rope's (whose records follow the matmuls').
        const auto roped_out = [&](std::ptrdiff_t k) -> const lowered_op* {
          const node_id rope = projection_rope_of(p.source(), f, mm[k].op->id);
          const auto r = std::find_if(mm + n_mm, first + n, [&](const lowered_op& o) { return o.op->id == rope; });
          return rope != no_node && r != first + n ? &*r : nullptr;
        };
        for (std::ptrdiff_t k = 0; k < n_mm; ++k) {
          const lowered_op* r = roped_out(k);
          if (k > 0) fused.inputs.push_back(mm[k].inputs.at(1));
          (k == 0 ? fused.out : fused.extra_outs.emplace_back()) = r ? r->out : mm[k].out;
          if (!r) continue;
          fused.projection_rope.roped |= static_cast<uint8_t>(1u << k);
          fused.projection_rope.neox = r->op->attrs.rope == rope_mode::neox;
          fused.projection_rope.head_dim = r->op->dims[-1];
          fused.projection_rope.seq = r->op->dims[-3];
          fused.projection_rope.theta = r->op->attrs.theta;
          fused.projection_rope.scaling = r->op->attrs.rope_scale;
        }
        break;
      }
      case projection_kind::gated:  // gate, up, silu, mul
        fused.inputs.push_back(mm[1].inputs.at(1));
        fused.out = mm[3].out;
        break;
      case projection_kind::residual: {  // m, add(r, m)
        const lowered_op& add = mm[1];
        const bool m_first = add.op->inputs.at(0) == mm->op->id;
        fused.inputs.push_back(add.inputs.at(m_first ? 1 : 0));
        fused.out = add.out;
        break;
      }
    }
    if (f.norm_prologue) {
      fused.projection_norm.on = true;
      fused.projection_norm.eps = first->op->attrs.eps;
      fused.projection_norm.weighted = first->inputs.size() > 1;
      if (fused.projection_norm.weighted) fused.inputs.push_back(first->inputs.at(1));
    }
    if (f.ropes > 0) fused.inputs.push_back(first[n - 1].inputs.at(1));  // the ropes' positions
    *first = std::move(fused);
    ls.ops.erase(first + 1, first + n);
  }
  return {};
}

error lower_compute(const plan& p, const step& s, lowered_step& ls) {
  const graph& g = p.source();
  const step_errors err{s};
  for (node_id id : s.ops) {
    const node& n = g.at(id);
    if (p.runs_nothing(id)) continue;  // a view, a leaf, an elided concat (its inputs are in place)
    lowered_op op;
    op.op = &n;
    auto out = resolve(p, id, s.device);
    if (!out) return err.wrap(out.err(), "op '" + n.name + "'", n.name);
    op.out = *out;
    for (node_id in : n.inputs) {
      auto a = resolve(p, in, s.device);
      if (!a) return err.wrap(a.err(), "op '" + n.name + "' input '" + g.at(in).name + "'", n.name);
      op.inputs.push_back(*a);
    }
    ls.ops.push_back(std::move(op));
  }
  if (error e = apply_fusions(p, s, ls)) return e;
  if (!s.ops.empty())
    ls.label = s.ops.size() == 1 ? g.at(s.ops.front()).name : g.at(s.ops.front()).name + ".." + g.at(s.ops.back()).name;
  return {};
}

error lower_copy(const plan& p, const step& s, lowered_step& ls) {
  const graph& g = p.source();
  const step_errors err{s};
  if (s.ops.size() != 1) return err("copies " + std::to_string(s.ops.size()) + " nodes, expected 1");
  const node_id id = s.ops.front();
  const node& n = g.at(id);
  ls.label = n.name;
  ls.subject = &n;
  copy_desc& c = ls.copy;
  c.io_index = s.io_index;
  c.bytes = n.dims.numel() * static_cast<int64_t>(dtype_size(n.type));
  c.src_device = s.kind == step_kind::copy_peer ? s.src_device : s.device;
  c.host_offset = s.host_offset;
  c.host_blocks = s.host_blocks;
  c.host_pitch = s.host_pitch;
  if (s.kind != step_kind::copy_h2d) {
    auto a = resolve(p, id, c.src_device);
    if (!a) return err.wrap(a.err(), "source '" + n.name + "'", n.name);
    if (!is_contiguous(n.dims, a->proto.stride)) {
      // A non-contiguous view output: copy its storage, gather on the host.
      const node& sn = g.at(n.storage);
      if (s.kind != step_kind::copy_d2h || !n.is_view())
        return err("copies '" + n.name + "', which is not contiguous on its source device", n.name);
      a = resolve(p, n.storage, c.src_device);
      if (!a) return err.wrap(a.err(), "storage '" + sn.name + "'", n.name);
      c.gather = true;
      c.bytes = sn.own_bytes();
    }
    c.src = *a;
  }
  if (s.kind != step_kind::copy_d2h) {
    auto a = resolve(p, id, s.device);
    if (!a) return err.wrap(a.err(), "destination '" + n.name + "'", n.name);
    if (!is_contiguous(n.dims, a->proto.stride))
      return err("copies '" + n.name + "' into a non-contiguous destination", n.name);
    c.dst = *a;
  }
  if (s.kind == step_kind::copy_h2d && (s.io_index < 0 || static_cast<std::size_t>(s.io_index) >= g.inputs().size()))
    return err("names input " + std::to_string(s.io_index), n.name);
  if (s.kind == step_kind::copy_d2h && (s.io_index < 0 || static_cast<std::size_t>(s.io_index) >= g.outputs().size()))
    return err("names output " + std::to_string(s.io_index), n.name);
  return {};
}

/// A collective part: its output here, every member's operand where that
/// member lives (never copied: the backend reads or exchanges them), the
/// members' devices in rank order, algorithm and size. Its label names the
/// collective with its op, algorithm and bytes (traces, timeline).
error lower_collective(const plan& p, const step& s, lowered_step& ls) {
  const graph& g = p.source();
  const step_errors err{s};
  if (s.ops.size() != 1) return err("has " + std::to_string(s.ops.size()) + " nodes, expected 1 collective");
  const node& n = g.at(s.ops.front());
  if (!is_collective_op(n.op)) return err("runs '" + n.name + "', which is not a collective", n.name);
  if (s.peers.size() != n.inputs.size())
    return err("has " + std::to_string(s.peers.size()) + " parts for " + std::to_string(n.inputs.size()) + " operands",
               n.name);
  collective_desc& c = ls.coll;
  c.rank = n.attrs.rank;
  c.algo = s.algo;
  c.bytes = s.bytes;
  if (c.rank < 0 || static_cast<std::size_t>(c.rank) >= s.peers.size() || s.peers[static_cast<std::size_t>(c.rank)] != s.id)
    return err("is not part " + std::to_string(c.rank) + " of its collective", n.name);
  const auto ndev = static_cast<int>(p.devices().size());
  for (std::size_t k = 0; k < s.peers.size(); ++k) {
    const step_id peer = s.peers[k];
    if (peer < 0 || static_cast<std::size_t>(peer) >= p.steps().size())
      return err("names part " + std::to_string(peer) + ", which is not in the plan", n.name);
    const int dev = p.at(peer).device;
    if (dev < 0 || dev >= ndev) return err("has a part on a device out of range", n.name);
    auto a = resolve(p, n.inputs[k], dev);
    if (!a) return err.wrap(a.err(), "operand '" + g.at(n.inputs[k]).name + "'", n.name);
    if (!is_contiguous(a->proto.dims, a->proto.stride))
      return err("operand '" + g.at(n.inputs[k]).name + "' is not contiguous", n.name);
    c.inputs.push_back(*a);
    c.member_devices.push_back(dev);
  }
  auto out = resolve(p, n.id, s.device);
  if (!out) return err.wrap(out.err(), "output '" + n.name + "'", n.name);
  c.out = *out;
  if (runs_in_stream(s)) {
    // One launch record, run on compute lane 0 like a kernel of the lane.
    if (s.peers.size() > static_cast<std::size_t>(max_in_stream_members))
      return err("is an in-stream part of " + std::to_string(s.peers.size()) + " members (at most " +
                     std::to_string(max_in_stream_members) + ")",
                 n.name);
    lowered_op op;
    op.op = &n;
    op.out = c.out;
    op.inputs = c.inputs;
    op.collective.rank = c.rank;
    op.collective.members = static_cast<int>(s.peers.size());
    // The first part's step id names the collective alike on every member.
    op.collective.key = static_cast<uint32_t>(*std::min_element(s.peers.begin(), s.peers.end()));
    for (std::size_t k = 0; k < s.peers.size(); ++k) {
      op.inputs[k].device = c.member_devices[k];
      op.collective.device_index[k] = c.member_devices[k];
    }
    ls.ops.push_back(std::move(op));
  }
  ls.subject = &n;
  ls.label = n.name + " (" + to_string(n.op) + ", " + to_string(c.algo) + ", " + std::to_string(c.bytes) + " B)";
  return {};
}

/// The per-kind part of the lowering: everything a step kind needs beyond
/// queues, deps and consumers. A new step kind is one more case here (and
/// one in the executor, stream_actor.cpp's launch_step).
error lower_step(const plan& p, const step& s, lowered_step& ls) {
  switch (s.kind) {
    case step_kind::compute: return lower_compute(p, s, ls);
    case step_kind::copy_h2d:
    case step_kind::copy_d2h:
    case step_kind::copy_peer: return lower_copy(p, s, ls);
    case step_kind::collective: return lower_collective(p, s, ls);
  }
  return step_errors{s}("has an unknown kind");
}

// ---- the decode-step fusion ----
//
// A whole single-device LLaMA decode step as one record
// (gpu::op_launch::fusion::decode_step, plan_options::fuse_decode_step).
// After apply_fusions such a step's records are, exactly: the embedding's
// get_rows; per layer q/k/v (projections, shared_input, with the norm),
// attention (over the KV cache, with its stores and ropes), o + residual,
// gate/up (gated, with the norm), down + residual; the final rms_norm, the
// head's matmul, and the logits' f32 copy or the argmax (maybe followed by
// the store_rows that keeps its token in a state). The pass checks that
// pattern, its dataflow by operand (the same bytes as the memory plan
// placed them) and the kernel's shape limits, and only then replaces the
// records by one. The memory plan stays the unfused one: the kernel writes
// the caches and, at its very end, after its last read of any input, the
// output; the intermediates' buffers are planned but never written.

/// The same tensor bytes: region, device, offset, dtype and element count
/// (a view of a record's output reads as that output).
bool same_bytes(const operand& a, const operand& b) {
  return a.where == b.where && a.device == b.device && a.byte_offset == b.byte_offset && a.proto.type == b.proto.type &&
         a.proto.dims.numel() == b.proto.dims.numel();
}

bool dims_are(const operand& a, std::initializer_list<int64_t> dims) { return a.proto.dims == shape(dims); }

std::string record_name(const lowered_op& o) { return "'" + o.op->name + "' (" + to_string(o.op->op) + ")"; }

/// Whether store_rows node `store` keeps its one row in row 0 of its state:
/// its position is a constant 0 (an element of a weight of i32, maybe a
/// view into it). The decode-step kernel writes its token at the output's
/// first element.
bool stores_in_row_zero(const graph& g, const node& store) {
  if (store.inputs.size() != 2) return false;
  const node& at = g.at(store.inputs[1]);
  if (at.type != dtype::i32 || at.dims.numel() != 1) return false;
  const node& w = g.at(at.storage);
  if (w.op != op_kind::weight || w.type != dtype::i32 || w.dims.rank() != 1 || !w.data || !w.data->has_values())
    return false;
  int32_t row = -1;
  if (error e = w.data->read_slice(0, at.offset, at.offset + 1, &row)) return false;
  return row == 0;
}

/// One rank's records of a tensor-parallel decode step, read as one
/// device's (match_decode_step): its compute steps' records in queue order,
/// where a read of a collective's result (an all-reduce's, the logits'
/// all-gather's) is a read of the operand this rank gave it. The rank's
/// records then chain as a single device's do: q/k/v read the embedding's
/// partial, the MLP o's, the argmax the rank's head output. The result's
/// bytes stand for the operand only until a record writes over them (the
/// memory plan reuses bytes), so reads are resolved as the records come.
struct tp_rank_view {
  int rank = 0;
  std::vector<lowered_op> records;
  /// Set by match_decode_step: the head's product among `records`.
  const lowered_op* head = nullptr;

  /// The results that stand for an operand now: (result, operand).
  std::vector<std::pair<operand, operand>> stands_for;
  void add_collective(const collective_desc& c);
  void add_record(const lowered_op& r);
};

/// Why the records `ops` (of a plan over graph `g`) are not a decode step
/// the kernel runs (empty: they are, and `fused` is their one record).
/// `tp`: they are that rank's records of a tensor-parallel step (its
/// `records`): a rank past 0 may run o and down as plain products (rank 0
/// adds the residual into its part before their all-reduces) and end with
/// the head's product (rank 0 takes the argmax of the gathered logits);
/// the embedding is the rank's slice of the table and `vocab` its head's
/// rows.
std::string match_decode_step(const graph& g, const std::vector<lowered_op>& ops, tp_rank_view* tp, lowered_op& fused,
                              int64_t max_cache_rows) {
  using fusion = gpu::op_launch::fusion;
  const std::size_t n = ops.size();
  const int rank = tp ? tp->rank : 0;
  const auto plain = [](const lowered_op& o, op_kind k) { return o.fused == fusion::none && o.op->op == k; };
  const auto group = [](const lowered_op& o, projection_kind k) {
    return o.fused == fusion::projections && o.projection == k;
  };
  if (n < (rank > 0 ? 8u : 9u) || !plain(ops.front(), op_kind::get_rows))
    return "the step does not start with the embedding's get_rows";
  // The tail: norm, head, then the f32 copy, or argmax [+ store_rows]. A
  // head of f32 activations is the output itself (no copy): matched too, so
  // that the note names the dtype.
  std::size_t tail = 0;
  bool argmax = false;
  if (plain(ops[n - 1], op_kind::copy)) tail = 3;
  else if (plain(ops[n - 1], op_kind::matmul) && ops[n - 1].out.proto.type == dtype::f32) tail = 2;
  else if (rank > 0 && plain(ops[n - 1], op_kind::matmul)) tail = 2;
  else if (plain(ops[n - 1], op_kind::argmax)) tail = 3, argmax = true;
  else if (plain(ops[n - 1], op_kind::store_rows) && plain(ops[n - 2], op_kind::argmax)) tail = 4, argmax = true;
  else return "the step ends with " + record_name(ops[n - 1]) + ", not the logits' copy or argmax";
  // Q/k/v biases (Qwen2's): three adds after each layer's projections;
  // q/k norms (Qwen3's): two rms_norms over each head's q and k after them.
  // So 5, 7, 8 or 10 records a layer.
  const bool biased = n > 2 && plain(ops[2], op_kind::add);
  const std::size_t after_biases = biased ? 5 : 2;
  const bool normed = n > after_biases && plain(ops[after_biases], op_kind::rms_norm);
  const std::size_t per_layer = 5 + (biased ? 3 : 0) + (normed ? 2 : 0);
  if ((n - 1 - tail) % per_layer != 0)
    return std::to_string(n) + " records, not the embedding, " + std::to_string(per_layer) + " a layer and the head's";
  const int layers = static_cast<int>((n - 1 - tail) / per_layer);
  const lowered_op& embed = ops[0];
  const lowered_op& norm = ops[n - tail];
  const lowered_op& head = ops[n - tail + 1];
  const lowered_op& last = ops[n - 1];
  if (!plain(norm, op_kind::rms_norm) || norm.inputs.empty() || norm.inputs.size() > 2)
    return record_name(norm) + " where the final rms_norm goes";
  if (!plain(head, op_kind::matmul) || head.op->attrs.trans_a || !head.op->attrs.trans_b || head.inputs.size() != 2)
    return record_name(head) + " where the head's matmul (x w^T) goes";
  const lowered_op& top = tail == 4 ? ops[n - 2] : last;  // the copy or argmax (or the head)
  if (tail > 2 && (top.inputs.size() != 1 || !same_bytes(top.inputs[0], head.out)))
    return record_name(top) + " reads no head output";
  if (!argmax && rank == 0 && top.out.proto.type != dtype::f32)
    return "the logits are copied to " + std::string(to_string(top.out.proto.type));
  if (argmax && (top.out.proto.type != dtype::i32 || top.out.proto.dims.numel() != 1))
    return "more than one greedy token";
  // Its token kept in a state of one row, or in row 0 of a state of several
  // (a batched generator's one-token steps: transformer_config::token_state_rows).
  if (tail == 4 &&
      (last.inputs.size() != 2 || !same_bytes(last.inputs[0], top.out) || last.inputs[1].where != region::weights ||
       (last.out.proto.dims.numel() != 1 && !stores_in_row_zero(g, *last.op))))
    return record_name(last) + " keeps no greedy token of its own";

  // The embedding: one token of a batch of 1.
  if (embed.inputs.size() != 2 || embed.inputs[0].proto.dims.rank() != 2) return "the embedding is not a table's rows";
  // A rank's logits are its head's rows; its table's rows are another slice.
  const int64_t vocab = tp ? head.inputs[1].proto.dims[0] : embed.inputs[0].proto.dims[0];
  const int64_t d = embed.inputs[0].proto.dims[1];
  const dtype t = embed.out.proto.type;
  if (embed.inputs[1].proto.type != dtype::i32 || embed.inputs[1].proto.dims.numel() != 1 ||
      embed.out.proto.dims.numel() != d)
    return "not one token (batch 1, one position)";

  gpu::op_launch::decode_step_params ds;
  ds.layers = layers;
  ds.d_model = d;
  ds.vocab = vocab;
  ds.argmax = argmax;
  fused.op = last.op;
  fused.out = last.out;
  fused.fused = fusion::decode_step;
  fused.inputs.assign(6, operand{});
  fused.inputs[0] = embed.inputs[1];
  fused.inputs[1] = embed.inputs[0];
  fused.inputs[5] = head.inputs[1];
  ds.final_norm_weighted = norm.inputs.size() == 2;
  if (ds.final_norm_weighted) fused.inputs.push_back(norm.inputs[1]);
  ds.eps = norm.op->attrs.eps;

  const operand* residual = &embed.out;  // the layer's input
  for (int l = 0; l < layers; ++l) {
    const std::string at = "layer " + std::to_string(l + 1) + ": ";
    const lowered_op* r = &ops[1 + per_layer * static_cast<std::size_t>(l)];
    const lowered_op &qkv = r[0], &att = r[per_layer - 4], &o = r[per_layer - 3], &mlp = r[per_layer - 2],
                     &down = r[per_layer - 1];
    const lowered_op* bias = biased ? r + 1 : nullptr;                // q's, k's, v's adds
    const lowered_op* qk_norm = normed ? r + (biased ? 4 : 1) : nullptr;  // q's, k's rms_norms
    // The attention first: without a KV cache (or its ropes) the rest
    // differs too, and this says why best.
    if (att.fused != fusion::attention || att.inputs.size() != 8 || !att.attention.masked ||
        !att.attention.store_new_rows || !att.attention.rope_q || !att.attention.rope_k || att.attention.causal)
      return at + record_name(att) + " where attention over a KV cache with its stores and ropes goes";
    if (!group(qkv, projection_kind::shared_input) || !qkv.projection_norm.on || qkv.projection_rope.roped != 0 ||
        qkv.extra_outs.size() != 2 || qkv.inputs.size() != (qkv.projection_norm.weighted ? 5u : 4u))
      return at + record_name(qkv) + " where q, k, v with their rms_norm go";
    // A rank past 0 of a tensor-parallel step: o and down as plain x w^T.
    const auto product = [&](const lowered_op& r) {
      return rank > 0 && plain(r, op_kind::matmul) && !r.op->attrs.trans_a && r.op->attrs.trans_b && r.inputs.size() == 2;
    };
    const bool o_plain = product(o), down_plain = product(down);
    if (!o_plain && (!group(o, projection_kind::residual) || o.projection_norm.on || o.inputs.size() != 3))
      return at + record_name(o) + " where o + residual goes";
    if (!group(mlp, projection_kind::gated) || !mlp.projection_norm.on ||
        mlp.inputs.size() != (mlp.projection_norm.weighted ? 4u : 3u))
      return at + record_name(mlp) + " where the gated MLP with its rms_norm goes";
    if (!down_plain && (!group(down, projection_kind::residual) || down.projection_norm.on || down.inputs.size() != 3))
      return at + record_name(down) + " where down + residual goes";
    // The biases (q, k and v, each plus a weight, in that order), then the
    // q/k norms (q's, then k's, each with a weight of its own): each a plain
    // record of what the one before made and a weight, as many elements out.
    const operand* made[3] = {&qkv.out, &qkv.extra_outs[0], &qkv.extra_outs[1]};
    const auto takes_weight = [&](const lowered_op& r, op_kind k, int i) {
      if (!plain(r, k) || r.inputs.size() != 2 || !same_bytes(r.inputs[0], *made[i]) ||
          r.inputs[1].where != region::weights || r.out.proto.dims.numel() != made[i]->proto.dims.numel())
        return false;
      made[i] = &r.out;
      return true;
    };
    for (int i = 0; biased && i < 3; ++i)
      if (!takes_weight(bias[i], op_kind::add, i)) return at + record_name(bias[i]) + " where " + "qkv"[i] + "'s bias goes";
    for (int i = 0; normed && i < 2; ++i)
      if (!takes_weight(qk_norm[i], op_kind::rms_norm, i))
        return at + record_name(qk_norm[i]) + " where " + "qk"[i] + "'s weighted rms_norm goes";
    // Dataflow: each record reads what the one before it made.
    if (!same_bytes(qkv.inputs[0], *residual) || !same_bytes(att.inputs[0], *made[0]) ||
        !same_bytes(att.inputs[4], *made[1]) || !same_bytes(att.inputs[5], *made[2]) ||
        !same_bytes(o.inputs[0], att.out) || (!o_plain && !same_bytes(o.inputs[2], *residual)) ||
        !same_bytes(mlp.inputs[0], o.out) || !same_bytes(down.inputs[0], mlp.out) ||
        (!down_plain && !same_bytes(down.inputs[2], o.out)))
      return at + "a record reads what the layer's pattern does not say";
    residual = &down.out;
    // What every layer shares: the mask, the positions, the constants.
    if (l == 0) {
      fused.inputs[2] = att.inputs[7];
      fused.inputs[3] = att.inputs[6];
      fused.inputs[4] = att.inputs[3];
      ds.rope_theta = att.attention.rope_theta;
      ds.rope_scale = att.attention.rope_scale;
      ds.scale = att.attention.scale;
      ds.norm_weighted = qkv.projection_norm.weighted;
    } else if (!same_bytes(att.inputs[7], fused.inputs[2]) || !same_bytes(att.inputs[6], fused.inputs[3]) ||
               !same_bytes(att.inputs[3], fused.inputs[4])) {
      return at + "its mask or positions are not layer 1's";
    } else if (att.attention.rope_theta != ds.rope_theta || !(att.attention.rope_scale == ds.rope_scale) ||
               att.attention.scale != ds.scale) {
      return at + "its rope theta, rope scaling or softmax scale differs";
    }
    if (qkv.projection_norm.eps != ds.eps || mlp.projection_norm.eps != ds.eps ||
        (normed && (qk_norm[0].op->attrs.eps != ds.eps || qk_norm[1].op->attrs.eps != ds.eps)))
      return at + "an rms_norm's eps differs";
    if (qkv.projection_norm.weighted != ds.norm_weighted || mlp.projection_norm.weighted != ds.norm_weighted)
      return at + "norm weights where another layer has none (or the other way round)";
    const operand &wq = qkv.inputs[1], &wk = qkv.inputs[2], &wv = qkv.inputs[3];
    const operand &kc = att.inputs[1], &vc = att.inputs[2];
    const operand &wo = o.inputs[1], &wg = mlp.inputs[1], &wu = mlp.inputs[2], &wd = down.inputs[1];
    // Shapes: [1, Hkv, C, dh] caches give the heads; the weights agree.
    if (kc.proto.dims.rank() != 4 || kc.proto.dims[0] != 1 || vc.proto.dims != kc.proto.dims ||
        wq.proto.dims.rank() != 2 || wg.proto.dims.rank() != 2)
      return at + "caches or weights of another rank";
    const int64_t kv_heads = kc.proto.dims[1], rows = kc.proto.dims[2], dh = kc.proto.dims[3];
    const int64_t heads = dh > 0 ? wq.proto.dims[0] / dh : 0, ff = wg.proto.dims[0];
    if (l == 0) ds.heads = heads, ds.kv_heads = kv_heads, ds.head_dim = dh, ds.cache_rows = rows, ds.d_ff = ff;
    if (heads != ds.heads || kv_heads != ds.kv_heads || dh != ds.head_dim || rows != ds.cache_rows || ff != ds.d_ff ||
        !dims_are(wq, {heads * dh, d}) || !dims_are(wk, {kv_heads * dh, d}) || wv.proto.dims != wk.proto.dims ||
        !dims_are(wo, {d, heads * dh}) || !dims_are(wg, {ff, d}) || wu.proto.dims != wg.proto.dims ||
        !dims_are(wd, {d, ff}))
      return at + "weights or caches of other shapes";
    for (const operand* w : {&wq, &wk, &wv, &kc, &vc, &wo, &wg, &wu, &wd}) fused.inputs.push_back(*w);
    if (ds.norm_weighted)
      for (const operand* w : {&qkv.inputs[4], &mlp.inputs[3]}) {
        if (!dims_are(*w, {d})) return at + "a norm weight of another shape";
        fused.inputs.push_back(*w);
      }
    if (biased)
      for (int i = 0; i < 3; ++i) {
        const operand& b = bias[i].inputs[1];
        if (b.proto.dims.numel() != (i == 0 ? heads : kv_heads) * dh) return at + "a bias of another shape";
        fused.inputs.push_back(b);
      }
    if (normed)
      for (int i = 0; i < 2; ++i) {
        // Over each head's dh values: the norm's rows are the heads.
        const operand& w = qk_norm[i].inputs[1];
        const auto& x = qk_norm[i].inputs[0].proto.dims;
        if (!dims_are(w, {dh}) || x.rank() < 1 || x[x.rank() - 1] != dh)
          return at + record_name(qk_norm[i]) + " does not normalise each head's " + std::to_string(dh) + " values";
        fused.inputs.push_back(w);
      }
  }
  ds.qkv_bias = biased;
  ds.qk_norm = normed;
  if (!same_bytes(norm.inputs[0], *residual) || !same_bytes(head.inputs[0], norm.out))
    return "the final norm or the head reads what the pattern does not say";
  if (norm.op->attrs.eps != ds.eps) return "the final norm's eps differs from the layers'";
  if (!dims_are(fused.inputs[5], {vocab, d}) || (ds.final_norm_weighted && !dims_are(norm.inputs[1], {d})))
    return "the head's or the final norm's weight is of another shape";
  if (fused.inputs[2].proto.type != dtype::i32 || fused.inputs[2].proto.dims.numel() != 1 ||
      fused.inputs[3].proto.type != dtype::i32 || fused.inputs[3].proto.dims.numel() != 1 ||
      fused.inputs[4].proto.dims.numel() != ds.cache_rows)
    return "positions or mask not of one token over the cache";
  const decode_step_shape shape_of{layers, d, ds.d_ff, ds.heads, ds.kv_heads, ds.head_dim, vocab, ds.cache_rows, t};
  if (std::string why = decode_step_misfit(shape_of, max_cache_rows); !why.empty())
    return "outside the kernel's limits: " + why;
  // One storage type for the activations, weights, caches and the mask
  // (all but the token and the positions).
  for (std::size_t i = 0; i < fused.inputs.size(); ++i)
    if (i != 0 && i != 2 && i != 3 && fused.inputs[i].proto.type != t)
      return "an input of " + std::string(to_string(fused.inputs[i].proto.type)) + " beside " + to_string(t) +
             " activations";
  // The kernel reads and writes whole tensors, row after row.
  for (const operand& a : fused.inputs)
    if (!is_contiguous(a.proto.dims, a.proto.stride)) return "an operand is not contiguous";
  if (!is_contiguous(fused.out.proto.dims, fused.out.proto.stride)) return "the output is not contiguous";
  fused.decode_step = ds;
  if (tp) tp->head = &head;
  return {};
}

std::string fuse_tp_decode_step(const plan& p, const std::vector<launch_queue>& queues, std::vector<lowered_step>& steps,
                                bool& fused);

/// Replaces the records of the plan's one compute step by one decode-step
/// record where plan_options::fuse_decode_step asks for it and the step is
/// one the kernel runs (match_decode_step); returns the note for
/// launch_program::decode_step_note() and sets `fused`. A tensor-parallel
/// step goes to fuse_tp_decode_step.
std::string fuse_decode_step(const plan& p, const std::vector<launch_queue>& queues, std::vector<lowered_step>& steps,
                             bool& fused) {
  fused = false;
  const plan_options& o = p.options();
  const std::string no = "decode step not fused: ";
  if (!o.fuse_decode_step) return no + "plan_options::fuse_decode_step off";
  if (!o.fuse_ops || !o.fuse_projections) return no + "it needs fuse_ops and fuse_projections";
  if (p.tensor_degree() > 1) {
    if (!o.fuse_tp_decode_step) return no + "tensor parallel (collectives), and plan_options::fuse_tp_decode_step off";
    return fuse_tp_decode_step(p, queues, steps, fused);
  }
  if (std::any_of(p.steps().begin(), p.steps().end(), [](const step& s) { return s.kind == step_kind::collective; }))
    return no + "tensor parallel (collectives)";
  if (p.used_devices().size() != 1) return no + "the plan uses " + std::to_string(p.used_devices().size()) + " devices";
  if (p.devices().at(static_cast<std::size_t>(p.used_devices().front())).kind != device_kind::cuda)
    return no + "not on a CUDA device";
  lowered_step* compute = nullptr;
  for (lowered_step& ls : steps) {
    if (ls.kind != step_kind::compute || ls.ops.empty()) continue;
    if (compute) return no + "more than one compute step";
    compute = &ls;
  }
  if (!compute) return no + "no compute step";
  lowered_op one;
  if (std::string why = match_decode_step(p.source(), compute->ops, nullptr, one, o.decode_step_max_cache_rows);
      !why.empty())
    return no + why;
  const int layers = one.decode_step.layers;
  compute->ops.assign(1, std::move(one));
  fused = true;
  return "decode step: one kernel (" + std::to_string(layers) + " layers)";
}

}  // namespace

/// Fills collective_desc::peer_ordered_deps of every collective part: a
/// remote dep d of part k is ordered by member j's part p (j != k) when d
/// runs on j's device and p waits for it (a dep of p) or runs after it on
/// p's queue. Then p joins the collective only after d, and a part that
/// waits for p to join (on the device) need not wait for d's event.
void mark_peer_ordered_deps(const plan& pl, launch_program& prog) {
  for (auto& ls : prog.steps_) {
    if (ls.kind != step_kind::collective) continue;
    const step& s = pl.at(ls.id);
    auto& c = ls.coll;
    for (step_id d : ls.remote_deps) {
      const lowered_step& ld = prog.steps_[static_cast<std::size_t>(d)];
      for (std::size_t j = 0; j < s.peers.size(); ++j) {
        if (static_cast<int>(j) == c.rank || c.member_devices[j] != ld.device || ld.device == ls.device) continue;
        const step_id peer = s.peers[j];
        const lowered_step& lp = prog.steps_[static_cast<std::size_t>(peer)];
        const auto& peer_deps = pl.at(peer).deps;
        const bool ordered = std::find(peer_deps.begin(), peer_deps.end(), d) != peer_deps.end() ||
                             (ld.queue == lp.queue && ld.pos < lp.pos);
        if (ordered) {
          c.peer_ordered_deps.push_back(d);
          break;
        }
      }
    }
  }
}

int launch_program::find_queue(int device, step_kind kind, int lane) const noexcept {
  for (std::size_t q = 0; q < queues_.size(); ++q)
    if (queues_[q].device == device && queues_[q].kind == kind && queues_[q].lane == lane) return static_cast<int>(q);
  return -1;
}

namespace {

/// The bytes an operand spans in its region: [first, last) (a view's
/// strides may skip some; counted as covered).
struct byte_span {
  region where = region::arena;
  int device = -1;
  int64_t first = 0, last = 0;
};

byte_span span_of(const operand& a) {
  const int64_t es = static_cast<int64_t>(dtype_size(a.proto.type));
  int64_t lo = 0, hi = 0;
  for (int k = 0; k < a.proto.dims.rank(); ++k) {
    const int64_t extent = (a.proto.dims[k] - 1) * a.proto.stride[static_cast<std::size_t>(k)];
    if (a.proto.dims[k] == 0) return {a.where, a.device, a.byte_offset, a.byte_offset};
    (extent < 0 ? lo : hi) += extent;
  }
  return {a.where, a.device, a.byte_offset + lo * es, a.byte_offset + (hi + 1) * es};
}

bool overlap(const byte_span& x, const byte_span& y) {
  return x.where == y.where && x.device == y.device && x.first < y.last && y.first < x.last;
}

// ---- the tensor-parallel decode step ----
//
// plan_options::fuse_tp_decode_step: a decode step split over one group of
// CUDA devices runs as one decode-step record a rank, whose kernels meet on
// the devices where the step's collectives did (the embedding's and each
// layer's o and down all-reduces, in-stream; the logits' all-gather, whose
// argmax the kernels take by exchanging each rank's best logit). The pass
// reads each rank's records as one device's (tp_rank_view,
// match_decode_step), puts the rank's record in its first compute step of
// records, and absorbs the rank's other steps of the decode step
// (lowered_step::absorbed_into): they keep their places in the queues,
// their deps, consumers and events, and launch nothing, so the order lower()
// built holds as it is. That is safe only where nothing outside the decode
// step reads what those steps would have written but the output the kernel
// writes, and where the first step's stream already has every input the
// kernel reads (an input its later steps waited for is not waited for any
// more): both are checked, and anything else keeps its records.

void tp_rank_view::add_collective(const collective_desc& c) {
  const byte_span at = span_of(c.out);
  std::erase_if(stands_for, [&](const auto& r) { return overlap(span_of(r.first), at); });
  stands_for.emplace_back(c.out, c.inputs.at(static_cast<std::size_t>(rank)));
}

void tp_rank_view::add_record(const lowered_op& r) {
  lowered_op& read = records.emplace_back(r);
  for (operand& a : read.inputs)
    for (const auto& [result, given] : stands_for)
      if (same_bytes(a, result)) {
        a = given;
        break;
      }
  // Bytes the record writes hold no collective's result any more.
  const auto writes = [&](const operand& o) {
    std::erase_if(stands_for, [&](const auto& x) { return overlap(span_of(x.first), span_of(o)); });
  };
  writes(r.out);
  for (const operand& o : r.extra_outs) writes(o);
}

/// Whether two of `n` members, member k on device device_of(k), are
/// logical devices of one GPU (a spec such as "cuda:0,0": one CUDA context).
template <class DeviceOf>
bool members_share_a_gpu(const plan& pl, int n, DeviceOf device_of) {
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      const device_spec& a = pl.devices().at(static_cast<std::size_t>(device_of(i)));
      const device_spec& b = pl.devices().at(static_cast<std::size_t>(device_of(j)));
      if (a.kind == b.kind && a.ordinal == b.ordinal) return true;
    }
  return false;
}

/// Whether two ranks of the tensor-parallel decode-step record of `ls` are
/// logical devices of one GPU.
bool decode_step_ranks_share_a_gpu(const plan& pl, const lowered_step& ls) {
  if (ls.ops.size() != 1) return false;
  const gpu::op_launch::in_stream_part& c = ls.ops.front().collective;
  return members_share_a_gpu(pl, c.members, [&](int k) { return c.device_index[static_cast<std::size_t>(k)]; });
}

/// The tensor-parallel form of fuse_decode_step (see above); the same
/// contract. Changes nothing unless every rank matches.
std::string fuse_tp_decode_step(const plan& p, const std::vector<launch_queue>& queues, std::vector<lowered_step>& steps,
                                bool& fused) {
  const std::string no = "decode step not fused: ";
  const graph& g = p.source();
  const tensor_parallel_info& tp = *p.tensor_parallel();
  if (tp.stages != 1) return no + "tensor parallel over " + std::to_string(tp.stages) + " pipeline stages";
  const int degree = tp.degree;
  if (degree > max_in_stream_members)
    return no + "tensor degree " + std::to_string(degree) + " (at most " + std::to_string(max_in_stream_members) +
           " ranks)";
  const std::vector<int>& ranks = tp.devices.front();
  for (int d : p.used_devices())
    if (std::find(ranks.begin(), ranks.end(), d) == ranks.end())
      return no + "device " + std::to_string(d) + " is no rank of the tensor-parallel group";
  for (std::size_t k = 0; k < ranks.size(); ++k)
    if (p.devices().at(static_cast<std::size_t>(ranks[k])).kind != device_kind::cuda)
      return no + "rank " + std::to_string(k) + " not on a CUDA device";
  // The kernels pick the token: logits as the output (each rank's copied to
  // the host) are not theirs to make.
  if (std::none_of(g.nodes().begin(), g.nodes().end(), [](const node& n) { return n.op == op_kind::argmax; }))
    return no + "the logits are an output (a tensor-parallel step takes the argmax only)";
  // The kernels do what in-stream all-reduces and the logits' all-gather
  // do; a collective of the communication queue is one they do not.
  for (const step& s : p.steps()) {
    if (s.kind == step_kind::copy_peer) return no + "a peer copy of '" + g.at(s.ops.front()).name + "'";
    if (s.kind != step_kind::collective || runs_in_stream(s)) continue;
    const node& n = g.at(s.ops.front());
    if (n.op != op_kind::all_gather)
      return no + "the " + to_string(n.op) + " '" + n.name + "' runs on the communication queue (" +
             to_string(s.algo) + "), not in-stream";
  }

  struct rank_step {
    lowered_step* first = nullptr;  ///< its first compute step of records: the decode-step record's
    std::vector<step_id> absorbed;
    lowered_op record;
  };
  std::vector<rank_step> per(static_cast<std::size_t>(degree));
  for (int k = 0; k < degree; ++k) {
    const int dev = ranks[static_cast<std::size_t>(k)];
    const std::string at = no + "rank " + std::to_string(k) + ": ";
    rank_step& r = per[static_cast<std::size_t>(k)];
    int q = -1;
    std::vector<step_id> gathers;  // its parts of collectives off the compute lane
    for (const step& s : p.steps()) {
      if (s.device != dev) continue;
      if (s.kind == step_kind::collective && !runs_in_stream(s)) gathers.push_back(s.id);
      if (s.kind != step_kind::compute && !runs_in_stream(s)) continue;
      const int sq = steps[static_cast<std::size_t>(s.id)].queue;
      if (q >= 0 && sq != q) return at + "its steps run on more than one compute lane";
      q = sq;
    }
    if (q < 0) return at + "no compute step";
    if (gathers.size() != 1)
      return at + std::to_string(gathers.size()) + " collective parts off its compute lane (the logits' all-gather is one)";
    tp_rank_view view;
    view.rank = k;
    bool gathered = false;
    for (step_id id : queues[static_cast<std::size_t>(q)].steps) {
      lowered_step& ls = steps[static_cast<std::size_t>(id)];
      const step& s = p.at(id);
      if (s.kind == step_kind::compute) {
        if (!r.first && ls.ops.empty()) continue;
        // From the first step that waits for them on, the gathered logits
        // stand for this rank's.
        if (!gathered && std::find(s.deps.begin(), s.deps.end(), gathers.front()) != s.deps.end()) {
          view.add_collective(steps[static_cast<std::size_t>(gathers.front())].coll);
          gathered = true;
        }
        if (r.first) r.absorbed.push_back(id);
        else r.first = &ls;
        for (const lowered_op& op : ls.ops) view.add_record(op);
      } else if (runs_in_stream(s)) {
        if (!r.first) return at + "an all-reduce before its first records";
        r.absorbed.push_back(id);
        view.add_collective(ls.coll);
      } else if (r.first && s.kind == step_kind::copy_h2d) {
        return at + "its input '" + g.at(s.ops.front()).name + "' is copied in after its first records";
      }
    }
    if (!r.first) return at + "no compute step of records";
    r.absorbed.push_back(gathers.front());
    if (std::string why = match_decode_step(g, view.records, &view, r.record, p.options().decode_step_max_cache_rows);
        !why.empty())
      return at + why;
    auto& ds = r.record.decode_step;
    if (ds.qk_norm) return no + "q/k norms (a tensor-parallel step takes none)";
    if (k == 0 && !ds.argmax) return no + "the logits are an output (a tensor-parallel step takes the argmax only)";
    // The head's logits gathered along their last dim, in rank order.
    const step& gs = p.at(gathers.front());
    const node& gn = g.at(gs.ops.front());
    const collective_desc& gc = steps[static_cast<std::size_t>(gs.id)].coll;
    const int axis = gc.out.proto.dims.rank() - 1;
    const auto columns = [&](const operand& a) { return a.proto.dims[a.proto.dims.rank() - 1]; };
    if (gn.op != op_kind::all_gather || gn.attrs.axis != axis || gn.attrs.axis2 != axis ||
        !same_bytes(gc.inputs.at(static_cast<std::size_t>(k)), view.head->out))
      return at + "'" + gn.name + "' is not the all-gather of its head's logits";
    int64_t total = 0;
    for (std::size_t j = 0; j < gc.inputs.size(); ++j) {
      if (static_cast<int>(j) == k) ds.logit_begin = total;
      total += columns(gc.inputs[j]);
    }
    ds.vocab_total = columns(gc.out);
    if (total != ds.vocab_total) return at + "'" + gn.name + "' gathers another number of logits than its parts hold";
    // The embedding: the rank's slice of the table's rows, zeros elsewhere.
    const lowered_op& embed = view.records.front();
    if (embed.op->attrs.end != ds.vocab_total)
      return at + "the embedding is not a slice of the head's vocabulary (a table split by rows)";
    ds.embed_rows = embed.inputs[0].proto.dims[0];
    ds.embed_begin = embed.op->attrs.begin;
    // Every rank picks the token; a rank past 0 writes it where it keeps
    // its own (a token state its next step reads).
    ds.tp_token_out = k > 0 && ds.argmax;
    ds.argmax = true;
    ds.tp_rank = k;
    ds.tp_degree = degree;
    gpu::op_launch::in_stream_part& c = r.record.collective;
    c.rank = k;
    c.members = degree;
    for (int j = 0; j < degree; ++j)
      c.device_index[static_cast<std::size_t>(j)] = ranks[static_cast<std::size_t>(j)];
    // The kernels go through the same phases: what they share must agree.
    const auto& d0 = per.front().record.decode_step;
    if (ds.layers != d0.layers || ds.d_model != d0.d_model || ds.head_dim != d0.head_dim ||
        ds.cache_rows != d0.cache_rows || ds.eps != d0.eps || ds.rope_theta != d0.rope_theta ||
        !(ds.rope_scale == d0.rope_scale) || ds.scale != d0.scale || ds.norm_weighted != d0.norm_weighted ||
        ds.final_norm_weighted != d0.final_norm_weighted || ds.qkv_bias != d0.qkv_bias ||
        ds.vocab_total != d0.vocab_total)
      return at + "its layers, widths or constants are not rank 0's";
    int64_t embed_begin = 0;  // where the slice before ends
    if (k > 0) {
      const auto& before = per[static_cast<std::size_t>(k - 1)].record.decode_step;
      embed_begin = before.embed_begin + before.embed_rows;
    }
    if (ds.embed_begin != embed_begin || (k + 1 == degree && ds.embed_begin + ds.embed_rows != ds.vocab_total))
      return at + "the ranks' embedding slices do not cover the vocabulary in rank order";
  }

  // The record of each step's rank, for the step and the steps it absorbs.
  std::vector<step_id> owner(steps.size(), -1);
  for (const rank_step& r : per) {
    owner[static_cast<std::size_t>(r.first->id)] = r.first->id;
    for (step_id id : r.absorbed) owner[static_cast<std::size_t>(id)] = r.first->id;
  }
  for (const rank_step& r : per) {
    const lowered_step& first = *r.first;
    // What the first step's stream has by then: its queue's steps before
    // it, and what they and it waited for.
    const launch_queue& fq = queues[static_cast<std::size_t>(first.queue)];
    std::vector<step_id> had(fq.steps.begin(), fq.steps.begin() + first.pos);
    for (int i = 0; i <= first.pos; ++i) {
      const auto& waited = steps[static_cast<std::size_t>(fq.steps[static_cast<std::size_t>(i)])].remote_deps;
      had.insert(had.end(), waited.begin(), waited.end());
    }
    const operand& out = r.record.out;
    const bool writes = r.record.decode_step.tp_rank == 0 || r.record.decode_step.tp_token_out;
    const int64_t out_bytes = out.proto.dims.numel() * static_cast<int64_t>(dtype_size(out.proto.type));
    std::vector<step_id> mine(1, first.id);
    mine.insert(mine.end(), r.absorbed.begin(), r.absorbed.end());
    for (step_id x : mine) {
      const step& s = p.at(x);
      for (step_id d : s.deps)
        if (owner[static_cast<std::size_t>(d)] < 0 && std::find(had.begin(), had.end(), d) == had.end())
          return no + "step " + std::to_string(x) + " waits for step " + std::to_string(d) + " (" +
                 to_string(p.at(d).kind) + " on device " + std::to_string(p.at(d).device) +
                 "), which the decode-step record's step " + std::to_string(first.id) + " does not";
      // Outside the decode step only the copy of its output may read it.
      for (step_id c : s.consumers) {
        if (owner[static_cast<std::size_t>(c)] >= 0) continue;
        const lowered_step& lc = steps[static_cast<std::size_t>(c)];
        const copy_desc& cd = lc.copy;
        const bool the_output = lc.kind == step_kind::copy_d2h && writes && lc.device == first.device && !cd.gather &&
                                cd.src.where == out.where && cd.src.byte_offset >= out.byte_offset &&
                                cd.src.byte_offset + cd.bytes <= out.byte_offset + out_bytes;
        if (!the_output)
          return no + "step " + std::to_string(c) + " (" + to_string(lc.kind) + ", '" + lc.label +
                 "') reads what the decode step's kernels do not write";
      }
    }
  }

  const int layers = per.front().record.decode_step.layers;
  for (rank_step& r : per) {
    r.first->label += " (decode step, rank " + std::to_string(r.record.decode_step.tp_rank) + " of " +
                      std::to_string(degree) + ")";
    r.first->ops.assign(1, std::move(r.record));
    r.first->job_tag = true;
    for (step_id id : r.absorbed) {
      lowered_step& ls = steps[static_cast<std::size_t>(id)];
      ls.ops.clear();
      ls.absorbed_into = r.first->id;
      ls.label += " (in the decode step)";
    }
  }
  fused = true;
  return "decode step: one kernel a rank (" + std::to_string(layers) + " layers, tensor degree " +
         std::to_string(degree) + ")";
}

}  // namespace

std::vector<gpu::op_launch> launch_program::launch_records(int q) const {
  const auto& queue = queues_.at(static_cast<std::size_t>(q));
  std::vector<gpu::op_launch> r;
  r.reserve(static_cast<std::size_t>(queue.launch_records));
  // What the record before wrote (its output and extra outputs): an input
  // outside them is settled (gpu::op_launch::settled_inputs).
  std::vector<byte_span> written_before;
  for (step_id s : queue.steps) {
    for (const auto& op : steps_[static_cast<std::size_t>(s)].ops) {
      gpu::op_launch l;
      l.op = op.op;
      l.source = &plan_->source();
      l.out = op.out.proto;
      l.inputs.reserve(op.inputs.size());
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        const operand& a = op.inputs[i];
        l.inputs.push_back(a.proto);
        // The masks hold 32 inputs: a decode-step record's later ones (6 + 9
        // a layer) are neither marked weights nor settled.
        if (i >= 32 || a.device >= 0) continue;
        if (a.where == region::weights) {
          l.weight_inputs |= uint32_t{1} << i;
          l.settled_inputs |= uint32_t{1} << i;
          continue;
        }
        const byte_span in = span_of(a);
        if (std::none_of(written_before.begin(), written_before.end(),
                         [&](const byte_span& w) { return overlap(in, w); }))
          l.settled_inputs |= uint32_t{1} << i;
      }
      written_before.clear();
      written_before.push_back(span_of(op.out));
      for (const auto& o : op.extra_outs) written_before.push_back(span_of(o));
      l.fused = op.fused;
      l.attention = op.attention;
      l.projection = op.projection;
      l.projection_norm = op.projection_norm;
      l.projection_rope = op.projection_rope;
      l.decode_step = op.decode_step;
      l.collective = op.collective;
      for (const auto& o : op.extra_outs) l.extra_outs.push_back(o.proto);
      r.push_back(std::move(l));
    }
  }
  return r;
}

error check_launch_order(const plan& p, const std::vector<launch_queue>& queues) {
  std::vector<char> done(p.steps().size(), 0);
  std::vector<std::size_t> pos(queues.size(), 0);
  std::size_t left = 0;
  for (const auto& q : queues) left += q.steps.size();
  bool progress = true;
  while (left > 0 && progress) {
    progress = false;
    for (std::size_t q = 0; q < queues.size(); ++q) {
      while (pos[q] < queues[q].steps.size()) {
        const step& s = p.at(queues[q].steps[pos[q]]);
        bool ready = true;
        for (step_id d : s.deps) ready = ready && done[static_cast<std::size_t>(d)];
        if (!ready) break;
        done[static_cast<std::size_t>(s.id)] = 1;
        ++pos[q];
        --left;
        progress = true;
      }
    }
  }
  if (left == 0) return {};
  for (std::size_t q = 0; q < queues.size(); ++q) {
    if (pos[q] >= queues[q].steps.size()) continue;
    const step_id s = queues[q].steps[pos[q]];
    const launch_queue& lq = queues[q];
    return {errc::internal,
            "plan's lane order deadlocks: step " + std::to_string(s) + " on " + lane_name(lq.kind, lq.lane) +
                " of device " + std::to_string(lq.device) + " waits for a step queued behind it",
            lq.device, s};
  }
  return {errc::internal, "plan's lane order deadlocks"};
}

/// Whether two members of in-stream part `s` are logical devices of one GPU
/// (a spec such as "cuda:0,0": one CUDA context).
bool in_stream_members_share_a_gpu(const plan& pl, const step& s) {
  return runs_in_stream(s) && members_share_a_gpu(pl, static_cast<int>(s.peers.size()), [&](int k) {
           return pl.at(s.peers[static_cast<std::size_t>(k)]).device;
         });
}

namespace {

/// Ops whose kernels read their inputs element by element, each element a
/// few times at most (so reading them from pinned host memory costs a
/// PCIe read, not a stream of them): plan_options::host_windows_in_place.
bool reads_elementwise(op_kind k) noexcept {
  switch (k) {
    case op_kind::add: case op_kind::mul: case op_kind::scale: case op_kind::gelu: case op_kind::silu:
    case op_kind::copy: case op_kind::get_rows: case op_kind::store_rows: return true;
    default: return false;
  }
}
/// Ops whose kernels write their output element by element, once.
bool writes_elementwise(op_kind k) noexcept {
  return (reads_elementwise(k) && k != op_kind::store_rows) || k == op_kind::argmax;
}

/// Lets the kernels of a replay segment (its steps `in_seg`) read the input
/// of h2d step `cs` (or write the output of d2h step `cs`) in the arena's
/// host window itself (copy_desc::in_place), when every reader of that
/// tensor, and for an output its producer, is an unfused elementwise kernel
/// of the segment; else changes nothing.
void place_in_window(const plan& pl, std::vector<lowered_step>& steps, const std::vector<step_id>& in_seg, lowered_step& cs) {
  const graph& g = pl.source();
  const step& ps = pl.at(cs.id);
  if (ps.ops.size() != 1) return;
  const node_id t = ps.ops.front();
  const bool h2d = cs.kind == step_kind::copy_h2d;
  if (!h2d && g.at(t).is_view()) return;  // the window holds the copied run, not its storage
  const auto in_segment = [&](step_id s) { return std::find(in_seg.begin(), in_seg.end(), s) != in_seg.end(); };
  // Every reader of t depends on the step that makes it: the copy (h2d) or
  // its producer step (d2h). Those steps must all be kernels of the segment.
  step_id maker = cs.id;
  if (!h2d) {
    if (ps.deps.size() != 1 || !in_segment(ps.deps.front())) return;
    maker = ps.deps.front();
  }
  std::vector<step_id> users;
  for (step_id c : pl.at(maker).consumers) {
    if (c == cs.id) continue;
    if (!in_segment(c) || pl.at(c).kind != step_kind::compute) return;
    users.push_back(c);
  }
  if (!h2d) users.push_back(maker);
  const int64_t base = h2d ? cs.copy.dst.byte_offset : cs.copy.src.byte_offset;
  std::vector<operand*> refs;
  bool written = h2d;  // an output needs its producer among the kernels
  // An operand in t's arena bytes that is not t by name (a fused record's
  // operands follow the fusion, not the node) keeps t where it is.
  const auto in_bytes = [&](const operand& a) {
    return a.where == region::arena && a.device < 0 && a.byte_offset >= base && a.byte_offset < base + cs.copy.bytes;
  };
  for (step_id u : users) {
    for (lowered_op& op : steps[static_cast<std::size_t>(u)].ops) {
      if (op.fused != gpu::op_launch::fusion::none) {
        if (in_bytes(op.out) || std::any_of(op.inputs.begin(), op.inputs.end(), in_bytes) ||
            std::any_of(op.extra_outs.begin(), op.extra_outs.end(), in_bytes))
          return;
        continue;
      }
      const bool touches = std::any_of(op.op->inputs.begin(), op.op->inputs.end(),
                                       [&](node_id in) { return g.at(in).storage == t; }) ||
                           op.op->id == t;
      if (!touches) continue;
      if (op.inputs.size() != op.op->inputs.size()) return;
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        if (g.at(op.op->inputs[i]).storage != t) continue;
        if (!reads_elementwise(op.op->op)) return;
        refs.push_back(&op.inputs[i]);
      }
      if (op.op->id == t) {
        if (!writes_elementwise(op.op->op)) return;
        refs.push_back(&op.out);
        written = true;
      }
    }
  }
  if (!written || refs.empty()) return;
  if (!std::all_of(refs.begin(), refs.end(), [&](const operand* r) { return in_bytes(*r); })) return;
  for (operand* r : refs) {
    r->in_window = true;
    r->byte_offset = cs.copy.window_offset + (r->byte_offset - base);
  }
  cs.copy.in_place = true;
}

}  // namespace

namespace {

/// A position for every step in one order that keeps every dep and every
/// queue's own order (lane_seq, then id, per (device, kind, lane)): the
/// order of a folded queue, whose steps came from several lanes. Kahn's
/// algorithm, the lowest step id first among those ready. The plan's deps
/// and lane orders agree (check_launch_order), so every step gets one.
std::vector<int> issue_rank(const plan& pl) {
  const std::size_t n = pl.steps().size();
  std::vector<std::vector<step_id>> next(n);
  std::vector<int> indegree(n, 0);
  for (const step& s : pl.steps())
    for (step_id d : s.deps) {
      next[static_cast<std::size_t>(d)].push_back(s.id);
      ++indegree[static_cast<std::size_t>(s.id)];
    }
  std::map<std::tuple<int, int, int>, std::vector<step_id>> queues;
  for (const step& s : pl.steps())
    queues[{s.device, static_cast<int>(queue_kind(s)), queue_lane(s)}].push_back(s.id);
  for (auto& [key, steps] : queues) {
    std::sort(steps.begin(), steps.end(), [&](step_id x, step_id y) {
      return std::make_pair(pl.at(x).lane_seq, x) < std::make_pair(pl.at(y).lane_seq, y);
    });
    for (std::size_t i = 1; i < steps.size(); ++i) {
      next[static_cast<std::size_t>(steps[i - 1])].push_back(steps[i]);
      ++indegree[static_cast<std::size_t>(steps[i])];
    }
  }
  std::priority_queue<step_id, std::vector<step_id>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (indegree[i] == 0) ready.push(static_cast<step_id>(i));
  std::vector<int> rank(n, std::numeric_limits<int>::max());  // a cycle leaves some unranked: lower() then refuses
  int at = 0;
  while (!ready.empty()) {
    const step_id s = ready.top();
    ready.pop();
    rank[static_cast<std::size_t>(s)] = at++;
    for (step_id c : next[static_cast<std::size_t>(s)])
      if (--indegree[static_cast<std::size_t>(c)] == 0) ready.push(c);
  }
  return rank;
}

/// The replay segments of the folded queue of device `d` (folded_lanes):
/// runs of its steps in queue order that a graph may hold (compute steps,
/// host copies that captures_host_copy accepts), each starting at a step
/// whose remote deps its graph launch waits for; a later step joins only
/// when it waits for no other remote step, and a segment ends after a step
/// that another queue consumes (so its consumers need not wait for the
/// whole graph).
std::vector<replay_segment> folded_segments(const plan& pl, const launch_program& prog, int d) {
  std::vector<replay_segment> out;
  const int q = prog.find_queue(d, step_kind::compute, 0);
  if (q < 0) return out;
  bool open = false;
  std::vector<step_id> waited;  // the open segment's remote deps (its first step's)
  for (step_id s : prog.queue(q).steps) {
    const step& ps = pl.at(s);
    const lowered_step& ls = prog.step(s);
    const bool copy = ps.on_compute_stream;
    if ((ps.kind != step_kind::compute && !copy) || (copy && !captures_host_copy(pl, ps))) {
      open = false;
      continue;
    }
    const bool joins = open && std::all_of(ls.remote_deps.begin(), ls.remote_deps.end(), [&](step_id r) {
      return std::find(waited.begin(), waited.end(), r) != waited.end();
    });
    if (!joins) {
      out.push_back(replay_segment{d, 0, {}, 0});
      waited = ls.remote_deps;
    }
    replay_segment& seg = out.back();
    seg.steps.push_back(s);
    if (copy) ++seg.copies;
    else
      for (node_id id : ps.ops) seg.kernels += !pl.runs_nothing(id);
    open = ls.consumer_queues.empty();
  }
  return out;
}

}  // namespace

/// Graph replay: marks the first step of each replay segment of one or more
/// kernels and host copies (graph/replay.hpp) with the segment's step and
/// launch-record counts, where the plan asks for replay and the device is
/// not a cpu device, and gives each host copy of such a segment its place in
/// the device's arena host window (copy_desc::window_offset).
/// A segment whose steps are not consecutive in their queue (lane order
/// differing from id order) is left unmarked: it runs kernel by kernel.
/// So is a segment with in-stream parts whose members share a GPU (or a
/// tensor-parallel decode-step record whose ranks do): replayed,
/// such parts timed out on an H100 (a host call that instantiated or
/// launched a graph blocked for as long as parts spun on the GPU, and the
/// part that would end the wait was behind it: docs/BENCHMARKS.md, session
/// 14), launched plainly they met every time.
/// A segment of one kernel is replayed too: on an H200 host a graph of one
/// kernel cost 1.3-2.0 us to launch, the kernel itself (cudaLaunchKernelEx)
/// 2.7-4.9 us (docs/BENCHMARKS.md, session 34).
void mark_replay_segments(const plan& pl, launch_program& prog) {
  prog.window_bytes_.assign(pl.devices().size(), 0);
  if (pl.options().graph_replay == graph_replay_mode::off) return;
  std::vector<replay_segment> segments = replay_segments(pl);
  // A folded device's segments span its lanes: made from its one queue.
  segments.erase(std::remove_if(segments.begin(), segments.end(),
                                [&](const replay_segment& seg) { return prog.folded_lanes(seg.device) > 0; }),
                 segments.end());
  for (int d = 0; d < static_cast<int>(pl.devices().size()); ++d)
    if (prog.folded_lanes(d) > 0)
      for (replay_segment& seg : folded_segments(pl, prog, d)) segments.push_back(std::move(seg));
  for (const replay_segment& seg : segments) {
    if (seg.launches() < 1 || seg.steps.empty()) continue;
    if (!replays_on(pl.options().graph_replay, pl.devices().at(static_cast<std::size_t>(seg.device)).kind)) continue;
    auto& first = prog.steps_[static_cast<std::size_t>(seg.steps.front())];
    bool consecutive = true;
    int records = 0;
    for (std::size_t i = 0; i < seg.steps.size(); ++i) {
      const auto& ls = prog.steps_[static_cast<std::size_t>(seg.steps[i])];
      consecutive = consecutive && ls.queue == first.queue && ls.pos == first.pos + static_cast<int>(i);
      records += static_cast<int>(ls.ops.size());
    }
    if (!consecutive) continue;
    // A tensor-parallel decode-step record meets its ranks on the devices
    // under the job's tag, as in-stream parts do, and must not be replayed
    // where ranks share a GPU for the same reason.
    bool in_stream = false, shared_gpu = false;
    for (step_id s : seg.steps) {
      const lowered_step& ls = prog.steps_[static_cast<std::size_t>(s)];
      in_stream = in_stream || runs_in_stream(pl.at(s)) || ls.job_tag;
      shared_gpu = shared_gpu || in_stream_members_share_a_gpu(pl, pl.at(s)) ||
                   (ls.job_tag && decode_step_ranks_share_a_gpu(pl, ls));
    }
    if (shared_gpu) continue;
    // Host copies of the segment move through the arena's host window.
    bool windowable = true;
    for (step_id s : seg.steps) {
      const copy_desc& c = prog.steps_[static_cast<std::size_t>(s)].copy;
      const step_kind k = pl.at(s).kind;
      if ((k == step_kind::copy_h2d || k == step_kind::copy_d2h) && (c.gather || c.host_blocks != 1)) windowable = false;
    }
    if (!windowable) continue;
    for (step_id s : seg.steps) {
      lowered_step& ls = prog.steps_[static_cast<std::size_t>(s)];
      if (ls.kind != step_kind::copy_h2d && ls.kind != step_kind::copy_d2h) continue;
      int64_t& window = prog.window_bytes_[static_cast<std::size_t>(ls.device)];
      ls.copy.window_offset = window;
      window += (ls.copy.bytes + 63) / 64 * 64;  // each copy's bytes 64-aligned, as a host_tensor's
      (ls.kind == step_kind::copy_h2d ? prog.window_inputs_ : prog.window_outputs_).push_back(s);
      if (pl.options().host_windows_in_place) place_in_window(pl, prog.steps_, seg.steps, ls);
    }
    first.replay_in_stream |= in_stream;
    first.replay_steps = static_cast<int>(seg.steps.size());
    first.replay_records = records;
    first.replay_kernels = seg.kernels;
    if (prog.folded_lanes(seg.device) > 0) {
      // The capture orders each step after its deps in the segment.
      for (step_id s : seg.steps) {
        lowered_step& ls = prog.steps_[static_cast<std::size_t>(s)];
        first.replay_lanes = std::max(first.replay_lanes, ls.capture_lane + 1);
        for (step_id dep : pl.at(s).deps)
          if (std::find(seg.steps.begin(), seg.steps.end(), dep) != seg.steps.end()) ls.segment_deps.push_back(dep);
      }
    }
  }
}

expected<std::shared_ptr<const launch_program>> lower(std::shared_ptr<const plan> p) {
  if (!p) return error{errc::internal, "lower: null plan"};
  const plan& pl = *p;
  const auto ndev = static_cast<int>(pl.devices().size());
  auto prog = std::make_shared<launch_program>();
  prog->plan_ = p;
  prog->used_devices_ = pl.used_devices();
  std::sort(prog->used_devices_.begin(), prog->used_devices_.end());
  prog->steps_.resize(pl.steps().size());
  const bool has_collectives =
      std::any_of(pl.steps().begin(), pl.steps().end(), [](const step& s) { return s.kind == step_kind::collective; });
  prog->folded_lanes_ = folded_lanes(pl);
  const auto folded = [&](const step& s) { return on_compute_lane(s) && prog->folded_lanes(s.device) > 0; };

  // Queues: one per (device, kind, lane), in order of first use; a folded
  // device's compute lanes all queue on lane 0.
  for (std::size_t i = 0; i < pl.steps().size(); ++i) {
    const step& s = pl.steps()[i];
    if (s.id != static_cast<step_id>(i))
      return error{errc::internal, "step at index " + std::to_string(i) + " has id " + std::to_string(s.id)};
    if (s.device < 0 || s.device >= ndev || (s.kind == step_kind::copy_peer && (s.src_device < 0 || s.src_device >= ndev)))
      return step_errors{s}("names a device out of range (the plan has " + std::to_string(ndev) + ")");
    for (step_id d : s.deps)
      if (d < 0 || static_cast<std::size_t>(d) >= pl.steps().size())
        return step_errors{s}("depends on step " + std::to_string(d) + ", which is not in the plan");
    const int lane = folded(s) ? 0 : queue_lane(s);
    int q = prog->find_queue(s.device, queue_kind(s), lane);
    if (q < 0) {
      q = static_cast<int>(prog->queues_.size());
      launch_queue lq;
      lq.device = s.device;
      lq.kind = queue_kind(s);
      lq.lane = lane;
      prog->queues_.push_back(std::move(lq));
    }
    prog->queues_[static_cast<std::size_t>(q)].steps.push_back(s.id);
    if (runs_in_stream(s)) prog->queues_[static_cast<std::size_t>(q)].in_stream_parts = prog->has_in_stream_ = true;
    auto& ls = prog->steps_[i];
    ls.id = s.id;
    ls.kind = s.kind;
    ls.device = s.device;
    ls.queue = q;
    if (folded(s)) ls.capture_lane = s.lane;
  }
  // With collectives, every queue issues jobs in the agreed order (launch_queue::in_job_order).
  const bool any_folded = std::any_of(prog->folded_lanes_.begin(), prog->folded_lanes_.end(), [](int n) { return n > 0; });
  const std::vector<int> rank = any_folded ? issue_rank(pl) : std::vector<int>{};
  for (auto& q : prog->queues_) {
    q.in_job_order = has_collectives;
    // A folded queue in issue rank, every other one in lane order.
    const bool by_rank = q.kind == step_kind::compute && prog->folded_lanes(q.device) > 0;
    const auto key = [&](step_id x) {
      return std::make_pair(by_rank ? rank[static_cast<std::size_t>(x)] : pl.at(x).lane_seq, x);
    };
    std::sort(q.steps.begin(), q.steps.end(), [&](step_id x, step_id y) { return key(x) < key(y); });
    for (std::size_t i = 0; i < q.steps.size(); ++i) prog->steps_[static_cast<std::size_t>(q.steps[i])].pos = static_cast<int>(i);
  }
  if (auto e = check_launch_order(pl, prog->queues_)) return e;

  // Per step: remote deps, consumers on other queues, completion, and what
  // its kind needs (operands, copy descriptor, label). Only the deps a queue
  // waits for (waited_deps: not those met on the devices, nor those an
  // earlier step of the lane waited for) are remote deps and announced.
  const auto waited = waited_deps(pl);
  for (const auto& s : pl.steps()) {
    auto& ls = prog->steps_[static_cast<std::size_t>(s.id)];
    for (step_id d : waited[static_cast<std::size_t>(s.id)])
      if (prog->steps_[static_cast<std::size_t>(d)].queue != ls.queue) ls.remote_deps.push_back(d);
    for (step_id c : s.consumers) {
      if (c < 0 || static_cast<std::size_t>(c) >= pl.steps().size())
        return step_errors{s}("is consumed by step " + std::to_string(c) + ", which is not in the plan");
      const auto& cs = prog->steps_[static_cast<std::size_t>(c)];
      if (cs.queue == ls.queue || !waits_for(waited, c, s.id)) continue;
      ls.remote_consumers.push_back({cs.queue, cs.pos});
      if (std::find(ls.consumer_queues.begin(), ls.consumer_queues.end(), cs.queue) == ls.consumer_queues.end())
        ls.consumer_queues.push_back(cs.queue);
    }
    // A step whose op may fail on its values (get_rows ids) reports too, so
    // that failure reaches the job (op_failed) instead of a "done" job.
    ls.completion = s.kind == step_kind::copy_d2h || s.consumers.empty() || may_fail_on_values(pl, s);
    if (ls.completion) prog->completion_.push_back(s.id);
    if (auto e = lower_step(pl, s, ls)) return e;
  }
  // Before the queues count their records (first_launch, replay segments).
  prog->decode_step_note_ = fuse_decode_step(pl, prog->queues_, prog->steps_, prog->decode_step_fused_);
  mark_peer_ordered_deps(pl, *prog);
  for (auto& q : prog->queues_) {
    q.remote_dep_counts.reserve(q.steps.size());
    for (step_id s : q.steps) {
      auto& ls = prog->steps_[static_cast<std::size_t>(s)];
      q.remote_dep_counts.push_back(static_cast<int>(ls.remote_deps.size()));
      ls.first_launch = q.launch_records;
      q.launch_records += static_cast<int>(ls.ops.size());
    }
    q.starts_itself = q.steps.empty() || q.remote_dep_counts.front() == 0;
  }
  mark_replay_segments(pl, *prog);
  choose_job_lanes(pl, has_collectives, *prog);
  return std::shared_ptr<const launch_program>(std::move(prog));
}

void choose_job_lanes(const plan& pl, bool has_collectives, launch_program& prog) {
  for (const auto& q : prog.queues_) {
    if (q.kind != step_kind::compute) continue;
    if (prog.compute_lanes_.size() <= static_cast<std::size_t>(q.device))
      prog.compute_lanes_.resize(static_cast<std::size_t>(q.device) + 1, 0);
    auto& n = prog.compute_lanes_[static_cast<std::size_t>(q.device)];
    n = std::max(n, q.lane + 1);
  }
  const int asked = pl.options().job_lanes;
  int want = asked;
  if (want == 0) {
    want = 1;
    if (!prog.used_devices_.empty() &&
        std::all_of(prog.used_devices_.begin(), prog.used_devices_.end(), [&](int d) {
          return pl.devices()[static_cast<std::size_t>(d)].kind == device_kind::cuda;
        }))
      want = 2;
  }
  if (want <= 1) return;
  const bool has_state = std::any_of(pl.memory().begin(), pl.memory().end(),
                                     [](const device_memory& m) { return m.state_bytes > 0; });
  std::string why;
  if (!has_collectives) why = "the plan has no collectives";
  else if (prog.has_in_stream_) why = "its in-stream collective parts share one memory area per device";
  else if (has_state) why = "it keeps state across jobs (a slot's jobs follow each other on one stream)";
  if (why.empty()) prog.job_lanes_ = want;
  else if (asked > 1) prog.job_lanes_note_ = "job_lanes " + std::to_string(asked) + " not taken: " + why;
}

int launch_program::lane_on_copy(int q, int copy) const noexcept {
  const launch_queue& lq = queues_[static_cast<std::size_t>(q)];
  if (copy <= 0 || !copied(q)) return lq.lane;
  if (lq.kind == step_kind::collective) return copy;
  return lq.lane + copy * compute_lanes_[static_cast<std::size_t>(lq.device)];
}

}  // namespace ag::actors
