#pragma once
/// \file state_pool.hpp
/// Planning and bookkeeping of *persistent state tensors*: device-resident
/// tensors that outlive a job (a KV cache per sequence is the first user),
/// held in per-device pools of fixed-size slots.
///
/// Status: a building block for issue 12 item 2 (device-resident KV cache).
/// Nothing in the runtime uses it yet; see docs/ARCHITECTURE.md "Generation"
/// for the intended wiring (the device actor owns each device's pool region,
/// a job names its slot, the plan's state operands resolve to
/// `region base + slot * slot_bytes + offset`, so a slot's addresses are the
/// same for every job of its sequence, which CUDA graph replay needs).
///
/// Pure data and functions: no threads, no CAF, no device memory. A
/// `state_slots` table is not thread-safe; its owner serialises the calls.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/shape.hpp"

namespace ag {

/// One state tensor of one slot (e.g. block 3's key cache shard on device 1):
/// its dtype and dims per slot, and the device index holding it.
struct state_tensor_spec {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  int device = 0;
};

/// Where the state tensors of a slot live. On device d, the pool is one
/// region of `slots * slot_bytes[d]` bytes; slot s of tensor t starts at
/// `s * slot_bytes[devices[t]] + offsets[t]` in that region. Every offset
/// and every slot size is a multiple of `state_alignment`.
struct state_pool_plan {
  int slots = 0;                       ///< slots in every device's pool
  std::vector<int64_t> slot_bytes;     ///< per device index: bytes of one slot (0: no state there)
  std::vector<int64_t> offsets;        ///< per tensor (input order): byte offset inside its slot
  /// Bytes of device d's pool region (slots * slot_bytes[d]).
  int64_t region_bytes(int device) const noexcept;
};

/// Alignment of every state tensor inside a slot (bytes).
inline constexpr int64_t state_alignment = 256;

/// Lays out one slot's state tensors per device and decides the slot count.
/// `budget_bytes[d]` bounds device d's pool region (devices beyond the
/// vector have no budget for state). `wanted_slots` > 0 asks for exactly that
/// many slots (error out_of_memory naming the device that cannot hold them);
/// 0 takes as many as every device's budget holds (error out_of_memory when
/// not even one fits). Errors: invalid_argument for a negative device index,
/// a negative budget or wanted_slots < 0, naming the tensor.
expected<state_pool_plan> plan_state_pool(const std::vector<state_tensor_spec>& tensors,
                                          const std::vector<int64_t>& budget_bytes,
                                          int wanted_slots);

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
