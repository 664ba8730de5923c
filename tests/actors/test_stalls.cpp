// Stall detection, quarantine and revival (issue 13) on real sim devices and
// real threads, through the public API. Stalls are injected by the sim
// (fault_config: every op stalls 600 s, far past any limit the tests wait
// for), so a report can never be early by luck; bounds are generous and no
// test sleeps to synchronise. Protocol-level versions on virtual time are in
// test_protocol.cpp (Protocol.AStalledStep..., Protocol.Reset...).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/actorgraph.hpp"
#include "gpu/sim/sim_device.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

// x -> 2 x (matmul, gelu), every node pinned to `device`.
ag::graph chain_on(int device, uint64_t seed) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 8});
  b.pin(x, device);
  for (int l = 0; l < 2; ++l) {
    auto w = b.weight("w" + std::to_string(l), ag::host_tensor::random_normal(ag::dtype::f32, {8, 8}, seed + l, 0.3f));
    auto m = b.matmul(x, w, false, false, "mm" + std::to_string(l));
    x = b.gelu(m, ag::gelu_mode::tanh, "act" + std::to_string(l));
    for (auto t : {w, m, x}) b.pin(t, device);
  }
  b.output(x);
  return std::move(b).build().value();
}

ag::runtime_options stall_options() {
  ag::runtime_options o;
  o.trace = false;
  o.stall_factor = 50;
  // The floor: far above a healthy sim step (microseconds modelled, a few
  // ms of real compute under a sanitizer on a loaded 2-core machine).
  o.stall_min_seconds = 0.5;
  return o;
}

ag::gpu::sim::sim_device* sim(ag::runtime& rt, int d) {
  return dynamic_cast<ag::gpu::sim::sim_device*>(rt.device(d).get());
}

std::vector<ag::host_tensor> input(uint64_t seed) {
  return {ag::host_tensor::random_normal(ag::dtype::f32, {4, 8}, seed)};
}

void expect_reference(const std::shared_ptr<const ag::plan>& p, const std::vector<ag::host_tensor>& in, ag::job j) {
  ASSERT_TRUE(j.wait_for(60s)) << "job " << j.id() << " hung";
  const auto& r = j.wait();
  ASSERT_TRUE(r.has_value()) << "job " << j.id() << " on devices " << ::testing::PrintToString(p->used_devices()) << ": "
                             << r.err().to_string();
  const auto ref = ag::evaluate_reference(p->source(), in).value();
  ASSERT_EQ(r->size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    auto c = ag::compare((*r)[i], ref[i], 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

TEST(Stall, AStalledStepFailsOnlyItsDevicesJobsWithATimeoutNamingDeviceAndStepUntilReset) {
  auto rt = ag::runtime::create("sim:2", stall_options()).value();
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  auto p0 = rt->compile(chain_on(0, 10), single).value();
  auto p1 = rt->compile(chain_on(1, 20), single).value();
  ASSERT_EQ(p0->used_devices(), std::vector<int>{0});
  ASSERT_EQ(p1->used_devices(), std::vector<int>{1});
  ag::gpu::fault_config stall;
  stall.op_stall_rate = 1;
  stall.stall_seconds = 600;
  sim(*rt, 0)->set_faults(stall);

  const auto t0 = std::chrono::steady_clock::now();
  ag::job stuck = rt->submit(p0, input(1));
  // Device 1 keeps serving while device 0 stalls.
  for (uint64_t s = 0; s < 4; ++s) expect_reference(p1, input(100 + s), rt->submit(p1, input(100 + s)));
  ASSERT_TRUE(stuck.wait_for(60s)) << "the stall was never reported";
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.5) << "reported before the 0.5 s floor";
  ASSERT_FALSE(stuck.wait().has_value());
  const auto& e = stuck.wait().err();
  EXPECT_EQ(e.code, ag::errc::timeout) << e.to_string();
  EXPECT_EQ(e.device, 0) << e.to_string();
  ASSERT_GE(e.step, 0) << e.to_string();
  EXPECT_EQ(p0->at(e.step).device, 0) << e.to_string();
  EXPECT_EQ(p0->at(e.step).kind, ag::step_kind::compute) << e.to_string();
  EXPECT_NE(e.message.find("sim0"), std::string::npos) << e.to_string();
  EXPECT_NE(e.message.find("stalled"), std::string::npos) << e.to_string();

  // Quarantined: jobs using device 0 fail at once, device 1 serves.
  EXPECT_FALSE(rt->device_in_service(0));
  EXPECT_TRUE(rt->device_in_service(1));
  ag::job refused = rt->submit(p0, input(2));
  ASSERT_TRUE(refused.wait_for(60s));
  ASSERT_FALSE(refused.wait().has_value());
  EXPECT_EQ(refused.wait().err().code, ag::errc::device_failed) << refused.wait().err().to_string();
  EXPECT_EQ(refused.wait().err().device, 0);
  EXPECT_NE(refused.wait().err().message.find("quarantined"), std::string::npos) << refused.wait().err().to_string();
  expect_reference(p1, input(7), rt->submit(p1, input(7)));

  // Reset: the stalled op is abandoned (no 600 s wait), the device serves.
  sim(*rt, 0)->set_faults({});
  ASSERT_FALSE(rt->reset_device(0)) << "reset of a quarantined sim device failed";
  EXPECT_TRUE(rt->device_in_service(0));
  for (uint64_t s = 0; s < 4; ++s) expect_reference(p0, input(200 + s), rt->submit(p0, input(200 + s)));
  rt->wait_idle();
}

TEST(Stall, ResetOfAnIndexOutOfRangeIsAClearErrorAndOfAHealthyDeviceDoesNothing) {
  auto rt = ag::runtime::create("sim:2", stall_options()).value();
  for (int d : {2, -1, 1000}) {
    const ag::error e = rt->reset_device(d);
    EXPECT_EQ(e.code, ag::errc::invalid_argument) << d << ": " << e.to_string();
    EXPECT_NE(e.message.find("no such device"), std::string::npos) << e.to_string();
    EXPECT_FALSE(rt->device_in_service(d));
  }
  auto p = rt->compile(chain_on(1, 30)).value();
  EXPECT_FALSE(rt->reset_device(1));
  EXPECT_TRUE(rt->device_in_service(1));
  expect_reference(p, input(3), rt->submit(p, input(3)));
}

TEST(Revival, ADeadSimDeviceRevivedServesCorrectResultsAgain) {
  auto rt = ag::runtime::create("sim:2", stall_options()).value();
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  auto p0 = rt->compile(chain_on(0, 40), single).value();
  auto p1 = rt->compile(chain_on(1, 50), single).value();
  auto* dev = sim(*rt, 0);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "die_after_ops" : "kill");
    if (round == 0) {
      ag::gpu::fault_config f;
      f.die_after_ops = 1;  // dies inside the job's first step
      dev->set_faults(f);
      ag::job j = rt->submit(p0, input(1));
      ASSERT_TRUE(j.wait_for(60s));
      ASSERT_FALSE(j.wait().has_value());
      EXPECT_EQ(j.wait().err().code, ag::errc::device_failed) << j.wait().err().to_string();
      EXPECT_EQ(j.wait().err().device, 0) << j.wait().err().to_string();
    } else {
      dev->kill("test kill");
    }
    ASSERT_FALSE(dev->alive());
    // Dead until reset: a new job fails at once, the other device serves.
    ag::job refused = rt->submit(p0, input(2));
    ASSERT_TRUE(refused.wait_for(60s));
    ASSERT_FALSE(refused.wait().has_value());
    EXPECT_EQ(refused.wait().err().code, ag::errc::device_failed);
    expect_reference(p1, input(3), rt->submit(p1, input(3)));
    ASSERT_FALSE(rt->reset_device(0));
    EXPECT_TRUE(dev->alive());
    EXPECT_TRUE(rt->device_in_service(0));
    // The spent die_after_ops does not kill it again.
    std::vector<ag::job> jobs;
    for (uint64_t s = 0; s < 6; ++s) jobs.push_back(rt->submit(p0, input(300 + s)));
    for (uint64_t s = 0; s < 6; ++s) expect_reference(p0, input(300 + s), jobs[s]);
  }
  rt->wait_idle();
}

}  // namespace
