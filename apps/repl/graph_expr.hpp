#pragma once
/// \file graph_expr.hpp
/// A one-line language for small custom graphs, parsed into an AST and then
/// built with ag::graph_builder:
///
///     x=input[8,64] w=weight[64,64] y=gelu(matmul(x,w)) out y
///
/// Statements: `name=expr` binds a tensor (the node is named `name`);
/// `out a, b` marks outputs (several `out`s append). Separators: spaces,
/// ';' or newlines. Leaves: `input[dims]` and `weight[dims]`, optionally
/// typed `input[8,64]:f16` / `input[8]:i32`. Ops (graph.hpp's builder):
///   matmul(a,b[,ta=1][,tb=1]) add(a,b) mul(a,b) scale(x,s) gelu(x) silu(x)
///   softmax(x[,causal=1][,scale=s]) rms_norm(x[,w][,eps=e])
///   layer_norm(x[,w[,b]][,eps=e]) get_rows(table,ids) rope(x,pos[,theta=t])
///   reshape(x,[dims]) transpose(x,a0,a1) permute(x,[p]) slice(x,axis,b,e)
///   concat(a,b,...,axis=k) copy(x,f16) contiguous(x)
/// Errors give the 1-based column of the command line ("col 23: expected ','
/// or ')' in the arguments of 'matmul', found 'w'"), or line and column for
/// a text of several lines (a file).
/// Pure functions; no I/O.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/error.hpp"
#include "graph/graph.hpp"

namespace ag::repl {

/// One expression: a name, a number, a dims list `[a,b]`, or a call
/// `f[dims]:type(args, key=value)` (each part optional after the name).
struct expr {
  enum class kind : uint8_t { name, number, list, call };
  kind k = kind::name;
  std::size_t pos = 0;                 ///< 0-based column of its first character
  std::string text;                    ///< name / function name / the number as written
  double number = 0;
  std::vector<int64_t> list;           ///< list, or a call's [dims]
  bool has_dims = false;               ///< call had [dims]
  std::string type;                    ///< call had :type
  std::vector<expr> args;              ///< positional arguments
  std::vector<std::pair<std::string, expr>> kwargs;
};

struct statement {
  std::size_t pos = 0;
  std::string target;                  ///< empty for `out`
  expr value;                          ///< unused for `out`
  std::vector<std::pair<std::string, std::size_t>> outs;  ///< `out` names and columns
};

/// Parses the whole text (several lines allowed). Syntax errors only;
/// `offset` is added to reported columns (where the text started in a line).
expected<std::vector<statement>> parse_graph_expr(const std::string& text, std::size_t offset = 0);

/// Limits checked while building, before anything is allocated.
struct graph_expr_limits {
  /// Bytes of all weights together (their values are drawn while building);
  /// a weight that would pass this is refused with the sizes.
  double max_weight_bytes = 1e300;
};

/// Builds the graph of a parsed program. Weights get deterministic random
/// values from `seed` (N(0, 1/fan_in)). Errors: an unknown name, a bad
/// argument count or type, a name bound twice, no `out`, and the builder's
/// own shape / dtype errors (which name the node); a leaf whose byte size
/// does not fit in 64 bits, or weights over `limits`.
/// `text` is what was parsed (for line/column numbers in errors).
expected<graph> build_graph_expr(const std::vector<statement>& prog, const std::string& text,
                                 uint64_t seed = 1, std::size_t offset = 0, const graph_expr_limits& limits = {});

/// Both steps.
expected<graph> graph_from_expr(const std::string& text, uint64_t seed = 1, std::size_t offset = 0,
                                const graph_expr_limits& limits = {});

/// Names of the ops the language knows (for completion and help).
const std::vector<std::string>& graph_expr_functions();

}  // namespace ag::repl
