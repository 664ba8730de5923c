#include "gpu/cpu/bf16_gemm.hpp"

#include "gpu/cpu/thread_team.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef ACTORGRAPH_HAVE_DNNL
#include <omp.h>

#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#endif

namespace ag::gpu::cpu {

#ifdef ACTORGRAPH_HAVE_DNNL

namespace {

// One product's shape and strides: the key of a thread's primitives.
using shape_key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

// A thread's oneDNN objects. A primitive of a layout oneDNN only has its
// reference kernel for is kept as null: the caller falls back at once.
struct thread_state {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<shape_key, std::unique_ptr<dnnl::matmul>> primitives;

  thread_state() {
    // This thread's OpenMP regions (oneDNN's) run on it alone: the cpu
    // backend spreads the blocks over its own helpers.
    omp_set_num_threads(1);
  }

  // The primitive for C (m x n, row stride ldc) = A (m x k) B (k x n), or
  // null where oneDNN has no fast kernel for it. Throws dnnl::error.
  dnnl::matmul* get(int64_t m, int64_t n, int64_t k, int64_t ars, int64_t acs, int64_t brs, int64_t bcs,
                    int64_t ldc, bool c_bf16) {
    const shape_key key{m, n, k, ars, acs, brs, bcs, ldc, c_bf16};
    if (auto it = primitives.find(key); it != primitives.end()) return it->second.get();
    // A prefill's lengths vary from job to job: a bounded table.
    if (primitives.size() >= 256) primitives.clear();
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc a_md({m, k}, dt::bf16, {ars, acs});
    const dnnl::memory::desc b_md({k, n}, dt::bf16, {brs, bcs});
    const dnnl::memory::desc c_md({m, n}, c_bf16 ? dt::bf16 : dt::f32, {ldc, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    const char* impl = pd.impl_info_str();
    std::unique_ptr<dnnl::matmul> p;
    if (impl && std::strncmp(impl, "ref", 3) != 0) p = std::make_unique<dnnl::matmul>(pd);
    return primitives.emplace(key, std::move(p)).first->second.get();
  }
};

thread_state& state() {
  thread_local thread_state s;
  return s;
}

}  // namespace

bool bf16_gemm_available() noexcept {
  static const bool yes = [] {
    if (const char* e = std::getenv("AG_CPU_BF16_GEMM"); e && std::strcmp(e, "0") == 0) return false;
    try {
      const auto isa = dnnl::get_effective_cpu_isa();
      return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
    } catch (...) {
      return false;
    }
  }();
  return yes;
}

bool bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ars, int64_t acs, const uint16_t* b,
               int64_t brs, int64_t bcs, void* c, bool c_bf16, int64_t ldc, int threads) {
  if (!bf16_gemm_available() || m <= 0 || n <= 0 || k <= 0) return false;
  const int64_t blocks = (n + bf16_gemm_block - 1) / bf16_gemm_block;
  std::atomic<bool> failed{false};
  // A range of blocks on one thread. oneDNN reports failure by throwing,
  // which must not leave a helper thread (run_parts): it is caught here.
  auto run = [&](int64_t first, int64_t end) {
    try {
      thread_state& st = state();
      for (int64_t j = first; j < end && !failed.load(std::memory_order_relaxed); ++j) {
        const int64_t j0 = j * bf16_gemm_block, nb = std::min(bf16_gemm_block, n - j0);
        dnnl::matmul* p = st.get(m, nb, k, ars, acs, brs, bcs, ldc, c_bf16);
        if (!p) {
          failed.store(true, std::memory_order_relaxed);
          return;
        }
        using dt = dnnl::memory::data_type;
        dnnl::memory am({{m, k}, dt::bf16, {ars, acs}}, st.engine, const_cast<uint16_t*>(a));
        dnnl::memory bm({{k, nb}, dt::bf16, {brs, bcs}}, st.engine, const_cast<uint16_t*>(b + j0 * bcs));
        void* cj = c_bf16 ? static_cast<void*>(static_cast<uint16_t*>(c) + j0) : static_cast<float*>(c) + j0;
        dnnl::memory cm({{m, nb}, c_bf16 ? dt::bf16 : dt::f32, {ldc, 1}}, st.engine, cj);
        p->execute(st.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        st.stream.wait();
      }
    } catch (...) {
      failed.store(true, std::memory_order_relaxed);
    }
  };
  // The first block alone first: a layout without a fast kernel is known
  // before any helper wakes up.
  run(0, 1);
  if (failed.load()) return false;
  if (blocks > 1) {
    const int parts = static_cast<int>(std::min<int64_t>(blocks - 1, 4 * static_cast<int64_t>(std::max(threads, 1))));
    run_parts(parts, threads, [&](int i) { run(1 + (blocks - 1) * i / parts, 1 + (blocks - 1) * (i + 1) / parts); });
  }
  return !failed.load();
}

#else

bool bf16_gemm_available() noexcept { return false; }

bool bf16_gemm(int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, void*,
               bool, int64_t, int) {
  return false;
}

#endif

}  // namespace ag::gpu::cpu
