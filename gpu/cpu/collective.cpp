#include "gpu/cpu/collective.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace ag::gpu::cpu {

namespace {

error bad(errc code, const collective_launch& c, const std::string& what) {
  const std::string name = c.op ? c.op->name : std::string("<null>");
  return error(code, "collective '" + name + "': " + what, -1, -1, c.op ? c.op->name : std::string{});
}

}  // namespace

double load_element(const std::byte* p, dtype t, int64_t i) {
  switch (t) {
    case dtype::f32: {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case dtype::i32: {
      int32_t v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case dtype::f16: {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      return half_to_float(v);
    }
    case dtype::bf16: {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      return bf16_to_float(v);
    }
  }
  return 0;
}

void store_element(std::byte* p, dtype t, int64_t i, double x) {
  switch (t) {
    case dtype::f32: {
      const auto v = static_cast<float>(x);
      std::memcpy(p + i * 4, &v, 4);
      return;
    }
    case dtype::i32: {
      int32_t v = 0;  // saturating, nan -> 0 (the reference's rule)
      if (x >= 2147483647.0) v = std::numeric_limits<int32_t>::max();
      else if (x <= -2147483648.0) v = std::numeric_limits<int32_t>::min();
      else if (!std::isnan(x)) v = static_cast<int32_t>(x);
      std::memcpy(p + i * 4, &v, 4);
      return;
    }
    case dtype::f16: {
      const uint16_t v = float_to_half(static_cast<float>(x));
      std::memcpy(p + i * 2, &v, 2);
      return;
    }
    case dtype::bf16: {
      const uint16_t v = float_to_bf16(static_cast<float>(x));
      std::memcpy(p + i * 2, &v, 2);
      return;
    }
  }
}

namespace {

bool contiguous(const tensor_arg& t) { return is_contiguous(t.dims, t.stride); }

}  // namespace

error check_collective(const collective_launch& c) {
  if (!c.op) return bad(errc::invalid_argument, c, "launch without an op");
  const node& n = *c.op;
  if (!is_collective_op(n.op)) return bad(errc::invalid_argument, c, std::string(to_string(n.op)) + " is not a collective");
  const std::size_t members = c.inputs.size();
  if (members == 0 || c.members.size() != members || n.inputs.size() != members)
    return bad(errc::invalid_argument, c,
               std::to_string(c.inputs.size()) + " operands, " + std::to_string(c.members.size()) + " members, node has " +
                   std::to_string(n.inputs.size()) + " inputs");
  if (c.rank < 0 || static_cast<std::size_t>(c.rank) >= members || c.rank != n.attrs.rank)
    return bad(errc::invalid_argument, c, "rank " + std::to_string(c.rank) + " does not match the node's");
  if (!c.out.data || c.out.type != n.type || c.out.dims != n.dims || !contiguous(c.out))
    return bad(errc::invalid_shape, c, "output buffer is null, not contiguous or not the node's dims/dtype");
  int64_t gathered = 0;
  for (std::size_t k = 0; k < members; ++k) {
    const tensor_arg& in = c.inputs[k];
    if (!in.data || !contiguous(in))
      return bad(errc::invalid_argument, c, "operand of rank " + std::to_string(k) + " is null or not contiguous");
    if (in.type != n.type) return bad(errc::dtype_mismatch, c, "operand of rank " + std::to_string(k) + " has another dtype");
    if (n.op != op_kind::all_gather && in.dims != c.inputs[0].dims)
      return bad(errc::invalid_shape, c, "operands of a reduction differ in dims");
    gathered += in.dims.numel();
  }
  if (n.op == op_kind::all_reduce && c.inputs[0].dims.numel() != n.dims.numel())
    return bad(errc::invalid_shape, c, "all_reduce output size differs from its operands'");
  if (n.op == op_kind::all_gather && gathered != n.dims.numel())
    return bad(errc::invalid_shape, c, "all_gather output size differs from its operands' total");
  if (n.op == op_kind::reduce_scatter) {
    const shape& full = c.inputs[0].dims;
    const int axis = n.attrs.axis;
    if (axis < 0 || axis >= full.rank() || n.attrs.begin < 0 || n.attrs.end > full[axis] || n.attrs.begin >= n.attrs.end)
      return bad(errc::invalid_shape, c, "reduce_scatter range outside its operands");
  }
  return {};
}

error run_collective(const collective_launch& c) {
  if (error e = check_collective(c)) return e;
  const node& n = *c.op;
  const dtype t = n.type;
  auto* out = static_cast<std::byte*>(c.out.data);
  if (n.op == op_kind::all_gather) {
    // Each operand as [outer, part]: concatenated in rank order per outer row.
    int64_t outer = 1;
    for (int d = 0; d < n.attrs.axis; ++d) outer *= n.dims[d];
    const std::size_t es = dtype_size(t);
    std::size_t dst = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (const tensor_arg& x : c.inputs) {
        const std::size_t chunk = static_cast<std::size_t>(x.dims.numel() / outer) * es;
        std::memcpy(out + dst, static_cast<const std::byte*>(x.data) + static_cast<std::size_t>(o) * chunk, chunk);
        dst += chunk;
      }
    return {};
  }
  const shape& full = c.inputs[0].dims;
  int64_t outer = 1, len = 1, inner = 1, begin = 0, axis_len = 1;
  if (n.op == op_kind::reduce_scatter) {
    const int axis = n.attrs.axis;
    for (int d = 0; d < axis; ++d) outer *= full[d];
    for (int d = axis + 1; d < full.rank(); ++d) inner *= full[d];
    begin = n.attrs.begin;
    len = n.attrs.end - n.attrs.begin;
    axis_len = full[axis];
  } else {
    len = full.numel();
    axis_len = len;
  }
  std::vector<const std::byte*> in;
  in.reserve(c.inputs.size());
  for (const auto& x : c.inputs) in.push_back(static_cast<const std::byte*>(x.data));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < len; ++r)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t src = (o * axis_len + begin + r) * inner + i;
        double sum = 0;
        for (const std::byte* p : in) sum += load_element(p, t, src);
        store_element(out, t, (o * len + r) * inner + i, sum);
      }
  return {};
}

}  // namespace ag::gpu::cpu
