#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/get_rows.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

__global__ void get_rows_kernel(kt out, kt table, kt ids, unsigned int* fault, int64_t n, int64_t first, int64_t rows) {
  pdl_enter();
  const int64_t D = table.d[3], V = table.d[2];
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / D, j = i % D;
    const int64_t id = static_cast<const int32_t*>(ids.p)[flat_offset(ids, r)];
    float v = 0.f;
    if (id >= first && id < first + V) {
      v = ld(table.p, table.t, (id - first) * table.s[2] + j * table.s[3]);
    } else if ((id < 0 || id >= rows) && fault) {  // in range but outside a shard: a zero row
      // Plain store: atomics on mapped host memory are not atomic for the host anyway.
      *reinterpret_cast<volatile unsigned int*>(fault) = static_cast<unsigned int>(fault_get_rows_oob);
    }
    st(out.p, out.t, r * D + j, v);
  }
}

/// get_rows of a table whose rows are contiguous, of the output's dtype,
/// into a contiguous output, in 16-byte words: a block per looked-up row
/// (an id read once), its threads over the row's words. The element
/// kernel above does an int64 division and a dtype switch per element:
/// 280 us for [2, 2048] ids of a d 8192 bf16 table on an H200.
__global__ void get_rows_words_kernel(uint4* out, const uint4* table, kt ids, unsigned int* fault, int64_t n_ids,
                                      int64_t words, int64_t table_row_words, int64_t first, int64_t V,
                                      int64_t rows) {
  pdl_enter();
  for (int64_t r = blockIdx.x; r < n_ids; r += gridDim.x) {
    const int64_t id = static_cast<const int32_t*>(ids.p)[flat_offset(ids, r)];
    const bool here = id >= first && id < first + V;
    if (!here && (id < 0 || id >= rows) && fault && threadIdx.x == 0)
      *reinterpret_cast<volatile unsigned int*>(fault) = static_cast<unsigned int>(fault_get_rows_oob);
    const uint4* src = table + (here ? (id - first) * table_row_words : 0);
    uint4* dst = out + r * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = here ? src[w] : make_uint4(0, 0, 0, 0);
  }
}

template <class T>
__global__ void store_rows_kernel(kt state, kt rows, kt pos, int axis4, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t c[4];
    int64_t r = i;
    for (int k = 3; k >= 0; --k) {
      c[k] = r % rows.d[k];
      r /= rows.d[k];
    }
    const int64_t at = static_cast<const int32_t*>(pos.p)[c[axis4] * pos.s[3]];
    if (at < 0 || at >= state.d[axis4]) continue;
    const int64_t src = c[0] * rows.s[0] + c[1] * rows.s[1] + c[2] * rows.s[2] + c[3] * rows.s[3];
    c[axis4] = at;
    const int64_t dst = c[0] * state.s[0] + c[1] * state.s[1] + c[2] * state.s[2] + c[3] * state.s[3];
    static_cast<T*>(state.p)[dst] = static_cast<const T*>(rows.p)[src];
  }
}

}  // namespace

error launch_store_rows(const launch_ctx& c, const kt& state, const kt& rows, const kt& positions, int axis4) {
  if (positions.t != static_cast<int>(dtype::i32))
    return error(errc::dtype_mismatch, c.where + ": store_rows positions must be i32");
  if (state.t != rows.t) return error(errc::dtype_mismatch, c.where + ": store_rows rows and state dtypes differ");
  if (axis4 < 0 || axis4 > 3) return error(errc::invalid_argument, c.where + ": store_rows axis out of range");
  const int64_t n = rows.numel();
  if (n == 0) return {};
  const int block = 256;
  const unsigned grid = grid_for(n, block, c.sm_count * 16);
  // A state of one row along the axis has stride 0 there (to_kt): only index 0 exists.
  if (dtype_size(static_cast<dtype>(rows.t)) == 4)
    launch_kernel(c, store_rows_kernel<uint32_t>, grid, block, 0, state, rows, positions, axis4, n);
  else
    launch_kernel(c, store_rows_kernel<uint16_t>, grid, block, 0, state, rows, positions, axis4, n);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

error launch_get_rows(const launch_ctx& c, const kt& out, const kt& table, const kt& ids, int64_t first, int64_t rows) {
  if (ids.t != static_cast<int>(dtype::i32)) return error(errc::dtype_mismatch, c.where + ": get_rows ids must be i32");
  const int64_t n = ids.numel() * table.d[3];
  if (n == 0) return {};
  const int block = 256;
  // Rows as 16-byte words where the layout allows it: same dtype, contiguous
  // rows starting on 16-byte boundaries, a contiguous output.
  const int64_t es = static_cast<int64_t>(dtype_size(static_cast<dtype>(table.t)));
  const int64_t row_bytes = table.d[3] * es;
  const bool contiguous_out = out.s[3] == 1 && (out.d[2] == 1 || out.s[2] == out.d[3]) &&
                              (out.d[1] == 1 || out.s[1] == out.d[2] * out.d[3]) &&
                              (out.d[0] == 1 || out.s[0] == out.d[1] * out.d[2] * out.d[3]);
  if (out.t == table.t && table.s[3] == 1 && contiguous_out && row_bytes % 16 == 0 && (table.s[2] * es) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(table.p) % 16 == 0 && reinterpret_cast<uintptr_t>(out.p) % 16 == 0) {
    const int64_t n_ids = ids.numel(), words = row_bytes / 16;
    launch_kernel(c, get_rows_words_kernel, grid_for(n_ids, 1, c.sm_count * 16), 128, 0,
        static_cast<uint4*>(out.p), static_cast<const uint4*>(table.p), ids, c.fault_word, n_ids, words,
        table.s[2] * es / 16, first, table.d[2], rows > 0 ? rows : table.d[2]);
    AG_CUDA_TRY_LAUNCH(c.where);
    return {};
  }
  launch_kernel(c, get_rows_kernel, grid_for(n, block, c.sm_count * 16), block, 0, out, table, ids, c.fault_word, n,
                first, rows > 0 ? rows : table.d[2]);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
