#pragma once
// A probe for backend host calls that may wait for the GPU. Only gpu/cuda/
// includes it.

#include <chrono>
#include <cstdio>
#include <string>

namespace ag::gpu::cuda::detail {

/// Reports on stderr, when it goes out of scope, a host call of the backend
/// that blocked for over a second: it waited for the GPU, or for a driver
/// lock held by a call that did. With an in-stream part spinning on that GPU
/// for a kernel this thread has yet to enqueue, that is how a part times
/// out (in_stream.cuh; a graph's instantiation did, on logical devices of
/// one H100: docs/BENCHMARKS.md, session 14). A diagnosis aid: it costs two
/// clock reads. `device` must outlive it.
class slow_call {
 public:
  slow_call(const std::string& device, const char* what) : device_(device), what_(what) {}
  ~slow_call() {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    if (ms > 1000.0)
      std::fprintf(stderr, "actorgraph cuda: %s: %s blocked the host for %.0f ms\n", device_.c_str(), what_, ms);
  }
  slow_call(const slow_call&) = delete;
  slow_call& operator=(const slow_call&) = delete;

 private:
  const std::string& device_;
  const char* what_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace ag::gpu::cuda::detail
