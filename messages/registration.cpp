#include "messages/registration.hpp"

#include "messages/caf_error.hpp"
#include "messages/messages.hpp"

namespace ag::msg {

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<acquire_arena>("ag.acquire_arena");
  cfg.add_message_type<arena_reply>("ag.arena_reply");
  cfg.add_message_type<release_arena>("ag.release_arena");
  cfg.add_message_type<withdraw_arena>("ag.withdraw_arena");
  cfg.add_message_type<unload_plan>("ag.unload_plan");
  cfg.add_message_type<step_done>("ag.step_done");
  cfg.add_message_type<step_failed>("ag.step_failed");
  cfg.add_message_type<cancel_ack>("ag.cancel_ack");
  cfg.add_message_type<fail_job>("ag.fail_job");
  cfg.add_message_type<device_fault>("ag.device_fault");
  cfg.add_message_type<device_down>("ag.device_down");
  cfg.add_message_type<device_stalled>("ag.device_stalled");
  cfg.add_error_category(ag_error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string s = "ag: ";
    s += ag::to_string(static_cast<ag::errc>(code));
    if (ctx.match_elements<std::string>() || ctx.match_elements<std::string, int32_t, int32_t, std::string>()) {
      s += ": ";
      s += ctx.get_as<std::string>(0);
    }
    return s;
  });
}

}  // namespace ag::msg
