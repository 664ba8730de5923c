// make_devices: every grammar case and every error, with messages that name
// the offending item.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cpu/cpu_device.hpp"
#include "gpu/device.hpp"
#include "gpu/device_factory.hpp"
#include "graph/host_tensor.hpp"

namespace {

using namespace ag;

TEST(DeviceSpec, SimCpuAndMixedSpecsNameAndIndexDevicesInOrder) {
  auto d = gpu::make_devices("sim:2, cpu:3");
  ASSERT_TRUE(d.has_value()) << d.err().to_string();
  ASSERT_EQ(d->size(), 5u);
  const char* names[] = {"sim0", "sim1", "cpu0", "cpu1", "cpu2"};
  const int ordinals[] = {0, 1, 0, 1, 2};
  for (int i = 0; i < 5; ++i) {
    const auto& dev = *(*d)[static_cast<std::size_t>(i)];
    EXPECT_EQ(dev.spec().name, names[i]);
    EXPECT_EQ(dev.spec().ordinal, ordinals[i]);
    EXPECT_EQ(dev.index(), i);
    EXPECT_EQ(dev.spec().kind, i < 2 ? device_kind::sim : device_kind::cpu);
    EXPECT_TRUE(dev.alive());
  }
  auto one = gpu::make_devices("cpu:1");
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->size(), 1u);
  auto four = gpu::make_devices("sim:4");
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ((*four)[3]->spec().name, "sim3");
}

TEST(DeviceSpec, SimDevicesTakeTheirSpecFromOptions) {
  gpu::backend_options o;
  o.sim.spec.mem_bytes = 12345678;
  o.sim.spec.name = "ignored";
  auto d = gpu::make_devices("sim:2", o);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)[1]->memory_capacity(), 12345678);
  EXPECT_EQ((*d)[1]->spec().name, "sim1");
}

void expect_bad(const std::string& spec, const std::string& must_mention) {
  auto d = gpu::make_devices(spec);
  ASSERT_FALSE(d.has_value()) << "spec \"" << spec << "\" was accepted";
  EXPECT_EQ(d.err().code, errc::bad_device_spec) << spec;
  EXPECT_NE(d.err().message.find(must_mention), std::string::npos)
      << "spec \"" << spec << "\": message \"" << d.err().message << "\" lacks \"" << must_mention << "\"";
}

TEST(DeviceSpec, ErrorsNameTheItemAndPosition) {
  expect_bad("", "empty");
  expect_bad("   ", "empty");
  expect_bad("gpu:1", "'gpu:1'");
  expect_bad("gpu:1", "unknown device kind");
  expect_bad("sim:0", "zero");
  expect_bad("sim:-2", "negative");
  expect_bad("sim:two", "'two'");
  expect_bad("sim:", "missing count");
  expect_bad("sim", "'sim'");
  expect_bad("sim:1,sim:2", "duplicate");
  expect_bad("sim:1,cpu:1,sim:1", "item 3");
  expect_bad("sim:1,,cpu:1", "empty item");
  expect_bad("sim:1,,cpu:1", "item 2");
  expect_bad("cpu:2,3", "bare number");
  expect_bad("cpu:1, tpu:2", "position 7");
  expect_bad("sim:99999", "too large");
  expect_bad("cuda:x", "'cuda:x'");
}

TEST(DeviceSpec, ParseDescribesItemsWithoutCreatingDevicesAndSharesTheGrammarsErrors) {
  auto r = gpu::parse_device_spec("sim:2, cpu:3,cuda:0,2");
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].kind, device_kind::sim);
  EXPECT_EQ((*r)[0].count, 2);
  EXPECT_EQ((*r)[0].pos, 0u);
  EXPECT_EQ((*r)[1].kind, device_kind::cpu);
  EXPECT_EQ((*r)[1].count, 3);
  EXPECT_EQ((*r)[1].pos, 7u);
  EXPECT_EQ((*r)[1].text, "cpu:3");
  // A cuda item is only described: no GPU is needed to parse it.
  EXPECT_EQ((*r)[2].kind, device_kind::cuda);
  EXPECT_FALSE((*r)[2].all);
  EXPECT_EQ((*r)[2].ordinals, (std::vector<int>{0, 2}));
  EXPECT_EQ((*r)[2].item, 3);
  auto all = gpu::parse_device_spec("cuda:all");
  ASSERT_TRUE(all.has_value());
  EXPECT_TRUE((*all)[0].all);
  // Every grammar error of make_devices comes from this parser.
  for (const char* bad : {"", "gpu:1", "sim:0", "sim:", "sim:1,sim:2", "cpu:2,3", "sim:99999"}) {
    auto p = gpu::parse_device_spec(bad);
    auto d = gpu::make_devices(bad);
    ASSERT_FALSE(p.has_value()) << bad;
    ASSERT_FALSE(d.has_value()) << bad;
    EXPECT_EQ(p.err().code, errc::bad_device_spec) << bad;
    EXPECT_EQ(p.err().message, d.err().message) << bad;
  }
}

TEST(DeviceSpec, CudaWithoutAGpuIsABadSpecNamingTheItem) {
  if (gpu::cuda_available()) GTEST_SKIP() << "this machine has a usable GPU: the no-GPU error cannot happen";
  expect_bad("sim:1,cuda:0", "'cuda:0'");
  expect_bad("cuda:all", "cuda:all");
}

TEST(DeviceSpec, ParsingAloneCreatesNothingAndNeedsNoGpu) {
  auto r = gpu::parse_device_spec(" sim:2 , cuda:0,3");
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].kind, device_kind::sim);
  EXPECT_EQ((*r)[0].count, 2);
  EXPECT_EQ((*r)[0].text, "sim:2");
  EXPECT_EQ((*r)[0].pos, 1u);
  EXPECT_EQ((*r)[1].kind, device_kind::cuda);
  EXPECT_EQ((*r)[1].ordinals, (std::vector<int>{0, 3}));
  EXPECT_FALSE((*r)[1].all);
  // A repeated ordinal is a second logical device of that GPU (issue 10:
  // tensor parallelism tested on one GPU), not an error.
  auto twice = gpu::parse_device_spec("cuda:0,0");
  ASSERT_TRUE(twice.has_value()) << twice.err().to_string();
  EXPECT_EQ((*twice)[0].ordinals, (std::vector<int>{0, 0}));
}

TEST(DeviceSpec, BackendOptionsAreValidatedNamingOptionAndValue) {
  const auto refused = [](gpu::backend_options o, const std::string& option) {
    auto d = gpu::make_devices("sim:1", o);
    ASSERT_FALSE(d.has_value()) << option << " was accepted";
    EXPECT_EQ(d.err().code, errc::invalid_argument);
    EXPECT_NE(d.err().message.find(option), std::string::npos) << d.err().message;
    EXPECT_EQ(gpu::validate(o).code, errc::invalid_argument);
  };
  EXPECT_TRUE(gpu::validate(gpu::backend_options{}).ok());
  gpu::backend_options o;
  o.sim.time_scale = -1;
  refused(o, "sim.time_scale = -1");
  o.sim.time_scale = std::nan("");
  refused(o, "sim.time_scale = nan");
  o = {};
  o.sim.jitter = std::nan("");
  refused(o, "sim.jitter = nan");
  o.sim.jitter = -0.5;
  refused(o, "sim.jitter = -0.5");
  o = {};
  o.sim.faults.op_error_rate = 2;
  refused(o, "sim.faults.op_error_rate = 2");
  o = {};
  o.sim.faults.op_stall_rate = -0.1;
  refused(o, "sim.faults.op_stall_rate");
  o = {};
  o.sim.faults.stall_seconds = INFINITY;
  refused(o, "sim.faults.stall_seconds = inf");
  o = {};
  o.sim.faults.die_after_ops = -5;
  refused(o, "sim.faults.die_after_ops = -5");
  o = {};
  o.sim.spec.link_bandwidth = -1;
  refused(o, "link_bandwidth");
  o = {};
  o.cpu_threads_per_stream = -1;
  refused(o, "cpu_threads_per_stream = -1");
}

// cpu_threads_per_stream: a count is taken as given; 0 shares the machine's
// hardware threads evenly among the cpu devices made together, at least one
// each.
TEST(DeviceSpec, CpuThreadsZeroShareTheMachineAmongTheCpuDevices) {
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  gpu::backend_options o;
  o.cpu_threads_per_stream = 5;
  EXPECT_EQ(gpu::cpu::cpu_threads_for(o, 3), 5);
  o.cpu_threads_per_stream = 0;
  EXPECT_EQ(gpu::cpu::cpu_threads_for(o, 1), hardware);
  EXPECT_EQ(gpu::cpu::cpu_threads_for(o, 2), std::max(1, hardware / 2));
  EXPECT_EQ(gpu::cpu::cpu_threads_for(o, 4 * hardware), 1);
  EXPECT_EQ(gpu::cpu::cpu_threads_for(o, 0), hardware);
}

TEST(DeviceSpec, DevicesInHostMemoryAreCappedAtWhatTheHostHas) {
  gpu::backend_options o;
  o.sim.spec.mem_bytes = ag::max_tensor_bytes;  // "80 GiB H100" or more on a smaller host
  auto d = gpu::make_devices("sim:1,cpu:1", o);
  ASSERT_TRUE(d.has_value()) << d.err().to_string();
  for (const auto& dev : *d) {
    EXPECT_TRUE(dev->spec().in_host_memory) << dev->spec().name;
    EXPECT_LE(dev->memory_capacity(), ag::host_memory_bytes()) << dev->spec().name;
    EXPECT_LE(dev->spec().mem_bytes, ag::host_memory_bytes()) << dev->spec().name;
  }
  // timing-only sim memory is untouched address space: not capped
  o.sim.compute_values = false;
  auto t = gpu::make_devices("sim:1", o);
  ASSERT_TRUE(t.has_value());
  EXPECT_FALSE((*t)[0]->spec().in_host_memory);
  EXPECT_EQ((*t)[0]->memory_capacity(), ag::max_tensor_bytes);
}

}  // namespace

