#include "messages/caf_error.hpp"

#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace ag::msg {

caf::error to_caf(const ag::error& e) {
  if (e.ok()) return caf::error{};
  return caf::error{static_cast<uint8_t>(e.code), ag_error_category,
                    caf::make_message(e.message, static_cast<int32_t>(e.device), e.step, e.op)};
}

ag::error from_caf(const caf::error& e) {
  if (!e) return {};
  if (e.category() == ag_error_category) {
    ag::error r{static_cast<errc>(e.code()), {}};
    const auto& ctx = e.context();
    if (ctx.match_elements<std::string, int32_t, int32_t, std::string>()) {
      r.message = ctx.get_as<std::string>(0);
      r.device = ctx.get_as<int32_t>(1);
      r.step = ctx.get_as<int32_t>(2);
      r.op = ctx.get_as<std::string>(3);
    } else if (ctx.match_elements<std::string>()) {
      r.message = ctx.get_as<std::string>(0);
    }
    // A caf::error may come from another process (or bad bytes): never turn
    // it into "ok" or an unknown code, never into an error without a message.
    const uint8_t code = e.code();
    if (code == 0 || code > static_cast<uint8_t>(errc::internal)) {
      r.code = errc::internal;
      r.message = "unknown actorgraph error code " + std::to_string(code) +
                  (r.message.empty() ? std::string() : ": " + r.message);
    } else if (r.message.empty()) {
      r.message = std::string(to_string(static_cast<errc>(code))) + " (the error carried no message)";
    }
    return r;
  }
  if (e.category() == caf::atom("system") &&
      e.code() == static_cast<uint8_t>(caf::sec::request_timeout))
    return {errc::timeout, "CAF request timed out"};
  return {errc::internal, "CAF error " + caf::to_string(e.category()) + ":" +
                              std::to_string(static_cast<int>(e.code()))};
}

}  // namespace ag::msg
