#pragma once
// Row gather and scatter: embedding lookup and the state store (host launchers).
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

/// The store of op_kind::store_rows: rows [.., S, ..] (S along the padded
/// axis `axis4`, 0..3 of the right-aligned kt) into `state` at index
/// positions[i] (i32 [S], read on the GPU, so a replayed graph stores where
/// each job's positions say); positions outside [0, state.d[axis4]) store
/// nothing. Same dtype (2- or 4-byte elements, moved as bits).
error launch_store_rows(const launch_ctx& c, const kt& state, const kt& rows, const kt& positions, int axis4);

}  // namespace ag::gpu::cuda
