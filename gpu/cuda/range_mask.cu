#include "gpu/cuda/range_mask.cuh"

#include <algorithm>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "graph/attention_mask.hpp"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

constexpr int kColumns = 256, kRows = 32;

template <class E>
__global__ void __launch_bounds__(kColumns) range_mask_kernel(kt out, kt keys, kt ranges) {
  pdl_enter();
  const int64_t rows = out.d[2], C = out.d[3];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  if (c >= C) return;
  const int32_t p = static_cast<const int32_t*>(keys.p)[c * keys.s[3]];
  const int32_t* r = static_cast<const int32_t*>(ranges.p);
  E* o = static_cast<E*>(out.p);
  const E seen = from_f<E>(0.f), hidden = from_f<E>(attention_hidden_score);
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * kRows; i < rows; i += static_cast<int64_t>(gridDim.y) * kRows) {
    const int64_t end = i + kRows < rows ? i + kRows : rows;
    for (int64_t row = i; row < end; ++row) {
      const int32_t lo = r[row * ranges.s[2]], hi = r[row * ranges.s[2] + ranges.s[3]];
      o[row * out.s[2] + c * out.s[3]] = p >= lo && p <= hi ? seen : hidden;
    }
  }
}

}  // namespace

error launch_range_mask(const launch_ctx& c, const kt& out, const kt& keys, const kt& ranges) {
  const int64_t T = out.d[2], C = out.d[3];
  if (out.d[0] * out.d[1] != 1 || keys.numel() != C || ranges.d[3] != 2 || ranges.d[2] != T ||
      ranges.d[0] * ranges.d[1] != 1 || keys.t != static_cast<int>(dtype::i32) || ranges.t != static_cast<int>(dtype::i32))
    return error(errc::invalid_shape, c.where + ": range_mask needs key positions i32 [C], query ranges i32 [T, 2] and out [T, C]");
  if (T == 0 || C == 0) return {};
  const auto columns = static_cast<unsigned>((C + kColumns - 1) / kColumns);
  const unsigned tiles = static_cast<unsigned>(std::min<int64_t>((T + kRows - 1) / kRows, 65535));
  const dim3 grid(columns, tiles);
  switch (static_cast<dtype>(out.t)) {
    case dtype::f32: launch_kernel(c, range_mask_kernel<float>, grid, kColumns, 0, out, keys, ranges); break;
    case dtype::f16: launch_kernel(c, range_mask_kernel<__half>, grid, kColumns, 0, out, keys, ranges); break;
    case dtype::bf16: launch_kernel(c, range_mask_kernel<__nv_bfloat16>, grid, kColumns, 0, out, keys, ranges); break;
    default: return error(errc::dtype_mismatch, c.where + ": range_mask writes f32, f16 or bf16");
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
