// graph: op names, validation of raw node lists (from_nodes), lookup, DOT.
#include "graph/graph.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "graph/validate_util.hpp"

namespace ag {

namespace {

constexpr const char* op_names[op_kind_count] = {
    "input",   "weight",  "matmul",   "add",     "mul",  "scale",   "rms_norm",  "layer_norm",
    "softmax", "gelu",    "silu",     "rope",    "get_rows", "reshape", "view", "permute",
    "transpose", "slice", "concat",   "copy", "all_reduce", "all_gather", "reduce_scatter",
    "store_rows", "argmax", "range_mask",
};

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

const char* to_string(op_kind k) noexcept {
  const int i = static_cast<int>(k);
  return i >= 0 && i < op_kind_count ? op_names[i] : "?";
}

bool parse_op_kind(const std::string& s, op_kind& out) noexcept {
  for (int i = 0; i < op_kind_count; ++i) {
    if (s == op_names[i]) {
      out = static_cast<op_kind>(i);
      return true;
    }
  }
  return false;
}

expected<graph> graph::from_nodes(std::vector<node> nodes, std::vector<node_id> inputs,
                                  std::vector<node_id> outputs) {
  const std::size_t n = nodes.size();
  // Fast path: ids are already the positions and every input comes before
  // its reader (what builders and the planner's rewrites produce): no
  // renumbering, no sort, no id maps.
  bool ordered = true;
  for (std::size_t i = 0; i < n && ordered; ++i) {
    ordered = nodes[i].id == static_cast<node_id>(i);
    for (node_id in : nodes[i].inputs) ordered = ordered && in >= 0 && in < nodes[i].id;
  }
  // 1. ids and names unique
  std::unordered_map<node_id, std::size_t> pos;  // original id -> position in `nodes` (unordered lists only)
  std::unordered_map<std::string, node_id> by_name;
  by_name.reserve(n);
  if (!ordered) pos.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const node& x = nodes[i];
    if (x.name.empty())
      return error(errc::invalid_argument, std::string(to_string(x.op)) + " node with id " + std::to_string(x.id) +
                                               " has no name");
    if (x.id < 0)
      return error(errc::invalid_argument, detail::label(x) + ": negative id " + std::to_string(x.id));
    if (!ordered && !pos.emplace(x.id, i).second)
      return error(errc::invalid_argument, detail::label(x) + ": duplicate id " + std::to_string(x.id) +
                                               " (also used by " + quoted(nodes[pos[x.id]].name) + ")");
    if (auto [it, fresh] = by_name.emplace(x.name, x.id); !fresh)
      return error(errc::invalid_argument, detail::label(x) + ": duplicate name (ids " + std::to_string(it->second) +
                                               " and " + std::to_string(x.id) + ")");
  }
  std::vector<std::size_t> order;
  std::unordered_map<node_id, node_id> new_id;  // unordered lists only
  if (ordered) {
    order.resize(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
  } else {
    // 2. every input id exists (arity is checked by infer_node below)
    std::vector<std::vector<std::size_t>> users(n);
    std::vector<std::size_t> pending(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < nodes[i].inputs.size(); ++k) {
        const node_id in = nodes[i].inputs[k];
        if (in == no_node)
          return detail::node_error(errc::missing_input, nodes[i], "input " + std::to_string(k) + " is missing (no node)");
        auto it = pos.find(in);
        if (it == pos.end())
          return detail::node_error(errc::unknown_input, nodes[i],
                                    "input " + std::to_string(k) + " names unknown node id " + std::to_string(in));
        users[it->second].push_back(i);
        ++pending[i];
      }
    }
    // 3. stable topological order (Kahn; among ready nodes the earliest listed first)
    std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
    for (std::size_t i = 0; i < n; ++i)
      if (pending[i] == 0) ready.push(i);
    order.reserve(n);
    while (!ready.empty()) {
      const std::size_t i = ready.top();
      ready.pop();
      order.push_back(i);
      for (std::size_t u : users[i])
        if (--pending[u] == 0) ready.push(u);
    }
    if (order.size() != n) {
      // walk inputs among the unordered nodes until one repeats: that one is on a cycle
      std::size_t cur = 0;
      while (pending[cur] == 0) ++cur;
      std::vector<int> seen_at(n, -1);
      std::vector<std::size_t> path;
      while (seen_at[cur] < 0) {
        seen_at[cur] = static_cast<int>(path.size());
        path.push_back(cur);
        for (node_id in : nodes[cur].inputs) {
          const std::size_t p = pos[in];
          if (pending[p] != 0) {
            cur = p;
            break;
          }
        }
      }
      std::string ring;
      // path runs consumer -> input; print it in data-flow order (input -> consumer)
      for (std::size_t k = path.size(); k-- > static_cast<std::size_t>(seen_at[cur]);)
        ring += quoted(nodes[path[k]].name) + " -> ";
      ring += quoted(nodes[path.back()].name);
      return detail::node_error(errc::cycle, nodes[cur], "is on a cycle: " + ring);
    }
    new_id.reserve(n);
    for (std::size_t k = 0; k < n; ++k) new_id[nodes[order[k]].id] = static_cast<node_id>(k);
  }
  auto renumbered = [&](node_id id) -> std::optional<node_id> {
    if (ordered) {
      if (id < 0 || static_cast<std::size_t>(id) >= n) return std::nullopt;
      return id;
    }
    auto it = new_id.find(id);
    if (it == new_id.end()) return std::nullopt;
    return it->second;
  };
  // 4. renumber and re-infer
  graph g;
  g.nodes_.reserve(n);
  for (std::size_t k = 0; k < n; ++k) {
    node x = std::move(nodes[order[k]]);
    x.id = static_cast<node_id>(k);
    if (!ordered)
      for (node_id& in : x.inputs) in = new_id[in];
    if (auto e = infer_node(g.nodes_, x)) return e;
    g.nodes_.push_back(std::move(x));
  }
  // 5. job inputs: exactly the input nodes, each once
  std::vector<bool> listed(n, false);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    auto id = renumbered(inputs[k]);
    if (!id)
      return error(errc::unknown_input, "graph input " + std::to_string(k) + " names unknown node id " +
                                            std::to_string(inputs[k]));
    const node& x = g.nodes_[static_cast<std::size_t>(*id)];
    if (x.op != op_kind::input)
      return detail::node_error(errc::invalid_argument, x,
                                "is listed as graph input " + std::to_string(k) + " but is not an input node");
    if (listed[static_cast<std::size_t>(x.id)])
      return detail::node_error(errc::invalid_argument, x, "is listed twice as a graph input");
    listed[static_cast<std::size_t>(x.id)] = true;
    g.inputs_.push_back(x.id);
  }
  for (const node& x : g.nodes_)
    if (x.op == op_kind::input && !listed[static_cast<std::size_t>(x.id)])
      return detail::node_error(errc::missing_input, x, "is not in the graph's input list, so no job can feed it");
  // 6. job outputs
  if (outputs.empty()) return error(errc::invalid_argument, "graph has no outputs");
  std::fill(listed.begin(), listed.end(), false);
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    auto id = renumbered(outputs[k]);
    if (!id)
      return error(errc::unknown_input, "graph output " + std::to_string(k) + " names unknown node id " +
                                            std::to_string(outputs[k]));
    const node& x = g.nodes_[static_cast<std::size_t>(*id)];
    if (listed[static_cast<std::size_t>(x.id)])
      return detail::node_error(errc::invalid_argument, x, "is listed twice as a graph output");
    listed[static_cast<std::size_t>(x.id)] = true;
    g.outputs_.push_back(x.id);
  }
  if (ordered) {
    g.by_name_ = std::move(by_name);
  } else {
    for (const node& x : g.nodes_) g.by_name_.emplace(x.name, x.id);
  }
  // 7. consumers (each consumer once, even if it reads a node twice)
  g.consumers_.assign(n, {});
  for (const node& x : g.nodes_) {
    for (node_id in : x.inputs) {
      auto& c = g.consumers_[static_cast<std::size_t>(in)];
      if (c.empty() || c.back() != x.id) c.push_back(x.id);
    }
  }
  return g;
}

node_id graph::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? no_node : it->second;
}

int64_t graph::weight_bytes() const {
  int64_t total = 0;
  for (const node& x : nodes_)
    if (x.op == op_kind::weight && x.data) total += x.data->bytes();
  return total;
}

namespace {

std::string dot_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (c == '\n') {
      r += "\\n";
      continue;
    }
    r += c;
  }
  return r;
}

}  // namespace

std::string graph::to_dot() const {
  std::string s = "digraph actorgraph {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  std::vector<bool> is_out(nodes_.size(), false);
  for (node_id o : outputs_) is_out[static_cast<std::size_t>(o)] = true;
  for (const node& x : nodes_) {
    s += "  n" + std::to_string(x.id) + " [label=\"" + dot_escape(x.name) + "\\n" + to_string(x.op) + " " +
         ag::to_string(x.type) + " " + x.dims.to_string();
    if (x.is_view()) s += "\\nview of " + dot_escape(nodes_[static_cast<std::size_t>(x.storage)].name);
    if (x.layer >= 0) s += "\\nlayer " + std::to_string(x.layer);
    if (x.pinned_device >= 0) s += "\\npinned to device " + std::to_string(x.pinned_device);
    s += "\"";
    if (is_out[static_cast<std::size_t>(x.id)])
      s += ", style=\"filled,bold\", fillcolor=\"lightgoldenrod\", penwidth=2";
    else if (x.op == op_kind::input)
      s += ", style=filled, fillcolor=\"lightblue\"";
    else if (x.op == op_kind::weight)
      s += ", style=filled, fillcolor=\"lightgrey\"";
    else if (x.is_view())
      s += ", style=dashed";
    s += "];\n";
  }
  for (const node& x : nodes_)
    for (node_id in : x.inputs) s += "  n" + std::to_string(in) + " -> n" + std::to_string(x.id) + ";\n";
  s += "}\n";
  return s;
}

std::vector<node_id> pruning_roots(const graph& g) {
  std::vector<node_id> roots(g.outputs().begin(), g.outputs().end());
  for (const node& n : g.nodes())
    if (is_state_op(n.op)) roots.push_back(n.id);
  return roots;
}

}  // namespace ag
