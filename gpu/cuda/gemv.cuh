#pragma once
// Matrix-vector products of a few rows against a shared weight matrix (host
// launcher): the shape of every projection of a decode step.
#include "gpu/cuda/kernel_args.hpp"
#include "graph/fusion.hpp"

namespace ag::gpu::cuda {

/// The most rows (batch entries x M) the GEMV kernel takes; more go to cuBLAS.
inline constexpr int gemv_max_rows = 8;
/// The most rows its tensor-core form takes (launch_ctx::
/// gemv_tensor_core_rows, f16 / bf16): two tiles of 8 x rows. A plain
/// product of 9 to 16 rows takes it when it is on, else cuBLAS; projection
/// groups keep gemv_max_rows (the planner groups no more).
inline constexpr int gemv_mma_max_rows = 16;

/// out [.., M, N] = op(a) [.., M, K] x op(b) [K, N] when the product is a
/// GEMV: at most gemv_max_rows rows of a in all (gemv_mma_max_rows on the
/// tensor cores), b without batch dims (a
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
/// With `rope` (shared_input: the group's ropes, projection_fusion::ropes),
/// output m is rotated as it is written when bit m of `roped` is set: the
/// row of x r at position positions[r % seq] (i32), each head of `head_dim`
/// (even; the output's N a whole number of heads) by pairs (k, k + D/2)
/// when `neox`, else (2k, 2k + 1), at the angle position * f_k (theta and
/// `scaling`: graph/rope_frequencies.hpp);
/// the products are rounded to the dtype first, as a rope reading them
/// would see them. Every N must be even, D at most 2 x gemv_rope_max_pairs
/// (graph/fusion.hpp's fused_gemv_rope_max_head).
inline constexpr int gemv_rope_max_pairs = static_cast<int>(fused_gemv_rope_max_head / 2);
struct gemv_rope {
  const kt* positions = nullptr;
  unsigned roped = 0;
  bool neox = true;
  int64_t head_dim = 0;
  int64_t seq = 1;
  float theta = 0.0f;
  rope_scaling scaling{};
};
error launch_gemv_projections(const launch_ctx& c, projection_kind kind, const kt& out, const kt* extra_outs,
                              int n_extra, const kt& x, const kt* weights, int n_weights, const kt* residual,
                              const gemv_norm* norm = nullptr, const gemv_rope* rope = nullptr);

}  // namespace ag::gpu::cuda
