#pragma once
/// \file bf16_gemm.hpp
/// Products of bf16 matrices on the CPU's bf16 units (AMX tiles, AVX-512
/// BF16) through oneDNN's matmul (Debian package libdnnl-dev), for the cpu
/// backend's many-row matmuls of a bf16 model (a prefill). Without them the
/// backend converts both operands to f32 for BLAS's sgemm, which on a
/// machine with AMX runs the same product about seven times slower
/// (docs/BENCHMARKS.md, session 59).
///
/// Optional at build time (ACTORGRAPH_HAVE_DNNL) and at run time (the CPU
/// must have AVX-512 BF16 or AMX): bf16_gemm_available() says which.
///
/// Threading: any thread may call bf16_gemm, several at once. Each thread
/// keeps its own oneDNN engine, stream and primitives, and runs them on one
/// OpenMP thread: the parallelism is the caller's `threads`, spread by the
/// cpu backend's helper team (thread_team.hpp), so oneDNN starts no threads.

#include <cstdint>

namespace ag::gpu::cpu {

/// True when bf16_gemm can run here: built with oneDNN, on a CPU with bf16
/// products (AVX-512 BF16 or AMX), and not switched off by the environment
/// (AG_CPU_BF16_GEMM=0, for comparisons).
bool bf16_gemm_available() noexcept;

/// Columns of C a call computes as one oneDNN product: fixed, so that the
/// blocks, and with them every element's sum, do not depend on `threads`.
/// Wider blocks measured slower (a LLaMA prefill's 512 x 2048 x 8192 in two
/// blocks of 4096: 1300-1376 -> 903-906 tokens/s; 512 columns no faster:
/// docs/BENCHMARKS.md, session 60).
inline constexpr int64_t bf16_gemm_block = 256;

/// C = A B: A bf16 m x k with element strides (ars, acs), B bf16 k x n with
/// (brs, bcs), C m x n with row stride ldc (element stride 1), f32, or bf16
/// when `c_bf16` (each f32 sum rounded to nearest even, as float_to_bf16
/// does). Products of bf16 are exact in f32 and summed in f32 (denormal
/// inputs may count as zero, as the hardware does). C's columns go in blocks of bf16_gemm_block
/// over up to `threads` threads; any count gives the same bits. Returns
/// false, possibly having written part of C, when it cannot run here or
/// oneDNN has no fast kernel for these strides (the caller then computes C
/// another way).
bool bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ars, int64_t acs, const uint16_t* b,
               int64_t brs, int64_t bcs, void* c, bool c_bf16, int64_t ldc, int threads);

}  // namespace ag::gpu::cpu
