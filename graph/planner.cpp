// Placement, lanes and steps of ag::compile. The memory pass is in
// memory_plan.cpp, the printing and lookups in plan.cpp.

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <string>
#include <tuple>
#include <utility>

#include "graph/fusion.hpp"
#include "graph/planner_internal.hpp"

namespace ag {

node_id storage_root(const graph& g, node_id id) {
  // Builders record the root directly; follow the chain anyway (bounded) so a
  // hand-made node list with view-of-view storage still resolves.
  for (std::size_t guard = 0; guard <= g.size(); ++guard) {
    const node& n = g.at(id);
    if (n.storage == no_node || n.storage == id) return id;
    id = n.storage;
  }
  return id;
}

namespace {

std::string label(const node& n) { return std::string(to_string(n.op)) + " '" + n.name + "'"; }

bool is_compute(const node& n) { return !is_leaf_op(n.op) && !is_view_op(n.op); }

/// Working state of one compile() call.
struct builder_state {
  const graph& g;
  const std::vector<device_spec>& devices;
  const plan_options& opt;
  std::vector<char> needed;
  std::vector<node_id> root;
  std::vector<int> place;  // device per node, -1 = pruned
  std::vector<int> lane;   // compute nodes only
  int lane_cap;            // lanes per device at most (before the device's max_lanes)
  bool lanes_by_model;     // auto lanes: spread only where the cost model predicts a gain
  std::vector<node_id> hand_over;  // tensor_parallel_info::hand_over, with plan_options::hand_over_lane

  builder_state(const graph& gr, const std::vector<device_spec>& d, const plan_options& o, int auto_lane_cap)
      : g(gr), devices(d), opt(o),
        lane_cap(o.lanes_per_device == 0 ? auto_lane_cap : o.lanes_per_device),
        lanes_by_model(o.lanes_per_device == 0) {}
  int ndev() const { return static_cast<int>(devices.size()); }
};

// ---------------------------------------------------------------- pruning --

void prune(builder_state& s) {
  const graph& g = s.g;
  s.needed.assign(g.size(), 0);
  // Every part of a needed collective is needed: its members run it together.
  std::map<std::pair<op_kind, std::vector<node_id>>, std::vector<node_id>> parts;
  for (const node& n : g.nodes())
    if (is_collective_op(n.op)) parts[{n.op, n.inputs}].push_back(n.id);
  std::vector<node_id> stack = pruning_roots(g);
  while (!stack.empty()) {
    node_id id = stack.back();
    stack.pop_back();
    if (s.needed[static_cast<std::size_t>(id)]) continue;
    s.needed[static_cast<std::size_t>(id)] = 1;
    const node& n = g.at(id);
    for (node_id i : n.inputs) stack.push_back(i);
    if (n.storage != no_node && n.storage != id) stack.push_back(n.storage);
    if (is_collective_op(n.op))
      for (node_id p : parts[{n.op, n.inputs}]) stack.push_back(p);
  }
  s.root.resize(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) s.root[i] = storage_root(g, static_cast<node_id>(i));
}

// ---------------------------------------------------------- output pieces --

/// One piece of an output gathered on the host (plan_options::output_pieces):
/// the node its device copies, and where its bytes land (step::host_offset).
struct output_piece {
  node_id node = no_node;
  int64_t host_offset = 0, host_blocks = 1, host_pitch = 0;
};

/// The shortest run of host memory a piece of an output may land in when its
/// runs are strided (a 2-D copy moves rows of a few KiB at full speed, rows
/// of a few hundred bytes at a fraction of it).
constexpr int64_t min_output_piece_run_bytes = 4096;

/// Per output: the pieces its d2h copies carry, or none (the output is
/// copied whole). An output qualifies when it is a concat that nothing else
/// reads, of inputs that are computed here in their own buffers on two or
/// more devices: the concat is then unplaced (never computed), and each
/// input is copied from its device into its place in the host output.
std::vector<std::vector<output_piece>> find_output_pieces(builder_state& s) {
  const graph& g = s.g;
  std::vector<std::vector<output_piece>> pieces(g.outputs().size());
  if (!s.opt.output_pieces) return pieces;
  std::vector<int> reads(g.size(), 0);
  for (const node& n : g.nodes()) {
    if (s.place[static_cast<std::size_t>(n.id)] < 0) continue;
    for (node_id i : n.inputs) ++reads[static_cast<std::size_t>(i)];
    if (n.storage != no_node && n.storage != n.id) ++reads[static_cast<std::size_t>(n.storage)];
  }
  for (node_id o : g.outputs()) ++reads[static_cast<std::size_t>(o)];
  for (std::size_t k = 0; k < g.outputs().size(); ++k) {
    const node& o = g.at(g.outputs()[k]);
    if (o.op != op_kind::concat || o.storage != o.id || reads[static_cast<std::size_t>(o.id)] != 1 ||
        s.place[static_cast<std::size_t>(o.id)] < 0)
      continue;
    std::vector<int> devices;
    bool whole_buffers = true;
    for (node_id i : o.inputs) {
      const node& in = g.at(i);
      const int dev = s.place[static_cast<std::size_t>(i)];
      whole_buffers = whole_buffers && is_compute(in) && in.storage == in.id && dev >= 0 && in.type == o.type;
      devices.push_back(dev);
    }
    std::sort(devices.begin(), devices.end());
    if (!whole_buffers || std::unique(devices.begin(), devices.end()) - devices.begin() < 2) continue;
    const int axis = o.attrs.axis;
    const auto es = static_cast<int64_t>(dtype_size(o.type));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= o.dims[d];
    for (int d = axis + 1; d < o.dims.rank(); ++d) inner *= o.dims[d];
    // Runs too short for a copy engine: gathered on a device instead.
    int64_t shortest = std::numeric_limits<int64_t>::max();
    for (node_id i : o.inputs) shortest = std::min(shortest, g.at(i).dims[axis] * inner * es);
    if (outer > 1 && shortest < min_output_piece_run_bytes) continue;
    int64_t at = 0;
    for (node_id i : o.inputs) {
      output_piece piece;
      piece.node = i;
      piece.host_offset = at * inner * es;
      piece.host_blocks = outer;
      piece.host_pitch = o.dims[axis] * inner * es;
      pieces[k].push_back(piece);
      at += g.at(i).dims[axis];
    }
    s.place[static_cast<std::size_t>(o.id)] = -1;
  }
  return pieces;
}

// -------------------------------------------------------------- placement --

// Contiguous split of `units` (costs per device) over devices 0..k-1 that
// minimises the most loaded stage: the classic linear-partition DP, with each
// stage priced on its own device so heterogeneous devices balance too.
std::vector<int> partition_units(const std::vector<std::vector<double>>& unit_cost_per_dev, int k) {
  const std::size_t u = unit_cost_per_dev.empty() ? 0 : unit_cost_per_dev[0].size();
  std::vector<int> stage_of(u, 0);
  if (u == 0 || k <= 1) return stage_of;
  std::vector<std::vector<double>> pre(static_cast<std::size_t>(k), std::vector<double>(u + 1, 0.0));
  for (int j = 0; j < k; ++j)
    for (std::size_t i = 0; i < u; ++i)
      pre[static_cast<std::size_t>(j)][i + 1] = pre[static_cast<std::size_t>(j)][i] + unit_cost_per_dev[static_cast<std::size_t>(j)][i];
  const double inf = std::numeric_limits<double>::infinity();
  // dp[j][i]: best max-stage time placing units [0, i) on stages 0..j.
  std::vector<std::vector<double>> dp(static_cast<std::size_t>(k), std::vector<double>(u + 1, inf));
  std::vector<std::vector<std::size_t>> cut(static_cast<std::size_t>(k), std::vector<std::size_t>(u + 1, 0));
  for (std::size_t i = 0; i <= u; ++i) dp[0][i] = pre[0][i];
  for (std::size_t j = 1; j < static_cast<std::size_t>(k); ++j) {
    for (std::size_t i = 0; i <= u; ++i) {
      // Largest cut first: on ties the earlier stages take the work (and
      // trailing devices stay empty rather than leading ones).
      for (std::size_t m = i + 1; m-- > 0;) {
        const double v = std::max(dp[j - 1][m], pre[j][i] - pre[j][m]);
        // Relative epsilon: prefix-sum differences of equal costs differ in the last bits.
        if (v < dp[j][i] * (1 - 1e-12)) {
          dp[j][i] = v;
          cut[j][i] = m;
        }
      }
    }
  }
  std::size_t i = u;
  for (std::size_t j = static_cast<std::size_t>(k) - 1; j > 0; --j) {
    const std::size_t m = cut[j][i];
    for (std::size_t x = m; x < i; ++x) stage_of[x] = static_cast<int>(j);
    i = m;
  }
  return stage_of;
}

}  // namespace

std::vector<int> partition_pipeline(const graph& g, const std::vector<node_id>& free_nodes,
                                    const std::vector<device_spec>& devices, int k) {
  std::vector<int> stage(free_nodes.size(), 0);
  if (k <= 1 || free_nodes.empty()) return stage;
  // Units: runs of equal layer tag; untagged nodes join the unit before
  // them (or the first unit when they precede every tagged node).
  int first_tag = -1;
  for (node_id id : free_nodes)
    if (g.at(id).layer != -1) { first_tag = g.at(id).layer; break; }
  std::vector<int> unit_of(free_nodes.size(), 0);
  int units = 0;
  if (first_tag == -1) {
    for (std::size_t i = 0; i < free_nodes.size(); ++i) unit_of[i] = static_cast<int>(i);
    units = static_cast<int>(free_nodes.size());
  } else {
    int tag = first_tag;
    int prev_tag = first_tag;
    for (std::size_t i = 0; i < free_nodes.size(); ++i) {
      const int l = g.at(free_nodes[i]).layer;
      if (l != -1) tag = l;
      if (i == 0 || tag != prev_tag) ++units;
      unit_of[i] = units - 1;
      prev_tag = tag;
    }
  }
  std::vector<std::vector<double>> cost(static_cast<std::size_t>(k), std::vector<double>(static_cast<std::size_t>(units), 0.0));
  for (int j = 0; j < k; ++j)
    for (std::size_t i = 0; i < free_nodes.size(); ++i)
      cost[static_cast<std::size_t>(j)][static_cast<std::size_t>(unit_of[i])] +=
          estimate_seconds(devices[static_cast<std::size_t>(j)], g, g.at(free_nodes[i]));
  const std::vector<int> unit_stage = partition_units(cost, k);
  for (std::size_t i = 0; i < free_nodes.size(); ++i) stage[i] = unit_stage[static_cast<std::size_t>(unit_of[i])];
  return stage;
}

namespace {

error place_compute(builder_state& s) {
  const graph& g = s.g;
  const int ndev = s.ndev();
  s.place.assign(g.size(), -1);
  // Pins are checked on every node, pruned or not: a bad pin is a caller bug either way.
  for (const node& n : g.nodes())
    if (n.pinned_device != -1 && (n.pinned_device < 0 || n.pinned_device >= ndev))
      return error(errc::invalid_argument, label(n) + " is pinned to device " + std::to_string(n.pinned_device) +
                                               " but the plan has " + std::to_string(ndev) + " device(s)");

  std::vector<node_id> free_nodes;  // unpinned compute nodes, topological order
  for (const node& n : g.nodes()) {
    if (!s.needed[static_cast<std::size_t>(n.id)] || !is_compute(n)) continue;
    if (n.pinned_device >= 0)
      s.place[static_cast<std::size_t>(n.id)] = n.pinned_device;
    else
      free_nodes.push_back(n.id);
  }

  int k = s.opt.pipeline_stages <= 0 ? ndev : std::min(s.opt.pipeline_stages, ndev);
  if (s.opt.policy == placement_policy::single) k = 1;
  const std::vector<int> stage = partition_pipeline(g, free_nodes, s.devices, k);
  for (std::size_t i = 0; i < free_nodes.size(); ++i) s.place[static_cast<std::size_t>(free_nodes[i])] = stage[i];

  // Fallback: an op its device cannot run moves to the nearest device that
  // can (smallest index distance, lower index on ties). Pins are not moved.
  for (const node& n : g.nodes()) {
    const int d = s.place[static_cast<std::size_t>(n.id)];
    if (d < 0 || s.devices[static_cast<std::size_t>(d)].supports(n.op)) continue;
    if (n.pinned_device >= 0)
      return error(errc::unsupported_op, label(n) + " is pinned to device " + std::to_string(d) + " ('" +
                                             s.devices[static_cast<std::size_t>(d)].name + "') which does not support " +
                                             to_string(n.op));
    int best = -1;
    for (int dist = 1; dist < ndev && best < 0; ++dist) {
      if (d - dist >= 0 && s.devices[static_cast<std::size_t>(d - dist)].supports(n.op)) best = d - dist;
      else if (d + dist < ndev && s.devices[static_cast<std::size_t>(d + dist)].supports(n.op)) best = d + dist;
    }
    if (best < 0)
      return error(errc::unsupported_op, label(n) + ": no device of the plan supports op " + to_string(n.op));
    s.place[static_cast<std::size_t>(n.id)] = best;
  }
  return {};
}

// Leaves and views take the device of their first compute consumer (through
// view chains); ones no compute op reads (job outputs only) take their
// storage's device, or the pin / device 0 for leaves.
void place_leaves_and_views(builder_state& s) {
  const graph& g = s.g;
  for (const node& n : g.nodes()) {
    if (s.place[static_cast<std::size_t>(n.id)] < 0 || !is_compute(n)) continue;
    const int d = s.place[static_cast<std::size_t>(n.id)];
    for (node_id i : n.inputs) {
      node_id x = i;
      // Walk the view chain down to its storage, claiming unplaced nodes.
      for (std::size_t guard = 0; guard <= g.size(); ++guard) {
        const node& xn = g.at(x);
        if (is_compute(xn)) break;
        if (s.place[static_cast<std::size_t>(x)] < 0) s.place[static_cast<std::size_t>(x)] = d;
        if (!is_view_op(xn.op) || xn.inputs.empty()) break;
        x = xn.inputs[0];
      }
    }
  }
  for (const node& n : g.nodes()) {
    if (!s.needed[static_cast<std::size_t>(n.id)] || s.place[static_cast<std::size_t>(n.id)] >= 0 || !is_leaf_op(n.op)) continue;
    s.place[static_cast<std::size_t>(n.id)] = n.pinned_device >= 0 ? n.pinned_device : 0;
  }
  for (const node& n : g.nodes()) {
    if (!s.needed[static_cast<std::size_t>(n.id)] || s.place[static_cast<std::size_t>(n.id)] >= 0) continue;
    s.place[static_cast<std::size_t>(n.id)] = std::max(0, s.place[static_cast<std::size_t>(s.root[static_cast<std::size_t>(n.id)])]);
  }
}

// ------------------------------------------------------------------ lanes --

// Per device: "sequential" nodes are ordered (by a path) against every other
// node of the device; between two consecutive ones the rest fall into groups
// with no path between them (components of the comparability graph). When at
// least two groups are each worth more than min_branch_seconds, those groups
// are spread over the lanes (heaviest first onto the least loaded lane);
// everything else runs on lane 0.
void assign_lanes(builder_state& s) {
  const graph& g = s.g;
  s.lane.assign(g.size(), 0);
  bool any = false;
  for (const device_spec& d : s.devices) any = any || (std::min(s.lane_cap, d.max_lanes) > 1);
  if (!any) return;
  // Hand-over ops of tensor-parallel chunks (tensor_parallel_info::hand_over)
  // take lane 1 of a device that has one: the next chunk's all-gather
  // operand is made beside the chunk that lane 0 computes, not after it.
  for (node_id id : s.hand_over) {
    const int dev = s.place[static_cast<std::size_t>(id)];
    if (dev >= 0 && std::min(s.lane_cap, s.devices[static_cast<std::size_t>(dev)].max_lanes) > 1)
      s.lane[static_cast<std::size_t>(id)] = 1;
  }

  const std::size_t n = g.size();
  const bool has_collectives = std::any_of(g.nodes().begin(), g.nodes().end(), [&](const node& v) {
    return s.needed[static_cast<std::size_t>(v.id)] && is_collective_op(v.op);
  });
  // Each device's compute nodes in id (topological) order, in one pass over
  // the graph (not one a device: a 64-device plan has 58,000 nodes).
  std::vector<std::vector<node_id>> nodes_of(static_cast<std::size_t>(s.ndev()));
  for (const node& v : g.nodes()) {
    const int dev = s.place[static_cast<std::size_t>(v.id)];
    if (dev >= 0 && dev < s.ndev() && is_compute(v)) nodes_of[static_cast<std::size_t>(dev)].push_back(v.id);
  }
  // col_of[v]: v's index among its device's nodes while that device is
  // worked on, none for every other node.
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> col_of(n, none);
  bit_matrix anc;
  for (int dev = 0; dev < s.ndev(); ++dev) {
    const device_spec& spec = s.devices[static_cast<std::size_t>(dev)];
    const int lanes = std::min(s.lane_cap, spec.max_lanes);
    if (lanes <= 1) continue;
    const std::vector<node_id>& nodes = nodes_of[static_cast<std::size_t>(dev)];
    const std::size_t m = nodes.size();
    // anc(v, j): this device's j-th node reaches node v (through any
    // device's nodes). Only this device's nodes are columns: the questions
    // below are about them, and a full n x n closure of a 64-device plan
    // (50,000 nodes) took 300 MB and most of its compile time.
    for (std::size_t a = 0; a < m; ++a) col_of[static_cast<std::size_t>(nodes[a])] = a;
    // A path between two of them runs through nodes between them in id
    // (topological) order: only those rows are kept (row of node v: v - lo),
    // and nodes before the first reach none of them.
    const node_id lo = m ? nodes.front() : 0, hi = m ? nodes.back() : -1;
    const auto row = [lo](node_id v) { return static_cast<std::size_t>(v - lo); };
    anc.reset(static_cast<std::size_t>(hi - lo + 1), m);
    for (node_id vid = lo; vid <= hi; ++vid) {
      const node& v = g.at(vid);
      if (!s.needed[static_cast<std::size_t>(v.id)]) continue;
      for (node_id u : v.inputs) {
        if (u < lo) continue;
        anc.merge(row(v.id), row(u));
        if (col_of[static_cast<std::size_t>(u)] < m) anc.set(row(v.id), col_of[static_cast<std::size_t>(u)]);
      }
    }
    // Sequential nodes: comparable with every other node of the device. A
    // path runs from lower ids to higher, so node a's row holds only columns
    // below a: a is sequential when its row holds all of them (every earlier
    // node reaches a) and every later node's row holds column a (a reaches
    // every later node): a running AND of the later rows, from the last
    // node back. Words of rows, not pairs of nodes (a pair at a time was
    // quadratic in a device's nodes, most of this pass's time on a
    // 64-device plan).
    std::vector<char> seq(m, 0);
    {
      const std::size_t words = (m + 63) / 64;
      std::vector<uint64_t> every_later(words, ~uint64_t{0});
      for (std::size_t a = m; a-- > 0;) {
        const std::size_t r = row(nodes[a]);
        const bool reaches_later = (every_later[a / 64] >> (a % 64)) & 1u;
        seq[a] = reaches_later && anc.count_row(r) == a;
        anc.and_row_into(r, every_later);
      }
    }
    // Interval of a node = number of sequential nodes that precede it (they
    // form a chain): every sequential node of a lower index reaches it (they
    // are comparable, and paths run from lower ids), so it is the count of
    // sequential nodes before it.
    std::vector<int> interval(m, 0);
    int seen_seq = 0;
    for (std::size_t a = 0; a < m; ++a) {
      if (seq[a]) { ++seen_seq; continue; }
      interval[a] = seen_seq;
    }
    std::vector<std::size_t> parent(m);
    std::iota(parent.begin(), parent.end(), std::size_t{0});
    auto find = [&](std::size_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    // Branches: a node joins the branch of its inputs (non-sequential compute
    // nodes of this device, same interval). A node whose inputs lie in two or
    // more branches joins them (a sum of branch results): it and every node
    // after it in the interval belong to no branch and run on lane 0, so the
    // branches it joins stay independent groups (nodes of two groups have no
    // path between them) instead of merging into one.
    std::vector<char> joined(m, 0);
    for (std::size_t a = 0; a < m; ++a) {  // nodes are in topological (id) order
      if (seq[a]) continue;
      std::size_t branch = m;
      for (node_id in : g.at(nodes[a]).inputs) {
        const std::size_t b = col_of[static_cast<std::size_t>(in)];
        if (b == none || seq[b] || interval[b] != interval[a]) continue;
        if (joined[b] || (branch != m && find(b) != branch)) joined[a] = 1;
        else branch = find(b);
      }
      if (!joined[a] && branch != m) parent[find(a)] = branch;
    }
    for (node_id v : nodes) col_of[static_cast<std::size_t>(v)] = none;  // for the next device
    // interval -> component -> modelled seconds on its lane, and the part of
    // them that is launch latency, host time (the rest holds the device: the
    // auto-lane model below and the sim device, host_device::occupy, treat
    // the two parts apart). Under graph replay (a backend that captures:
    // sim, cuda) a kernel has no launch of its own: it costs kernel_latency
    // instead, device time that lanes overlap but for its issue interval, and
    // each lane's segment pays one graph launch, unless the lanes fold
    // (below).
    const bool replayed = replays_on(s.opt.graph_replay, spec.kind);
    // Folded lanes (graph/replay.hpp folded_lanes: replayed, the option on,
    // no collectives) are one graph: one launch for every lane, and a fork
    // or a join is an edge between its kernels, about a replayed kernel's
    // latency. Unfolded lanes pay a graph launch each, and an event record
    // and wait (a launch latency) for each fork and join.
    // A product's last wave of tiles (estimate_wave_tail_seconds) holds its
    // lane but leaves SMs that a product of another lane fills: it counts in
    // the branch's time on its lane, not in the device's throughput.
    const bool folds = replayed && s.opt.fold_lanes && !has_collectives;
    std::map<int, std::map<std::size_t, double>> groups, launch_part, latency_part, tail_part;
    for (std::size_t a = 0; a < m; ++a) {
      if (seq[a] || joined[a]) continue;
      const node& v = g.at(nodes[a]);
      double t = estimate_seconds(spec, g, v);
      if (replayed && t > 0) {
        t = estimate_replayed_seconds(spec, t);
        latency_part[interval[a]][find(a)] += replayed_kernel_overlap_seconds(spec);
      } else {
        launch_part[interval[a]][find(a)] += std::min(t, spec.launch_latency);
      }
      const double tail = estimate_wave_tail_seconds(spec, g, v);
      tail_part[interval[a]][find(a)] += tail;
      groups[interval[a]][find(a)] += t + tail;
    }
    std::map<std::size_t, int> lane_of_component;
    for (auto& [iv, comps] : groups) {
      std::vector<std::pair<double, std::size_t>> heavy;
      for (auto& [c, t] : comps)
        if (t > s.opt.min_branch_seconds) heavy.emplace_back(t, c);
      if (heavy.size() < 2) continue;
      std::sort(heavy.begin(), heavy.end(), [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
      std::vector<double> load(static_cast<std::size_t>(lanes), 0.0);
      std::map<std::size_t, int> chosen;
      double one_lane = 0, throughput_part = 0, launch_total = 0;
      for (auto& [t, c] : heavy) {
        const auto l = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        load[l] += t;
        chosen[c] = static_cast<int>(l);
        one_lane += t;
        throughput_part += t - launch_part[iv][c] - latency_part[iv][c] - tail_part[iv][c];
        launch_total += launch_part[iv][c];
      }
      if (s.lanes_by_model) {
        // Lanes finish when the busiest lane does, but no sooner than all
        // launches back to back (one actor launches every lane's kernels; one
        // graph launch per lane under replay, one for all when folded) or the
        // throughput-bound parts back to back (one device's throughput):
        // lanes overlap one branch's launches, or replayed kernels'
        // latencies, with another's work. Every extra lane costs a fork and
        // a join (fork_join). The sim device models the same
        // (host_device::occupy).
        const int used = static_cast<int>(std::count_if(load.begin(), load.end(), [](double x) { return x > 0; }));
        if (replayed) launch_total = (folds ? 1 : used) * spec.launch_latency;  // the lanes' graph launches
        const double fork_join = folds ? spec.kernel_latency : spec.launch_latency;
        const double spread =
            std::max({throughput_part, launch_total, *std::max_element(load.begin(), load.end())}) +
            2.0 * fork_join * (used - 1);
        if (!(spread < 0.9 * one_lane)) continue;  // a gain under 10% is within the model's error
      }
      lane_of_component.insert(chosen.begin(), chosen.end());
    }
    for (std::size_t a = 0; a < m; ++a) {
      if (seq[a] || joined[a]) continue;
      auto it = lane_of_component.find(find(a));
      if (it != lane_of_component.end()) s.lane[static_cast<std::size_t>(nodes[a])] = it->second;
    }
  }
}

// ------------------------------------------------------------------ steps --

struct step_builder {
  builder_state& s;
  std::vector<step> steps;  // creation order; renumbered topologically at the end
  std::vector<step_id> compute_step_of;
  std::map<std::pair<node_id, int>, step_id> h2d_of, peer_of;
  std::map<std::pair<int, int>, step_id> open_step;  // (device, lane) -> step
  std::vector<std::vector<char>> view_emitted;       // [device][node]
  std::vector<int> input_index;
  std::vector<char> read_elsewhere;  // compute node read on another (device, lane)
  std::vector<int> visit_mark;
  int visit_stamp = 0;

  explicit step_builder(builder_state& st) : s(st) {
    compute_step_of.assign(s.g.size(), -1);
    view_emitted.assign(static_cast<std::size_t>(s.ndev()), std::vector<char>(s.g.size(), 0));
    input_index.assign(s.g.size(), -1);
    for (std::size_t i = 0; i < s.g.inputs().size(); ++i)
      input_index[static_cast<std::size_t>(s.g.inputs()[i])] = static_cast<int>(i);
    read_elsewhere.assign(s.g.size(), 0);
    for (const node& c : s.g.nodes()) {
      if (s.place[static_cast<std::size_t>(c.id)] < 0 || !is_compute(c)) continue;
      for (node_id i : c.inputs) {
        const auto r = static_cast<std::size_t>(s.root[static_cast<std::size_t>(i)]);
        if (!is_compute(s.g.at(static_cast<node_id>(r)))) continue;
        // A collective runs on the communication queue: its operands are
        // always read from another queue.
        if (is_collective_op(c.op) || s.place[r] != s.place[static_cast<std::size_t>(c.id)] ||
            s.lane[r] != s.lane[static_cast<std::size_t>(c.id)])
          read_elsewhere[r] = 1;
      }
    }
  }

  step_id add_step(step st) {
    st.id = static_cast<step_id>(steps.size());
    steps.push_back(std::move(st));
    visit_mark.push_back(0);
    return steps.back().id;
  }

  // The step that makes storage node `sn`'s value available on `dev`, creating
  // the h2d / peer copy on first use; -1 for weights (resident from load).
  expected<step_id> value_step(node_id sn, int dev) {
    const node& n = s.g.at(sn);
    if (n.op == op_kind::weight) return step_id{-1};
    if (n.op == op_kind::input) {
      auto key = std::make_pair(sn, dev);
      if (auto it = h2d_of.find(key); it != h2d_of.end()) return it->second;
      if (input_index[static_cast<std::size_t>(sn)] < 0)
        return error(errc::internal, label(n) + " is an input node but not listed in the graph's inputs");
      step st;
      st.kind = step_kind::copy_h2d;
      st.device = dev;
      st.ops = {sn};
      st.io_index = input_index[static_cast<std::size_t>(sn)];
      st.bytes = n.own_bytes();
      const step_id id = add_step(std::move(st));
      h2d_of[key] = id;
      return id;
    }
    const int home = s.place[static_cast<std::size_t>(sn)];
    const step_id producer = compute_step_of[static_cast<std::size_t>(sn)];
    if (producer < 0) return error(errc::internal, label(n) + " is read before the step computing it exists");
    if (home == dev) return producer;
    auto key = std::make_pair(sn, dev);
    if (auto it = peer_of.find(key); it != peer_of.end()) return it->second;
    step st;
    st.kind = step_kind::copy_peer;
    st.device = dev;
    st.src_device = home;
    st.ops = {sn};
    st.bytes = n.own_bytes();
    st.deps = {producer};
    const step_id id = add_step(std::move(st));
    peer_of[key] = id;
    return id;
  }

  // True when `target` is reachable from `from` through deps. A step's deps
  // were all made before it (smaller ids), so a step older than `target`
  // cannot lead to it: the search stays within the steps made since.
  bool reaches(step_id from, step_id target) {
    ++visit_stamp;
    std::vector<step_id> stack{from};
    while (!stack.empty()) {
      const step_id x = stack.back();
      stack.pop_back();
      if (x == target) return true;
      if (x < target || visit_mark[static_cast<std::size_t>(x)] == visit_stamp) continue;
      visit_mark[static_cast<std::size_t>(x)] = visit_stamp;
      for (step_id d : steps[static_cast<std::size_t>(x)].deps) stack.push_back(d);
    }
    return false;
  }

  // One member's part of a collective: its own step, waiting for the
  // producers of every member's operand where each operand lives.
  error add_collective(const node& n) {
    step st;
    st.kind = step_kind::collective;
    st.device = s.place[static_cast<std::size_t>(n.id)];
    st.ops = {n.id};
    for (node_id i : n.inputs) {
      const node_id r = s.root[static_cast<std::size_t>(i)];
      auto dep = value_step(r, s.place[static_cast<std::size_t>(r)]);
      if (!dep) return dep.err();
      if (*dep >= 0) st.deps.push_back(*dep);
    }
    const node& first = s.g.at(n.inputs.at(0));
    st.bytes = n.op == op_kind::all_gather ? n.own_bytes() : first.dims.numel() * static_cast<int64_t>(dtype_size(first.type));
    compute_step_of[static_cast<std::size_t>(n.id)] = add_step(std::move(st));
    return {};
  }

  error add_compute(const node& n) {
    if (is_collective_op(n.op)) return add_collective(n);
    const int dev = s.place[static_cast<std::size_t>(n.id)];
    const int lane = s.lane[static_cast<std::size_t>(n.id)];
    std::vector<step_id> deps;
    for (node_id i : n.inputs) {
      auto st = value_step(s.root[static_cast<std::size_t>(i)], dev);
      if (!st) return st.err();
      if (*st >= 0) deps.push_back(*st);
    }
    // On a CUDA device (where attention chains fuse), an attention chain's
    // later operands, where their producers exist by now (nodes come in
    // topological order; one made later splits as before): otherwise a v
    // made later than q and k, or on another lane (chunks of the batch put
    // a chunk's q, k and v projections on lanes of their own), starts a new
    // split at the product with v and the chain runs as four kernels.
    const bool fuses = s.devices[static_cast<std::size_t>(dev)].kind == device_kind::cuda;
    for (node_id i : fuses ? attention_chain_late_operands(s.g, n.id) : std::vector<node_id>{}) {
      const node_id r = s.root[static_cast<std::size_t>(i)];
      const node& rn = s.g.at(r);
      if (rn.op != op_kind::input && rn.op != op_kind::weight && compute_step_of[static_cast<std::size_t>(r)] < 0)
        continue;
      auto st = value_step(r, dev);
      if (!st) return st.err();
      if (*st >= 0 && std::find(deps.begin(), deps.end(), *st) == deps.end()) deps.push_back(*st);
    }
    // Join the open split of this (device, lane) only when the op adds no new
    // wait: each of its producers is the split itself or already something
    // the split waits for. A split's waits all sit at its start, so a new one
    // would hold back the ops already in it (and could close a cycle).
    step_id target = -1;
    if (auto it = open_step.find({dev, lane}); it != open_step.end()) {
      target = it->second;
      // Job input uploads are exempt: they have no deps (no cycle possible)
      // and the job issues them all at its start.
      for (step_id d : deps)
        if (d != target && steps[static_cast<std::size_t>(d)].kind != step_kind::copy_h2d && !reaches(target, d)) {
          target = -1;
          break;
        }
    }
    if (target < 0) {
      step st;
      st.kind = step_kind::compute;
      st.device = dev;
      st.lane = lane;
      target = add_step(std::move(st));
      open_step[{dev, lane}] = target;
    }
    step& st = steps[static_cast<std::size_t>(target)];
    // Views read by this op are listed (once per device) just before it.
    for (node_id i : n.inputs) {
      std::vector<node_id> chain;
      for (node_id x = i; is_view_op(s.g.at(x).op) && !view_emitted[static_cast<std::size_t>(dev)][static_cast<std::size_t>(x)];) {
        chain.push_back(x);
        view_emitted[static_cast<std::size_t>(dev)][static_cast<std::size_t>(x)] = 1;
        if (s.g.at(x).inputs.empty()) break;
        x = s.g.at(x).inputs[0];
      }
      st.ops.insert(st.ops.end(), chain.rbegin(), chain.rend());
    }
    st.ops.push_back(n.id);
    for (step_id d : deps)
      if (d != target && std::find(st.deps.begin(), st.deps.end(), d) == st.deps.end()) st.deps.push_back(d);
    compute_step_of[static_cast<std::size_t>(n.id)] = target;
    // A value another lane or device reads ends the split here, so that
    // reader (or its copy) waits only for the ops up to it: this is what lets
    // a fork actually run its branches side by side.
    if (read_elsewhere[static_cast<std::size_t>(n.id)]) open_step.erase({dev, lane});
    return {};
  }

  error add_outputs(const std::vector<std::vector<output_piece>>& pieces) {
    const auto& outs = s.g.outputs();
    for (std::size_t k = 0; k < outs.size(); ++k) {
      for (const output_piece& piece : pieces[k]) {
        const int home = s.place[static_cast<std::size_t>(piece.node)];
        auto producer = value_step(piece.node, home);
        if (!producer) return producer.err();
        step st;
        st.kind = step_kind::copy_d2h;
        st.device = home;
        st.ops = {piece.node};
        st.io_index = static_cast<int>(k);
        st.bytes = s.g.at(piece.node).own_bytes();
        st.host_offset = piece.host_offset;
        st.host_blocks = piece.host_blocks;
        st.host_pitch = piece.host_pitch;
        if (*producer >= 0) st.deps = {*producer};
        add_step(std::move(st));
      }
      if (!pieces[k].empty()) continue;
      const node_id o = outs[k];
      const node_id sn = s.root[static_cast<std::size_t>(o)];
      const int home = s.place[static_cast<std::size_t>(sn)];
      auto producer = value_step(sn, home);
      if (!producer) return producer.err();
      const node& on = s.g.at(o);
      step st;
      st.kind = step_kind::copy_d2h;
      st.device = home;
      st.ops = {o};
      st.io_index = static_cast<int>(k);
      st.bytes = on.contiguous() ? on.dims.numel() * static_cast<int64_t>(dtype_size(on.type))
                                 : s.g.at(sn).own_bytes();
      if (*producer >= 0) st.deps = {*producer};
      add_step(std::move(st));
    }
    return {};
  }

  // Kahn's algorithm, ties broken by creation order, so the final ids are a
  // topological order close to the graph's; the job's input copies (h2d
  // steps, which wait for nothing) first of all, so that each is the first
  // step of the queue it runs on: one read only by a later step of a
  // compute lane (a decode step's positions under tensor parallelism, read
  // from the first layer on, after the embedding's all-reduce) can still be
  // inlined there (inline_small_copies) instead of making the lane wait for
  // another queue. Fills ids, deps, consumers.
  expected<std::vector<step>> sorted() {
    const std::size_t n = steps.size();
    std::vector<int> indeg(n, 0);
    std::vector<std::vector<step_id>> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto& d = steps[i].deps;
      std::sort(d.begin(), d.end());
      d.erase(std::unique(d.begin(), d.end()), d.end());
      for (step_id x : d) out[static_cast<std::size_t>(x)].push_back(static_cast<step_id>(i));
      indeg[i] = static_cast<int>(d.size());
    }
    using entry = std::pair<int, step_id>;  // (0 for an input copy, else 1; creation order)
    std::priority_queue<entry, std::vector<entry>, std::greater<>> ready;
    for (std::size_t i = 0; i < n; ++i)
      if (indeg[i] == 0) ready.push({steps[i].kind == step_kind::copy_h2d ? 0 : 1, static_cast<step_id>(i)});
    std::vector<step_id> new_id(n, -1);
    std::vector<step> result;
    result.reserve(n);
    while (!ready.empty()) {
      const step_id x = ready.top().second;
      ready.pop();
      new_id[static_cast<std::size_t>(x)] = static_cast<step_id>(result.size());
      result.push_back(steps[static_cast<std::size_t>(x)]);
      for (step_id y : out[static_cast<std::size_t>(x)])
        if (--indeg[static_cast<std::size_t>(y)] == 0) ready.push({1, y});
    }
    if (result.size() != n) return error(errc::internal, "planner built a cyclic step graph");
    for (std::size_t i = 0; i < n; ++i) {
      step& st = result[i];
      st.id = static_cast<step_id>(i);
      for (step_id& d : st.deps) d = new_id[static_cast<std::size_t>(d)];
      std::sort(st.deps.begin(), st.deps.end());
      st.consumers.clear();
    }
    for (step& st : result)
      for (step_id d : st.deps) result[static_cast<std::size_t>(d)].consumers.push_back(st.id);
    return result;
  }
};

/// Puts host copies of at most device_spec::inline_copy_max_bytes on the
/// compute lane that reads them (h2d) or wrote them (d2h), see
/// plan_options::inline_small_copies. Only at a lane's ends: an h2d whose
/// consumers are all on one compute lane that has no step before it, a d2h
/// of one compute-lane producer whose lane has no step after it. So a copy
/// never splits a lane's run of compute steps (a replayed segment), and the
/// lane order, by step id, is still a topological order. The memory plan
/// takes no order from it (it orders compute steps only).
/// On a device whose lanes will run from one queue (`folding`, by device:
/// graph/replay.hpp folded_lanes, > 0), an h2d whose
/// consumers are all compute steps of the device, on any of its lanes, goes
/// first on its first consumer's lane: the folded queue then issues it
/// first, and the replay segment after it takes it in (one graph for the
/// job's input copy and the lanes' work), where a copy queue of its own
/// would cost every job a hand-over between actors and an event wait.
void inline_small_copies(std::vector<step>& steps, const std::vector<device_spec>& devices,
                         const std::vector<int>& folding) {
  // (device, lane) -> the first and last step id on that compute lane.
  std::map<std::pair<int, int>, std::pair<step_id, step_id>> span;
  for (const step& st : steps) {
    if (!on_compute_lane(st)) continue;
    auto [it, fresh] = span.try_emplace({st.device, st.lane}, st.id, st.id);
    if (!fresh) it->second.second = st.id;  // steps come in id order
  }
  for (step& st : steps) {
    if (st.kind != step_kind::copy_h2d && st.kind != step_kind::copy_d2h) continue;
    if (st.bytes > devices[static_cast<std::size_t>(st.device)].inline_copy_max_bytes) continue;
    int lane = -1;
    if (st.kind == step_kind::copy_h2d) {
      const bool any_lane = folding[static_cast<std::size_t>(st.device)] != 0;
      for (step_id c : st.consumers) {  // in id order: the first consumer's lane comes first
        const step& cs = steps[static_cast<std::size_t>(c)];
        const bool same = on_compute_lane(cs) && !cs.on_compute_stream && cs.device == st.device;
        if (!same || (lane >= 0 && cs.lane != lane && !any_lane)) {
          lane = -1;
          break;
        }
        if (lane < 0) lane = cs.lane;
      }
      if (lane < 0 || span.at({st.device, lane}).first < st.id) continue;
    } else {
      if (st.deps.size() != 1) continue;
      const step& ps = steps[static_cast<std::size_t>(st.deps[0])];
      if (!on_compute_lane(ps) || ps.on_compute_stream || ps.device != st.device) continue;
      lane = ps.lane;
      if (span.at({st.device, lane}).second > st.id) continue;
    }
    st.lane = lane;
    st.on_compute_stream = true;
  }
}

// One job needs host memory for its inputs and outputs (outputs that are
// non-contiguous views also need their storage there to gather from), and a
// device whose memory is the host's (device_spec::in_host_memory) needs its
// arena and weights there too: refuse a plan that could never run on this
// host, naming the sizes, before anything is allocated.
error check_host_memory(const plan& p) {
  const graph& g = p.source();
  int64_t total = 0, io = 0, largest = -1;
  std::string largest_what;
  bool saturated = false;
  const auto count = [&](const std::string& what, const node& n, int64_t bytes) {
    if (!checked_add(io, bytes, io)) saturated = true;
    if (bytes > largest) {
      largest = bytes;
      largest_what = what + " '" + n.name + "' " + to_string(n.type) + " " + n.dims.to_string() + " (" +
                     std::to_string(bytes) + " bytes)";
    }
  };
  for (std::size_t k = 0; k < g.inputs().size(); ++k) {
    const node& n = g.at(g.inputs()[k]);
    count("input " + std::to_string(k), n, n.own_bytes());
  }
  for (std::size_t k = 0; k < g.outputs().size(); ++k) {
    const node& n = g.at(g.outputs()[k]);
    const int64_t bytes = n.dims.numel() * static_cast<int64_t>(dtype_size(n.type));  // valid graph: fits
    count("output " + std::to_string(k), n, bytes);
    if (!n.contiguous()) {
      const node& st = g.at(storage_root(g, n.id));
      count("output " + std::to_string(k) + "'s storage", st, st.own_bytes());
    }
  }
  total = io;
  std::string devices;
  for (int d : p.used_devices()) {
    const device_spec& spec = p.devices()[static_cast<std::size_t>(d)];
    if (!spec.in_host_memory) continue;
    const device_memory& m = p.memory()[static_cast<std::size_t>(d)];
    int64_t states = 0;
    if (!checked_add(total, m.arena_bytes, total) || !checked_add(total, m.weight_bytes, total) ||
        !checked_mul(m.state_bytes, int64_t{p.options().state_slots}, states) || !checked_add(total, states, total))
      saturated = true;
    devices += (devices.empty() ? "" : ", ") + spec.name + " arena " + std::to_string(m.arena_bytes) + " + weights " +
               std::to_string(m.weight_bytes) + (states > 0 ? " + state " + std::to_string(states) : std::string());
  }
  const int64_t have = host_memory_bytes();
  if (saturated || total > have)
    return error(errc::out_of_memory,
                 "compile: one job of this plan needs " +
                     (saturated ? std::string("more than 2^63") : std::to_string(total)) +
                     " bytes of host memory, more than this host's " + std::to_string(have) + ": inputs and outputs " +
                     std::to_string(io) + " (the largest is " + largest_what + ")" +
                     (devices.empty() ? std::string() : "; devices in host memory: " + devices));
  return {};
}

/// plan_options::share_state_with: `g` with each store_rows node pinned to
/// the device `other` keeps the node of that name on (null when nothing
/// changes); an error naming the node when `other` lacks it or holds it
/// with other dims or dtype.
expected<std::shared_ptr<const graph>> pin_shared_state(const graph& g, const plan& other) {
  std::vector<node> nodes(g.nodes().begin(), g.nodes().end());
  bool changed = false;
  for (node& n : nodes) {
    if (!is_state_op(n.op)) continue;
    const node_id o = other.source().find(n.name);
    const auto bad = [&](const std::string& why) {
      return error(errc::invalid_argument, "compile: plan_options::share_state_with: state '" + n.name + "' " + why);
    };
    if (o == no_node) return bad("is not in the other plan");
    const node& on = other.source().at(o);
    if (!is_state_op(on.op) || on.dims != n.dims || on.type != n.type)
      return bad("is " + std::string(to_string(n.type)) + " " + n.dims.to_string() + " here but " +
                 to_string(on.op) + " " + to_string(on.type) + " " + on.dims.to_string() + " in the other plan");
    const int dev = other.placement()[static_cast<std::size_t>(o)];
    if (dev < 0) return bad("is pruned from the other plan (no output needs it there)");
    if (n.pinned_device >= 0 && n.pinned_device != dev)
      return bad("is pinned to device " + std::to_string(n.pinned_device) + " here but lives on device " +
                 std::to_string(dev) + " in the other plan");
    changed |= n.pinned_device != dev;
    n.pinned_device = dev;
  }
  if (!changed) return std::shared_ptr<const graph>{};
  std::vector<node_id> inputs(g.inputs().begin(), g.inputs().end()), outputs(g.outputs().begin(), g.outputs().end());
  auto rebuilt = graph::from_nodes(std::move(nodes), std::move(inputs), std::move(outputs));
  if (!rebuilt) return rebuilt.err();
  return std::make_shared<const graph>(std::move(*rebuilt));
}

}  // namespace

error validate(const plan_options& o) {
  const auto bad = [](const std::string& what) { return error(errc::invalid_argument, "plan_options: " + what); };
  if (o.policy != placement_policy::automatic && o.policy != placement_policy::single)
    return bad("policy " + std::to_string(static_cast<int>(o.policy)) + " is not a placement_policy (automatic = 0, single = 1)");
  if (o.pipeline_stages < 0 || o.pipeline_stages > 4096)
    return bad("pipeline_stages must be 0 (all devices) .. 4096, got " + std::to_string(o.pipeline_stages));
  if (o.lanes_per_device < 0 || o.lanes_per_device > 64)
    return bad("lanes_per_device must be 0 (auto) .. 64, got " + std::to_string(o.lanes_per_device));
  if (o.job_lanes < 0 || o.job_lanes > 8)
    return bad("job_lanes must be 0 (auto), 1 (off) .. 8, got " + std::to_string(o.job_lanes));
  if (!(o.max_lane_memory_ratio >= 1) || !std::isfinite(o.max_lane_memory_ratio))
    return bad("max_lane_memory_ratio must be a finite number >= 1, got " + std::to_string(o.max_lane_memory_ratio));
  if (o.lane_memory_slack_bytes < 0)
    return bad("lane_memory_slack_bytes must be >= 0, got " + std::to_string(o.lane_memory_slack_bytes));
  if (!(o.min_branch_seconds >= 0) || !std::isfinite(o.min_branch_seconds))
    return bad("min_branch_seconds must be a finite number >= 0, got " + std::to_string(o.min_branch_seconds));
  if (o.tensor_parallel < 1 || o.tensor_parallel > 4096)
    return bad("tensor_parallel must be >= 1 (at most 4096), got " + std::to_string(o.tensor_parallel));
  if (o.graph_replay != graph_replay_mode::off && o.graph_replay != graph_replay_mode::on &&
      o.graph_replay != graph_replay_mode::automatic)
    return bad("graph_replay " + std::to_string(static_cast<int>(o.graph_replay)) +
               " is not a graph_replay_mode (off = 0, on = 1, auto = 2)");
  if (o.sequence_parallel != sequence_parallel_mode::off && o.sequence_parallel != sequence_parallel_mode::on &&
      o.sequence_parallel != sequence_parallel_mode::automatic)
    return bad("sequence_parallel " + std::to_string(static_cast<int>(o.sequence_parallel)) +
               " is not a sequence_parallel_mode (off = 0, on = 1, auto = 2)");
  if (o.tp_batch_chunks != batch_chunks_mode::off && o.tp_batch_chunks != batch_chunks_mode::on &&
      o.tp_batch_chunks != batch_chunks_mode::automatic)
    return bad("tp_batch_chunks " + std::to_string(static_cast<int>(o.tp_batch_chunks)) +
               " is not a batch_chunks_mode (off = 0, on = 1, auto = 2)");
  if (o.tp_overlap_chunks != 0 && o.tp_overlap_chunks != 2 && o.tp_overlap_chunks != 4)
    return bad("tp_overlap_chunks must be 0 (the cost model's choice), 2 or 4, got " +
               std::to_string(o.tp_overlap_chunks));
  if (o.state_slots < 1 || o.state_slots > 65536)
    return bad("state_slots must be 1..65536, got " + std::to_string(o.state_slots));
  if (o.decode_step_max_cache_rows < 1)
    return bad("decode_step_max_cache_rows must be >= 1, got " + std::to_string(o.decode_step_max_cache_rows));
  return {};
}

error planner::group_collectives(plan& p) {
  const graph& g = *p.graph_;
  std::map<std::pair<op_kind, std::vector<node_id>>, std::vector<step_id>> parts;
  for (const step& st : p.steps_)
    if (st.kind == step_kind::collective) parts[{g.at(st.ops[0]).op, g.at(st.ops[0]).inputs}].push_back(st.id);
  for (auto& [key, ids] : parts) {
    std::sort(ids.begin(), ids.end(), [&](step_id a, step_id b) {
      return g.at(p.steps_[static_cast<std::size_t>(a)].ops[0]).attrs.rank < g.at(p.steps_[static_cast<std::size_t>(b)].ops[0]).attrs.rank;
    });
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const node& n = g.at(p.steps_[static_cast<std::size_t>(ids[i])].ops[0]);
      if (i > 0 && g.at(p.steps_[static_cast<std::size_t>(ids[i - 1])].ops[0]).attrs.rank == n.attrs.rank)
        return error(errc::invalid_argument, std::string(to_string(n.op)) + " '" + n.name + "' and '" +
                                                 g.at(p.steps_[static_cast<std::size_t>(ids[i - 1])].ops[0]).name +
                                                 "' read the same operands as the same rank " + std::to_string(n.attrs.rank));
    }
    for (step_id id : ids) p.steps_[static_cast<std::size_t>(id)].peers = ids;
  }
  return {};
}

expected<std::shared_ptr<const plan>> planner::compile(std::shared_ptr<const graph> gp,
                                                       std::vector<device_spec> devices,
                                                       plan_options options, int auto_lane_cap) {
  if (!gp) return error(errc::invalid_argument, "compile: graph is null");
  if (devices.empty()) return error(errc::invalid_argument, "compile: no devices given");
  if (auto e = validate(options)) return error(e.code, "compile: " + e.message);
  for (const device_spec& d : devices)
    if (auto e = validate(d)) return error(e.code, "compile: " + e.message);
  const std::shared_ptr<const graph> original = gp;
  // Folding serves the GEMV kernels that take a norm in (CUDA, and the sim
  // that models it); a plan of cpu devices alone would only pay the load's
  // products and one more rounding of each scaled weight.
  const bool cpu_only = std::all_of(devices.begin(), devices.end(),
                                    [](const device_spec& d) { return d.kind == device_kind::cpu; });
  if (options.fold_norm_weights && !cpu_only) {
    auto folded = fold_norm_weights(*gp);
    if (!folded) return error(folded.err().code, "compile: " + folded.err().message);
    if (*folded) gp = std::move(*folded);
  }
  std::shared_ptr<const tensor_parallel_info> tp;
  if (options.tensor_parallel > 1) {
    auto rw = rewrite_tensor_parallel(gp, devices, options);
    if (!rw) return rw.err();
    gp = rw->rewritten;
    tp = rw->info;
  } else if (!options.shard_ratios.empty() && options.shard_ratios.size() != 1) {
    return error(errc::invalid_argument, "compile: shard_ratios has " + std::to_string(options.shard_ratios.size()) +
                                             " entries, the tensor-parallel degree is 1");
  }
  if (options.share_state_with) {
    if (options.share_state_with->devices().size() != devices.size())
      return error(errc::invalid_argument, "compile: plan_options::share_state_with names a plan over " +
                                               std::to_string(options.share_state_with->devices().size()) +
                                               " devices, this one has " + std::to_string(devices.size()));
    auto pinned = pin_shared_state(*gp, *options.share_state_with);
    if (!pinned) return pinned.err();
    if (*pinned) gp = std::move(*pinned);
    options.state_slots = options.share_state_with->options().state_slots;
  }
  const graph& g = *gp;
  if (g.outputs().empty())
    return error(errc::invalid_argument, "compile: the graph has no outputs (" + std::to_string(g.size()) +
                                             " nodes): nothing to compute; mark a tensor with output()");
  for (std::size_t i = 0; i < g.size(); ++i)
    if (g.at(static_cast<node_id>(i)).id != static_cast<node_id>(i))
      return error(errc::internal, "compile: node ids are not indices");

  builder_state s(g, devices, options, auto_lane_cap);
  if (tp && options.hand_over_lane) s.hand_over = tp->hand_over;
  prune(s);
  if (auto e = place_compute(s)) return e;
  place_leaves_and_views(s);
  const auto output_pieces = find_output_pieces(s);
  assign_lanes(s);

  step_builder sb(s);
  for (const node& n : g.nodes()) {
    if (s.place[static_cast<std::size_t>(n.id)] < 0 || !is_compute(n)) continue;
    if (auto e = sb.add_compute(n)) return e;
  }
  if (auto e = sb.add_outputs(output_pieces)) return e;
  auto sorted = sb.sorted();
  if (!sorted) return sorted.err();

  auto p = std::make_shared<plan>();
  p->graph_ = gp;
  p->original_ = original;
  p->tp_ = tp;
  p->devices_ = std::move(devices);
  p->options_ = options;
  p->placement_ = s.place;
  p->steps_ = std::move(*sorted);

  if (auto e = group_collectives(*p)) return e;

  // Each step's cost-model time (what order_steps simulates with).
  for (step& st : p->steps_) {
    const device_spec& d = p->devices_[static_cast<std::size_t>(st.device)];
    switch (st.kind) {
      case step_kind::compute:
        st.est_seconds = 0;
        for (node_id id : st.ops) st.est_seconds += estimate_seconds(d, g, g.at(id));
        break;
      case step_kind::copy_h2d:
      case step_kind::copy_d2h:
        st.est_seconds = estimate_host_copy_seconds(d, st.bytes);
        break;
      case step_kind::copy_peer:
        st.est_seconds = estimate_peer_copy_seconds(p->devices_[static_cast<std::size_t>(st.src_device)], d, st.bytes);
        break;
      case step_kind::collective: {
        std::vector<const device_spec*> members;
        for (step_id q : st.peers) members.push_back(&p->devices_[static_cast<std::size_t>(p->steps_[static_cast<std::size_t>(q)].device)]);
        st.algo = choose_collective_algo(members, st.bytes, g.at(st.ops[0]).op, options.in_stream_collectives);
        st.est_seconds = estimate_collective_seconds(g.at(st.ops[0]).op, st.algo, members, st.bytes);
        // An in-stream collective part queues on compute lane 0 (plan.hpp, step).
        if (runs_in_stream(st)) st.lane = 0;
        break;
      }
    }
  }
  if (options.order_steps_by_model) order_steps(*p);
  // On the devices whose lanes the lowering will fold (their lanes are
  // set by now; inlining only moves copies onto lanes already used).
  if (options.inline_small_copies) inline_small_copies(p->steps_, p->devices_, folded_lanes(*p));

  // Lane order: compute lanes (with the in-stream parts and copies inlined
  // there) per (device, lane), copies per (device, kind), both in step order
  // (so lane order never contradicts deps).
  std::map<std::tuple<int, int, int>, int> seq;
  std::vector<char> used(p->devices_.size(), 0);
  for (step& st : p->steps_) {
    const bool compute_lane = on_compute_lane(st);
    const int queue = compute_lane ? st.lane : -1;
    st.lane_seq = seq[{st.device, static_cast<int>(compute_lane ? step_kind::compute : st.kind), queue}]++;
    used[static_cast<std::size_t>(st.device)] = 1;
    if (st.src_device >= 0) used[static_cast<std::size_t>(st.src_device)] = 1;
    if (st.deps.empty()) p->sources_.push_back(st.id);
    if (st.kind == step_kind::copy_d2h) p->sinks_.push_back(st.id);
  }
  for (std::size_t d = 0; d < used.size(); ++d)
    if (used[d]) p->used_devices_.push_back(static_cast<int>(d));

  if (options.fuse_ops) p->fusions_ = find_attention_fusions(g, p->steps_, p->devices_);
  p->fused_inside_.assign(g.size(), 0);
  for (const attention_fusion& f : p->fusions_)
    for (node_id id : {f.scores, f.mask_add, f.softmax})
      if (id != no_node) p->fused_inside_[static_cast<std::size_t>(id)] = 1;
  if (options.fuse_projections) p->projection_fusions_ = find_projection_fusions(g, p->steps_, p->devices_, p->fusions_);
  elide_concats(*p);
  elide_empty_stores(*p);
  if (auto e = plan_memory(*p)) return e;
  if (auto e = check_host_memory(*p)) return e;
  return std::shared_ptr<const plan>(std::move(p));
}

namespace {

bool uses_lanes(const plan& p) {
  return std::any_of(p.steps().begin(), p.steps().end(),
                     [](const step& st) { return st.kind == step_kind::compute && st.lane > 0; });
}

/// Every device's arena of `lanes` within `ratio` times the one-lane plan's,
/// or at most `slack` bytes above it.
bool arena_within(const plan& lanes, const plan& one, double ratio, int64_t slack) {
  for (std::size_t d = 0; d < lanes.memory().size() && d < one.memory().size(); ++d) {
    const int64_t with = lanes.memory()[d].arena_bytes, without = one.memory()[d].arena_bytes;
    if (with - without > slack && static_cast<double>(with) > ratio * static_cast<double>(without)) return false;
  }
  return true;
}

}  // namespace

expected<std::shared_ptr<const plan>> compile(std::shared_ptr<const graph> g, std::vector<device_spec> devices,
                                              plan_options options) {
  try {
    if (options.lanes_per_device != 0) return planner::compile(std::move(g), std::move(devices), options, 0);
    // Auto lanes: most plans use none (one pass). A plan that spreads
    // branches is kept only if no device's arena grows past
    // max_lane_memory_ratio of the one-lane plan's (or by more than
    // lane_memory_slack_bytes); else fewer lanes.
    int cap = 1;
    for (const device_spec& d : devices) cap = std::max(cap, d.max_lanes);
    auto first = planner::compile(g, devices, options, cap);
    if (!first || cap == 1 || !uses_lanes(**first)) return first;
    auto one = planner::compile(g, devices, options, 1);
    if (!one) return one;
    for (auto p = std::move(first); p && uses_lanes(**p);) {
      if (arena_within(**p, **one, options.max_lane_memory_ratio, options.lane_memory_slack_bytes)) return p;
      if (--cap < 2) break;
      p = planner::compile(g, devices, options, cap);
      if (!p) return p;
    }
    return one;
  } catch (const std::exception& e) {
    return error(errc::internal, std::string("compile: ") + e.what());
  }
}

}  // namespace ag
