#pragma once
/// \file state_pool.hpp
/// Which holder has which state slot: the generator hands the slots of its
/// plans' state (plan_options::state_slots, one KV cache per sequence; the
/// memory planner lays the slots out, region::state) to sequences, and
/// queues sequences when every slot is taken.
///
/// Pure data: no threads, no CAF, no device memory. A `state_slots` table is
/// not thread-safe; its owner serialises the calls.

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "graph/error.hpp"

namespace ag {

/// Which slot each holder (a sequence, named by a caller-chosen ticket)
/// has, and who waits for one, FIFO. Slots are handed out lowest index
/// first, so a lightly loaded pool touches the same memory.
class state_slots {
 public:
  /// A pool of `count` slots (count >= 0), all free.
  explicit state_slots(int count);

  /// A slot for `ticket`: a free one at once; with none free, the ticket
  /// waits (returns nullopt; release() hands it one later) when
  /// `wait_when_full`, else error out_of_memory saying how many slots there
  /// are. Error invalid_argument when the ticket already holds or waits.
  expected<std::optional<int>> acquire(uint64_t ticket, bool wait_when_full);

  /// A slot handed to the oldest waiter by release().
  struct grant {
    uint64_t ticket = 0;
    int slot = -1;
  };

  /// Frees `ticket`'s slot. When a ticket waits, the slot goes to the
  /// oldest one at once and that grant is returned. Error invalid_argument
  /// when the ticket holds no slot.
  expected<std::optional<grant>> release(uint64_t ticket);

  /// Takes a waiting ticket out of the queue (a sequence cancelled before
  /// it got a slot). False when it was not waiting.
  bool cancel_wait(uint64_t ticket);

  /// The slot `ticket` holds, if any.
  std::optional<int> slot_of(uint64_t ticket) const;
  int count() const noexcept { return static_cast<int>(holder_.size()); }
  int in_use() const noexcept;
  int waiting() const noexcept { return static_cast<int>(waiters_.size()); }

 private:
  std::vector<std::optional<uint64_t>> holder_;  // per slot: its ticket
  std::deque<uint64_t> waiters_;
};

}  // namespace ag
