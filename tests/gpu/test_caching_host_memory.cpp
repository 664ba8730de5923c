// caching_host_memory (the logic behind the CUDA pinned pool) with a counting
// heap allocator as its "expensive" raw allocator: reuse by size, the heap
// below the threshold and after a raw failure, the cache limit, and many
// threads at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "gpu/host/caching_host_memory.hpp"
#include "graph/random.hpp"

namespace {

constexpr std::size_t kib = 1024;
constexpr std::size_t min_bytes = 64 * kib;

/// The raw allocator: heap memory, every buffer tracked.
struct raw_heap {
  std::mutex m;
  std::set<void*> live;
  int allocs = 0, frees = 0, bad_frees = 0;
  bool fail = false;

  ag::gpu::host::caching_host_memory make(int64_t max_cached) {
    return ag::gpu::host::caching_host_memory(
        "test pool",
        [this](std::size_t n, std::string& why) -> void* {
          std::lock_guard<std::mutex> lk(m);
          if (fail) {
            why = "told to fail";
            return nullptr;
          }
          void* p = ::operator new(n, std::align_val_t{64});
          live.insert(p);
          ++allocs;
          return p;
        },
        [this](void* p, std::size_t) {
          std::lock_guard<std::mutex> lk(m);
          if (!live.erase(p)) {
            ++bad_frees;
            return;
          }
          ++frees;
          ::operator delete(p, std::align_val_t{64});
        },
        min_bytes, max_cached);
  }
};

TEST(CachingHostMemory, ABufferGivenBackIsHandedOutAgainForAboutItsSize) {
  raw_heap raw;
  {
    auto pool = raw.make(int64_t{1} << 30);
    void* a = pool.allocate(1000 * kib);
    EXPECT_EQ(raw.allocs, 1);
    pool.deallocate(a, 1000 * kib);
    EXPECT_EQ(pool.stats().cached_bytes, static_cast<int64_t>(1024 * kib));  // rounded to the 64 KiB granule
    void* b = pool.allocate(900 * kib);  // smaller, within 1.5x: reused
    EXPECT_EQ(b, a);
    EXPECT_EQ(raw.allocs, 1);
    EXPECT_EQ(pool.stats().reuses, 1);
    pool.deallocate(b, 900 * kib);
    void* c = pool.allocate(2000 * kib);  // larger than the cached one: fresh
    void* d = pool.allocate(100 * kib);   // far smaller than the cached one: fresh
    EXPECT_NE(c, a);
    EXPECT_NE(d, a);
    EXPECT_EQ(raw.allocs, 3);
    pool.deallocate(c, 2000 * kib);
    pool.deallocate(d, 100 * kib);
    const auto s = pool.stats();
    EXPECT_EQ(s.live_bytes, 0);
    EXPECT_EQ(raw.frees, 0) << "buffers under the cache limit are kept";
  }
  EXPECT_EQ(raw.frees, 3) << "the destructor gives cached buffers back";
  EXPECT_EQ(raw.bad_frees, 0);
  EXPECT_TRUE(raw.live.empty());
}

TEST(CachingHostMemory, SmallRequestsAndRawFailuresUseTheHeap) {
  raw_heap raw;
  auto pool = raw.make(int64_t{1} << 30);
  void* small = pool.allocate(min_bytes - 1);
  std::memset(small, 1, min_bytes - 1);
  pool.deallocate(small, min_bytes - 1);
  EXPECT_EQ(raw.allocs, 0);
  raw.fail = true;
  void* big = pool.allocate(256 * kib);
  ASSERT_NE(big, nullptr);
  std::memset(big, 2, 256 * kib);
  EXPECT_EQ(pool.stats().heap_fallbacks, 1);
  pool.deallocate(big, 256 * kib);  // back to the heap, not to the raw allocator
  EXPECT_EQ(raw.frees, 0);
  EXPECT_EQ(raw.bad_frees, 0);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
}

// contains(): every byte of a buffer handed out from the raw allocator (a
// CUDA copy then skips asking the driver whether it is pinned), none of a
// heap buffer, a cached one or a neighbour's.
TEST(CachingHostMemory, ContainsTheBuffersItHandedOutFromTheRawAllocatorOnly) {
  raw_heap raw;
  auto pool = raw.make(int64_t{1} << 30);
  auto* a = static_cast<std::byte*>(pool.allocate(100 * kib));  // 128 KiB of capacity
  auto* b = static_cast<std::byte*>(pool.allocate(300 * kib));
  auto* small = static_cast<std::byte*>(pool.allocate(16));  // below min_bytes: the heap
  EXPECT_TRUE(pool.contains(a));
  EXPECT_TRUE(pool.contains(a + 100 * kib - 1));
  EXPECT_TRUE(pool.contains(a + 128 * kib - 1)) << "the capacity is the buffer's";
  EXPECT_TRUE(pool.contains(b + 1234));
  EXPECT_FALSE(pool.contains(small));
  EXPECT_FALSE(pool.contains(std::min(a, b) - 1)) << "the byte before the lower buffer";
  int local = 0;
  EXPECT_FALSE(pool.contains(&local));
  pool.deallocate(a, 100 * kib);  // cached now: not handed out
  EXPECT_FALSE(pool.contains(a));
  EXPECT_TRUE(pool.contains(b));
  pool.deallocate(b, 300 * kib);
  pool.deallocate(small, 16);
  EXPECT_FALSE(pool.contains(b));
}

TEST(CachingHostMemory, BuffersOverTheCacheLimitGoBackToTheRawAllocator) {
  raw_heap raw;
  auto pool = raw.make(static_cast<int64_t>(256 * kib));
  void* a = pool.allocate(256 * kib);
  void* b = pool.allocate(256 * kib);
  pool.deallocate(a, 256 * kib);
  EXPECT_EQ(raw.frees, 0);
  pool.deallocate(b, 256 * kib);  // the cache is full
  EXPECT_EQ(raw.frees, 1);
  EXPECT_EQ(pool.stats().cached_bytes, static_cast<int64_t>(256 * kib));
  pool.set_max_cached_bytes(0);
  EXPECT_EQ(raw.frees, 2);
  EXPECT_EQ(pool.stats().cached_bytes, 0);
  EXPECT_TRUE(raw.live.empty());
}

// Host tensors from four threads at once, of a few sizes, written and checked
// while held: no buffer is handed to two holders, none is lost, and the cache
// serves most requests.
TEST(CachingHostMemory, ManyThreadsShareThePoolWithoutSharingBuffers) {
  raw_heap raw;
  {
    auto pool = raw.make(int64_t{1} << 30);
    std::atomic<int> corrupt{0};
    auto worker = [&](int t) {
      ag::rng r(static_cast<uint64_t>(t) + 1);
      for (int i = 0; i < 300; ++i) {
        const int64_t n = (static_cast<int64_t>(r.next() % 4) + 1) * 40000;  // 160 KB .. 640 KB of f32
        auto a = ag::host_tensor::uninitialized(ag::dtype::f32, {n}, &pool);
        auto b = ag::host_tensor::uninitialized(ag::dtype::f32, {n / 2}, &pool);
        const auto tag = static_cast<unsigned char>(t * 16 + i % 16);
        std::memset(a.data(), tag, a.bytes());
        std::memset(b.data(), tag ^ 0xff, b.bytes());
        std::this_thread::yield();
        for (std::size_t k = 0; k < a.bytes(); k += 4093)
          if (std::to_integer<unsigned char>(a.data()[k]) != tag) ++corrupt;
        for (std::size_t k = 0; k < b.bytes(); k += 4093)
          if (std::to_integer<unsigned char>(b.data()[k]) != (tag ^ 0xff)) ++corrupt;
      }
    };
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) ts.emplace_back(worker, t);
    for (auto& t : ts) t.join();
    EXPECT_EQ(corrupt.load(), 0) << "a buffer was handed to two holders at once";
    const auto s = pool.stats();
    EXPECT_EQ(s.live_bytes, 0);
    EXPECT_GT(s.reuses, 10 * s.raw_allocations) << "the cache served too few requests";
  }
  EXPECT_EQ(raw.bad_frees, 0);
  EXPECT_TRUE(raw.live.empty());
}

}  // namespace
