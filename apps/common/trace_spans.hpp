#pragma once
/// \file trace_spans.hpp
/// Per-job spans of a runtime trace, shared by the benchmark programs.

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "actors/actorgraph.hpp"

namespace ag::apps {

/// Each job's span in `t`: its first step's start and last step's end, over
/// all devices (records that do not end after they start are left out).
inline std::map<uint64_t, std::pair<int64_t, int64_t>> job_spans(const ag::trace& t) {
  std::map<uint64_t, std::pair<int64_t, int64_t>> span;
  for (const auto& r : t.records) {
    if (r.end_ns <= r.start_ns) continue;
    auto [it, fresh] = span.try_emplace(r.job, r.start_ns, r.end_ns);
    if (!fresh) {
      it->second.first = std::min(it->second.first, r.start_ns);
      it->second.second = std::max(it->second.second, r.end_ns);
    }
  }
  return span;
}

/// How far apart the devices began each job, in ns: per job, over the
/// devices with a record of it, the latest device's first start minus the
/// earliest's (`start`), and the same for the host's first enqueue on each
/// device (`enqueue`). A collective waits for its last member, so a device
/// that starts late lengthens the job's span by up to that much.
struct start_skew {
  int64_t start = 0;
  int64_t enqueue = 0;
};
inline std::map<uint64_t, start_skew> job_start_skews(const ag::trace& t) {
  struct firsts {
    int64_t start, enqueue;
  };
  std::map<uint64_t, std::map<int, firsts>> first;  // job -> device -> its first start and enqueue
  for (const auto& r : t.records) {
    if (r.end_ns <= r.start_ns) continue;
    auto [it, fresh] = first[r.job].try_emplace(r.device, firsts{r.start_ns, r.enqueue_ns});
    if (!fresh) {
      it->second.start = std::min(it->second.start, r.start_ns);
      it->second.enqueue = std::min(it->second.enqueue, r.enqueue_ns);
    }
  }
  std::map<uint64_t, start_skew> skew;
  for (const auto& [job, devices] : first) {
    int64_t s0 = INT64_MAX, s1 = INT64_MIN, e0 = INT64_MAX, e1 = INT64_MIN;
    for (const auto& [device, f] : devices) {
      s0 = std::min(s0, f.start), s1 = std::max(s1, f.start);
      e0 = std::min(e0, f.enqueue), e1 = std::max(e1, f.enqueue);
    }
    skew[job] = start_skew{s1 - s0, e1 - e0};
  }
  return skew;
}

}  // namespace ag::apps
