// The benchmark programs' trace helpers (apps/common/trace_spans.hpp): each
// job's span over all devices, and how far apart its devices started it.
#include <gtest/gtest.h>

#include "apps/common/trace_spans.hpp"

namespace {

ag::trace_record rec(uint64_t job, int device, int64_t enqueue, int64_t start, int64_t end) {
  ag::trace_record r;
  r.job = job;
  r.device = device;
  r.enqueue_ns = enqueue;
  r.start_ns = start;
  r.end_ns = end;
  return r;
}

// Job 1 on two devices: device 1 was enqueued 30 us and started 40 us after
// device 0; job 2 on one device; a record that did not run (end <= start)
// counts for neither.
ag::trace two_jobs() {
  ag::trace t;
  t.records = {rec(1, 0, 1'000, 5'000, 90'000),      rec(1, 0, 2'000, 90'000, 120'000),
               rec(1, 1, 31'000, 45'000, 100'000),   rec(1, 1, 40'000, 100'000, 130'000),
               rec(2, 0, 200'000, 210'000, 250'000), rec(2, 1, 150'000, 150'000, 150'000)};
  return t;
}

TEST(TraceSpans, AJobsSpanRunsFromItsFirstStartToItsLastEndOverAllDevices) {
  const auto spans = ag::apps::job_spans(two_jobs());
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans.at(1).first, 5'000);
  EXPECT_EQ(spans.at(1).second, 130'000);
  EXPECT_EQ(spans.at(2).first, 210'000);
  EXPECT_EQ(spans.at(2).second, 250'000);
}

TEST(TraceSpans, StartSkewIsTheLatestDevicesFirstStartMinusTheEarliests) {
  const auto skews = ag::apps::job_start_skews(two_jobs());
  ASSERT_EQ(skews.size(), 2u);
  EXPECT_EQ(skews.at(1).start, 40'000);    // 45'000 - 5'000
  EXPECT_EQ(skews.at(1).enqueue, 30'000);  // 31'000 - 1'000
  EXPECT_EQ(skews.at(2).start, 0);         // one device ran it
  EXPECT_EQ(skews.at(2).enqueue, 0);
}

}  // namespace
