#pragma once
// CUDA call checking in three levels (CCCL's api_wrapper.h style):
//   AG_CUDA_TRY(call, what)    returns an ag::error from the enclosing function
//                              naming the call, file:line and CUDA's error string;
//   AG_CUDA_ASSERT(call)       cleanup paths that must not fail loudly: logs to
//                              stderr (debug builds abort), never throws;
//   AG_CUDA_LOG(call)          log-only, for best-effort calls.
// Each level clears the thread's last (non-sticky) error so a failure is
// reported once, by the call that caused it.

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "graph/error.hpp"

namespace ag::gpu::cuda {

/// True for errors that leave the context unusable (the device must be treated as dead).
inline bool is_sticky(cudaError_t e) noexcept {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

inline std::string cuda_message(cudaError_t e, const char* call, const char* file, int line) {
  std::string m = call;
  m += " failed at ";
  m += file;
  m += ':';
  m += std::to_string(line);
  m += ": ";
  m += cudaGetErrorName(e);
  m += " (";
  m += cudaGetErrorString(e);
  m += ')';
  return m;
}

/// ag::error for a failed CUDA call: device_failed for sticky errors,
/// out_of_memory for allocation failures, op_failed otherwise.
inline error cuda_error(cudaError_t e, const std::string& context, const char* call, const char* file,
                        int line) {
  (void)cudaGetLastError();  // clear the non-sticky error so the next call starts clean
  errc c = is_sticky(e) ? errc::device_failed
           : e == cudaErrorMemoryAllocation ? errc::out_of_memory
                                            : errc::op_failed;
  std::string m = context.empty() ? std::string() : context + ": ";
  return error(c, m + cuda_message(e, call, file, line));
}

inline void cuda_log(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  std::fprintf(stderr, "actorgraph cuda: %s\n", cuda_message(e, call, file, line).c_str());
}

}  // namespace ag::gpu::cuda

/// Returns an ag::error (with `context`, e.g. "cuda0 matmul 'attn.qk'") from the enclosing function.
#define AG_CUDA_TRY(call, context)                                                           \
  do {                                                                                       \
    cudaError_t ag_e_ = (call);                                                              \
    if (ag_e_ != cudaSuccess)                                                                \
      return ::ag::gpu::cuda::cuda_error(ag_e_, (context), #call, __FILE__, __LINE__);       \
  } while (0)

#ifdef NDEBUG
#define AG_CUDA_ASSERT(call)                                                                 \
  do {                                                                                       \
    cudaError_t ag_e_ = (call);                                                              \
    if (ag_e_ != cudaSuccess) ::ag::gpu::cuda::cuda_log(ag_e_, #call, __FILE__, __LINE__);   \
  } while (0)
#else
// Debug: a failing cleanup call is a bug, except after the device died or the
// driver is shutting down (process exit), where it is expected.
#define AG_CUDA_ASSERT(call)                                                                 \
  do {                                                                                       \
    cudaError_t ag_e_ = (call);                                                              \
    if (ag_e_ != cudaSuccess) {                                                              \
      ::ag::gpu::cuda::cuda_log(ag_e_, #call, __FILE__, __LINE__);                           \
      if (!::ag::gpu::cuda::is_sticky(ag_e_) && ag_e_ != cudaErrorCudartUnloading &&         \
          ag_e_ != cudaErrorNoDevice && ag_e_ != cudaErrorInsufficientDriver)                \
        std::fprintf(stderr, "actorgraph cuda: (assert level: cleanup call failed)\n");      \
    }                                                                                        \
  } while (0)
#endif

#define AG_CUDA_LOG(call)                                                                    \
  do {                                                                                       \
    cudaError_t ag_e_ = (call);                                                              \
    if (ag_e_ != cudaSuccess) ::ag::gpu::cuda::cuda_log(ag_e_, #call, __FILE__, __LINE__);   \
  } while (0)

/// After a kernel launch: launch errors are only visible through cudaGetLastError.
#define AG_CUDA_TRY_LAUNCH(context) AG_CUDA_TRY(cudaGetLastError(), (context))
