#include "gpu/cuda/kernel_preload.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/cuda_testing.hpp"
#include "gpu/cuda/device_guard.hpp"

namespace ag::gpu::cuda {
namespace {

struct anchor_list {
  std::mutex mu;
  std::vector<const void*> kernels;
};
anchor_list& anchors() {
  static anchor_list a;  // function-local: safe from every .cu's static initialiser
  return a;
}

// Driver calls through the runtime's entry-point lookup: the backend never
// links libcuda (binaries must start on machines without a driver).
struct driver_calls {
  CUresult (*func_get_module)(CUmodule*, CUfunction) = nullptr;
  CUresult (*module_function_count)(unsigned int*, CUmodule) = nullptr;
  CUresult (*module_enumerate)(CUfunction*, unsigned int, CUmodule) = nullptr;
  CUresult (*func_load)(CUfunction) = nullptr;
  CUresult (*func_is_loaded)(CUfunctionLoadingState*, CUfunction) = nullptr;
  bool complete() const {
    return func_get_module && module_function_count && module_enumerate && func_load && func_is_loaded;
  }
};

template <class F>
void lookup(const char* name, F& out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12040, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    out = reinterpret_cast<F>(p);
  else
    (void)cudaGetLastError();
}

const driver_calls& driver() {
  static const driver_calls d = [] {
    driver_calls c;
    lookup("cuFuncGetModule", c.func_get_module);
    lookup("cuModuleGetFunctionCount", c.module_function_count);
    lookup("cuModuleEnumerateFunctions", c.module_enumerate);
    lookup("cuFuncLoad", c.func_load);
    lookup("cuFuncIsLoaded", c.func_is_loaded);
    return c;
  }();
  return d;
}

error driver_error(CUresult r, const std::string& where, const char* call) {
  return error(errc::device_failed, where + ": " + call + " failed (CUresult " + std::to_string(static_cast<int>(r)) +
                                        ") while loading the backend's kernels");
}

/// Calls visit(function) for every function of every registered module in
/// the current device's context; `modules` receives how many modules.
template <class Visit>
error for_each_kernel(const driver_calls& d, const std::string& where, int& modules, Visit&& visit) {
  std::vector<const void*> kernels;
  {
    auto& a = anchors();
    std::lock_guard<std::mutex> lk(a.mu);
    kernels = a.kernels;
  }
  std::vector<CUmodule> seen;
  std::vector<CUfunction> functions;
  for (const void* k : kernels) {
    cudaFunction_t f = nullptr;  // the anchor in the current device's context
    AG_CUDA_TRY(cudaGetFuncBySymbol(&f, k), where + ": loading the backend's kernels");
    CUmodule m = nullptr;
    if (CUresult r = d.func_get_module(&m, reinterpret_cast<CUfunction>(f)); r != CUDA_SUCCESS)
      return driver_error(r, where, "cuFuncGetModule");
    if (std::find(seen.begin(), seen.end(), m) != seen.end()) continue;
    seen.push_back(m);
    unsigned int n = 0;
    if (CUresult r = d.module_function_count(&n, m); r != CUDA_SUCCESS)
      return driver_error(r, where, "cuModuleGetFunctionCount");
    functions.assign(n, nullptr);
    if (CUresult r = d.module_enumerate(functions.data(), n, m); r != CUDA_SUCCESS)
      return driver_error(r, where, "cuModuleEnumerateFunctions");
    for (CUfunction fn : functions)
      if (error e = visit(fn)) return e;
  }
  modules = static_cast<int>(seen.size());
  return {};
}

}  // namespace

bool register_module_anchor(const void* kernel) noexcept {
  auto& a = anchors();
  std::lock_guard<std::mutex> lk(a.mu);
  a.kernels.push_back(kernel);
  return true;
}

error preload_kernels(const std::string& where) {
  const driver_calls& d = driver();
  if (!d.complete()) return {};
  int modules = 0;
  return for_each_kernel(d, where, modules, [&](CUfunction fn) -> error {
    if (CUresult r = d.func_load(fn); r != CUDA_SUCCESS) return driver_error(r, where, "cuFuncLoad");
    return {};
  });
}

namespace testing {
expected<int> unloaded_kernels(int ordinal, int* modules) {
  const driver_calls& d = driver();
  if (!d.complete()) return -1;
  detail::device_guard g(ordinal);
  const std::string where = "cuda" + std::to_string(ordinal);
  int walked = 0, unloaded = 0;
  if (error e = for_each_kernel(d, where, walked, [&](CUfunction fn) -> error {
        CUfunctionLoadingState st{};
        if (CUresult r = d.func_is_loaded(&st, fn); r != CUDA_SUCCESS) return driver_error(r, where, "cuFuncIsLoaded");
        unloaded += st != CU_FUNCTION_LOADING_STATE_LOADED;
        return {};
      }))
    return e;
  if (modules) *modules = walked;
  return unloaded;
}
}  // namespace testing

}  // namespace ag::gpu::cuda
