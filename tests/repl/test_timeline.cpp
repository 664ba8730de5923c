// The terminal timeline and utilisation views, on traces built by hand.
#include <gtest/gtest.h>

#include <sstream>

#include "apps/repl/timeline.hpp"

using namespace ag;
using namespace ag::repl;

namespace {

trace_record rec(uint64_t job, int dev, const char* lane, int64_t b, int64_t e) {
  trace_record r;
  r.job = job;
  r.device = dev;
  r.lane = lane;
  r.start_ns = b;
  r.end_ns = e;
  r.enqueue_ns = b;
  return r;
}

// A 2-stage pipeline of 3 jobs: stage 0 on dev 0 runs jobs back to back,
// stage 1 on dev 1 starts one slot later (the bubble).
trace pipeline() {
  trace t;
  t.device_names = {"sim0", "sim1"};
  const int64_t slot = 1'000'000;
  for (int j = 0; j < 3; ++j) {
    t.records.push_back(rec(10 + j, 0, "compute0", j * slot, (j + 1) * slot));
    t.records.push_back(rec(10 + j, 1, "peer", (j + 1) * slot - slot / 10, (j + 1) * slot));
    t.records.push_back(rec(10 + j, 1, "compute0", (j + 1) * slot, (j + 2) * slot));
  }
  return t;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

std::string row(const std::vector<std::string>& lines, const std::string& label) {
  for (const auto& l : lines)
    if (l.rfind(label, 0) == 0) {
      const auto a = l.find('|'), b = l.rfind('|');
      return l.substr(a + 1, b - a - 1);
    }
  return "<no row " + label + ">";
}

}  // namespace

TEST(ReplTimeline, DrawsOneRowPerLaneWithJobCharactersAndTheBubble) {
  timeline_options o;
  o.width = 40;  // 4 slots of 1 ms: 10 columns each
  const auto lines = lines_of(render_timeline(pipeline(), o));
  const std::string d0 = row(lines, "sim0 compute0"), d1 = row(lines, "sim1 compute0"), p1 = row(lines, "sim1 peer");
  ASSERT_EQ(d0.size(), 40u);
  ASSERT_EQ(d1.size(), 40u);
  EXPECT_EQ(d0, std::string(10, '0') + std::string(10, '1') + std::string(10, '2') + std::string(10, '.'));
  EXPECT_EQ(d1, std::string(10, '.') + std::string(10, '0') + std::string(10, '1') + std::string(10, '2'));
  // The short peer copies still get a cell each, just before stage 1 starts.
  EXPECT_EQ(p1[9], '0');
  EXPECT_EQ(p1[19], '1');
  EXPECT_EQ(p1[0], '.');
  // Rows in device order: sim0's compute row comes before sim1's rows, compute before copies.
  std::size_t i0 = 99, i1 = 99, ip = 99;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("sim0 compute0", 0) == 0) i0 = i;
    if (lines[i].rfind("sim1 compute0", 0) == 0) i1 = i;
    if (lines[i].rfind("sim1 peer", 0) == 0) ip = i;
  }
  EXPECT_LT(i0, i1);
  EXPECT_LT(i1, ip);
}

TEST(ReplTimeline, HasATimeAxisWithLabelsAndALegend) {
  timeline_options o;
  o.width = 40;
  const std::string s = render_timeline(pipeline(), o);
  EXPECT_NE(s.find("+----"), std::string::npos) << s;
  EXPECT_NE(s.find(" 0 "), std::string::npos) << s;  // the axis starts at 0
  EXPECT_NE(s.find("2ms"), std::string::npos) << s;
  EXPECT_NE(s.find("0=10 1=11 2=12"), std::string::npos) << s;
  EXPECT_NE(s.find("3 jobs"), std::string::npos) << s;
  EXPECT_NE(s.find("4ms"), std::string::npos) << s;  // the span in the header
}

TEST(ReplTimeline, EmptyTraceSaysSo) {
  trace t;
  EXPECT_NE(render_timeline(t).find("no trace records"), std::string::npos);
  EXPECT_NE(render_utilisation(t).find("no trace records"), std::string::npos);
}

TEST(ReplTimeline, JobCharactersCycle) {
  EXPECT_EQ(job_char(0), '0');
  EXPECT_EQ(job_char(10), 'a');
  EXPECT_EQ(job_char(36), 'A');
  EXPECT_EQ(job_char(62), '0');
}

TEST(ReplTimeline, UtilisationIsTheUnionOfComputeIntervalsOverTheSpan) {
  const trace t = pipeline();
  // Span 4 ms; each device computes 3 ms; copies only on sim1 (3 x 0.1 ms).
  EXPECT_NEAR(compute_utilisation(t, 0), 0.75, 1e-9);
  EXPECT_NEAR(compute_utilisation(t, 1), 0.75, 1e-9);
  trace overlap;
  overlap.device_names = {"sim0"};
  overlap.records = {rec(1, 0, "compute0", 0, 100), rec(2, 0, "compute1", 50, 150), rec(3, 0, "compute0", 300, 400)};
  EXPECT_NEAR(compute_utilisation(overlap, 0), 250.0 / 400.0, 1e-9);
  const std::string u = render_utilisation(t);
  EXPECT_NE(u.find("sim0 compute  75.0%"), std::string::npos) << u;
  EXPECT_NE(u.find("copies   7.5%"), std::string::npos) << u;
}
