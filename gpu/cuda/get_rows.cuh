#pragma once
// Embedding lookup (host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out[r, :] = table[ids[r], :] for table [V, D] and ids i32 [...].
/// An id outside [0, V) cannot be reported at enqueue time (ids live on the
/// GPU): the kernel writes zeros for that row and sets fault_get_rows_oob in
/// the stream's fault word, so the stream's next notify() / synchronize()
/// fails with errc::op_failed. It never reads out of bounds.
/// A table shard (tensor parallelism) holds rows [first, first + V) of a
/// vocabulary of `rows` (0: the table is whole): ids in the vocabulary but
/// outside the shard give zero rows, without a fault.
error launch_get_rows(const launch_ctx& c, const kt& out, const kt& table, const kt& ids, int64_t first = 0,
                      int64_t rows = 0);

}  // namespace ag::gpu::cuda
