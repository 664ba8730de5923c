#pragma once
// Pinned staging for copies between a CUDA device and pageable host memory.
// Only gpu/cuda/ includes it.

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda/device_core.hpp"
#include "gpu/cuda/event_poller.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

/// True for host memory CUDA does not know (pageable: malloc / std::vector).
/// Pinned or registered host memory (cudaMemoryTypeHost), device and managed
/// memory keep the direct cudaMemcpyAsync (which also reports misuse, e.g. a
/// device pointer as the host side, as an error instead of a host memcpy).
bool is_pageable_host(const void* p);

/// Pinned staging buffers for copies between the device and pageable host
/// memory (std::vector storage of host tensors). One pool per device.
///
/// Why: cudaMemcpyAsync into pageable memory returns only once the copy has
/// completed, i.e. after everything queued before it on the stream, so the
/// copy-engine actor would block until the job's GPU work is done; from
/// pageable memory the driver may also synchronise with the stream while it
/// stages. So:
///   d2h: device -> pinned staging (asynchronous), then a host function
///        (cudaLaunchHostFunc) copies staging -> user memory in stream order;
///        it returns the buffer to `free_`. Work enqueued after it, including
///        the event a later notify() records, runs only once it has returned.
///   h2d: the calling thread copies user memory -> staging, then an
///        asynchronous staging -> device copy and an event recorded after it;
///        the buffer sits in `pending_` until a later take() sees that event
///        complete (no host function, so the h2d stream never waits for a
///        callback thread).
/// Ownership: buffers are cudaHostAlloc'd by the enqueuing thread and listed in
/// `all_`; each is at any time in `free_`, in `pending_`, or owned by exactly
/// one in-flight copy. Only release_all() frees them (cudaFreeHost), which the
/// device's destructor calls after cudaDeviceSynchronize; the host function
/// never calls CUDA. The pool lives in a shared_ptr because in-flight host
/// functions hold it.
/// Locks: `m_` guards free_/all_ (taken by host functions, never held across a
/// CUDA call); `pending_mu_` guards pending_ (never taken by host functions,
/// held across cudaEventQuery, which does not block). Order: pending_mu_, m_.
class staging_pool : public std::enable_shared_from_this<staging_pool> {
 public:
  /// Device -> pageable host without blocking the caller: an asynchronous
  /// copy into staging, then a stream-ordered host function into `dst`.
  /// The caller has checked the stream and made the device current; `name`
  /// names the device in errors; `c` checks CUDA results (sticky = death).
  error copy_d2h(core& c, const std::string& name, cudaStream_t s, void* dst, const void* src, std::size_t n);

  /// Pageable host -> device without the driver's own staging (which may
  /// synchronise with the stream): the caller's thread fills a pinned buffer,
  /// the DMA reads it asynchronously, an event tells when it may be reused.
  /// Same preconditions as copy_d2h.
  error copy_h2d(core& c, const std::string& name, cudaStream_t s, void* dst, const void* src, std::size_t n);

  /// Frees every buffer and hands pending events to `events` (which destroys
  /// them). Only once no staged copy can be in flight (after cudaDeviceSynchronize).
  void release_all(poller& events);

  /// Returns a buffer to the free list. Thread-safe; no CUDA call (the d2h
  /// host function calls it).
  void give(void* buf, std::size_t capacity);

 private:
  struct in_flight {
    cudaEvent_t done;  // recorded after the staging -> device copy
    void* buf;
    std::size_t capacity;
  };

  /// A free buffer of at least n bytes (and not much larger), or {nullptr, 0}.
  std::pair<void*, std::size_t> take_free(std::size_t n);
  /// A pinned staging buffer of at least n bytes: a free one, one whose
  /// staged h2d copy has completed, or a new one. Called with no pool lock
  /// held; never waits for the GPU.
  expected<std::pair<void*, std::size_t>> take(core& c, const std::string& name, std::size_t n, const char* what);
  /// Moves the buffers of completed staged h2d copies back to the free list.
  /// A query error leaves the buffer pending (the copy may still read it;
  /// release_all frees it).
  void reclaim(poller& events);

  std::mutex m_;
  std::multimap<std::size_t, void*> free_;  // capacity -> buffer
  std::vector<void*> all_;                  // every buffer, for release_all
  std::mutex pending_mu_;
  std::vector<in_flight> pending_;
};

}  // namespace ag::gpu::cuda::detail
