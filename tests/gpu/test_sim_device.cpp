// The sim device: modelled time (lower bounds only), jitter determinism,
// values through the cpu kernels, the instant mode, fault injection.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/host/host_stream.hpp"
#include "gpu/sim/sim_device.hpp"
#include "graph/cost_model.hpp"
#include "graph/random.hpp"

namespace {

using namespace ag;
using namespace std::chrono_literals;

std::shared_ptr<gpu::sim::sim_device> make_sim(const gpu::sim_options& o, const std::string& spec = "sim:1",
                                               int which = 0) {
  gpu::backend_options b;
  b.sim = o;
  auto d = gpu::make_devices(spec, b);
  EXPECT_TRUE(d.has_value()) << (d ? "" : d.err().to_string());
  if (!d) return nullptr;
  return std::dynamic_pointer_cast<gpu::sim::sim_device>((*d)[static_cast<std::size_t>(which)]);
}

// A small graph with one scale op over `n` floats; launches it on a sim.
struct scale_job {
  graph g;
  const node* op = nullptr;
  int64_t n;
  std::vector<float> in, out;

  explicit scale_job(int64_t count, uint64_t seed = 1) : n(count), in(static_cast<std::size_t>(count)),
                                                          out(static_cast<std::size_t>(count), 0.0f) {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {count});
    b.output(b.scale(x, 3.0f, "triple"));
    g = *std::move(b).build();
    op = &g.at(g.find("triple"));
    rng r(seed);
    for (auto& v : in) v = static_cast<float>(r.normal());
  }
  gpu::op_launch launch(void* dx, void* dy) const {
    gpu::op_launch l;
    l.op = op;
    l.source = &g;
    l.inputs = {{dx, dtype::f32, {n}, contiguous_strides({n})}};
    l.out = {dy, dtype::f32, {n}, contiguous_strides({n})};
    return l;
  }
};

gpu::sim_options slow_launch_options(double launch_latency) {
  gpu::sim_options o;
  o.spec.launch_latency = launch_latency;  // dominates a tiny op: cost ~= latency
  return o;
}

TEST(SimDevice, OpsOccupyTheirStreamForAtLeastTheModelledTime) {
  auto dev = make_sim(slow_launch_options(0.015));
  ASSERT_TRUE(dev);
  EXPECT_EQ(dev->spec().name, "sim0");
  scale_job job(64);
  const double modelled = estimate_seconds(dev->spec(), job.g, *job.op);
  ASSERT_GE(modelled, 0.015);
  auto dx = dev->allocate(64 * 4), dy = dev->allocate(64 * 4);
  ASSERT_TRUE(dx && dy);
  ASSERT_FALSE(dev->upload(*dx, job.in.data(), 64 * 4));
  auto s = dev->create_stream(ag::step_kind::compute).value();
  auto ev = dev->create_event(true).value();
  const int64_t t0 = gpu::host_clock_ns();
  for (int i = 0; i < 3; ++i) ASSERT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
  dev->record(*ev, *s);
  ASSERT_FALSE(dev->synchronize(*s));
  const int64_t t1 = gpu::host_clock_ns();
  EXPECT_GE(double(t1 - t0) * 1e-9, 3 * modelled * 0.999);
  EXPECT_GE(double(ev->completion_ns() - t0) * 1e-9, 3 * modelled * 0.999);
  // values are real (compute_values defaults to true)
  ASSERT_FALSE(dev->download(job.out.data(), *dy, 64 * 4));
  for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(job.out[static_cast<std::size_t>(i)], 3.0f * job.in[static_cast<std::size_t>(i)]);
  EXPECT_EQ(dev->ops_run(), 3);
}

TEST(SimDevice, PeerCopyTakesAtLeastLinkLatencyPlusBytesOverBandwidth) {
  gpu::sim_options o;
  o.spec.link_latency = 0.01;
  o.spec.link_bandwidth = 1e9;  // 4 MB -> 4 ms
  gpu::backend_options b;
  b.sim = o;
  auto d = gpu::make_devices("sim:2", b);
  ASSERT_TRUE(d.has_value());
  auto& src = *(*d)[0];
  auto& dst = *(*d)[1];
  const int64_t bytes = 4'000'000;
  auto a = src.allocate(bytes), c = dst.allocate(bytes);
  ASSERT_TRUE(a && c);
  std::vector<uint8_t> data(static_cast<std::size_t>(bytes));
  rng r(3);
  for (auto& v : data) v = static_cast<uint8_t>(r.next() | 1);
  ASSERT_FALSE(src.upload(*a, data.data(), bytes));
  auto s = dst.create_stream(ag::step_kind::copy_peer).value();
  const double modelled = estimate_peer_copy_seconds(src.spec(), dst.spec(), bytes);
  ASSERT_GE(modelled, 0.014);
  const int64_t t0 = gpu::host_clock_ns();
  ASSERT_FALSE(dst.copy_peer(*s, *c, src, *a, bytes));
  ASSERT_FALSE(dst.synchronize(*s));
  EXPECT_GE(double(gpu::host_clock_ns() - t0) * 1e-9, modelled * 0.999);
  EXPECT_EQ(std::memcmp(*c, data.data(), static_cast<std::size_t>(bytes)), 0);
}

TEST(SimDevice, CopyStreamsShareTheCopyEngines) {
  gpu::sim_options o;
  o.spec.copy_engines = 1;
  o.spec.host_latency = 0.01;
  auto dev = make_sim(o);
  ASSERT_TRUE(dev);
  std::vector<char> h(64, 1);
  auto a = dev->allocate(64), a2 = dev->allocate(64);
  ASSERT_TRUE(a && a2);
  auto s1 = dev->create_stream(ag::step_kind::copy_h2d).value();
  auto s2 = dev->create_stream(ag::step_kind::copy_h2d).value();
  const double one = estimate_host_copy_seconds(dev->spec(), 64);
  const int64_t t0 = gpu::host_clock_ns();
  ASSERT_FALSE(dev->copy_h2d(*s1, *a, h.data(), 64));
  ASSERT_FALSE(dev->copy_h2d(*s2, *a2, h.data(), 64));
  ASSERT_FALSE(dev->synchronize(*s1));
  ASSERT_FALSE(dev->synchronize(*s2));
  // one engine: the two copies cannot overlap
  EXPECT_GE(double(gpu::host_clock_ns() - t0) * 1e-9, 2 * one * 0.999);
}

TEST(SimDevice, JitterIsDeterministicBySeed) {
  auto run = [](uint64_t seed, double jitter) {
    gpu::sim_options o;
    o.jitter = jitter;
    o.seed = seed;
    o.time_scale = 1e-9;  // modelled, but a modelled second takes a nanosecond
    o.compute_values = false;
    auto dev = make_sim(o);
    scale_job job(1 << 16);
    auto dx = dev->allocate(job.n * 4), dy = dev->allocate(job.n * 4);
    auto s = dev->create_stream(ag::step_kind::compute).value();
    for (int i = 0; i < 50; ++i) EXPECT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
    EXPECT_FALSE(dev->copy_h2d(*s, *dx, job.in.data(), job.n * 4));
    EXPECT_FALSE(dev->synchronize(*s));
    return std::make_pair(dev->modelled_seconds(), 50 * estimate_seconds(dev->spec(), job.g, *job.op) +
                                                       estimate_host_copy_seconds(dev->spec(), job.n * 4));
  };
  const auto a = run(7, 0.3), b = run(7, 0.3), c = run(8, 0.3), exact = run(7, 0.0);
  EXPECT_EQ(a.first, b.first);
  EXPECT_NE(a.first, c.first);
  EXPECT_NEAR(exact.first, exact.second, 1e-12);
  EXPECT_NE(a.first, exact.first);
}

// Graph replay: an op whose launch a segment's graph launch paid is charged
// spec.kernel_latency instead of spec.launch_latency.
TEST(SimDevice, ReplayedOpsAreChargedTheKernelLatencyInsteadOfTheLaunchLatency) {
  auto run = [](bool replayed) {
    gpu::sim_options o;
    o.jitter = 0;
    o.time_scale = 1e-9;
    o.compute_values = false;
    auto dev = make_sim(o);
    scale_job job(1 << 10);
    auto dx = dev->allocate(job.n * 4), dy = dev->allocate(job.n * 4);
    auto s = dev->create_stream(ag::step_kind::compute).value();
    for (int i = 0; i < 10; ++i) {
      auto l = job.launch(*dx, *dy);
      l.launch_paid_by_replay = replayed && i > 0;
      EXPECT_FALSE(dev->launch(*s, l));
    }
    EXPECT_FALSE(dev->synchronize(*s));
    return std::make_pair(dev->modelled_seconds(), dev->spec().launch_latency - dev->spec().kernel_latency);
  };
  const auto plain = run(false), replay = run(true);
  EXPECT_GT(plain.second, 0);
  EXPECT_NEAR(plain.first - replay.first, 9 * plain.second, 1e-12);
}

// Timing only, no jitter; launch and kernel latency of 10 ms each dominate a tiny op.
gpu::sim_options latency_bound_options() {
  gpu::sim_options o;
  o.jitter = 0;
  o.compute_values = false;
  o.spec.launch_latency = 0.01;
  o.spec.kernel_latency = 0.01;
  return o;
}

// Milliseconds from t0 until the later of two streams has done its work.
double span_ms(gpu::device& dev, gpu::stream& s0, gpu::stream& s1, int64_t t0) {
  auto e0 = dev.create_event(true).value(), e1 = dev.create_event(true).value();
  EXPECT_FALSE(dev.record(*e0, s0));
  EXPECT_FALSE(dev.record(*e1, s1));
  EXPECT_FALSE(dev.synchronize(s0));
  EXPECT_FALSE(dev.synchronize(s1));
  return static_cast<double>(std::max(e0->completion_ns(), e1->completion_ns()) - t0) * 1e-6;
}

// Two compute lanes of one device: plain launches of tiny ops come one after
// another on the device's launch clock (one actor launches every lane), so a
// second lane gains nothing; replayed ops hold only their own stream for the
// kernel latency, so two lanes overlap them (as 4 streams did on an H100).
TEST(SimDevice, LanesOverlapReplayedKernelLatenciesButNotPlainLaunches) {
  auto two_lanes_ms = [](bool replayed) {
    auto dev = make_sim(latency_bound_options());
    scale_job job(16);
    auto dx = dev->allocate(64), dy = dev->allocate(64), dz = dev->allocate(64);
    auto s0 = dev->create_stream(ag::step_kind::compute).value();
    auto s1 = dev->create_stream(ag::step_kind::compute).value();
    const int64_t t0 = gpu::host_clock_ns();
    for (int i = 0; i < 6; ++i)
      for (auto [s, out] : {std::pair{s0.get(), *dy}, std::pair{s1.get(), *dz}}) {
        auto l = job.launch(*dx, out);
        l.launch_paid_by_replay = replayed && i > 0;
        EXPECT_FALSE(dev->launch(*s, l));
      }
    return span_ms(*dev, *s0, *s1, t0);
  };
  const double plain = two_lanes_ms(false), replay = two_lanes_ms(true);
  // plain: 12 launches back to back, >= 120 ms; replayed: the first launch of
  // each lane on the launch clock, then 5 latencies per lane side by side:
  // about 70 ms (host wake-ups may add a little, never take away).
  EXPECT_GE(plain, 120 * 0.999);
  EXPECT_GE(replay, 70 * 0.999);
  EXPECT_LT(replay, 0.8 * plain) << "replayed ops on two lanes did not overlap: " << replay << " vs " << plain << " ms";
}

// spec.kernel_issue_interval: the part of a replayed kernel's latency that
// holds the whole device (a GPU's front end starts kernels one at a time), so
// lanes of tiny replayed kernels are bound by their kernel count times it.
TEST(SimDevice, ReplayedKernelsOfAllLanesTakeTurnsForTheirIssueInterval) {
  auto four_lanes_ms = [](double issue_interval) {
    gpu::sim_options o = latency_bound_options();
    o.spec.kernel_issue_interval = issue_interval;
    auto dev = make_sim(o);
    scale_job job(16);
    auto dx = dev->allocate(64);
    std::vector<std::unique_ptr<gpu::stream>> lanes;
    std::vector<void*> outs;
    std::vector<std::unique_ptr<gpu::event>> done;
    for (int l = 0; l < 4; ++l) {
      lanes.push_back(dev->create_stream(ag::step_kind::compute).value());
      outs.push_back(dev->allocate(64).value());
      done.push_back(dev->create_event(true).value());
    }
    const int64_t t0 = gpu::host_clock_ns();
    for (int i = 0; i < 8; ++i)
      for (std::size_t l = 0; l < lanes.size(); ++l) {
        auto op = job.launch(*dx, outs[l]);
        op.launch_paid_by_replay = i > 0;
        EXPECT_FALSE(dev->launch(*lanes[l], op));
      }
    int64_t end = 0;
    for (std::size_t l = 0; l < lanes.size(); ++l) {
      EXPECT_FALSE(dev->record(*done[l], *lanes[l]));
      EXPECT_FALSE(dev->synchronize(*lanes[l]));
      end = std::max(end, done[l]->completion_ns());
    }
    return static_cast<double>(end - t0) * 1e-6;
  };
  const double overlapped = four_lanes_ms(0.0), issued = four_lanes_ms(0.008);
  // No issue interval: the 4 first launches back to back (40 ms), then each
  // lane's 7 replayed latencies side by side: about 110 ms. An issue interval
  // of 8 ms: the 28 replayed kernels take their turns, >= 224 ms (host
  // wake-ups may add a little, never take away).
  EXPECT_GE(overlapped, 110 * 0.999);
  EXPECT_GE(issued, 224 * 0.999);
  EXPECT_LT(overlapped, 0.8 * issued) << "the issue interval did not bind: " << overlapped << " vs " << issued << " ms";
}

// spec.gemm_sms: a product's partly filled last wave of tiles holds only its
// own stream (estimate_wave_tail_seconds), so a product on another lane
// fills it, as the planner's auto lanes assume. x [12, 8] x w [8, 4] in
// tiles of 4 is 3 tiles; on 2 SMs, 2 waves for 3 tiles: 60 ms of compute
// and a tail of 20. Two products on one lane: 2 x 80 ms; on two lanes the
// second's body follows the first's (one device's throughput) and the
// first's tail overlaps it: 60 + 60 + 20. Without waves (gemm_sms 0) the
// lanes gain nothing: 2 x 60 either way.
TEST(SimDevice, AProductsLastWaveHoldsOnlyItsStreamSoAnotherLaneFillsIt) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {12, 8});
  auto w = b.input("w", dtype::f32, {8, 4});
  b.output(b.matmul(x, w, false, false, "y"));
  const graph g = *std::move(b).build();
  const node& product = g.at(g.find("y"));
  const auto run_ms = [&](int gemm_sms, bool two_lanes) {
    gpu::sim_options o;
    o.jitter = 0;
    o.compute_values = false;
    o.spec.launch_latency = 0;
    o.spec.mem_bandwidth = 1e15;               // bound by compute
    o.spec.flops_f32 = 2.0 * 12 * 4 * 8 / 0.06;  // 60 ms a product
    o.spec.gemm_row_tile = 4;
    o.spec.gemm_sms = gemm_sms;
    auto dev = make_sim(o);
    auto dx = dev->allocate(12 * 8 * 4), dw = dev->allocate(8 * 4 * 4);
    auto dy = dev->allocate(12 * 4 * 4), dz = dev->allocate(12 * 4 * 4);
    auto s0 = dev->create_stream(ag::step_kind::compute).value();
    auto s1 = dev->create_stream(ag::step_kind::compute).value();
    const int64_t t0 = gpu::host_clock_ns();
    for (auto [s, out] : {std::pair{s0.get(), *dy}, std::pair{two_lanes ? s1.get() : s0.get(), *dz}}) {
      gpu::op_launch l;
      l.op = &product;
      l.source = &g;
      l.inputs = {{*dx, dtype::f32, {12, 8}, contiguous_strides({12, 8})},
                  {*dw, dtype::f32, {8, 4}, contiguous_strides({8, 4})}};
      l.out = {out, dtype::f32, {12, 4}, contiguous_strides({12, 4})};
      EXPECT_FALSE(dev->launch(*s, l));
    }
    return span_ms(*dev, *s0, *s1, t0);
  };
  const double one_lane = run_ms(2, false), two_lanes = run_ms(2, true);
  // Lower bounds exact (host wake-ups may add a little, never take away).
  EXPECT_GE(one_lane, 160 * 0.999);
  EXPECT_GE(two_lanes, 140 * 0.999);
  EXPECT_LT(two_lanes, one_lane - 10) << "the first product's tail did not overlap the second";
  const double linear_one = run_ms(0, false), linear_two = run_ms(0, true);
  EXPECT_GE(linear_one, 120 * 0.999);
  EXPECT_GE(linear_two, 120 * 0.999);
  EXPECT_LT(linear_two, 140) << "without waves two lanes take the same throughput";
}

// capture() records launches without running them; replay() runs them with
// the captured buffers (x -> y -> z, each tripled) for one launch latency;
// refuse_capture makes capture() fail and leaves the stream untouched.
TEST(SimDevice, CapturedLaunchesReplayWithOneLaunchLatencyAndTheSameValues) {
  gpu::sim_options o;
  o.jitter = 0;
  o.time_scale = 1e-9;
  auto dev = make_sim(o);
  scale_job job(257);
  auto dx = dev->allocate(job.n * 4), dy = dev->allocate(job.n * 4), dz = dev->allocate(job.n * 4);
  ASSERT_TRUE(dx && dy && dz);
  ASSERT_FALSE(dev->upload(*dx, job.in.data(), job.n * 4));
  // Device memory starts uninitialised (ASan fills fresh heap blocks): zero
  // the output so that "capture wrote nothing" can be seen.
  const std::vector<float> zeros(static_cast<std::size_t>(job.n), 0.0f);
  ASSERT_FALSE(dev->upload(*dz, zeros.data(), job.n * 4));
  auto s = dev->create_stream(ag::step_kind::compute).value();
  const gpu::op_launch ops[2] = {job.launch(*dx, *dy), job.launch(*dy, *dz)};
  const double before = dev->modelled_seconds();
  auto g = dev->capture(*s, ops, 2);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  EXPECT_EQ((*g)->kernels(), 2);
  EXPECT_FALSE(dev->synchronize(*s));
  EXPECT_EQ(dev->modelled_seconds(), before) << "capture ran something";
  std::vector<float> z(static_cast<std::size_t>(job.n), 0.0f);
  ASSERT_FALSE(dev->download(z.data(), *dz, job.n * 4));
  for (float v : z) ASSERT_EQ(v, 0.0f) << "capture wrote the output";
  ASSERT_FALSE(dev->replay(*s, **g));
  EXPECT_FALSE(dev->synchronize(*s));
  ASSERT_FALSE(dev->download(z.data(), *dz, job.n * 4));
  for (std::size_t i = 0; i < z.size(); ++i) ASSERT_FLOAT_EQ(z[i], 9.0f * job.in[i]) << i;
  const double plain_two = 2 * estimate_seconds(dev->spec(), job.g, *job.op);
  EXPECT_NEAR(dev->modelled_seconds() - before, plain_two - dev->spec().launch_latency + dev->spec().kernel_latency,
              1e-12);

  gpu::fault_config f;
  f.refuse_capture = true;
  dev->set_faults(f);
  auto refused = dev->capture(*s, ops, 2);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.err().code, errc::unsupported_op);
  EXPECT_NE(refused.err().message.find("refused the capture"), std::string::npos) << refused.err().to_string();
}

// capture_lanes (folded lanes): a graph over two streams. Lane 0 triples x
// into y; lane 1 triples x into w beside it, then y into z after lane 0's op
// (segment_op::after). Each op takes 20 ms of modelled time, so a lane-1 op
// that did not wait would read y still zero. Replayed: z = 9x, w = 3x, and
// the lanes overlap (about 40 ms, not 60). An op that names a later op as
// its predecessor is refused.
TEST(SimDevice, CapturedLanesRunSideBySideInTheOrderTheirOpsFollow) {
  gpu::sim_options o;
  o.jitter = 0;
  o.spec.launch_latency = 0.02;  // dominates a tiny op: 20 ms each
  o.spec.kernel_latency = 0.02;
  auto dev = make_sim(o);
  scale_job job(64);
  auto dx = dev->allocate(job.n * 4), dy = dev->allocate(job.n * 4), dz = dev->allocate(job.n * 4),
       dw = dev->allocate(job.n * 4);
  ASSERT_TRUE(dx && dy && dz && dw);
  ASSERT_FALSE(dev->upload(*dx, job.in.data(), job.n * 4));
  const std::vector<float> zeros(static_cast<std::size_t>(job.n), 0.0f);
  for (void* p : {*dy, *dz, *dw}) ASSERT_FALSE(dev->upload(p, zeros.data(), job.n * 4));
  auto s0 = dev->create_stream(ag::step_kind::compute).value();
  auto s1 = dev->create_stream(ag::step_kind::compute).value();
  const gpu::op_launch xy = job.launch(*dx, *dy), xw = job.launch(*dx, *dw), yz = job.launch(*dy, *dz);
  const int32_t after_xy[1] = {0};
  gpu::segment_op ops[3];
  ops[0].launch = &xy;  // lane 0
  ops[1].launch = &xw;
  ops[1].lane = 1;
  ops[2].launch = &yz;
  ops[2].lane = 1;
  ops[2].after = after_xy;
  ops[2].after_count = 1;
  gpu::stream* lanes[2] = {s0.get(), s1.get()};
  auto g = dev->capture_lanes(lanes, 2, ops, 3);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  EXPECT_EQ((*g)->kernels(), 3);
  const int64_t t0 = gpu::host_clock_ns();
  ASSERT_FALSE(dev->replay(*s0, **g));
  EXPECT_FALSE(dev->synchronize(*s0));  // the lanes join lane 0 at the end
  const double ms = static_cast<double>(gpu::host_clock_ns() - t0) * 1e-6;
  std::vector<float> z(static_cast<std::size_t>(job.n)), w(z.size());
  ASSERT_FALSE(dev->download(z.data(), *dz, job.n * 4));
  ASSERT_FALSE(dev->download(w.data(), *dw, job.n * 4));
  for (std::size_t i = 0; i < z.size(); ++i) {
    ASSERT_FLOAT_EQ(z[i], 9.0f * job.in[i]) << i << ": lane 1 did not wait for lane 0's op";
    ASSERT_FLOAT_EQ(w[i], 3.0f * job.in[i]) << i;
  }
  EXPECT_GE(ms, 40 * 0.999);
  EXPECT_LT(ms, 58) << "the lanes did not overlap";

  const int32_t later[1] = {2};
  ops[1].after = later;
  ops[1].after_count = 1;
  auto bad = dev->capture_lanes(lanes, 2, ops, 3);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.err().code, errc::invalid_argument);
}

TEST(SimDevice, ZeroDelayModelsNothingUnlessFaultsAreConfigured) {
  gpu::sim_options o;
  o.zero_delay = true;
  o.compute_values = false;
  o.jitter = 0.3;
  auto dev = make_sim(o);
  scale_job job(1 << 12);
  auto dx = dev->allocate(job.n * 4), dy = dev->allocate(job.n * 4);
  auto s = dev->create_stream(ag::step_kind::compute).value();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
  EXPECT_FALSE(dev->copy_h2d(*s, *dx, job.in.data(), job.n * 4));
  EXPECT_FALSE(dev->synchronize(*s));
  EXPECT_EQ(dev->modelled_seconds(), 0.0) << "a zero-delay device ran the cost model";
  gpu::fault_config f;
  f.op_error_rate = 1.0;  // faults still apply in zero-delay mode
  dev->set_faults(f);
  auto e = dev->launch(*s, job.launch(*dx, *dy));
  EXPECT_EQ(e.code, errc::op_failed) << e.to_string();
}

TEST(SimDevice, InstantModeCompletesAtRecordAndNotifiesInline) {
  gpu::sim_options o;
  o.zero_delay = true;
  o.compute_values = false;
  auto dev = make_sim(o);
  auto s = dev->create_stream(ag::step_kind::compute).value();
  scale_job job(1024);
  // timing-only memory is reserved, not committed: far more than the host has
  auto big = dev->allocate(40LL << 30);
  ASSERT_TRUE(big.has_value()) << big.err().to_string();
  EXPECT_EQ(dev->memory_in_use(), 40LL << 30);
  ASSERT_FALSE(dev->launch(*s, job.launch(*big, *big)));
  auto ev = dev->create_event().value();
  dev->record(*ev, *s);
  EXPECT_TRUE(ev->query());
  bool called = false;
  dev->notify(*s, [&](const error& e) { called = !e; });
  EXPECT_TRUE(called) << "instant device: notify runs before it returns";
  dev->deallocate(*big);
  EXPECT_EQ(dev->memory_in_use(), 0);
}

TEST(SimDevice, OutOfMemoryAtSpecCapacityNamesTheDevice) {
  gpu::sim_options o;
  o.spec.mem_bytes = 1 << 20;
  auto dev = make_sim(o, "sim:3", 2);
  ASSERT_TRUE(dev);
  auto a = dev->allocate(600 << 10);
  ASSERT_TRUE(a);
  auto b = dev->allocate(600 << 10);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.err().code, errc::out_of_memory);
  EXPECT_NE(b.err().message.find("sim2"), std::string::npos) << b.err().message;
  dev->deallocate(*a);
  EXPECT_TRUE(dev->allocate(600 << 10).has_value());
}

TEST(SimDevice, InjectedOpErrorFailsLaunchNamingDeviceAndOp) {
  gpu::sim_options o;
  o.faults.op_error_rate = 1.0;
  auto dev = make_sim(o);
  scale_job job(8);
  auto dx = dev->allocate(32), dy = dev->allocate(32);
  auto s = dev->create_stream(ag::step_kind::compute).value();
  const error e = dev->launch(*s, job.launch(*dx, *dy));
  ASSERT_TRUE(e);
  EXPECT_EQ(e.code, errc::op_failed);
  EXPECT_NE(e.message.find("sim0"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("triple"), std::string::npos) << e.message;
  dev->set_faults({});
  EXPECT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
  EXPECT_FALSE(dev->synchronize(*s));
}

TEST(SimDevice, InjectedStallDelaysTheOp) {
  gpu::sim_options o;
  o.faults.op_stall_rate = 1.0;
  o.faults.stall_seconds = 0.05;
  auto dev = make_sim(o);
  scale_job job(8);
  auto dx = dev->allocate(32), dy = dev->allocate(32);
  auto s = dev->create_stream(ag::step_kind::compute).value();
  const int64_t t0 = gpu::host_clock_ns();
  ASSERT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
  ASSERT_FALSE(dev->synchronize(*s));
  EXPECT_GE(double(gpu::host_clock_ns() - t0) * 1e-9, 0.05);
}

TEST(SimDevice, DeathAfterOpsFailsEverythingOnceWithoutHanging) {
  gpu::sim_options o;
  o.faults.die_after_ops = 2;
  auto dev = make_sim(o);
  std::atomic<int> faults{0};
  error fault;
  std::promise<void> faulted;
  dev->on_fault([&](const error& e) {
    fault = e;
    if (faults.fetch_add(1) == 0) faulted.set_value();
  });
  scale_job job(8);
  auto dx = dev->allocate(32), dy = dev->allocate(32);
  auto s = dev->create_stream(ag::step_kind::compute).value();
  // A gate the test opens (the work of another device the stream waits for):
  // death does not release the wait, so nothing the stream records or
  // notifies behind it jumps ahead of that work; it completes once the gate opens.
  gpu::host::host_event gate;
  const uint64_t gen = gate.state()->arm();
  for (int i = 0; i < 2; ++i) ASSERT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
  dev->wait(*s, gate);
  std::promise<error> notified;
  auto notice = notified.get_future();
  dev->notify(*s, [&](const error& e) { notified.set_value(e); });
  faulted.get_future().wait();
  // The worker parks at the gate after the death (the death came from its
  // second op): from then on the notify behind it cannot have run.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (gate.state()->waiters() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(gate.state()->waiters(), 1) << "the stream did not wait at the gate after the death";
  EXPECT_EQ(notice.wait_for(0s), std::future_status::timeout) << "the death released a wait whose event had not fired";
  gate.state()->reach(gen, gpu::host_clock_ns());
  const error n = notice.get();
  EXPECT_EQ(n.code, errc::device_failed);
  EXPECT_EQ(n.device, 0) << n.to_string();
  EXPECT_EQ(fault.code, errc::device_failed);
  EXPECT_EQ(fault.device, 0) << fault.to_string();
  EXPECT_FALSE(dev->alive());
  // Every refusal after death is the device's own death error: its code,
  // device and reason (whichever of refusal and fault notice reaches a job
  // first, the job tells the same story), plus what was refused.
  const error l = dev->launch(*s, job.launch(*dx, *dy));
  EXPECT_EQ(l.code, errc::device_failed);
  EXPECT_EQ(l.device, 0);
  EXPECT_EQ(l.op, "triple");
  EXPECT_NE(l.message.find(fault.message), std::string::npos) << l.message << " lacks the reason: " << fault.message;
  const error c = dev->copy_h2d(*s, *dx, job.in.data(), 32);
  EXPECT_EQ(c.code, errc::device_failed);
  EXPECT_EQ(c.device, 0);
  EXPECT_NE(c.message.find(fault.message), std::string::npos) << c.message;
  const auto stream = dev->create_stream(ag::step_kind::compute);
  ASSERT_FALSE(stream.has_value());
  EXPECT_EQ(stream.err().code, errc::device_failed);
  EXPECT_EQ(stream.err().device, 0);
  auto ev = dev->create_event().value();
  dev->record(*ev, *s);
  EXPECT_EQ(dev->synchronize(*s).code, errc::device_failed);
  EXPECT_TRUE(ev->query());
  dev->kill("again");  // a second death does not report again
  EXPECT_EQ(faults.load(), 1);
}

// A dead device in the middle of a chain keeps its order: a live device's
// stream waits for an event the dead device records after waiting for the
// live device's own earlier work (the memory plan orders a copy that reuses
// bytes after the kernel reading them this way, through whichever device the
// dependency path crosses). Before, the dead device's wait gave up at the
// death and its record fired at once, so the live device's later work ran
// while its earlier work was still under way (ThreadSanitizer: a kernel read
// arena bytes a peer copy was still writing, in
// TensorParallelFault.DeviceDeathDuringCollectivesFailsOnlyItsJobs).
TEST(SimDevice, ADeadDeviceFiresNoEventBeforeTheWorkItWaitsForHasReturned) {
  // Device 0's op runs 0.2 s, then its copy writes `mid`: what device 0
  // reads back behind the dead device's event must be that copy's bytes.
  gpu::backend_options b;
  b.sim = slow_launch_options(0.2);
  auto d = gpu::make_devices("sim:2", b);
  ASSERT_TRUE(d.has_value()) << d.err().to_string();
  auto* live = dynamic_cast<gpu::sim::sim_device*>((*d)[0].get());
  auto* dying = dynamic_cast<gpu::sim::sim_device*>((*d)[1].get());
  ASSERT_TRUE(live && dying);
  scale_job job(64);
  const int64_t bytes = job.n * 4;
  auto dx = live->allocate(bytes), dy = live->allocate(bytes), mid = live->allocate(bytes);
  ASSERT_TRUE(dx && dy && mid);
  std::memset(*mid, 0, static_cast<std::size_t>(bytes));
  auto s0 = live->create_stream(ag::step_kind::compute).value();
  auto s2 = live->create_stream(ag::step_kind::copy_d2h).value();
  auto s1 = dying->create_stream(ag::step_kind::compute).value();  // made while alive
  auto e0 = live->create_event().value();
  auto e1 = dying->create_event().value();
  // Live device: the long op, then the copy into `mid`, then e0.
  ASSERT_FALSE(live->launch(*s0, job.launch(*dx, *dy)));
  ASSERT_FALSE(live->copy_h2d(*s0, *mid, job.in.data(), bytes));
  ASSERT_FALSE(live->record(*e0, *s0));
  // The device in between dies before its wait runs, then waits for e0 and records e1.
  dying->kill("pulled (test)");
  ASSERT_FALSE(dying->wait(*s1, *e0));
  ASSERT_FALSE(dying->record(*e1, *s1));
  std::promise<error> dying_notice;
  dying->notify(*s1, [&](const error& e) { dying_notice.set_value(e); });
  // Live device, downstream of e1: reads `mid` back.
  std::vector<float> back(static_cast<std::size_t>(job.n), -1.0f);
  ASSERT_FALSE(live->wait(*s2, *e1));
  ASSERT_FALSE(live->copy_d2h(*s2, back.data(), *mid, bytes));
  std::promise<bool> upstream_done;  // e0's state when the work behind e1 finished
  live->notify(*s2, [&](const error&) { upstream_done.set_value(e0->query()); });
  auto done = upstream_done.get_future();
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready) << "the live device's work behind the dead device hangs";
  EXPECT_TRUE(done.get()) << "the dead device fired e1 before the live op it waited for (e0) had returned";
  EXPECT_EQ(std::memcmp(back.data(), job.in.data(), static_cast<std::size_t>(bytes)), 0)
      << "the live device read `mid` before its copy wrote it";
  // Nothing waits forever: the dead device's notify completes, with its death error.
  auto dn = dying_notice.get_future();
  ASSERT_EQ(dn.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(dn.get().code, errc::device_failed);
  EXPECT_TRUE(e1->query());
  ASSERT_FALSE(live->synchronize(*s0));
  for (auto p : {*dx, *dy, *mid}) live->deallocate(p);
}

TEST(SimDevice, KillReleasesAStalledStreamAndLateHandlerStillHearsOnce) {
  gpu::sim_options o;
  o.faults.op_stall_rate = 1.0;
  o.faults.stall_seconds = 30.0;  // would outlast the test: kill must cut it short
  auto dev = make_sim(o);
  scale_job job(8);
  auto dx = dev->allocate(32), dy = dev->allocate(32);
  auto s = dev->create_stream(ag::step_kind::compute).value();
  ASSERT_FALSE(dev->launch(*s, job.launch(*dx, *dy)));
  std::promise<error> notified;
  auto done = notified.get_future();
  dev->notify(*s, [&](const error& e) { notified.set_value(e); });
  // Kill only once the op is under way (its 30 s stall has begun or is about
  // to): a bounded wait on that condition, not a sleep.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (dev->ops_begun() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_EQ(dev->ops_begun(), 1) << "the op never started";
  dev->kill("test");
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready) << "kill did not release the stalled stream";
  EXPECT_EQ(done.get().code, errc::device_failed);
  std::atomic<int> calls{0};
  dev->on_fault([&](const error& e) { calls += e.code == errc::device_failed; });
  EXPECT_EQ(calls.load(), 1) << "a handler set after death hears of it at once";
}

}  // namespace

namespace {

using namespace ag;

// Without op_launch::source the sim costs an op from its tensor_args: the
// result must equal the planner's cost for every op kind.
TEST(SimDevice, CostFromLaunchMatchesTheCostModel) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 6, 8});
  auto w = b.input("w", dtype::f16, {8, 5});
  auto ids = b.input("ids", dtype::i32, {3});
  auto pos = b.input("pos", dtype::i32, {6});
  auto xs = b.slice(x, 1, 0, 6, "xs");
  b.output(b.matmul(x, b.copy(w, dtype::f32, "w32"), false, false, "mm"));
  b.output(b.matmul(b.transpose(x, 1, 2, "xt"), x, true, true, "mm_t"));
  for (auto t : {b.add(x, b.input("bias", dtype::f32, {8})), b.mul(x, x), b.scale(x, 2.0f), b.gelu(x), b.silu(xs),
                 b.softmax(x, true), b.rms_norm(x, tensor()), b.layer_norm(x, tensor(), tensor()),
                 b.get_rows(w, ids), b.concat({x, x}, 0), b.contiguous(b.transpose(x, 0, 1))})
    b.output(t);
  b.output(b.rope(b.reshape(x, {4, 6, 2, 4}), pos, 10000.0f, rope_mode::neox, "rope"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  int checked = 0;
  for (const node& n : g->nodes()) {
    gpu::op_launch l;
    l.op = &n;
    for (node_id i : n.inputs) l.inputs.push_back({nullptr, g->at(i).type, g->at(i).dims, g->at(i).stride});
    l.out = {nullptr, n.type, n.dims, n.stride};
    const op_cost want = cost_of(*g, n), got = gpu::sim::cost_of_launch(l);
    EXPECT_DOUBLE_EQ(got.flops, want.flops) << n.name;
    EXPECT_DOUBLE_EQ(got.bytes, want.bytes) << n.name;
    checked += want.flops > 0 || want.bytes > 0;
  }
  EXPECT_GE(checked, 14);
}

}  // namespace
