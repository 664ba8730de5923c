#pragma once
/// \file rope_frequencies.hpp
/// RoPE's frequencies: the one definition that the reference evaluator, the
/// CPU kernel and every CUDA rope (the rope op, the fused attention's, the
/// projection groups', the whole decode step's) rotate by. Header-only and
/// free of the rest of graph/ so that device code can include it.
///
/// Pair k of a head of D turns by position * f_k, where
///   f_k = theta^(-2k / D)                             (plain RoPE)
/// and, with Llama 3's scaling (Hugging Face's rope_type "llama3",
/// transformers' _compute_llama3_parameters), wavelength w = 2 pi / f_k,
/// L = original_context:
///   w > L / low_freq_factor   ->  f_k / factor
///   w < L / high_freq_factor  ->  f_k
///   otherwise                 ->  (1 - s) f_k / factor + s f_k,
///                                 s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor);
/// with linear scaling (rope_type "linear", position interpolation:
/// LongChat-style long-context LLaMA checkpoints) every pair: f_k / factor,
/// so position p turns as position p / factor did.
/// Computed in f64 (transformers computes in f32: the two agree to about
/// 1e-7 relative, far inside the tests' tolerances).

#include <cmath>
#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define AG_ROPE_HOST_DEVICE __host__ __device__
#else
#define AG_ROPE_HOST_DEVICE
#endif

namespace ag {

/// Which RoPE scaling (Hugging Face's rope_type).
enum class rope_scaling_kind : uint8_t {
  llama3 = 0,  ///< frequency dependent (below)
  linear = 1,  ///< every pair `factor` times slower; the other fields unused
};

/// A RoPE scaling; factor 0: plain RoPE. Llama 3's (Llama 3.1 and 3.2
/// checkpoints): the pairs of long wavelength turn `factor` times slower,
/// the short ones stay, those between are blended. Linear: every pair turns
/// `factor` times slower.
struct rope_scaling {
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_context = 8192;
  rope_scaling_kind kind = rope_scaling_kind::llama3;

  AG_ROPE_HOST_DEVICE bool on() const noexcept { return factor > 0.0f; }
  bool operator==(const rope_scaling&) const = default;
};

/// Empty when `s` is off or well formed (a finite factor > 0; for Llama 3's,
/// 0 < low_freq_factor < high_freq_factor and an original context > 0),
/// else what is wrong with it. Host only.
inline std::string rope_scaling_misfit(const rope_scaling& s) {
  if (s.factor == 0.0f) return {};
  if (!(s.factor > 0.0f) || !std::isfinite(s.factor))
    return "rope scaling factor must be a finite value > 0 (or 0: none), got " + std::to_string(s.factor);
  if (s.kind == rope_scaling_kind::linear) return {};
  if (s.kind != rope_scaling_kind::llama3)
    return "rope scaling kind " + std::to_string(static_cast<int>(s.kind)) + " is not one of llama3 (0) and linear (1)";
  if (!(s.low_freq_factor > 0.0f) || !(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor))
    return "rope scaling needs 0 < low_freq_factor < high_freq_factor, got " + std::to_string(s.low_freq_factor) +
           " and " + std::to_string(s.high_freq_factor);
  if (s.original_context <= 0)
    return "rope scaling's original context must be > 0, got " + std::to_string(s.original_context);
  return {};
}

/// f_k for pair k < D / 2 (above).
AG_ROPE_HOST_DEVICE inline double rope_frequency(double theta, const rope_scaling& s, int64_t k, int64_t D) {
  const double f = pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(D));
  if (!s.on()) return f;
  if (s.kind == rope_scaling_kind::linear) return f / static_cast<double>(s.factor);
  const double two_pi = 6.283185307179586476925286766559;
  const double L = static_cast<double>(s.original_context), lo = s.low_freq_factor, hi = s.high_freq_factor;
  const double wavelength = two_pi / f, factor = s.factor;
  if (wavelength > L / lo) return f / factor;
  if (wavelength < L / hi) return f;
  const double smooth = (L / wavelength - lo) / (hi - lo);
  return (1.0 - smooth) * f / factor + smooth * f;
}

/// f_k for every k < D / 2 into inv[0, D / 2).
inline void rope_frequencies(double theta, const rope_scaling& s, int64_t D, double* inv) {
  for (int64_t k = 0; k < D / 2; ++k) inv[k] = rope_frequency(theta, s, k, D);
}

}  // namespace ag
