#pragma once
/// \file graph.hpp
/// The tensor graph: nodes (one tensor each), the builder that makes them, and
/// validation. Pure C++: no CAF, no CUDA, no threads. A `graph` is valid by
/// construction (graph_builder::build and graph::from_nodes validate) and
/// immutable afterwards, so plans and jobs share it freely across threads.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/host_tensor.hpp"
#include "graph/rope_frequencies.hpp"
#include "graph/shape.hpp"
#include "graph/weight_source.hpp"

namespace ag {

using node_id = int32_t;
constexpr node_id no_node = -1;

/// Every op of the graph. Leaves are `input` (fed per job) and `weight`
/// (constant data owned by the graph, uploaded once per device).
enum class op_kind : uint8_t {
  input, weight,
  // compute
  matmul,      ///< [.., M, K] x [.., K, N] -> [.., M, N]; trans_a / trans_b; batch dims broadcast
  add, mul,    ///< elementwise, numpy broadcasting of the second operand (right-aligned)
  scale,       ///< x * attrs.scale
  rms_norm,    ///< over the last dim; optional weight input (2nd)
  layer_norm,  ///< over the last dim; optional weight (2nd) and bias (3rd) inputs (positional: a bias needs a weight)
  softmax,     ///< over the last dim of x * attrs.scale; attrs.causal masks j > i + (Sk - Sq)
  gelu,        ///< attrs.gelu: tanh approximation (GPT-2) or erf (exact)
  silu,        ///< x * sigmoid(x)
  rope,        ///< x [.., S, H, D] rotated by positions (i32 [S]); attrs.rope pairing, attrs.theta
  get_rows,    ///< table [V, D], ids i32 [...] -> [..., D]; with attrs.end > 0 the table is rows
               ///< [attrs.begin, attrs.begin + V) of a vocabulary of attrs.end rows (a tensor-parallel
               ///< shard): ids outside [0, end) are an error, ids outside the shard give zero rows
  // views: no computation, alias their source's storage. reshape takes the
  // node's dims; view takes the node's dims, stride and offset as given
  // (absolute within the storage buffer, not relative to the source)
  reshape, view, permute, transpose, slice,
  // data movement
  concat,      ///< along attrs.axis
  copy,        ///< contiguous copy, with cast when the node's dtype differs from its input's
  // collectives (tensor parallelism). One node per member of a group of
  // devices: node k of a group has as inputs the group members' operands in
  // rank order (the same list on every member) and attrs.group / attrs.rank
  // name the group and k. Each computes its own result from all operands; the
  // planner makes each node a `collective` step that reads the peers'
  // operands where they live (no peer copies).
  all_reduce,      ///< sum of the inputs (same dtype and dims); the result has their dims
  all_gather,      ///< concatenation of the inputs in rank order along the merged dims
                   ///< [attrs.axis, attrs.axis2] (row-major merge); the node's dims are given
                   ///< (like reshape): outside the merged dims they equal the inputs', inside
                   ///< their product is the sum of the inputs' products
  reduce_scatter,  ///< sum of the inputs (same dims), sliced to [attrs.begin, attrs.end) along attrs.axis
  // state (a KV cache): a tensor that outlives the job
  store_rows,  ///< persistent tensor: rows (input 0, a float type or i32) stored at positions (input 1, i32 [rows.dims[axis]])
               ///< along attrs.axis of a tensor of rows' dims with attrs.end rows there. Row i goes
               ///< to index positions[i]; a position outside [0, attrs.end) stores nothing. Every
               ///< other row keeps what the previous job of the same state slot stored there (zero
               ///< in a fresh slot): the node lives in its device's state region, one copy per
               ///< state slot (plan_options::state_slots; submit_options::state_slot picks one).
  argmax,      ///< i32 index of the first maximum along the last dim (NaNs never win; 0 when a row is all
               ///< NaN): x [.., N] -> [.., 1]. A decode step's greedy token, picked on the device.
  range_mask,  ///< an additive attention mask [T, C] of the node's (float) dtype from key_positions (i32 [C]: the
               ///< position each key row holds, negative for none) and query_ranges (i32 [T, 2]: the first and
               ///< last position each query sees): 0 where first <= key_positions[c] <= last, else
               ///< attention_masked_score. A prompt chunk's mask over a KV cache built on the device from a few
               ///< KiB of inputs, not copied there (128 MiB for 1024 tokens over 65,536 rows).
};
constexpr int op_kind_count = static_cast<int>(op_kind::range_mask) + 1;
const char* to_string(op_kind k) noexcept;
bool parse_op_kind(const std::string& s, op_kind& out) noexcept;
/// reshape, view, permute, transpose, slice.
constexpr bool is_view_op(op_kind k) noexcept {
  return k == op_kind::reshape || k == op_kind::view || k == op_kind::permute ||
         k == op_kind::transpose || k == op_kind::slice;
}
constexpr bool is_leaf_op(op_kind k) noexcept { return k == op_kind::input || k == op_kind::weight; }
/// Ops that can fail on the values they read, which only the kernel sees
/// (get_rows: an id outside [0, V)); every other op's failures are known when
/// it is launched. A device reports such a failure through the notify of the
/// stream it ran on (op_failed), so the runtime asks for one after a step
/// that holds one of these (plan.hpp, may_fail_on_values).
constexpr bool may_fail_on_values(op_kind k) noexcept { return k == op_kind::get_rows; }
/// all_reduce, all_gather, reduce_scatter.
/// store_rows: a node whose value persists across the jobs of one state slot.
constexpr bool is_state_op(op_kind k) noexcept { return k == op_kind::store_rows; }
constexpr bool is_collective_op(op_kind k) noexcept {
  return k == op_kind::all_reduce || k == op_kind::all_gather || k == op_kind::reduce_scatter;
}

/// RoPE pairing. `neox` rotates (i, i + D/2) pairs (HF transformers' LLaMA,
/// GPT-NeoX "rotate_half"); `interleaved` rotates (2i, 2i + 1) pairs (Meta's
/// original LLaMA, GPT-J).
enum class rope_mode : uint8_t { neox = 0, interleaved = 1 };
/// GELU variant: `tanh` is the approximation GPT-2 uses ("gelu_new"), `erf` the exact one.
enum class gelu_mode : uint8_t { tanh = 0, erf = 1 };

/// Per-op parameters; each op reads only the fields it documents.
struct op_attrs {
  float scale = 1.0f;          ///< scale; softmax pre-scale
  float eps = 1e-5f;           ///< rms_norm, layer_norm
  float theta = 10000.0f;      ///< rope base
  rope_scaling rope_scale{};   ///< rope: Llama 3's scaling of the frequencies (off by default)
  rope_mode rope = rope_mode::neox;
  gelu_mode gelu = gelu_mode::tanh;
  bool trans_a = false;        ///< matmul
  bool trans_b = false;        ///< matmul
  bool causal = false;         ///< softmax
  /// range_mask: each row's range holds keys that no other row's does (a
  /// batched decode step's rows, each a sequence in a lane of its own;
  /// transformer_config::rows_apart). A promise attention kernels may run
  /// the rows apart on: the values are the same either way.
  bool rows_apart = false;
  int axis = 0;                ///< concat, slice, transpose (first axis), all_gather / reduce_scatter, store_rows
  int axis2 = 0;               ///< transpose (second axis), all_gather (last merged axis)
  int64_t begin = 0, end = 0;  ///< slice / reduce_scatter [begin, end) along axis; get_rows shard; store_rows: end = rows kept
  int group = -1;              ///< collectives: tensor-parallel group (pipeline stage) index
  int rank = -1;               ///< collectives: this node's index among its inputs
  std::array<int, max_rank> perm{0, 1, 2, 3};  ///< permute: output dim i = input dim perm[i]

  bool operator==(const op_attrs&) const = default;
};

/// One node = one op = one tensor.
struct node {
  node_id id = no_node;
  op_kind op = op_kind::input;
  std::string name;                 ///< unique in its graph; errors name it
  dtype type = dtype::f32;
  shape dims;
  strides stride{};                 ///< element strides into `storage`'s buffer
  int64_t offset = 0;               ///< element offset into `storage`'s buffer
  node_id storage = no_node;        ///< node whose buffer holds the data (== id unless a view)
  std::vector<node_id> inputs;
  op_attrs attrs;
  int layer = -1;                   ///< pipeline unit tag (model builder sets it); -1 = none
  int pinned_device = -1;           ///< explicit placement; -1 = planner decides
  /// Weights only: where the values come from (in memory, a mapped checkpoint,
  /// or shapes only). The node's dims and dtype are the source's.
  weight_source_ptr data;

  bool is_view() const noexcept { return storage != id; }
  /// Bytes of the node's own buffer (0 for views).
  int64_t own_bytes() const noexcept { return is_view() ? 0 : dims.numel() * static_cast<int64_t>(dtype_size(type)); }
  bool contiguous() const noexcept { return is_contiguous(dims, stride); }
};

/// A validated, immutable DAG of nodes. Node ids are indices into nodes(),
/// and every node's inputs have smaller ids (topological order).
class graph {
 public:
  graph() = default;

  /// Validates a raw node list (e.g. parsed from a file) and builds a graph.
  /// Ids may be in any order on entry; on success nodes are renumbered in a
  /// topological order with names unchanged. Errors name the node and what is
  /// wrong: cycle, unknown (dangling) input id, missing inputs, shape or dtype
  /// mismatch, duplicate name, unknown output.
  /// `inputs`/`outputs` list node ids in the order jobs feed / receive them.
  /// `inputs` must name every input node exactly once (missing_input names an
  /// unlisted one); `outputs` must be non-empty and without repeats. Names
  /// must be non-empty. Node ids must be >= 0; the ids in the result are
  /// the positions in the topological order (stable: among nodes whose inputs
  /// are all placed, the one listed first comes first, so an already ordered
  /// list keeps its ids). Every node is re-inferred (infer_node), so dims,
  /// strides and dtypes of computed nodes need not be filled in; only
  /// input (type, dims), weight (data), view (dims, stride, offset),
  /// reshape and all_gather (dims) and copy (type) take them from the node.
  static expected<graph> from_nodes(std::vector<node> nodes, std::vector<node_id> inputs,
                                    std::vector<node_id> outputs);

  const std::vector<node>& nodes() const noexcept { return nodes_; }
  const node& at(node_id id) const { return nodes_.at(static_cast<std::size_t>(id)); }
  std::size_t size() const noexcept { return nodes_.size(); }
  /// Job inputs, in the order a job passes its tensors.
  const std::vector<node_id>& inputs() const noexcept { return inputs_; }
  /// Job outputs, in the order a job returns its tensors.
  const std::vector<node_id>& outputs() const noexcept { return outputs_; }
  /// Nodes that read node `id` (computed once at construction).
  const std::vector<node_id>& consumers(node_id id) const { return consumers_.at(static_cast<std::size_t>(id)); }
  /// Finds a node by name; no_node if absent.
  node_id find(const std::string& name) const;

  /// Graphviz DOT text: one box per node (name, op, dtype, shape), edges input -> consumer.
  std::string to_dot() const;
  /// Total bytes of weight data.
  int64_t weight_bytes() const;

 private:
  friend class graph_builder;
  std::vector<node> nodes_;
  std::vector<node_id> inputs_, outputs_;
  std::vector<std::vector<node_id>> consumers_;
  std::unordered_map<std::string, node_id> by_name_;
};

/// Where pruning starts (the planner's and the tensor-parallel rewrite's):
/// the outputs, then every state store, since a later job of the slot reads
/// what a store keeps whether or not this job's outputs need it.
std::vector<node_id> pruning_roots(const graph& g);

/// Infers dims/stride/offset/storage of node `n` from its inputs (already
/// valid, in `nodes`) and checks op arity, shapes and dtypes. Used by the
/// builder and by graph::from_nodes. Errors name the node.
/// Input ids index `nodes` (nodes[i].id == i) and must be < n.id. Sets
/// n.type for every op except input and copy (whose type is the caller's);
/// normalises negative axes in n.attrs (axis, axis2, perm, begin/end) so a
/// second call gives the same node. Rank must be 1..4, every dim >= 1.
error infer_node(const std::vector<node>& nodes, node& n);

/// Handle to a node under construction. Cheap to copy. Remembers which
/// builder made it, so passing it to another builder is reported as an error.
class tensor {
 public:
  tensor() = default;
  node_id id() const noexcept { return id_; }
  bool valid() const noexcept { return id_ != no_node; }

 private:
  friend class graph_builder;
  explicit tensor(node_id id) : id_(id) {}
  tensor(node_id id, uint64_t owner) : id_(id), owner_(owner) {}
  node_id id_ = no_node;
  uint64_t owner_ = 0;  // serial of the graph_builder that made it
};

/// Builds a graph op by op:
///
///     ag::graph_builder b;
///     auto x = b.input("x", ag::dtype::f32, {8, 512});
///     auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {512, 512}, 1, 0.02f));
///     auto y = b.gelu(b.matmul(x, w));
///     b.output(y);
///     ag::expected<ag::graph> g = std::move(b).build();
///
/// Methods never throw and never abort: the first error (bad shape, wrong
/// dtype, a tensor from another builder...) is recorded with the node's name,
/// later calls return invalid tensors, and build() returns that error.
/// Names default to "<op>_<id>"; explicit names must be unique.
/// Not thread-safe: one builder per thread.
class graph_builder {
 public:
  graph_builder() = default;

  tensor input(std::string name, dtype type, shape dims);
  tensor weight(std::string name, host_tensor data);
  /// A weight whose values come from `source` (a checkpoint, or shapes only).
  tensor weight(std::string name, weight_source_ptr source);

  tensor matmul(tensor a, tensor b, bool trans_a = false, bool trans_b = false, std::string name = {});
  tensor add(tensor a, tensor b, std::string name = {});
  tensor mul(tensor a, tensor b, std::string name = {});
  tensor scale(tensor x, float s, std::string name = {});
  /// `weight` may be an invalid tensor() for no weight.
  tensor rms_norm(tensor x, tensor weight, float eps = 1e-6f, std::string name = {});
  /// `weight` / `bias` may be invalid tensor() for none. Inputs are positional
  /// (x, weight, bias), so a bias without a weight adds a weight node
  /// "<name>.ones" holding ones (of x's dtype) as the 2nd input.
  tensor layer_norm(tensor x, tensor weight, tensor bias, float eps = 1e-5f, std::string name = {});
  tensor softmax(tensor x, bool causal = false, float scale = 1.0f, std::string name = {});
  tensor gelu(tensor x, gelu_mode mode = gelu_mode::tanh, std::string name = {});
  tensor silu(tensor x, std::string name = {});
  /// i32 [.., 1]: the index of the first maximum of each row of x [.., N] (op_kind::argmax).
  tensor argmax(tensor x, std::string name = {});
  /// The additive mask [T, C] of dtype `type` (a float type) that
  /// op_kind::range_mask defines: key_positions i32 [C], query_ranges i32 [T, 2].
  /// rows_apart: op_attrs::rows_apart.
  tensor range_mask(tensor key_positions, tensor query_ranges, dtype type, std::string name = {},
                    bool rows_apart = false);
  /// x [.., S, H, D] (D even), positions i32 [S]. Pair k turns by
  /// position * f_k, f_k = theta^(-2k/D), scaled as `scaling` says (off by
  /// default; graph/rope_frequencies.hpp).
  tensor rope(tensor x, tensor positions, float theta = 10000.0f, rope_mode mode = rope_mode::neox,
              std::string name = {}, rope_scaling scaling = {});
  tensor get_rows(tensor table, tensor ids, std::string name = {});
  /// State that outlives the job (op_kind::store_rows): a tensor of rows'
  /// dims but `capacity` rows along `axis`, holding what earlier jobs of the
  /// same state slot stored, with rows[.., i, ..] stored at index
  /// positions[i] (positions i32 [rows.dims[axis]]). A KV cache is one per
  /// layer for keys and one for values, read by attention in place.
  tensor store_rows(tensor rows, tensor positions, int axis, int64_t capacity, std::string name = {});

  /// Views (free): reshape needs a contiguous source.
  tensor reshape(tensor x, shape dims, std::string name = {});
  /// Arbitrary view: `st` are element strides into x's storage buffer and
  /// `offset` counts elements from x's first element (x.offset + offset);
  /// every element reached must lie inside the storage buffer. Strides >= 0.
  tensor view(tensor x, shape dims, strides st, int64_t offset, std::string name = {});
  tensor permute(tensor x, std::array<int, max_rank> perm, std::string name = {});
  tensor transpose(tensor x, int axis0, int axis1, std::string name = {});
  tensor slice(tensor x, int axis, int64_t begin, int64_t end, std::string name = {});

  tensor concat(const std::vector<tensor>& xs, int axis, std::string name = {});
  /// Contiguous copy of x, cast to `type`.
  tensor copy(tensor x, dtype type, std::string name = {});
  /// Contiguous copy of x in its own dtype (no-op view-to-buffer materialisation).
  tensor contiguous(tensor x, std::string name = {});

  /// Marks x as a job output (in call order). Marking one twice is an error;
  /// build() needs at least one output.
  void output(tensor x);
  /// Tags nodes created from now on with a pipeline unit (layer index); -1 clears.
  void set_layer(int layer) noexcept { layer_ = layer; }
  /// Pins x to device index `device` of the plan's device list.
  void pin(tensor x, int device);

  /// Shape / dtype of a tensor under construction (default values if invalid).
  const node& info(tensor x) const;
  /// The first error so far (ok if none).
  const error& status() const noexcept { return status_; }

  /// Validates and returns the graph, or the first error.
  expected<graph> build() &&;

 private:
  tensor add_node(node n);
  bool check(tensor x, const char* what, const std::string& name);

  tensor fail(error e);
  std::string default_name(op_kind k) const;

  std::vector<node> nodes_;
  std::vector<node_id> inputs_, outputs_;
  std::unordered_map<std::string, node_id> by_name_;
  error status_;
  int layer_ = -1;
  uint64_t serial_ = next_serial();  // identifies this builder's tensors
  static uint64_t next_serial() noexcept;
};

}  // namespace ag
