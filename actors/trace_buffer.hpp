#pragma once
/// \file trace_buffer.hpp
/// Where finished jobs leave their trace records until take_trace().
///
/// Ownership and threads: one per runtime_core; thread-safe (one mutex).
/// Pushed by the thread that completes a job (a backend thread on the fast
/// path, else the job actor), taken by the user's thread.

#include <mutex>
#include <vector>

#include "actors/actorgraph.hpp"

namespace ag::actors {

class trace_buffer {
 public:
  void push(std::vector<trace_record>&& recs);
  std::vector<trace_record> take();

 private:
  std::mutex m_;
  std::vector<trace_record> recs_;
};

}  // namespace ag::actors
