#include "gpu/cpu/cpu_device.hpp"

#include "gpu/cpu/thread_team.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "gpu/host/host_device.hpp"

// OpenBLAS's thread-count knob, when the BLAS in use is OpenBLAS (weak: a
// plain reference BLAS, as on the GPU machines, does not have it).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace ag::gpu::cpu {

namespace {

class cpu_device final : public host::host_device {
 public:
  cpu_device(device_spec spec, int index, int threads, int parts)
      : host_device(std::move(spec), index, config(threads, parts)) {}

 private:
  static host::host_device_config config(int threads, int parts) {
    host::host_device_config c;
    c.ring_collectives = true;  // large collectives as a ring (gpu/cpu/ring.hpp)
    c.kernel_threads = threads;
    c.kernel_parts = parts;
    return c;
  }
};

}  // namespace

device_spec default_cpu_spec(int ordinal) {
  device_spec s;
  s.name = "cpu" + std::to_string(ordinal);
  s.kind = device_kind::cpu;
  s.ordinal = ordinal;
  s.flops_f32 = 100e9;
  s.flops_bf16 = 50e9;  // converted to f32 first: slower than f32
  s.mem_bandwidth = 20e9;
  s.mem_bytes = default_capacity;
  s.launch_latency = 2e-6;
  s.link_bandwidth = 10e9;
  s.link_latency = 2e-6;
  s.host_bandwidth = 10e9;
  s.host_latency = 2e-6;
  s.copy_engines = 2;
  s.max_lanes = 2;
  return s;
}

int cpu_threads_for(const backend_options& options, int cpu_devices) {
  if (options.cpu_threads_per_stream > 0) return options.cpu_threads_per_stream;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, hardware / std::max(1, cpu_devices));
}

device_ptr make_cpu_device(device_spec spec, int index, const backend_options& options, int cpu_devices) {
  spec.kind = device_kind::cpu;
  if (options.cpu_oneshot_max_bytes >= 0) spec.oneshot_max_bytes = options.cpu_oneshot_max_bytes;
  const int threads = cpu_threads_for(options, cpu_devices);
  // BLAS runs single-threaded: each stream is a thread, and a product's
  // blocks go over the stream's helpers (gemm_f32), so every thread is the
  // team's. OpenBLAS's own threads spun between its calls and slowed the
  // kernels running then by a third on two cores (docs/BENCHMARKS.md,
  // session 60). The setting is process-wide; OPENBLAS_NUM_THREADS, where
  // the environment sets it, is left as the user's word.
  static std::once_flag blas_threads;
  std::call_once(blas_threads, [] {
    if (openblas_set_num_threads && !std::getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
  });
  // The cut of a large f32 product: this device's share of the machine
  // (what its kernels get by default), whatever threads they are given. On
  // `cpu:2 --tp 2` of two cores each device's one-row products stay whole:
  // cut in two on one thread they took 7% longer (session 60).
  const int parts = std::max(1, machine_parts() / std::max(1, cpu_devices));
  return std::make_shared<cpu_device>(std::move(spec), index, threads, parts);
}

}  // namespace ag::gpu::cpu
