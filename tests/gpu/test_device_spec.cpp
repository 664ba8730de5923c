// make_devices: every grammar case and every error, with messages that name
// the offending item.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/device.hpp"

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

}  // namespace

namespace ag {
namespace {

// A repeated CUDA ordinal is a second logical device of the same GPU
// ("cuda:0,0": tensor parallelism on a 1-GPU machine), not an error.
TEST(DeviceSpec, RepeatedCudaOrdinalIsAnotherLogicalDeviceOfThatGpu) {
  auto r = gpu::parse_device_spec("cuda:0,0");
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].ordinals, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace ag
