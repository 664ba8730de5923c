#pragma once
// Helpers for the CUDA backend tests: the shared GPU, running a whole graph
// node by node on one stream, and per-dtype tolerances.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/device.hpp"
#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"
#include "graph/plan.hpp"
#include "graph/reference.hpp"

namespace ag::test {

/// Skips the calling test (GTEST_SKIP must be used in the test body, hence a macro).
#define AG_REQUIRE_GPU(n)                                                                             \
  do {                                                                                                \
    const int ag_count_ = ::ag::gpu::cuda::device_count();                                            \
    if (ag_count_ < (n))                                                                              \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount reports " << ag_count_ << " usable GPU(s), " \
                   << "this test needs " << (n);                                                      \
  } while (0)

/// The collective steps of `p`; with `algo`, only those of that algorithm.
inline int collective_steps(const plan& p, std::optional<collective_algo> algo = {}) {
  int n = 0;
  for (const auto& s : p.steps()) n += s.kind == step_kind::collective && (!algo || s.algo == *algo);
  return n;
}

/// The shared devices (index 0: plain, 1: TF32 matmuls).
inline gpu::device_ptr& gpu_slot(int i) {
  static gpu::device_ptr d[2];
  return d[i];
}
/// Releases the shared devices before the CUDA runtime unloads (test environment TearDown).
inline void release_gpus() {
  gpu_slot(0).reset();
  gpu_slot(1).reset();
}

/// Device 0 (made once per process), or nullptr.
inline gpu::device_ptr gpu0(bool tf32 = false) {
  auto& slot = gpu_slot(tf32 ? 1 : 0);
  if (!slot) {
    gpu::backend_options o;
    o.cuda_tf32 = tf32;
    auto made = gpu::cuda::make_cuda_devices({0}, o, 0);
    if (made) slot = (*made)[0];
    else ADD_FAILURE() << made.err().to_string();
  }
  return slot;
}

/// Gathers a strided view of a contiguous host buffer into a contiguous tensor.
inline host_tensor gather(const node& n, const std::vector<std::byte>& storage) {
  host_tensor t(n.type, n.dims);
  const int64_t esz = static_cast<int64_t>(dtype_size(n.type));
  const int r = n.dims.rank();
  const int64_t total = n.dims.numel();
  for (int64_t i = 0; i < total; ++i) {
    int64_t rem = i, off = n.offset;
    for (int k = r - 1; k >= 0; --k) {
      off += (rem % n.dims[k]) * n.stride[static_cast<std::size_t>(k)];
      rem /= n.dims[k];
    }
    std::memcpy(t.data() + i * esz, storage.data() + off * esz, static_cast<std::size_t>(esz));
  }
  return t;
}

/// Bytes after every buffer of run_on, filled with guard_byte: a kernel that
/// writes past its output's end changes them, and run_on says so.
inline constexpr int64_t guard_bytes = 4096;
inline constexpr unsigned char guard_byte = 0xA5;

/// Runs every node of g on `d` in id order on one compute stream and returns
/// the outputs. Errors of launch / synchronize come back as the error, and so
/// does a write past the end of any buffer (errc::internal naming the node).
inline expected<std::vector<host_tensor>> run_on(gpu::device& d, const graph& g, const std::vector<host_tensor>& inputs,
                                                 bool tf32 = false) {
  std::vector<void*> bufs(g.size(), nullptr);
  auto release = [&] {
    for (void* p : bufs) d.deallocate(p);
  };
  const std::vector<unsigned char> guard(static_cast<std::size_t>(guard_bytes), guard_byte);
  auto bytes_of = [](const node& n) { return std::max<int64_t>(n.own_bytes(), 4); };
  for (const node& n : g.nodes()) {
    if (n.is_view()) continue;
    auto p = d.allocate(bytes_of(n) + guard_bytes);
    if (!p) {
      release();
      return p.err();
    }
    bufs[static_cast<std::size_t>(n.id)] = *p;
    if (error e = d.upload(static_cast<char*>(*p) + bytes_of(n), guard.data(), guard_bytes)) {
      release();
      return e;
    }
  }
  auto arg = [&](const node& n) {
    gpu::tensor_arg a;
    a.data = static_cast<char*>(bufs[static_cast<std::size_t>(n.storage)]) +
             n.offset * static_cast<int64_t>(dtype_size(n.type));
    a.type = n.type;
    a.dims = n.dims;
    a.stride = n.stride;
    return a;
  };
  for (std::size_t i = 0; i < g.inputs().size(); ++i) {
    const node& n = g.at(g.inputs()[i]);
    if (error e = d.upload(bufs[static_cast<std::size_t>(n.id)], inputs[i].data(), static_cast<int64_t>(inputs[i].bytes()))) {
      release();
      return e;
    }
  }
  for (const node& n : g.nodes())
    if (n.op == op_kind::weight && n.data)
      if (error e = d.upload(bufs[static_cast<std::size_t>(n.id)], n.data->in_memory()->data(), n.data->bytes())) {
        release();
        return e;
      }
  auto s = d.create_stream(ag::step_kind::compute).value();
  for (const node& n : g.nodes()) {
    if (is_leaf_op(n.op)) continue;
    gpu::op_launch l;
    l.op = &n;
    l.out = arg(n);
    for (node_id in : n.inputs) l.inputs.push_back(arg(g.at(in)));
    if (error e = d.launch(*s, l)) {
      release();
      return e;
    }
  }
  if (error e = d.synchronize(*s)) {
    release();
    return e;
  }
  std::vector<unsigned char> after(guard.size());
  for (const node& n : g.nodes()) {
    if (n.is_view()) continue;
    const void* end = static_cast<const char*>(bufs[static_cast<std::size_t>(n.id)]) + bytes_of(n);
    if (error e = d.download(after.data(), end, guard_bytes)) {
      release();
      return e;
    }
    if (after != guard) {
      release();
      return error(errc::internal, "a kernel wrote past the end of '" + n.name + "' (" + std::to_string(bytes_of(n)) +
                                       " bytes): its guard bytes changed");
    }
  }
  std::vector<host_tensor> outs;
  for (node_id id : g.outputs()) {
    const node& n = g.at(id);
    const node& st = g.at(n.storage);
    std::vector<std::byte> raw(static_cast<std::size_t>(st.own_bytes()));
    if (error e = d.download(raw.data(), bufs[static_cast<std::size_t>(st.id)], static_cast<int64_t>(raw.size()))) {
      release();
      return e;
    }
    outs.push_back(gather(n, raw));
  }
  release();
  (void)tf32;
  return outs;
}

struct tol {
  double atol, rtol;
};
/// Elementwise-class tolerance for results stored as `t` (f32 math inside).
inline tol tol_for(dtype t, double scale = 1.0) {
  switch (t) {
    case dtype::f16: return {2e-3 * scale, 2e-3 * scale};
    case dtype::bf16: return {1.6e-2 * scale, 1.6e-2 * scale};
    default: return {1e-5 * scale, 1e-5 * scale};
  }
}

/// Evaluates g on `dev` and with the reference, and compares every output.
inline void check_against_reference_on(gpu::device& dev, const graph& g, const std::vector<host_tensor>& inputs, tol t,
                                       const std::string& what, bool tf32 = false) {
  auto ref = evaluate_reference(g, inputs);
  ASSERT_TRUE(ref) << what << ": reference failed: " << ref.err().to_string();
  auto got = run_on(dev, g, inputs, tf32);
  ASSERT_TRUE(got) << what << ": " << got.err().to_string();
  ASSERT_EQ(got->size(), ref->size());
  for (std::size_t i = 0; i < ref->size(); ++i) {
    ASSERT_EQ((*got)[i].dims(), (*ref)[i].dims()) << what;
    auto c = compare((*got)[i], (*ref)[i], t.atol, t.rtol);
    EXPECT_TRUE(c.ok) << what << " output " << i << ": " << c.message << " (max abs err " << c.max_abs_err << ")";
  }
}

/// The same on the shared device 0 (TF32 matmuls with `tf32`).
inline void check_against_reference(const graph& g, const std::vector<host_tensor>& inputs, tol t,
                                    const std::string& what, bool tf32 = false) {
  auto dev = gpu0(tf32);
  ASSERT_TRUE(dev);
  check_against_reference_on(*dev, g, inputs, t, what, tf32);
}

inline std::string label(dtype t, const shape& s) { return std::string(to_string(t)) + " " + s.to_string(); }

}  // namespace ag::test
