# The public API: the headers `cmake --install` puts under
# <prefix>/include/actorgraph/ (paths from the repository root, kept as they
# are). actors/actorgraph.hpp and everything it includes, plus what a user
# builds graphs and checks results with (reference evaluator, transformer
# builder, the deterministic generator). Everything else (actor internals,
# messages/, backends, planner internals) is private.
# The test package.public_headers_closed checks that these headers include
# only each other (and system headers).
set(ACTORGRAPH_PUBLIC_HEADERS
  actors/actorgraph.hpp
  actors/generator.hpp
  gpu/device.hpp
  graph/cost_model.hpp
  graph/attention_mask.hpp
  graph/dtype.hpp
  graph/error.hpp
  graph/fusion.hpp
  graph/graph.hpp
  graph/host_tensor.hpp
  graph/models/transformer.hpp
  graph/plan.hpp
  graph/replay.hpp
  graph/random.hpp
  graph/reference.hpp
  graph/rope_frequencies.hpp
  graph/shape.hpp
  graph/step_kind.hpp
  graph/tensor_parallel.hpp
  graph/weight_source.hpp)
