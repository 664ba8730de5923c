#pragma once
// The clock anchor: maps a CUDA device's timing events onto the host clock,
// so that trace timestamps of GPU work and of host-side events compare.
// Only gpu/cuda/ includes it.

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

/// One device's mapping: `ref_event` was reached at host time `ref_ns`; GPU
/// time advances `rate` host ns per GPU ns. host_ns() is thread-safe;
/// calibrate() is called alone by the device factory before the device is
/// shared, then only by host_ns() under its lock.
class clock_anchor {
 public:
  clock_anchor(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}
  ~clock_anchor();
  clock_anchor(const clock_anchor&) = delete;
  clock_anchor& operator=(const clock_anchor&) = delete;

  /// (Re)anchors timing events to the host clock. Not thread-safe: called
  /// before any other thread can see the anchor, later only under host_ns()'s lock.
  ///
  /// One sample: note the host time t0, record an event on an idle private
  /// stream, spin on cudaEventQuery until it completes, note t1. The GPU
  /// reached the event inside [t0, t1], most of which is launch latency; it
  /// was reached at most one query round trip (~1 us) before t1. Of several
  /// samples the one with the narrowest bracket becomes the anchor (ref_ns =
  /// its t1), so a sample disturbed by preemption or a busy PCIe link is not.
  /// With a previous anchor at least 0.2 s older, the GPU-vs-host clock rate
  /// is re-estimated from the pair: GPU and host oscillators differ by some
  /// ppm, which over seconds is tens of us, more than a completion latency.
  /// host_ns() re-anchors every second, so errors stay at ~1 us.
  error calibrate();

  /// Host time (ns, steady clock) at which the completed timing event `ev` of
  /// this device was reached; 0 when CUDA cannot tell. Thread-safe; re-anchors
  /// first when the anchor is older than a second.
  int64_t host_ns(cudaEvent_t ev);


 private:
  std::mutex mu_;  // guards everything below (host_ns() and its calibrate())
  int ordinal_;
  std::string name_;
  cudaEvent_t ref_event_ = nullptr;
  cudaEvent_t spare_event_ = nullptr;  // the other sample / the previous anchor
  int64_t ref_ns_ = 0;
  int64_t anchored_at_ns_ = 0;         // host time of the last calibration
  double rate_ = 1.0;
  // Created by the first calibrate() and kept: stream creation can hold the
  // driver lock for long, and calibrate() runs again every second.
  cudaStream_t clock_stream_ = nullptr;
};

}  // namespace ag::gpu::cuda::detail
