#pragma once
// An attention mask built on the device from key positions and query
// ranges (op_kind::range_mask; host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out [T, C] (f32 / f16 / bf16) = 0 where ranges[i, 0] <= keys[c] <=
/// ranges[i, 1], attention_hidden_score elsewhere; keys i32 [C], ranges i32
/// [T, 2]. A block covers 256 columns of 32 rows: each thread reads its
/// key once and writes a column of the tile, coalesced across the warp, so
/// a 128 MiB mask costs about its writes (tens of microseconds on an H200).
error launch_range_mask(const launch_ctx& c, const kt& out, const kt& keys, const kt& ranges);

}  // namespace ag::gpu::cuda
