// The CPU reference evaluator. Every node's value is kept as a contiguous
// host_tensor of the node's dtype (views materialised by gathering through
// their strides), so each op reads plain row-major inputs and the rounding to
// the node's dtype happens exactly once, when its result is stored.
#include "graph/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>

#include "graph/attention_mask.hpp"
#include "graph/validate_util.hpp"

namespace ag {

error check_inputs(const graph& g, const std::vector<host_tensor>& inputs) {
  const auto& want = g.inputs();
  if (inputs.size() < want.size()) {
    const node& n = g.at(want[inputs.size()]);
    return error(errc::missing_input, "job passes " + std::to_string(inputs.size()) + " inputs, graph needs " +
                                          std::to_string(want.size()) + "; first missing: input " +
                                          std::to_string(inputs.size()) + " '" + n.name + "' " +
                                          to_string(n.type) + " " + n.dims.to_string());
  }
  if (inputs.size() > want.size())
    return error(errc::invalid_argument, "job passes " + std::to_string(inputs.size()) + " inputs, graph takes " +
                                             std::to_string(want.size()));
  for (std::size_t k = 0; k < want.size(); ++k) {
    const node& n = g.at(want[k]);
    const host_tensor& t = inputs[k];
    if (t.type() != n.type)
      return error(errc::dtype_mismatch, "input " + std::to_string(k) + " '" + n.name + "': expected " +
                                             to_string(n.type) + ", given " + to_string(t.type()));
    if (t.dims() != n.dims)
      return error(errc::invalid_shape, "input " + std::to_string(k) + " '" + n.name + "': expected " +
                                            n.dims.to_string() + ", given " + t.dims().to_string());
    if (t.bytes() != static_cast<std::size_t>(t.numel()) * dtype_size(t.type()))
      return error(errc::invalid_argument, "input " + std::to_string(k) + " '" + n.name + "': holds " +
                                               std::to_string(t.bytes()) + " bytes, " + n.dims.to_string() +
                                               " " + to_string(n.type) + " needs " +
                                               std::to_string(t.numel() * int64_t(dtype_size(t.type()))));
  }
  return {};
}

namespace {

using dvec = std::vector<double>;

int32_t raw_i32(const host_tensor& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, t.data() + i * 4, 4);
  return v;
}

dvec to_doubles(const host_tensor& t) {
  dvec v(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<std::size_t>(i)] = t.type() == dtype::i32 ? raw_i32(t, i) : static_cast<double>(t.at(i));
  return v;
}

void store(host_tensor& t, int64_t i, double v) {
  if (t.type() == dtype::i32) {
    int32_t r = 0;  // nan -> 0; out of range saturates (C++ would make it undefined)
    if (v >= 2147483647.0) r = std::numeric_limits<int32_t>::max();
    else if (v <= -2147483648.0) r = std::numeric_limits<int32_t>::min();
    else if (!std::isnan(v)) r = static_cast<int32_t>(v);
    std::memcpy(t.data() + i * 4, &r, 4);
  } else {
    t.set(i, static_cast<float>(v));
  }
}

host_tensor from_doubles(dtype type, const shape& dims, const dvec& v) {
  host_tensor t(type, dims);
  for (int64_t i = 0; i < t.numel(); ++i) store(t, i, v[static_cast<std::size_t>(i)]);
  return t;
}

// Multi-index of flat row-major index i in dims.
std::array<int64_t, max_rank> unravel(int64_t i, const shape& d) {
  std::array<int64_t, max_rank> idx{};
  for (int k = d.rank() - 1; k >= 0; --k) {
    idx[static_cast<std::size_t>(k)] = i % d[k];
    i /= d[k];
  }
  return idx;
}

// Flat index into `in` (right-aligned under `out`, size-1 dims broadcast) of out's multi-index.
int64_t broadcast_index(const std::array<int64_t, max_rank>& out_idx, int out_rank, const shape& in,
                        int in_rank_used) {
  const strides st = contiguous_strides(in);
  int64_t f = 0;
  for (int k = 0; k < in_rank_used; ++k) {
    const int o = k + (out_rank - in_rank_used);
    if (in[k] != 1) f += out_idx[static_cast<std::size_t>(o)] * st[static_cast<std::size_t>(k)];
  }
  return f;
}

host_tensor materialise_view(const node& n, const host_tensor& storage) {
  host_tensor t(n.type, n.dims);
  const std::size_t es = dtype_size(n.type);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const auto idx = unravel(i, n.dims);
    int64_t src = n.offset;
    for (int k = 0; k < n.dims.rank(); ++k) src += idx[static_cast<std::size_t>(k)] * n.stride[static_cast<std::size_t>(k)];
    std::memcpy(t.data() + static_cast<std::size_t>(i) * es, storage.data() + static_cast<std::size_t>(src) * es, es);
  }
  return t;
}

// `stop` (may be null) is asked before each row of each matrix; when it says
// stop, the result is garbage and the caller returns errc::cancelled.
host_tensor eval_matmul(const node& n, const host_tensor& ta, const host_tensor& tb, const std::function<bool()>* stop) {
  const dvec a = to_doubles(ta), b = to_doubles(tb);
  const shape& da = ta.dims();
  const shape& db = tb.dims();
  const int r = n.dims.rank() - 2;
  const int64_t M = n.dims[-2], N = n.dims[-1];
  const int64_t K = n.attrs.trans_a ? da[-2] : da[-1];
  // batch shapes of a and b (leading dims only)
  shape ba = da, bb = db, bo = n.dims;
  ba.set_rank(da.rank() - 2);
  bb.set_rank(db.rank() - 2);
  bo.set_rank(r);
  const int64_t a_mat = da[-1] * da[-2], b_mat = db[-1] * db[-2];
  // element strides of (m, k) in a and (k, n) in b
  const int64_t sam = n.attrs.trans_a ? 1 : K, sak = n.attrs.trans_a ? M : 1;
  const int64_t sbk = n.attrs.trans_b ? 1 : N, sbn = n.attrs.trans_b ? K : 1;
  dvec out(static_cast<std::size_t>(n.dims.numel()));
  dvec pa(static_cast<std::size_t>(M * K)), pb(static_cast<std::size_t>(N * K));
  for (int64_t ob = 0; ob < bo.numel(); ++ob) {
    const auto bidx = unravel(ob, bo);
    const int64_t a0 = broadcast_index(bidx, r, ba, ba.rank()) * a_mat;
    const int64_t b0 = broadcast_index(bidx, r, bb, bb.rank()) * b_mat;
    // pack rows of a and columns of b so the dot products run over contiguous memory
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) pa[static_cast<std::size_t>(m * K + k)] = a[static_cast<std::size_t>(a0 + m * sam + k * sak)];
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) pb[static_cast<std::size_t>(j * K + k)] = b[static_cast<std::size_t>(b0 + k * sbk + j * sbn)];
    for (int64_t m = 0; m < M; ++m) {
      if (stop && (*stop)()) return {};
      for (int64_t j = 0; j < N; ++j) {
        const double* x = pa.data() + m * K;
        const double* y = pb.data() + j * K;
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += x[k] * y[k];
        out[static_cast<std::size_t>((ob * M + m) * N + j)] = acc;
      }
    }
  }
  return from_doubles(n.type, n.dims, out);
}

host_tensor eval_binary(const node& n, const host_tensor& ta, const host_tensor& tb) {
  const dvec a = to_doubles(ta), b = to_doubles(tb);
  dvec out(a.size());
  for (int64_t i = 0; i < ta.numel(); ++i) {
    const auto idx = unravel(i, n.dims);
    const double y = b[static_cast<std::size_t>(broadcast_index(idx, n.dims.rank(), tb.dims(), tb.dims().rank()))];
    const double x = a[static_cast<std::size_t>(i)];
    out[static_cast<std::size_t>(i)] = n.op == op_kind::add ? x + y : x * y;
  }
  return from_doubles(n.type, n.dims, out);
}

double gelu(double x, gelu_mode m) {
  if (m == gelu_mode::erf) return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

host_tensor eval_unary(const node& n, const host_tensor& tx) {
  dvec v = to_doubles(tx);
  for (double& x : v) {
    switch (n.op) {
      case op_kind::scale: x *= static_cast<double>(n.attrs.scale); break;
      case op_kind::gelu: x = gelu(x, n.attrs.gelu); break;
      case op_kind::silu: x = x / (1.0 + std::exp(-x)); break;
      default: break;
    }
  }
  return from_doubles(n.type, n.dims, v);
}

host_tensor eval_norm(const node& n, const std::vector<const host_tensor*>& in) {
  const dvec x = to_doubles(*in[0]);
  const dvec w = in.size() > 1 ? to_doubles(*in[1]) : dvec();
  const dvec b = in.size() > 2 ? to_doubles(*in[2]) : dvec();
  const int64_t D = n.dims[-1], rows = n.dims.numel() / D;
  const double eps = n.attrs.eps;
  dvec out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * D;
    double* o = out.data() + r * D;
    if (n.op == op_kind::rms_norm) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += row[i] * row[i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
      for (int64_t i = 0; i < D; ++i) o[i] = row[i] * inv * (w.empty() ? 1.0 : w[static_cast<std::size_t>(i)]);
    } else {
      double mean = 0;
      for (int64_t i = 0; i < D; ++i) mean += row[i];
      mean /= static_cast<double>(D);
      double var = 0;
      for (int64_t i = 0; i < D; ++i) var += (row[i] - mean) * (row[i] - mean);
      var /= static_cast<double>(D);  // biased, as PyTorch's LayerNorm
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < D; ++i)
        o[i] = (row[i] - mean) * inv * (w.empty() ? 1.0 : w[static_cast<std::size_t>(i)]) +
               (b.empty() ? 0.0 : b[static_cast<std::size_t>(i)]);
    }
  }
  return from_doubles(n.type, n.dims, out);
}

host_tensor eval_softmax(const node& n, const host_tensor& tx) {
  const dvec x = to_doubles(tx);
  const int64_t Sk = n.dims[-1], rows = n.dims.numel() / Sk;
  const int64_t Sq = n.dims.rank() >= 2 ? n.dims[-2] : 1;
  const double s = n.attrs.scale;
  dvec out(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % Sq;
    const int64_t last = n.attrs.causal ? std::min(Sk - 1, i + (Sk - Sq)) : Sk - 1;  // last unmasked j
    const double* row = x.data() + r * Sk;
    double* o = out.data() + r * Sk;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, row[j] * s);
    double sum = 0;
    for (int64_t j = 0; j <= last; ++j) sum += (o[j] = std::exp(row[j] * s - mx));
    for (int64_t j = 0; j <= last; ++j) o[j] /= sum;
  }
  return from_doubles(n.type, n.dims, out);
}

host_tensor eval_argmax(const node& n, const host_tensor& tx) {
  const dvec x = to_doubles(tx);
  const int64_t N = tx.dims()[-1], rows = n.dims.numel();
  std::vector<int32_t> out(static_cast<std::size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * N;
    int64_t best = -1;
    for (int64_t j = 0; j < N; ++j)  // the first maximum; a NaN never compares greater
      if (!std::isnan(row[j]) && (best < 0 || row[j] > row[best])) best = j;
    out[static_cast<std::size_t>(r)] = static_cast<int32_t>(best < 0 ? 0 : best);
  }
  return host_tensor::from_ints(n.dims, out);
}

host_tensor eval_range_mask(const node& n, const host_tensor& keys, const host_tensor& ranges) {
  const int64_t T = n.dims[0], C = n.dims[1];
  host_tensor out(n.type, n.dims);
  for (int64_t i = 0; i < T; ++i) {
    const int32_t first = raw_i32(ranges, 2 * i), last = raw_i32(ranges, 2 * i + 1);
    for (int64_t c = 0; c < C; ++c) {
      const int32_t p = raw_i32(keys, c);
      out.set(i * C + c, p >= first && p <= last ? 0.0f : attention_hidden_score);
    }
  }
  return out;
}

host_tensor eval_rope(const node& n, const host_tensor& tx, const host_tensor& tp) {
  const dvec x = to_doubles(tx);
  const int64_t D = n.dims[-1], H = n.dims[-2], S = n.dims[-3];
  const int64_t half = D / 2;
  const double theta = n.attrs.theta;
  dvec out(x.size());
  const int64_t heads = n.dims.numel() / D;  // rows of D, ordered [.., S, H]
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t s = (h / H) % S;
    const double pos = raw_i32(tp, s);
    const double* xi = x.data() + h * D;
    double* o = out.data() + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const double ang = pos * rope_frequency(theta, n.attrs.rope_scale, i, D);
      const double c = std::cos(ang), sn = std::sin(ang);
      const int64_t p = n.attrs.rope == rope_mode::neox ? i : 2 * i;
      const int64_t q = n.attrs.rope == rope_mode::neox ? i + half : 2 * i + 1;
      o[p] = xi[p] * c - xi[q] * sn;
      o[q] = xi[p] * sn + xi[q] * c;
    }
  }
  return from_doubles(n.type, n.dims, out);
}

expected<host_tensor> eval_get_rows(const node& n, const host_tensor& table, const host_tensor& ids) {
  const int64_t V = table.dims()[0], D = table.dims()[1];
  // A shard holds rows [first, first + V) of a vocabulary of `rows` (attrs.end > 0).
  const int64_t first = n.attrs.end > 0 ? n.attrs.begin : 0;
  const int64_t rows = n.attrs.end > 0 ? n.attrs.end : V;
  const std::size_t row_bytes = static_cast<std::size_t>(D) * dtype_size(table.type());
  host_tensor t(n.type, n.dims);  // zero-filled: ids outside a shard leave zero rows
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t id = raw_i32(ids, i);
    if (id < 0 || id >= rows)
      return detail::node_error(errc::invalid_argument, n,
                                "id " + std::to_string(id) + " at flat index " + std::to_string(i) +
                                    " is outside [0, " + std::to_string(rows) + ")");
    if (id < first || id >= first + V) continue;
    std::memcpy(t.data() + static_cast<std::size_t>(i) * row_bytes,
                table.data() + static_cast<std::size_t>(id - first) * row_bytes, row_bytes);
  }
  return t;
}

// all_reduce / reduce_scatter: the sum in double, rounded once to the dtype.
host_tensor eval_reduce(const node& n, const std::vector<const host_tensor*>& in) {
  dvec sum = to_doubles(*in[0]);
  for (std::size_t k = 1; k < in.size(); ++k) {
    const dvec v = to_doubles(*in[k]);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  if (n.op == op_kind::all_reduce) return from_doubles(n.type, n.dims, sum);
  // reduce_scatter: keep [begin, end) along axis.
  const shape& full = in[0]->dims();
  const int axis = n.attrs.axis;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= full[d];
  for (int d = axis + 1; d < full.rank(); ++d) inner *= full[d];
  const int64_t len = n.attrs.end - n.attrs.begin;
  dvec out(static_cast<std::size_t>(outer * len * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < len; ++r)
      for (int64_t i = 0; i < inner; ++i)
        out[static_cast<std::size_t>((o * len + r) * inner + i)] =
            sum[static_cast<std::size_t>((o * full[axis] + n.attrs.begin + r) * inner + i)];
  return from_doubles(n.type, n.dims, out);
}

// all_gather: each operand, seen as [outer, part * inner] with part the
// product of its merged dims, is concatenated in rank order along dim 1.
host_tensor eval_all_gather(const node& n, const std::vector<const host_tensor*>& in) {
  host_tensor t(n.type, n.dims);
  int64_t outer = 1;
  for (int d = 0; d < n.attrs.axis; ++d) outer *= n.dims[d];
  const std::size_t es = dtype_size(n.type);
  std::size_t dst = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (const host_tensor* x : in) {
      const std::size_t chunk = static_cast<std::size_t>(x->numel() / outer) * es;
      std::memcpy(t.data() + dst, x->data() + static_cast<std::size_t>(o) * chunk, chunk);
      dst += chunk;
    }
  return t;
}

host_tensor eval_concat(const node& n, const std::vector<const host_tensor*>& in) {
  host_tensor t(n.type, n.dims);
  const int axis = n.attrs.axis;
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < axis; ++k) outer *= n.dims[k];
  for (int k = axis + 1; k < n.dims.rank(); ++k) inner *= n.dims[k];
  const std::size_t es = dtype_size(n.type);
  std::size_t dst = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (const host_tensor* x : in) {
      const std::size_t chunk = static_cast<std::size_t>(x->dims()[axis] * inner) * es;
      std::memcpy(t.data() + dst, x->data() + static_cast<std::size_t>(o) * chunk, chunk);
      dst += chunk;
    }
  return t;
}

// store_rows: the slot's previous value (zeros when the state holds none of
// this node's dims and dtype), rows stored at their positions along the axis.
host_tensor eval_store_rows(const node& n, const host_tensor& rows, const host_tensor& positions,
                            reference_state* state) {
  host_tensor t(n.type, n.dims);
  if (state) {
    auto it = state->find(n.name);
    if (it != state->end() && it->second.type() == n.type && it->second.dims() == n.dims) t = it->second;
  }
  const int axis = n.attrs.axis;
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < axis; ++k) outer *= n.dims[k];
  for (int k = axis + 1; k < n.dims.rank(); ++k) inner *= n.dims[k];
  const int64_t count = rows.dims()[axis], cap = n.dims[axis];
  const std::size_t chunk = static_cast<std::size_t>(inner) * dtype_size(n.type);
  const auto* pos = reinterpret_cast<const int32_t*>(positions.data());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = pos[i];
      if (at < 0 || at >= cap) continue;
      std::memcpy(t.data() + static_cast<std::size_t>(o * cap + at) * chunk,
                  rows.data() + static_cast<std::size_t>(o * count + i) * chunk, chunk);
    }
  if (state) (*state)[n.name] = t;
  return t;
}

host_tensor eval_copy(const node& n, const host_tensor& x) {
  if (x.type() == n.type) return x;
  host_tensor t(n.type, n.dims);
  const dvec v = to_doubles(x);
  for (int64_t i = 0; i < t.numel(); ++i) store(t, i, v[static_cast<std::size_t>(i)]);
  return t;
}

error stopped() { return error(errc::cancelled, "reference evaluation stopped"); }

// Refuses a graph whose evaluation cannot fit this host, before allocating:
// every node's value is kept (views materialised), and an op works on double
// copies of its inputs and output (8 bytes per element each).
error check_reference_memory(const graph& g) {
  constexpr int64_t saturated = std::numeric_limits<int64_t>::max();
  const auto add = [](int64_t a, int64_t b) { return checked_add(a, b, a) ? a : saturated; };
  const auto doubles = [](const node& n) { int64_t b = 0; return checked_mul(n.dims.numel(), 8, b) ? b : saturated; };
  int64_t total = 0, worst_temp = 0, biggest_bytes = -1;
  const node* biggest = nullptr;
  for (const node& n : g.nodes()) {
    const int64_t bytes = n.dims.numel() * static_cast<int64_t>(dtype_size(n.type));  // valid graph: <= 2^62
    int64_t temp = doubles(n);
    for (node_id i : n.inputs) temp = add(temp, doubles(g.at(i)));
    worst_temp = std::max(worst_temp, temp);
    if (bytes > biggest_bytes) {
      biggest = &n;
      biggest_bytes = bytes;
    }
    total = add(total, bytes);
  }
  const int64_t need = add(total, worst_temp);
  if (need > host_memory_bytes())
    return error(errc::out_of_memory,
                 "evaluate_reference: the graph needs about " +
                     (need == saturated ? std::string("2^63 or more") : std::to_string(need)) + " bytes of host memory (every node's value plus double-precision scratch), this host has " +
                     std::to_string(host_memory_bytes()) +
                     (biggest ? "; the largest node is " + detail::label(*biggest) + " " + to_string(biggest->type) +
                                    " " + biggest->dims.to_string()
                              : std::string()));
  return {};
}

expected<std::vector<host_tensor>> evaluate_all(const graph& g, const std::vector<host_tensor>& inputs,
                                                const std::function<bool()>* stop, reference_state* state = nullptr) {
  if (auto e = check_inputs(g, inputs)) return e;
  if (auto e = check_reference_memory(g)) return e;
  std::vector<host_tensor> val(g.size());
  for (std::size_t k = 0; k < g.inputs().size(); ++k) val[static_cast<std::size_t>(g.inputs()[k])] = inputs[k];
  const node* current = nullptr;
  try {
    for (const node& n : g.nodes()) {
      current = &n;
      if (stop && (*stop)()) return stopped();
      const auto id = static_cast<std::size_t>(n.id);
      std::vector<const host_tensor*> in;
      for (node_id i : n.inputs) in.push_back(&val[static_cast<std::size_t>(i)]);
      if (n.is_view()) {
        // views read the storage buffer (always a non-view node, already computed)
        val[id] = materialise_view(n, val[static_cast<std::size_t>(n.storage)]);
        continue;
      }
      switch (n.op) {
        case op_kind::input: break;
        case op_kind::weight: {
          auto w = read_all(*n.data);
          if (!w) return error(w.err().code, "weight '" + n.name + "' (" + n.data->origin() + "): " + w.err().message);
          val[id] = std::move(*w);
          break;
        }
        case op_kind::matmul:
          val[id] = eval_matmul(n, *in[0], *in[1], stop);
          if (stop && (*stop)()) return stopped();
          break;
        case op_kind::add:
        case op_kind::mul: val[id] = eval_binary(n, *in[0], *in[1]); break;
        case op_kind::scale:
        case op_kind::gelu:
        case op_kind::silu: val[id] = eval_unary(n, *in[0]); break;
        case op_kind::rms_norm:
        case op_kind::layer_norm: val[id] = eval_norm(n, in); break;
        case op_kind::softmax: val[id] = eval_softmax(n, *in[0]); break;
        case op_kind::argmax: val[id] = eval_argmax(n, *in[0]); break;
        case op_kind::range_mask: val[id] = eval_range_mask(n, *in[0], *in[1]); break;
        case op_kind::rope: val[id] = eval_rope(n, *in[0], *in[1]); break;
        case op_kind::get_rows: {
          auto r = eval_get_rows(n, *in[0], *in[1]);
          if (!r) return r.err();
          val[id] = std::move(*r);
          break;
        }
        case op_kind::concat: val[id] = eval_concat(n, in); break;
        case op_kind::copy: val[id] = eval_copy(n, *in[0]); break;
        case op_kind::all_reduce:
        case op_kind::reduce_scatter: val[id] = eval_reduce(n, in); break;
        case op_kind::all_gather: val[id] = eval_all_gather(n, in); break;
        case op_kind::store_rows: val[id] = eval_store_rows(n, *in[0], *in[1], state); break;
        case op_kind::reshape:
        case op_kind::view:
        case op_kind::permute:
        case op_kind::transpose:
        case op_kind::slice:
          // a view whose storage is itself (cannot happen in a validated graph)
          return detail::node_error(errc::internal, n, "view without a storage node");
      }
    }
  } catch (const std::exception& e) {
    // allocation failures (bad_alloc, length_error): an error, never an exception
    return current ? detail::node_error(errc::out_of_memory, *current,
                                        std::string("evaluate_reference: ") + e.what() + " while evaluating it (" +
                                            to_string(current->type) + " " + current->dims.to_string() + ")")
                   : error(errc::out_of_memory, std::string("evaluate_reference: ") + e.what());
  }
  return val;
}

expected<std::vector<host_tensor>> outputs_of(const graph& g, expected<std::vector<host_tensor>> all) {
  if (!all) return all.err();
  std::vector<host_tensor> out;
  out.reserve(g.outputs().size());
  for (node_id o : g.outputs()) out.push_back((*all)[static_cast<std::size_t>(o)]);
  return out;
}

}  // namespace

expected<std::vector<host_tensor>> evaluate_reference_all(const graph& g, const std::vector<host_tensor>& inputs) {
  return evaluate_all(g, inputs, nullptr);
}

expected<std::vector<host_tensor>> evaluate_reference(const graph& g, const std::vector<host_tensor>& inputs) {
  return outputs_of(g, evaluate_all(g, inputs, nullptr));
}

expected<std::vector<host_tensor>> evaluate_reference(const graph& g, const std::vector<host_tensor>& inputs,
                                                      const std::function<bool()>& stop) {
  return outputs_of(g, evaluate_all(g, inputs, &stop));
}

expected<std::vector<host_tensor>> evaluate_reference(const graph& g, const std::vector<host_tensor>& inputs,
                                                      reference_state& state) {
  return outputs_of(g, evaluate_all(g, inputs, nullptr, &state));
}

}  // namespace ag
