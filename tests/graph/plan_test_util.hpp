#pragma once
// Helpers shared by the planner and memory-plan tests: build or compile, and
// record a test failure (with the error) instead of returning an error value.
#include <gtest/gtest.h>

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
};
}  // namespace ag

namespace ag::test_util {

using ag::plan_test_hook;

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
