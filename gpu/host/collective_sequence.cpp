#include "gpu/host/collective_sequence.hpp"

#include <cstdlib>

namespace ag::gpu::host {

collective_sequence& collective_sequence::instance() {
  static collective_sequence* registry = new collective_sequence();  // never destroyed: devices may outlive statics
  return *registry;
}

std::atomic<bool>& collective_sequence::checking() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("AG_CHECK_COLLECTIVE_ORDER");
    return v != nullptr && v[0] == '1';
  }()};
  return on;
}

uint64_t next_host_device_id() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

collective_sequence::ticket collective_sequence::issue(const std::vector<member>& members, int communicator,
                                                       int rank, identity id, std::string label) {
  std::lock_guard lk(mutex_);
  group& g = groups_[{members, communicator}];
  if (g.next.size() != members.size()) g.next.assign(members.size(), 0);
  const uint64_t at = g.next[static_cast<std::size_t>(rank)]++;
  auto [it, fresh] = g.open.try_emplace(at);
  position& p = it->second;
  ticket t{p.result, {}};
  if (fresh) {
    p.id = std::move(id);
    p.label = std::move(label);
  } else if (!(p.id == id)) {
    const std::string why = "collective order broken on communicator " + std::to_string(communicator) +
                            " of " + std::to_string(members.size()) + " members: position " + std::to_string(at) +
                            " is " + p.label + " on one member and " + label +
                            " (another collective) on another; NCCL would pair them";
    if (!p.result->broken.load(std::memory_order_relaxed)) {
      p.result->why = why;
      p.result->broken.store(true, std::memory_order_release);
    }
    t.found = error(errc::internal, why);
  }
  if (++p.seen == static_cast<int>(members.size())) {
    g.open.erase(it);  // every member holds the verdict through its ticket
    // No open position: every member is at the same position, which is the
    // state of a group not yet seen. Dropping it keeps the map to the groups
    // with a part waiting for a member.
    if (g.open.empty()) groups_.erase({members, communicator});
  }
  return t;
}

std::size_t collective_sequence::open_positions() {
  std::lock_guard lk(mutex_);
  std::size_t n = 0;
  for (const auto& [key, g] : groups_) n += g.open.size();
  return n;
}

}  // namespace ag::gpu::host
