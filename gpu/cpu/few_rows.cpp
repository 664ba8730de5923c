#include "gpu/cpu/few_rows.hpp"

#include "graph/target_clones.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace ag::gpu::cpu {

namespace {

// Elements of a column (dot form) or row (axpy form) of B converted at a
// time: 1-2 KiB of f32, in L1 while every row of A uses them.
constexpr int64_t dot_chunk = 256;
constexpr int64_t axpy_chunk = 512;

// Everything below is inlined into each clone of the entry points (bottom),
// so that the AVX2 clone's loops are AVX2 loops: GCC otherwise calls one
// baseline copy of a template from every clone.
#define AG_INLINE [[gnu::always_inline]] inline

struct f32_elems {
  using type = float;
  AG_INLINE static float load(float x) { return x; }
};
struct bf16_elems {
  using type = uint16_t;
  AG_INLINE static float load(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
// IEEE half to float without a branch on the common path, so that a loop of
// it vectorises: the exponent and mantissa shifted into a float's place and
// rescaled by 2^112 (exact for normals and subnormals); infinities and NaNs
// (exponent 31) get the float's all-ones exponent instead.
struct f16_elems {
  using type = uint16_t;
  AG_INLINE static float load(uint16_t h) {
    const uint32_t em = static_cast<uint32_t>(h & 0x7fffu);
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t shifted = em << 13;
    float f;
    std::memcpy(&f, &shifted, 4);
    f *= 0x1p112f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t special = shifted | 0x7f800000u;
    u = (em >= 0x7c00u ? special : u) | sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <class E>
AG_INLINE void convert(const typename E::type* p, int64_t n, float* out) {
  for (int64_t q = 0; q < n; ++q) out[q] = E::load(p[q]);
}

// x . y over n elements: 32 running sums (four vector registers of AVX2,
// so that four additions are in flight), reduced pairwise, then the tail.
AG_INLINE float dot32(const float* x, const float* y, int64_t n) {
  constexpr int lanes = 32;
  float s[lanes] = {};
  int64_t q = 0;
  for (; q + lanes <= n; q += lanes)
    for (int l = 0; l < lanes; ++l) s[l] += x[q + l] * y[q + l];
  for (int width = lanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) s[l] += s[l + width];
  float tail = 0.0f;
  for (; q < n; ++q) tail += x[q] * y[q];
  return s[0] + tail;
}

// Columns of B contiguous (B[p][j] = w[j * js + p]): one column at a time,
// a chunk of it converted and dotted with every row of A.
template <class E>
AG_INLINE void product_dot(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const typename E::type* w,
                           int64_t js, float* c, int64_t ldc) {
  alignas(64) float buf[dot_chunk];
  for (int64_t j = 0; j < n; ++j) {
    float acc[few_rows_max] = {};
    const typename E::type* col = w + j * js;
    for (int64_t p0 = 0; p0 < k; p0 += dot_chunk) {
      const int64_t len = std::min(dot_chunk, k - p0);
      const float* y = buf;
      if constexpr (std::is_same_v<E, f32_elems>) y = col + p0;
      else convert<E>(col + p0, len, buf);
      for (int64_t i = 0; i < m; ++i) acc[i] += dot32(a + i * lda + p0, y, len);
    }
    for (int64_t i = 0; i < m; ++i) c[i * ldc + j] = acc[i];
  }
}

// Rows of B contiguous (B[p][j] = w[p * ps + j]): C's rows, a chunk of
// columns at a time, take every row of B in turn.
template <class E>
AG_INLINE void product_axpy(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const typename E::type* w,
                         int64_t ps, float* c, int64_t ldc) {
  alignas(64) float buf[axpy_chunk];
  for (int64_t j0 = 0; j0 < n; j0 += axpy_chunk) {
    const int64_t len = std::min(axpy_chunk, n - j0);
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc + j0, c + i * ldc + j0 + len, 0.0f);
    for (int64_t p = 0; p < k; ++p) {
      const float* y = buf;
      if constexpr (std::is_same_v<E, f32_elems>) y = w + p * ps + j0;
      else convert<E>(w + p * ps + j0, len, buf);
      for (int64_t i = 0; i < m; ++i) {
        const float av = a[i * lda + p];
        float* ci = c + i * ldc + j0;
        for (int64_t q = 0; q < len; ++q) ci[q] += av * y[q];
      }
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AG_FEW_ROWS_AVX2_FMA 1
// The dot form with AVX2, FMA and F16C, for machines that have them
// (picked at run time): four columns of B a pass, each converted in
// registers (bf16: a 16-bit shift; f16: vcvtph2ps) and multiplied into two
// rows of A at a time: eight independent chains of fused multiply-adds, one
// load of each element of B per pair of rows (B's four columns of a pass,
// at most 4 x 8192 elements, stay in L2 for the next pair).
template <class E>
[[gnu::target("avx2,fma,f16c")]] inline __m256 load8(const typename E::type* p) {
  if constexpr (std::is_same_v<E, f32_elems>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<E, bf16_elems>) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

[[gnu::target("avx2,fma,f16c")]] inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Rows r0 .. r0 + R - 1 of A (R 1 or 2) against columns j .. j + G - 1.
template <class E, int G, int R>
[[gnu::target("avx2,fma,f16c")]] inline void dot_block_avx2(int64_t r0, int64_t j, int64_t k, const float* a,
                                                              int64_t lda, const typename E::type* w, int64_t js,
                                                              float* c, int64_t ldc) {
  __m256 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
  const typename E::type* col[G];
  for (int g = 0; g < G; ++g) col[g] = w + (j + g) * js;
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm256_loadu_ps(a + (r0 + r) * lda + p);
    for (int g = 0; g < G; ++g) {
      const __m256 y = load8<E>(col[g] + p);
      for (int r = 0; r < R; ++r) acc[r][g] = _mm256_fmadd_ps(x[r], y, acc[r][g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      float sum = hsum(acc[r][g]);
      for (int64_t q = p; q < k; ++q) sum += a[(r0 + r) * lda + q] * E::load(col[g][q]);
      c[(r0 + r) * ldc + j + g] = sum;
    }
}

template <class E>
[[gnu::target("avx2,fma,f16c")]] void product_dot_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                                       const typename E::type* w, int64_t js, float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    int64_t r = 0;
    for (; r + 2 <= m; r += 2) dot_block_avx2<E, 4, 2>(r, j, k, a, lda, w, js, c, ldc);
    if (r < m) dot_block_avx2<E, 4, 1>(r, j, k, a, lda, w, js, c, ldc);
  }
  for (; j < n; ++j)
    for (int64_t r = 0; r < m; ++r) dot_block_avx2<E, 1, 1>(r, j, k, a, lda, w, js, c, ldc);
}

// The axpy form with AVX2 and FMA: C's rows, axpy_chunk columns at a time
// (in L1), take every row of B in turn, each element of B converted in a
// register and multiplied into all m rows.
template <class E>
[[gnu::target("avx2,fma,f16c")]] void product_axpy_avx2(int64_t m, int64_t n, int64_t k, const float* a,
                                                        int64_t lda, const typename E::type* w, int64_t ps,
                                                        float* c, int64_t ldc) {
  // Long pieces of B's rows (64 KiB of C's rows, in L2): pieces of 512
  // columns jumped a page from row to row and left the prefetcher behind
  // (10 against 27 GB/s for a bf16 weight [8192, 2048]).
  const int64_t chunk = std::max<int64_t>(axpy_chunk, 16384 / m);
  for (int64_t j0 = 0; j0 < n; j0 += chunk) {
    const int64_t len = std::min(chunk, n - j0), vec = len / 8 * 8;
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc + j0, c + i * ldc + j0 + len, 0.0f);
    // Four rows of B a pass: C's elements are loaded and stored once per
    // four rows (once per row ran at 11 GB/s), from four streams of B.
    int64_t p = 0;
    for (; p + 4 <= k; p += 4) {
      const typename E::type* row[4] = {w + p * ps + j0, w + (p + 1) * ps + j0, w + (p + 2) * ps + j0,
                                        w + (p + 3) * ps + j0};
      for (int64_t i = 0; i < m; ++i) {
        const __m256 a0 = _mm256_set1_ps(a[i * lda + p]), a1 = _mm256_set1_ps(a[i * lda + p + 1]),
                     a2 = _mm256_set1_ps(a[i * lda + p + 2]), a3 = _mm256_set1_ps(a[i * lda + p + 3]);
        float* ci = c + i * ldc + j0;
        for (int64_t q = 0; q < vec; q += 8) {
          __m256 acc = _mm256_loadu_ps(ci + q);
          acc = _mm256_fmadd_ps(a0, load8<E>(row[0] + q), acc);
          acc = _mm256_fmadd_ps(a1, load8<E>(row[1] + q), acc);
          acc = _mm256_fmadd_ps(a2, load8<E>(row[2] + q), acc);
          acc = _mm256_fmadd_ps(a3, load8<E>(row[3] + q), acc);
          _mm256_storeu_ps(ci + q, acc);
        }
        for (int64_t q = vec; q < len; ++q)
          for (int r = 0; r < 4; ++r) ci[q] += a[i * lda + p + r] * E::load(row[r][q]);
      }
    }
    for (; p < k; ++p) {
      const typename E::type* row = w + p * ps + j0;
      for (int64_t i = 0; i < m; ++i) {
        const __m256 av = _mm256_set1_ps(a[i * lda + p]);
        float* ci = c + i * ldc + j0;
        for (int64_t q = 0; q < vec; q += 8)
          _mm256_storeu_ps(ci + q, _mm256_fmadd_ps(av, load8<E>(row + q), _mm256_loadu_ps(ci + q)));
        for (int64_t q = vec; q < len; ++q) ci[q] += a[i * lda + p] * E::load(row[q]);
      }
    }
  }
}

bool have_avx2_fma() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
  // does not know "f16c".
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
}
#endif

// The portable entry points, built for AVX2 (without FMA) and for the
// baseline (graph/target_clones.hpp).
#define AG_FEW_ROWS_CLONES AG_AVX2_CLONES
#define AG_FEW_ROWS_FOR(E)                                                                                      \
  AG_FEW_ROWS_CLONES void dot_##E(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,               \
                                  const E::type* w, int64_t js, float* c, int64_t ldc) {                     \
    product_dot<E>(m, n, k, a, lda, w, js, c, ldc);                                                          \
  }                                                                                                          \
  AG_FEW_ROWS_CLONES void axpy_##E(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,              \
                                   const E::type* w, int64_t ps, float* c, int64_t ldc) {                    \
    product_axpy<E>(m, n, k, a, lda, w, ps, c, ldc);                                                         \
  }
AG_FEW_ROWS_FOR(f32_elems)
AG_FEW_ROWS_FOR(bf16_elems)
AG_FEW_ROWS_FOR(f16_elems)
#undef AG_FEW_ROWS_FOR
#undef AG_FEW_ROWS_CLONES
#undef AG_INLINE

// What both entry points take (few_rows.hpp).
bool takes(int64_t m, dtype t, int64_t ps, int64_t js) {
  return m >= 1 && m <= few_rows_max && t != dtype::i32 && (ps == 1 || js == 1);
}

}  // namespace

bool few_row_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* b, dtype t,
                     int64_t ps, int64_t js, float* c, int64_t ldc) {
  if (!takes(m, t, ps, js)) return false;
#ifdef AG_FEW_ROWS_AVX2_FMA
  if (have_avx2_fma()) {
    const bool dot = ps == 1;
    const auto* w16 = static_cast<const uint16_t*>(b);
    const auto* w32 = static_cast<const float*>(b);
    switch (t) {
      case dtype::f32:
        dot ? product_dot_avx2<f32_elems>(m, n, k, a, lda, w32, js, c, ldc)
            : product_axpy_avx2<f32_elems>(m, n, k, a, lda, w32, ps, c, ldc);
        return true;
      case dtype::bf16:
        dot ? product_dot_avx2<bf16_elems>(m, n, k, a, lda, w16, js, c, ldc)
            : product_axpy_avx2<bf16_elems>(m, n, k, a, lda, w16, ps, c, ldc);
        return true;
      case dtype::f16:
        dot ? product_dot_avx2<f16_elems>(m, n, k, a, lda, w16, js, c, ldc)
            : product_axpy_avx2<f16_elems>(m, n, k, a, lda, w16, ps, c, ldc);
        return true;
      case dtype::i32: return false;
    }
  }
#endif
  return few_row_product_portable(m, n, k, a, lda, b, t, ps, js, c, ldc);
}

bool few_row_product_portable(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const void* b, dtype t,
                              int64_t ps, int64_t js, float* c, int64_t ldc) {
  if (!takes(m, t, ps, js)) return false;
  const bool dot = ps == 1;
  switch (t) {
    case dtype::f32: {
      const auto* w = static_cast<const float*>(b);
      dot ? dot_f32_elems(m, n, k, a, lda, w, js, c, ldc) : axpy_f32_elems(m, n, k, a, lda, w, ps, c, ldc);
      return true;
    }
    case dtype::bf16: {
      const auto* w = static_cast<const uint16_t*>(b);
      dot ? dot_bf16_elems(m, n, k, a, lda, w, js, c, ldc) : axpy_bf16_elems(m, n, k, a, lda, w, ps, c, ldc);
      return true;
    }
    case dtype::f16: {
      const auto* w = static_cast<const uint16_t*>(b);
      dot ? dot_f16_elems(m, n, k, a, lda, w, js, c, ldc) : axpy_f16_elems(m, n, k, a, lda, w, ps, c, ldc);
      return true;
    }
    case dtype::i32: return false;
  }
  return false;
}

}  // namespace ag::gpu::cpu
