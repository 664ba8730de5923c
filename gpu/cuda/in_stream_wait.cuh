#pragma once
// Device-side waits on other devices, shared by the kernels that meet their
// peers on the devices: the in-stream all-reduce's parts (in_stream.cu) and
// a tensor-parallel decode step's ranks (decode_step.cu). How a wait gives
// up, and how it fails its job, is in_stream.cuh's protocol (death words,
// the abort ring, cuda_collective_timeout_s; the fault ring and its detail,
// which cuda_device::collective_fault reads). Only .cu files include it.

#include "gpu/cuda/in_stream.cuh"

namespace ag::gpu::cuda {

__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Whether a wait since t0 gives up: the member died (its death word), the
/// job was cancelled here (`aborted`, the device's abort ring), or the
/// timeout passed. Waits ask every 1024 polls: the host-mapped words cost a
/// PCIe read each.
__device__ inline bool gave_up(const unsigned int* dead, const unsigned long long* aborted, unsigned long long job,
                               long long t0, long long timeout) {
  if (*reinterpret_cast<const volatile unsigned int*>(dead) != 0) return true;
  for (int j = 0; j < in_stream_aborts; ++j)
    if (reinterpret_cast<const volatile unsigned long long*>(aborted)[j] == job) return true;
  return global_ns() - t0 > timeout;
}

/// What the first give-up on this device waited for and saw, for the
/// fault's message (cuda_device::collective_fault): the tag, what was seen,
/// the peer's slot and block, and a fourth word by kind: an in-stream part's
/// previous announcement (pull) or, with the top bit set, its pushed lines'
/// flag; a decode step's rank waited for, with bit 62 set.
__device__ inline void note_give_up(unsigned long long* faults, unsigned long long tag, unsigned long long seen,
                                    int slot, int block, unsigned long long fourth) {
  volatile unsigned long long* d = faults + in_stream_faults;
  if (d[0] != 0) return;
  d[0] = tag;
  d[1] = seen;
  d[2] = (static_cast<unsigned long long>(slot) << 32) | static_cast<unsigned>(block);
  d[3] = fourth;
}

/// Puts `job` (its job word) in the device's fault ring: the runtime fails
/// the job before it completes (device::collective_fault).
__device__ __forceinline__ void note_fault(unsigned long long* faults, unsigned long long job) {
  reinterpret_cast<volatile unsigned long long*>(faults)[job % in_stream_faults] = job;
}

}  // namespace ag::gpu::cuda
