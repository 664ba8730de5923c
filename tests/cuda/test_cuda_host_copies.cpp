// Host copies never block the host: copy_d2h into / copy_h2d from pageable
// memory (a job's host tensors) return while the stream is still held by
// earlier work (a spin-gate kernel), and the data lands, exactly, before the
// stream's next notify fires. Pinned memory keeps the direct path.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
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

const std::size_t sizes[] = {1, 4097, (std::size_t{3} << 20) + 5, (std::size_t{37} << 20) + 3};

/// A spin gate on one stream. The destructor opens it and drains the stream,
/// so a failing assertion cannot leave a kernel spinning (the device's
/// destructor would wait for it forever).
class gate {
 public:
  gate(gpu::device& d, gpu::stream& s) : d_(d), s_(s) {
    auto m = d.allocate_host(64);
    if (m) flag_ = static_cast<volatile uint32_t*>(*m);
  }
  ~gate() {
    if (!flag_) return;
    open();
    (void)d_.synchronize(s_);
    d_.deallocate_host(const_cast<uint32_t*>(flag_));
  }
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;

  bool ok() const { return flag_ != nullptr; }
  error close() {
    flag_[0] = 0;
    return gpu::cuda::testing::launch_spin_gate(d_, s_, flag_);
  }
  void open() { flag_[0] = 1; }

  /// Runs `call` on this thread while the gate is closed. A watchdog opens
  /// the gate after 5 s if the call has not returned by then, so a call that
  /// waits for the GPU fails the test instead of hanging it. Returns true when
  /// the call returned on its own (before anyone opened the gate).
  bool returns_while_closed(const std::function<void()>& call) {
    std::atomic<bool> returned{false}, released_by_watchdog{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 500 && !returned.load(); ++i) std::this_thread::sleep_for(10ms);
      if (!returned.load()) {
        released_by_watchdog = true;
        open();
      }
    });
    call();
    returned = true;
    watchdog.join();
    return !released_by_watchdog.load();
  }

 private:
  gpu::device& d_;
  gpu::stream& s_;
  volatile uint32_t* flag_ = nullptr;
};

/// Result of a notify() whose callback checks a host buffer against the
/// expected bytes at the moment it fires. Shared with the callback, so a test
/// that gives up waiting leaves no dangling reference behind.
struct notify_check {
  std::vector<std::byte> want, got;
  std::atomic<int> calls{0};
  std::atomic<bool> ok{false}, data_ok{false};
};

void notify_and_check(gpu::device& d, gpu::stream& s, const std::shared_ptr<notify_check>& c) {
  d.notify(s, [c](const error& e) {
    c->ok = e.ok();
    c->data_ok = c->got.size() == c->want.size() && std::memcmp(c->got.data(), c->want.data(), c->want.size()) == 0;
    c->calls.fetch_add(1);
  });
}

/// Waits (at most 10 s: a hang guard, not a timing assertion) for the callback.
void wait_called(const notify_check& c) {
  for (int i = 0; i < 10000 && c.calls.load() == 0; ++i) std::this_thread::sleep_for(1ms);
}

TEST(CudaHostCopies, D2hIntoPageableMemoryDoesNotWaitForEarlierWork) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::copy_d2h).value();
  gate g(*d, *s);
  ASSERT_TRUE(g.ok());
  for (std::size_t n : sizes) {
    auto c = std::make_shared<notify_check>();
    c->want = random_bytes(n, n);
    c->got.assign(n, std::byte{0});  // pageable, like a host_tensor
    auto dev = d->allocate(static_cast<int64_t>(n));
    ASSERT_TRUE(dev);
    ASSERT_FALSE(d->upload(*dev, c->want.data(), static_cast<int64_t>(n)));
    ASSERT_FALSE(g.close());
    error copy_err;
    const bool returned_first =
        g.returns_while_closed([&] { copy_err = d->copy_d2h(*s, c->got.data(), *dev, static_cast<int64_t>(n)); });
    EXPECT_TRUE(returned_first) << "copy_d2h of " << n << " bytes blocked until earlier work finished";
    ASSERT_FALSE(copy_err) << copy_err.to_string();
    notify_and_check(*d, *s, c);
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(c->calls.load(), 0) << "notify fired while the gate was closed";
    g.open();
    ASSERT_FALSE(d->synchronize(*s));
    wait_called(*c);
    ASSERT_EQ(c->calls.load(), 1);
    EXPECT_TRUE(c->ok.load());
    EXPECT_TRUE(c->data_ok.load()) << n << " bytes were not all in place when notify fired";
    EXPECT_EQ(std::memcmp(c->got.data(), c->want.data(), n), 0) << n << " bytes differ after the staged copy";
    d->deallocate(*dev);
  }
}

TEST(CudaHostCopies, H2dFromPageableMemoryDoesNotWaitForEarlierWork) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::copy_h2d).value();
  gate g(*d, *s);
  ASSERT_TRUE(g.ok());
  for (std::size_t n : sizes) {
    auto c = std::make_shared<notify_check>();
    c->want = random_bytes(n, 7 * n + 1);
    c->got.assign(n, std::byte{0});
    const std::vector<std::byte> src = c->want;  // pageable, like a job input
    auto dev = d->allocate(static_cast<int64_t>(n));
    ASSERT_TRUE(dev);
    ASSERT_FALSE(g.close());
    error up_err, down_err;
    // Round trip on the held stream: both calls must return before it moves.
    const bool returned_first = g.returns_while_closed([&] {
      up_err = d->copy_h2d(*s, *dev, src.data(), static_cast<int64_t>(n));
      if (!up_err) down_err = d->copy_d2h(*s, c->got.data(), *dev, static_cast<int64_t>(n));
    });
    EXPECT_TRUE(returned_first) << "copy_h2d / copy_d2h of " << n << " bytes blocked until earlier work finished";
    ASSERT_FALSE(up_err) << up_err.to_string();
    ASSERT_FALSE(down_err) << down_err.to_string();
    notify_and_check(*d, *s, c);
    g.open();
    ASSERT_FALSE(d->synchronize(*s));
    wait_called(*c);
    ASSERT_EQ(c->calls.load(), 1);
    EXPECT_TRUE(c->ok.load());
    EXPECT_TRUE(c->data_ok.load()) << n << " bytes were not all in place when notify fired";
    // And on the device itself, read back synchronously.
    std::vector<std::byte> back(n, std::byte{0});
    ASSERT_FALSE(d->download(back.data(), *dev, static_cast<int64_t>(n)));
    EXPECT_EQ(std::memcmp(back.data(), c->want.data(), n), 0) << n << " bytes differ on the device after copy_h2d";
    d->deallocate(*dev);
  }
}

TEST(CudaHostCopies, ManyConcurrentStagedCopiesOnTwoStreamsLandExactly) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s0 = d->create_stream(ag::step_kind::copy_d2h).value();
  auto s1 = d->create_stream(ag::step_kind::copy_d2h).value();
  constexpr int copies = 64;
  std::vector<std::vector<std::byte>> want(copies), got(copies);
  std::vector<void*> dev;
  for (int i = 0; i < copies; ++i) {
    const std::size_t n = 1000 + 37 * static_cast<std::size_t>(i) + (i % 8 == 0 ? (std::size_t{1} << 20) : 0);
    got[i].assign(n, std::byte{0});
    auto p = d->allocate(static_cast<int64_t>(n));
    ASSERT_TRUE(p);
    dev.push_back(*p);
  }
  // Each round uploads fresh data through the staged h2d path and reads it
  // back through the staged d2h path, from two threads (one per stream) at
  // once. Later rounds reuse pooled buffers: a buffer handed out again while
  // its copy was still in flight would corrupt some copy.
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < copies; ++i) {
      want[i] = random_bytes(got[i].size(), 1000 * round + i + 1);
      std::memset(got[i].data(), 0, got[i].size());
    }
    auto drive = [&](gpu::stream& s, int parity, error& err) {
      for (int i = parity; i < copies && !err; i += 2) {
        const auto n = static_cast<int64_t>(got[i].size());
        err = d->copy_h2d(s, dev[i], want[i].data(), n);
        if (!err) err = d->copy_d2h(s, got[i].data(), dev[i], n);
      }
    };
    error e0, e1;
    std::thread t1([&] { drive(*s1, 1, e1); });
    drive(*s0, 0, e0);
    t1.join();
    ASSERT_FALSE(e0) << e0.to_string();
    ASSERT_FALSE(e1) << e1.to_string();
    ASSERT_FALSE(d->synchronize(*s0));
    ASSERT_FALSE(d->synchronize(*s1));
    for (int i = 0; i < copies; ++i)
      ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size()), 0) << "copy " << i << " round " << round;
  }
  for (void* p : dev) d->deallocate(p);
}

TEST(CudaHostCopies, PinnedHostMemoryIsCopiedDirectly) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::copy_d2h).value();
  const std::size_t n = 12345;
  const auto want = random_bytes(n, 9);
  auto dev = d->allocate(static_cast<int64_t>(n));
  auto pinned_src = d->allocate_host(static_cast<int64_t>(n));
  auto pinned_dst = d->allocate_host(static_cast<int64_t>(n));
  ASSERT_TRUE(dev && pinned_src && pinned_dst);
  std::memcpy(*pinned_src, want.data(), n);
  std::memset(*pinned_dst, 0, n);
  ASSERT_FALSE(d->copy_h2d(*s, *dev, *pinned_src, static_cast<int64_t>(n)));
  ASSERT_FALSE(d->copy_d2h(*s, *pinned_dst, *dev, static_cast<int64_t>(n)));
  ASSERT_FALSE(d->synchronize(*s));
  EXPECT_EQ(std::memcmp(*pinned_dst, want.data(), n), 0);
  // The direct path is asynchronous too: a d2h into pinned memory behind a
  // closed gate returns at once and lands only after the gate opens.
  {
    gate g(*d, *s);
    ASSERT_TRUE(g.ok());
    std::memset(*pinned_dst, 0, n);
    ASSERT_FALSE(g.close());
    error err;
    EXPECT_TRUE(g.returns_while_closed([&] { err = d->copy_d2h(*s, *pinned_dst, *dev, static_cast<int64_t>(n)); }));
    ASSERT_FALSE(err) << err.to_string();
    g.open();
    ASSERT_FALSE(d->synchronize(*s));
    EXPECT_EQ(std::memcmp(*pinned_dst, want.data(), n), 0);
  }
  d->deallocate(*dev);
  d->deallocate_host(*pinned_src);
  d->deallocate_host(*pinned_dst);
}

// The pinned pool behind CUDA job outputs: its buffers are page-locked (a d2h
// into one behind a closed gate returns at once and lands after the gate
// opens, without staging), and a buffer given back is handed out again to the
// next request of that size instead of pinning fresh memory. Which cached
// buffer serves it is not asserted: in a full run an earlier test may have
// left one of the same capacity in the pool, which the pool's multimap hands
// out first (session 88's whole test_cuda on an H100 got that one); the
// counters say that a cached buffer served it and nothing was pinned.
TEST(CudaHostCopies, PinnedPoolBuffersAreCopiedDirectlyAndReused) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  ASSERT_EQ(d->host_memory(), &gpu::cuda::pinned_host_memory());
  auto s = d->create_stream(ag::step_kind::copy_d2h).value();
  const int64_t numel = (int64_t{3} << 18) + 7;  // 3 MiB + 28 bytes of f32
  const auto n = static_cast<std::size_t>(numel) * 4;
  const auto want = random_bytes(n, 31);
  auto dev = d->allocate(static_cast<int64_t>(n));
  ASSERT_TRUE(dev);
  ASSERT_FALSE(d->upload(*dev, want.data(), static_cast<int64_t>(n)));
  for (int round = 0; round < 2; ++round) {
    const auto before = gpu::cuda::pinned_host_pool_stats();
    auto out = host_tensor::uninitialized(dtype::f32, {numel}, d->host_memory());
    const auto after = gpu::cuda::pinned_host_pool_stats();
    ASSERT_EQ(out.memory(), d->host_memory());
    EXPECT_GE(after.live_bytes - before.live_bytes, static_cast<int64_t>(n));
    if (round == 1) {
      EXPECT_EQ(after.reuses, before.reuses + 1) << "the buffer given back was not handed out again";
      EXPECT_EQ(after.raw_allocations, before.raw_allocations) << "fresh memory was pinned";
      EXPECT_EQ(after.cached_bytes, before.cached_bytes - (after.live_bytes - before.live_bytes));
    }
    std::memset(out.data(), 0, n);
    gate g(*d, *s);
    ASSERT_TRUE(g.ok());
    ASSERT_FALSE(g.close());
    error err;
    EXPECT_TRUE(g.returns_while_closed([&] { err = d->copy_d2h(*s, out.data(), *dev, static_cast<int64_t>(n)); }));
    ASSERT_FALSE(err) << err.to_string();
    std::this_thread::sleep_for(5ms);
    EXPECT_NE(std::memcmp(out.data(), want.data(), n), 0) << "the copy ran past a closed gate";
    g.open();
    ASSERT_FALSE(d->synchronize(*s));
    EXPECT_EQ(std::memcmp(out.data(), want.data(), n), 0) << "round " << round;
  }
  d->deallocate(*dev);
}

// Host copies captured into a replay graph (device::capture_segment: copy
// kernels on the pinned memory) move exactly the bytes asked, for sizes that
// are and are not multiples of 16 and for aligned and odd addresses, and a
// replay reads the host memory as it is at replay time, not at capture:
// each replay after new bytes are written returns those bytes.
TEST(CudaHostCopies, CapturedHostCopiesMoveExactlyTheirBytesAtEachReplay) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::compute).value();
  host_memory_resource* pinned = d->host_memory();
  ASSERT_NE(pinned, nullptr);
  for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{1000}, std::size_t{4099},
                              std::size_t{65536}}) {
    for (const std::size_t skew : {std::size_t{0}, std::size_t{3}}) {
      SCOPED_TRACE("bytes " + std::to_string(n) + " skew " + std::to_string(skew));
      auto* in = static_cast<std::byte*>(pinned->allocate(n + 64));
      auto* out = static_cast<std::byte*>(pinned->allocate(n + 64));
      auto dev = d->allocate(static_cast<int64_t>(n + 64));
      ASSERT_TRUE(dev);
      std::byte* dev_at = static_cast<std::byte*>(*dev) + skew;
      gpu::segment_op ops[2];
      ops[0] = {gpu::segment_op::kind::copy_h2d, nullptr, dev_at, in + skew, static_cast<int64_t>(n)};
      ops[1] = {gpu::segment_op::kind::copy_d2h, nullptr, out + skew, dev_at, static_cast<int64_t>(n)};
      auto g = d->capture_segment(*s, ops, 2);
      ASSERT_TRUE(g) << g.err().to_string();
      for (uint64_t round = 0; round < 3; ++round) {
        const auto want = random_bytes(n, 1000 * n + 10 * skew + round);
        std::memcpy(in + skew, want.data(), n);
        std::memset(out, 0x5a, n + 64);
        ASSERT_FALSE(d->replay(*s, **g));
        ASSERT_FALSE(d->synchronize(*s));
        EXPECT_EQ(std::memcmp(out + skew, want.data(), n), 0) << "round " << round;
        for (std::size_t k = 0; k < skew; ++k) EXPECT_EQ(out[k], std::byte{0x5a}) << "wrote before its start";
        for (std::size_t k = skew + n; k < n + 64; ++k) ASSERT_EQ(out[k], std::byte{0x5a}) << "wrote past its end";
      }
      g->reset();
      d->deallocate(*dev);
      pinned->deallocate(in, n + 64);
      pinned->deallocate(out, n + 64);
    }
  }
}

// A segment of many small host copies, as a decode step's inputs and
// outputs: independent consecutive copies share one kernel (at most
// 8 a kernel: gpu/cuda/elementwise.cuh), a copy that reads what an earlier one of
// the run wrote starts a new one, and every byte lands at each replay, for
// sizes that are and are not multiples of 16 and odd addresses.
TEST(CudaHostCopies, IndependentCapturedCopiesShareAKernelAndDependentOnesWait) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::compute).value();
  host_memory_resource* pinned = d->host_memory();
  ASSERT_NE(pinned, nullptr);
  const std::size_t sizes_of[] = {1, 4, 15, 16, 1152, 4099, 65536 + 7, 3, 40};  // 9 copies each way
  constexpr std::size_t count = std::size(sizes_of), slot = 70000;
  auto* in = static_cast<std::byte*>(pinned->allocate(count * slot));
  auto* out = static_cast<std::byte*>(pinned->allocate(count * slot));
  auto dev = d->allocate(static_cast<int64_t>(count * slot));
  ASSERT_TRUE(dev);
  auto* dev_base = static_cast<std::byte*>(*dev);
  const auto skew = [](std::size_t k) { return k % 3 == 1 ? std::size_t{3} : std::size_t{0}; };
  std::vector<gpu::segment_op> ops;
  for (std::size_t k = 0; k < count; ++k)
    ops.push_back({gpu::segment_op::kind::copy_h2d, nullptr, dev_base + k * slot + skew(k), in + k * slot + skew(k),
                   static_cast<int64_t>(sizes_of[k])});
  for (std::size_t k = 0; k < count; ++k)
    ops.push_back({gpu::segment_op::kind::copy_d2h, nullptr, out + k * slot + skew(k), dev_base + k * slot + skew(k),
                   static_cast<int64_t>(sizes_of[k])});
  auto g = d->capture_segment(*s, ops.data(), ops.size());
  ASSERT_TRUE(g) << g.err().to_string();
  // Greedy runs in stream order: the first 8 copies in (the most a kernel
  // takes); the 9th in with the first 7 out (none touches its bytes); the
  // last two out, the 9th of which reads what the 9th in wrote.
  EXPECT_EQ((*g)->host_copy_kernels(), 3);
  EXPECT_EQ((*g)->kernels(), 0) << "no op kernels in a segment of copies";
  for (uint64_t round = 0; round < 3; ++round) {
    const auto want = random_bytes(count * slot, 77 + round);
    std::memcpy(in, want.data(), count * slot);
    std::memset(out, 0x5a, count * slot);
    ASSERT_FALSE(d->replay(*s, **g));
    ASSERT_FALSE(d->synchronize(*s));
    for (std::size_t k = 0; k < count; ++k) {
      SCOPED_TRACE("copy " + std::to_string(k) + " of " + std::to_string(sizes_of[k]) + " bytes, round " +
                   std::to_string(round));
      const std::size_t at = k * slot + skew(k);
      EXPECT_EQ(std::memcmp(out + at, want.data() + at, sizes_of[k]), 0);
      for (std::size_t b = k * slot; b < at; ++b) ASSERT_EQ(out[b], std::byte{0x5a}) << "wrote before its start";
      for (std::size_t b = at + sizes_of[k]; b < (k + 1) * slot; ++b)
        ASSERT_EQ(out[b], std::byte{0x5a}) << "wrote past its end";
    }
  }
  g->reset();
  d->deallocate(*dev);
  pinned->deallocate(in, count * slot);
  pinned->deallocate(out, count * slot);
}

}  // namespace
}  // namespace ag
