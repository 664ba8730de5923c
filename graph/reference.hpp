#pragma once
/// \file reference.hpp
/// The CPU reference evaluator: the oracle every backend is tested against.
/// Straightforward and accurate rather than fast: it accumulates in double
/// (matmul dot products, norm statistics, softmax sums) and rounds each
/// node's result to the node's dtype, as a device storing that dtype would.
/// Pure function of its arguments; safe to call from any thread.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"

namespace ag {

/// Checks job inputs against g.inputs(): count, dtype, dims. The error names
/// the input (index and node name) and what was expected vs given:
/// missing_input (too few), invalid_argument (too many), dtype_mismatch,
/// invalid_shape.
error check_inputs(const graph& g, const std::vector<host_tensor>& inputs);

/// Evaluates g on the CPU. Returns the outputs in g.outputs() order, each a
/// contiguous tensor of its node's dtype and dims. Fails with check_inputs'
/// errors, or errc::invalid_argument naming the node and the id when get_rows
/// meets an id outside [0, V).
///
/// Definitions: gelu tanh = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))),
/// gelu erf = 0.5x(1 + erf(x / sqrt 2)); silu = x / (1 + exp(-x));
/// rms_norm = x / sqrt(mean(x^2) + eps) * w; layer_norm = (x - mean) /
/// sqrt(var + eps) * w + b with the biased variance; softmax over the last
/// dim of x * scale, minus the row max, with causal masking of j > i + Sk - Sq
/// (masked probabilities are exactly 0); rope angle = pos * theta^(-2i/D) for
/// pair i (neox pairs (i, i + D/2), interleaved pairs (2i, 2i + 1)), rotating
/// (a, b) to (a cos - b sin, a sin + b cos); copy to i32 truncates toward zero
/// (saturating; nan -> 0); get_rows of a table shard (attrs.end > 0) gives
/// zero rows for ids outside the shard; all_reduce sums its operands in
/// double and rounds once; reduce_scatter is that sum's [begin, end) along
/// axis; all_gather concatenates its operands in order along the merged axes.
expected<std::vector<host_tensor>> evaluate_reference(const graph& g, const std::vector<host_tensor>& inputs);

/// Same, for a caller that may want to give up on a long evaluation (the
/// REPL's checker thread when the user presses Ctrl-C): `stop` is called on
/// the calling thread between nodes and between rows of a matmul; once it
/// returns true (it must keep returning true) the evaluation fails soon with
/// errc::cancelled.
expected<std::vector<host_tensor>> evaluate_reference(const graph& g, const std::vector<host_tensor>& inputs,
                                                      const std::function<bool()>& stop);

/// The values of a graph's store_rows nodes (op_kind::store_rows) that one
/// state slot keeps between jobs, by node name: what a device's state region
/// holds for that slot. A node the map lacks (or holds with other dims or
/// dtype) starts as zeros, like a fresh slot.
using reference_state = std::map<std::string, host_tensor>;

/// Same, evaluating store_rows nodes over `state` (read, then updated with
/// each node's new value): a sequence of calls with one state gives what a
/// sequence of jobs on one state slot gives. Without a state, each
/// store_rows starts from zeros.
expected<std::vector<host_tensor>> evaluate_reference(const graph& g, const std::vector<host_tensor>& inputs,
                                                      reference_state& state);

/// Same, but returns every node's value (index = node id; views materialised
/// as contiguous tensors).
expected<std::vector<host_tensor>> evaluate_reference_all(const graph& g,
                                                          const std::vector<host_tensor>& inputs);

}  // namespace ag
