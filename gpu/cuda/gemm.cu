#include <vector>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/gemm.cuh"
#include "gpu/cuda/gemv.cuh"

namespace ag::gpu::cuda {

const char* cublas_status_name(cublasStatus_t s) noexcept { return cublasGetStatusName(s); }

namespace {

cudaDataType_t cuda_type(dtype t) {
  switch (t) {
    case dtype::f16: return CUDA_R_16F;
    case dtype::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// One operand in cuBLAS terms.
struct operand {
  const void* p = nullptr;
  int64_t ld = 0;
  int64_t bstride[2] = {0, 0};  // per output batch dim (0 = broadcast)
  bool flip = false;            // stored transposed (unit stride on rows)
};

// Describes a kt's last two dims [r, c] for cuBLAS; false when neither dim has
// a unit stride (the caller copies it to a contiguous buffer first).
bool describe(const kt& x, operand& o) {
  const int64_t r = x.d[2], c = x.d[3], sr = x.s[2], sc = x.s[3];
  if ((c == 1 || sc == 1) && (r == 1 || sr >= c)) {
    o.flip = false;
    o.ld = r == 1 ? (c < 1 ? 1 : c) : sr;
    if (o.ld < c) o.ld = c;
    return true;
  }
  if ((r == 1 || sr == 1) && (c == 1 || sc >= r)) {
    o.flip = true;
    o.ld = c == 1 ? (r < 1 ? 1 : r) : sc;
    if (o.ld < r) o.ld = r;
    return true;
  }
  return false;
}

#define AG_CUBLAS_TRY(call)                                                                           \
  do {                                                                                                \
    cublasStatus_t st_ = (call);                                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      return error(errc::op_failed, c.where + ": " #call " failed: " + cublas_status_name(st_) + " at " + \
                                        __FILE__ + ":" + std::to_string(__LINE__));                   \
  } while (0)

}  // namespace

error launch_matmul(const launch_ctx& c, cublasHandle_t h, const tensor_arg& out_arg, const tensor_arg& a_arg,
                    const tensor_arg& b_arg, bool trans_a, bool trans_b, bool tf32) {
  if (a_arg.type != b_arg.type)
    return error(errc::dtype_mismatch, c.where + ": matmul inputs must share a dtype (" + to_string(a_arg.type) +
                                           " vs " + to_string(b_arg.type) + ")");
  if (a_arg.type == dtype::i32) return error(errc::dtype_mismatch, c.where + ": matmul of i32 is not supported");
  if (out_arg.type != a_arg.type && out_arg.type != dtype::f32)
    return error(errc::dtype_mismatch, c.where + ": matmul output must be " + to_string(a_arg.type) + " or f32");
  if (a_arg.dims.rank() < 2 || b_arg.dims.rank() < 2 || out_arg.dims.rank() < 2)
    return error(errc::invalid_shape, c.where + ": matmul needs rank >= 2");

  kt a = to_kt(a_arg), b = to_kt(b_arg), o = to_kt(out_arg);
  const int64_t M = o.d[2], N = o.d[3];
  const int64_t K = trans_a ? a.d[2] : a.d[3];
  if ((trans_a ? a.d[3] : a.d[2]) != M || (trans_b ? b.d[3] : b.d[2]) != K || (trans_b ? b.d[2] : b.d[3]) != N)
    return error(errc::invalid_shape, c.where + ": matmul dims do not fit: a " + a_arg.dims.to_string() + ", b " +
                                          b_arg.dims.to_string() + ", out " + out_arg.dims.to_string());
  if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff)
    return error(errc::invalid_shape, c.where + ": matmul dims exceed cuBLAS's int range");
  if (M == 0 || N == 0) return {};
  for (int k = 0; k < 2; ++k) {
    if ((a.d[k] != 1 && a.d[k] != o.d[k]) || (b.d[k] != 1 && b.d[k] != o.d[k]))
      return error(errc::invalid_shape, c.where + ": matmul batch dims do not broadcast: a " + a_arg.dims.to_string() +
                                            ", b " + b_arg.dims.to_string() + ", out " + out_arg.dims.to_string());
  }
  if (!is_contiguous(out_arg.dims, out_arg.stride))
    return error(errc::invalid_argument, c.where + ": matmul output must be contiguous");
  if (c.gemv) {
    error gemv_err;
    if (try_launch_gemv(c, o, a, b, trans_a, trans_b, gemv_err)) return gemv_err;
  }

  // Scratch copies for operands without a unit stride (rare: general strided views).
  std::vector<void*> scratch;
  auto cleanup = [&] {
    for (void* p : scratch) AG_CUDA_ASSERT(cudaFreeAsync(p, c.stream));
  };
  operand A, B;
  auto prepare = [&](kt& x, operand& op) -> error {
    if (!describe(x, op)) {
      const int64_t bytes = x.numel() * static_cast<int64_t>(dtype_size(static_cast<dtype>(x.t)));
      void* p = nullptr;
      AG_CUDA_TRY(cudaMallocAsync(&p, static_cast<size_t>(bytes), c.stream), c.where);
      scratch.push_back(p);
      kt dst = x;
      dst.p = p;
      int64_t s = 1;
      for (int k = 3; k >= 0; --k) {
        dst.s[k] = x.d[k] == 1 ? 0 : s;
        s *= x.d[k];
      }
      if (error e = launch_strided_copy(c, dst, x)) return e;
      x = dst;
      describe(x, op);
    }
    op.p = x.p;
    op.bstride[0] = x.s[0];
    op.bstride[1] = x.s[1];
    return {};
  };
  if (error e = prepare(a, A)) { cleanup(); return e; }
  if (error e = prepare(b, B)) { cleanup(); return e; }

  const cublasOperation_t opA = (trans_a != A.flip) ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = (trans_b != B.flip) ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t ti = cuda_type(a_arg.type), to = cuda_type(out_arg.type);
  const cublasComputeType_t ct =
      a_arg.type == dtype::f32 ? (tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
  const float alpha = 1.f, beta = 0.f;
  const int64_t esz_i = static_cast<int64_t>(dtype_size(a_arg.type));
  const int64_t esz_o = static_cast<int64_t>(dtype_size(out_arg.type));
  const int64_t ostride1 = M * N, ostride0 = o.d[1] * M * N;

  // Collapse both batch dims into one strided batch when every operand allows it.
  auto collapsible = [&](const operand& x) { return o.d[0] == 1 || o.d[1] == 1 || x.bstride[0] == o.d[1] * x.bstride[1]; };
  error result;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (collapsible(A) && collapsible(B)) {
    const int64_t batch = o.d[0] * o.d[1];
    const int64_t sa = o.d[1] == 1 ? A.bstride[0] : A.bstride[1];
    const int64_t sb = o.d[1] == 1 ? B.bstride[0] : B.bstride[1];
    st = cublasGemmStridedBatchedEx(h, opB, opA, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
                                    B.p, ti, static_cast<int>(B.ld), sb, A.p, ti, static_cast<int>(A.ld), sa, &beta,
                                    out_arg.data, to, static_cast<int>(N), ostride1, static_cast<int>(batch), ct,
                                    CUBLAS_GEMM_DEFAULT);
  } else if (o.d[0] > o.d[1]) {
    // One strided batch over the outer dim per index of the inner one: fewer
    // calls (e.g. attention over [B, H] heads of a permuted [B, S, H, Dh] view
    // with B > H).
    for (int64_t i1 = 0; i1 < o.d[1] && st == CUBLAS_STATUS_SUCCESS; ++i1) {
      const char* ap = static_cast<const char*>(A.p) + i1 * A.bstride[1] * esz_i;
      const char* bp = static_cast<const char*>(B.p) + i1 * B.bstride[1] * esz_i;
      char* op = static_cast<char*>(out_arg.data) + i1 * ostride1 * esz_o;
      st = cublasGemmStridedBatchedEx(h, opB, opA, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                                      &alpha, bp, ti, static_cast<int>(B.ld), B.bstride[0], ap, ti,
                                      static_cast<int>(A.ld), A.bstride[0], &beta, op, to, static_cast<int>(N),
                                      ostride0, static_cast<int>(o.d[0]), ct, CUBLAS_GEMM_DEFAULT);
    }
  } else {
    for (int64_t i0 = 0; i0 < o.d[0] && st == CUBLAS_STATUS_SUCCESS; ++i0) {
      const char* ap = static_cast<const char*>(A.p) + i0 * A.bstride[0] * esz_i;
      const char* bp = static_cast<const char*>(B.p) + i0 * B.bstride[0] * esz_i;
      char* op = static_cast<char*>(out_arg.data) + i0 * ostride0 * esz_o;
      st = cublasGemmStridedBatchedEx(h, opB, opA, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                                      &alpha, bp, ti, static_cast<int>(B.ld), B.bstride[1], ap, ti,
                                      static_cast<int>(A.ld), A.bstride[1], &beta, op, to, static_cast<int>(N),
                                      ostride1, static_cast<int>(o.d[1]), ct, CUBLAS_GEMM_DEFAULT);
    }
  }
  if (st != CUBLAS_STATUS_SUCCESS)
    result = error(errc::op_failed, c.where + ": cublasGemmStridedBatchedEx failed: " + cublas_status_name(st));
  else if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    result = cuda_error(e, c.where, "cublasGemmStridedBatchedEx", __FILE__, __LINE__);
  cleanup();
  return result;
}

}  // namespace ag::gpu::cuda
