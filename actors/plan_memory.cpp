#include "actors/plan_memory.hpp"

namespace ag::actors {

plan_memory::~plan_memory() {
  if (!dev) return;
  if (weights && !weight_owner) dev->deallocate(weights);
  if (states && !state_owner) dev->deallocate(states);
  for (void* a : arenas)
    if (a) dev->deallocate(a);
}

}  // namespace ag::actors
