#pragma once
// Helpers shared by the planner and memory-plan tests: build or compile, and
// record a test failure (with the error) instead of returning an error value.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "graph/graph.hpp"
#include "graph/plan.hpp"

namespace ag::test_util {

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
