// graph_builder: records nodes, checks each one as it is made (infer_node),
// keeps the first error instead of throwing.
#include <algorithm>
#include <atomic>

#include "graph/graph.hpp"
#include "graph/validate_util.hpp"

namespace ag {

uint64_t graph_builder::next_serial() noexcept {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

tensor graph_builder::fail(error e) {
  if (status_.ok()) status_ = std::move(e);
  return tensor();
}

std::string graph_builder::default_name(op_kind k) const {
  return std::string(to_string(k)) + "_" + std::to_string(nodes_.size());
}

bool graph_builder::check(tensor x, const char* what, const std::string& name) {
  if (!status_.ok()) return false;
  if (!x.valid()) {
    fail(error(errc::missing_input, name + ": " + what + " is an invalid tensor (missing or from a failed call)"));
    return false;
  }
  if (x.owner_ != serial_ || static_cast<std::size_t>(x.id_) >= nodes_.size()) {
    fail(error(errc::unknown_input, name + ": " + what + " (id " + std::to_string(x.id_) +
                                        ") was made by another graph_builder"));
    return false;
  }
  return true;
}

tensor graph_builder::add_node(node n) {
  if (!status_.ok()) return tensor();
  n.id = static_cast<node_id>(nodes_.size());
  if (n.name.empty()) {
    n.name = default_name(n.op);
    // an explicit name may already hold the default one; make ours unique
    for (int k = 2; by_name_.count(n.name) != 0; ++k) n.name = default_name(n.op) + "_" + std::to_string(k);
  } else if (auto it = by_name_.find(n.name); it != by_name_.end()) {
    return fail(detail::node_error(errc::invalid_argument, n,
                                   "duplicate name (already used by " +
                                       detail::label(nodes_[static_cast<std::size_t>(it->second)]) + ")"));
  }
  n.layer = layer_;
  n.storage = n.id;
  if (auto e = infer_node(nodes_, n)) return fail(std::move(e));
  by_name_.emplace(n.name, n.id);
  nodes_.push_back(std::move(n));
  return tensor(nodes_.back().id, serial_);
}

namespace {

node make(op_kind k, std::string name, std::vector<node_id> inputs) {
  node n;
  n.op = k;
  n.name = std::move(name);
  n.inputs = std::move(inputs);
  return n;
}

// "matmul 'x'" or "matmul" when the name is not chosen yet
std::string who(op_kind k, const std::string& name) {
  return name.empty() ? std::string(to_string(k)) : std::string(to_string(k)) + " '" + name + "'";
}

}  // namespace

tensor graph_builder::input(std::string name, dtype type, shape dims) {
  if (!status_.ok()) return tensor();
  node n = make(op_kind::input, std::move(name), {});
  n.type = type;
  n.dims = dims;
  tensor t = add_node(std::move(n));
  if (t.valid()) inputs_.push_back(t.id());
  return t;
}

tensor graph_builder::weight(std::string name, host_tensor data) {
  if (!status_.ok()) return tensor();
  return weight(std::move(name), make_host_weight(std::move(data)));
}

tensor graph_builder::weight(std::string name, weight_source_ptr source) {
  if (!status_.ok()) return tensor();
  node n = make(op_kind::weight, std::move(name), {});
  n.data = std::move(source);
  return add_node(std::move(n));
}

tensor graph_builder::matmul(tensor a, tensor b, bool trans_a, bool trans_b, std::string name) {
  const std::string w = who(op_kind::matmul, name);
  if (!check(a, "a", w) || !check(b, "b", w)) return tensor();
  node n = make(op_kind::matmul, std::move(name), {a.id(), b.id()});
  n.attrs.trans_a = trans_a;
  n.attrs.trans_b = trans_b;
  return add_node(std::move(n));
}

tensor graph_builder::add(tensor a, tensor b, std::string name) {
  const std::string w = who(op_kind::add, name);
  if (!check(a, "a", w) || !check(b, "b", w)) return tensor();
  return add_node(make(op_kind::add, std::move(name), {a.id(), b.id()}));
}

tensor graph_builder::mul(tensor a, tensor b, std::string name) {
  const std::string w = who(op_kind::mul, name);
  if (!check(a, "a", w) || !check(b, "b", w)) return tensor();
  return add_node(make(op_kind::mul, std::move(name), {a.id(), b.id()}));
}

tensor graph_builder::scale(tensor x, float s, std::string name) {
  if (!check(x, "x", who(op_kind::scale, name))) return tensor();
  node n = make(op_kind::scale, std::move(name), {x.id()});
  n.attrs.scale = s;
  return add_node(std::move(n));
}

tensor graph_builder::rms_norm(tensor x, tensor weight, float eps, std::string name) {
  const std::string w = who(op_kind::rms_norm, name);
  if (!check(x, "x", w)) return tensor();
  std::vector<node_id> ins{x.id()};
  if (weight.valid()) {
    if (!check(weight, "weight", w)) return tensor();
    ins.push_back(weight.id());
  }
  node n = make(op_kind::rms_norm, std::move(name), std::move(ins));
  n.attrs.eps = eps;
  return add_node(std::move(n));
}

tensor graph_builder::layer_norm(tensor x, tensor weight, tensor bias, float eps, std::string name) {
  const std::string w = who(op_kind::layer_norm, name);
  if (!check(x, "x", w)) return tensor();
  if (weight.valid() && !check(weight, "weight", w)) return tensor();
  if (bias.valid() && !check(bias, "bias", w)) return tensor();
  if (bias.valid() && !weight.valid()) {
    // inputs are positional (x, weight, bias): a bias alone needs a ones weight
    const node& xn = nodes_[static_cast<std::size_t>(x.id())];
    const int64_t d = xn.dims[-1];
    host_tensor ones(xn.type, shape{d});
    for (int64_t i = 0; i < d; ++i) ones.set(i, 1.0f);
    if (name.empty()) name = "layer_norm_" + std::to_string(nodes_.size() + 1);  // its id once the weight exists
    weight = this->weight(name + ".ones", std::move(ones));
    if (!weight.valid()) return tensor();
  }
  std::vector<node_id> ins{x.id()};
  if (weight.valid()) ins.push_back(weight.id());
  if (bias.valid()) ins.push_back(bias.id());
  node n = make(op_kind::layer_norm, std::move(name), std::move(ins));
  n.attrs.eps = eps;
  return add_node(std::move(n));
}

tensor graph_builder::softmax(tensor x, bool causal, float scale, std::string name) {
  if (!check(x, "x", who(op_kind::softmax, name))) return tensor();
  node n = make(op_kind::softmax, std::move(name), {x.id()});
  n.attrs.causal = causal;
  n.attrs.scale = scale;
  return add_node(std::move(n));
}

tensor graph_builder::argmax(tensor x, std::string name) {
  if (!check(x, "x", who(op_kind::argmax, name))) return tensor();
  return add_node(make(op_kind::argmax, std::move(name), {x.id()}));
}

tensor graph_builder::range_mask(tensor key_positions, tensor query_ranges, dtype type, std::string name,
                                 bool rows_apart) {
  const std::string w = who(op_kind::range_mask, name);
  if (!check(key_positions, "key_positions", w) || !check(query_ranges, "query_ranges", w)) return tensor();
  node n = make(op_kind::range_mask, std::move(name), {key_positions.id(), query_ranges.id()});
  n.type = type;
  n.attrs.rows_apart = rows_apart;
  return add_node(std::move(n));
}

tensor graph_builder::gelu(tensor x, gelu_mode mode, std::string name) {
  if (!check(x, "x", who(op_kind::gelu, name))) return tensor();
  node n = make(op_kind::gelu, std::move(name), {x.id()});
  n.attrs.gelu = mode;
  return add_node(std::move(n));
}

tensor graph_builder::silu(tensor x, std::string name) {
  if (!check(x, "x", who(op_kind::silu, name))) return tensor();
  return add_node(make(op_kind::silu, std::move(name), {x.id()}));
}

tensor graph_builder::rope(tensor x, tensor positions, float theta, rope_mode mode, std::string name,
                           rope_scaling scaling) {
  const std::string w = who(op_kind::rope, name);
  if (!check(x, "x", w) || !check(positions, "positions", w)) return tensor();
  node n = make(op_kind::rope, std::move(name), {x.id(), positions.id()});
  n.attrs.theta = theta;
  n.attrs.rope_scale = scaling;
  n.attrs.rope = mode;
  return add_node(std::move(n));
}

tensor graph_builder::get_rows(tensor table, tensor ids, std::string name) {
  const std::string w = who(op_kind::get_rows, name);
  if (!check(table, "table", w) || !check(ids, "ids", w)) return tensor();
  return add_node(make(op_kind::get_rows, std::move(name), {table.id(), ids.id()}));
}

tensor graph_builder::store_rows(tensor rows, tensor positions, int axis, int64_t capacity, std::string name) {
  const std::string w = who(op_kind::store_rows, name);
  if (!check(rows, "rows", w) || !check(positions, "positions", w)) return tensor();
  node n = make(op_kind::store_rows, std::move(name), {rows.id(), positions.id()});
  n.attrs.axis = axis;
  n.attrs.end = capacity;
  return add_node(std::move(n));
}

tensor graph_builder::reshape(tensor x, shape dims, std::string name) {
  if (!check(x, "x", who(op_kind::reshape, name))) return tensor();
  node n = make(op_kind::reshape, std::move(name), {x.id()});
  n.dims = dims;
  return add_node(std::move(n));
}

tensor graph_builder::view(tensor x, shape dims, strides st, int64_t offset, std::string name) {
  if (!check(x, "x", who(op_kind::view, name))) return tensor();
  node n = make(op_kind::view, std::move(name), {x.id()});
  n.dims = dims;
  n.stride = st;
  // the node keeps an absolute offset into the storage buffer
  n.offset = nodes_[static_cast<std::size_t>(x.id())].offset + offset;
  return add_node(std::move(n));
}

tensor graph_builder::permute(tensor x, std::array<int, max_rank> perm, std::string name) {
  if (!check(x, "x", who(op_kind::permute, name))) return tensor();
  node n = make(op_kind::permute, std::move(name), {x.id()});
  n.attrs.perm = perm;
  return add_node(std::move(n));
}

tensor graph_builder::transpose(tensor x, int axis0, int axis1, std::string name) {
  if (!check(x, "x", who(op_kind::transpose, name))) return tensor();
  node n = make(op_kind::transpose, std::move(name), {x.id()});
  n.attrs.axis = axis0;
  n.attrs.axis2 = axis1;
  return add_node(std::move(n));
}

tensor graph_builder::slice(tensor x, int axis, int64_t begin, int64_t end, std::string name) {
  if (!check(x, "x", who(op_kind::slice, name))) return tensor();
  node n = make(op_kind::slice, std::move(name), {x.id()});
  n.attrs.axis = axis;
  n.attrs.begin = begin;
  n.attrs.end = end;
  return add_node(std::move(n));
}

tensor graph_builder::concat(const std::vector<tensor>& xs, int axis, std::string name) {
  const std::string w = who(op_kind::concat, name);
  if (!status_.ok()) return tensor();
  if (xs.empty()) return fail(error(errc::missing_input, w + ": needs at least one input"));
  std::vector<node_id> ins;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (!check(xs[i], ("input " + std::to_string(i)).c_str(), w)) return tensor();
    ins.push_back(xs[i].id());
  }
  node n = make(op_kind::concat, std::move(name), std::move(ins));
  n.attrs.axis = axis;
  return add_node(std::move(n));
}

tensor graph_builder::copy(tensor x, dtype type, std::string name) {
  if (!check(x, "x", who(op_kind::copy, name))) return tensor();
  node n = make(op_kind::copy, std::move(name), {x.id()});
  n.type = type;
  return add_node(std::move(n));
}

tensor graph_builder::contiguous(tensor x, std::string name) {
  if (!check(x, "x", who(op_kind::copy, name))) return tensor();
  return copy(x, nodes_[static_cast<std::size_t>(x.id())].type, std::move(name));
}

void graph_builder::output(tensor x) {
  if (!check(x, "output", "output()")) return;
  for (node_id o : outputs_)
    if (o == x.id()) {
      fail(detail::node_error(errc::invalid_argument, nodes_[static_cast<std::size_t>(o)],
                              "is marked as an output twice"));
      return;
    }
  outputs_.push_back(x.id());
}

void graph_builder::pin(tensor x, int device) {
  if (!check(x, "tensor", "pin()")) return;
  node& n = nodes_[static_cast<std::size_t>(x.id())];
  if (device < 0) {
    fail(detail::node_error(errc::invalid_argument, n, "pin to negative device index " + std::to_string(device)));
    return;
  }
  n.pinned_device = device;
}

const node& graph_builder::info(tensor x) const {
  static const node none{};
  if (!x.valid() || x.owner_ != serial_ || static_cast<std::size_t>(x.id()) >= nodes_.size()) return none;
  return nodes_[static_cast<std::size_t>(x.id())];
}

expected<graph> graph_builder::build() && {
  if (!status_.ok()) return status_;
  // the builder's nodes are already in order; from_nodes re-checks everything
  // (and keeps ids, since its topological order is stable)
  return graph::from_nodes(std::move(nodes_), std::move(inputs_), std::move(outputs_));
}

}  // namespace ag
