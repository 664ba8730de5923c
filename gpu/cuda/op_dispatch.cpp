// Op dispatch (op_dispatch.hpp): the switch from op_kind to the per-family
// host launchers (<family>.cuh).

#include "gpu/cuda/op_dispatch.hpp"

#include "gpu/cuda/argmax.cuh"
#include "gpu/cuda/range_mask.cuh"
#include "gpu/cuda/attention.cuh"
#include "gpu/cuda/decode_step.cuh"
#include "gpu/cuda/device_guard.hpp"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/gemm.cuh"
#include "gpu/cuda/gemv.cuh"
#include "gpu/cuda/get_rows.cuh"
#include "gpu/cuda/kernel_args.hpp"
#include "gpu/cuda/norm.cuh"
#include "gpu/cuda/rope.cuh"
#include "gpu/cuda/softmax.cuh"

namespace ag::gpu::cuda::detail {

error dispatch_op(core& dev_core, cuda_stream& cs, const op_launch& l, const std::string& device_name,
                  int sm_count, const kernel_choices& kernels, const decode_step_tp* tp) {
  const bool tf32 = kernels.tf32;
  if (!l.op) return error(errc::invalid_argument, device_name + ": launch without a node");
  const node& n = *l.op;
  // One context per thread, reused: `where` keeps its capacity, so a launch
  // allocates nothing on the host once names of this length were seen (four
  // string allocations per kernel before).
  thread_local launch_ctx c;
  c.stream = cs.s_;
  c.fault_word = cs.fault_ ? cs.fault_->dev : nullptr;
  c.where.clear();
  c.where.append(device_name).append(" ").append(to_string(n.op)).append(" '").append(n.name).append("'");
  c.sm_count = sm_count;
  c.gemv = kernels.gemv;
  c.gemv_tensor_core_rows = kernels.gemv_tensor_core_rows;
  c.b_is_weight = (l.weight_inputs >> 1) & 1u;
  c.settled_inputs = l.settled_inputs;
  c.pdl = kernels.pdl;
  c.attention_workspace = cs.attention_ws_;
  c.attention_workspace_floats = cs.attention_ws_ ? cuda_stream::attention_workspace_floats : 0;
  c.attention_counter_words = cs.attention_counters_;
  c.attention_counters = cs.attention_ws_ ? cuda_stream::attention_counters : 0;
  auto need = [&](std::size_t k) -> error {
    if (l.inputs.size() < k)
      return error(errc::missing_input, c.where + ": needs " + std::to_string(k) + " inputs, got " +
                                            std::to_string(l.inputs.size()));
    for (std::size_t i = 0; i < k; ++i)
      if (!l.inputs[i].data && l.inputs[i].dims.numel() > 0)
        return error(errc::invalid_argument, c.where + ": input " + std::to_string(i) + " has no buffer");
    if (!l.out.data && l.out.dims.numel() > 0) return error(errc::invalid_argument, c.where + ": no output buffer");
    return {};
  };
  device_guard g(dev_core.ordinal);
  const kt out = to_kt(l.out);
  error e;
  if (l.fused == op_launch::fusion::attention) {
    // The lowering's fused chain (gpu::op_launch::fusion): inputs q, k, v[,
    // mask][, k_new, v_new, cache_positions[, rope positions]].
    const op_launch::attention_params& ap = l.attention;
    const bool masked = ap.masked;
    const std::size_t base = masked ? 4 : 3;
    const std::size_t count = base + (ap.store_new_rows ? 3 + (ap.rope_q || ap.rope_k ? 1 : 0) : 0);
    if ((e = need(count))) return e;
    c.where.append(" (fused attention)");
    if (kernels.skip_attention) return {};
    const kt mask = masked ? to_kt(l.inputs[3]) : kt{};
    attention_prologue pro;
    if (ap.store_new_rows) {
      pro.k_new = to_kt(l.inputs[base]);
      pro.v_new = to_kt(l.inputs[base + 1]);
      pro.cache_positions = to_kt(l.inputs[base + 2]);
      if (ap.rope_q || ap.rope_k) pro.rope_positions = to_kt(l.inputs[base + 3]);
      pro.rope_q = ap.rope_q;
      pro.rope_k = ap.rope_k;
      pro.theta = ap.rope_theta;
      pro.scaling = ap.rope_scale;
    }
    e = launch_fused_attention(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]), to_kt(l.inputs[2]),
                               masked ? &mask : nullptr, ap.scale, ap.causal, ap.softmax_rows,
                               ap.store_new_rows ? &pro : nullptr, ap.rows_apart);
    if (e.code == errc::device_failed) dev_core.mark_dead(e);
    return e;
  }
  if (l.fused == op_launch::fusion::decode_step) {
    // The lowering's whole decode step (gpu::op_launch::decode_step_params).
    c.where.append(" (fused decode step)");
    e = launch_decode_step(c, l.decode_step, l.inputs, l.out, cs.decode_step_ws_,
                           cs.decode_step_ws_ ? decode_step_workspace_bytes() : 0, tp);
    if (e.code == errc::device_failed) dev_core.mark_dead(e);
    return e;
  }
  if (l.fused == op_launch::fusion::projections) {
    // The lowering's projection group (gpu::op_launch::projection): inputs
    // {x, w_1, .., w_n} or {x, w, residual}, then the norm prologue's
    // weight when it has one.
    if ((e = need(2))) return e;
    c.where.append(" (fused projections)");
    if ((kernels.skip_residual && l.projection == projection_kind::residual) ||
        (kernels.skip_gated && l.projection == projection_kind::gated) ||
        (kernels.skip_shared && l.projection == projection_kind::shared_input))
      return {};
    const bool with_residual = l.projection == projection_kind::residual;
    const bool norm_weighted = l.projection_norm.on && l.projection_norm.weighted;
    const bool roped = l.projection_rope.roped != 0;
    const int n_w =
        static_cast<int>(l.inputs.size()) - 1 - (with_residual ? 1 : 0) - (norm_weighted ? 1 : 0) - (roped ? 1 : 0);
    kt ws[3], extra[2];
    if (n_w < 1 || n_w > 3 || l.extra_outs.size() > 2)
      return error(errc::internal, c.where + ": fused projections with " + std::to_string(l.inputs.size()) + " inputs");
    for (int m = 0; m < n_w; ++m) ws[m] = to_kt(l.inputs[static_cast<std::size_t>(1 + m)]);
    for (std::size_t m = 0; m < l.extra_outs.size(); ++m) extra[m] = to_kt(l.extra_outs[m]);
    const kt resid = with_residual ? to_kt(l.inputs[static_cast<std::size_t>(1 + n_w)]) : kt{};
    // Then the norm's weight, then the ropes' positions (launch_program.cpp).
    const kt norm_w = norm_weighted ? to_kt(l.inputs[static_cast<std::size_t>(1 + n_w)]) : kt{};
    const gemv_norm norm{norm_weighted ? &norm_w : nullptr, l.projection_norm.eps};
    const kt positions = roped ? to_kt(l.inputs.back()) : kt{};
    const gemv_rope rope{&positions, l.projection_rope.roped, l.projection_rope.neox, l.projection_rope.head_dim,
                         l.projection_rope.seq, l.projection_rope.theta, l.projection_rope.scaling};
    e = launch_gemv_projections(c, l.projection, out, extra, static_cast<int>(l.extra_outs.size()),
                                to_kt(l.inputs[0]), ws, n_w, with_residual ? &resid : nullptr,
                                l.projection_norm.on ? &norm : nullptr, roped ? &rope : nullptr);
    if (e.code == errc::device_failed) dev_core.mark_dead(e);
    return e;
  }
  switch (n.op) {
    case op_kind::input:
    case op_kind::weight:
    case op_kind::reshape:
    case op_kind::view:
    case op_kind::permute:
    case op_kind::transpose:
    case op_kind::slice:
      return {};  // leaves are uploaded, views alias their source
    case op_kind::all_reduce:
    case op_kind::all_gather:
    case op_kind::reduce_scatter:
      return error(errc::unsupported_op, c.where + ": a collective runs as a collective step, not as a kernel");
    case op_kind::matmul: {
      if ((e = need(2))) return e;
      auto h = cs.blas(tf32);
      if (!h) return h.err();
      e = launch_matmul(c, *h, l.out, l.inputs[0], l.inputs[1], n.attrs.trans_a, n.attrs.trans_b, tf32);
      break;
    }
    case op_kind::add:
    case op_kind::mul: {
      if ((e = need(2))) return e;
      const kt a = to_kt(l.inputs[0]), b = to_kt(l.inputs[1]);
      e = launch_elementwise(c, n.op == op_kind::add ? ew_op::add : ew_op::mul, out, a, &b, 1.f);
      break;
    }
    case op_kind::scale:
      if ((e = need(1))) return e;
      e = launch_elementwise(c, ew_op::scale, out, to_kt(l.inputs[0]), nullptr, n.attrs.scale);
      break;
    case op_kind::gelu:
      if ((e = need(1))) return e;
      e = launch_elementwise(c, n.attrs.gelu == gelu_mode::erf ? ew_op::gelu_erf : ew_op::gelu_tanh, out,
                             to_kt(l.inputs[0]), nullptr, 1.f);
      break;
    case op_kind::silu:
      if ((e = need(1))) return e;
      e = launch_elementwise(c, ew_op::silu, out, to_kt(l.inputs[0]), nullptr, 1.f);
      break;
    case op_kind::rms_norm: {
      if ((e = need(1))) return e;
      kt w;
      if (l.inputs.size() > 1) w = to_kt(l.inputs[1]);
      e = launch_rms_norm(c, out, to_kt(l.inputs[0]), l.inputs.size() > 1 ? &w : nullptr, n.attrs.eps);
      break;
    }
    case op_kind::layer_norm: {
      if ((e = need(1))) return e;
      kt w, b;
      if (l.inputs.size() > 1) w = to_kt(l.inputs[1]);
      if (l.inputs.size() > 2) b = to_kt(l.inputs[2]);
      e = launch_layer_norm(c, out, to_kt(l.inputs[0]), l.inputs.size() > 1 ? &w : nullptr,
                            l.inputs.size() > 2 ? &b : nullptr, n.attrs.eps);
      break;
    }
    case op_kind::softmax:
      if ((e = need(1))) return e;
      e = launch_softmax(c, out, to_kt(l.inputs[0]), n.attrs.scale, n.attrs.causal);
      break;
    case op_kind::argmax:
      if ((e = need(1))) return e;
      e = launch_argmax(c, out, to_kt(l.inputs[0]));
      break;
    case op_kind::range_mask:
      if ((e = need(2))) return e;
      e = launch_range_mask(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]));
      break;
    case op_kind::rope:
      if ((e = need(2))) return e;
      if (kernels.skip_rope) return {};
      e = launch_rope(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]), n.attrs.theta, n.attrs.rope_scale,
                      n.attrs.rope == rope_mode::neox);
      break;
    case op_kind::get_rows:
      if ((e = need(2))) return e;
      e = n.attrs.end > 0 ? launch_get_rows(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]), n.attrs.begin, n.attrs.end)
                          : launch_get_rows(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]));
      break;
    case op_kind::store_rows:
      if ((e = need(2))) return e;
      e = launch_store_rows(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]), n.attrs.axis + 4 - l.out.dims.rank());
      break;
    case op_kind::concat: {
      if ((e = need(1))) return e;
      const int rank = l.out.dims.rank();
      const int axis = n.attrs.axis < 0 ? n.attrs.axis + rank : n.attrs.axis;
      if (axis < 0 || axis >= rank) return error(errc::invalid_argument, c.where + ": concat axis out of range");
      int64_t at = 0;
      const int64_t esz = static_cast<int64_t>(dtype_size(l.out.type));
      for (const tensor_arg& in : l.inputs) {
        tensor_arg dst;
        dst.data = static_cast<char*>(l.out.data) + at * l.out.stride[static_cast<std::size_t>(axis)] * esz;
        dst.type = l.out.type;
        dst.dims = in.dims;
        dst.stride = l.out.stride;
        if ((e = launch_strided_copy(c, to_kt(dst), to_kt(in)))) break;
        at += in.dims[axis];
      }
      break;
    }
    case op_kind::copy:
      if ((e = need(1))) return e;
      if (l.inputs[0].dims.numel() != l.out.dims.numel())
        return error(errc::invalid_shape, c.where + ": copy changes the element count");
      if (l.inputs[0].dims != l.out.dims) {
        // Same count, other dims: read the source in its own index order.
        tensor_arg dst = l.out;
        dst.dims = l.inputs[0].dims;
        dst.stride = contiguous_strides(dst.dims);
        e = launch_strided_copy(c, to_kt(dst), to_kt(l.inputs[0]));
      } else {
        e = launch_strided_copy(c, out, to_kt(l.inputs[0]));
      }
      break;
  }
  if (e.code == errc::device_failed) dev_core.mark_dead(e);
  return e;
}

}  // namespace ag::gpu::cuda::detail
