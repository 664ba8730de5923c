#pragma once
/// \file collective.hpp
/// Host implementation of a collective part (gpu/device.hpp's
/// collective_launch), used by the cpu device and by the sim device when it
/// computes values: *one-shot*, the member reads every member's operand
/// directly (device memory of host devices is host memory, mapped in every
/// member) and reduces in double precision, rounding once to the dtype: the
/// reference evaluator's arithmetic, so results equal it bit for bit. The
/// algorithm the plan picked (ring or one-shot) changes the sim's modelled
/// time, not the values.
///
/// Threading: pure functions of their arguments (any thread). The caller
/// guarantees that every operand's producer completed (the part's waits)
/// and that no member overwrites its operand before every part read it (the
/// memory plan keeps operands busy until then).

#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cpu {

/// Checks a collective part without touching memory: the op is a
/// collective, `rank` and members agree with the inputs, every buffer is
/// non-null, contiguous, of the node's dtype, with the dims the op needs.
/// Errors name the node (invalid_argument / invalid_shape / dtype_mismatch).
/// Element `i` of a buffer of dtype `t`, widened to double (exact for every dtype).
double load_element(const std::byte* p, dtype t, int64_t i);
/// Writes `x` as element `i` of a buffer of dtype `t`: rounded once to the
/// dtype; i32 saturates, NaN -> 0 (the reference evaluator's rule).
void store_element(std::byte* p, dtype t, int64_t i, double x);

error check_collective(const collective_launch& c);

/// Runs the part (see the file comment). f32, f16, bf16 and i32.
error run_collective(const collective_launch& c);

}  // namespace ag::gpu::cpu
