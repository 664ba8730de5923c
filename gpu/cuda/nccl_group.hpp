#pragma once
/// \file nccl_group.hpp
/// NCCL communicators of the CUDA backend: one per tensor-parallel group
/// (its member devices, on distinct GPUs, rank order), shared by every plan
/// of this process that has that group of devices, created by ncclCommInitAll when the first
/// such plan loads (device::prepare_collective_group). Only gpu/cuda/
/// includes it; without NCCL in the build (ACTORGRAPH_HAVE_NCCL unset) every
/// call returns errc::unsupported_op.
///
/// Threading: get() and abort() are thread-safe. A rank's enqueue calls
/// come from that member's communication actor only (one thread at a time
/// per communicator, NCCL's rule); the runtime issues a group's collectives
/// in one order on every member (actors/collective_order.hpp), which NCCL
/// needs. A rank's call enqueues its own part on the member's stream and
/// returns (NCCL_LAUNCH_MODE=PARALLEL, set at the first NCCL call if
/// unset): no group call across ranks, no host wait for the other ranks.

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/dtype.hpp"

namespace ag::gpu::cuda {

class nccl_group {
 public:
  /// The communicator of the member devices `members` (process-unique
  /// device ids, rank order) on the GPUs `ordinals` (distinct, rank order),
  /// made now (ncclCommInitAll, all ranks at once) unless this process has
  /// it. Two groups of other devices over the same GPUs get two
  /// communicators: each group's issue order is agreed on its own; so do
  /// two `index`es of one group (a plan's job lanes, each with its own
  /// order: collective_launch::communicator).
  /// Sets NCCL_NVLS_ENABLE=0 (NVLink multicast stays off, DESIGN.md) and
  /// NCCL_LAUNCH_MODE=PARALLEL and NCCL_RUNTIME_CONNECT=0 (peers connected at
  /// init, so no collective blocks the host) in the environment before the first NCCL
  /// call when they are unset. Errors name the GPUs and NCCL's message.
  static expected<std::shared_ptr<nccl_group>> get(const std::vector<int>& ordinals,
                                                   const std::vector<uint64_t>& members, int index = 0);

  ~nccl_group();
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  /// Enqueues rank `rank`'s sum of `count` elements of `type` on `stream`
  /// (ncclAllReduce). `where` names the device and collective in errors.
  error all_reduce(int rank, const void* send, void* recv, int64_t count, dtype type, cudaStream_t stream,
                   const std::string& where);
  /// Enqueues rank `rank`'s part of ncclAllGather: `recv` gets every rank's
  /// `count` elements, rank after rank.
  error all_gather(int rank, const void* send, void* recv, int64_t count, dtype type, cudaStream_t stream,
                   const std::string& where);
  /// The communicator's asynchronous error (ncclCommGetAsyncError) of
  /// `rank`, as an error naming `where`; ok when none.
  error async_error(int rank, const std::string& where);
  /// A member died: aborts every rank's communicator (ncclCommAbort), so
  /// parts enqueued on the other members stop instead of waiting for it,
  /// and drops the group from the process's cache (a later plan makes a
  /// fresh one). Idempotent.
  void abort(const std::string& why);
  bool aborted() const noexcept;

  const std::vector<int>& ordinals() const noexcept { return ordinals_; }
  int size() const noexcept { return static_cast<int>(ordinals_.size()); }

 private:
  struct impl;
  nccl_group(std::vector<int> ordinals, std::vector<uint64_t> members, int index);
  std::vector<int> ordinals_;
  int index_ = 0;
  std::vector<uint64_t> members_;
  std::unique_ptr<impl> impl_;
};

/// Aborts every cached communicator that has GPU `ordinal` (its device
/// died). Thread-safe; nothing without NCCL.
void abort_nccl_groups_of(int ordinal, const std::string& why);

}  // namespace ag::gpu::cuda
