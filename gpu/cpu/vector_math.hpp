#pragma once
/// \file vector_math.hpp
/// Loops of the cpu kernels that the compiler cannot vectorise as written
/// in plain C++ (a float compare in a loop is control flow under IEEE
/// rules), with AVX2 + FMA where the machine has them (picked at run time)
/// and a portable loop elsewhere.
///
/// Threading: pure functions of their arguments.

#include <cstdint>

namespace ag::gpu::cpu {

/// row[j] = e^(row[j] * s - shift) for j in [0, n), in place; returns their
/// sum in double. For a softmax: `shift` is the row's largest row[j] * s, so
/// every exponent is <= 0 (or NaN, which stays NaN). With AVX2 + FMA, e^x is
/// Cephes' polynomial expf (within 2 ulp; exponents below -87.3 give 0, where
/// e^x is under 1.2e-38), summed in eight running sums combined in one fixed
/// order; elsewhere std::exp summed in order. The same bits for the same
/// arguments on one machine.
double exp_shifted_sum(float* row, int64_t n, float s, float shift);

}  // namespace ag::gpu::cpu
