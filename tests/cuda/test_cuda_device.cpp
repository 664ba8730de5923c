// The CUDA device beyond kernels: stream ordering through events (spin gate),
// notify, peer copies, out-of-memory, device enumeration without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "gpu/cuda/cuda_testing.hpp"

namespace ag {
namespace {

using namespace std::chrono_literals;

volatile uint32_t* as_flag(void* p) { return static_cast<volatile uint32_t*>(p); }

// Destroys the shared devices (streams, poller threads) while the CUDA runtime
// is still loaded, not in static destruction after main().
class release_gpus_env : public ::testing::Environment {
 public:
  void TearDown() override { test::release_gpus(); }
};
[[maybe_unused]] ::testing::Environment* const release_env =
    ::testing::AddGlobalTestEnvironment(new release_gpus_env);

TEST(CudaDevice, EnumerationNeverCrashesRejectsBadOrdinalsAndSharesAGpuWhenRepeated) {
  // Runs with or without a GPU: without one, creating devices is an error value.
  const int n = gpu::cuda::device_count();
  ASSERT_GE(n, 0);
  auto made = gpu::cuda::make_cuda_devices({n + 3}, {}, 0);
  ASSERT_FALSE(made);
  EXPECT_EQ(made.err().code, errc::bad_device_spec) << made.err().to_string();
  if (n == 0) GTEST_SKIP() << "no CUDA device: only the no-GPU path was checked";
  // A repeated ordinal is two logical devices of one GPU (how multi-device
  // CUDA code is tested on a 1-GPU machine), each named apart.
  auto shared = gpu::cuda::make_cuda_devices({0, 0}, {}, 0);
  ASSERT_TRUE(shared) << shared.err().to_string();
  ASSERT_EQ(shared->size(), 2u);
  EXPECT_EQ((*shared)[0]->spec().name, "cuda0");
  EXPECT_EQ((*shared)[1]->spec().name, "cuda0.1");
}

// Lazy loading would load a kernel on its first launch, which may
// synchronise the GPU's whole context: with an in-stream part spinning on
// the GPU for another logical device of it, a deadlock
// (gpu/cuda/kernel_preload.hpp). Making the devices loads every own kernel.
TEST(CudaDevice, MakingTheDevicesLoadsEveryOwnKernel) {
  AG_REQUIRE_GPU(1);
  auto made = gpu::cuda::make_cuda_devices({0}, {}, 0);
  ASSERT_TRUE(made) << made.err().to_string();
  int modules = 0;
  auto unloaded = gpu::cuda::testing::unloaded_kernels(0, &modules);
  ASSERT_TRUE(unloaded) << unloaded.err().to_string();
  if (*unloaded < 0) GTEST_SKIP() << "the driver is older than CUDA 12.4: it cannot tell whether a kernel is loaded";
  EXPECT_EQ(*unloaded, 0) << "of the kernels of " << modules << " modules";
  // One module per .cu file with kernels (AG_CUDA_MODULE_ANCHOR): argmax,
  // attention, collective, decode_step, elementwise, flash_attention, gemv,
  // get_rows, in_stream, norm, range_mask, rope, softmax, sync (gemm.cu calls
  // cuBLAS only).
  EXPECT_EQ(modules, 14);
}

TEST(CudaDevice, SpecComesFromTheHardware) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  const auto& s = d->spec();
  EXPECT_EQ(s.name, "cuda0");
  EXPECT_EQ(s.kind, device_kind::cuda);
  EXPECT_GT(s.mem_bytes, int64_t{1} << 30);
  EXPECT_GT(s.mem_bandwidth, 1e11);
  EXPECT_GT(s.flops_bf16, s.flops_f32);
  EXPECT_GE(s.copy_engines, 1);
  std::printf("cuda0: mem %.1f GiB, bandwidth %.0f GB/s, f32 %.1f TFLOP/s, bf16 %.0f TFLOP/s, copy engines %d\n",
              s.mem_bytes / double(1 << 30), s.mem_bandwidth / 1e9, s.flops_f32 / 1e12, s.flops_bf16 / 1e12,
              s.copy_engines);
}

TEST(CudaDevice, EventWaitOrdersStreamsSpinGate) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto a = d->create_stream(ag::step_kind::compute).value();
  auto b = d->create_stream(ag::step_kind::compute).value();
  auto gate_mem = d->allocate_host(64);
  ASSERT_TRUE(gate_mem);
  auto* gate = as_flag(*gate_mem);
  auto* out = as_flag(static_cast<char*>(*gate_mem) + 32);
  gate[0] = 0;
  out[0] = 0;
  ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(*d, *a, gate));
  auto ev = d->create_event().value();
  d->record(*ev, *a);
  d->wait(*b, *ev);
  ASSERT_FALSE(gpu::cuda::testing::launch_write_value(*d, *b, const_cast<uint32_t*>(out), 0xC0FFEEu));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(out[0], 0u) << "stream B ran past its wait while the gate on stream A was closed";
  EXPECT_FALSE(ev->query());
  gate[0] = 1;  // release
  ASSERT_FALSE(d->synchronize(*b));
  EXPECT_EQ(out[0], 0xC0FFEEu);
  EXPECT_EQ(gate[0], 2u) << "the gate kernel marks that it passed";
  EXPECT_TRUE(ev->query());
  d->deallocate_host(*gate_mem);
}

// deallocate() defers cudaFree, which would wait for all of the GPU's work
// (a plan unloaded beside running jobs stalled them; on logical devices of
// one GPU it deadlocked with spinning in-stream parts): it returns while a
// kernel still spins on the GPU, and the memory is freed when an allocation
// runs short, which then succeeds.
TEST(CudaDevice, GivingMemoryBackNeitherWaitsForTheGpuNorLosesTheMemory) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::compute).value();
  auto gate_mem = d->allocate_host(64);
  ASSERT_TRUE(gate_mem);
  auto* gate = as_flag(*gate_mem);
  gate[0] = 0;
  auto buf = d->allocate(1 << 20);
  ASSERT_TRUE(buf) << buf.err().to_string();
  const int64_t in_use = d->memory_in_use();
  ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(*d, *s, gate));
  // A watchdog opens the gate after 20 s; a deallocate that waited for the
  // GPU would return only then.
  std::atomic<bool> opened_by_watchdog{false}, done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 2000 && !done.load(); ++i) std::this_thread::sleep_for(10ms);
    if (!done.load()) {
      opened_by_watchdog = true;
      gate[0] = 1;
    }
  });
  d->deallocate(*buf);
  const bool gate_still_closed = gate[0] == 0;
  done = true;
  gate[0] = 1;
  watchdog.join();
  EXPECT_FALSE(opened_by_watchdog.load()) << "deallocate waited for the spinning kernel";
  EXPECT_TRUE(gate_still_closed);
  EXPECT_EQ(d->memory_in_use(), in_use - (1 << 20));
  ASSERT_FALSE(d->synchronize(*s));
  // Two thirds of the free memory, given back, then asked for again: the
  // second allocation fits only once the first one is really freed.
  auto free_b = gpu::cuda::testing::free_gpu_memory(*d);
  ASSERT_TRUE(free_b) << free_b.err().to_string();
  const int64_t big = *free_b / 3 * 2;
  auto first = d->allocate(big);
  ASSERT_TRUE(first) << first.err().to_string();
  d->deallocate(*first);
  auto second = d->allocate(big);
  ASSERT_TRUE(second) << "memory given back was not reused: " << second.err().to_string();
  d->deallocate(*second);
  d->deallocate_host(*gate_mem);
}

TEST(CudaDevice, NotifyFiresOnceAfterTheWorkWithLowLatency) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::compute).value();
  auto mem = d->allocate_host(64);
  ASSERT_TRUE(mem);
  auto* gate = as_flag(*mem);
  for (auto mode : {gpu::cuda::notify_mode::poller, gpu::cuda::notify_mode::host_func}) {
    gpu::cuda::set_notify_mode(*d, mode);
    gate[0] = 0;
    ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(*d, *s, gate));
    std::atomic<int> calls{0};
    std::atomic<int64_t> fired_at{0};
    std::atomic<bool> was_ok{false};
    d->notify(*s, [&](const error& e) {
      fired_at = gpu::host_clock_ns();
      was_ok = e.ok();
      calls.fetch_add(1);
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(calls.load(), 0) << "notify fired before the gated work completed";
    const int64_t released = gpu::host_clock_ns();
    gate[0] = 1;
    for (int i = 0; i < 5000 && calls.load() == 0; ++i) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(calls.load(), 1);
    EXPECT_TRUE(was_ok.load());
    // Not a timed assertion: the figure is printed (benchmarks measure it).
    std::printf("notify (%s): release -> callback %.1f us\n",
                mode == gpu::cuda::notify_mode::poller ? "poller" : "cudaLaunchHostFunc",
                (fired_at.load() - released) / 1e3);
    std::this_thread::sleep_for(5ms);
    EXPECT_EQ(calls.load(), 1) << "called exactly once";
  }
  gpu::cuda::set_notify_mode(*d, gpu::cuda::notify_mode::poller);
  d->deallocate_host(*mem);
}

/// GPU 0 as a device of its own with backend_options::cuda_launch_on_poller
/// = `on_poller` (the shared test device keeps the defaults).
gpu::device_ptr gpu0_launching_on_poller(bool on_poller) {
  gpu::backend_options o;
  o.cuda_launch_on_poller = on_poller;
  auto made = gpu::cuda::make_cuda_devices({0}, o, 0);
  if (!made) {
    ADD_FAILURE() << made.err().to_string();
    return nullptr;
  }
  return (*made)[0];
}

/// A replay graph of one copy: the 4-byte word at device address `word` to
/// pinned host memory at `dst`.
expected<std::unique_ptr<gpu::replay_graph>> capture_word_copy(gpu::device& d, gpu::stream& s, void* word,
                                                              uint32_t* dst) {
  gpu::segment_op copy_out{gpu::segment_op::kind::copy_d2h, nullptr, dst, word, sizeof(uint32_t)};
  return d.capture_segment(s, &copy_out, 1);
}

// device::replay_and_notify hands the graph launch to the poller thread
// (backend_options::cuda_launch_on_poller); a direct call on the same stream
// made right after must still land behind it. Each round writes k + 1 into a
// device word with a direct kernel, then replays a graph that copies the word
// into the round's own pinned slot: the slot must hold k + 1, not a later
// round's value. Batches of 64 rounds (one graph per slot), checked once
// their notifications came; the first batch queues behind a spin gate, the
// rest race the poller. With the option on the poller makes (nearly) every
// launch, with it off none.
TEST(CudaDevice, ReplayedTailsLaunchedByThePollerKeepTheStreamsOrder) {
  AG_REQUIRE_GPU(1);
  if (const char* v = std::getenv("AG_CUDA_LAUNCH_ON_POLLER"); v && *v)
    GTEST_SKIP() << "AG_CUDA_LAUNCH_ON_POLLER=" << v << " overrides the option this test compares";
  for (const bool on_poller : {true, false}) {
    SCOPED_TRACE(on_poller ? "launches on the poller" : "launches on the caller");
    gpu::device_ptr dev = gpu0_launching_on_poller(on_poller);
    ASSERT_TRUE(dev);
    gpu::device& d = *dev;
    auto s = d.create_stream(ag::step_kind::compute).value();
    auto word = d.allocate(64);
    auto gate_mem = d.allocate_host(64);
    ASSERT_TRUE(word && gate_mem);
    host_memory_resource* pinned = d.host_memory();
    ASSERT_NE(pinned, nullptr);
    constexpr int slots = 64, batches = 40;
    auto* out = static_cast<uint32_t*>(pinned->allocate(slots * sizeof(uint32_t)));
    std::vector<std::unique_ptr<gpu::replay_graph>> graphs;
    for (int j = 0; j < slots; ++j) {
      auto g = capture_word_copy(d, *s, *word, out + j);
      ASSERT_TRUE(g) << g.err().to_string();
      graphs.push_back(std::move(*g));
    }
    const uint64_t launched_before = gpu::cuda::testing::launches_on_poller(d).value();
    std::atomic<int> calls{0}, errors{0};
    int out_of_order = 0;
    auto* gate = as_flag(*gate_mem);
    for (int batch = 0; batch < batches; ++batch) {
      gate[0] = 0;
      if (batch == 0) {
        ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(d, *s, gate));
      }
      for (int j = 0; j < slots; ++j) {
        const uint32_t k = static_cast<uint32_t>(batch * slots + j);
        ASSERT_FALSE(gpu::cuda::testing::launch_write_value(d, *s, static_cast<uint32_t*>(*word), k + 1));
        ASSERT_FALSE(d.replay_and_notify(*s, *graphs[static_cast<std::size_t>(j)], [&](const error& e) {
          if (!e.ok()) errors.fetch_add(1);
          calls.fetch_add(1);
        }));
      }
      gate[0] = 1;
      const int want = (batch + 1) * slots;
      for (int i = 0; i < 10000 && calls.load() < want; ++i) std::this_thread::sleep_for(100us);
      ASSERT_EQ(calls.load(), want) << "batch " << batch;
      for (int j = 0; j < slots; ++j)
        out_of_order += out[j] != static_cast<uint32_t>(batch * slots + j + 1);
    }
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(out_of_order, 0) << "rounds whose slot holds another round's value";
    const uint64_t launched = gpu::cuda::testing::launches_on_poller(d).value() - launched_before;
    std::printf("launches made by the poller: %llu of %d\n", static_cast<unsigned long long>(launched),
                slots * batches);
    if (on_poller)
      EXPECT_GE(launched, static_cast<uint64_t>(slots * batches / 2)) << "the poller, awake with work pending, launched few";
    else
      EXPECT_EQ(launched, 0u);
    graphs.clear();
    ASSERT_FALSE(d.synchronize(*s));
    pinned->deallocate(out, slots * sizeof(uint32_t));
    d.deallocate(*word);
    d.deallocate_host(*gate_mem);
  }
}

// While the poller runs a callback (a job's continuations: user code that
// may take long) it does not count as awake: replay_and_notify then launches
// on the caller's thread, so neither the launch nor a later call on the
// stream waits for the callback. A callback that blocks until released holds
// the poller; meanwhile ten replays and a synchronize must finish, with no
// launch made by the poller, and their notifications fire once it is free.
TEST(CudaDevice, ReplaysDoNotWaitForACallbackThatHoldsThePoller) {
  AG_REQUIRE_GPU(1);
  if (const char* v = std::getenv("AG_CUDA_LAUNCH_ON_POLLER"); v && *v)
    GTEST_SKIP() << "AG_CUDA_LAUNCH_ON_POLLER=" << v << " overrides the option this test needs on";
  gpu::device_ptr dev = gpu0_launching_on_poller(true);
  ASSERT_TRUE(dev);
  gpu::device& d = *dev;
  auto s = d.create_stream(ag::step_kind::compute).value();
  auto word = d.allocate(64);
  ASSERT_TRUE(word);
  host_memory_resource* pinned = d.host_memory();
  ASSERT_NE(pinned, nullptr);
  auto* out = static_cast<uint32_t*>(pinned->allocate(64));
  auto g = capture_word_copy(d, *s, *word, out);
  ASSERT_TRUE(g) << g.err().to_string();
  std::atomic<bool> entered{false}, release{false};
  std::atomic<int> calls{0};
  struct releaser {  // whatever assertion returns early, the poller is let go
    std::atomic<bool>& r;
    ~releaser() { r = true; }
  } const let_go{release};
  d.notify(*s, [&](const error&) {
    entered = true;
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  for (int i = 0; i < 5000 && !entered.load(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(entered.load()) << "the blocking callback never ran";
  const uint64_t launched_before = gpu::cuda::testing::launches_on_poller(d).value();
  auto replays = std::async(std::launch::async, [&] {
    for (int k = 0; k < 10; ++k) {
      if (error e = gpu::cuda::testing::launch_write_value(d, *s, static_cast<uint32_t*>(*word), k + 1)) return e;
      if (error e = d.replay_and_notify(*s, **g, [&](const error&) { calls.fetch_add(1); })) return e;
    }
    return d.synchronize(*s);
  });
  const bool finished = replays.wait_for(10s) == std::future_status::ready;
  const uint64_t launched = gpu::cuda::testing::launches_on_poller(d).value() - launched_before;
  release = true;
  ASSERT_TRUE(finished) << "replays and synchronize waited for the callback holding the poller";
  ASSERT_FALSE(replays.get());
  EXPECT_EQ(*out, 10u) << "the last replay copied the last value";
  EXPECT_EQ(launched, 0u) << "the poller was handed launches while a callback held it";
  for (int i = 0; i < 5000 && calls.load() < 10; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(calls.load(), 10);
  g->reset();
  pinned->deallocate(out, 64);
  d.deallocate(*word);
}

TEST(CudaDevice, ManyNotifiesOnSeveralStreamsAllFire) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  std::vector<std::unique_ptr<gpu::stream>> ss;
  for (int i = 0; i < 4; ++i) ss.push_back(d->create_stream(ag::step_kind::compute).value());
  std::atomic<int> calls{0}, errors{0};
  constexpr int per_stream = 500;
  for (int k = 0; k < per_stream; ++k)
    for (auto& s : ss)
      d->notify(*s, [&](const error& e) {
        if (!e.ok()) errors.fetch_add(1);
        calls.fetch_add(1);
      });
  for (int i = 0; i < 5000 && calls.load() < 4 * per_stream; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(calls.load(), 4 * per_stream);
  EXPECT_EQ(errors.load(), 0);
}

TEST(CudaDevice, CopiesRoundTripThroughPinnedStaging) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  const int64_t n = (1 << 20) + 7;
  auto h2d = d->create_stream(ag::step_kind::copy_h2d).value();
  auto d2h = d->create_stream(ag::step_kind::copy_d2h).value();
  auto src = d->allocate_host(n * 4);
  auto dst = d->allocate_host(n * 4);
  auto dev = d->allocate(n * 4);
  ASSERT_TRUE(src && dst && dev);
  host_tensor v = host_tensor::random_normal(dtype::f32, {n}, 99);
  std::memcpy(*src, v.data(), v.bytes());
  std::memset(*dst, 0, v.bytes());
  ASSERT_FALSE(d->copy_h2d(*h2d, *dev, *src, n * 4));
  auto ev = d->create_event().value();
  d->record(*ev, *h2d);
  d->wait(*d2h, *ev);
  ASSERT_FALSE(d->copy_d2h(*d2h, *dst, *dev, n * 4));
  ASSERT_FALSE(d->synchronize(*d2h));
  EXPECT_EQ(std::memcmp(*dst, v.data(), v.bytes()), 0);
  d->deallocate(*dev);
  d->deallocate_host(*src);
  d->deallocate_host(*dst);
}

// upload() is synchronous (gpu::device): from pageable memory cudaMemcpy
// returns once the source is staged, its last DMA still queued on the
// default stream, which the runtime's non-blocking streams do not wait
// for. A copy on such a stream right after the upload reads every byte it
// wrote, including the last ones, over several rounds.
TEST(CudaDevice, UploadedBytesAreThereForAStreamThatStartsRightAfter) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  const int64_t n = int64_t{48} << 20;  // floats: 192 MiB from pageable memory
  const int64_t tail = int64_t{1} << 18;  // the last 1 MiB
  auto d2h = d->create_stream(ag::step_kind::copy_d2h).value();
  auto dev = d->allocate(n * 4);
  auto back = d->allocate_host(tail * 4);
  ASSERT_TRUE(dev && back);
  std::vector<float> host(static_cast<std::size_t>(n));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    for (int64_t i = n - tail; i < n; ++i) host[static_cast<std::size_t>(i)] = static_cast<float>(i % 1009 + round);
    ASSERT_FALSE(d->upload(*dev, host.data(), n * 4));
    ASSERT_FALSE(d->copy_d2h(*d2h, *back, static_cast<float*>(*dev) + (n - tail), tail * 4));
    ASSERT_FALSE(d->synchronize(*d2h));
    EXPECT_EQ(std::memcmp(*back, host.data() + (n - tail), static_cast<std::size_t>(tail) * 4), 0);
  }
  d->deallocate(*dev);
  d->deallocate_host(*back);
}

TEST(CudaDevice, PeerCopyBetweenTwoGpusWithCrossDeviceWait) {
  AG_REQUIRE_GPU(2);
  auto made = gpu::cuda::make_cuda_devices({0, 1}, {}, 0);
  ASSERT_TRUE(made) << made.err().to_string();
  auto& d0 = *(*made)[0];
  auto& d1 = *(*made)[1];
  EXPECT_EQ(d1.spec().name, "cuda1");
  EXPECT_EQ(d1.index(), 1);
  const int64_t n = (8 << 20) + 3;
  host_tensor v = host_tensor::random_uniform(dtype::f32, {n}, 1234);
  auto a = d0.allocate(n * 4);
  auto b = d1.allocate(n * 4);
  ASSERT_TRUE(a && b);
  auto s0 = d0.create_stream(ag::step_kind::copy_h2d).value();
  auto s1 = d1.create_stream(ag::step_kind::copy_peer).value();
  auto pinned = d0.allocate_host(n * 4);
  ASSERT_TRUE(pinned);
  std::memcpy(*pinned, v.data(), v.bytes());
  ASSERT_FALSE(d0.copy_h2d(*s0, *a, *pinned, n * 4));
  auto ev = d0.create_event().value();
  d0.record(*ev, *s0);
  d1.wait(*s1, *ev);  // cross-device event wait: the peer copy must see the upload
  ASSERT_FALSE(d1.copy_peer(*s1, *b, d0, *a, n * 4));
  ASSERT_FALSE(d1.synchronize(*s1));
  std::vector<std::byte> back(v.bytes());
  ASSERT_FALSE(d1.download(back.data(), *b, n * 4));
  EXPECT_EQ(std::memcmp(back.data(), v.data(), v.bytes()), 0);
  d0.deallocate(*a);
  d1.deallocate(*b);
  d0.deallocate_host(*pinned);
}

TEST(CudaDevice, OutOfMemoryIsAnErrorNotACrash) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  const int64_t before = d->memory_in_use();
  auto p = d->allocate(d->memory_capacity() * 4);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.err().code, errc::out_of_memory) << p.err().to_string();
  EXPECT_NE(p.err().message.find("free"), std::string::npos) << p.err().to_string();
  EXPECT_EQ(d->memory_in_use(), before);
  EXPECT_TRUE(d->alive());
  // The device still works afterwards.
  auto q = d->allocate(1 << 20);
  ASSERT_TRUE(q) << q.err().to_string();
  EXPECT_EQ(d->memory_in_use(), before + (1 << 20));
  d->deallocate(*q);
  EXPECT_EQ(d->memory_in_use(), before);
}

TEST(CudaDevice, TimingEventsUseTheHostClock) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto s = d->create_stream(ag::step_kind::compute).value();
  auto mem = d->allocate_host(64);
  ASSERT_TRUE(mem);
  auto* gate = as_flag(*mem);
  gate[0] = 0;
  auto e0 = d->create_event(true).value();
  auto e1 = d->create_event(true).value();
  d->record(*e0, *s);
  ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(*d, *s, gate));
  d->record(*e1, *s);
  const int64_t t0 = gpu::host_clock_ns();
  std::this_thread::sleep_for(20ms);
  const int64_t t_release = gpu::host_clock_ns();
  gate[0] = 1;
  ASSERT_FALSE(d->synchronize(*s));
  const int64_t t_done = gpu::host_clock_ns();
  ASSERT_TRUE(e0->query() && e1->query());
  // e1 completes after the host released the gate and before synchronize returned
  // (1 ms slack for the clock calibration).
  EXPECT_GE(e1->completion_ns(), t_release - 1'000'000);
  EXPECT_LE(e1->completion_ns(), t_done + 1'000'000);
  EXPECT_LE(e0->completion_ns(), t0 + 1'000'000);
  EXPECT_GT(e1->completion_ns() - e0->completion_ns(), 15'000'000);
  d->deallocate_host(*mem);
}

TEST(CudaDevice, HostBackendEventIsWaitedForOnTheGpu) {
  AG_REQUIRE_GPU(1);
  auto d = test::gpu0();
  ASSERT_TRUE(d);
  auto cpu = gpu::make_devices("cpu:1");
  ASSERT_TRUE(cpu) << cpu.err().to_string();
  auto& h = *(*cpu)[0];
  auto hs = h.create_stream(ag::step_kind::compute).value();
  auto hev = h.create_event().value();
  // Hold the host stream: its worker waits for a CUDA event gated by the host.
  auto gs = d->create_stream(ag::step_kind::compute).value();
  auto mem = d->allocate_host(64);
  ASSERT_TRUE(mem);
  auto* gate = as_flag(*mem);
  auto* out = as_flag(static_cast<char*>(*mem) + 32);
  gate[0] = 0;
  out[0] = 0;
  ASSERT_FALSE(gpu::cuda::testing::launch_spin_gate(*d, *gs, gate));
  auto gev = d->create_event().value();
  d->record(*gev, *gs);
  h.wait(*hs, *gev);   // host stream waits for the GPU gate
  h.record(*hev, *hs); // host event completes after that
  auto s = d->create_stream(ag::step_kind::compute).value();
  d->wait(*s, *hev);   // GPU stream waits for the host event (no host block)
  ASSERT_FALSE(gpu::cuda::testing::launch_write_value(*d, *s, const_cast<uint32_t*>(out), 7u));
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(out[0], 0u) << "the GPU stream ran past a pending host event";
  gate[0] = 1;
  ASSERT_FALSE(d->synchronize(*s));
  EXPECT_EQ(out[0], 7u);
  EXPECT_TRUE(hev->query());
  ASSERT_FALSE(h.synchronize(*hs));
  d->deallocate_host(*mem);
}

}  // namespace
}  // namespace ag
