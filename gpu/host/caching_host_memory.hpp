#pragma once
/// \file caching_host_memory.hpp
/// A host_memory_resource that caches the buffers it gets from an expensive
/// allocator (the CUDA backend's: cudaHostAlloc, which pins and faults in every
/// page, about a millisecond per 16 MiB, and cudaFreeHost, which may
/// synchronise the device). A buffer given back is kept and handed out again to
/// a request of about its size (at most 1.5x + 64 KiB larger). Requests below
/// `min_bytes` come from the heap, as do all requests once the raw allocator
/// fails (reported once on stderr).
///
/// Thread-safe (one mutex; the raw allocator and free run outside it), which is
/// why it lives here and not beside host_memory_resource in graph/ (no
/// threads there). The object must outlive every buffer it handed out: the
/// CUDA backend's instance is never destroyed (host_tensors may be destroyed
/// during static destruction).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "graph/host_tensor.hpp"

namespace ag::gpu::host {

/// Counters of a caching_host_memory (tests, benchmarks).
struct host_cache_stats {
  int64_t live_bytes = 0;      ///< raw-allocated bytes held by users now
  int64_t cached_bytes = 0;    ///< raw-allocated bytes kept for reuse
  int64_t raw_allocations = 0; ///< calls of the raw allocator that succeeded
  int64_t raw_frees = 0;       ///< buffers given back to the raw allocator
  int64_t reuses = 0;          ///< requests served from the cache
  int64_t heap_fallbacks = 0;  ///< requests served from the heap because the raw allocator failed
};

class caching_host_memory final : public host_memory_resource {
 public:
  /// Returns a buffer of at least n bytes, aligned to 64, or null with a reason in `why`.
  using raw_alloc_fn = std::function<void*(std::size_t n, std::string& why)>;
  /// Frees a buffer of raw_alloc_fn's, given the `n` it was asked for.
  using raw_free_fn = std::function<void(void* p, std::size_t n)>;

  caching_host_memory(std::string name, raw_alloc_fn alloc, raw_free_fn free, std::size_t min_bytes,
                      int64_t max_cached_bytes);
  /// Gives every cached buffer back to the raw allocator. Buffers still
  /// handed out must not be deallocated afterwards.
  ~caching_host_memory();

  void* allocate(std::size_t bytes) override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  const char* name() const noexcept override { return name_.c_str(); }

  host_cache_stats stats();
  /// Whether `p` points into a buffer of the raw allocator handed out now
  /// (for the CUDA pool: pinned memory, which a device copies directly). A
  /// lookup under the lock, far cheaper than asking the driver
  /// (cudaPointerGetAttributes, about a microsecond).
  bool contains(const void* p);
  /// Caps the cached bytes; frees cached buffers above the cap now (largest first).
  void set_max_cached_bytes(int64_t n);

  /// Granularity of raw allocations: near sizes share buffers.
  static constexpr std::size_t granule = std::size_t{64} << 10;

 private:
  std::string name_;
  raw_alloc_fn alloc_;
  raw_free_fn free_fn_;
  std::size_t min_bytes_;
  std::mutex m_;
  std::multimap<std::size_t, void*> cached_;     // capacity -> buffer
  std::map<const void*, std::size_t> live_;      // handed out from the raw allocator: buffer -> capacity (ordered: contains())
  std::unordered_map<void*, std::size_t> heap_;  // handed out from the heap (fallback)
  int64_t max_cached_bytes_;
  host_cache_stats stats_;
  bool warned_ = false;
};

}  // namespace ag::gpu::host
