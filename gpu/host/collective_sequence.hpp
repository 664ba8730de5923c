#pragma once
/// \file collective_sequence.hpp
/// NCCL's pairing rule, checked on the host backends (cpu and sim).
///
/// NCCL pairs the parts of a communicator by their position in each member's
/// issue order and by nothing else: a member that issues another collective
/// at position k, or skips one, pairs one job's part with another's (wrong
/// sums, or a hang on the GPUs that no host message breaks). The runtime
/// promises that order (gpu/device.hpp, collective_launch; actors/
/// collective_order.hpp). Host collectives meet by identity (the operands'
/// addresses and the job's cancellation flag), so a broken order would never
/// show on the machines without a GPU, where most of the tests run. This
/// registry makes it show: every host device's collective() reports its part
/// here at issue, and a part whose position another member filled with a
/// different collective fails at once (errc::internal, naming both), as does
/// the earlier part when it runs. Off by default (checking(), below).
///
/// A communicator is the members' devices in rank order, each with its reset
/// generation (a revived member stands for a new communicator, as the CUDA
/// backend makes new NCCL communicators then), and the part's
/// collective_launch::communicator. Positions every member filled are
/// dropped, and so is a group with none left open (its members are then all
/// at one position, as in a group not yet seen): the registry holds only
/// parts waiting for a member. A broken position shifts every later one, as
/// NCCL's pairing would. One lock, process-wide: each part takes it once at
/// issue.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "graph/error.hpp"

namespace ag::gpu::host {

class collective_sequence {
 public:
  /// One member of a communicator: a device's process-unique id and its
  /// reset generation.
  struct member {
    uint64_t device_id = 0;
    uint64_t epoch = 0;
    friend bool operator<(const member& a, const member& b) {
      return a.device_id != b.device_id ? a.device_id < b.device_id : a.epoch < b.epoch;
    }
  };
  /// What makes two members' parts the same collective: the job (its
  /// cancellation flag; null where a test drives the devices itself) and the
  /// operands, every member's in rank order (alike on every member).
  struct identity {
    const void* job = nullptr;
    std::vector<const void*> operands;
    friend bool operator==(const identity& a, const identity& b) {
      return a.job == b.job && a.operands == b.operands;
    }
  };
  /// Whether a position's parts paired up: `broken` set (release, once,
  /// after `why`) when a member's part there is another collective.
  struct verdict {
    std::atomic<bool> broken{false};
    std::string why;  ///< read only once `broken` reads true (acquire)
  };
  /// A part's ticket: `error` is the mismatch found at its issue, if any;
  /// `verdict` is its position's, which a later member's issue may still
  /// break (the part checks it when it runs).
  struct ticket {
    std::shared_ptr<const verdict> position;
    error found;
  };

  static collective_sequence& instance();

  /// Whether the host backends check the rule (and refuse a part whose
  /// member was revived since its job started): process-wide, off unless
  /// the environment sets AG_CHECK_COLLECTIVE_ORDER=1 or a test turns it
  /// on (the soaks and the tensor-parallel tests do). Off by default for
  /// its cost: one process-wide lock per part.
  static std::atomic<bool>& checking();

  /// Member `rank` of `members` (communicator `communicator`) issues the
  /// collective `id`, labelled `label` (for messages: the device and op).
  ticket issue(const std::vector<member>& members, int communicator, int rank, identity id, std::string label);

  /// Positions still waiting for a member (tests).
  std::size_t open_positions();

 private:
  struct position {
    identity id;
    std::string label;  // the first member's part
    int seen = 0;       // members that issued here
    std::shared_ptr<verdict> result = std::make_shared<verdict>();
  };
  struct group {
    std::vector<uint64_t> next;             // per rank: its next position
    std::map<uint64_t, position> open;      // positions not yet filled by every member
  };
  std::mutex mutex_;
  std::map<std::pair<std::vector<member>, int>, group> groups_;
};

/// A process-unique id for a host device (collective_sequence::member).
uint64_t next_host_device_id() noexcept;

}  // namespace ag::gpu::host
