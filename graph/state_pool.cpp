#include "graph/state_pool.hpp"

#include <algorithm>
#include <limits>

namespace ag {

namespace {

int64_t align_up(int64_t v) { return (v + state_alignment - 1) / state_alignment * state_alignment; }

}  // namespace

int64_t state_pool_plan::region_bytes(int device) const noexcept {
  if (device < 0 || static_cast<std::size_t>(device) >= slot_bytes.size()) return 0;
  return slot_bytes[static_cast<std::size_t>(device)] * slots;
}

expected<state_pool_plan> plan_state_pool(const std::vector<state_tensor_spec>& tensors,
                                          const std::vector<int64_t>& budget_bytes, int wanted_slots) {
  if (wanted_slots < 0)
    return error{errc::invalid_argument, "state pool: wanted_slots is " + std::to_string(wanted_slots) +
                                             " (0 takes as many slots as fit)"};
  for (std::size_t d = 0; d < budget_bytes.size(); ++d)
    if (budget_bytes[d] < 0)
      return error{errc::invalid_argument,
                   "state pool: device " + std::to_string(d) + " has a negative budget"}.concerning(
          static_cast<int>(d));
  state_pool_plan plan;
  int devices = static_cast<int>(budget_bytes.size());
  for (const state_tensor_spec& t : tensors) {
    if (t.device < 0)
      return error{errc::invalid_argument, "state pool: state tensor '" + t.name + "' has device index " +
                                               std::to_string(t.device)};
    devices = std::max(devices, t.device + 1);
  }
  plan.slot_bytes.assign(static_cast<std::size_t>(devices), 0);
  plan.offsets.reserve(tensors.size());
  for (const state_tensor_spec& t : tensors) {
    int64_t bytes = 0;
    int64_t& slot = plan.slot_bytes[static_cast<std::size_t>(t.device)];
    if (!checked_bytes(t.dims, static_cast<int64_t>(dtype_size(t.type)), bytes) ||
        bytes > std::numeric_limits<int64_t>::max() / 2 - slot)
      return error{errc::invalid_argument, "state pool: state tensor '" + t.name + "' of " +
                                               numel_string(t.dims) + " elements overflows a slot"}
          .concerning(t.device, -1, t.name);
    plan.offsets.push_back(slot);
    slot = align_up(slot + bytes);
  }
  // The slot count every device's budget allows (devices without state
  // do not bound it).
  int64_t fit = std::numeric_limits<int>::max();
  int bounding_device = -1;
  for (int d = 0; d < devices; ++d) {
    const int64_t per_slot = plan.slot_bytes[static_cast<std::size_t>(d)];
    if (per_slot == 0) continue;
    const int64_t budget = static_cast<std::size_t>(d) < budget_bytes.size() ? budget_bytes[static_cast<std::size_t>(d)] : 0;
    if (budget / per_slot < fit) {
      fit = budget / per_slot;
      bounding_device = d;
    }
  }
  if (bounding_device < 0) {  // no state at all: slots cost nothing
    plan.slots = wanted_slots;
    return plan;
  }
  const int64_t per_slot = plan.slot_bytes[static_cast<std::size_t>(bounding_device)];
  const int64_t budget = static_cast<std::size_t>(bounding_device) < budget_bytes.size()
                             ? budget_bytes[static_cast<std::size_t>(bounding_device)]
                             : 0;
  const int64_t needed = wanted_slots > 0 ? wanted_slots : 1;
  if (fit < needed)
    return error{errc::out_of_memory,
                 "state pool: device " + std::to_string(bounding_device) + " holds " + std::to_string(fit) +
                     " state slot(s) of " + std::to_string(per_slot) + " bytes in its budget of " +
                     std::to_string(budget) + " bytes; " + std::to_string(needed) + " wanted"}
        .concerning(bounding_device);
  plan.slots = wanted_slots > 0 ? wanted_slots : static_cast<int>(fit);
  return plan;
}

state_slots::state_slots(int count) : holder_(static_cast<std::size_t>(std::max(count, 0))) {}

int state_slots::in_use() const noexcept {
  return static_cast<int>(std::count_if(holder_.begin(), holder_.end(), [](const auto& h) { return h.has_value(); }));
}

std::optional<int> state_slots::slot_of(uint64_t ticket) const {
  for (std::size_t s = 0; s < holder_.size(); ++s)
    if (holder_[s] == ticket) return static_cast<int>(s);
  return std::nullopt;
}

expected<std::optional<int>> state_slots::acquire(uint64_t ticket, bool wait_when_full) {
  if (slot_of(ticket) || std::find(waiters_.begin(), waiters_.end(), ticket) != waiters_.end())
    return error{errc::invalid_argument,
                 "state slots: ticket " + std::to_string(ticket) + " already holds or waits for a slot"};
  // Waiters go first: a free slot with waiters only exists mid-release.
  if (waiters_.empty())
    for (std::size_t s = 0; s < holder_.size(); ++s)
      if (!holder_[s]) {
        holder_[s] = ticket;
        return std::optional<int>{static_cast<int>(s)};
      }
  if (!wait_when_full)
    return error{errc::out_of_memory, "state slots: all " + std::to_string(holder_.size()) +
                                          " slots are taken and the caller does not wait"};
  waiters_.push_back(ticket);
  return std::optional<int>{};
}

expected<std::optional<state_slots::grant>> state_slots::release(uint64_t ticket) {
  const std::optional<int> slot = slot_of(ticket);
  if (!slot)
    return error{errc::invalid_argument, "state slots: ticket " + std::to_string(ticket) + " holds no slot"};
  auto& h = holder_[static_cast<std::size_t>(*slot)];
  if (waiters_.empty()) {
    h.reset();
    return std::optional<grant>{};
  }
  const grant g{waiters_.front(), *slot};
  waiters_.pop_front();
  h = g.ticket;
  return std::optional<grant>{g};
}

bool state_slots::cancel_wait(uint64_t ticket) {
  const auto it = std::find(waiters_.begin(), waiters_.end(), ticket);
  if (it == waiters_.end()) return false;
  waiters_.erase(it);
  return true;
}

}  // namespace ag
