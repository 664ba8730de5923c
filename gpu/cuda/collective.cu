#include "gpu/cuda/collective.cuh"
#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

struct members_arg {
  const void* p[max_collective_members];
  int n;
};

/// out[o, r, i] = sum_k in_k[o, begin + r, i] over [outer, len, inner] of
/// operands shaped [outer, axis_len, inner] (all_reduce: outer = inner = 1).
__global__ void reduce_kernel(void* out, int t, members_arg in, int64_t len, int64_t inner, int64_t axis_len,
                              int64_t begin, int64_t n_out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_out; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t o = i / (len * inner), rem = i % (len * inner);
    const int64_t src = (o * axis_len + begin + rem / inner) * inner + rem % inner;
    store_member_sum(out, t, in.p, in.n, src, i);
  }
}

}  // namespace

error launch_collective(const launch_ctx& c, const collective_launch& l) {
  const node& n = *l.op;
  const int members = static_cast<int>(l.inputs.size());
  if (members < 1 || members > max_collective_members)
    return error(errc::unsupported_op, c.where + ": " + std::to_string(members) + " members (at most " +
                                           std::to_string(max_collective_members) + ")");
  const std::size_t es = dtype_size(n.type);
  if (n.op == op_kind::all_gather) {
    // Each operand as [outer, part]: rows of the output are the parts in rank order.
    int64_t outer = 1;
    for (int d = 0; d < n.attrs.axis; ++d) outer *= n.dims[d];
    const int64_t row = n.dims.numel() / outer;
    int64_t at = 0;
    for (int k = 0; k < members; ++k) {
      const int64_t part = l.inputs[static_cast<std::size_t>(k)].dims.numel() / outer;
      if (part > 0)
        AG_CUDA_TRY(cudaMemcpy2DAsync(static_cast<std::byte*>(l.out.data) + at * es, row * es,
                                      l.inputs[static_cast<std::size_t>(k)].data, part * es, part * es,
                                      static_cast<std::size_t>(outer), cudaMemcpyDefault, c.stream),
                    c.where + " all_gather part of rank " + std::to_string(k));
      at += part;
    }
    return {};
  }
  members_arg in{};
  in.n = members;
  for (int k = 0; k < members; ++k) in.p[k] = l.inputs[static_cast<std::size_t>(k)].data;
  const shape& full = l.inputs[0].dims;
  int64_t len = full.numel(), inner = 1, axis_len = full.numel(), begin = 0;
  if (n.op == op_kind::reduce_scatter) {
    const int axis = n.attrs.axis;
    inner = 1;
    for (int d = axis + 1; d < full.rank(); ++d) inner *= full[d];
    len = n.attrs.end - n.attrs.begin;
    axis_len = full[axis];
    begin = n.attrs.begin;
  }
  const int64_t n_out = n.dims.numel();
  if (n_out == 0) return {};
  const int block = 256;
  reduce_kernel<<<grid_for(n_out, block, c.sm_count * 8), block, 0, c.stream>>>(
      l.out.data, static_cast<int>(n.type), in, len, inner, axis_len, begin, n_out);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
