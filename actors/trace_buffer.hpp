#pragma once
/// \file trace_buffer.hpp
/// Where finished jobs leave their trace records until take_trace().
///
/// Ownership and threads: one per runtime_core; thread-safe (one mutex).
/// Pushed by the thread that completes a job (a backend thread on the fast
/// path, else the job actor), taken by the user's thread.
///
/// Bounded: a ring of the newest `capacity` records (runtime_options::
/// trace_max_records). When full, the oldest records are dropped and counted
/// (trace::dropped_records), so tracing left on in a long run costs a fixed
/// amount of memory (it grew by about 4 KB per job without bound: 1 GB after
/// 207k jobs).

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "actors/actorgraph.hpp"

namespace ag::actors {

class trace_buffer {
 public:
  explicit trace_buffer(int64_t capacity = 262144) : capacity_(capacity < 0 ? 0 : capacity) {}
  void push(std::vector<trace_record>&& recs);
  /// The records kept, oldest first, and how many were dropped since the
  /// last take(); both are cleared.
  std::vector<trace_record> take(uint64_t* dropped = nullptr);

 private:
  std::mutex m_;
  int64_t capacity_;
  std::deque<trace_record> recs_;
  uint64_t dropped_ = 0;
};

}  // namespace ag::actors
