#include "actors/job_registry.hpp"

#include <algorithm>

namespace ag::actors {

error job_registry::add(uint64_t id, caf::actor who, std::shared_ptr<const loaded_plan> lp) {
  std::lock_guard<std::mutex> lk(m_);
  for (int d : lp->program->used_devices())
    if (auto it = dead_.find(d); it != dead_.end()) return it->second;
  jobs_.insert_or_assign(id, entry{std::move(who), std::move(lp)});
  return {};
}

void job_registry::remove(uint64_t id) {
  std::lock_guard<std::mutex> lk(m_);
  jobs_.erase(id);
}

std::vector<job_registry::user> job_registry::mark_dead(int device, const error& why) {
  std::lock_guard<std::mutex> lk(m_);
  dead_.try_emplace(device, why);
  std::vector<user> r;
  for (const auto& [id, e] : jobs_) {
    const auto& used = e.lp->program->used_devices();
    if (std::find(used.begin(), used.end(), device) != used.end()) r.push_back({e.who, e.lp->key});
  }
  return r;
}

void job_registry::revive(int device) {
  std::lock_guard<std::mutex> lk(m_);
  dead_.erase(device);
}

bool job_registry::in_service(int device) {
  std::lock_guard<std::mutex> lk(m_);
  return dead_.find(device) == dead_.end();
}

std::size_t job_registry::size() {
  std::lock_guard<std::mutex> lk(m_);
  return jobs_.size();
}

}  // namespace ag::actors
