#pragma once
/// \file validate_util.hpp
/// Internal to graph/ (not part of the public contract): how graph errors
/// name a node, so the builder, validation and reference evaluator all say
/// "matmul 'attn.qk': ..." the same way.

#include <string>

#include "graph/graph.hpp"

namespace ag::detail {

/// "matmul 'attn.qk'"
std::string label(const node& n);
/// error(c, "matmul 'attn.qk': " + what)
error node_error(errc c, const node& n, const std::string& what);

}  // namespace ag::detail
