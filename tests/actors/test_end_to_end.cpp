// End-to-end runs through the public API (actorgraph.hpp), checked against
// the reference evaluator (graph/reference.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "actors/actorgraph.hpp"
#include "gpu/cpu/thread_team.hpp"
#include "gpu/host/host_device.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"
#include "graph/hidden_keys_attention.hpp"

namespace {

using namespace std::chrono_literals;

// f32 compute on different kernels (BLAS vs double accumulation): relative
// error of a few ulps per op, compounded over a handful of ops.
constexpr double atol = 1e-4, rtol = 1e-3;

ag::graph small_mlp(uint64_t seed) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 16});
  b.set_layer(0);
  auto w1 = b.weight("w1", ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, seed, 0.2f));
  auto h = b.gelu(b.matmul(x, w1, false, false, "fc1"), ag::gelu_mode::tanh, "act");
  b.set_layer(1);
  auto w2 = b.weight("w2", ag::host_tensor::random_normal(ag::dtype::f32, {32, 16}, seed + 1, 0.2f));
  auto y = b.add(b.matmul(h, w2, false, false, "fc2"), x, "resid");
  b.output(y);
  return std::move(b).build().value();
}

void expect_matches_reference(const ag::graph& g, const std::vector<ag::host_tensor>& in, const ag::job_result& r) {
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  auto ref = ag::evaluate_reference(g, in);
  ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
  ASSERT_EQ(r->size(), ref->size());
  for (std::size_t i = 0; i < ref->size(); ++i) {
    auto c = ag::compare((*r)[i], (*ref)[i], atol, rtol);
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

void run_mlp(const std::string& spec) {
  auto rt = ag::runtime::create(spec);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto g = small_mlp(3);
  auto p = (*rt)->compile(g);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {4, 16}, 11)};
  ag::job j = (*rt)->submit(*p, in);
  ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
  EXPECT_EQ(j.state(), ag::job_state::done);
  expect_matches_reference(g, in, j.wait());
}

TEST(EndToEnd, MlpOnCpu1) { run_mlp("cpu:1"); }
TEST(EndToEnd, MlpOnSim2) { run_mlp("sim:2"); }

}  // namespace

// backend_options::cpu_threads_per_stream reaches the cpu device's kernels:
// a decode-shaped job (one bf16 row through two weights of 2 MiB) on cpu:1
// with 3 threads a kernel starts the helper team and gives the same bits as
// one thread, and the reference's values.
TEST(EndToEnd, CpuKernelsOnSeveralThreadsGiveTheSameBitsAsOne) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::bf16, {1, 512});
  auto w1 = b.weight("w1", ag::host_tensor::random_normal(ag::dtype::bf16, {2048, 512}, 5, 0.05f));
  auto w2 = b.weight("w2", ag::host_tensor::random_normal(ag::dtype::bf16, {512, 2048}, 6, 0.05f));
  auto h = b.silu(b.matmul(x, w1, false, true, "up"), "act");
  b.output(b.matmul(h, w2, false, true, "down"));
  const ag::graph g = std::move(b).build().value();
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::bf16, {1, 512}, 7)};
  const int helpers_before = ag::gpu::cpu::team_helpers();
  std::vector<ag::host_tensor> outs;
  for (const int threads : {1, 3}) {
    ag::runtime_options o;
    o.backend.cpu_threads_per_stream = threads;
    auto rt = ag::runtime::create("cpu:1", o);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    auto p = (*rt)->compile(g);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    ag::job j = (*rt)->submit(*p, in);
    ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
    const ag::job_result& r = j.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    auto ref = ag::evaluate_reference(g, in);
    ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
    const auto c = ag::compare((*r)[0], (*ref)[0], 2e-2, 2e-2);  // bf16 output
    EXPECT_TRUE(c.ok) << threads << " threads: " << c.message;
    outs.push_back((*r)[0]);
  }
  ASSERT_EQ(outs[0].bytes(), outs[1].bytes());
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), static_cast<std::size_t>(outs[0].bytes())), 0)
      << "3 threads a kernel changed the bits";
  if (helpers_before < 2)
    EXPECT_GE(ag::gpu::cpu::team_helpers(), 2) << "the kernels ran without the helper team";
  else
    std::printf("[ note ] helpers started before this test (%d): whether it started them is not checked\n",
                helpers_before);
}

// A cpu device's job outputs of 1 MiB and more come from the process's
// cache of huge-page buffers (gpu::device::output_memory(),
// gpu/host/host_device.hpp): a job's output lives there and equals the
// reference, and once the first result is dropped the next job's output of
// the same size reuses its buffer instead of faulting in fresh pages (the
// cache hands small outputs to the heap; the 4 KiB one checks its values).
TEST(EndToEnd, CpuJobOutputsReuseCachedBuffers) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {1024, 256});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {256, 768}, 41, 0.1f));
  b.output(b.matmul(x, w, false, false, "big"));  // 1024 x 768 f32: 3 MiB
  b.output(b.scale(b.slice(x, 0, 0, 4), 2.0f, "small"));  // 4 x 256 f32: 4 KiB
  const ag::graph g = std::move(b).build().value();
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  ag::plan_options o;
  o.graph_replay = ag::graph_replay_mode::off;  // outputs copied out by their own steps, not through a replayed host window
  auto p = (*rt)->compile(g, o);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  ag::host_memory_resource* cache = &ag::gpu::host::host_output_memory();
  const bool huge_pages_on = ag::gpu::host::huge_pages_enabled();  // off: AG_CPU_HUGE_PAGES=0
  int64_t reuses_before = 0;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "first job" : "second job");
    const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {1024, 256}, 50 + round)};
    if (round == 1) reuses_before = ag::gpu::host::host_output_memory_stats().reuses;
    ag::job j = (*rt)->submit(*p, in);
    ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
    const ag::job_result& r = j.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    EXPECT_EQ((*r)[0].memory(), cache) << "the large output is not in the output cache";
    if (huge_pages_on) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*r)[0].data()) % (uintptr_t{2} << 20), 0u)
          << "the large output is not a mapping on huge pages";
    }
    auto ref = ag::evaluate_reference(g, in);
    ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
    for (int k = 0; k < 2; ++k) {
      const auto c = ag::compare((*r)[k], (*ref)[k], 1e-4, 1e-4);
      EXPECT_TRUE(c.ok) << "output " << k << ": " << c.message;
    }
  }  // each result, and with it its output buffer, is dropped before the next job
  EXPECT_GT(ag::gpu::host::host_output_memory_stats().reuses, reuses_before)
      << "the second job's output faulted in a fresh buffer";
}

// runtime::input_memory names where a caller best builds each input: for
// a cpu device the process's cache of huge-page buffers (its buffers faulted
// in once, then reused); null for an index out of range, a plan of another
// runtime and a sim device that computes no values. A job whose input was
// built there equals the reference, and the input's buffer goes back to the
// cache for the next one.
TEST(EndToEnd, InputMemoryNamesWhereEachInputIsBestBuilt) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {1024, 256});  // 1 MiB
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {256, 64}, 43, 0.1f));
  b.output(b.matmul(x, w, false, false, "y"));
  const ag::graph g = std::move(b).build().value();
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto p = (*rt)->compile(g);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  ag::host_memory_resource* memory = (*rt)->input_memory(*p, 0);
  EXPECT_EQ(memory, &ag::gpu::host::host_output_memory()) << "a cpu device's input is not built in the output cache";
  EXPECT_EQ((*rt)->input_memory(*p, 1), nullptr) << "an index out of range";

  ag::runtime_options timing;
  timing.backend.sim.compute_values = false;
  auto sim = ag::runtime::create("sim:1", timing);
  ASSERT_TRUE(sim.has_value()) << sim.err().to_string();
  EXPECT_EQ((*sim)->input_memory(*p, 0), nullptr) << "a plan of another runtime";
  auto sp = (*sim)->compile(g);
  ASSERT_TRUE(sp.has_value()) << sp.err().to_string();
  EXPECT_EQ((*sim)->input_memory(*sp, 0), nullptr) << "a sim device that computes no values needs no input memory";

  const ag::host_tensor values = ag::host_tensor::random_normal(ag::dtype::f32, {1024, 256}, 44, 1.0f);
  int64_t reuses_before = 0;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "first job" : "second job");
    if (round == 1) reuses_before = ag::gpu::host::host_output_memory_stats().reuses;
    ag::host_tensor in = ag::host_tensor::uninitialized(ag::dtype::f32, {1024, 256}, memory);
    EXPECT_EQ(in.memory(), memory);
    std::memcpy(in.data(), values.data(), static_cast<std::size_t>(values.bytes()));
    ag::job j = (*rt)->submit(*p, {std::move(in)});
    ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
    const ag::job_result& r = j.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    auto ref = ag::evaluate_reference(g, {values});
    ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
    const auto c = ag::compare((*r)[0], (*ref)[0], 1e-4, 1e-4);
    EXPECT_TRUE(c.ok) << c.message;
  }
  EXPECT_GT(ag::gpu::host::host_output_memory_stats().reuses, reuses_before)
      << "the second job's input did not reuse the first one's buffer";
}

// The cpu backend's fused attention (a prefill's chain scores -> [mask] ->
// softmax -> times v as one kernel, gpu/cpu/kernels.hpp): the plan fuses
// the chain, and the job equals the reference and the unfused ops, in
// f32, bf16 and f16, causal over as many keys as rows, causal with a cache
// (more keys than rows) plus an additive mask and several query heads'
// rows to one softmax view (GQA's packing), and neither causal nor masked;
// 1 and 3 threads a kernel give the same bits.
TEST(EndToEnd, CpuFusedAttentionEqualsTheReferenceOnAnyThreadCount) {
  struct cfg {
    const char* name;
    ag::dtype t;
    int64_t heads, rows, keys, dh, softmax_rows;
    bool causal, masked;
  };
  const cfg cases[] = {
      {"causal", ag::dtype::f32, 3, 40, 40, 32, 40, true, false},
      {"gqa cache mask", ag::dtype::bf16, 2, 48, 24, 64, 16, true, true},
      {"plain", ag::dtype::f16, 2, 20, 70, 16, 20, false, false},
      {"gqa cache mask f32", ag::dtype::f32, 2, 96, 80, 32, 32, true, true},
      {"large enough to split", ag::dtype::f32, 4, 256, 256, 64, 256, true, false},
  };
  uint64_t seed = 300;
  for (const cfg& c : cases) {
    SCOPED_TRACE(c.name);
    ag::graph_builder b;
    auto q = b.input("q", c.t, {1, c.heads, c.rows, c.dh});
    auto k = b.input("k", c.t, {1, c.heads, c.keys, c.dh});
    auto v = b.input("v", c.t, {1, c.heads, c.keys, c.dh});
    const int64_t group = c.rows / c.softmax_rows;
    auto scores = b.reshape(b.matmul(q, k, false, true, "qk"), {1, c.heads * group, c.softmax_rows, c.keys});
    std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(c.t, {1, c.heads, c.rows, c.dh}, seed++),
                                    ag::host_tensor::random_normal(c.t, {1, c.heads, c.keys, c.dh}, seed++),
                                    ag::host_tensor::random_normal(c.t, {1, c.heads, c.keys, c.dh}, seed++)};
    if (c.masked) {
      scores = b.add(scores, b.input("mask", c.t, {c.softmax_rows, c.keys}), "mask_add");
      in.push_back(ag::host_tensor::random_normal(c.t, {c.softmax_rows, c.keys}, seed++));
    }
    auto probs = b.reshape(b.softmax(scores, c.causal, 0.125f, "softmax"), {1, c.heads, c.rows, c.keys});
    b.output(b.matmul(probs, v, false, false, "pv"));
    const ag::graph g = std::move(b).build().value();
    auto ref = ag::evaluate_reference(g, in);
    ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
    const double tol = c.t == ag::dtype::f32 ? 1e-4 : 2e-2;
    std::vector<ag::host_tensor> outs;
    for (const int threads : {1, 3, 0}) {  // 0: 1 thread, the chain unfused
      ag::runtime_options o;
      o.backend.cpu_threads_per_stream = std::max(threads, 1);
      auto rt = ag::runtime::create("cpu:1", o);
      ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
      ag::plan_options po;
      po.fuse_ops = threads != 0;
      auto p = (*rt)->compile(g, po);
      ASSERT_TRUE(p.has_value()) << p.err().to_string();
      EXPECT_EQ((*p)->fusions().size(), threads != 0 ? 1u : 0u) << (*p)->describe();
      ag::job j = (*rt)->submit(*p, in);
      ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
      const ag::job_result& r = j.wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      const auto cmp = ag::compare((*r)[0], (*ref)[0], tol, tol);
      EXPECT_TRUE(cmp.ok) << threads << " threads: " << cmp.message;
      outs.push_back((*r)[0]);
    }
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), static_cast<std::size_t>(outs[0].bytes())), 0)
        << "3 threads a kernel changed the fused attention's bits";
    const auto fused_vs_unfused = ag::compare(outs[0], outs[2], tol, tol);
    EXPECT_TRUE(fused_vs_unfused.ok) << fused_vs_unfused.message;
  }
}

// The cpu backend's fused attention stops at the last key the mask leaves
// visible to some row of a block (a prefill chunk in a generator's cache
// longer than its sequence): the keys past it are NaN in k and v and never
// reach the output, which equals the reference on the same inputs with
// those rows finite. Chunks of 8 and 20 positions (4 query heads each:
// more rows than the cpu backend leaves to its few-row products), each
// position seeing one key more than the one before, or any number.
TEST(EndToEnd, CpuFusedAttentionReadsNoKeyPastTheLastItsMaskShows) {
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (const ag::dtype t : {ag::dtype::f32, ag::dtype::bf16})
    for (const std::vector<int64_t>& ends :
         {std::vector<int64_t>{300, 301, 302, 303, 304, 305, 306, 307},
          std::vector<int64_t>{300, 301, 350, 200, 9, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 1}}) {
      SCOPED_TRACE(std::string(ag::to_string(t)) + ", " + std::to_string(ends.size()) + " softmax rows");
      const auto c = ag::test::make_hidden_keys_attention(t, 2, 4 * static_cast<int64_t>(ends.size()), 1000, 64, 0,
                                                          ends, 900 + ends.size());
      ag::plan_options po;
      po.fuse_ops = true;
      auto p = (*rt)->compile(c.g, po);
      ASSERT_TRUE(p.has_value()) << p.err().to_string();
      ASSERT_EQ((*p)->fusions().size(), 1u) << (*p)->describe();
      auto ref = ag::evaluate_reference(c.g, c.clean);
      ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
      ASSERT_TRUE(ag::test::all_finite((*ref)[0])) << "the reference on finite rows";
      ag::job j = (*rt)->submit(*p, c.poisoned);
      ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
      const ag::job_result& r = j.wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      EXPECT_TRUE(ag::test::all_finite((*r)[0])) << "a hidden key's NaN reached the output";
      const double tol = t == ag::dtype::f32 ? 1e-4 : 2e-2;
      const auto cmp = ag::compare((*r)[0], (*ref)[0], tol, tol);
      EXPECT_TRUE(cmp.ok) << cmp.message;
    }
}
