// Fuzz target: graph validation from raw node lists (graph::from_nodes), what
// a graph read from a file or another process goes through. The bytes decode
// into up to 12 nodes with any op byte, dtype byte, rank, dims, strides,
// offsets, input ids (dangling, negative, cyclic), attrs and weight data
// (in memory, matching or not, or shapes only), plus the graph's input and output lists. A graph that
// validates is then planned over 1-3 simulated device specs (check_hazards
// must prove it) and, when small, evaluated by the reference evaluator on
// random inputs. Properties: no crash or sanitizer report; a refused list
// gets an error with a message; a valid graph's sizes are exact (each tensor
// at most max_tensor_bytes); plans pass check_hazards.
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "graph/graph.hpp"
#include "graph/plan.hpp"
#include "graph/reference.hpp"

namespace {

using ag::fuzz::byte_reader;

ag::shape read_shape(byte_reader& in) {
  const int rank = in.u8() % 7;  // 0..6: ranks 0, 5 and 6 are invalid
  std::vector<int64_t> d;
  for (int i = 0; i < rank; ++i) d.push_back(in.dim());
  return ag::shape::from_range(d.begin(), d.end());
}

ag::node read_node(byte_reader& in, int index, int count) {
  ag::node n;
  const uint8_t op = in.u8();
  n.op = static_cast<ag::op_kind>(op < 240 ? op % ag::op_kind_count : op);  // rarely an unknown op
  n.id = static_cast<ag::node_id>(in.u8() & 0x80 ? in.dim() : index);     // ids: any order, dupes, negative
  n.name = in.u8() & 0x40 ? in.str(6) : "n" + std::to_string(index);
  const uint8_t t = in.u8();
  n.type = static_cast<ag::dtype>(t < 250 ? t % 4 : t);
  n.dims = read_shape(in);
  for (int i = 0; i < ag::max_rank; ++i) n.stride[static_cast<std::size_t>(i)] = in.u8() & 1 ? in.dim() : 0;
  n.offset = in.u8() & 1 ? in.dim() : 0;
  const int ninputs = in.u8() % 5;
  for (int i = 0; i < ninputs; ++i) {
    const uint8_t r = in.u8();
    n.inputs.push_back(r < 200 ? static_cast<ag::node_id>(r % (count + 1)) - 1 : static_cast<ag::node_id>(in.dim()));
  }
  const uint8_t flags = in.u8();
  n.attrs.trans_a = flags & 1;
  n.attrs.trans_b = flags & 2;
  n.attrs.causal = flags & 4;
  n.attrs.rope = static_cast<ag::rope_mode>(flags & 8 ? in.u8() : 0);
  n.attrs.gelu = static_cast<ag::gelu_mode>(flags & 16 ? in.u8() : 0);
  if (flags & 32) {
    n.attrs.scale = in.raw<float>();
    n.attrs.eps = in.raw<float>();
    n.attrs.theta = in.raw<float>();
  }
  if (flags & 128) {  // a RoPE scaling (Llama 3, linear or no such kind), any values
    n.attrs.rope_scale.factor = in.raw<float>();
    n.attrs.rope_scale.low_freq_factor = in.raw<float>();
    n.attrs.rope_scale.high_freq_factor = in.raw<float>();
    n.attrs.rope_scale.original_context = in.raw<int32_t>();
    n.attrs.rope_scale.kind = static_cast<ag::rope_scaling_kind>(in.raw<uint8_t>() % 3);  // 2: no such kind
  }
  n.attrs.axis = static_cast<int8_t>(in.u8());
  n.attrs.axis2 = static_cast<int8_t>(in.u8());
  n.attrs.begin = in.dim();
  n.attrs.end = in.dim();
  for (auto& p : n.attrs.perm) p = static_cast<int8_t>(in.u8()) % 6;
  if (n.op == ag::op_kind::weight && (flags & 64) != 0 && (in.u8() & 1)) {
    // a shapes-only weight (planning without values): any shape, any dtype byte
    n.data = ag::make_shape_only_weight(n.type, read_shape(in));
  } else if (n.op == ag::op_kind::weight && (flags & 64) == 0) {
    // data: a real tensor of a small shape (maybe not the node's), or a
    // tensor whose dims and bytes disagree (any shape, no bytes)
    ag::shape s = read_shape(in);
    int64_t bytes = 0;
    auto t = ag::checked_bytes(s, 4, bytes) && bytes <= 4096 ? ag::host_tensor::create(n.type, s)
                                                             : ag::expected<ag::host_tensor>(ag::error());
    if (t) {
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, static_cast<float>(static_cast<int8_t>(in.u8())) / 16);
      n.data = ag::make_host_weight(std::move(*t));
    } else {
      ag::byte_buffer bytes(static_cast<std::size_t>(in.u8() & 1 ? in.u8() : 0));
      ag::host_tensor odd;
      odd.reset(n.type, s, std::move(bytes));  // n.type may be an unknown dtype byte
      n.data = ag::make_host_weight(std::move(odd));
    }
  }
  return n;
}

// Inputs of the right dtype and shape with small values (ids in range mostly).
std::vector<ag::host_tensor> make_inputs(const ag::graph& g, byte_reader& in) {
  std::vector<ag::host_tensor> v;
  for (ag::node_id id : g.inputs()) {
    const ag::node& n = g.at(id);
    ag::host_tensor t(n.type, n.dims);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int8_t b = static_cast<int8_t>(in.u8());
      t.set(i, n.type == ag::dtype::i32 ? static_cast<float>(b % 5) : static_cast<float>(b) / 32);
    }
    v.push_back(std::move(t));
  }
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  byte_reader in(data, size);
  const int count = 1 + in.u8() % 12;
  std::vector<ag::node> nodes;
  for (int i = 0; i < count; ++i) nodes.push_back(read_node(in, i, count));
  std::vector<ag::node_id> inputs, outputs;
  const int ni = in.u8() % 4, no = in.u8() % 4;
  for (int i = 0; i < ni; ++i) inputs.push_back(static_cast<ag::node_id>(in.u8() % (count + 1)) - 1);
  for (int i = 0; i < no; ++i) outputs.push_back(static_cast<ag::node_id>(in.u8() % (count + 1)) - 1);
  // the usual case: every input node listed, in order
  if (in.u8() & 1) {
    inputs.clear();
    for (const auto& n : nodes)
      if (n.op == ag::op_kind::input) inputs.push_back(n.id);
  }
  auto g = ag::graph::from_nodes(std::move(nodes), std::move(inputs), std::move(outputs));
  if (!g) {
    ag::fuzz::check_error(g.err(), "from_nodes");
    return 0;
  }
  int64_t total_elements = 0;
  for (const ag::node& n : g->nodes()) {
    int64_t bytes = 0;
    FUZZ_CHECK(ag::checked_bytes(n.dims, static_cast<int64_t>(ag::dtype_size(n.type)), bytes) &&
                   bytes <= ag::max_tensor_bytes,
               "node '%s' %s passed validation with an impossible size", n.name.c_str(), n.dims.to_string().c_str());
    if (!ag::checked_add(total_elements, n.dims.numel(), total_elements)) total_elements = INT64_MAX;
  }
  (void)g->to_dot();
  auto gp = std::make_shared<const ag::graph>(std::move(*g));
  std::vector<ag::device_spec> devs(1 + in.u8() % 3);
  for (std::size_t i = 0; i < devs.size(); ++i) {
    devs[i].name = "sim" + std::to_string(i);
    devs[i].ordinal = static_cast<int>(i);
  }
  ag::plan_options o;
  o.lanes_per_device = 1 + in.u8() % 3;
  o.policy = in.u8() & 1 ? ag::placement_policy::single : ag::placement_policy::automatic;
  auto p = ag::compile(gp, devs, o);
  if (!p) {
    ag::fuzz::check_error(p.err(), "compile");
  } else {
    const ag::error hz = ag::check_hazards(**p);
    FUZZ_CHECK(hz.ok(), "check_hazards: %s", hz.to_string().c_str());
    ag::fuzz::reached("plan");
  }
  // The oracle itself on small graphs (its cost is elements x ops).
  if (total_elements <= 4096) {
    auto ins = make_inputs(*gp, in);
    auto r = ag::evaluate_reference(*gp, ins);
    if (!r) ag::fuzz::check_error(r.err(), "evaluate_reference");
    else FUZZ_CHECK(r->size() == gp->outputs().size(), "reference returned %zu outputs", r->size());
    if (r) ag::fuzz::reached("reference");
  }
  return 0;
}
