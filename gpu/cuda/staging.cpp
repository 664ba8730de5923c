// Pinned staging for pageable host copies (staging.hpp).

#include "gpu/cuda/staging.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/slow_call.hpp"

namespace ag::gpu::cuda::detail {
namespace {

struct staged_d2h {
  void* dst;
  void* staging;
  std::size_t bytes;
  std::size_t capacity;
  std::shared_ptr<staging_pool> pool;
};

/// memcpy split over a few threads for large buffers: this runs on CUDA's
/// host-callback thread, in stream order, so one thread copying 16-64 MiB of
/// logits per job at ~6 GB/s became the pipeline's bottleneck.
void parallel_memcpy(void* dst, const void* src, std::size_t n) {
  constexpr std::size_t chunk_min = std::size_t{4} << 20;
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t parts = std::min<std::size_t>({n / chunk_min, 8, hw});
  if (parts < 2) {
    std::memcpy(dst, src, n);
    return;
  }
  // ceil(n / parts) rounded up to a cache line: the parts cover all n bytes.
  const std::size_t step = ((n + parts - 1) / parts + 63) & ~std::size_t{63};
  std::vector<std::thread> helpers;
  helpers.reserve(parts - 1);
  for (std::size_t i = 1; i < parts; ++i) {
    const std::size_t off = i * step;
    if (off >= n) break;
    const std::size_t len = std::min(step, n - off);
    helpers.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len); });
  }
  std::memcpy(dst, src, std::min(step, n));
  for (auto& t : helpers) t.join();
}

// A host function: no CUDA calls here (cudaLaunchHostFunc's rules).
void CUDART_CB finish_staged_d2h(void* p) {
  std::unique_ptr<staged_d2h> s(static_cast<staged_d2h*>(p));
  parallel_memcpy(s->dst, s->staging, s->bytes);
  s->pool->give(s->staging, s->capacity);
}

}  // namespace

bool is_pageable_host(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // older runtimes report unknown (pageable) pointers as an error
  }
  return a.type == cudaMemoryTypeUnregistered;
}

void staging_pool::give(void* buf, std::size_t capacity) {
  std::lock_guard<std::mutex> lk(m_);
  free_.emplace(capacity, buf);
}

std::pair<void*, std::size_t> staging_pool::take_free(std::size_t n) {
  std::lock_guard<std::mutex> lk(m_);
  auto it = free_.lower_bound(n);
  if (it == free_.end() || it->first > 2 * n + (std::size_t{1} << 20)) return {nullptr, 0};
  std::pair<void*, std::size_t> r{it->second, it->first};
  free_.erase(it);
  return r;
}

expected<std::pair<void*, std::size_t>> staging_pool::take(core& c, const std::string& name, std::size_t n,
                                                           const char* what) {
  reclaim(*c.poll);
  auto got = take_free(n);
  if (got.first) return got;
  const std::size_t cap = std::max<std::size_t>(n, 4096);
  void* buf = nullptr;
  cudaError_t r = cudaSuccess;
  {
    slow_call probe(name, "cudaHostAlloc (pinned staging)");
    r = cudaHostAlloc(&buf, cap, cudaHostAllocPortable);
  }
  if (r == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return error(errc::out_of_memory,
                 name + ": pinned staging of " + std::to_string(n) + " bytes for " + what + " failed");
  }
  if (error e = AG_CORE_CHECK(c, r, name + " " + what + " staging")) return e;
  std::lock_guard<std::mutex> lk(m_);
  all_.push_back(buf);
  return std::pair<void*, std::size_t>{buf, cap};
}

void staging_pool::reclaim(poller& events) {
  std::lock_guard<std::mutex> lk(pending_mu_);
  auto& pend = pending_;
  for (std::size_t i = 0; i < pend.size();) {
    const cudaError_t r = cudaEventQuery(pend[i].done);
    if (r != cudaSuccess) {
      if (r != cudaErrorNotReady) (void)cudaGetLastError();
      ++i;
      continue;
    }
    events.give_event(pend[i].done);
    give(pend[i].buf, pend[i].capacity);
    pend[i] = pend.back();
    pend.pop_back();
  }
}

error staging_pool::copy_d2h(core& c, const std::string& name, cudaStream_t s, void* dst, const void* src,
                             std::size_t n) {
  auto st = take(c, name, n, "copy_d2h");
  if (!st) return st.err();
  auto [buf, cap] = *st;
  if (error e = AG_CORE_CHECK(c, cudaMemcpyAsync(buf, src, n, cudaMemcpyDeviceToHost, s),
                              name + " copy_d2h (to staging)")) {
    give(buf, cap);  // nothing was enqueued
    return e;
  }
  auto* job = new staged_d2h{dst, buf, n, cap, shared_from_this()};
  if (error e = AG_CORE_CHECK(c, cudaLaunchHostFunc(s, &finish_staged_d2h, job),
                              name + " copy_d2h (staging to host)")) {
    delete job;  // the copy above may still write the buffer: it stays out of `free_` (release_all frees it)
    return e;
  }
  return {};
}

error staging_pool::copy_h2d(core& c, const std::string& name, cudaStream_t s, void* dst, const void* src,
                             std::size_t n) {
  cudaEvent_t done = c.poll->take_event();
  if (!done) return error(errc::device_failed, name + ": copy_h2d could not create an event");
  auto st = take(c, name, n, "copy_h2d");
  if (!st) {
    c.poll->give_event(done);
    return st.err();
  }
  auto [buf, cap] = *st;
  parallel_memcpy(buf, src, n);
  if (error e = AG_CORE_CHECK(c, cudaMemcpyAsync(dst, buf, n, cudaMemcpyHostToDevice, s),
                              name + " copy_h2d (from staging)")) {
    give(buf, cap);  // nothing was enqueued
    c.poll->give_event(done);
    return e;
  }
  if (error e = AG_CORE_CHECK(c, cudaEventRecord(done, s), name + " copy_h2d (staging release)")) {
    // The copy may still read the buffer: it stays out of `free_` (release_all frees it).
    c.poll->give_event(done);
    return e;
  }
  std::lock_guard<std::mutex> lk(pending_mu_);
  pending_.push_back({done, buf, cap});
  return {};
}

void staging_pool::release_all(poller& events) {
  {
    std::lock_guard<std::mutex> plk(pending_mu_);
    for (const auto& f : pending_) events.give_event(f.done);  // the poller destroys them
    pending_.clear();
  }
  std::lock_guard<std::mutex> slk(m_);
  for (void* p : all_) AG_CUDA_ASSERT(cudaFreeHost(p));
  all_.clear();
  free_.clear();
}

}  // namespace ag::gpu::cuda::detail
