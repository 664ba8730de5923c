#pragma once
// Matrix-vector products of a few rows against a shared weight matrix (host
// launcher): the shape of every projection of a decode step.
#include "gpu/cuda/kernel_args.hpp"
#include "graph/fusion.hpp"

namespace ag::gpu::cuda {

/// The most rows (batch entries x M) the GEMV kernel takes; more go to cuBLAS.
inline constexpr int gemv_max_rows = 8;

/// out [.., M, N] = op(a) [.., M, K] x op(b) [K, N] when the product is a
/// GEMV: at most gemv_max_rows rows of a in all, b without batch dims (a
/// weight), K contiguous in both a's rows and b's (op(b) = w^T with w [N, K]
/// row-major, the layout of every nn.Linear weight), 16-byte aligned rows,
/// f32 / f16 / bf16 with out of that dtype or f32, out contiguous (the caller
/// checks). Accumulates in f32. Returns false, launching nothing, when the
/// product does not fit; true when it launched (result: a launch error, if any).
bool try_launch_gemv(const launch_ctx& c, const kt& out, const kt& a, const kt& b, bool trans_a, bool trans_b,
                     error& result);

/// A projection group (graph/fusion.hpp, projection_fusion) as one GEMV
/// launch: x [rows, K] (rows <= gemv_max_rows, 16-byte aligned rows) against
/// `weights` (contiguous [N_m, K]). shared_input: out = x w_0^T and
/// extra_outs[m - 1] = x w_m^T (n_weights 2-3); gated: out = silu(x w_0^T) *
/// (x w_1^T); residual: out = x w_0^T + residual. Outputs and the residual
/// contiguous [rows, N]; one dtype (f32, f16, bf16), f32 accumulation, one
/// rounding at the end. With `norm` (shared_input, gated: the group's
/// rms_norm prologue), each row of x is normalised, x / sqrt(mean(x^2) +
/// eps), and scaled by `norm_weight` [K] when it is given, in f32, never
/// stored (the kernel applies 1 / rms to each output's sum). The planner
/// only groups what fits (is_gemv_projection); anything else is an
/// errc::internal error naming the op.
struct gemv_norm {
  const kt* weight = nullptr;  ///< [K], contiguous and 16-byte aligned, or null
  float eps = 0.0f;
};
error launch_gemv_projections(const launch_ctx& c, projection_kind kind, const kt& out, const kt* extra_outs,
                              int n_extra, const kt& x, const kt* weights, int n_weights, const kt* residual,
                              const gemv_norm* norm = nullptr);

}  // namespace ag::gpu::cuda
