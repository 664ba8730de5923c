// Enumeration and the factory of CUDA devices (cuda_backend.hpp): device
// count, the device spec read from the hardware, peer access.

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu/collective_path.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/cuda_device.hpp"
#include "gpu/cuda/device_core.hpp"
#include "gpu/cuda/device_guard.hpp"
#include "gpu/cuda/event_poller.hpp"
#include "gpu/cuda/kernel_preload.hpp"

namespace ag::gpu::cuda {
namespace {

using namespace detail;

int attr(cudaDeviceAttr a, int ordinal) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, a, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

expected<device_ptr> make_one(int ordinal, int index, const backend_options& opts, int repeat) {
  device_guard g(ordinal);
  cudaDeviceProp prop{};
  AG_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal), "cuda" + std::to_string(ordinal));
  device_spec spec;
  spec.name = "cuda" + std::to_string(ordinal) + (repeat > 0 ? "." + std::to_string(repeat) : std::string{});
  spec.kind = device_kind::cuda;
  spec.ordinal = ordinal;
  const double sms = prop.multiProcessorCount;
  const double clock_hz = attr(cudaDevAttrClockRate, ordinal) * 1e3;            // kHz
  const double mem_clock_hz = attr(cudaDevAttrMemoryClockRate, ordinal) * 1e3;  // kHz
  const double bus_bits = attr(cudaDevAttrGlobalMemoryBusWidth, ordinal);
  // FP32: 128 lanes x FMA (2 flops) per SM per clock on sm_80+/sm_90.
  // Dense bf16 tensor cores: 4096 flops per SM per clock on sm_90 (H100 SXM:
  // 132 SMs x 1.83 GHz x 4096 = 989 TFLOP/s); 2048 on sm_80; 1024 before.
  const double tc_per_sm = prop.major >= 9 ? 4096 : prop.major == 8 ? 2048 : 1024;
  if (sms > 0 && clock_hz > 0) {
    spec.flops_f32 = sms * clock_hz * 256.0;
    spec.flops_bf16 = sms * clock_hz * tc_per_sm;
  }
  if (mem_clock_hz > 0 && bus_bits > 0) spec.mem_bandwidth = 2.0 * mem_clock_hz * bus_bits / 8.0;  // DDR
  // What kernels reach of those peaks, measured on an H100 SXM (2026-11-25,
  // PyTorch 2.11 + cuBLAS, docs/BENCHMARKS.md): bf16 GEMMs of a d-8192
  // layer's shapes 763-813 of the 1070 TFLOP/s the formula gives at the
  // 1980 MHz boost clock (0.76); a 256 MiB device copy 2.98 and a bf16 silu
  // 2.77 of 3.35 TB/s (0.86). With the peaks alone, the sim predicted that
  // layer at 0.75 of its measured time (actorgraph-tp-bench's sim_error_1gpu).
  spec.compute_efficiency = 0.76;
  spec.memory_efficiency = 0.86;
  // What moving data between two GPUs reaches on H100 SXM NVLink (2026-11-27,
  // docs/BENCHMARKS.md session 18): a 16 MiB copy-engine peer pull 266-294
  // GB/s, NCCL's 64 MiB all-reduce at degree 2 a bus bandwidth of 266 GB/s;
  // the link's 450 GB/s one way is not reached. Other interconnects (PCIe)
  // are slower and would need their own figure.
  spec.link_bandwidth = 270e9;
  spec.mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  spec.copy_engines = std::max(1, prop.asyncEngineCount);
  // The planner's ring/one-shot pick (describe, trace) names the path the
  // backend runs: NCCL from the crossover on, when the build has NCCL.
  spec.oneshot_max_bytes = nccl_built() ? opts.cuda_nccl_min_bytes - 1 : std::numeric_limits<int64_t>::max();
  spec.oneshot_max_bytes_wide = nccl_built() ? opts.cuda_nccl_min_bytes_wide - 1 : std::numeric_limits<int64_t>::max();
  spec.in_stream_max_bytes = opts.cuda_in_stream_max_bytes;
  // A GEMM's full grid starves NCCL's kernels beside it (device_spec); the
  // copy engines need no SM.
  spec.collectives_overlap_compute = false;
  spec.copy_engine_collectives = opts.cuda_copy_engine_collectives;
  spec.sequence_parallel_min_bytes = opts.cuda_sequence_parallel_min_bytes;
  spec.gemm_row_tile = 128;  // cuBLAS's bf16 tiles on sm_90 are 64 or 128 rows
  spec.gemm_sms = prop.multiProcessorCount;  // a wave of tiles a time (device_spec::gemm_sms)
  spec.max_overlap_chunks = 2;

  auto c = std::make_shared<core>(ordinal, spec.name);
  c->index = index;
  if (error e = c->clock.calibrate()) return e;
  c->poll = std::make_shared<poller>(ordinal, spec.name);
  std::weak_ptr<core> weak = c;
  c->poll->on_death = [weak](const error& e) {
    if (auto cc = weak.lock()) cc->mark_dead(e);
  };
  c->poll->start(c->poll);
  return make_device(std::move(c), std::move(spec), index, opts, prop.multiProcessorCount, prop.major);
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

expected<std::vector<device_ptr>> make_cuda_devices(const std::vector<int>& ordinals, const backend_options& options,
                                                    int first_index) {
  const int count = device_count();
  if (count <= 0) return error(errc::bad_device_spec, "no usable CUDA GPU (cudaGetDeviceCount found none)");
  std::vector<int> ords = ordinals;
  if (ords.empty())
    for (int i = 0; i < count; ++i) ords.push_back(i);
  for (std::size_t i = 0; i < ords.size(); ++i)
    if (ords[i] < 0 || ords[i] >= count)
      return error(errc::bad_device_spec, "CUDA ordinal " + std::to_string(ords[i]) + " out of range (" +
                                              std::to_string(count) + " GPUs)");
  std::vector<device_ptr> out;
  for (std::size_t i = 0; i < ords.size(); ++i) {
    // A repeated ordinal is another logical device of the same GPU (its own
    // streams, events and poller; the GPU's memory is shared): "cuda0.1".
    int repeat = 0;
    for (std::size_t j = 0; j < i; ++j) repeat += ords[j] == ords[i];
    auto d = make_one(ords[i], first_index + static_cast<int>(i), options, repeat);
    if (!d) {
      error e = d.err();
      if (e.code != errc::out_of_memory) e.code = errc::device_failed;
      return e;
    }
    out.push_back(std::move(*d));
  }
  // Every own kernel loaded now, once per GPU (kernel_preload.hpp): no lazy
  // load, which may synchronise the context, while a job runs.
  if (options.cuda_preload_kernels) {
    std::vector<int> done;
    for (std::size_t i = 0; i < ords.size(); ++i) {
      if (std::find(done.begin(), done.end(), ords[i]) != done.end()) continue;
      done.push_back(ords[i]);
      device_guard g(ords[i]);
      if (error e = preload_kernels(out[i]->spec().name)) return e;
    }
  }
  // Peer access both ways between every pair that allows it (copies between
  // others still work: the driver stages them through the host).
  for (int a : ords) {
    device_guard g(a);
    for (int b : ords) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) (void)cudaGetLastError();
      if (!can) continue;
      const cudaError_t r = cudaDeviceEnablePeerAccess(b, 0);
      if (r != cudaSuccess && r != cudaErrorPeerAccessAlreadyEnabled) AG_CUDA_LOG(r);
      (void)cudaGetLastError();
    }
  }
  return out;
}

}  // namespace ag::gpu::cuda
