#pragma once
// What an attention mask's values mean to the fused attention kernels.

namespace ag {

/// The additive mask value that hides a key: what a generator's mask and
/// the sliding window's give one (models::attention_masked_score is this).
/// It fits f16 exactly and bf16 as -29952, and unlike -inf it never makes a
/// softmax's max - max a NaN.
inline constexpr float attention_hidden_score = -30000.0f;

/// A key whose mask value is at most this is hidden: its weight beside any
/// visible key of the row is e^(-16384 scale) at most (scale >= 1/16 for
/// heads up to 256: e^-1024, 0 in f32), so a fused attention (gpu/cuda/
/// attention.cu, gpu/cuda/decode_step.cu, gpu/cpu/kernels.cpp) need not
/// read it. Over a long KV cache the kernels read only the keys from the
/// first to the last that some query row sees, so a sequence of 512 tokens
/// in a cache of 16,384 reads 512 rows a layer; when some row hides all its
/// keys they read every key (the reference then takes the softmax over the
/// hidden keys' scores, and so do they). A power of two: exact in every
/// dtype, and attention_hidden_score in any of them is below it.
inline constexpr float attention_hidden_limit = -16384.0f;
static_assert(attention_hidden_score * (1.0f - 1.0f / 128.0f) < attention_hidden_limit,
              "the hidden score rounded to bf16 (8 significant bits) stays hidden");

}  // namespace ag
