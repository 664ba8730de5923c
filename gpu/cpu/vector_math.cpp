#include "gpu/cpu/vector_math.hpp"

#include <cmath>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AG_VECTOR_MATH_AVX2 1
#endif

namespace ag::gpu::cpu {

// sqrt(2 / pi): gelu tanh(x) = 0.5x(1 + tanh(c(x + 0.044715x^3)))
//                            = x / (1 + e^(-2c(x + 0.044715x^3)))
constexpr float gelu_tanh_c = 0.79788456080286536f;

namespace portable {

double exp_shifted_sum(float* row, int64_t n, float s, float shift) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] * s - shift);
    sum += row[j];
  }
  return sum;
}

void gelu_tanh_in_place(float* row, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = row[j];
    row[j] = x / (1.0f + std::exp(-2.0f * gelu_tanh_c * x * (1.0f + 0.044715f * x * x)));
  }
}

void silu_in_place(float* row, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] = row[j] / (1.0f + std::exp(-row[j]));
}

}  // namespace portable

namespace {

#ifdef AG_VECTOR_MATH_AVX2
bool have_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// e^x for eight x: x = k ln2 + r with |r| <= ln2 / 2, e^r by Cephes'
// degree-7 polynomial, 2^k through the exponent bits. Below -87.3 gives 0
// (e^x is under 1.2e-38 there), above 88.3 gives +inf, NaN stays NaN.
[[gnu::target("avx2,fma")]] inline __m256 exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3f), highest = _mm256_set1_ps(88.3f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);  // NaN -> -87.3 here
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  // k in [-126, 127]: 2^k is a normal float
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  __m256 e = _mm256_mul_ps(er, _mm256_castsi256_ps(bits));
  e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, lowest, _CMP_LT_OQ));  // underflow: 0
  e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, highest, _CMP_GT_OQ));  // overflow: inf
  return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));                    // NaN: itself
}

enum class sigmoid_of { x, gelu_tanh };

// x / (1 + e^-z(x)) for eight x: z = x (SiLU) or 2c(x + 0.044715x^3) (GELU).
template <sigmoid_of Z>
[[gnu::target("avx2,fma")]] inline __m256 times_sigmoid8(__m256 x) {
  __m256 z = x;
  if constexpr (Z == sigmoid_of::gelu_tanh)
    z = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(2.0f * gelu_tanh_c * 0.044715f),
                                         _mm256_set1_ps(2.0f * gelu_tanh_c)));
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// The row eight at a time, the tail through the same lanes.
template <sigmoid_of Z>
[[gnu::target("avx2,fma")]] void times_sigmoid_avx2(float* row, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, times_sigmoid8<Z>(_mm256_loadu_ps(row + j)));
  if (j < n) {
    alignas(32) float tail[8] = {};
    for (int64_t l = 0; j + l < n; ++l) tail[l] = row[j + l];
    _mm256_store_ps(tail, times_sigmoid8<Z>(_mm256_load_ps(tail)));
    for (int64_t l = 0; j + l < n; ++l) row[j + l] = tail[l];
  }
}

[[gnu::target("avx2,fma")]] double exp_shifted_sum_avx2(float* row, int64_t n, float s, float shift) {
  const __m256 vs = _mm256_set1_ps(s), vshift = _mm256_set1_ps(shift);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(row + j), vs), vshift));
    _mm256_storeu_ps(row + j, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  if (j < n) {  // the tail through the same lanes, padded with exponents that give 0
    alignas(32) float tail[8];
    for (int l = 0; l < 8; ++l) tail[l] = j + l < n ? row[j + l] * s - shift : -1e30f;
    const __m256 e = exp8(_mm256_load_ps(tail));
    _mm256_store_ps(tail, e);
    for (int64_t l = 0; j + l < n; ++l) row[j + l] = tail[l];
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double part[8];
  _mm256_store_pd(part, lo);
  _mm256_store_pd(part + 4, hi);
  double sum = 0;
  for (double v : part) sum += v;
  return sum;
}
#endif

}  // namespace

double exp_shifted_sum(float* row, int64_t n, float s, float shift) {
#ifdef AG_VECTOR_MATH_AVX2
  if (have_avx2_fma()) return exp_shifted_sum_avx2(row, n, s, shift);
#endif
  return portable::exp_shifted_sum(row, n, s, shift);
}

void gelu_tanh_in_place(float* row, int64_t n) {
#ifdef AG_VECTOR_MATH_AVX2
  if (have_avx2_fma()) return times_sigmoid_avx2<sigmoid_of::gelu_tanh>(row, n);
#endif
  portable::gelu_tanh_in_place(row, n);
}

void silu_in_place(float* row, int64_t n) {
#ifdef AG_VECTOR_MATH_AVX2
  if (have_avx2_fma()) return times_sigmoid_avx2<sigmoid_of::x>(row, n);
#endif
  portable::silu_in_place(row, n);
}

}  // namespace ag::gpu::cpu
