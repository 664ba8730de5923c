// actorgraph-cuda-bench: kernel and completion benchmarks of the CUDA backend.
// Prints a table and `name: value` lines (docs/BENCHMARKS.md records them).
//   actorgraph-cuda-bench [--quick] [--decode-kernels [--decode-rows N]]   (--help)
// Uses only the device interface (gpu/device.hpp) plus the CUDA backend's
// entry points: apps include no CUDA header.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/flags.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/device.hpp"
#include "graph/graph.hpp"

namespace {

using namespace ag;

struct result {
  std::string name;
  double value;
  std::string unit;
};
std::vector<result> results;

void report(const std::string& name, double v, const std::string& unit) {
  results.push_back({name, v, unit});
  std::printf("%-44s %12.2f %s\n", name.c_str(), v, unit.c_str());
  std::fflush(stdout);
}

/// Device buffers for every non-view node of g, filled with a constant pattern.
struct bound_graph {
  gpu::device& d;
  const graph& g;
  std::vector<void*> bufs;
  bound_graph(gpu::device& dev, const graph& gr) : d(dev), g(gr), bufs(gr.size(), nullptr) {
    for (const node& n : g.nodes()) {
      if (n.is_view()) continue;
      auto p = d.allocate(std::max<int64_t>(n.own_bytes(), 4));
      if (!p) {
        std::fprintf(stderr, "%s\n", p.err().to_string().c_str());
        std::exit(1);
      }
      bufs[static_cast<std::size_t>(n.id)] = *p;
      if (is_leaf_op(n.op)) {
        host_tensor t = n.type == dtype::i32 ? host_tensor::random_ints(n.dims, 1, 1000)
                                             : host_tensor::random_normal(n.type, n.dims, 7);
        d.upload(*p, t.data(), static_cast<int64_t>(t.bytes()));
      }
    }
  }
  ~bound_graph() {
    for (void* p : bufs) d.deallocate(p);
  }
  gpu::tensor_arg arg(const node& n) const {
    gpu::tensor_arg a;
    a.data = static_cast<char*>(bufs[static_cast<std::size_t>(n.storage)]) + n.offset * static_cast<int64_t>(dtype_size(n.type));
    a.type = n.type;
    a.dims = n.dims;
    a.stride = n.stride;
    return a;
  }
  /// One launch record per compute node, in id order.
  std::vector<gpu::op_launch> launches() const {
    std::vector<gpu::op_launch> out;
    for (const node& n : g.nodes()) {
      if (is_leaf_op(n.op) || is_view_op(n.op)) continue;
      gpu::op_launch l;
      l.op = &n;
      l.out = arg(n);
      for (node_id in : n.inputs) l.inputs.push_back(arg(g.at(in)));
      out.push_back(std::move(l));
    }
    return out;
  }
  /// Enqueues every compute node once.
  void enqueue(gpu::stream& s) const {
    for (const gpu::op_launch& l : launches()) {
      if (error e = d.launch(s, l)) {
        std::fprintf(stderr, "%s\n", e.to_string().c_str());
        std::exit(1);
      }
    }
  }
};

template <class T>
T or_exit(expected<T> v) {
  if (!v) {
    std::fprintf(stderr, "%s\n", v.err().to_string().c_str());
    std::exit(1);
  }
  return std::move(*v);
}
void or_exit(const error& e) {
  if (e) {
    std::fprintf(stderr, "%s\n", e.to_string().c_str());
    std::exit(1);
  }
}

/// Microseconds per kernel of `ops` captured into one CUDA graph and replayed
/// (as a decode step's segments run: back to back, no host launch between
/// them); median over `iters` replays, over the number of launch records.
double us_per_replayed_launch(gpu::device& d, const std::vector<gpu::op_launch>& ops, int iters) {
  auto s = or_exit(d.create_stream(ag::step_kind::compute));
  for (const gpu::op_launch& l : ops) or_exit(d.launch(*s, l));  // a plain run first (cuBLAS workspace)
  or_exit(d.synchronize(*s));
  auto rg = or_exit(d.capture(*s, ops.data(), ops.size()));
  std::vector<double> t;
  for (int i = 0; i < iters + 2; ++i) {
    auto e0 = or_exit(d.create_event(true)), e1 = or_exit(d.create_event(true));
    or_exit(d.record(*e0, *s));
    or_exit(d.replay(*s, *rg));
    or_exit(d.record(*e1, *s));
    or_exit(d.synchronize(*s));
    if (i >= 2) t.push_back((e1->completion_ns() - e0->completion_ns()) * 1e-3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] / static_cast<double>(ops.size());
}

/// A decode step's kernels one by one (LLaMA-1B shape, bf16, batch 1, 576
/// cached keys), each as `copies` launches replayed in one graph, with
/// distinct weights where the step has them, so that they stream from memory
/// and not from L2 as they would in a step. `plain`: a device with
/// backend_options' defaults; `no_gemv`: the same GPU with cuda_gemv off.
/// `rows`: rows of x in the products and projection groups (1: a decode
/// step; more: a batched step's, generator_options::decode_batch; the
/// projection groups take up to 8, measured only then; the FMA GEMV takes
/// 8, more go to cuBLAS on `plain`, its tensor-core form 16); the figures' names carry
/// them when not 1. `mma` (rows >= 2, or null): the same GPU with the GEMV's
/// tensor-core form from 2 rows (backend_options::cuda_gemv_tensor_core_rows),
/// its figures labelled `mma` beside `gemv` (the FMA form) and `cublas`.
void bench_decode_kernels(const gpu::device_ptr& plain, const gpu::device_ptr& no_gemv, const gpu::device_ptr& mma,
                          int iters, int64_t rows) {
  std::vector<std::pair<gpu::device_ptr, const char*>> products{{plain, "gemv"}, {no_gemv, "cublas"}};
  if (mma) products.emplace_back(mma, "mma");
  const std::string at_rows = rows == 1 ? "" : "_rows" + std::to_string(rows);
  const dtype t = dtype::bf16;
  struct proj {
    const char* name;
    int64_t n, k;
  };
  for (const proj& pr : {proj{"q_o", 2048, 2048}, proj{"k_v", 512, 2048}, proj{"gate_up", 8192, 2048},
                         proj{"down", 2048, 8192}, proj{"head", 32000, 2048}}) {
    const double bytes = 2.0 * pr.n * pr.k;
    const int copies = static_cast<int>(std::clamp(512e6 / bytes, 4.0, 64.0));
    graph_builder b;
    auto x = b.input("x", t, {rows, pr.k});
    for (int i = 0; i < copies; ++i) b.output(b.matmul(x, b.input("w" + std::to_string(i), t, {pr.n, pr.k}), false, true));
    auto g = or_exit(std::move(b).build());
    for (const auto& [dev, label] : products) {
      bound_graph bg(*dev, g);
      const double us = us_per_replayed_launch(*dev, bg.launches(), iters);
      report(std::string("decode_") + pr.name + at_rows + "_" + label + "_us", us, "us");
      report(std::string("decode_") + pr.name + at_rows + "_" + label + "_gbps", bytes / (us * 1e-6) / 1e9, "GB/s");
    }
  }
  // Fused records (projection groups, fuse_projections; attention, fuse_ops)
  // against their ops one by one: `g` holds copies of a chain of `per` ops,
  // `fuse` makes the chain's one record from its `per` records.
  const auto fused_against_ops = [&](const char* name, const graph& g, std::size_t per,
                                     const std::function<gpu::op_launch(const gpu::op_launch*)>& fuse) {
    // Projection groups take at most 8 rows (the planner forms none with more).
    if (rows > 8 && std::string(name) != "attention") return;
    // The chain's records on `dev` fused (label: the figure's suffix), and,
    // on `plain`, the same records one by one.
    const auto measure = [&](const gpu::device_ptr& dev, const char* label) {
      bound_graph bg(*dev, g);
      const std::vector<gpu::op_launch> ops = bg.launches();
      if (dev == plain)
        report(std::string("decode_") + name + at_rows + "_" + std::to_string(per) + "_kernels_us",
               us_per_replayed_launch(*dev, ops, iters) * static_cast<double>(per), "us");
      std::vector<gpu::op_launch> fused;
      for (std::size_t i = 0; i + per <= ops.size(); i += per) fused.push_back(fuse(&ops[i]));
      report(std::string("decode_") + name + at_rows + label, us_per_replayed_launch(*dev, fused, iters), "us");
    };
    measure(plain, "_fused_us");
    if (mma && std::string(name) != "attention") measure(mma, "_fused_mma_us");  // the groups on the tensor cores
  };
  {
    graph_builder b;  // q, k, v of one x
    auto x = b.input("x", t, {rows, 2048});
    for (int i = 0; i < 16; ++i) {
      const std::string s = std::to_string(i);
      b.output(b.matmul(x, b.input("wq" + s, t, {2048, 2048}), false, true));
      b.output(b.matmul(x, b.input("wk" + s, t, {512, 2048}), false, true));
      b.output(b.matmul(x, b.input("wv" + s, t, {512, 2048}), false, true));
    }
    fused_against_ops("qkv", or_exit(std::move(b).build()), 3, [](const gpu::op_launch* r) {
      gpu::op_launch l = r[2];
      l.fused = gpu::op_launch::fusion::projections;
      l.projection = projection_kind::shared_input;
      l.out = r[0].out;
      l.extra_outs = {r[1].out, r[2].out};
      l.inputs = {r[0].inputs[0], r[0].inputs[1], r[1].inputs[1], r[2].inputs[1]};
      return l;
    });
  }
  {
    graph_builder b;  // gate, up, silu, mul
    auto x = b.input("x", t, {rows, 2048});
    for (int i = 0; i < 8; ++i) {
      const std::string s = std::to_string(i);
      auto gate = b.matmul(x, b.input("wg" + s, t, {8192, 2048}), false, true);
      auto up = b.matmul(x, b.input("wu" + s, t, {8192, 2048}), false, true);
      b.output(b.mul(b.silu(gate), up));
    }
    fused_against_ops("gated_mlp", or_exit(std::move(b).build()), 4, [](const gpu::op_launch* r) {
      gpu::op_launch l = r[3];
      l.fused = gpu::op_launch::fusion::projections;
      l.projection = projection_kind::gated;
      l.inputs = {r[0].inputs[0], r[0].inputs[1], r[1].inputs[1]};
      return l;
    });
  }
  const int copies = 16;
  {
    graph_builder b;  // attention of one layer: 8 kv heads x 4 query rows, 576 keys of 64, a mask
    for (int i = 0; i < copies; ++i) {
      const std::string n = std::to_string(i);
      auto q = b.input("q" + n, t, {1, 8, 4, 64});
      auto k = b.input("k" + n, t, {1, 8, 576, 64});
      auto v = b.input("v" + n, t, {1, 8, 576, 64});
      auto mask = b.input("mask" + n, t, {1, 576});
      auto scores = b.reshape(b.matmul(q, k, false, true), {1, 32, 1, 576});
      auto probs = b.reshape(b.softmax(b.add(scores, mask), false, 0.125f), {1, 8, 4, 576});
      b.output(b.matmul(probs, v));
    }
    fused_against_ops("attention", or_exit(std::move(b).build()), 4, [](const gpu::op_launch* r) {
      gpu::op_launch l = r[3];  // qk, add, softmax, pv: the pv matmul's output
      l.fused = gpu::op_launch::fusion::attention;
      l.inputs = {r[0].inputs[0], r[0].inputs[1], r[3].inputs[1], r[1].inputs[1]};
      l.attention.scale = 0.125f;
      l.attention.masked = true;
      l.attention.softmax_rows = 1;
      return l;
    });
  }
  // The small row ops of a step.
  struct small {
    const char* name;
    shape dims;
  };
  for (const small& sm : {small{"rms_norm", {1, 2048}}, small{"rope", {1, 1, 32, 64}}, small{"add", {1, 2048}},
                          small{"silu", {1, 8192}}}) {
    graph_builder sb;
    auto x = sb.input("x", t, sm.dims);
    auto w = sb.input("w", t, {sm.dims[-1]});
    auto pos = sb.input("pos", dtype::i32, {1});
    for (int i = 0; i < copies; ++i) {
      const std::string op = sm.name;
      sb.output(op == "rms_norm" ? sb.rms_norm(x, w, 1e-5f)
                : op == "rope"   ? sb.rope(x, pos, 10000.0f, rope_mode::neox)
                : op == "add"    ? sb.add(x, x)
                                 : sb.silu(x));
    }
    auto sg = or_exit(std::move(sb).build());
    bound_graph sbg(*plain, sg);
    report(std::string("decode_") + sm.name + "_us", us_per_replayed_launch(*plain, sbg.launches(), iters), "us");
  }
}

/// Median seconds per enqueue() of g over `iters` runs (GPU time from timing events).
double time_graph(gpu::device& d, const graph& g, int iters) {
  bound_graph bg(d, g);
  auto s = d.create_stream(ag::step_kind::compute).value();
  for (int i = 0; i < 3; ++i) bg.enqueue(*s);
  d.synchronize(*s);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto e0 = d.create_event(true).value(), e1 = d.create_event(true).value();
    d.record(*e0, *s);
    bg.enqueue(*s);
    d.record(*e1, *s);
    d.synchronize(*s);
    t.push_back((e1->completion_ns() - e0->completion_ns()) * 1e-9);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

graph one_op(dtype t, shape xs, const std::function<tensor(graph_builder&, tensor)>& f) {
  graph_builder b;
  auto x = b.input("x", t, xs);
  b.output(f(b, x));
  auto g = std::move(b).build();
  if (!g) {
    std::fprintf(stderr, "%s\n", g.err().to_string().c_str());
    std::exit(1);
  }
  return std::move(*g);
}

void bench_matmul(const gpu::device_ptr& d, const char* label, dtype t, int64_t n, int iters) {
  graph_builder b;
  auto x = b.input("a", t, {n, n});
  auto y = b.input("b", t, {n, n});
  b.output(b.matmul(x, y));
  auto g = std::move(b).build();
  const double s = time_graph(*d, *g, iters);
  report(std::string("matmul_") + std::to_string(n) + "_" + label + "_tflops", 2.0 * n * n * n / s / 1e12, "TFLOP/s");
}

void bench_rowop(const gpu::device_ptr& d, const char* op, dtype t, int64_t rows, int64_t cols, int iters) {
  graph g = one_op(t, {rows, cols}, [&](graph_builder& b, tensor x) {
    if (std::string(op) == "rms_norm") return b.rms_norm(x, tensor());
    if (std::string(op) == "softmax") return b.softmax(x, false, 1.0f);
    if (std::string(op) == "softmax_causal") return b.softmax(x, true, 0.125f);
    if (std::string(op) == "layer_norm") return b.layer_norm(x, tensor(), tensor());
    if (std::string(op) == "add") return b.add(x, x);
    return b.silu(x);
  });
  const double s = time_graph(*d, g, iters);
  const double bytes = 2.0 * rows * cols * static_cast<double>(dtype_size(t));  // read + write
  report(std::string(op) + "_" + std::to_string(rows) + "x" + std::to_string(cols) + "_" + to_string(t) + "_gbps",
         bytes / s / 1e9, "GB/s");
}

void bench_notify(const gpu::device_ptr& d, gpu::cuda::notify_mode mode, const char* label, int iters) {
  gpu::cuda::set_notify_mode(*d, mode);
  graph g = one_op(dtype::f32, {256}, [](graph_builder& b, tensor x) { return b.scale(x, 2.0f); });
  bound_graph bg(*d, g);
  auto s = d->create_stream(ag::step_kind::compute).value();
  std::vector<double> lat;
  for (int i = 0; i < iters + 50; ++i) {
    std::atomic<int64_t> done_at{0};
    const int64_t t0 = gpu::host_clock_ns();
    bg.enqueue(*s);
    d->notify(*s, [&](const error&) { done_at.store(gpu::host_clock_ns(), std::memory_order_release); });
    while (done_at.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    if (i >= 50) lat.push_back((done_at.load() - t0) * 1e-3);
  }
  std::sort(lat.begin(), lat.end());
  report(std::string("notify_roundtrip_") + label + "_median_us", lat[lat.size() / 2], "us");
  report(std::string("notify_roundtrip_") + label + "_p99_us", lat[lat.size() * 99 / 100], "us");
  gpu::cuda::set_notify_mode(*d, gpu::cuda::notify_mode::poller);
}

void bench_peer(const std::vector<gpu::device_ptr>& ds) {
  const int64_t bytes = 256ll << 20;
  auto a = ds[0]->allocate(bytes);
  auto b = ds[1]->allocate(bytes);
  if (!a || !b) return;
  auto s = ds[1]->create_stream(ag::step_kind::copy_peer).value();
  for (int i = 0; i < 3; ++i) ds[1]->copy_peer(*s, *b, *ds[0], *a, bytes);
  ds[1]->synchronize(*s);
  auto e0 = ds[1]->create_event(true).value(), e1 = ds[1]->create_event(true).value();
  const int iters = 20;
  ds[1]->record(*e0, *s);
  for (int i = 0; i < iters; ++i) ds[1]->copy_peer(*s, *b, *ds[0], *a, bytes);
  ds[1]->record(*e1, *s);
  ds[1]->synchronize(*s);
  const double sec = (e1->completion_ns() - e0->completion_ns()) * 1e-9;
  report("peer_copy_256MiB_gpu0_to_gpu1_gbps", iters * bytes / sec / 1e9, "GB/s");
  ds[0]->deallocate(*a);
  ds[1]->deallocate(*b);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  ag::apps::flags app("actorgraph-cuda-bench",
                                      "actorgraph-cuda-bench: kernel throughput and host-completion latency of the CUDA backend");
  app.add_flag("--quick", quick, "fewer iterations (a smoke run)");
  bool decode_only = false;
  app.add_flag("--decode-kernels", decode_only,
               "only a decode step's kernels, one by one (GEMV against cuBLAS, and from 2 rows its tensor-core form; "
               "attention fused or not)");
  int64_t decode_rows = 1;
  app.add_option("--decode-rows", decode_rows,
                 "rows of x in the decode kernels' products and projection groups (a batched step's, 1..16: the "
                 "projection groups take up to 8, the GEMV's tensor-core form 16, its FMA form 8)")
      ->check(CLI::Range(int64_t{1}, int64_t{16}));
  std::string pdl = "on";
  ag::apps::add_on_off(app, "--pdl", pdl, "backend_options::cuda_pdl of every device (on, off)");
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  const int n_gpus = gpu::cuda::device_count();
  if (n_gpus <= 0) {
    std::printf("no CUDA device: nothing to benchmark\n");
    return 0;
  }
  gpu::backend_options plain, tf32;
  plain.cuda_pdl = pdl == "on";
  // Few-row GEMVs on the FMA kernel: the decode kernels' `_gemv_` column (the
  // tensor-core form has a device of its own, `_mma_`).
  plain.cuda_gemv_tensor_core_rows = 0;
  tf32 = plain;
  tf32.cuda_tf32 = true;
  auto devs = gpu::cuda::make_cuda_devices({}, plain, 0);
  auto tdev = gpu::cuda::make_cuda_devices({0}, tf32, 0);
  if (!devs || !tdev) {
    std::fprintf(stderr, "%s\n", (!devs ? devs.err() : tdev.err()).to_string().c_str());
    return 1;
  }
  auto d = (*devs)[0];
  const auto& sp = d->spec();
  std::printf("device: %s, %d GPU(s), %.0f GiB, est. f32 %.1f / bf16 %.0f TFLOP/s, %.0f GB/s, %d copy engines\n",
              sp.name.c_str(), n_gpus, sp.mem_bytes / double(1ll << 30), sp.flops_f32 / 1e12, sp.flops_bf16 / 1e12,
              sp.mem_bandwidth / 1e9, sp.copy_engines);
  const int it = quick ? 3 : 10;
  {
    gpu::backend_options cublas_only = plain;
    cublas_only.cuda_gemv = false;
    auto ndev = gpu::cuda::make_cuda_devices({0}, cublas_only, 0);
    if (!ndev) {
      std::fprintf(stderr, "%s\n", ndev.err().to_string().c_str());
      return 1;
    }
    gpu::device_ptr mma_dev;
    if (decode_rows >= 2) {
      gpu::backend_options on_tensor_cores = plain;
      on_tensor_cores.cuda_gemv_tensor_core_rows = 2;
      auto mdev = gpu::cuda::make_cuda_devices({0}, on_tensor_cores, 0);
      if (!mdev) {
        std::fprintf(stderr, "%s\n", mdev.err().to_string().c_str());
        return 1;
      }
      mma_dev = (*mdev)[0];
    }
    bench_decode_kernels(d, (*ndev)[0], mma_dev, quick ? 5 : 20, decode_rows);
  }
  if (decode_only) {
    std::printf("\n");
    for (const auto& r : results) std::printf("%s: %.3f\n", r.name.c_str(), r.value);
    return 0;
  }
  std::printf("%-44s %12s\n", "benchmark", "value");
  bench_matmul(d, "f32", dtype::f32, 4096, it);
  bench_matmul((*tdev)[0], "tf32", dtype::f32, 4096, it);
  bench_matmul(d, "bf16", dtype::bf16, 4096, it);
  bench_matmul(d, "f16", dtype::f16, 4096, it);
  bench_matmul(d, "bf16", dtype::bf16, 8192, it);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    bench_rowop(d, "rms_norm", t, 16384, 8192, it);
    bench_rowop(d, "layer_norm", t, 16384, 8192, it);
    bench_rowop(d, "softmax", t, 16384, 8192, it);
    bench_rowop(d, "softmax", t, 64, 1 << 20, it);
    bench_rowop(d, "softmax_causal", t, 8192, 8192, it);
    bench_rowop(d, "add", t, 16384, 8192, it);
  }
  bench_notify(d, gpu::cuda::notify_mode::poller, "poller", quick ? 200 : 2000);
  bench_notify(d, gpu::cuda::notify_mode::host_func, "hostfunc", quick ? 200 : 2000);
  if (devs->size() >= 2) bench_peer(*devs);
  std::printf("\n");
  for (const auto& r : results) std::printf("%s: %.3f\n", r.name.c_str(), r.value);
  return 0;
}
