// The process's pool of pinned host buffers (cuda_backend.hpp,
// pinned_host_memory()): a caching_host_memory over cudaHostAlloc /
// cudaFreeHost. Created on first use and never destroyed, because
// host_tensors holding its buffers may outlive every runtime and be destroyed
// during static destruction; cached buffers are freed by the driver at exit.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/slow_call.hpp"
#include "gpu/host/caching_host_memory.hpp"

namespace ag::gpu::cuda {
namespace {

/// Every job output is pinned, however small: a pageable output is copied
/// through staging and a stream-ordered host function (staging.hpp), whose
/// wake-up held a 16 KiB output copy for 95-105 us of an H100's timeline,
/// more than the rest of a tiny job; a pinned one is one DMA. The price is at
/// least a page of locked memory per cached buffer.
constexpr std::size_t min_pinned_bytes = 1;
constexpr int64_t default_cache_limit = int64_t{4} << 30;

host::caching_host_memory& pool() {
  static auto* p = new host::caching_host_memory(
      "cuda pinned",
      [](std::size_t n, std::string& why) -> void* {
        void* q = nullptr;
        static const std::string who = "cuda pinned pool";
        detail::slow_call probe(who, "cudaHostAlloc");
        // Portable: every device's copy engines use it directly.
        const cudaError_t r = cudaHostAlloc(&q, n, cudaHostAllocPortable);
        if (r == cudaSuccess) return q;
        why = cuda_message(r, "cudaHostAlloc", __FILE__, __LINE__);
        (void)cudaGetLastError();
        return nullptr;
      },
      [](void* q, std::size_t) { AG_CUDA_ASSERT(cudaFreeHost(q)); }, min_pinned_bytes, default_cache_limit);
  return *p;
}

}  // namespace

host_memory_resource& pinned_host_memory() noexcept { return pool(); }

bool in_pinned_pool(const void* p) { return pool().contains(p); }

host::host_cache_stats pinned_host_pool_stats() { return pool().stats(); }

}  // namespace ag::gpu::cuda
