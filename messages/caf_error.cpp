#include "messages/caf_error.hpp"

#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace ag::msg {

caf::error to_caf(const ag::error& e) {
  if (e.ok()) return caf::error{};
  return caf::error{static_cast<uint8_t>(e.code), ag_error_category, caf::make_message(e.message)};
}

ag::error from_caf(const caf::error& e) {
  if (!e) return {};
  if (e.category() == ag_error_category) {
    std::string text;
    const auto& ctx = e.context();
    if (ctx.match_elements<std::string>()) text = ctx.get_as<std::string>(0);
    return {static_cast<errc>(e.code()), std::move(text)};
  }
  if (e.category() == caf::atom("system") &&
      e.code() == static_cast<uint8_t>(caf::sec::request_timeout))
    return {errc::timeout, "CAF request timed out"};
  return {errc::internal, "CAF error " + caf::to_string(e.category()) + ":" +
                              std::to_string(static_cast<int>(e.code()))};
}

}  // namespace ag::msg
