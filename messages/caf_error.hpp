#pragma once
/// \file caf_error.hpp
/// ag::errc as a CAF 0.17 error category ("ag"), so actors can fail requests
/// with a caf::error that still carries actorgraph's code and message, and
/// the conversions at that boundary. Register the category with
/// register_message_types() (registration.hpp) to get readable to_string().

#include <caf/error.hpp>
#include <caf/atom.hpp>

#include "graph/error.hpp"

namespace ag::msg {

/// The category atom of errors made from ag::errc.
constexpr caf::atom_value ag_error_category = caf::atom("ag");

/// ag::error -> caf::error (code in category "ag"; message, device, step and
/// op as context). An ok error gives an empty caf::error.
caf::error to_caf(const ag::error& e);

/// caf::error -> ag::error. Errors of category "ag" keep code, message and
/// fields (an unknown code becomes errc::internal naming it; a missing message
/// is replaced by one that says so);
/// CAF's own errors (e.g. a request timeout or a dead actor) become
/// errc::timeout / errc::internal with CAF's rendering as the message.
ag::error from_caf(const caf::error& e);

}  // namespace ag::msg
