#include "gpu/cuda/nccl_group.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <tuple>

#ifdef ACTORGRAPH_HAVE_NCCL
#include <nccl.h>
#endif

namespace ag::gpu::cuda {

namespace {
std::mutex cache_mutex;
// Keyed by (GPUs, member devices, index: the plan's job lane): one
// communicator per group of logical
// devices, so two groups over the same GPUs (cuda:0,1,0,1 as 2 stages x 2)
// never share one. A communicator's collectives must be issued in one order
// on every rank, and the runtime agrees that order per group (per member
// queue): two groups interleaving on one communicator mispaired and hung.
using group_key = std::tuple<std::vector<int>, std::vector<uint64_t>, int>;
std::map<group_key, std::weak_ptr<nccl_group>>& cache() {
  static std::map<group_key, std::weak_ptr<nccl_group>> c;
  return c;
}
std::string gpus(const std::vector<int>& o) {
  std::string s = "GPUs";
  for (int x : o) s += " " + std::to_string(x);
  return s;
}
}  // namespace

#ifdef ACTORGRAPH_HAVE_NCCL

namespace {

/// ncclResult_t -> ag::error: a system / internal / remote failure is the
/// device's (device_failed), bad arguments and usage are the caller's.
error nccl_error(ncclResult_t r, const std::string& where, const char* call) {
  errc code = errc::op_failed;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = errc::invalid_argument;
  else if (r == ncclSystemError || r == ncclInternalError || r == ncclRemoteError) code = errc::device_failed;
  std::string m = where + ": " + call + " failed: " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last && *last) m += std::string(" (") + last + ")";
  return error(code, m);
}

#define AG_NCCL_TRY(call, where)                                   \
  do {                                                             \
    const ncclResult_t ag_r_ = (call);                             \
    if (ag_r_ != ncclSuccess) return nccl_error(ag_r_, (where), #call); \
  } while (0)

expected<ncclDataType_t> nccl_type(dtype t, const std::string& where) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::i32: return ncclInt32;
  }
  return error(errc::dtype_mismatch, where + ": no NCCL type for " + std::string(to_string(t)));
}

void set_env_defaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    // overwrite = 0: a value the user set wins.
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    ::setenv("NCCL_LAUNCH_MODE", "PARALLEL", 0);
    // Connect every peer inside ncclCommInitAll. With NCCL's default lazy
    // connection (2.22+), a rank's first collective does a host-side
    // handshake with its peers and blocks until they make the same call; the
    // runtime issues each rank's part from that member's actor on whatever
    // worker thread CAF picks, so two ranks' first calls can sit on one
    // thread and the handshake never completes (seen on 2 H100s: the first
    // 2-GPU all-reduce hung). Connected at init, a call only enqueues.
    ::setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  });
}

}  // namespace

struct nccl_group::impl {
  // Enqueues take it shared, abort() exclusive: the ranks' enqueues never
  // wait for one another here (an exclusive lock would make a rank's call
  // that NCCL holds until its peers call too a deadlock), and an abort never
  // frees a communicator that a call is using.
  std::shared_mutex mutex;
  std::vector<ncclComm_t> comms;
  bool aborted = false;
};

nccl_group::nccl_group(std::vector<int> ordinals, std::vector<uint64_t> members, int index)
    : ordinals_(std::move(ordinals)), index_(index), members_(std::move(members)), impl_(std::make_unique<impl>()) {}

nccl_group::~nccl_group() {
  std::lock_guard<std::shared_mutex> lk(impl_->mutex);
  if (impl_->aborted) return;
  for (ncclComm_t c : impl_->comms)
    if (c) (void)ncclCommDestroy(c);  // a destructor never throws; an error here has nobody to go to
}

expected<std::shared_ptr<nccl_group>> nccl_group::get(const std::vector<int>& ordinals,
                                                       const std::vector<uint64_t>& members, int index) {
  std::lock_guard<std::mutex> lk(cache_mutex);
  const group_key key{ordinals, members, index};
  if (auto it = cache().find(key); it != cache().end())
    if (auto g = it->second.lock(); g && !g->aborted()) return g;
  set_env_defaults();
  const std::string where = "NCCL communicator of " + gpus(ordinals);
  std::shared_ptr<nccl_group> g(new nccl_group(ordinals, members, index));
  g->impl_->comms.assign(ordinals.size(), nullptr);
  // All ranks at once, from this thread: ncclCommInitAll needs every one.
  AG_NCCL_TRY(ncclCommInitAll(g->impl_->comms.data(), static_cast<int>(ordinals.size()), ordinals.data()), where);
  cache()[key] = g;
  return g;
}

error nccl_group::all_reduce(int rank, const void* send, void* recv, int64_t count, dtype type, cudaStream_t stream,
                             const std::string& where) {
  auto t = nccl_type(type, where);
  if (!t) return t.err();
  std::shared_lock<std::shared_mutex> lk(impl_->mutex);
  if (impl_->aborted) return error(errc::device_failed, where + ": the NCCL communicator was aborted (a member died)");
  AG_NCCL_TRY(ncclAllReduce(send, recv, static_cast<size_t>(count), *t, ncclSum,
                            impl_->comms[static_cast<std::size_t>(rank)], stream),
              where);
  return {};
}

error nccl_group::all_gather(int rank, const void* send, void* recv, int64_t count, dtype type, cudaStream_t stream,
                             const std::string& where) {
  auto t = nccl_type(type, where);
  if (!t) return t.err();
  std::shared_lock<std::shared_mutex> lk(impl_->mutex);
  if (impl_->aborted) return error(errc::device_failed, where + ": the NCCL communicator was aborted (a member died)");
  AG_NCCL_TRY(ncclAllGather(send, recv, static_cast<size_t>(count), *t, impl_->comms[static_cast<std::size_t>(rank)],
                            stream),
              where);
  return {};
}

error nccl_group::async_error(int rank, const std::string& where) {
  std::shared_lock<std::shared_mutex> lk(impl_->mutex);
  if (impl_->aborted) return error(errc::device_failed, where + ": the NCCL communicator was aborted (a member died)");
  ncclResult_t state = ncclSuccess;
  AG_NCCL_TRY(ncclCommGetAsyncError(impl_->comms[static_cast<std::size_t>(rank)], &state), where);
  if (state != ncclSuccess && state != ncclInProgress) return nccl_error(state, where, "NCCL (asynchronous)");
  return {};
}

void nccl_group::abort(const std::string& why) {
  {
    std::lock_guard<std::shared_mutex> lk(impl_->mutex);
    if (impl_->aborted) return;
    impl_->aborted = true;
    // Every rank: kernels of the other members that wait for the dead one
    // return instead of spinning forever.
    for (ncclComm_t c : impl_->comms)
      if (c) (void)ncclCommAbort(c);  // best effort: the group is gone either way
  }
  (void)why;
  std::lock_guard<std::mutex> lk(cache_mutex);
  if (auto it = cache().find(group_key{ordinals_, members_, index_}); it != cache().end() && it->second.lock().get() == this)
    cache().erase(it);
}

bool nccl_group::aborted() const noexcept {
  std::shared_lock<std::shared_mutex> lk(impl_->mutex);
  return impl_->aborted;
}

void abort_nccl_groups_of(int ordinal, const std::string& why) {
  std::vector<std::shared_ptr<nccl_group>> hit;
  {
    std::lock_guard<std::mutex> lk(cache_mutex);
    for (auto& [k, w] : cache())
      if (auto g = w.lock(); g && std::find(std::get<0>(k).begin(), std::get<0>(k).end(), ordinal) != std::get<0>(k).end())
        hit.push_back(std::move(g));
  }
  for (auto& g : hit) g->abort(why);  // outside the cache lock: abort() takes it
}

#else  // no NCCL in this build

struct nccl_group::impl {};
nccl_group::nccl_group(std::vector<int> ordinals, std::vector<uint64_t> members, int index)
    : ordinals_(std::move(ordinals)), index_(index), members_(std::move(members)) {}
nccl_group::~nccl_group() = default;

namespace {
error no_nccl(const std::string& where) {
  return error(errc::unsupported_op, where + ": this build has no NCCL (ACTORGRAPH_HAVE_NCCL unset)");
}
}  // namespace

expected<std::shared_ptr<nccl_group>> nccl_group::get(const std::vector<int>& ordinals,
                                                       const std::vector<uint64_t>&, int) {
  return no_nccl("NCCL communicator of " + gpus(ordinals));
}
error nccl_group::all_reduce(int, const void*, void*, int64_t, dtype, cudaStream_t, const std::string& where) {
  return no_nccl(where);
}
error nccl_group::all_gather(int, const void*, void*, int64_t, dtype, cudaStream_t, const std::string& where) {
  return no_nccl(where);
}
error nccl_group::async_error(int, const std::string&) { return {}; }
void nccl_group::abort(const std::string&) {}
bool nccl_group::aborted() const noexcept { return false; }
void abort_nccl_groups_of(int, const std::string&) {}

#endif

}  // namespace ag::gpu::cuda
