#include "actors/plan_memory.hpp"

#include <new>

namespace ag::actors {

bool plan_memory::allocate_window(std::size_t a) {
  if (window_bytes <= 0 || windows[a]) return true;
  const auto bytes = static_cast<std::size_t>(window_bytes);
  try {
    windows[a] = static_cast<std::byte*>(window_memory ? window_memory->allocate(bytes)
                                                       : ::operator new(bytes, std::align_val_t{64}));
  } catch (const std::bad_alloc&) {
    return false;
  }
  return true;
}

plan_memory::~plan_memory() {
  if (!dev) return;
  if (weights && !weight_owner) dev->deallocate(weights);
  if (states && !state_owner) dev->deallocate(states);
  for (void* a : arenas)
    if (a) dev->deallocate(a);
  for (std::byte* w : windows) {
    if (!w) continue;
    if (window_memory) window_memory->deallocate(w, static_cast<std::size_t>(window_bytes));
    else ::operator delete(w, std::align_val_t{64});
  }
}

}  // namespace ag::actors
