// Stress: 2,000 jobs, 64 in flight, on 4 sim devices with random delays and
// jitter; every result checked against the reference, nothing lost or hung.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>

#include "actors/actorgraph.hpp"
#include "graph/reference.hpp"
#include "../graph/random_dag.hpp"

namespace {

using namespace std::chrono_literals;

TEST(Stress, TwoThousandJobsSixtyFourInFlightOnFourJitterySims) {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-3;  // simulated ms -> us: delays matter, the test stays fast
  o.backend.sim.jitter = 0.5;
  o.backend.sim.seed = 99;
  o.arenas_per_device = 16;         // fewer than in flight: back-pressure is exercised too
  o.trace = false;
  auto rt = ag::runtime::create("sim:4", o).value();

  auto g = ag::test::random_dag({.seed = 21, .ops = 16, .dims = {4, 8}});
  ASSERT_TRUE(g.has_value());
  ag::plan_options po;
  po.lanes_per_device = 2;
  po.min_branch_seconds = 0;
  auto p = rt->compile(*g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  EXPECT_GE((*p)->used_devices().size(), 2u) << (*p)->describe();

  // A few distinct input sets, each with its reference computed once.
  constexpr int sets = 8;
  std::vector<std::vector<ag::host_tensor>> ins;
  std::vector<std::vector<ag::host_tensor>> refs;
  for (int s = 0; s < sets; ++s) {
    std::vector<ag::host_tensor> in;
    uint64_t seed = 1000 + static_cast<uint64_t>(s) * 10;
    for (ag::node_id id : g->inputs()) in.push_back(ag::host_tensor::random_normal(ag::dtype::f32, g->at(id).dims, seed++));
    refs.push_back(ag::evaluate_reference(*g, in).value());
    ins.push_back(std::move(in));
  }

  constexpr int total = 2000, window = 64;
  std::deque<std::pair<ag::job, int>> flight;
  int submitted = 0, checked = 0, failures = 0;
  auto check_front = [&] {
    auto [j, s] = flight.front();
    flight.pop_front();
    ASSERT_TRUE(j.wait_for(60s)) << "job " << j.id() << " hung (watchdog)";
    const auto& r = j.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    for (std::size_t i = 0; i < r->size(); ++i) {
      auto c = ag::compare((*r)[i], refs[static_cast<std::size_t>(s)][i], 2e-4, 2e-3);
      if (!c.ok && ++failures < 5) ADD_FAILURE() << "job " << j.id() << " output " << i << ": " << c.message;
    }
    ++checked;
  };
  while (submitted < total) {
    while (static_cast<int>(flight.size()) < window && submitted < total) {
      const int s = submitted % sets;
      flight.emplace_back(rt->submit(*p, ins[static_cast<std::size_t>(s)]), s);
      ++submitted;
    }
    check_front();
    if (HasFatalFailure()) return;
  }
  while (!flight.empty()) {
    check_front();
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(checked, total);
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(rt->jobs_in_flight(), 0);
}

}  // namespace
