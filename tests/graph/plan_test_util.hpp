#pragma once
// Helpers shared by the planner and memory-plan tests: build or compile, and
// record a test failure (with the error) instead of returning an error value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "graph/graph.hpp"
#include "graph/plan.hpp"

namespace ag {
// Test-only access to a plan's internals (declared a friend in plan.hpp), to
// plant faulty plans. One definition for every test file.
struct plan_test_hook {
  static std::vector<device_memory>& memory(plan& p) { return p.memory_; }
  static std::vector<step>& steps(plan& p) { return p.steps_; }
  static std::vector<elided_concat>& elided_concats(plan& p) { return p.elided_concats_; }
};
}  // namespace ag

namespace ag::test_util {

using ag::plan_test_hook;

// Largest |a - b| relative to max(1, |b|) over all outputs (i32 outputs count as 0:
// compare those exactly elsewhere); mismatched dims fail and return 1e30.
inline double max_rel_diff(const std::vector<host_tensor>& a, const std::vector<host_tensor>& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t o = 0; o < std::min(a.size(), b.size()); ++o) {
    EXPECT_EQ(a[o].dims(), b[o].dims()) << "output " << o;
    EXPECT_EQ(a[o].type(), b[o].type()) << "output " << o;
    if (a[o].dims() != b[o].dims()) return 1e30;
    for (int64_t i = 0; i < a[o].numel(); ++i) {
      const double x = a[o].type() == dtype::i32 ? 0 : a[o].at(i), y = b[o].type() == dtype::i32 ? 0 : b[o].at(i);
      worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(y)));
    }
  }
  return worst;
}

inline std::shared_ptr<const graph> finish(graph_builder&& b) {
  auto g = std::move(b).build();
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  if (!g) return nullptr;
  return std::make_shared<const graph>(std::move(*g));
}

inline std::shared_ptr<const plan> must_compile(std::shared_ptr<const graph> g, std::vector<device_spec> d,
                                                plan_options o = {}) {
  auto p = compile(std::move(g), std::move(d), o);
  EXPECT_TRUE(p.has_value()) << (p ? "" : p.err().to_string());
  return p ? *p : nullptr;
}

}  // namespace ag::test_util
