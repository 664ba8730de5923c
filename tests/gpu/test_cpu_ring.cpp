// The cpu backend's ring collectives driven through the device interface
// directly (no runtime): parts launched at different times on their
// members' communication streams meet and equal the reference; a part
// whose neighbour dies or whose job is cancelled fails (device_failed
// naming the dead member / cancelled) instead of waiting forever, and
// leaves no meeting state behind.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cpu/ring.hpp"
#include "gpu/device.hpp"
#include "gpu/host/collective_sequence.hpp"
#include "gpu/host/host_device.hpp"
#include "graph/reference.hpp"
#include "../graph/tp_random_graph.hpp"

namespace ag {
namespace {

using namespace std::chrono_literals;

/// n cpu devices, each with a collective stream, the operands of
/// user_collectives(f32, n, rows, cols) uploaded and an output per member.
struct ring_fixture {
  int n;
  int64_t rows, cols;
  std::shared_ptr<const graph> g;
  std::vector<gpu::device_ptr> devs;
  std::vector<std::unique_ptr<gpu::stream>> streams;
  std::vector<void*> operands, outs;
  std::vector<host_tensor> in;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  collective_algo algo = collective_algo::ring;
  std::vector<uint64_t> generations;  // collective_launch::generations (empty: the current ones)
  bool void_part = false;             // collective_launch::void_part

  ring_fixture(int members, int64_t r, int64_t c) : n(members), rows(r), cols(c) {
    g = test::user_collectives(dtype::f32, n, rows, cols);
    devs = gpu::make_devices("cpu:" + std::to_string(n)).value();
    for (int k = 0; k < n; ++k) {
      auto& d = *devs[static_cast<std::size_t>(k)];
      streams.push_back(d.create_stream(step_kind::collective).value());
      in.push_back(host_tensor::random_normal(dtype::f32, {rows, cols}, 500 + static_cast<uint64_t>(k)));
      operands.push_back(d.allocate(rows * cols * 4).value());
      EXPECT_FALSE(d.upload(operands.back(), in.back().data(), rows * cols * 4));
      outs.push_back(d.allocate(rows * cols * 4).value());
    }
  }
  ~ring_fixture() {
    streams.clear();
    for (int k = 0; k < n; ++k) {
      devs[static_cast<std::size_t>(k)]->deallocate(operands[static_cast<std::size_t>(k)]);
      devs[static_cast<std::size_t>(k)]->deallocate(outs[static_cast<std::size_t>(k)]);
    }
  }

  const node& part(const std::string& name) const {
    for (const node& x : g->nodes())
      if (x.name == name) return x;
    ADD_FAILURE() << "no node " << name;
    return g->nodes().front();
  }

  /// Launches rank k's part of the all_reduce (a ring unless `algo` says otherwise).
  error launch(int k) {
    const node& op = part("sum" + std::to_string(k));
    gpu::collective_launch l;
    l.op = &op;
    l.rank = k;
    l.algo = algo;
    l.bytes = rows * cols * 4;
    l.cancelled = cancelled;
    l.generations = generations;
    l.void_part = void_part;
    l.out = {outs[static_cast<std::size_t>(k)], dtype::f32, op.dims, contiguous_strides(op.dims)};
    for (int j = 0; j < n; ++j) {
      l.inputs.push_back({operands[static_cast<std::size_t>(j)], dtype::f32, shape{rows, cols},
                          contiguous_strides(shape{rows, cols})});
      l.members.push_back(devs[static_cast<std::size_t>(j)].get());
    }
    return devs[static_cast<std::size_t>(k)]->collective(*streams[static_cast<std::size_t>(k)], l);
  }

  /// What notify reports for rank k's stream, or a timeout error after 20 s
  /// (the hang this file tests against).
  error outcome(int k) {
    auto done = std::make_shared<std::promise<error>>();
    auto f = done->get_future();
    devs[static_cast<std::size_t>(k)]->notify(*streams[static_cast<std::size_t>(k)],
                                              [done](const error& e) { done->set_value(e); });
    if (f.wait_for(20s) != std::future_status::ready) return error(errc::internal, "hung");
    return f.get();
  }
};

TEST(CpuRingDevice, PartsLaunchedAtDifferentTimesMeetAndEqualTheReference) {
  ring_fixture fx(3, 4, 37);  // 148 elements: chunks of 49, 49, 50
  // Rank 2 first, then rank 0 a little later, rank 1 last: the early parts
  // wait on their members' progress events, not on the host.
  ASSERT_FALSE(fx.launch(2));
  // Rank 2's part is parked in its ring session (the ring path runs, not
  // the one-shot, which would have finished alone).
  for (int i = 0; i < 2000 && gpu::cpu::ring_sessions_in_flight() == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(gpu::cpu::ring_sessions_in_flight(), 1);
  std::this_thread::sleep_for(5ms);
  ASSERT_FALSE(fx.launch(0));
  std::this_thread::sleep_for(5ms);
  ASSERT_FALSE(fx.launch(1));
  auto want = evaluate_reference(*fx.g, fx.in).value();
  for (int k = 0; k < 3; ++k) {
    ASSERT_FALSE(fx.outcome(k)) << "rank " << k;
    host_tensor got = host_tensor::uninitialized(dtype::f32, {fx.rows, fx.cols});
    ASSERT_FALSE(fx.devs[static_cast<std::size_t>(k)]->download(got.data(), fx.outs[static_cast<std::size_t>(k)],
                                                              fx.rows * fx.cols * 4));
    // outputs of user_collectives: (sum, scatter, gather) per member.
    auto c = compare(got, want[static_cast<std::size_t>(3 * k)], 1e-5, 1e-5);
    EXPECT_TRUE(c.ok) << "rank " << k << ": " << c.message;
  }
  EXPECT_EQ(gpu::cpu::ring_sessions_in_flight(), 0);
}

TEST(CpuRingDevice, APartWhoseMemberDiesFailsNamingItInsteadOfWaiting) {
  ring_fixture fx(3, 2, 30);
  ASSERT_FALSE(fx.launch(0));
  ASSERT_FALSE(fx.launch(1));  // rank 2's part never comes: its device dies
  std::this_thread::sleep_for(10ms);
  auto* dead = dynamic_cast<gpu::host::host_device*>(fx.devs[2].get());
  ASSERT_NE(dead, nullptr);
  dead->die(error(errc::device_failed, "pulled during a ring (test)"));
  for (int k = 0; k < 2; ++k) {
    const error e = fx.outcome(k);
    ASSERT_NE(e.code, errc::internal) << "rank " << k << " hangs after its member died";
    EXPECT_EQ(e.code, errc::device_failed) << e.to_string();
    EXPECT_NE(e.message.find("cpu2"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("pulled during a ring"), std::string::npos) << e.message;
  }
  EXPECT_EQ(gpu::cpu::ring_sessions_in_flight(), 0);
}

TEST(CpuRingDevice, ACancelledJobsPartStopsWaitingForAMemberThatNeverComes) {
  ring_fixture fx(2, 2, 16);
  ASSERT_FALSE(fx.launch(0));  // rank 1's part never comes (the runtime issues a void one, which meets nobody)
  std::this_thread::sleep_for(5ms);
  fx.cancelled->store(true);
  const error e = fx.outcome(0);
  ASSERT_NE(e.code, errc::internal) << "the part hangs after its job was cancelled";
  EXPECT_EQ(e.code, errc::cancelled) << e.to_string();
  EXPECT_EQ(gpu::cpu::ring_sessions_in_flight(), 0);
  // The devices serve the next collective.
  fx.cancelled = std::make_shared<std::atomic<bool>>(false);
  ASSERT_FALSE(fx.launch(0));
  ASSERT_FALSE(fx.launch(1));
  EXPECT_FALSE(fx.outcome(0));
  EXPECT_FALSE(fx.outcome(1));
}

// NCCL's pairing rule on the host backends (gpu/host/collective_sequence.hpp,
// off by default): parts pair by their place in each member's issue order,
// so a part one member left out makes its next collective meet another's.
// The check refuses that part (errc::internal, naming both), where NCCL
// would sum the wrong operands or wait for ever.
/// Turns the host backends' check on for one test (it is off by default).
struct checking_on {
  bool was = gpu::host::collective_sequence::checking().exchange(true);
  ~checking_on() { gpu::host::collective_sequence::checking().store(was); }
};

TEST(HostCollectives, APartLeftOutByOneMemberBreaksTheNextCollectiveOfItsCommunicator) {
  checking_on check;
  ring_fixture fx(2, 2, 16);
  fx.algo = collective_algo::one_shot;  // reads both operands at once: nothing waits
  const std::size_t open_before = gpu::host::collective_sequence::instance().open_positions();
  ASSERT_FALSE(fx.launch(0));
  ASSERT_FALSE(fx.launch(1));  // the first collective, issued alike
  EXPECT_FALSE(fx.outcome(0));
  EXPECT_FALSE(fx.outcome(1));
  EXPECT_EQ(gpu::host::collective_sequence::instance().open_positions(), open_before);
  ASSERT_FALSE(fx.launch(0));  // the second: rank 1 leaves it out
  fx.cancelled = std::make_shared<std::atomic<bool>>(false);  // the third, another job's
  ASSERT_FALSE(fx.launch(0));
  const error e = fx.launch(1);
  EXPECT_EQ(e.code, errc::internal) << e.to_string();
  EXPECT_NE(e.message.find("collective order broken"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("'sum0' of device 'cpu0'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("'sum1' of device 'cpu1'"), std::string::npos) << e.message;
  // Rank 0's third part still waits for a second member at its place.
  EXPECT_EQ(gpu::host::collective_sequence::instance().open_positions(), open_before + 1);
}

// A cancelled job's member that had not issued its part issues a void one
// (actors/collective_order.hpp, owe_cancelled_collectives): it keeps the
// order (the next job's parts pair as ever) and, having no waits, touches
// neither the operands nor the result, whose bytes may by then hold other
// tensors of its job that its running steps use (session 91: computing it
// gave other sequences wrong tokens). Ring parts meet their neighbours; a
// void one meets nobody and does not wait.
TEST(HostCollectives, AVoidPartKeepsTheOrderAndTouchesNoMemory) {
  checking_on check;
  ring_fixture fx(2, 2, 16);
  fx.algo = collective_algo::one_shot;
  const int64_t bytes = fx.rows * fx.cols * 4;
  const host_tensor sentinel = host_tensor::random_normal(dtype::f32, {fx.rows, fx.cols}, 77);
  ASSERT_FALSE(fx.devs[1]->upload(fx.outs[1], sentinel.data(), bytes));
  const std::size_t open_before = gpu::host::collective_sequence::instance().open_positions();
  ASSERT_FALSE(fx.launch(0));  // the cancelled job's part, issued before the cancel
  fx.void_part = true;
  ASSERT_FALSE(fx.launch(1));  // the other member's, owed
  EXPECT_FALSE(fx.outcome(1));
  EXPECT_FALSE(fx.outcome(0));
  EXPECT_EQ(gpu::host::collective_sequence::instance().open_positions(), open_before);
  host_tensor after(dtype::f32, {fx.rows, fx.cols});
  ASSERT_FALSE(fx.devs[1]->download(after.data(), fx.outs[1], bytes));
  EXPECT_EQ(std::memcmp(after.data(), sentinel.data(), static_cast<std::size_t>(bytes)), 0)
      << "the void part wrote its result";
  // A ring void part does not wait for its neighbour (none comes).
  fx.cancelled = std::make_shared<std::atomic<bool>>(false);
  fx.algo = collective_algo::ring;
  ASSERT_FALSE(fx.launch(0));
  ASSERT_FALSE(fx.launch(1));
  EXPECT_FALSE(fx.outcome(0));
  EXPECT_FALSE(fx.outcome(1));
  // The next job pairs as ever: no broken order, and the sum is right.
  fx.void_part = false;
  fx.cancelled = std::make_shared<std::atomic<bool>>(false);
  ASSERT_FALSE(fx.launch(0));
  ASSERT_FALSE(fx.launch(1));
  EXPECT_FALSE(fx.outcome(0));
  EXPECT_FALSE(fx.outcome(1));
  EXPECT_EQ(gpu::host::collective_sequence::instance().open_positions(), open_before);
  ASSERT_FALSE(fx.devs[1]->download(after.data(), fx.outs[1], bytes));
  const float* a = reinterpret_cast<const float*>(fx.in[0].data());
  const float* b = reinterpret_cast<const float*>(fx.in[1].data());
  const float* got = reinterpret_cast<const float*>(after.data());
  for (int64_t i = 0; i < fx.rows * fx.cols; ++i) ASSERT_NEAR(got[i], a[i] + b[i], 1e-5f) << "element " << i;
}

// A member revived since the job started is a new communicator (the CUDA
// backend aborts a dead member's NCCL communicators): a part of that job is
// refused on every member, naming the revived one, so that it never pairs
// with a part of a job of after the revival.
TEST(HostCollectives, APartOfAJobFromBeforeAMembersRevivalIsRefused) {
  checking_on check;
  ring_fixture fx(2, 2, 16);
  fx.algo = collective_algo::one_shot;
  fx.generations = {fx.devs[0]->generation(), fx.devs[1]->generation()};
  auto* member = dynamic_cast<gpu::host::host_device*>(fx.devs[1].get());
  ASSERT_NE(member, nullptr);
  member->die(error(errc::device_failed, "pulled (test)"));
  ASSERT_FALSE(member->reset());
  EXPECT_EQ(member->generation(), fx.generations[1] + 1);
  for (int k = 0; k < 2; ++k) {
    const error e = fx.launch(k);
    EXPECT_EQ(e.code, errc::device_failed) << e.to_string();
    EXPECT_NE(e.message.find("member 'cpu1' was reset since this job started"), std::string::npos) << e.message;
  }
  // A job of after the revival pairs as ever.
  fx.generations = {fx.devs[0]->generation(), fx.devs[1]->generation()};
  fx.cancelled = std::make_shared<std::atomic<bool>>(false);
  ASSERT_FALSE(fx.launch(0));
  ASSERT_FALSE(fx.launch(1));
  EXPECT_FALSE(fx.outcome(0));
  EXPECT_FALSE(fx.outcome(1));
}

}  // namespace
}  // namespace ag
