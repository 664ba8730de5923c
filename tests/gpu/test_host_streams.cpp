// The host stream engine through the cpu device: stream order, events across
// streams and devices (a gate event holds a stream until the test releases
// it), notify, foreign events, dropping pending work, memory.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/cpu/cpu_device.hpp"
#include "gpu/device.hpp"
#include "gpu/host/host_device.hpp"
#include "gpu/host/host_stream.hpp"
#include "graph/random.hpp"

namespace {

using namespace ag;
using namespace std::chrono_literals;

std::vector<gpu::device_ptr> devices(const std::string& spec, gpu::backend_options o = {}) {
  auto d = gpu::make_devices(spec, o);
  EXPECT_TRUE(d.has_value()) << (d ? "" : d.err().to_string());
  return d ? *d : std::vector<gpu::device_ptr>{};
}

std::vector<int32_t> random_ints(std::size_t n, uint64_t seed) {
  rng r(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(r.next() & 0x7fffffff) | 1;  // never zero
  return v;
}

// A gate: an event armed by the test and reached only when the test says so
// (the host analogue of a spin-gate kernel).
struct gate {
  gpu::host::host_event ev;
  uint64_t gen = ev.state()->arm();
  void open() { ev.state()->reach(gen, gpu::host_clock_ns()); }
};

/// Waits (bounded) until a stream worker is parked in a wait on host event
/// `e`: from then on nothing behind that wait in its stream can run before
/// `e` completes, so a negative check needs no sleep.
bool parked_at(const gpu::event& e, std::chrono::seconds limit = 10s) {
  const auto& st = *dynamic_cast<const gpu::host::host_event&>(e).state();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (st.waiters() == 0)
    if (std::chrono::steady_clock::now() > deadline) return false;
    else std::this_thread::yield();
  return true;
}

TEST(HostStreams, TasksRunInSubmissionOrderAcrossDrivingThreads) {
  auto d = devices("cpu:1");
  auto s = d[0]->create_stream(ag::step_kind::compute).value();
  std::vector<int> order;  // only touched by the stream's worker until synchronize
  std::mutex m;
  constexpr int per_thread = 300;
  // The owning actor migrates between threads: drive the stream from three
  // threads one after the other.
  for (int t = 0; t < 3; ++t) {
    std::thread([&, t] {
      for (int i = 0; i < per_thread; ++i)
        d[0]->notify(*s, [&, v = t * per_thread + i](const error& e) {
          std::lock_guard<std::mutex> lk(m);
          order.push_back(e ? -1 : v);
        });
    }).join();
  }
  ASSERT_FALSE(d[0]->synchronize(*s));
  std::lock_guard<std::mutex> lk(m);
  ASSERT_EQ(order.size(), 3u * per_thread);
  for (int i = 0; i < 3 * per_thread; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(HostStreams, CopiesRunInOrderAndNotifyFiresOnceAfterThem) {
  auto d = devices("cpu:1");
  auto& dev = *d[0];
  auto s = dev.create_stream(ag::step_kind::copy_h2d).value();
  const auto src = random_ints(1 << 16, 3);
  const int64_t bytes = static_cast<int64_t>(src.size() * 4);
  auto buf = dev.allocate(bytes);
  ASSERT_TRUE(buf.has_value());
  std::vector<int32_t> back(src.size(), 0);
  ASSERT_FALSE(dev.copy_h2d(*s, *buf, src.data(), bytes));
  auto d2h = dev.create_stream(ag::step_kind::copy_d2h).value();
  auto ev = dev.create_event().value();
  dev.record(*ev, *s);
  dev.wait(*d2h, *ev);
  ASSERT_FALSE(dev.copy_d2h(*d2h, back.data(), *buf, bytes));
  std::atomic<int> calls{0};
  std::promise<bool> seen;
  dev.notify(*d2h, [&](const error& e) {
    // prior work is complete when the callback runs
    seen.set_value(!e && std::memcmp(back.data(), src.data(), static_cast<std::size_t>(bytes)) == 0);
    calls.fetch_add(1);
  });
  EXPECT_TRUE(seen.get_future().get());
  ASSERT_FALSE(dev.synchronize(*d2h));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(ev->query());
  dev.deallocate(*buf);
}

TEST(HostStreams, CrossStreamAndCrossDeviceWaitHoldsWorkUntilTheEvent) {
  auto d = devices("cpu:2");
  auto s0 = d[0]->create_stream(ag::step_kind::compute).value();
  auto s1 = d[1]->create_stream(ag::step_kind::copy_peer).value();
  gate g;
  auto ev = d[0]->create_event(true).value();
  d[0]->wait(*s0, g.ev);   // s0 blocked by the gate
  d[0]->record(*ev, *s0);  // ev completes only after the gate opens
  EXPECT_FALSE(ev->query());

  const auto src = random_ints(4096, 9);
  auto a = d[0]->allocate(4096 * 4);
  auto b = d[1]->allocate(4096 * 4);
  ASSERT_TRUE(a && b);
  ASSERT_FALSE(d[0]->upload(*a, src.data(), 4096 * 4));
  std::memset(*b, 0, 4096 * 4);
  d[1]->wait(*s1, *ev);  // device 1 waits on device 0's event
  ASSERT_FALSE(d[1]->copy_peer(*s1, *b, *d[0], *a, 4096 * 4));
  std::atomic<bool> done{false};
  d[1]->notify(*s1, [&](const error&) { done = true; });

  ASSERT_TRUE(parked_at(*ev)) << "device 1's stream never reached its wait";
  EXPECT_FALSE(done.load()) << "work behind the event ran before the event";
  EXPECT_EQ(static_cast<int32_t*>(*b)[0], 0) << "peer copy ran before the event";
  EXPECT_FALSE(ev->query());

  const int64_t before_open = gpu::host_clock_ns();
  g.open();
  ASSERT_FALSE(d[1]->synchronize(*s1));
  EXPECT_TRUE(done.load());
  EXPECT_TRUE(ev->query());
  EXPECT_GE(ev->completion_ns(), before_open);
  EXPECT_EQ(std::memcmp(*b, src.data(), 4096 * 4), 0);
  d[0]->deallocate(*a);
  d[1]->deallocate(*b);
}

TEST(HostStreams, WaitUsesTheRecordMadeBeforeIt) {
  auto d = devices("cpu:1");
  auto& dev = *d[0];
  auto s0 = dev.create_stream(ag::step_kind::compute).value();
  auto s1 = dev.create_stream(ag::step_kind::compute).value();
  auto ev = dev.create_event().value();
  EXPECT_TRUE(ev->query()) << "a never-recorded event counts as complete";
  std::atomic<bool> ran{false};
  dev.wait(*s1, *ev);  // nothing recorded yet: does not wait
  dev.notify(*s1, [&](const error&) { ran = true; });
  ASSERT_FALSE(dev.synchronize(*s1));
  EXPECT_TRUE(ran.load());
  // Now a record that cannot complete, then a wait: the wait must hold.
  gate g;
  dev.wait(*s0, g.ev);
  dev.record(*ev, *s0);
  ran = false;
  dev.wait(*s1, *ev);
  dev.notify(*s1, [&](const error&) { ran = true; });
  ASSERT_TRUE(parked_at(*ev)) << "s1 never reached its wait";
  EXPECT_FALSE(ran.load());
  g.open();
  ASSERT_FALSE(dev.synchronize(*s1));
  EXPECT_TRUE(ran.load());
}

// An event of another backend: the host worker calls its host_wait().
// It says when a thread is blocked in its host_wait().
class foreign_event final : public gpu::event {
 public:
  bool query() const override { return done_.load(); }
  void host_wait() const override {
    std::unique_lock<std::mutex> lk(m_);
    waiting_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return done_.load(); });
  }
  int64_t completion_ns() const override { return 0; }
  void complete() {
    { std::lock_guard<std::mutex> lk(m_); done_ = true; }
    cv_.notify_all();
  }
  /// Waits (bounded) until a thread is blocked in host_wait().
  bool wait_until_waited_for(std::chrono::seconds limit = 10s) const {
    std::unique_lock<std::mutex> lk(m_);
    return cv_.wait_for(lk, limit, [&] { return waiting_; });
  }

 private:
  std::atomic<bool> done_{false};
  mutable bool waiting_ = false;  // under m_
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
};

TEST(HostStreams, ForeignEventIsWaitedForThroughHostWait) {
  auto d = devices("cpu:1");
  auto s = d[0]->create_stream(ag::step_kind::compute).value();
  foreign_event fe;
  std::atomic<bool> ran{false};
  d[0]->wait(*s, fe);
  d[0]->notify(*s, [&](const error&) { ran = true; });
  // The worker is inside fe's host_wait: the notify behind it cannot have run.
  ASSERT_TRUE(fe.wait_until_waited_for()) << "the stream never waited for the foreign event";
  EXPECT_FALSE(ran.load());
  fe.complete();
  ASSERT_FALSE(d[0]->synchronize(*s));
  EXPECT_TRUE(ran.load());
}

TEST(HostStreams, DestroyingAStreamDropsBlockedWorkWithoutHanging) {
  auto d = devices("cpu:1");
  gate g;  // never opened
  std::atomic<int> calls{0};
  error got;
  auto ev = d[0]->create_event().value();
  {
    auto s = d[0]->create_stream(ag::step_kind::compute).value();
    d[0]->wait(*s, g.ev);
    d[0]->record(*ev, *s);
    d[0]->notify(*s, [&](const error& e) {
      got = e;
      calls.fetch_add(1);
    });
  }  // destructor: drops the pending work
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(got.code, errc::cancelled);
  EXPECT_TRUE(ev->query()) << "events recorded on a dropped stream complete";
}

TEST(HostStreams, CpuDeviceMemoryIsCountedAndOutOfMemoryNamesTheDevice) {
  auto d = devices("cpu:1");
  auto& dev = *d[0];
  EXPECT_EQ(dev.spec().name, "cpu0");
  EXPECT_EQ(dev.memory_capacity(), gpu::cpu::default_capacity);
  auto a = dev.allocate(1000);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 64, 0u);
  EXPECT_EQ(dev.memory_in_use(), 1000);
  auto too_big = dev.allocate(dev.memory_capacity());
  ASSERT_FALSE(too_big.has_value());
  EXPECT_EQ(too_big.err().code, errc::out_of_memory);
  EXPECT_EQ(too_big.err().device, 0) << too_big.err().to_string();
  EXPECT_EQ(dev.memory_in_use(), 1000);
  dev.deallocate(*a);
  EXPECT_EQ(dev.memory_in_use(), 0);
  auto neg = dev.allocate(-5);
  ASSERT_FALSE(neg.has_value());
  EXPECT_EQ(neg.err().code, errc::invalid_argument);
  auto h = dev.allocate_host(256);
  ASSERT_TRUE(h.has_value());
  dev.deallocate_host(*h);
}

// Allocations of 2 MiB and more come from their own mappings, aligned to a
// huge page (gpu/host/host_device.cpp): every byte of an odd size is usable
// (the mapping's tail ends on the 4 KiB page after the last byte), the
// counts stay exact, and freeing returns them.
TEST(HostStreams, LargeCpuDeviceAllocationsStartOnAHugePageAndHoldEveryByte) {
  auto d = devices("cpu:1");
  auto& dev = *d[0];
  constexpr int64_t huge = int64_t{2} << 20;
  const int64_t sizes[] = {huge, huge + 4096 + 100, 3 * huge - 64, 5 * huge + 1};
  const bool huge_pages_on = gpu::host::huge_pages_enabled();  // off: AG_CPU_HUGE_PAGES=0, for comparisons
  std::vector<void*> blocks;
  int64_t total = 0;
  for (const int64_t bytes : sizes) {
    auto a = dev.allocate(bytes);
    ASSERT_TRUE(a.has_value()) << a.err().to_string();
    if (huge_pages_on) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % huge, 0u) << bytes << " bytes";
    }
    auto* p = static_cast<unsigned char*>(*a);
    // A pattern over every byte, read back after all blocks exist: blocks
    // that overlapped, or a tail cut short, would lose some of it.
    for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>((i * 131 + bytes) & 0xff);
    blocks.push_back(*a);
    total += bytes;
    EXPECT_EQ(dev.memory_in_use(), total);
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const auto* p = static_cast<const unsigned char*>(blocks[b]);
    int64_t wrong = 0;
    for (int64_t i = 0; i < sizes[b]; ++i) wrong += p[i] != static_cast<unsigned char>((i * 131 + sizes[b]) & 0xff);
    EXPECT_EQ(wrong, 0) << sizes[b] << " bytes";
  }
  for (void* p : blocks) dev.deallocate(p);
  EXPECT_EQ(dev.memory_in_use(), 0);
}

TEST(HostStreams, BadCopyArgumentsFailAtOnce) {
  auto d = devices("cpu:1");
  auto s = d[0]->create_stream(ag::step_kind::copy_h2d).value();
  int x = 0;
  const error e = d[0]->copy_h2d(*s, nullptr, &x, 4);
  EXPECT_EQ(e.code, errc::invalid_argument);
  EXPECT_EQ(e.device, 0) << e.to_string();
  EXPECT_EQ(d[0]->copy_d2h(*s, &x, &x, -1).code, errc::invalid_argument);
}

TEST(HostStreams, AsyncKernelErrorReachesNotifyAsOpFailed) {
  auto d = devices("cpu:1");
  auto& dev = *d[0];
  graph_builder b;
  auto table = b.input("table", dtype::f32, {4, 2});
  auto ids = b.input("ids", dtype::i32, {2});
  b.output(b.get_rows(table, ids, "emb_lookup"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value());
  const node& n = g->at(g->find("emb_lookup"));
  std::vector<float> t(8, 1.0f), out(4, 0.0f);
  std::vector<int32_t> idv = {0, 9};  // 9 is out of range: found only when the op runs
  gpu::op_launch l;
  l.op = &n;
  l.inputs = {{t.data(), dtype::f32, {4, 2}, contiguous_strides({4, 2})},
              {idv.data(), dtype::i32, {2}, contiguous_strides({2})}};
  l.out = {out.data(), dtype::f32, {2, 2}, contiguous_strides({2, 2})};
  auto s = dev.create_stream(ag::step_kind::compute).value();
  ASSERT_FALSE(dev.launch(*s, l));
  std::promise<error> p;
  dev.notify(*s, [&](const error& e) { p.set_value(e); });
  const error e = p.get_future().get();
  EXPECT_EQ(e.code, errc::op_failed);
  EXPECT_EQ(e.op, "emb_lookup") << e.to_string();
  EXPECT_EQ(e.device, 0) << e.to_string();
  EXPECT_FALSE(dev.synchronize(*s)) << "the error was reported once, to notify";
}

TEST(HostStreams, CpuDeviceLaunchComputesMatmul) {
  auto d = devices("cpu:1");
  auto& dev = *d[0];
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 4});
  auto w = b.input("w", dtype::f32, {4, 2});
  b.output(b.matmul(x, w, false, false, "mm"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value());
  rng r(5);
  std::vector<float> xv(12), wv(8), out(6, 0.0f);
  for (auto& v : xv) v = static_cast<float>(r.normal());
  for (auto& v : wv) v = static_cast<float>(r.normal());
  auto dx = dev.allocate(48), dw = dev.allocate(32), dy = dev.allocate(24);
  ASSERT_TRUE(dx && dw && dy);
  auto s = dev.create_stream(ag::step_kind::compute).value();
  ASSERT_FALSE(dev.copy_h2d(*s, *dx, xv.data(), 48));
  ASSERT_FALSE(dev.copy_h2d(*s, *dw, wv.data(), 32));
  gpu::op_launch l;
  l.op = &g->at(g->find("mm"));
  l.source = &*g;
  l.inputs = {{*dx, dtype::f32, {3, 4}, contiguous_strides({3, 4})}, {*dw, dtype::f32, {4, 2}, contiguous_strides({4, 2})}};
  l.out = {*dy, dtype::f32, {3, 2}, contiguous_strides({3, 2})};
  ASSERT_FALSE(dev.launch(*s, l));
  ASSERT_FALSE(dev.copy_d2h(*s, out.data(), *dy, 24));
  ASSERT_FALSE(dev.synchronize(*s));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      double acc = 0;
      for (int k = 0; k < 4; ++k) acc += double(xv[i * 4 + k]) * wv[k * 2 + j];
      EXPECT_NEAR(out[i * 2 + j], acc, 1e-5);
    }
  for (void* p : {*dx, *dw, *dy}) dev.deallocate(p);
}

}  // namespace
