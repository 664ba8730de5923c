#pragma once
/// \file kernels.hpp
/// Host kernels for every op_kind, used by the cpu device and by the sim
/// device when it computes values. Inputs may have any element strides
/// (views: permuted, transposed, sliced, broadcast with stride 0); storage is
/// f32 / f16 / bf16 with f32 arithmetic, i32 for ids and positions. The
/// semantics are graph/graph.hpp's, and tests/gpu/kernels_test.cpp checks
/// them against graph/reference.hpp.
///
/// Threading: pure functions of their arguments; safe to call from any number
/// of threads at once (each call allocates its own scratch; a call given
/// several threads shares the process's helper team with the others).

#include <cstdint>

#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cpu {

/// Checks what run_op needs without touching memory: op arity, non-null
/// buffers, output dims/dtype equal to the node's, input ranks; for a fused
/// attention record (op_launch::fusion::attention, without a cache
/// prologue: the only fusion this backend runs) its operands' shapes and
/// dtypes. Errors name the node (errc::invalid_argument / invalid_shape /
/// dtype_mismatch / unsupported_op).
error check_op(const op_launch& l);

/// Runs one op on host memory, or a fused attention chain (prefill-sized:
/// per block of query rows, only the keys it can see, the scores kept in
/// the thread's cache). View ops and leaves (input, weight) are no-ops
/// that succeed. Errors (bad arguments, an id out of range in get_rows) name
/// the node and return before or without writing a partial result where possible.
/// `threads`: how many threads the op may use, the calling one included
/// (gpu/cpu/thread_team.hpp): a matmul of a few rows splits its columns, a
/// matmul over batches at least as many as the threads its batches, a
/// product in f32 through BLAS its blocks (gemm_f32), a product of two bf16
/// matrices on the CPU's bf16 units its blocks of columns
/// (gpu/cpu/bf16_gemm.hpp), a bf16 or f16 operand's
/// conversion to f32 its lines, and the ops over whole rows (softmax,
/// norms, rope, the elementwise ones) their rows, among them. The result is
/// the same bits for any count (each output element is one thread's work,
/// in one order). Scratch memory stays with the thread that used it, for
/// its next op (at most 256 MiB a thread).
/// `parts`: how many parts a large f32 product through BLAS is cut into
/// (gemm_f32; 0: machine_parts()). A device passes its fixed share of the
/// machine, so that the bits depend on neither `threads` nor the load.
error run_op(const op_launch& l, int threads = 1, int parts = 0);

/// C = alpha * op(A) * op(B) + beta * C, row-major f32 with leading
/// dimensions (cblas_sgemm's contract). Uses BLAS when the build has it: C
/// cut into `parts` (0: machine_parts(), gpu/cpu/thread_team.hpp) parts of columns (or of rows, where it is
/// narrow; one part when the product is small), each one BLAS call, spread
/// over up to `threads` threads of the helper team (BLAS itself runs
/// single-threaded, as cpu devices set it). The cut does not depend on
/// `threads`, so neither do the bits. One row goes to BLAS's sgemv.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, int threads = 1, int parts = 0);
/// The same without BLAS (a cache-blocked loop); always compiled, so it is tested.
void gemm_f32_fallback(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc);

/// True when gemm_f32 calls BLAS in this build.
bool have_blas() noexcept;

}  // namespace ag::gpu::cpu
