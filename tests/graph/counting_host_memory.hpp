#pragma once
/// \file counting_host_memory.hpp
/// A test host_memory_resource: heap memory, but every buffer it hands out is
/// tracked, so tests can assert where a host_tensor's bytes came from and that
/// each one was given back exactly once with its size.

#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "graph/host_tensor.hpp"

namespace ag::test {

class counting_host_memory final : public host_memory_resource {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = ::operator new(bytes, std::align_val_t{64});
    std::lock_guard<std::mutex> lk(m_);
    live_[p] = bytes;
    ++allocations_;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    std::lock_guard<std::mutex> lk(m_);
    auto it = live_.find(p);
    if (it == live_.end() || it->second != bytes) {
      ++bad_deallocations_;
      return;  // leak rather than free what we do not own
    }
    live_.erase(it);
    ::operator delete(p, std::align_val_t{64});
  }
  const char* name() const noexcept override { return "counting"; }

  bool owns(const void* p) {
    std::lock_guard<std::mutex> lk(m_);
    return live_.count(const_cast<void*>(p)) != 0;
  }
  std::size_t live() {
    std::lock_guard<std::mutex> lk(m_);
    return live_.size();
  }
  int allocations() {
    std::lock_guard<std::mutex> lk(m_);
    return allocations_;
  }
  int bad_deallocations() {
    std::lock_guard<std::mutex> lk(m_);
    return bad_deallocations_;
  }

 private:
  std::mutex m_;
  std::map<void*, std::size_t> live_;
  int allocations_ = 0;
  int bad_deallocations_ = 0;
};

}  // namespace ag::test
