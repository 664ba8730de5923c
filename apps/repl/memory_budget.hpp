#pragma once
/// \file memory_budget.hpp
/// What the REPL checks before it allocates anything, so that a graph or a
/// run too big for this host (or a shape whose byte size does not fit in 64
/// bits) is refused with the size it would need instead of hanging in an
/// allocation or a random fill:
///   - tensor sizes in checked 64-bit arithmetic;
///   - weights (drawn at `model` / `graph` time) against a quarter of the
///     host's memory;
///   - what loading a plan and running n jobs holds on the host (job inputs
///     and outputs, the reference check, the memory of devices that live in
///     host memory) against three quarters of it.
/// Pure functions apart from reading the host's memory size.

#include <cstdint>
#include <optional>
#include <string>

#include "graph/graph.hpp"

namespace ag::repl {

/// Bytes of a tensor of `dims` and `type`, or nullopt when that does not fit
/// in int64 (e.g. input[2147483648,2147483648]).
std::optional<int64_t> checked_bytes(const shape& dims, dtype type);
/// The same in floating point, for messages about sizes that overflow.
double approx_bytes(const shape& dims, dtype type);

/// "2147483648 x 2147483648 f32 = 16.00 EiB, more than a 64-bit byte count holds".
std::string overflow_text(const shape& dims, dtype type);

/// Physical memory of this host in bytes (0 when unknown).
double host_memory_bytes();
/// Weights the REPL builds: up to a quarter of the host's memory (drawing
/// them takes time, and devices in host memory hold a second copy).
double host_weight_limit();
/// What a plan and a run may hold on the host at once: three quarters of it.
double host_run_limit();

/// An error naming the first node of `g` whose byte size overflows int64
/// (errc::invalid_shape), or ok.
error check_node_sizes(const graph& g);

}  // namespace ag::repl
