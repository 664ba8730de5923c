// A user's program against the installed actorgraph (examples/consumer):
// a two-layer MLP pipelined over two devices, a few jobs, each result checked
// against the CPU reference evaluator. Exits 0 only if every job is right.
//
//   actorgraph-consumer [device-spec]     (default "sim:2")
#include <cstdio>
#include <vector>

#include "actors/actorgraph.hpp"
#include "graph/reference.hpp"

namespace {

/// y = rms_norm(gelu(x W1) W2): layer 0 and layer 1, so that the planner can
/// put one layer on each device.
ag::expected<ag::graph> build_mlp() {
  ag::graph_builder b;
  b.set_layer(0);
  auto x = b.input("x", ag::dtype::f32, {8, 64});
  auto w1 = b.weight("w1", ag::host_tensor::random_normal(ag::dtype::f32, {64, 128}, 1, 0.1f));
  auto h = b.gelu(b.matmul(x, w1, false, false, "up"), ag::gelu_mode::tanh, "act");
  b.set_layer(1);
  auto w2 = b.weight("w2", ag::host_tensor::random_normal(ag::dtype::f32, {128, 64}, 2, 0.1f));
  auto y = b.rms_norm(b.matmul(h, w2, false, false, "down"), ag::tensor(), 1e-6f, "norm");
  b.output(y);
  return std::move(b).build();
}

}  // namespace

int main(int argc, char** argv) {
  const char* spec = argc > 1 ? argv[1] : "sim:2";
  ag::runtime_options opts;
  opts.backend.sim.time_scale = 1e-3;  // simulated milliseconds take microseconds
  auto rt = ag::runtime::create(spec, opts);
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", rt.err().to_string().c_str());
    return 1;
  }
  auto model = build_mlp();
  if (!model) {
    std::fprintf(stderr, "graph: %s\n", model.err().to_string().c_str());
    return 1;
  }
  auto plan = (*rt)->compile(*model, ag::plan_options{});
  if (!plan) {
    std::fprintf(stderr, "compile: %s\n", plan.err().to_string().c_str());
    return 1;
  }
  std::printf("plan: %zu steps over %zu device(s)\n", (*plan)->steps().size(), (*plan)->used_devices().size());

  std::vector<std::vector<ag::host_tensor>> inputs;
  for (uint64_t i = 0; i < 4; ++i)
    inputs.push_back({ag::host_tensor::random_normal(ag::dtype::f32, {8, 64}, 100 + i, 1.0f)});
  std::vector<ag::job> jobs = (*rt)->submit_batch(*plan, inputs);

  int wrong = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const ag::job_result& r = jobs[i].wait();
    auto expect = ag::evaluate_reference(*model, inputs[i]);
    if (!r || !expect) {
      std::printf("job %zu: %s\n", i, (!r ? r.err() : expect.err()).to_string().c_str());
      ++wrong;
      continue;
    }
    auto cmp = ag::compare((*r)[0], (*expect)[0], 1e-4, 1e-4);
    if (!cmp.ok) {
      std::printf("job %zu: %s\n", i, cmp.message.c_str());
      ++wrong;
    }
  }
  std::printf("consumer: %zu jobs on %s, %d wrong\n", jobs.size(), spec, wrong);
  return wrong == 0 && !jobs.empty() ? 0 : 1;
}
