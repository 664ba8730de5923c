#include "graph/state_pool.hpp"

#include <algorithm>

namespace ag {

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
