#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/vec.cuh"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

struct coords {
  int64_t i0, i1, i2, i3;
};
__device__ __forceinline__ coords split(const kt& x, int64_t i) {
  coords c;
  c.i3 = i % x.d[3];
  i /= x.d[3];
  c.i2 = i % x.d[2];
  i /= x.d[2];
  c.i1 = i % x.d[1];
  c.i0 = i / x.d[1];
  return c;
}
__device__ __forceinline__ int64_t off(const kt& x, const coords& c) {
  return c.i0 * x.s[0] + c.i1 * x.s[1] + c.i2 * x.s[2] + c.i3 * x.s[3];
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.f + tanhf(k0 * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

template <int OP>
__global__ void ew_kernel(kt out, kt a, kt b, float scale, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const coords c = split(out, i);
    const float x = ld(a.p, a.t, off(a, c));
    float y;
    if constexpr (OP == (int)ew_op::add) y = x + ld(b.p, b.t, off(b, c));
    else if constexpr (OP == (int)ew_op::mul) y = x * ld(b.p, b.t, off(b, c));
    else if constexpr (OP == (int)ew_op::scale) y = x * scale;
    else if constexpr (OP == (int)ew_op::gelu_tanh) y = gelu_tanh(x);
    else if constexpr (OP == (int)ew_op::gelu_erf) y = gelu_erf(x);
    else if constexpr (OP == (int)ew_op::silu) y = silu(x);
    else y = x;
    st(out.p, out.t, off(out, c), y);
  }
}

// Contiguous, same shape, same dtype T everywhere: the common residual add /
// activation case, without index arithmetic.
template <int OP, class T>
__global__ void ew_contig_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, float scale,
                                 int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float x = to_f(a[i]);
    float y;
    if constexpr (OP == (int)ew_op::add) y = x + to_f(b[i]);
    else if constexpr (OP == (int)ew_op::mul) y = x * to_f(b[i]);
    else if constexpr (OP == (int)ew_op::scale) y = x * scale;
    else if constexpr (OP == (int)ew_op::gelu_tanh) y = gelu_tanh(x);
    else if constexpr (OP == (int)ew_op::gelu_erf) y = gelu_erf(x);
    else if constexpr (OP == (int)ew_op::silu) y = silu(x);
    else y = x;
    out[i] = from_f<T>(y);
  }
}

bool contiguous_like(const kt& x, const kt& ref);

template <int OP>
__device__ __forceinline__ float apply(float x, float y, float scale) {
  if constexpr (OP == (int)ew_op::add) return x + y;
  else if constexpr (OP == (int)ew_op::mul) return x * y;
  else if constexpr (OP == (int)ew_op::scale) return x * scale;
  else if constexpr (OP == (int)ew_op::gelu_tanh) return gelu_tanh(x);
  else if constexpr (OP == (int)ew_op::gelu_erf) return gelu_erf(x);
  else if constexpr (OP == (int)ew_op::silu) return silu(x);
  else return x;
}

// Vectorised contiguous path, 8-element chunks (16-byte loads / stores), all
// pointers 16-byte aligned, one dtype T. BM: 0 no b, 1 b has out's shape,
// 2 b is a vector over the last dim (period D, D % 8 == 0). Elements past the
// last whole chunk are done one by one by the first threads.
template <int OP, class T, int BM>
__global__ void ew_vec_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, float scale,
                              int64_t n, int64_t D) {
  pdl_enter();
  const int64_t nc = n / kChunk;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nc; i += stride) {
    float x[kChunk], y[kChunk];
    load8(a + i * kChunk, x);
    if constexpr (BM == 1) load8(b + i * kChunk, y);
    else if constexpr (BM == 2) load8(b + (i * kChunk) % D, y);
    else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) y[k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) x[k] = apply<OP>(x[k], y[k], scale);
    store8(out + i * kChunk, x);
  }
  if constexpr (BM != 2) {
    const int64_t i = nc * kChunk + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f<T>(apply<OP>(to_f(a[i]), BM == 1 ? to_f(b[i]) : 0.f, scale));
  }
}

// Rows path: out, a (and b) of one dtype and shape, each row (last dim)
// contiguous and 16-byte aligned, the rows anywhere (rows_vectorisable): a
// slice of rows out of a larger tensor, such as a residual's rows of one
// chunk of a sequence-parallel region (rows of every batch, so not one
// contiguous run). The generic kernel did these element by element, with 4-D
// index arithmetic and 2-byte accesses: a chunk's residual add of a d-8192
// layer at degree 2 took 85 us against 18 us for the same bytes contiguous.
template <int OP, class T, bool HAS_B>
__global__ void ew_rows_kernel(kt out, kt a, kt b, float scale, int64_t chunks) {
  pdl_enter();
  const int64_t per_row = out.d[3] / kChunk;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < chunks; i += stride) {
    // The same dims everywhere: the row's coordinates once, then each
    // tensor's strides.
    const int64_t row = i / per_row, col = (i - row * per_row) * kChunk;
    const int64_t i2 = row % out.d[2], r = row / out.d[2];
    const int64_t i1 = r % out.d[1], i0 = r / out.d[1];
    const auto at = [&](const kt& x) { return i0 * x.s[0] + i1 * x.s[1] + i2 * x.s[2] + col; };
    float x[kChunk], y[kChunk];
    load8(static_cast<const T*>(a.p) + at(a), x);
    if constexpr (HAS_B) {
      load8(static_cast<const T*>(b.p) + at(b), y);
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) y[k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) x[k] = apply<OP>(x[k], y[k], scale);
    store8(static_cast<T*>(out.p) + at(out), x);
  }
}

/// True when x has out's dims and dtype and rows the rows path can take.
bool rows_like(const kt& x, const kt& out) {
  for (int k = 0; k < 4; ++k)
    if (x.d[k] != out.d[k]) return false;
  return x.t == out.t && rows_vectorisable(x);
}

/// AG_CUDA_EW_ROWS=0 sends rows to the generic kernel instead (a diagnostic
/// switch, A/B); read once.
bool rows_path_on() {
  static const bool on = [] {
    const char* e = std::getenv("AG_CUDA_EW_ROWS");
    return !(e && e[0] == '0');
  }();
  return on;
}

template <int OP, class T>
void launch_rows(const launch_ctx& c, const kt& out, const kt& a, const kt* b, float scale, unsigned grid,
                 int block) {
  const int64_t chunks = out.numel() / kChunk;
  if (b) launch_kernel(c, ew_rows_kernel<OP, T, true>, grid, block, 0, out, a, *b, scale, chunks);
  else launch_kernel(c, ew_rows_kernel<OP, T, false>, grid, block, 0, out, a, kt{}, scale, chunks);
}

// b broadcasts as one vector over out's last dim.
bool last_dim_vector(const kt& b, const kt& out) {
  return b.d[0] == 1 && b.d[1] == 1 && b.d[2] == 1 && b.d[3] == out.d[3] && (b.d[3] == 1 || b.s[3] == 1);
}

template <int OP, class T>
void launch_vec(const launch_ctx& c, const kt& out, const kt& a, const kt* b, int bm, float scale, unsigned grid,
                int block) {
  const int64_t n = out.numel();
  T* o = static_cast<T*>(out.p);
  const T* ap = static_cast<const T*>(a.p);
  const T* bp = b ? static_cast<const T*>(b->p) : nullptr;
  if (bm == 0) launch_kernel(c, ew_vec_kernel<OP, T, 0>, grid, block, 0, o, ap, bp, scale, n, out.d[3]);
  else if (bm == 1) launch_kernel(c, ew_vec_kernel<OP, T, 1>, grid, block, 0, o, ap, bp, scale, n, out.d[3]);
  else launch_kernel(c, ew_vec_kernel<OP, T, 2>, grid, block, 0, o, ap, bp, scale, n, out.d[3]);
}

bool contiguous_like(const kt& x, const kt& ref) {
  int64_t expect = 1;
  for (int k = 3; k >= 0; --k) {
    if (x.d[k] != ref.d[k]) return false;
    if (x.d[k] != 1 && x.s[k] != expect) return false;
    expect *= x.d[k];
  }
  return true;
}

template <int OP>
error dispatch(const launch_ctx& c, const kt& out, const kt& a, const kt* b, float scale) {
  const int64_t n = out.numel();
  if (n == 0) return {};
  const int block = 256;
  const unsigned grid = grid_for(n, block, c.sm_count * 16);
  // Vectorised: every tensor of out's dtype and 16-byte aligned; a contiguous
  // like out; b absent, contiguous like out, or a vector over the last dim.
  if (out.t != static_cast<int>(dtype::i32) && contiguous_like(out, out) && aligned16(out.p)) {
    const kt* va = &a;
    const kt* vb = b;
    int bm = -1;
    // f32 same-shape stays on ew_contig_kernel: measured on H200 (2026-11-21),
    // the 8-element f32 chunks (two adjacent float4 per thread) ran add at
    // 3089 GB/s against 3502 for the scalar kernel.
    const bool same_shape_ok = out.t != static_cast<int>(dtype::f32);
    if (va->t == out.t && aligned16(va->p) && contiguous_like(*va, out)) {
      if (!vb) bm = same_shape_ok ? 0 : -1;
      else if (vb->t == out.t && aligned16(vb->p) && contiguous_like(*vb, out)) bm = same_shape_ok ? 1 : -1;
      else if (vb->t == out.t && aligned16(vb->p) && out.d[3] % kChunk == 0 && last_dim_vector(*vb, out)) bm = 2;
    }
    if (bm >= 0) {
      const unsigned vgrid = grid_for((n + kChunk - 1) / kChunk, block, c.sm_count * 16);
      switch (static_cast<dtype>(out.t)) {
        case dtype::f32: launch_vec<OP, float>(c, out, *va, vb, bm, scale, vgrid, block); break;
        case dtype::f16: launch_vec<OP, __half>(c, out, *va, vb, bm, scale, vgrid, block); break;
        default: launch_vec<OP, __nv_bfloat16>(c, out, *va, vb, bm, scale, vgrid, block); break;
      }
      AG_CUDA_TRY_LAUNCH(c.where);
      return {};
    }
  }
  const bool fast = contiguous_like(out, out) && contiguous_like(a, out) && a.t == out.t &&
                    (!b || (contiguous_like(*b, out) && b->t == out.t));
  // Rows of one shape, each contiguous, anywhere in memory (see
  // ew_rows_kernel); all-contiguous f32 stays on ew_contig_kernel (above).
  if (rows_path_on() && !fast && out.t != static_cast<int>(dtype::i32) && rows_vectorisable(out) && rows_like(a, out) &&
      (!b || rows_like(*b, out))) {
    const unsigned rgrid = grid_for(n / kChunk, block, c.sm_count * 16);
    switch (static_cast<dtype>(out.t)) {
      case dtype::f32: launch_rows<OP, float>(c, out, a, b, scale, rgrid, block); break;
      case dtype::f16: launch_rows<OP, __half>(c, out, a, b, scale, rgrid, block); break;
      default: launch_rows<OP, __nv_bfloat16>(c, out, a, b, scale, rgrid, block); break;
    }
    AG_CUDA_TRY_LAUNCH(c.where);
    return {};
  }
  if (fast && out.t != static_cast<int>(dtype::i32)) {
    const void* bp = b ? b->p : nullptr;
    switch (static_cast<dtype>(out.t)) {
      case dtype::f32:
        launch_kernel(c, ew_contig_kernel<OP, float>, grid, block, 0,
            static_cast<float*>(out.p), static_cast<const float*>(a.p), static_cast<const float*>(bp), scale, n);
        break;
      case dtype::f16:
        launch_kernel(c, ew_contig_kernel<OP, __half>, grid, block, 0,
            static_cast<__half*>(out.p), static_cast<const __half*>(a.p), static_cast<const __half*>(bp), scale, n);
        break;
      default:
        launch_kernel(c, ew_contig_kernel<OP, __nv_bfloat16>, grid, block, 0,
            static_cast<__nv_bfloat16*>(out.p), static_cast<const __nv_bfloat16*>(a.p),
            static_cast<const __nv_bfloat16*>(bp), scale, n);
        break;
    }
  } else {
    launch_kernel(c, ew_kernel<OP>, grid, block, 0, out, a, b ? *b : kt{}, scale, n);
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

template <class T>
__global__ void raw_copy_kernel(kt dst, kt src, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const coords c = split(src, i);
    static_cast<T*>(dst.p)[off(dst, c)] = static_cast<const T*>(src.p)[off(src, c)];
  }
}
__global__ void cast_copy_kernel(kt dst, kt src, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const coords c = split(src, i);
    if (dst.t == 3 && src.t == 3) {
      static_cast<int32_t*>(dst.p)[off(dst, c)] = static_cast<const int32_t*>(src.p)[off(src, c)];
    } else {
      st(dst.p, dst.t, off(dst, c), ld(src.p, src.t, off(src, c)));
    }
  }
}

}  // namespace

error launch_elementwise(const launch_ctx& c, ew_op op, const kt& out, const kt& a, const kt* b, float scale) {
  switch (op) {
    case ew_op::add: return dispatch<(int)ew_op::add>(c, out, a, b, scale);
    case ew_op::mul: return dispatch<(int)ew_op::mul>(c, out, a, b, scale);
    case ew_op::scale: return dispatch<(int)ew_op::scale>(c, out, a, b, scale);
    case ew_op::gelu_tanh: return dispatch<(int)ew_op::gelu_tanh>(c, out, a, b, scale);
    case ew_op::gelu_erf: return dispatch<(int)ew_op::gelu_erf>(c, out, a, b, scale);
    case ew_op::silu: return dispatch<(int)ew_op::silu>(c, out, a, b, scale);
    case ew_op::copy: return dispatch<(int)ew_op::copy>(c, out, a, b, scale);
  }
  return error(errc::internal, c.where + ": unknown elementwise op");
}

namespace {

/// Rows of 16-byte words: word w of row r from src[r * spitch + w] to
/// dst[r * dpitch + w] (pitches in words), `total` = rows x words.
__global__ void rows_copy_kernel(uint4* dst, const uint4* src, int64_t total, int64_t words, int64_t dpitch,
                                 int64_t spitch) {
  pdl_enter();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / words, w = i - r * words;
    dst[r * dpitch + w] = src[r * spitch + w];
  }
}

/// A same-dtype copy as at most two levels of contiguous runs: `rows` rows of
/// `width` elements, row r at r * dst_pitch / r * src_pitch (elements).
struct copy_rows {
  int64_t rows, width, dst_pitch, src_pitch;
};

/// dst = src (same dims) as rows of contiguous runs, when the dims collapse
/// so (size-1 dims dropped, neighbours merged where both tensors are
/// contiguous across them); nothing when it takes more than two levels.
std::optional<copy_rows> as_copy_rows(const kt& dst, const kt& src) {
  struct dim {
    int64_t n, ds, ss;
  };
  std::vector<dim> dims;  // outermost first
  for (int i = 0; i < 4; ++i) {
    if (src.d[i] == 1) continue;
    if (!dims.empty() && dims.back().ds == dst.s[i] * src.d[i] && dims.back().ss == src.s[i] * src.d[i]) {
      dims.back() = {dims.back().n * src.d[i], dst.s[i], src.s[i]};  // merge into the inner one
      continue;
    }
    dims.push_back({src.d[i], dst.s[i], src.s[i]});
  }
  if (dims.empty()) return copy_rows{1, 1, 1, 1};
  if (dims.back().ds != 1 || dims.back().ss != 1 || dims.size() > 2) return std::nullopt;
  const int64_t width = dims.back().n;
  if (dims.size() == 1) return copy_rows{1, width, width, width};
  // Rows that overlap (a broadcast source, pitch below the width) are not runs.
  if (dims[0].ds < width || dims[0].ss < width) return std::nullopt;
  return copy_rows{dims[0].n, width, dims[0].ds, dims[0].ss};
}

}  // namespace

namespace {

struct byte_copies_args {
  gpu::byte_copy c[max_batched_copies];
};

// Block row blockIdx.y moves copy blockIdx.y (grid-stride along x).
__global__ void byte_copies_kernel(byte_copies_args a) {
  pdl_enter();  // reads the previous kernel's output, writes what the next one reads
  const gpu::byte_copy c = a.c[blockIdx.y];
  auto* dst = static_cast<unsigned char*>(c.dst);
  const auto* src = static_cast<const unsigned char*>(c.src);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0) {
    for (int64_t w = i; w < c.bytes / 16; w += stride)
      reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(src)[w];
    i += c.bytes / 16 * 16;
  }
  for (; i < c.bytes; i += stride) dst[i] = src[i];
}

}  // namespace

error launch_byte_copies(const launch_ctx& c, const gpu::byte_copy* copies, int count) {
  if (count < 1 || count > max_batched_copies)
    return error(errc::internal, c.where + ": launch_byte_copies takes 1 to " + std::to_string(max_batched_copies) +
                                     " copies, not " + std::to_string(count));
  byte_copies_args a;
  const int block = 256;
  unsigned grid = 1;
  for (int k = 0; k < count; ++k) {
    a.c[k] = copies[k];
    const int64_t n = copies[k].bytes;
    const bool words =
        (reinterpret_cast<uintptr_t>(copies[k].dst) | reinterpret_cast<uintptr_t>(copies[k].src)) % 16 == 0;
    grid = std::max(grid, grid_for(words ? n / 16 + 1 : n, block, c.sm_count * 4));
  }
  launch_kernel(c, byte_copies_kernel, dim3(grid, static_cast<unsigned>(count)), block, 0, a);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

error launch_strided_copy(const launch_ctx& c, const kt& dst, const kt& src) {
  const int64_t n = src.numel();
  if (n == 0) return {};
  // Contiguous runs (a concat of row blocks, a slice of rows, a plain copy)
  // go 16 bytes a thread; the element kernel below divides each index into
  // four coordinates (a 64 MiB concat of bf16 chunks took 220 us on an
  // H200 that way, 45 us as runs). A kernel rather than cudaMemcpy2DAsync,
  // which measured the same on the layer: it stays a kernel node in a
  // replayed graph, like every other op.
  if (dst.t == src.t)
    if (auto r = as_copy_rows(dst, src)) {
      const auto es = static_cast<int64_t>(dtype_size(static_cast<dtype>(src.t)));
      const int64_t row_bytes = r->width * es, dpitch = r->dst_pitch * es, spitch = r->src_pitch * es;
      if (row_bytes % 16 == 0 && dpitch % 16 == 0 && spitch % 16 == 0 &&
          reinterpret_cast<uintptr_t>(dst.p) % 16 == 0 && reinterpret_cast<uintptr_t>(src.p) % 16 == 0) {
        const int64_t words = row_bytes / 16, total = r->rows * words;
        const int block = 256;
        launch_kernel(c, rows_copy_kernel, grid_for(total, block, c.sm_count * 16), block, 0,
            static_cast<uint4*>(dst.p), static_cast<const uint4*>(src.p), total, words, dpitch / 16, spitch / 16);
        AG_CUDA_TRY_LAUNCH(c.where);
        return {};
      }
    }
  const int block = 256;
  const unsigned grid = grid_for(n, block, c.sm_count * 16);
  if (dst.t == src.t) {
    if (dtype_size(static_cast<dtype>(src.t)) == 4)
      launch_kernel(c, raw_copy_kernel<uint32_t>, grid, block, 0, dst, src, n);
    else
      launch_kernel(c, raw_copy_kernel<uint16_t>, grid, block, 0, dst, src, n);
  } else {
    launch_kernel(c, cast_copy_kernel, grid, block, 0, dst, src, n);
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
