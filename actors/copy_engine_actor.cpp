#include "actors/copy_engine_actor.hpp"

namespace ag::actors {

caf::actor spawn_copy_engine(caf::actor_system& sys, gpu::device_ptr dev, step_kind kind, stall_watch watch) {
  return spawn_exec_actor(sys, std::move(dev), kind, 0, std::move(watch));
}

}  // namespace ag::actors
