// Tensor parallelism on CUDA with two logical devices of one GPU ("cuda:0,0",
// where NCCL cannot run): the backend's one-shot collectives (every dtype)
// and tensor-parallel transformers at degree 2 equal the CPU reference.
// The NCCL path: a one-rank communicator on one GPU (the code path: init,
// enqueue, the strided gather/slice copies), and, with two distinct GPUs,
// every collective and dtype against the reference.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "actors/actorgraph.hpp"
#include "gpu/collective_path.hpp"
#include "gpu/device.hpp"
#include "cuda/cuda_test_util.hpp"
#include "../graph/tp_random_graph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

/// `members` operands of `dims`, fresh random values: normal, or ints in
/// [0, int_max) for i32; seeds first_seed, first_seed + 1, ...
std::vector<host_tensor> random_operands(dtype t, int members, const shape& dims, uint64_t first_seed,
                                         int32_t int_max) {
  std::vector<host_tensor> in;
  for (int k = 0; k < members; ++k)
    in.push_back(t == dtype::i32 ? host_tensor::random_ints(dims, first_seed + static_cast<uint64_t>(k), int_max)
                                 : host_tensor::random_normal(t, dims, first_seed + static_cast<uint64_t>(k)));
  return in;
}

/// Every output of `got` equals `want`'s within `tol` (absolute and relative).
void expect_outputs_equal(const std::vector<host_tensor>& got, const std::vector<host_tensor>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto c = compare(got[i], want[i], tol, tol);
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

TEST(CudaCollectives, OneShotOnTwoLogicalDevicesOfOneGpuEqualsTheReferenceForEveryDtype) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0,0");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
    SCOPED_TRACE(to_string(t));
    auto g = test::user_collectives(t, 2, 5, 64);
    ASSERT_TRUE(g);
    auto p = (*rt)->compile(g);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    const std::vector<host_tensor> in = random_operands(t, 2, {5, 64}, 30, 1000);
    auto want = evaluate_reference(*g, in).value();
    const auto& got = (*rt)->submit(*p, in).wait();
    ASSERT_TRUE(got.has_value()) << got.err().to_string();
    // Sums of two values in f32 then rounded once: exact for i32, within
    // one rounding of the storage dtype otherwise.
    expect_outputs_equal(*got, want, t == dtype::f32 ? 1e-6 : t == dtype::i32 ? 0 : 1e-2);
  }
}

// Even with the NCCL crossover at 1 byte, two logical devices of one GPU
// run one-shot on the communication queue (in-stream collectives off), and
// the plan says so.
TEST(CudaCollectives, LogicalDevicesOfOneGpuRunOneShotWhateverTheCrossover) {
  AG_REQUIRE_GPU(1);
  runtime_options o;
  o.backend.cuda_nccl_min_bytes = 1;
  // The default; on, reduce-scatters and all-gathers would take the copy engines.
  o.backend.cuda_copy_engine_collectives = false;
  auto rt = runtime::create("cuda:0,0", o);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto g = test::user_collectives(dtype::f32, 2, 64, 1024);  // 256 KiB operands
  plan_options po;
  po.in_stream_collectives = in_stream_mode::off;  // the default already, on logical devices
  auto p = (*rt)->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  for (const auto& s : (*p)->steps())
    if (s.kind == step_kind::collective) { EXPECT_EQ(s.algo, collective_algo::one_shot); }
  std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {64, 1024}, 1),
                              host_tensor::random_normal(dtype::f32, {64, 1024}, 2)};
  auto want = evaluate_reference(*g, in).value();
  const auto& got = (*rt)->submit(*p, in).wait();
  ASSERT_TRUE(got.has_value()) << got.err().to_string();
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto c = compare((*got)[i], want[i], 1e-6, 1e-6);
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

// The copy-engine path (collective_algo::copy_engine): with the one-shot
// limit at 0 every reduce-scatter and all-gather pulls its peers' pieces
// with peer copies (a reduce-scatter then sums them with one kernel), and
// equals the reference for every dtype: 2 and 4 logical devices of GPU 0,
// and 2 distinct GPUs when there are two; slices whose rows are a multiple
// of 16 bytes (the vectorised sum) and uneven ones that are not (the
// scalar sum). All-reduces keep their path.
TEST(CudaCollectives, CopyEnginePathEqualsTheReferenceForEveryDtypeAndShare) {
  AG_REQUIRE_GPU(1);
  std::vector<std::string> specs{"cuda:0,0", "cuda:0,0,0,0"};
  if (gpu::cuda::device_count() >= 2) specs.push_back("cuda:0,1");
  else std::printf("[  NOTE    ] one GPU: the copy-engine path on distinct GPUs is not run here\n");
  runtime_options o;
  o.backend.cuda_nccl_min_bytes = 1;
  o.backend.cuda_nccl_min_bytes_wide = 1;
  o.backend.cuda_copy_engine_collectives = true;
  for (const std::string& spec : specs) {
    auto rt = runtime::create(spec, o);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    const int n = static_cast<int>((*rt)->devices().size());
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
      for (bool uneven : {false, true}) {
        SCOPED_TRACE(spec + " " + to_string(t) + (uneven ? " uneven" : " even"));
        const int64_t rows = 7, cols = 64 * n;
        std::vector<int64_t> parts;
        if (uneven) {  // 61 + 67 (+ 64 + 64): odd widths, unaligned starts
          parts.assign(static_cast<std::size_t>(n), 64);
          parts[0] = 61;
          parts[1] = 67;
        }
        auto g = test::user_collectives(t, n, rows, cols, parts);
        ASSERT_TRUE(g);
        auto p = (*rt)->compile(g);
        ASSERT_TRUE(p.has_value()) << p.err().to_string();
        int copy_engine = 0;
        for (const auto& st : (*p)->steps()) {
          if (st.kind != step_kind::collective) continue;
          const op_kind op = (*p)->source().at(st.ops[0]).op;
          if (op == op_kind::all_reduce) EXPECT_NE(st.algo, collective_algo::copy_engine);
          else EXPECT_EQ(st.algo, collective_algo::copy_engine) << to_string(op);
          copy_engine += st.algo == collective_algo::copy_engine;
        }
        EXPECT_EQ(copy_engine, 2 * n);
        const std::vector<host_tensor> in = random_operands(t, n, {rows, cols}, 40, 1000);
        auto want = evaluate_reference(*g, in).value();
        for (int rep = 0; rep < 2; ++rep) {  // the second job reuses the stream-ordered scratch
          const auto& got = (*rt)->submit(*p, in).wait();
          ASSERT_TRUE(got.has_value()) << got.err().to_string();
          // Sums in f32 rounded once (as the one-shot): exact for i32.
          expect_outputs_equal(*got, want, t == dtype::f32 ? 1e-6 : t == dtype::i32 ? 0 : 1e-2);
        }
      }
    }
  }
}

// A one-rank NCCL communicator (ncclCommInitAll with one GPU) through the
// device interface: all_reduce of one rank is a copy, all_gather of one
// rank with rows (the scratch + 2D copy path) too, reduce_scatter its slice.
TEST(CudaCollectives, NcclOneRankCommunicatorRunsEveryCollective) {
  AG_REQUIRE_GPU(1);
  if (!gpu::nccl_built()) GTEST_SKIP() << "this build has no NCCL (ACTORGRAPH_HAVE_NCCL unset)";
  gpu::backend_options o;
  o.cuda_nccl_min_bytes = 1;
  auto devs = gpu::make_devices("cuda:0", o);
  ASSERT_TRUE(devs.has_value()) << devs.err().to_string();
  gpu::device& d = *devs->front();
  gpu::device* members[] = {&d};
  ASSERT_FALSE(d.prepare_collective_group({members[0]}));
  auto s = d.create_stream(step_kind::collective);
  ASSERT_TRUE(s.has_value()) << s.err().to_string();
  auto g = test::user_collectives(dtype::f32, 1, 6, 40);  // sum0, scatter0, gather0
  ASSERT_TRUE(g);
  const shape dims{6, 40};
  const int64_t bytes = dims.numel() * 4;
  host_tensor x = host_tensor::random_normal(dtype::f32, dims, 17);
  void* in = d.allocate(bytes).value();
  ASSERT_FALSE(d.upload(in, x.data(), bytes));
  auto want = evaluate_reference(*g, {x}).value();
  for (std::size_t k = 0; k < g->outputs().size(); ++k) {
    const node& n = g->at(g->outputs()[k]);
    SCOPED_TRACE(n.name);
    const auto path = gpu::choose_cuda_collective_path(n.op, bytes, {0}, {dims.numel()}, 1, true);
    EXPECT_EQ(path.path, gpu::collective_path::nccl) << path.reason;
    void* out = d.allocate(n.dims.numel() * 4).value();
    gpu::collective_launch l;
    l.op = &n;
    l.rank = 0;
    l.algo = collective_algo::ring;
    l.bytes = bytes;
    l.out = {out, dtype::f32, n.dims, contiguous_strides(n.dims)};
    l.inputs = {{in, dtype::f32, dims, contiguous_strides(dims)}};
    l.members = {&d};
    ASSERT_FALSE(d.collective(**s, l));
    ASSERT_FALSE(d.synchronize(**s));
    host_tensor got = host_tensor::uninitialized(dtype::f32, n.dims);
    ASSERT_FALSE(d.download(got.data(), out, n.dims.numel() * 4));
    auto c = compare(got, want[k], 0, 0);  // one rank: copies, exact
    EXPECT_TRUE(c.ok) << c.message;
    d.deallocate(out);
  }
  d.deallocate(in);
}

// A void part (collective_launch::void_part: the part of a cancelled or
// failed job that keeps NCCL's order) makes the NCCL call its real part
// would make, in place on scratch: on `n` ranks (one GPU each; 1 runs the
// one-rank communicator), rank 0 issues the real part of every collective
// (sum0, scatter0, gather0) and the others void ones, which pair with it
// and leave their results' memory as it was; then every rank's real part of
// the next job pairs as ever and equals the reference.
void nccl_void_parts_keep_the_order(int n) {
  gpu::backend_options o;
  o.cuda_nccl_min_bytes = 1;
  o.cuda_nccl_min_bytes_wide = 1;
  std::string spec = "cuda:0";
  for (int k = 1; k < n; ++k) spec += "," + std::to_string(k);
  auto devs = gpu::make_devices(spec, o);
  ASSERT_TRUE(devs.has_value()) << devs.err().to_string();
  std::vector<gpu::device*> members;
  for (auto& d : *devs) members.push_back(d.get());
  ASSERT_FALSE(members[0]->prepare_collective_group(members));
  auto g = test::user_collectives(dtype::f32, n, 6, 40 * n);
  ASSERT_TRUE(g);
  const shape dims{6, 40 * n};
  const int64_t bytes = dims.numel() * 4;
  std::vector<std::unique_ptr<gpu::stream>> streams;
  std::vector<void*> in;
  const std::vector<host_tensor> x = random_operands(dtype::f32, n, dims, 23, 0);
  for (int k = 0; k < n; ++k) {
    gpu::device& d = *members[static_cast<std::size_t>(k)];
    streams.push_back(d.create_stream(step_kind::collective).value());
    in.push_back(d.allocate(bytes).value());
    ASSERT_FALSE(d.upload(in.back(), x[static_cast<std::size_t>(k)].data(), bytes));
  }
  auto want = evaluate_reference(*g, x).value();
  for (std::size_t o_k = 0; o_k < g->outputs().size(); ++o_k) {
    const node& first = g->at(g->outputs()[o_k]);
    const std::string base = first.name.substr(0, first.name.size() - 1);  // "sum", "scatter", "gather"
    if (first.name.back() != '0') continue;  // one pass per collective, from rank 0's output
    SCOPED_TRACE(base);
    std::vector<const node*> part(static_cast<std::size_t>(n));
    std::vector<std::size_t> out_index(static_cast<std::size_t>(n));
    for (std::size_t j = 0; j < g->outputs().size(); ++j)
      for (int k = 0; k < n; ++k)
        if (g->at(g->outputs()[j]).name == base + std::to_string(k)) {
          part[static_cast<std::size_t>(k)] = &g->at(g->outputs()[j]);
          out_index[static_cast<std::size_t>(k)] = j;
        }
    std::vector<void*> out;
    std::vector<host_tensor> sentinel;
    for (int k = 0; k < n; ++k) {
      const node& nk = *part[static_cast<std::size_t>(k)];
      ASSERT_NE(&nk, nullptr);
      out.push_back(members[static_cast<std::size_t>(k)]->allocate(nk.dims.numel() * 4).value());
      sentinel.push_back(host_tensor::random_normal(dtype::f32, nk.dims, 90 + static_cast<uint64_t>(k)));
      ASSERT_FALSE(members[static_cast<std::size_t>(k)]->upload(out.back(), sentinel.back().data(), nk.dims.numel() * 4));
    }
    const auto issue = [&](int k, bool void_part) {
      const node& nk = *part[static_cast<std::size_t>(k)];
      gpu::collective_launch l;
      l.op = &nk;
      l.rank = k;
      l.algo = collective_algo::ring;
      l.bytes = bytes;
      l.void_part = void_part;
      l.out = {out[static_cast<std::size_t>(k)], dtype::f32, nk.dims, contiguous_strides(nk.dims)};
      for (int j = 0; j < n; ++j) l.inputs.push_back({in[static_cast<std::size_t>(j)], dtype::f32, dims, contiguous_strides(dims)});
      l.members = members;
      return members[static_cast<std::size_t>(k)]->collective(*streams[static_cast<std::size_t>(k)], l);
    };
    // The cancelled job: rank 0's real part, the others' void ones.
    ASSERT_FALSE(issue(0, false));
    for (int k = 1; k < n; ++k) ASSERT_FALSE(issue(k, true));
    if (n == 1) ASSERT_FALSE(issue(0, true));  // one rank: a void part after the real one
    for (int k = 0; k < n; ++k) ASSERT_FALSE(members[static_cast<std::size_t>(k)]->synchronize(*streams[static_cast<std::size_t>(k)]));
    const int first_void = n == 1 ? 0 : 1;
    for (int k = first_void; k < n; ++k) {
      const node& nk = *part[static_cast<std::size_t>(k)];
      host_tensor got = host_tensor::uninitialized(dtype::f32, nk.dims);
      ASSERT_FALSE(members[static_cast<std::size_t>(k)]->download(got.data(), out[static_cast<std::size_t>(k)], nk.dims.numel() * 4));
      if (n > 1) {
        auto c = compare(got, sentinel[static_cast<std::size_t>(k)], 0, 0);
        EXPECT_TRUE(c.ok) << "rank " << k << "'s void part wrote its result: " << c.message;
      } else {
        auto c = compare(got, want[out_index[0]], 0, 0);  // the real part's result, left alone
        EXPECT_TRUE(c.ok) << "the void part wrote over the real part's result: " << c.message;
      }
    }
    // The next job: every rank's real part pairs as ever.
    for (int k = 0; k < n; ++k) ASSERT_FALSE(issue(k, false));
    for (int k = 0; k < n; ++k) {
      gpu::device& d = *members[static_cast<std::size_t>(k)];
      ASSERT_FALSE(d.synchronize(*streams[static_cast<std::size_t>(k)]));
      const node& nk = *part[static_cast<std::size_t>(k)];
      host_tensor got = host_tensor::uninitialized(dtype::f32, nk.dims);
      ASSERT_FALSE(d.download(got.data(), out[static_cast<std::size_t>(k)], nk.dims.numel() * 4));
      auto c = compare(got, want[out_index[static_cast<std::size_t>(k)]], 1e-5, 1e-5);
      EXPECT_TRUE(c.ok) << "rank " << k << " after the void parts: " << c.message;
      d.deallocate(out[static_cast<std::size_t>(k)]);
    }
  }
  for (int k = 0; k < n; ++k) members[static_cast<std::size_t>(k)]->deallocate(in[static_cast<std::size_t>(k)]);
}

TEST(CudaCollectives, NcclVoidPartsOfOneRankTouchNoMemory) {
  AG_REQUIRE_GPU(1);
  if (!gpu::nccl_built()) GTEST_SKIP() << "this build has no NCCL (ACTORGRAPH_HAVE_NCCL unset)";
  nccl_void_parts_keep_the_order(1);
}

TEST(CudaCollectives, OnTwoGpusNcclVoidPartsPairWithTheRealPartsAndKeepTheOrder) {
  AG_REQUIRE_GPU(2);
  if (!gpu::nccl_built()) GTEST_SKIP() << "this build has no NCCL (ACTORGRAPH_HAVE_NCCL unset)";
  nccl_void_parts_keep_the_order(2);
}

// With two distinct GPUs and the crossover at 1 byte, every collective runs
// through NCCL (the plan says ring for each) and equals the reference within
// the dtype's tolerance (NCCL sums in the dtype); i32 exact.
TEST(CudaCollectives, NcclOnTwoGpusEqualsTheReferenceForEveryDtype) {
  AG_REQUIRE_GPU(2);
  if (!gpu::nccl_built()) GTEST_SKIP() << "this build has no NCCL (ACTORGRAPH_HAVE_NCCL unset)";
  runtime_options o;
  o.backend.cuda_nccl_min_bytes = 1;
  o.backend.cuda_copy_engine_collectives = false;  // NCCL for every op
  auto rt = runtime::create("cuda:0,1", o);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
    SCOPED_TRACE(to_string(t));
    auto g = test::user_collectives(t, 2, 5, 64);
    ASSERT_TRUE(g);
    plan_options po;
    po.in_stream_collectives = in_stream_mode::off;  // on by default: the small all-reduces would run in-stream
    auto p = (*rt)->compile(g, po);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    for (const auto& s : (*p)->steps())
      if (s.kind == step_kind::collective) { EXPECT_EQ(s.algo, collective_algo::ring); }
    const std::vector<host_tensor> in = random_operands(t, 2, {5, 64}, 80, 100000);
    auto want = evaluate_reference(*g, in).value();
    const auto& got = (*rt)->submit(*p, in).wait();
    ASSERT_TRUE(got.has_value()) << got.err().to_string();
    // Two summands: one rounding of the dtype at the sum's magnitude.
    expect_outputs_equal(*got, want, t == dtype::f32 ? 1e-6 : t == dtype::f16 ? 4e-3 : t == dtype::bf16 ? 3e-2 : 0);
  }
}

// Degree 2 on two logical devices of GPU 0, four ways: the defaults (the
// tiny activations stay under the one-shot limit: all-reduces); the
// one-shot limit at 0 and no minimum for sequence parallelism, so auto mode
// plans it with reduce-scatters and all-gathers on the copy engines; the
// same with the copy engines off (no sequence parallelism: all-reduces
// again); and the one-shot limit at 0 with the default minimum
// (backend_options::cuda_sequence_parallel_min_bytes, 16 MiB at width
// 4096: the 4 KiB activations keep their all-reduces).
TEST(CudaCollectives, TensorParallelTransformersOnTwoLogicalDevicesEqualTheReference) {
  AG_REQUIRE_GPU(1);
  for (int mode = 0; mode < 4; ++mode) {
    runtime_options ro;
    if (mode > 0) ro.backend.cuda_nccl_min_bytes = 1;
    ro.backend.cuda_copy_engine_collectives = mode != 2;
    if (mode == 1) ro.backend.cuda_sequence_parallel_min_bytes = 0;
    auto rt = runtime::create("cuda:0,0", ro);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    for (auto variant : {models::model_variant::gpt2, models::model_variant::llama}) {
      models::transformer_config cfg;
      cfg.variant = variant;
      cfg.n_layers = 2;
      cfg.d_model = 64;
      cfg.n_heads = 8;
      cfg.n_kv_heads = variant == models::model_variant::llama ? 2 : 0;
      cfg.vocab = 101;
      cfg.seq_len = 16;
      cfg.batch = 2;
      SCOPED_TRACE(std::string(models::to_string(variant)) + " mode " + std::to_string(mode));
      auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
      plan_options o;
      o.tensor_parallel = 2;
      auto p = (*rt)->compile(g, o);
      ASSERT_TRUE(p.has_value()) << p.err().to_string();
      const int copy_engine = test::collective_steps(**p, collective_algo::copy_engine);
      EXPECT_GT(test::collective_steps(**p), 0);
      if (mode == 1)
        EXPECT_GT(copy_engine, 0) << "sequence parallelism on the copy engines";
      else
        EXPECT_EQ(copy_engine, 0);
      std::vector<job> jobs;
      std::vector<std::vector<host_tensor>> ins;
      for (int k = 0; k < 4; ++k) {
        ins.push_back(models::transformer_inputs(cfg, 70 + static_cast<uint64_t>(k)));
        jobs.push_back((*rt)->submit(*p, ins.back()));
      }
      for (int k = 0; k < 4; ++k) {
        const auto& r = jobs[static_cast<std::size_t>(k)].wait();
        ASSERT_TRUE(r.has_value()) << r.err().to_string();
        auto want = evaluate_reference(*g, ins[static_cast<std::size_t>(k)]).value();
        auto c = compare(r->front(), want.front(), 2e-4, 2e-3);
        EXPECT_TRUE(c.ok) << "job " << k << ": " << c.message;
      }
    }
  }
}

}  // namespace
}  // namespace ag
