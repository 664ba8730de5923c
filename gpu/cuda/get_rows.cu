#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/get_rows.cuh"

namespace ag::gpu::cuda {
namespace {

__global__ void get_rows_kernel(kt out, kt table, kt ids, unsigned int* fault, int64_t n, int64_t first, int64_t rows) {
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

}  // namespace

error launch_get_rows(const launch_ctx& c, const kt& out, const kt& table, const kt& ids, int64_t first, int64_t rows) {
  if (ids.t != static_cast<int>(dtype::i32)) return error(errc::dtype_mismatch, c.where + ": get_rows ids must be i32");
  const int64_t n = ids.numel() * table.d[3];
  if (n == 0) return {};
  const int block = 256;
  get_rows_kernel<<<grid_for(n, block, c.sm_count * 16), block, 0, c.stream>>>(out, table, ids, c.fault_word, n, first,
                                                                                   rows > 0 ? rows : table.d[2]);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
