// A tour of the public API, quoted by the README and run by CTest
// (test `examples.api_tour`), so the README's code keeps compiling and working.
//
//   build/examples/actorgraph-api-tour [device-spec]     (default "sim:4")
#include <chrono>
#include <cstdio>
#include <future>
#include <vector>

#include "actors/actorgraph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

int main(int argc, char** argv) {
  const char* spec = argc > 1 ? argv[1] : "sim:4";

  // 1. A runtime over devices: simulated GPUs here ("cpu:2", "cuda:all" also work).
  ag::runtime_options opts;
  opts.backend.sim.time_scale = 1e-3;  // a simulated millisecond takes a microsecond
  auto rt = ag::runtime::create(spec, opts);
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", rt.err().to_string().c_str());
    return 1;
  }

  // 2. A graph: a small LLaMA-style transformer (any graph_builder graph works).
  ag::models::transformer_config cfg;
  cfg.variant = ag::models::model_variant::llama;
  cfg.n_layers = 8;
  auto g = ag::models::build_transformer(cfg);
  if (!g) {
    std::fprintf(stderr, "model: %s\n", g.err().to_string().c_str());
    return 1;
  }
  const ag::graph model = *g;  // kept for the reference check below

  // 3. Compile once: pipeline over every device, layers balanced by the cost model.
  auto plan = (*rt)->compile(model, ag::plan_options{});
  if (!plan) {
    std::fprintf(stderr, "compile: %s\n", plan.err().to_string().c_str());
    return 1;
  }
  std::printf("%s", (*plan)->describe().c_str());

  // 4. Submit 16 micro-batch jobs at once; handles come back immediately.
  std::vector<std::vector<ag::host_tensor>> inputs;
  for (uint64_t i = 0; i < 16; ++i) inputs.push_back(ag::models::transformer_inputs(cfg, 100 + i));
  std::vector<ag::job> jobs = (*rt)->submit_batch(*plan, inputs);
  jobs[0].then([](const ag::job_result& r) {  // when job 0 is ready: on a runtime thread (here if it already is)
    std::printf("first job %s\n", r ? "finished" : r.err().to_string().c_str());
  });
  // A continuation chained at submission (submit_options::on_done) runs on a
  // runtime thread however fast the job ends, never here.
  std::promise<bool> chained_done;
  ag::submit_options so;
  so.on_done = [&chained_done](const ag::job_result& r) { chained_done.set_value(r.has_value()); };
  (*rt)->submit(*plan, inputs[3], so);

  // 5. Wait, and check every result against the CPU reference evaluator.
  int bad = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const ag::job_result& r = jobs[i].wait();
    auto expect = ag::evaluate_reference(model, inputs[i]);
    if (!r || !expect) {
      std::printf("job %zu: %s\n", i, (!r ? r.err() : expect.err()).to_string().c_str());
      ++bad;
      continue;
    }
    auto cmp = ag::compare((*r)[0], (*expect)[0], 1e-3, 1e-3);
    if (!cmp.ok) {
      std::printf("job %zu: %s\n", i, cmp.message.c_str());
      ++bad;
    }
  }

  auto chained = chained_done.get_future();
  if (chained.wait_for(std::chrono::seconds(60)) != std::future_status::ready || !chained.get()) {
    std::printf("the job chained at submission: its on_done did not run, or its job failed\n");
    ++bad;
  }

  // A temporary handle's wait() returns the result by value; as the job's
  // last handle it moves the outputs out (no copy).
  ag::job_result mine = (*rt)->submit(*plan, inputs[0]).wait();
  if (!mine || !ag::compare((*mine)[0], (*jobs[0].wait())[0], 1e-5, 1e-5).ok) {
    std::printf("a job on a temporary handle: %s\n", mine ? "differs from the same job's first run" : mine.err().to_string().c_str());
    ++bad;
  }

  // 6. The trace of those jobs: per-device utilisation, Chrome trace JSON for Perfetto.
  ag::trace t = (*rt)->take_trace();
  for (int d = 0; d < static_cast<int>(t.device_names.size()); ++d)
    std::printf("%s busy %.0f%%\n", t.device_names[static_cast<std::size_t>(d)].c_str(), 100 * t.utilisation(d));
  std::printf("%zu jobs, %d wrong, %zu trace records\n", jobs.size(), bad, t.records.size());
  return bad == 0 ? 0 : 1;
}
