// Fuzz target: the REPL's graph language (apps/repl/graph_expr.hpp), the text
// a user types after `graph` or keeps in a file for `graph @file`. Parses,
// builds the graph, and plans a valid one over two simulated device specs
// (the planner allocates nothing per tensor). Properties: no crash, no
// sanitizer report, every failure an error with a message, every plan passes
// check_hazards.
#include <cmath>
#include <string>

#include "apps/repl/graph_expr.hpp"
#include "fuzz_check.hpp"
#include "graph/host_tensor.hpp"
#include "graph/plan.hpp"

namespace {

// Weights get real (random) data: programs whose weights need more than
// 4 MiB are only parsed. Drawing the values is all a larger weight adds, and
// under the sanitizers it is slow: 20 MB of them took 1 s on the 2-core
// development machine and 11 s while it was busy, past the fuzzer's 10 s
// limit per input (session 78; the limit was 64 MiB, set for the fuzzer's
// 2 GiB of memory).
// (Impossible weights, e.g. "w=weight[2147483648,2147483648]", are built: a
// weight of 2^64 bytes used to wrap to 0 and be written past its end, a
// segfault of the REPL; now the builder refuses it. Seed: corpus/overflow_weight.)
constexpr double max_weight_bytes = 4.0 * (1 << 20);

double weight_bytes(const ag::repl::expr& e) {
  double total = 0;
  if (e.k == ag::repl::expr::kind::call && e.text == "weight" && e.has_dims) {
    double elements = 1;
    for (int64_t d : e.list) elements *= std::fabs(static_cast<double>(d));
    // A size this host cannot hold even at one byte an element is not
    // allocated (the builder refuses it); any other counts at 4 bytes an
    // element, the most a dtype takes. (Counting the exemption at 4 bytes
    // too let a 24 GB f16 weight through on a 23 GB host: the builder drew
    // it, past the fuzzer's 2 GiB.)
    if (elements <= static_cast<double>(ag::host_memory_bytes())) total += 4 * elements;
  }
  for (const auto& a : e.args) total += weight_bytes(a);
  for (const auto& kw : e.kwargs) total += weight_bytes(kw.second);
  return total;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto prog = ag::repl::parse_graph_expr(text);
  if (!prog) {
    ag::fuzz::check_error(prog.err(), "parse_graph_expr");
    return 0;
  }
  double weights = 0;
  for (const auto& st : *prog) weights += weight_bytes(st.value);
  if (!(weights <= max_weight_bytes)) return 0;
  auto g = ag::repl::build_graph_expr(*prog, text, 1);
  if (!g) {
    ag::fuzz::check_error(g.err(), "build_graph_expr");
    return 0;
  }
  FUZZ_CHECK(!g->outputs().empty(), "a built graph has outputs");
  (void)g->to_dot();
  ag::device_spec a, b;
  b.name = "sim1";
  b.ordinal = 1;
  auto p = ag::compile(std::make_shared<const ag::graph>(std::move(*g)), {a, b});
  if (!p) {
    ag::fuzz::check_error(p.err(), "compile");
    return 0;
  }
  const ag::error hz = ag::check_hazards(**p);
  FUZZ_CHECK(hz.ok(), "check_hazards: %s", hz.to_string().c_str());
  (void)(*p)->describe();
  ag::fuzz::reached("plan");
  return 0;
}
