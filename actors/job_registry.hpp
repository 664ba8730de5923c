#pragma once
/// \file job_registry.hpp
/// The jobs in flight and the devices each one uses, so that a device fault
/// fails exactly the jobs on that device (runtime_actor.hpp).
///
/// Ownership and threads: one per runtime_core (shared with the runtime
/// actor); thread-safe behind one mutex. Job actors add and remove
/// themselves directly (two short critical sections per job instead of two
/// messages to the runtime actor); the runtime actor marks devices dead.

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>

#include "actors/loaded_plan.hpp"
#include "graph/error.hpp"

namespace ag::actors {

class job_registry {
 public:
  /// Registers job `id` (its actor `who`, its plan, whose used devices
  /// count). If one of them is dead already, registers nothing and returns
  /// that device's death error, which the job fails with.
  error add(uint64_t id, caf::actor who, std::shared_ptr<const loaded_plan> lp);
  void remove(uint64_t id);
  /// A registered job that uses a device being taken out of service.
  struct user {
    caf::actor who;
    uint64_t plan_key = 0;  ///< its loaded plan
  };
  /// Marks `device` out of service (dead or quarantined) with the error
  /// `why` (later add()s of jobs using it fail with it; the first mark
  /// stays until revive) and returns the registered jobs using it. Atomic
  /// with add(): a job registers either before (and is returned here) or
  /// after (and add() fails it).
  std::vector<user> mark_dead(int device, const error& why);
  /// `device` serves again (runtime::reset_device): add() accepts jobs using it.
  void revive(int device);
  /// False while `device` is marked out of service.
  bool in_service(int device);
  std::size_t size();

 private:
  struct entry {
    caf::actor who;
    std::shared_ptr<const loaded_plan> lp;  // shared, not copied: no allocation per job
  };
  std::mutex m_;
  std::unordered_map<uint64_t, entry> jobs_;
  std::unordered_map<int, error> dead_;  ///< device index -> its death error
};

}  // namespace ag::actors
