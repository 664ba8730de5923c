#pragma once
/// \file trace_spans.hpp
/// Per-job spans of a runtime trace, shared by the benchmark programs.

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>

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

}  // namespace ag::apps
