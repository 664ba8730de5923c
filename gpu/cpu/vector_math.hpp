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

/// row[j] = GELU's tanh approximation of row[j], in place, computed as
/// x / (1 + e^(-2 sqrt(2/pi)(x + 0.044715x^3))): the same function as
/// 0.5x(1 + tanh(...)) without its cancellation at negative x (within 4 ulp
/// of the exact value where that is a normal float; 0 where it is below
/// about 1e-37 x). e^x as in exp_shifted_sum (AVX2 + FMA) or std::exp.
void gelu_tanh_in_place(float* row, int64_t n);

/// row[j] = SiLU(row[j]) = x / (1 + e^-x), in place; e^x as above.
void silu_in_place(float* row, int64_t n);

/// The largest row[j] * s, NaNs passed over; -inf for an empty row or one
/// of NaNs (a softmax's shift). Exact: the same value on any path.
float max_scaled(const float* row, int64_t n, float s);

/// The index of the first largest row[j], NaNs never winning; -1 when there
/// is none (an empty row, or all NaN). Exact: the same index on any path.
int64_t first_argmax(const float* row, int64_t n);

/// The same functions one element at a time, with std::exp: what a machine
/// without AVX2 + FMA runs (exposed so that tests check them anywhere).
namespace portable {
double exp_shifted_sum(float* row, int64_t n, float s, float shift);
void gelu_tanh_in_place(float* row, int64_t n);
void silu_in_place(float* row, int64_t n);
float max_scaled(const float* row, int64_t n, float s);
int64_t first_argmax(const float* row, int64_t n);
}  // namespace portable

}  // namespace ag::gpu::cpu
