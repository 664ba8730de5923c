#pragma once
/// \file atoms.hpp
/// Every atom the actors use, in one place (CAF 0.17: atom_constant, at most
/// 10 characters). Most messages are structs (messages.hpp); atoms only tag
/// payload-free requests. Names end in `_atom` and never reuse caf::'s own
/// (get_atom, ok_atom, ...), which would be ambiguous under `using namespace caf`.

#include <caf/atom.hpp>

namespace ag::msg {

/// job actor: the user asked to cancel.
using cancel_atom = caf::atom_constant<caf::atom("ag_cancel")>;
/// executing actor to itself (delayed): check its running steps for stalls.
using stall_atom = caf::atom_constant<caf::atom("ag_stall")>;
/// job actor: the state slot it waited for is its now (loaded_plan.hpp slot_table).
using slot_atom = caf::atom_constant<caf::atom("ag_slot")>;
/// any runtime actor: report internal counters (tests).
using stats_atom = caf::atom_constant<caf::atom("ag_stats")>;

}  // namespace ag::msg
