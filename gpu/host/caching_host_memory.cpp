#include "gpu/host/caching_host_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <new>
#include <utility>
#include <vector>

namespace ag::gpu::host {

namespace {
constexpr std::align_val_t heap_alignment{64};
std::size_t round_up(std::size_t n, std::size_t g) { return (n + g - 1) / g * g; }
}  // namespace

caching_host_memory::caching_host_memory(std::string name, raw_alloc_fn alloc, raw_free_fn free,
                                         std::size_t min_bytes, int64_t max_cached_bytes)
    : name_(std::move(name)),
      alloc_(std::move(alloc)),
      free_fn_(std::move(free)),
      min_bytes_(min_bytes),
      max_cached_bytes_(std::max<int64_t>(max_cached_bytes, 0)) {}

caching_host_memory::~caching_host_memory() {
  for (const auto& [cap, p] : cached_) free_fn_(p, cap);
}

void* caching_host_memory::allocate(std::size_t bytes) {
  if (bytes < min_bytes_) return ::operator new(bytes, heap_alignment);
  {
    std::lock_guard<std::mutex> lk(m_);
    // A cached buffer at least this big but not wastefully bigger.
    auto it = cached_.lower_bound(bytes);
    if (it != cached_.end() && it->first <= bytes + bytes / 2 + granule) {
      void* p = it->second;
      const std::size_t cap = it->first;
      cached_.erase(it);
      live_.emplace(p, cap);
      stats_.cached_bytes -= static_cast<int64_t>(cap);
      stats_.live_bytes += static_cast<int64_t>(cap);
      ++stats_.reuses;
      return p;
    }
  }
  const std::size_t cap = round_up(bytes, granule);
  std::string why;
  void* p = alloc_(cap, why);  // not under the lock: it is the slow part
  std::lock_guard<std::mutex> lk(m_);
  if (!p) {
    // The heap still works; only copies into this buffer lose the fast path.
    ++stats_.heap_fallbacks;
    if (!warned_) {
      warned_ = true;
      std::fprintf(stderr, "actorgraph: %s: allocating %zu bytes failed (%s); using the heap\n", name_.c_str(), cap,
                   why.c_str());
    }
    void* h = ::operator new(bytes, heap_alignment);
    heap_.emplace(h, bytes);
    return h;
  }
  live_.emplace(p, cap);
  stats_.live_bytes += static_cast<int64_t>(cap);
  ++stats_.raw_allocations;
  return p;
}

void caching_host_memory::deallocate(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  if (bytes < min_bytes_) return ::operator delete(p, heap_alignment);
  std::size_t cap = 0;
  {
    std::lock_guard<std::mutex> lk(m_);
    if (auto h = heap_.find(p); h != heap_.end()) {
      heap_.erase(h);
      ::operator delete(p, heap_alignment);
      return;
    }
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr, "actorgraph: %s: deallocate of a buffer it did not hand out (%p, %zu bytes)\n",
                   name_.c_str(), p, bytes);
      return;
    }
    cap = it->second;
    live_.erase(it);
    stats_.live_bytes -= static_cast<int64_t>(cap);
    if (stats_.cached_bytes + static_cast<int64_t>(cap) <= max_cached_bytes_) {
      cached_.emplace(cap, p);
      stats_.cached_bytes += static_cast<int64_t>(cap);
      return;
    }
    ++stats_.raw_frees;
  }
  free_fn_(p, cap);  // over the cache limit (outside the lock: it may be slow)
}

bool caching_host_memory::contains(const void* p) {
  std::lock_guard<std::mutex> lk(m_);
  auto it = live_.upper_bound(p);  // the first buffer starting after p
  if (it == live_.begin()) return false;
  --it;
  return static_cast<const std::byte*>(p) < static_cast<const std::byte*>(it->first) + it->second;
}

host_cache_stats caching_host_memory::stats() {
  std::lock_guard<std::mutex> lk(m_);
  return stats_;
}

void caching_host_memory::set_max_cached_bytes(int64_t n) {
  std::vector<std::pair<void*, std::size_t>> drop;
  {
    std::lock_guard<std::mutex> lk(m_);
    max_cached_bytes_ = std::max<int64_t>(n, 0);
    while (stats_.cached_bytes > max_cached_bytes_ && !cached_.empty()) {
      auto it = std::prev(cached_.end());
      stats_.cached_bytes -= static_cast<int64_t>(it->first);
      drop.emplace_back(it->second, it->first);
      cached_.erase(it);
      ++stats_.raw_frees;
    }
  }
  for (const auto& [p, cap] : drop) free_fn_(p, cap);
}

}  // namespace ag::gpu::host
