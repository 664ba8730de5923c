#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/elementwise.cuh"

namespace ag::gpu::cuda {
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
  const bool fast = contiguous_like(out, out) && contiguous_like(a, out) && a.t == out.t &&
                    (!b || (contiguous_like(*b, out) && b->t == out.t));
  if (fast && out.t != static_cast<int>(dtype::i32)) {
    const void* bp = b ? b->p : nullptr;
    switch (static_cast<dtype>(out.t)) {
      case dtype::f32:
        ew_contig_kernel<OP, float><<<grid, block, 0, c.stream>>>(
            static_cast<float*>(out.p), static_cast<const float*>(a.p), static_cast<const float*>(bp), scale, n);
        break;
      case dtype::f16:
        ew_contig_kernel<OP, __half><<<grid, block, 0, c.stream>>>(
            static_cast<__half*>(out.p), static_cast<const __half*>(a.p), static_cast<const __half*>(bp), scale, n);
        break;
      default:
        ew_contig_kernel<OP, __nv_bfloat16><<<grid, block, 0, c.stream>>>(
            static_cast<__nv_bfloat16*>(out.p), static_cast<const __nv_bfloat16*>(a.p),
            static_cast<const __nv_bfloat16*>(bp), scale, n);
        break;
    }
  } else {
    ew_kernel<OP><<<grid, block, 0, c.stream>>>(out, a, b ? *b : kt{}, scale, n);
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

template <class T>
__global__ void raw_copy_kernel(kt dst, kt src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const coords c = split(src, i);
    static_cast<T*>(dst.p)[off(dst, c)] = static_cast<const T*>(src.p)[off(src, c)];
  }
}
__global__ void cast_copy_kernel(kt dst, kt src, int64_t n) {
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

error launch_strided_copy(const launch_ctx& c, const kt& dst, const kt& src) {
  const int64_t n = src.numel();
  if (n == 0) return {};
  const int block = 256;
  const unsigned grid = grid_for(n, block, c.sm_count * 16);
  if (dst.t == src.t) {
    if (dtype_size(static_cast<dtype>(src.t)) == 4)
      raw_copy_kernel<uint32_t><<<grid, block, 0, c.stream>>>(dst, src, n);
    else
      raw_copy_kernel<uint16_t><<<grid, block, 0, c.stream>>>(dst, src, n);
  } else {
    cast_copy_kernel<<<grid, block, 0, c.stream>>>(dst, src, n);
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
