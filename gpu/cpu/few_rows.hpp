#pragma once
/// \file few_rows.hpp
/// Products of a few rows against a matrix read once, in its own dtype: the
/// CPU backend's matmuls of a decode step (one token: one row against each
/// weight). BLAS's sgemm packs the whole weight before multiplying, which
/// for one row costs more than the product (GPT-2 124M in f32: 91.6 ms a
/// token on one core, 69% of it packing), and a bf16 or f16 weight had to
/// be converted to f32 first, column by column when it is used transposed
/// (a LLaMA weight [out, in]): 3 s a token for four LLaMA-1B layers. Here
/// each element of B is loaded once, converted in registers-sized chunks,
/// and multiplied into every row of A.
///
/// Pure functions on caller-owned memory; call from any thread.

#include <cstdint>

#include "graph/dtype.hpp"

namespace ag::gpu::cpu {

/// The most rows of A few_row_product takes.
inline constexpr int64_t few_rows_max = 8;

/// C[i][j] = sum over p < k of A[i][p] * B[p][j], for i < m, j < n. C is f32
/// with rows of stride ldc; A f32 with rows of stride lda (contiguous over
/// p); B of dtype `t` (f32, f16 or bf16; not i32) with element (p, j) at
/// `b` + p * `ps` + j * `js`, one of the two strides 1: ps == 1 (each column
/// of B contiguous: a weight [n, k] used transposed, the products are dot
/// products) or js == 1 (each row contiguous: axpy updates of C's rows).
/// Sums in f32. On x86-64 machines with AVX2, FMA and F16C: four columns a
/// pass, fused multiply-adds in eight-wide partial sums (27 GB/s for one
/// row against a bf16 weight [8192, 2048] on the development machine, where
/// BLAS's sgemv reads f32 at the same rate: half the bytes, half the time);
/// elsewhere few_row_product_portable. Single-threaded (the stream's
/// thread). Returns false, writing nothing, when m is not in
/// 1..few_rows_max, t is i32, or neither stride is 1.
bool few_row_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* b, dtype t,
                     int64_t ps, int64_t js, float* c, int64_t ldc);

/// The same without AVX2 intrinsics (loops the compiler vectorises, built
/// for the baseline and for AVX2 without FMA); what few_row_product runs on
/// other machines, callable here so that tests cover it everywhere.
bool few_row_product_portable(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* b, dtype t,
                              int64_t ps, int64_t js, float* c, int64_t ldc);

}  // namespace ag::gpu::cpu
