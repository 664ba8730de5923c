#pragma once
// How an in-stream all-reduce part splits over blocks (in_stream.cuh says
// why pushed parts need a fixed split). Plain C++, no CUDA headers, so that
// tests can check the split without a GPU.

#include <cstdint>

namespace ag::gpu::cuda {

constexpr int in_stream_blocks = 32;  ///< most blocks of one part (flags per block)
/// Parts of at most this many bytes (and 16-byte words) push their operand
/// into each peer's inbox instead of letting the peers read it (in_stream.cuh).
constexpr int64_t in_stream_push_max_bytes = 64 * 1024;
/// 16-byte words of a pushed part that each block carries (the last block
/// fewer): a fixed slice, whatever the part's size (in_stream.cuh says why).
constexpr int64_t in_stream_push_block_words = 256;
static_assert(in_stream_push_max_bytes / 16 <= in_stream_push_block_words * in_stream_blocks,
              "a pushed part fits in_stream_blocks blocks");

/// How a part of `n_out` elements of `elem_bytes` each splits over blocks:
/// `grid` blocks of `per_block` elements (the last fewer), and whether it
/// pushes. `words`: every member's operand is 16-byte aligned and n_out
/// fills whole 16-byte words (what all members see alike), so blocks split
/// at words and a part of at most in_stream_push_max_bytes may push; a
/// pushed part's block b carries words [b W, (b + 1) W) of every size,
/// W = in_stream_push_block_words. Other parts split evenly over at most
/// in_stream_blocks blocks of at least 2048 elements.
struct in_stream_split_t {
  int64_t grid = 1;
  int64_t per_block = 0;
  bool push = false;
};
in_stream_split_t in_stream_split(int64_t n_out, int64_t elem_bytes, bool words, bool push_allowed);

}  // namespace ag::gpu::cuda
