// The clock anchor (clock_anchor.hpp): best-of-8 calibration and the
// event-to-host-time mapping.

#include "gpu/cuda/clock_anchor.hpp"

#include <utility>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/device_guard.hpp"
#include "gpu/cuda/host_clock.hpp"

namespace ag::gpu::cuda::detail {

clock_anchor::~clock_anchor() {
  device_guard g(ordinal_);
  if (ref_event_) AG_CUDA_ASSERT(cudaEventDestroy(ref_event_));
  if (spare_event_) AG_CUDA_ASSERT(cudaEventDestroy(spare_event_));
  if (clock_stream_) AG_CUDA_ASSERT(cudaStreamDestroy(clock_stream_));
}

error clock_anchor::calibrate() {
  device_guard g(ordinal_);
  if (!ref_event_) AG_CUDA_TRY(cudaEventCreate(&ref_event_), name_);
  if (!spare_event_) AG_CUDA_TRY(cudaEventCreate(&spare_event_), name_);
  if (!clock_stream_) AG_CUDA_TRY(cudaStreamCreateWithFlags(&clock_stream_, cudaStreamNonBlocking), name_);
  cudaStream_t s = clock_stream_;
  // The previous anchor, if any, moves to `spare_event_` only once a better
  // one exists; samples go into `candidate`.
  const bool had_anchor = anchored_at_ns_ != 0;
  const int64_t old_ns = ref_ns_;
  cudaEvent_t candidate = nullptr;
  error err;
  if (cudaError_t r = cudaEventCreate(&candidate); r != cudaSuccess)
    err = cuda_error(r, name_ + " clock calibration", "cudaEventCreate", __FILE__, __LINE__);
  cudaEvent_t best = nullptr;
  int64_t best_window = INT64_MAX, best_t1 = 0;
  constexpr int samples = 8;
  for (int i = 0; i < samples && !err; ++i) {
    const int64_t t0 = now_ns();
    cudaError_t r = cudaEventRecord(candidate, s);
    if (r == cudaSuccess)
      while ((r = cudaEventQuery(candidate)) == cudaErrorNotReady) {
      }
    const int64_t t1 = now_ns();
    if (r != cudaSuccess) {
      err = cuda_error(r, name_ + " clock calibration", "cudaEventRecord/Query", __FILE__, __LINE__);
      break;
    }
    if (t1 - t0 < best_window) {
      best_window = t1 - t0;
      best_t1 = t1;
      std::swap(best, candidate);
      if (!candidate) {
        if (cudaError_t c = cudaEventCreate(&candidate); c != cudaSuccess)
          err = cuda_error(c, name_ + " clock calibration", "cudaEventCreate", __FILE__, __LINE__);
      }
    }
  }
  if (candidate) AG_CUDA_ASSERT(cudaEventDestroy(candidate));
  if (err || !best) {
    if (best) AG_CUDA_ASSERT(cudaEventDestroy(best));
    return err ? err : error(errc::device_failed, name_ + ": clock calibration took no sample");
  }
  if (had_anchor) {
    float ms = 0;
    const int64_t host_dt = best_t1 - old_ns;
    if (host_dt > 200'000'000 && cudaEventElapsedTime(&ms, ref_event_, best) == cudaSuccess && ms > 0) {
      const double r = static_cast<double>(host_dt) / (static_cast<double>(ms) * 1e6);
      if (r > 0.9999 && r < 1.0001) rate_ = r;  // beyond 100 ppm a sample was bad, not the clock
    } else {
      (void)cudaGetLastError();
    }
  }
  // best becomes the anchor; the old anchor event is reused as the spare.
  AG_CUDA_ASSERT(cudaEventDestroy(spare_event_));
  spare_event_ = ref_event_;
  ref_event_ = best;
  ref_ns_ = best_t1;
  anchored_at_ns_ = best_t1;
  return {};
}

int64_t clock_anchor::host_ns(cudaEvent_t ev) {
  std::lock_guard<std::mutex> lk(mu_);
  // Re-anchor once a second: keeps clock-rate drift and float-ms rounding
  // of the elapsed time far below a microsecond (see calibrate()).
  if (now_ns() - anchored_at_ns_ > 1'000'000'000) (void)calibrate();
  float ms = 0;
  if (cudaEventElapsedTime(&ms, ref_event_, ev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ref_ns_ + static_cast<int64_t>(static_cast<double>(ms) * 1e6 * rate_);
}

}  // namespace ag::gpu::cuda::detail
