#pragma once
/// \file npy.hpp
/// NumPy's .npy format (version 1.0): what actorgraph-generate --dump-logits
/// writes, so that a Python script can np.load() the logits. Pure functions.

#include <string>

#include "graph/error.hpp"
#include "graph/host_tensor.hpp"

namespace ag::models {

/// Writes `t` (f32 as '<f4', f16 as '<f2', i32 as '<i4'; bf16, which NumPy
/// lacks, as '<f4' after conversion) to `path`, C order, its dims as the shape.
/// Errors name the path.
error save_npy(const std::string& path, const host_tensor& t);

/// Reads a .npy file written by save_npy or NumPy ('<f4', '<f2', '<i4', C
/// order, rank 1..4) into a host tensor. Errors name the path and what is wrong.
expected<host_tensor> load_npy(const std::string& path);

}  // namespace ag::models
