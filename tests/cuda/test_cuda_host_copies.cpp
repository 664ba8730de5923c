// Host copies never block the host: copy_d2h into pageable memory (a job's
// output tensor) returns while the stream is still held by earlier work, and
// the data lands, exactly, before the stream's next notify.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "gpu/cuda/cuda_testing.hpp"
#include "graph/random.hpp"

namespace ag {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> random_bytes(std::size_t n, uint64_t seed) {
  rng r(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(r.next() & 0xff);
  return v;
}

TEST(CudaHostCopies, D2hIntoPageableMemoryDoesNotWaitForEarlierWork) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(gpu::stream_role::d2h);
  auto gate_mem = d->allocate_host(64);
  ASSERT_TRUE(gate_mem);
  auto* gate = static_cast<volatile uint32_t*>(*gate_mem);
  for (std::size_t n : {std::size_t{1}, std::size_t{4097}, (std::size_t{3} << 20) + 5, (std::size_t{37} << 20) + 3}) {
    const auto want = random_bytes(n, n);
    auto dev = d->allocate(static_cast<int64_t>(n));
    ASSERT_TRUE(dev);
    ASSERT_FALSE(d->upload(*dev, want.data(), static_cast<int64_t>(n)));
    std::vector<std::byte> host(n, std::byte{0});  // pageable, like a host_tensor
    gate[0] = 0;
    ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(*d, *s, gate));
    // If copy_d2h blocked until the gate opened, this watchdog opens it after
    // 5 s so the test fails instead of hanging.
    std::atomic<bool> returned{false}, released_by_watchdog{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 500 && !returned.load(); ++i) std::this_thread::sleep_for(10ms);
      if (!returned.load()) {
        released_by_watchdog = true;
        gate[0] = 1;
      }
    });
    ASSERT_FALSE(d->copy_d2h(*s, host.data(), *dev, static_cast<int64_t>(n)));
    returned = true;
    watchdog.join();
    EXPECT_FALSE(released_by_watchdog.load()) << "copy_d2h of " << n << " bytes blocked until earlier work finished";
    std::atomic<int> notified{0};
    d->notify(*s, [&](const error& e) { notified.fetch_add(e.ok() ? 1 : 100); });
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(notified.load(), 0) << "notify fired while the gate was closed";
    gate[0] = 1;
    ASSERT_FALSE(d->synchronize(*s));
    for (int i = 0; i < 500 && notified.load() == 0; ++i) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(notified.load(), 1);
    EXPECT_EQ(std::memcmp(host.data(), want.data(), n), 0) << n << " bytes differ after the staged copy";
    d->deallocate(*dev);
  }
  d->deallocate_host(*gate_mem);
}

TEST(CudaHostCopies, ManyConcurrentStagedCopiesOnTwoStreamsLandExactly) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s0 = d->create_stream(gpu::stream_role::d2h);
  auto s1 = d->create_stream(gpu::stream_role::d2h);
  constexpr int copies = 64;
  std::vector<std::vector<std::byte>> want, got;
  std::vector<void*> dev;
  for (int i = 0; i < copies; ++i) {
    const std::size_t n = 1000 + 37 * static_cast<std::size_t>(i);
    want.push_back(random_bytes(n, 500 + i));
    got.emplace_back(n, std::byte{0});
    auto p = d->allocate(static_cast<int64_t>(n));
    ASSERT_TRUE(p);
    dev.push_back(*p);
    ASSERT_FALSE(d->upload(*p, want.back().data(), static_cast<int64_t>(n)));
  }
  for (int round = 0; round < 3; ++round) {  // later rounds reuse pooled staging buffers
    for (int i = 0; i < copies; ++i) {
      auto& s = i % 2 ? *s1 : *s0;
      std::memset(got[i].data(), 0, got[i].size());
      ASSERT_FALSE(d->copy_d2h(s, got[i].data(), dev[i], static_cast<int64_t>(got[i].size())));
    }
    ASSERT_FALSE(d->synchronize(*s0));
    ASSERT_FALSE(d->synchronize(*s1));
    for (int i = 0; i < copies; ++i)
      ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size()), 0) << "copy " << i << " round " << round;
  }
  for (void* p : dev) d->deallocate(p);
}

TEST(CudaHostCopies, PinnedDestinationIsCopiedDirectly) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(gpu::stream_role::d2h);
  const std::size_t n = 12345;
  const auto want = random_bytes(n, 9);
  auto dev = d->allocate(static_cast<int64_t>(n));
  auto pinned = d->allocate_host(static_cast<int64_t>(n));
  ASSERT_TRUE(dev && pinned);
  ASSERT_FALSE(d->upload(*dev, want.data(), static_cast<int64_t>(n)));
  std::memset(*pinned, 0, n);
  ASSERT_FALSE(d->copy_d2h(*s, *pinned, *dev, static_cast<int64_t>(n)));
  ASSERT_FALSE(d->synchronize(*s));
  EXPECT_EQ(std::memcmp(*pinned, want.data(), n), 0);
  d->deallocate(*dev);
  d->deallocate_host(*pinned);
}

}  // namespace
}  // namespace ag
