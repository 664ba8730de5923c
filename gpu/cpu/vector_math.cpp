#include "gpu/cpu/vector_math.hpp"

#include <algorithm>
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

float max_scaled(const float* row, int64_t n, float s) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j] * s);
  return mx;
}

int64_t first_argmax(const float* row, int64_t n) {
  int64_t best = -1;
  for (int64_t j = 0; j < n; ++j)
    if (!std::isnan(row[j]) && (best < 0 || row[j] > row[best])) best = j;
  return best;
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
[[gnu::target("avx2,fma")]] float max_scaled_avx2(const float* row, int64_t n, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  // Four running maxima: a max's latency, not its throughput, would bound one.
  __m256 m[4] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY),
                 _mm256_set1_ps(-INFINITY)};
  int64_t j = 0;
  // max_ps(x, m) gives m where x is NaN: NaNs are passed over, as std::max(m, x) does.
  for (; j + 32 <= n; j += 32)
    for (int u = 0; u < 4; ++u) m[u] = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(row + j + 8 * u), vs), m[u]);
  for (; j + 8 <= n; j += 8) m[0] = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(row + j), vs), m[0]);
  const __m256 all = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, all);
  float mx = -INFINITY;
  for (float v : lanes) mx = std::max(mx, v);
  for (; j < n; ++j) mx = std::max(mx, row[j] * s);
  return mx;
}

// Per lane the first maximum of its elements (strictly greater replaces;
// the first non-NaN fills an empty lane), then the lanes' best with the
// lowest index among equal values, then the tail, whose indices are larger.
[[gnu::target("avx2,fma")]] int64_t first_argmax_avx2(const float* row, int64_t n) {
  __m256 best = _mm256_set1_ps(-INFINITY);
  __m256i at = _mm256_set1_epi32(-1);
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8), none = _mm256_set1_epi32(-1);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(row + j);
    const __m256 empty = _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, none));
    const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ),
                                     _mm256_and_ps(empty, _mm256_cmp_ps(v, v, _CMP_ORD_Q)));
    best = _mm256_blendv_ps(best, v, take);
    at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(idx), take));
    idx = _mm256_add_epi32(idx, eight);
  }
  alignas(32) float bv[8];
  alignas(32) int32_t bi[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bi), at);
  int64_t found = -1;
  float value = 0;
  for (int l = 0; l < 8; ++l) {
    if (bi[l] < 0) continue;
    if (found < 0 || bv[l] > value || (bv[l] == value && bi[l] < found)) {
      found = bi[l];
      value = bv[l];
    }
  }
  for (; j < n; ++j)
    if (!std::isnan(row[j]) && (found < 0 || row[j] > value)) {
      found = j;
      value = row[j];
    }
  return found;
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

float max_scaled(const float* row, int64_t n, float s) {
#ifdef AG_VECTOR_MATH_AVX2
  if (have_avx2_fma()) return max_scaled_avx2(row, n, s);
#endif
  return portable::max_scaled(row, n, s);
}

int64_t first_argmax(const float* row, int64_t n) {
#ifdef AG_VECTOR_MATH_AVX2
  if (have_avx2_fma() && n < (int64_t{1} << 31) - 8) return first_argmax_avx2(row, n);
#endif
  return portable::first_argmax(row, n);
}

}  // namespace ag::gpu::cpu
