#pragma once
// A plain byte copy between two addresses of the unified address space, and
// when two of them may run at once. The CUDA backend batches a replayed
// segment's consecutive host copies into one kernel
// (gpu/cuda/elementwise.cuh launch_byte_copies) only where they are
// independent.
#include <cstdint>

namespace ag::gpu {

/// `bytes` bytes from `src` to `dst`.
struct byte_copy {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
};

/// Whether copies `a` and `b` may run at once with the same result as `a`
/// then `b`: neither writes a byte the other reads or writes. Pointers
/// compare as addresses of one unified space (a host pointer of pinned
/// memory and its device alias are the same address there; host and device
/// memory never overlap). An empty copy touches nothing.
inline bool copies_independent(const byte_copy& a, const byte_copy& b) noexcept {
  const auto overlap = [](const void* p, int64_t pn, const void* q, int64_t qn) {
    const auto x = reinterpret_cast<uintptr_t>(p), y = reinterpret_cast<uintptr_t>(q);
    return pn > 0 && qn > 0 && x < y + static_cast<uintptr_t>(qn) && y < x + static_cast<uintptr_t>(pn);
  };
  return !overlap(a.dst, a.bytes, b.dst, b.bytes) && !overlap(a.dst, a.bytes, b.src, b.bytes) &&
         !overlap(b.dst, b.bytes, a.src, a.bytes);
}

}  // namespace ag::gpu
