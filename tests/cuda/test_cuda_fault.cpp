// A real sticky CUDA error, through the public API: a kernel that traps ends
// the GPU's context for the rest of the process. The runtime must mark that
// device dead and keep it so (reset_device refuses), fail the jobs that use
// it with its death error, keep serving the jobs of its other devices, and
// neither abort nor hang, also when it is destroyed.
//
// The scenario runs in a process of its own (a death test re-executing this
// binary, style "threadsafe": no fork after CUDA is initialised), since no
// later test of a process could use the GPU once its context has a sticky
// error; it exits 0 only when every check held and prints the first that did
// not otherwise.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/actorgraph.hpp"
#include "cuda/cuda_test_util.hpp"
#include "gpu/cuda/cuda_testing.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

using namespace std::chrono_literals;

/// x -> matmul -> gelu, every tensor pinned to `device`.
graph matmul_gelu_on(int device) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {16, 32});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {32, 32}, 11 + static_cast<uint64_t>(device), 0.3f));
  auto m = b.matmul(x, w, false, false, "fc");
  auto y = b.gelu(m, gelu_mode::tanh, "act");
  for (auto t : {x, w, m, y}) b.pin(t, device);
  b.output(y);
  return std::move(b).build().value();
}

/// "" when `j` finished in time with `want`'s values, else what went wrong.
std::string check_done(job& j, const std::vector<host_tensor>& want, const std::string& what) {
  if (!j.wait_for(60s)) return what + ": the job hangs";
  const auto& r = j.wait();
  if (!r) return what + ": failed: " + r.err().to_string();
  auto c = compare(r->front(), want.front(), 2e-4, 2e-3);
  return c.ok ? "" : what + ": wrong values: " + c.message;
}

std::string sticky_error_scenario() {
  runtime_options o;
  o.trace = false;
  auto made = runtime::create("cuda:0,cpu:1", o);
  if (!made) return "runtime::create(cuda:0,cpu:1): " + made.err().to_string();
  auto& rt = **made;
  auto on_gpu = rt.compile(matmul_gelu_on(0));
  auto on_cpu = rt.compile(matmul_gelu_on(1));
  if (!on_gpu || !on_cpu) return "compile: " + (on_gpu ? on_cpu.err() : on_gpu.err()).to_string();
  const std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {16, 32}, 5)};
  const auto want_gpu = evaluate_reference((*on_gpu)->source(), in).value();
  const auto want_cpu = evaluate_reference((*on_cpu)->source(), in).value();

  // The GPU serves before the fault.
  auto before = rt.submit(*on_gpu, in);
  if (auto why = check_done(before, want_gpu, "cuda0 job before the fault"); !why.empty()) return why;

  // A trapping kernel on a stream of the runtime's cuda0: the next call that
  // looks at the context (this synchronize) sees the sticky error.
  gpu::device_ptr dev = rt.device(0);
  auto s = dev->create_stream(step_kind::compute);
  if (!s) return "create_stream: " + s.err().to_string();
  if (error e = gpu::cuda::testing::launch_trap(*dev, **s)) return "launch_trap: " + e.to_string();
  const error sync = dev->synchronize(**s);
  if (sync.code != errc::device_failed)
    return "synchronize after the trap: want device_failed, got " + sync.to_string();
  if (dev->alive()) return "cuda0 still says it is alive after a sticky error";
  s->reset();  // its destroy call fails on the dead context: logged, never thrown

  // The death notice reaches the runtime through the device's actor.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (rt.device_in_service(0) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  if (rt.device_in_service(0)) return "cuda0 still in service 10 s after its sticky error";
  if (!rt.device_in_service(1)) return "the cpu device left service with the GPU";

  // Jobs on the dead GPU fail with its death error; the cpu device serves.
  auto after = rt.submit(*on_gpu, in);
  if (!after.wait_for(60s)) return "cuda0 job after the fault hangs";
  if (after.wait()) return "cuda0 job after the fault finished done";
  const error& died = after.wait().err();
  if (died.code != errc::device_failed || died.device != 0 || died.message.find("cuda0") == std::string::npos)
    return "cuda0 job after the fault: want device_failed naming cuda0 (device 0), got " + died.to_string();
  auto cpu_job = rt.submit(*on_cpu, in);
  if (auto why = check_done(cpu_job, want_cpu, "cpu job after the GPU died"); !why.empty()) return why;

  // A sticky error cannot be undone in this process: the reset refuses and
  // the device stays out of service; the cpu device still serves.
  const error reset = rt.reset_device(0);
  if (reset.code != errc::device_failed) return "reset_device(0) of a dead GPU: want device_failed, got " + reset.to_string();
  if (rt.device_in_service(0)) return "cuda0 back in service after a refused reset";
  auto again = rt.submit(*on_gpu, in);
  if (!again.wait_for(60s) || again.wait() || again.wait().err().code != errc::device_failed)
    return "cuda0 job after the refused reset did not fail with device_failed";
  auto cpu_again = rt.submit(*on_cpu, in);
  if (auto why = check_done(cpu_again, want_cpu, "cpu job after the refused reset"); !why.empty()) return why;
  std::cerr << "reset refused as expected: " << reset.message << "\n";
  return "";  // the runtime is destroyed by the caller's scope: it must return
}

TEST(CudaFault, AStickyErrorKillsOnlyThatDeviceWhichStaysDeadWhileTheProcessCarriesOn) {
  AG_REQUIRE_GPU(1);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::string why = sticky_error_scenario();
        if (!why.empty()) {
          std::cerr << "sticky-error scenario failed: " << why << "\n";
          std::exit(1);
        }
        std::cerr << "sticky-error scenario: every check held, runtime destroyed\n";
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "every check held, runtime destroyed");
}

}  // namespace
}  // namespace ag
