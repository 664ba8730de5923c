#include "gpu/cuda/collective.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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

/// out[i] = the sum over the members, in rank order, of this rank's slice of
/// its own operand (own[o * own_pitch + own_begin + r], where i = o * row + r)
/// and the peers' copies of theirs (scratch[j * n_out + i], peers in rank
/// order without this rank), in f32 rounded once: the one-shot's result.
/// V elements (16 bytes) per thread.
template <class T, int V>
__global__ void sum_pieces_kernel(T* out, const T* own, const T* scratch, int members, int rank, int64_t n_out,
                                  int64_t row, int64_t own_pitch, int64_t own_begin) {
  union pack {
    uint4 u;
    T v[V];
  };
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < n_out / V;
       q += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = q * V, o = i / row, r = i % row;
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = 0.f;
    for (int k = 0, j = 0; k < members; ++k) {
      const T* src = k == rank ? own + o * own_pitch + own_begin + r : scratch + (int64_t)(j++) * n_out + i;
      pack p;
      p.u = *reinterpret_cast<const uint4*>(src);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += to_f<T>(p.v[e]);
    }
    pack w;
#pragma unroll
    for (int e = 0; e < V; ++e) w.v[e] = from_f<T>(acc[e]);
    *reinterpret_cast<uint4*>(out + i) = w.u;
  }
}

/// The same, one element per thread, for any dtype (i32 exact, saturated)
/// and any alignment: store_member_sum over each member's element.
__global__ void sum_pieces_scalar_kernel(void* out, int t, const void* own, const void* scratch, int members, int rank,
                                         int64_t n_out, int64_t row, int64_t own_pitch, int64_t own_begin) {
  const int64_t es = t == 0 || t == 3 ? 4 : 2;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_out; i += (int64_t)gridDim.x * blockDim.x) {
    const void* src[max_collective_members];
    for (int k = 0, j = 0; k < members; ++k)
      src[k] = k == rank ? static_cast<const char*>(own) + ((i / row) * own_pitch + own_begin + i % row) * es
                         : static_cast<const char*>(scratch) + ((int64_t)(j++) * n_out + i) * es;
    store_member_sum(out, t, src, members, 0, i);
  }
}

/// AG_CUDA_CE_PROFILE set: each copy (and the sum) of a copy-engine part is
/// timed with events, and the part's times are printed to stderr
/// ("ce_profile" lines) once it ends; the enqueueing thread waits for that.
/// A diagnosis aid (which copy of a part is slow), never on by default.
class ce_profile {
 public:
  explicit ce_profile(const launch_ctx& c) : c_(c), on_(enabled()) { mark("start"); }
  ce_profile(const ce_profile&) = delete;
  ce_profile& operator=(const ce_profile&) = delete;
  void mark(const char* what) {
    if (!on_) return;
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess || cudaEventRecord(e, c_.stream) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    marks_.emplace_back(what, e);
  }
  ~ce_profile() {
    if (!on_ || marks_.empty()) return;
    std::string line = "ce_profile " + c_.where + ":";
    if (cudaEventSynchronize(marks_.back().second) == cudaSuccess)
      for (std::size_t i = 1; i < marks_.size(); ++i) {
        float ms = 0;
        (void)cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second);
        line += std::string(" ") + marks_[i].first + " " + std::to_string(static_cast<int>(1000.0f * ms)) + " us;";
      }
    (void)cudaGetLastError();
    for (auto& m : marks_) (void)cudaEventDestroy(m.second);
    std::fprintf(stderr, "%s\n", line.c_str());
  }

 private:
  static bool enabled() {
    static const bool on = std::getenv("AG_CUDA_CE_PROFILE") != nullptr;
    return on;
  }
  const launch_ctx& c_;
  const bool on_;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
};

/// A reduce_scatter's (or all_reduce's) operands as [outer, axis_len, inner]
/// and this rank's slice, rows [begin, begin + len) of the axis (all_reduce:
/// the whole operand as one row).
struct slice_geometry {
  int64_t outer = 1, axis_len = 1, inner = 1, begin = 0, len = 1;
};
slice_geometry slice_geometry_of(const node& n, const shape& full) {
  slice_geometry g;
  if (n.op != op_kind::reduce_scatter) {
    g.axis_len = g.len = full.numel();
    return g;
  }
  const int axis = n.attrs.axis;
  for (int d = 0; d < axis; ++d) g.outer *= full[d];
  for (int d = axis + 1; d < full.rank(); ++d) g.inner *= full[d];
  g.axis_len = full[axis];
  g.begin = n.attrs.begin;
  g.len = n.attrs.end - n.attrs.begin;
  return g;
}

/// Enqueues `count` peer pulls, pull(i, stream) for i in [0, count): fanned
/// out over `lanes` (pull i on side[i % n] after the fork; c.stream then
/// waits for every side stream used), or one after another on c.stream.
template <class Pull>
error fan_out(const launch_ctx& c, const copy_lanes& lanes, int count, Pull&& pull) {
  if (lanes.n <= 0 || count <= 1) {
    for (int i = 0; i < count; ++i)
      if (error e = pull(i, c.stream)) return e;
    return {};
  }
  const int used = std::min(count, lanes.n);
  AG_CUDA_TRY(cudaEventRecord(lanes.fork, c.stream), c.where + " fork of the pulls");
  for (int s = 0; s < used; ++s)
    AG_CUDA_TRY(cudaStreamWaitEvent(lanes.side[s], lanes.fork, 0), c.where + " fork of the pulls");
  for (int i = 0; i < count; ++i)
    if (error e = pull(i, lanes.side[i % lanes.n])) return e;
  for (int s = 0; s < used; ++s) {
    AG_CUDA_TRY(cudaEventRecord(lanes.join[s], lanes.side[s]), c.where + " join of the pulls");
    AG_CUDA_TRY(cudaStreamWaitEvent(c.stream, lanes.join[s], 0), c.where + " join of the pulls");
  }
  return {};
}

/// all_gather: one strided copy per member of its operand into this rank's
/// output (the parts of each outer row in rank order). Peer copies run on
/// the copy engines, fanned out over `lanes`.
error enqueue_gather_copies(const launch_ctx& c, const collective_launch& l, const copy_lanes& lanes = {}) {
  const node& n = *l.op;
  const std::size_t es = dtype_size(n.type);
  const int members = static_cast<int>(l.inputs.size());
  // Each operand as [outer, part]: rows of the output are the parts in rank order.
  int64_t outer = 1;
  for (int d = 0; d < n.attrs.axis; ++d) outer *= n.dims[d];
  const int64_t row = n.dims.numel() / outer;
  std::vector<int64_t> at(static_cast<std::size_t>(members) + 1, 0);
  for (int k = 0; k < members; ++k)
    at[static_cast<std::size_t>(k) + 1] =
        at[static_cast<std::size_t>(k)] + l.inputs[static_cast<std::size_t>(k)].dims.numel() / outer;
  // This rank's own part first, then the peers from the next rank on. The
  // own part is a copy within the GPU, which runs on its SMs: beside a GEMM
  // it took 20x its time alone (scripts/cuda-experiments/copy_beside_gemm.cu),
  // and the part starts when this rank's piece is made, when the compute
  // lane has nothing else ready (it waits for this gather). Peer pulls run
  // on the copy engines at their speed beside GEMMs; starting each member
  // at the next rank, members gathering at once read different peers at
  // each step instead of all reading rank 0 first.
  const int me = l.rank >= 0 && l.rank < members ? l.rank : 0;
  const auto copy_part = [&](int k, cudaStream_t s) -> error {
    const int64_t part = at[static_cast<std::size_t>(k) + 1] - at[static_cast<std::size_t>(k)];
    if (part > 0)
      AG_CUDA_TRY(cudaMemcpy2DAsync(static_cast<std::byte*>(l.out.data) + at[static_cast<std::size_t>(k)] * es,
                                    row * es, l.inputs[static_cast<std::size_t>(k)].data, part * es, part * es,
                                    static_cast<std::size_t>(outer), cudaMemcpyDefault, s),
                  c.where + " all_gather part of rank " + std::to_string(k));
    return {};
  };
  ce_profile prof(c);
  if (error e = copy_part(me, c.stream)) return e;
  prof.mark("own");
  const auto pull = [&](int i, cudaStream_t s) { return copy_part((me + 1 + i) % members, s); };
  if (error e = fan_out(c, lanes, members - 1, pull)) return e;
  prof.mark("pulls");
  return {};
}

}  // namespace

error launch_collective(const launch_ctx& c, const collective_launch& l) {
  const node& n = *l.op;
  const int members = static_cast<int>(l.inputs.size());
  if (members < 1 || members > max_collective_members)
    return error(errc::unsupported_op, c.where + ": " + std::to_string(members) + " members (at most " +
                                           std::to_string(max_collective_members) + ")");
  if (n.op == op_kind::all_gather) return enqueue_gather_copies(c, l);
  members_arg in{};
  in.n = members;
  for (int k = 0; k < members; ++k) in.p[k] = l.inputs[static_cast<std::size_t>(k)].data;
  const slice_geometry g = slice_geometry_of(n, l.inputs[0].dims);
  const int64_t n_out = n.dims.numel();
  if (n_out == 0) return {};
  const int block = 256;
  reduce_kernel<<<grid_for(n_out, block, c.sm_count * 8), block, 0, c.stream>>>(
      l.out.data, static_cast<int>(n.type), in, g.len, g.inner, g.axis_len, g.begin, n_out);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

int64_t copy_engine_scratch_bytes(const collective_launch& l) {
  if (l.op->op != op_kind::reduce_scatter || l.inputs.size() < 2) return 0;
  return static_cast<int64_t>(l.inputs.size() - 1) * l.op->dims.numel() * static_cast<int64_t>(dtype_size(l.op->type));
}

error launch_copy_engine_collective(const launch_ctx& c, const collective_launch& l, void* scratch,
                                    const copy_lanes& lanes) {
  const node& n = *l.op;
  const int members = static_cast<int>(l.inputs.size());
  if (members < 1 || members > max_collective_members || l.rank < 0 || l.rank >= members)
    return error(errc::unsupported_op, c.where + ": " + std::to_string(members) + " members, rank " +
                                           std::to_string(l.rank) + " (at most " +
                                           std::to_string(max_collective_members) + " members)");
  if (n.op == op_kind::all_gather) return enqueue_gather_copies(c, l, lanes);
  if (n.op != op_kind::reduce_scatter)
    return error(errc::unsupported_op, c.where + ": the copy-engine path runs reduce_scatter and all_gather only");
  const int64_t n_out = n.dims.numel();
  if (n_out == 0) return {};
  if (members > 1 && !scratch) return error(errc::invalid_argument, c.where + ": no scratch for the peers' pieces");
  const slice_geometry g = slice_geometry_of(n, l.inputs[0].dims);
  const int64_t outer = g.outer, row = g.len * g.inner, own_pitch = g.axis_len * g.inner, own_begin = g.begin * g.inner;
  const auto es = static_cast<int64_t>(dtype_size(n.type));
  // 1. Pull each peer's slice with a strided peer copy, from the next rank
  //    on (members pulling at once read different peers at each step);
  //    scratch holds them in rank order.
  ce_profile prof(c);
  const auto pull = [&](int i, cudaStream_t s) -> error {
    const int k = (l.rank + 1 + i) % members;
    const int64_t j = k < l.rank ? k : k - 1;
    AG_CUDA_TRY(cudaMemcpy2DAsync(static_cast<std::byte*>(scratch) + j * n_out * es,
                                  static_cast<size_t>(row * es),
                                  static_cast<const std::byte*>(l.inputs[static_cast<std::size_t>(k)].data) +
                                      own_begin * es,
                                  static_cast<size_t>(own_pitch * es), static_cast<size_t>(row * es),
                                  static_cast<size_t>(outer), cudaMemcpyDefault, s),
                c.where + " pull of rank " + std::to_string(k) + "'s piece");
    return {};
  };
  if (error e = fan_out(c, lanes, members - 1, pull)) return e;
  prof.mark("pulls");
  // 2. Sum them with this rank's own slice.
  const void* own = l.inputs[static_cast<std::size_t>(l.rank)].data;
  const int block = 256;
  const int t = static_cast<int>(n.type);
  const int vec = n.type == dtype::f32 ? 4 : 8;
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vectorised = n.type != dtype::i32 && row % vec == 0 && own_pitch % vec == 0 && own_begin % vec == 0 &&
                          aligned(own) && aligned(scratch) && aligned(l.out.data);
  const unsigned grid = grid_for(vectorised ? n_out / vec : n_out, block, c.sm_count * 8);
  if (!vectorised)
    sum_pieces_scalar_kernel<<<grid, block, 0, c.stream>>>(l.out.data, t, own, scratch, members, l.rank, n_out, row,
                                                           own_pitch, own_begin);
  else if (n.type == dtype::f32)
    sum_pieces_kernel<float, 4><<<grid, block, 0, c.stream>>>(static_cast<float*>(l.out.data),
                                                              static_cast<const float*>(own),
                                                              static_cast<const float*>(scratch), members, l.rank,
                                                              n_out, row, own_pitch, own_begin);
  else if (n.type == dtype::f16)
    sum_pieces_kernel<__half, 8><<<grid, block, 0, c.stream>>>(static_cast<__half*>(l.out.data),
                                                               static_cast<const __half*>(own),
                                                               static_cast<const __half*>(scratch), members, l.rank,
                                                               n_out, row, own_pitch, own_begin);
  else
    sum_pieces_kernel<__nv_bfloat16, 8><<<grid, block, 0, c.stream>>>(
        static_cast<__nv_bfloat16*>(l.out.data), static_cast<const __nv_bfloat16*>(own),
        static_cast<const __nv_bfloat16*>(scratch), members, l.rank, n_out, row, own_pitch, own_begin);
  AG_CUDA_TRY_LAUNCH(c.where);
  prof.mark("sum");
  return {};
}

}  // namespace ag::gpu::cuda
