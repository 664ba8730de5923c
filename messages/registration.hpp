#pragma once
/// \file registration.hpp
/// One call that makes every serializable message type and the "ag" error
/// category known to an actor system config (needed for remote actors and
/// readable error strings; local-only messages need nothing).

#include <caf/actor_system_config.hpp>

namespace ag::msg {

void register_message_types(caf::actor_system_config& cfg);

}  // namespace ag::msg
