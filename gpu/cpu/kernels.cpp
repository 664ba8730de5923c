#include "gpu/cpu/kernels.hpp"

#include "gpu/cpu/bf16_gemm.hpp"
#include "gpu/cpu/few_rows.hpp"
#include "gpu/cpu/thread_team.hpp"
#include "gpu/cpu/vector_math.hpp"
#include "graph/attention_mask.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#ifdef ACTORGRAPH_HAVE_BLAS
#include <cblas.h>
#endif

namespace ag::gpu::cpu {

namespace {

// A tensor padded to rank 4 (right-aligned: leading dims 1, stride 0), so
// every kernel loops over the same three outer dims and one inner dim.
struct nd {
  std::byte* p = nullptr;
  dtype t = dtype::f32;
  int64_t d[4] = {1, 1, 1, 1};
  int64_t s[4] = {0, 0, 0, 0};

  int64_t off(int64_t i0, int64_t i1, int64_t i2) const { return i0 * s[0] + i1 * s[1] + i2 * s[2]; }
};

nd pad(const tensor_arg& a) {
  nd r;
  r.p = static_cast<std::byte*>(a.data);
  r.t = a.type;
  const int rank = a.dims.rank();
  for (int k = 0; k < rank; ++k) {
    r.d[4 - rank + k] = a.dims[k];
    r.s[4 - rank + k] = a.stride[static_cast<std::size_t>(k)];
  }
  return r;
}

// `a` broadcast onto `out` (right-aligned; size-1 dims get stride 0).
nd broadcast(const tensor_arg& a, const nd& out) {
  nd r = pad(a);
  for (int k = 0; k < 4; ++k)
    if (r.d[k] == 1 && out.d[k] != 1) {
      r.d[k] = out.d[k];
      r.s[k] = 0;
    }
  return r;
}

void load_row(const nd& x, int64_t off, int64_t n, float* buf) {
  const int64_t st = x.s[3];
  switch (x.t) {
    case dtype::f32: {
      const float* p = reinterpret_cast<const float*>(x.p) + off;
      if (st == 1) std::memcpy(buf, p, static_cast<std::size_t>(n) * 4);
      else for (int64_t i = 0; i < n; ++i) buf[i] = p[i * st];
      break;
    }
    case dtype::f16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(x.p) + off;
      for (int64_t i = 0; i < n; ++i) buf[i] = half_to_float(p[i * st]);
      break;
    }
    case dtype::bf16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(x.p) + off;
      if (st == 1) {
        for (int64_t i = 0; i < n; ++i) buf[i] = bf16_to_float(p[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) buf[i] = bf16_to_float(p[i * st]);
      }
      break;
    }
    case dtype::i32: {
      const int32_t* p = reinterpret_cast<const int32_t*>(x.p) + off;
      for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(p[i * st]);
      break;
    }
  }
}

int32_t to_i32(float v) {
  // Truncation toward zero, saturating, nan -> 0 (graph/reference.hpp).
  if (std::isnan(v)) return 0;
  if (v >= 2147483647.0f) return std::numeric_limits<int32_t>::max();
  if (v <= -2147483648.0f) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(v);
}

void store_row(const nd& y, int64_t off, int64_t n, const float* buf) {
  const int64_t st = y.s[3];
  switch (y.t) {
    case dtype::f32: {
      float* p = reinterpret_cast<float*>(y.p) + off;
      if (st == 1) std::memcpy(p, buf, static_cast<std::size_t>(n) * 4);
      else for (int64_t i = 0; i < n; ++i) p[i * st] = buf[i];
      break;
    }
    case dtype::f16: {
      uint16_t* p = reinterpret_cast<uint16_t*>(y.p) + off;
      for (int64_t i = 0; i < n; ++i) p[i * st] = float_to_half(buf[i]);
      break;
    }
    case dtype::bf16: {
      uint16_t* p = reinterpret_cast<uint16_t*>(y.p) + off;
      if (st == 1) {
        // float_to_bf16 without its branch, so that the loop vectorises (a
        // prefill's outputs: 11% of its time as the scalar loop).
        for (int64_t i = 0; i < n; ++i) {
          uint32_t u;
          std::memcpy(&u, buf + i, 4);
          const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
          p[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) p[i * st] = float_to_bf16(buf[i]);
      }
      break;
    }
    case dtype::i32: {
      int32_t* p = reinterpret_cast<int32_t*>(y.p) + off;
      for (int64_t i = 0; i < n; ++i) p[i * st] = to_i32(buf[i]);
      break;
    }
  }
}

int32_t load_i32(const nd& x, int64_t off) {
  int32_t v;
  std::memcpy(&v, x.p + off * 4, 4);
  return v;
}

// Calls f(i0, i1, i2) for every row of `out`.
template <class F>
void for_rows(const nd& out, F&& f) {
  for (int64_t i0 = 0; i0 < out.d[0]; ++i0)
    for (int64_t i1 = 0; i1 < out.d[1]; ++i1)
      for (int64_t i2 = 0; i2 < out.d[2]; ++i2) f(i0, i1, i2);
}

// part(first, end) over ranges of [0, count) of independent items touching
// `bytes` in all, spread over `threads` (run_parts): one range where there is
// a single thread or too little to share (a helper's wake-up costs
// microseconds), else about four a thread, so that a helper woken late still
// finds some; each range holds at least `min_items` (but the only one) and
// starts at a multiple of `align`. An item is one thread's work from start to
// end, so the result does not depend on the split. A part that throws (its
// scratch cannot be allocated) stops nothing else; the first exception is
// rethrown here, on the calling thread, once every part is done (one
// leaving a helper thread would end the process).
template <class F>
void for_item_ranges(int64_t count, int64_t bytes, int threads, int64_t min_items, int64_t align, F&& part) {
  constexpr int64_t share_min_bytes = 256 << 10;
  const int parts = threads <= 1 || bytes < share_min_bytes
                        ? 1
                        : static_cast<int>(std::clamp<int64_t>(count / min_items, 1, 4 * static_cast<int64_t>(threads)));
  const auto edge = [&](int j) { return j == parts ? count : count * j / parts / align * align; };
  std::mutex m;
  std::exception_ptr thrown;
  run_parts(parts, threads, [&](int i) {
    try {
      if (edge(i + 1) > edge(i)) part(edge(i), edge(i + 1));
    } catch (...) {
      std::lock_guard<std::mutex> lk(m);
      if (!thrown) thrown = std::current_exception();
    }
  });
  if (thrown) std::rethrow_exception(thrown);
}

// The rows of `out` (its three outer dims) in ranges over `threads`, each
// row one thread's: part(first, end) of the flattened row index, which
// rows_in() walks. `bytes`: what the op reads and writes in all.
template <class F>
void for_row_ranges(const nd& out, int64_t bytes, int threads, F&& part) {
  for_item_ranges(out.d[0] * out.d[1] * out.d[2], bytes, threads, 1, 1, part);
}

// f(i0, i1, i2) for the rows [first, end) of `out` in for_row_ranges' order.
template <class F>
void rows_in(const nd& out, int64_t first, int64_t end, F&& f) {
  for (int64_t r = first; r < end; ++r) f(r / (out.d[1] * out.d[2]), r / out.d[2] % out.d[1], r % out.d[2]);
}

// What an op over whole rows touches: its output and inputs of `out`'s size.
int64_t row_op_bytes(const nd& out, int operands) {
  return out.d[0] * out.d[1] * out.d[2] * out.d[3] * static_cast<int64_t>(dtype_size(out.t)) * operands;
}

std::string label(const op_launch& l) {
  return "op '" + l.op->name + "' (" + to_string(l.op->op) + ")";
}

error bad(errc c, const op_launch& l, const std::string& what) {
  return error(c, label(l) + ": " + what, -1, -1, l.op ? l.op->name : std::string{});
}

// --- ops -------------------------------------------------------------------

void run_unary(const op_launch& l, int threads) {
  const nd out = pad(l.out);
  const nd x = pad(l.inputs[0]);
  const int64_t n = out.d[3];
  const op_attrs& at = l.op->attrs;
  const op_kind k = l.op->op;
  for_row_ranges(out, row_op_bytes(out, 2), threads, [&](int64_t first, int64_t end) {
    std::vector<float> buf(static_cast<std::size_t>(n));
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      load_row(x, x.off(i0, i1, i2), n, buf.data());
      switch (k) {
        case op_kind::scale: for (auto& v : buf) v *= at.scale; break;
        case op_kind::gelu:
          if (at.gelu == gelu_mode::tanh) gelu_tanh_in_place(buf.data(), n);
          else for (auto& v : buf) v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
          break;
        case op_kind::silu: silu_in_place(buf.data(), n); break;
        default: break;  // copy: the cast happens in store_row
      }
      store_row(out, out.off(i0, i1, i2), n, buf.data());
    });
  });
}

// out = x, cast to out's dtype; rows in ranges over `threads` (a prefill's
// logits cast to f32: 16 M elements).
void copy_strided(const nd& x, const nd& out, int threads = 1) {
  const int64_t n = out.d[3];
  if (x.t == out.t) {
    // Same dtype: move the bits (exact for i32 and nan payloads).
    const std::size_t es = dtype_size(out.t);
    for_row_ranges(out, row_op_bytes(out, 2), threads, [&](int64_t first, int64_t end) {
      rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
        const std::byte* src = x.p + x.off(i0, i1, i2) * static_cast<int64_t>(es);
        std::byte* dst = out.p + out.off(i0, i1, i2) * static_cast<int64_t>(es);
        if (x.s[3] == 1 && out.s[3] == 1) {
          std::memcpy(dst, src, static_cast<std::size_t>(n) * es);
        } else {
          for (int64_t i = 0; i < n; ++i)
            std::memcpy(dst + i * out.s[3] * static_cast<int64_t>(es), src + i * x.s[3] * static_cast<int64_t>(es), es);
        }
      });
    });
    return;
  }
  for_row_ranges(out, row_op_bytes(out, 2), threads, [&](int64_t first, int64_t end) {
    std::vector<float> buf(static_cast<std::size_t>(n));
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      load_row(x, x.off(i0, i1, i2), n, buf.data());
      store_row(out, out.off(i0, i1, i2), n, buf.data());
    });
  });
}

void run_binary(const op_launch& l, int threads) {
  const nd out = pad(l.out);
  const nd a = broadcast(l.inputs[0], out);
  const nd b = broadcast(l.inputs[1], out);
  const int64_t n = out.d[3];
  const bool add = l.op->op == op_kind::add;
  for_row_ranges(out, row_op_bytes(out, 3), threads, [&](int64_t first, int64_t end) {
    std::vector<float> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      load_row(a, a.off(i0, i1, i2), n, x.data());
      load_row(b, b.off(i0, i1, i2), n, y.data());
      if (add) for (int64_t i = 0; i < n; ++i) x[i] += y[i];
      else for (int64_t i = 0; i < n; ++i) x[i] *= y[i];
      store_row(out, out.off(i0, i1, i2), n, x.data());
    });
  });
}

void run_norm(const op_launch& l, int threads) {
  const nd out = pad(l.out);
  const nd x = pad(l.inputs[0]);
  const int64_t n = out.d[3];
  std::vector<float> w, b;
  if (l.inputs.size() > 1) {
    w.resize(static_cast<std::size_t>(n));
    load_row(pad(l.inputs[1]), 0, n, w.data());
  }
  if (l.inputs.size() > 2) {
    b.resize(static_cast<std::size_t>(n));
    load_row(pad(l.inputs[2]), 0, n, b.data());
  }
  const double eps = l.op->attrs.eps;
  const bool rms = l.op->op == op_kind::rms_norm;
  for_row_ranges(out, row_op_bytes(out, 2), threads, [&](int64_t first, int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(n));
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      load_row(x, x.off(i0, i1, i2), n, row.data());
      // Statistics in double: cheap, and keeps long rows as accurate as the reference.
      if (rms) {
        double ss = 0;
        for (float v : row) ss += static_cast<double>(v) * v;
        const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
        for (int64_t i = 0; i < n; ++i) row[i] = row[i] * inv * (w.empty() ? 1.0f : w[i]);
      } else {
        double mean = 0;
        for (float v : row) mean += v;
        mean /= static_cast<double>(n);
        double var = 0;
        for (float v : row) var += (v - mean) * (v - mean);
        var /= static_cast<double>(n);
        const double inv = 1.0 / std::sqrt(var + eps);
        for (int64_t i = 0; i < n; ++i)
          row[i] = static_cast<float>((row[i] - mean) * inv) * (w.empty() ? 1.0f : w[i]) +
                   (b.empty() ? 0.0f : b[i]);
      }
      store_row(out, out.off(i0, i1, i2), n, row.data());
    });
  });
}

// Softmax of row[j] * s over j < visible, in place; entries from `visible`
// to n are 0 (masked probabilities are exactly 0; a row that sees no key is
// all 0).
void softmax_row(float* row, int64_t n, int64_t visible, float s) {
  const int64_t seen = std::clamp<int64_t>(visible, 0, n);
  const float mx = max_scaled(row, seen, s);
  const double sum = exp_shifted_sum(row, seen, s, mx);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < seen; ++j) row[j] *= inv;
  std::fill(row + seen, row + n, 0.0f);
}

// Keys row i of a causal softmax over [sq, sk] sees: j <= i + (sk - sq).
int64_t causal_visible(int64_t i, int64_t sq, int64_t sk) { return std::min(sk, i + (sk - sq) + 1); }

void run_softmax(const op_launch& l, int threads) {
  const nd out = pad(l.out);
  const nd x = pad(l.inputs[0]);
  const int64_t sk = out.d[3], sq = out.d[2];
  const float s = l.op->attrs.scale;
  const bool causal = l.op->attrs.causal;
  for_row_ranges(out, row_op_bytes(out, 2), threads, [&](int64_t first, int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(sk));
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      load_row(x, x.off(i0, i1, i2), sk, row.data());
      softmax_row(row.data(), sk, causal ? causal_visible(i2, sq, sk) : sk, s);
      store_row(out, out.off(i0, i1, i2), sk, row.data());
    });
  });
}

void run_argmax(const op_launch& l, int threads) {
  const nd out = pad(l.out);  // [.., 1] i32
  const nd x = pad(l.inputs[0]);
  const int64_t n = x.d[3];
  // The rows over the threads (a prefill's logits: hundreds of rows of the vocabulary).
  for_row_ranges(out, out.d[0] * out.d[1] * out.d[2] * n * static_cast<int64_t>(dtype_size(x.t)), threads,
                 [&](int64_t first, int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(n));
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      load_row(x, x.off(i0, i1, i2), n, row.data());
      const int64_t best = first_argmax(row.data(), n);  // -1: all NaN
      const auto v = static_cast<int32_t>(best < 0 ? 0 : best);
      std::memcpy(out.p + out.off(i0, i1, i2) * 4, &v, 4);
    });
  });
}

void run_range_mask(const op_launch& l, int threads) {
  const nd out = pad(l.out);  // [T, C]
  const nd keys = pad(l.inputs[0]), ranges = pad(l.inputs[1]);
  const int64_t C = out.d[3];
  for_row_ranges(out, row_op_bytes(out, 1), threads, [&](int64_t first, int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(C));
    rows_in(out, first, end, [&](int64_t, int64_t, int64_t i) {
      const int32_t lo = load_i32(ranges, i * ranges.s[2]), hi = load_i32(ranges, i * ranges.s[2] + ranges.s[3]);
      for (int64_t c = 0; c < C; ++c) {
        const int32_t p = load_i32(keys, c * keys.s[3]);
        row[static_cast<std::size_t>(c)] = p >= lo && p <= hi ? 0.0f : attention_hidden_score;
      }
      store_row(out, out.off(0, 0, i), C, row.data());
    });
  });
}

void run_rope(const op_launch& l, int threads) {
  const nd out = pad(l.out);  // [B, S, H, D]
  const nd x = pad(l.inputs[0]);
  const nd pos = pad(l.inputs[1]);
  const int64_t d = out.d[3], half = d / 2;
  const bool neox = l.op->attrs.rope == rope_mode::neox;
  // Inverse frequencies once per op; angles in double (positions in the
  // thousands would lose the angle's low bits in float).
  std::vector<double> inv(static_cast<std::size_t>(half));
  rope_frequencies(l.op->attrs.theta, l.op->attrs.rope_scale, d, inv.data());
  for_row_ranges(out, row_op_bytes(out, 2), threads, [&](int64_t first, int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(d)), res(static_cast<std::size_t>(d));
    std::vector<float> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
    int64_t cached_s = -1;
    rows_in(out, first, end, [&](int64_t i0, int64_t i1, int64_t i2) {
      if (i1 != cached_s) {  // the position's angles, once per run of its heads
        const double p = load_i32(pos, i1 * pos.s[3]);
        for (int64_t i = 0; i < half; ++i) {
          cs[i] = static_cast<float>(std::cos(p * inv[i]));
          sn[i] = static_cast<float>(std::sin(p * inv[i]));
        }
        cached_s = i1;
      }
      load_row(x, x.off(i0, i1, i2), d, row.data());
      for (int64_t i = 0; i < half; ++i) {
        const int64_t p = neox ? i : 2 * i, q = neox ? i + half : 2 * i + 1;
        res[p] = row[p] * cs[i] - row[q] * sn[i];
        res[q] = row[p] * sn[i] + row[q] * cs[i];
      }
      store_row(out, out.off(i0, i1, i2), d, res.data());
    });
  });
}

error run_get_rows(const op_launch& l) {
  const nd out = pad(l.out);  // [.., D] with the ids' dims in front
  const tensor_arg& table = l.inputs[0];
  const int64_t v = table.dims[0], d = table.dims[1];
  // A table shard (tensor parallelism, attrs.end > 0) holds rows [first,
  // first + v) of a vocabulary of attrs.end rows: ids elsewhere give zero rows.
  const bool shard = l.op->attrs.end > 0;
  const int64_t first = shard ? l.op->attrs.begin : 0;
  const int64_t rows = shard ? l.op->attrs.end : v;
  // ids padded to rank 3, aligned with out's three outer dims
  nd ids;
  ids.p = static_cast<std::byte*>(l.inputs[1].data);
  ids.t = dtype::i32;
  const int ir = l.inputs[1].dims.rank();
  for (int k = 0; k < ir; ++k) {
    ids.d[3 - ir + k] = l.inputs[1].dims[k];
    ids.s[3 - ir + k] = l.inputs[1].stride[static_cast<std::size_t>(k)];
  }
  // Check every id before writing anything.
  for (int64_t i0 = 0; i0 < out.d[0]; ++i0)
    for (int64_t i1 = 0; i1 < out.d[1]; ++i1)
      for (int64_t i2 = 0; i2 < out.d[2]; ++i2) {
        const int32_t id = load_i32(ids, ids.off(i0, i1, i2));
        if (id < 0 || id >= rows)
          return bad(errc::invalid_argument, l,
                     "id " + std::to_string(id) + " at index " +
                         std::to_string((i0 * out.d[1] + i1) * out.d[2] + i2) + " is outside [0, " +
                         std::to_string(rows) + ")");
      }
  nd row_src = pad(table);  // row r of the table = offset r * stride[0]
  nd one_row = row_src;
  one_row.s[3] = table.stride[1];
  std::vector<float> buf(static_cast<std::size_t>(d));
  const std::size_t es = dtype_size(table.type);
  for_rows(out, [&](int64_t i0, int64_t i1, int64_t i2) {
    const int64_t id = load_i32(ids, ids.off(i0, i1, i2));
    const int64_t dst = out.off(i0, i1, i2);
    if (id < first || id >= first + v) {
      std::fill(buf.begin(), buf.end(), 0.0f);
      store_row(out, dst, d, buf.data());
      return;
    }
    const int64_t src = (id - first) * table.stride[0];
    if (table.type == out.t && one_row.s[3] == 1 && out.s[3] == 1) {
      std::memcpy(out.p + dst * static_cast<int64_t>(es), one_row.p + src * static_cast<int64_t>(es),
                  static_cast<std::size_t>(d) * es);
    } else {
      load_row(one_row, src, d, buf.data());
      store_row(out, dst, d, buf.data());
    }
  });
  return {};
}

void run_concat(const op_launch& l) {
  const nd out = pad(l.out);
  const int axis = l.op->attrs.axis < 0 ? l.op->attrs.axis + l.out.dims.rank() : l.op->attrs.axis;
  const int pa = axis + (4 - l.out.dims.rank());
  int64_t at = 0;
  for (const auto& in : l.inputs) {
    const nd x = pad(in);
    nd part = out;
    for (int k = 0; k < 4; ++k) part.d[k] = x.d[k];
    part.p = out.p + at * out.s[pa] * static_cast<int64_t>(dtype_size(out.t));
    copy_strided(x, part);
    at += x.d[pa];
  }
}

// store_rows: row i of the rows along the axis goes to index positions[i] of
// the state (out), one strided slice copy per row; positions outside the
// state are skipped. The rest of the state keeps its bytes.
void run_store_rows(const op_launch& l) {
  const nd out = pad(l.out);
  const nd rows = pad(l.inputs[0]);
  const int pa = l.op->attrs.axis + (4 - l.out.dims.rank());
  const tensor_arg& pos = l.inputs[1];
  const auto* p = static_cast<const int32_t*>(pos.data);
  const std::size_t es = dtype_size(out.t);
  for (int64_t i = 0; i < rows.d[pa]; ++i) {
    const int64_t at = p[i * pos.stride[0]];
    if (at < 0 || at >= out.d[pa]) continue;
    nd src = rows, dst = out;
    src.d[pa] = dst.d[pa] = 1;
    src.p = rows.p + i * rows.s[pa] * static_cast<int64_t>(dtype_size(rows.t));
    dst.p = out.p + at * out.s[pa] * static_cast<int64_t>(es);
    copy_strided(src, dst);
  }
}

// --- matmul ----------------------------------------------------------------

// A rows x cols matrix with element strides (rs, cs) as BLAS sees it.
struct mat_ref {
  const float* p = nullptr;
  bool trans = false;
  int64_t ld = 0;
};

// Direct use of an f32 matrix when its layout is row-major (cs == 1) or
// column-major (rs == 1) with a valid leading dimension.
bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool& trans, int64_t& ld) {
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= std::max<int64_t>(cols, 1))) {
    trans = false;
    ld = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    return true;
  }
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= std::max<int64_t>(rows, 1))) {
    trans = true;
    ld = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    return true;
  }
  return false;
}

// f(first, end) over ranges of [0, lines), independent lines (columns of a
// product, rows of a conversion) reading `bytes` in all (for_item_ranges),
// each range at least 32 lines and starting at a multiple of 16.
template <class F>
void for_line_ranges(int64_t lines, int64_t bytes, int threads, F&& f) {
  for_item_ranges(lines, bytes, threads, 32, 16, f);
}

// Float scratch of a kernel (an operand converted to f32, a product's f32
// result) that stays with the thread that used it: the thread's next op
// reuses pages it already touched. Fresh blocks cost a bf16 prefill about a
// tenth of its time (glibc maps every block over 32 MiB anew, and the
// kernel zeroes each page on its first touch). Uninitialised. A thread keeps
// at most scratch_keep_bytes of released blocks; a larger block is freed
// when released.
class scratch {
 public:
  static constexpr std::size_t scratch_keep_bytes = std::size_t{256} << 20;

  scratch() = default;
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() { release(); }

  // At least n floats: the block this object holds when it fits (what was
  // written there stays), else another one (uninitialised).
  float* reserve(std::size_t n) {
    if (n <= size_) return block_.get();
    release();
    auto& kept = cache();
    // The smallest kept block that fits, else a new one.
    auto best = kept.blocks.end();
    for (auto it = kept.blocks.begin(); it != kept.blocks.end(); ++it)
      if (it->second >= n && (best == kept.blocks.end() || it->second < best->second)) best = it;
    if (best != kept.blocks.end()) {
      block_ = std::move(best->first);
      size_ = best->second;
      kept.bytes -= size_ * sizeof(float);
      kept.blocks.erase(best);
    } else {
      block_.reset(new float[n]);
      size_ = n;
    }
    return block_.get();
  }

 private:
  struct kept_blocks {
    std::vector<std::pair<std::unique_ptr<float[]>, std::size_t>> blocks;
    std::size_t bytes = 0;
  };
  static kept_blocks& cache() {
    thread_local kept_blocks k;
    return k;
  }
  void release() noexcept {
    if (!block_) return;
    auto& kept = cache();
    const std::size_t bytes = size_ * sizeof(float);
    if (bytes > scratch_keep_bytes) {  // never kept: the kept ones stay
      block_.reset();
      size_ = 0;
      return;
    }
    // Room made by dropping the smallest kept blocks first (the large ones
    // are the expensive ones to map again).
    while (kept.bytes + bytes > scratch_keep_bytes && !kept.blocks.empty()) {
      auto smallest = std::min_element(kept.blocks.begin(), kept.blocks.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
      kept.bytes -= smallest->second * sizeof(float);
      kept.blocks.erase(smallest);
    }
    if (kept.bytes + bytes <= scratch_keep_bytes) {
      try {
        kept.blocks.emplace_back(std::move(block_), size_);
        kept.bytes += bytes;
      } catch (...) {  // no room to remember it: freed below
      }
    }
    block_.reset();
    size_ = 0;
  }

  std::unique_ptr<float[]> block_;
  std::size_t size_ = 0;
};

// Packs (or references) one operand; reuses the packed copy when the same
// source is asked for again (a weight broadcast over batches).
class operand {
 public:
  mat_ref get(const std::byte* base, dtype t, int64_t off, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
              int threads) {
    mat_ref m;
    if (t == dtype::f32 && blas_layout(rows, cols, rs, cs, m.trans, m.ld)) {
      m.p = reinterpret_cast<const float*>(base) + off;
      return m;
    }
    // Converted to f32 in the order it lies in memory: a matrix of contiguous
    // columns (a weight [out, in] used transposed) column by column, handed
    // to BLAS transposed. Gathering it row by row read every element a
    // column's stride apart (a bf16 LLaMA prefill spent 67% of its time there).
    bool by_columns = false;
    int64_t ld = 0;
    const bool contiguous = blas_layout(rows, cols, rs, cs, by_columns, ld);
    by_columns = contiguous && by_columns && rows > 1;
    if (!(packed_ && off == last_off_)) {
      float* buf = buf_.reserve(static_cast<std::size_t>(rows * cols));
      nd src;
      src.p = const_cast<std::byte*>(base);
      src.t = t;
      src.s[3] = by_columns ? rs : cs;
      // The lines (columns or rows) in ranges over the stream's threads.
      const int64_t lines = by_columns ? cols : rows, length = by_columns ? rows : cols;
      const int64_t step = by_columns ? cs : rs;
      for_line_ranges(lines, rows * cols * static_cast<int64_t>(dtype_size(t)), threads, [&](int64_t first, int64_t end) {
        for (int64_t c = first; c < end; ++c) load_row(src, off + c * step, length, buf + c * length);
      });
      packed_ = true;
      last_off_ = off;
    }
    m.p = buf_.reserve(static_cast<std::size_t>(rows * cols));  // the block packed above
    m.trans = by_columns;
    m.ld = by_columns ? rows : std::max<int64_t>(cols, 1);
    return m;
  }

 private:
  scratch buf_;
  bool packed_ = false;
  int64_t last_off_ = -1;
};

void run_matmul(const op_launch& l, int threads, int parts) {
  const nd out = pad(l.out);
  nd a = pad(l.inputs[0]), b = pad(l.inputs[1]);
  for (int k = 0; k < 2; ++k) {  // batch broadcast
    if (a.d[k] == 1) a.s[k] = 0;
    if (b.d[k] == 1) b.s[k] = 0;
  }
  const bool ta = l.op->attrs.trans_a, tb = l.op->attrs.trans_b;
  const int64_t m = out.d[2], n = out.d[3];
  const int64_t k = ta ? a.d[2] : a.d[3];
  // element strides of A (m, k) and B (k, n)
  const int64_t ars = ta ? a.s[3] : a.s[2], acs = ta ? a.s[2] : a.s[3];
  const int64_t brs = tb ? b.s[3] : b.s[2], bcs = tb ? b.s[2] : b.s[3];
  // A few rows (a decode step's token) against B read once in its own
  // dtype (gpu/cpu/few_rows.hpp) where B's rows or columns are contiguous;
  // BLAS's sgemm would pack all of B for them. One row of f32 goes to
  // BLAS's sgemv (gemm_f32).
  const bool few_rows = m <= few_rows_max && (brs == 1 || bcs == 1) && b.t != dtype::i32 &&
                        !(m == 1 && b.t == dtype::f32 && have_blas());
  bool c_trans = false;
  int64_t ldc = 0;
  const bool c_rows = blas_layout(m, n, out.s[2], out.s[3], c_trans, ldc) && !c_trans;  // C by rows, stride ldc
  const bool c_direct = out.t == dtype::f32 && c_rows;
  // Two bf16 operands on the bf16 units, rounded into a bf16 C by rows in place.
  const bool bf16_pair = a.t == dtype::bf16 && b.t == dtype::bf16 && !few_rows && k > 0;
  const bool bf16_in_place = bf16_pair && out.t == dtype::bf16 && c_rows;
  const int64_t es = static_cast<int64_t>(dtype_size(b.t));
  // Batches [first, end) of the flattened (i0, i1), with `column_threads`
  // for each batch's few-row product. Each range has its own scratch, so
  // ranges may run on different threads.
  auto batches = [&](int64_t first, int64_t end, int column_threads) {
    operand pa, pb;
    std::vector<float> a_rows;  // A's rows, when A is laid out by columns
    scratch cscratch;  // C in f32 where it is not written in place
    for (int64_t bi = first; bi < end; ++bi) {
      const int64_t i0 = bi / out.d[1], i1 = bi % out.d[1];
      const int64_t coff = out.off(i0, i1, 0);
      const auto* a16 = reinterpret_cast<const uint16_t*>(a.p) + a.off(i0, i1, 0);
      const auto* b16 = reinterpret_cast<const uint16_t*>(b.p) + b.off(i0, i1, 0);
      if (bf16_in_place &&
          bf16_gemm(m, n, k, a16, ars, acs, b16, brs, bcs, reinterpret_cast<uint16_t*>(out.p) + coff, true, ldc,
                    column_threads))
        continue;  // C written, rounded, in its place
      float* const cbuf = c_direct ? nullptr : cscratch.reserve(static_cast<std::size_t>(m * n));
      float* c = c_direct ? reinterpret_cast<float*>(out.p) + coff : cbuf;
      const int64_t ld = c_direct ? ldc : std::max<int64_t>(n, 1);
      if (k == 0) {
        for (int64_t r = 0; r < m; ++r) std::fill(c + r * ld, c + r * ld + n, 0.0f);
      } else if (few_rows) {
        const mat_ref am = pa.get(a.p, a.t, a.off(i0, i1, 0), m, k, ars, acs, column_threads);
        const float* arows = am.p;
        int64_t lda = am.ld;
        if (am.trans) {  // column-major A: its m rows gathered
          a_rows.resize(static_cast<std::size_t>(m * k));
          for (int64_t r = 0; r < m; ++r)
            for (int64_t p = 0; p < k; ++p) a_rows[static_cast<std::size_t>(r * k + p)] = am.p[p * am.ld + r];
          arows = a_rows.data();
          lda = k;
        }
        const std::byte* bp = b.p + b.off(i0, i1, 0) * es;
        // Ranges of columns over the threads: each element of C is one
        // thread's sum, in the same order whatever the split.
        for_line_ranges(n, n * k * es, column_threads, [&](int64_t c0, int64_t c1) {
          few_row_product(m, c1 - c0, k, arows, lda, bp + c0 * bcs * es, b.t, brs, bcs, c + c0, ld);
        });
      } else if (!(bf16_pair && bf16_gemm(m, n, k, a16, ars, acs, b16, brs, bcs, c, false, ld, column_threads))) {
        // Both operands in f32 for BLAS (a bf16 pair where bf16_gemm cannot run).
        const mat_ref am = pa.get(a.p, a.t, a.off(i0, i1, 0), m, k, ars, acs, column_threads);
        const mat_ref bm = pb.get(b.p, b.t, b.off(i0, i1, 0), k, n, brs, bcs, column_threads);
        gemm_f32(am.trans, bm.trans, m, n, k, 1.0f, am.p, am.ld, bm.p, bm.ld, 0.0f, c, ld, column_threads, parts);
      }
      if (!c_direct) {
        nd row = out;
        for (int64_t r = 0; r < m; ++r) store_row(row, coff + r * out.s[2], n, cbuf + r * n);
      }
    }
  };
  const int64_t count = out.d[0] * out.d[1];
  // At least as many batches as threads (attention: a head each) go a
  // batch to a thread, which wakes the helpers once per op instead of once
  // per head, and keeps each product whole (a prefill's 512 x 512 x 64
  // scores ran at 126 GFLOP/s split over two threads, one head at a time).
  if (threads > 1 && count >= threads)
    for_item_ranges(count, count * n * k * es, threads, 1, 1,
                    [&](int64_t first, int64_t end) { batches(first, end, 1); });
  else
    batches(0, count, threads);
}

// --- fused attention -------------------------------------------------------

// Query rows a task of the fused attention takes: its scores [rows, keys]
// stay in the core's cache, and a causal block computes at most this many
// rows' worth of keys past its rows' own (the diagonal's triangle). Blocks
// on the bf16 units are larger: each product there is a oneDNN call, whose
// few microseconds a 32-row block's product does not outweigh.
constexpr int64_t attention_rows_per_task = 32;
constexpr int64_t attention_rows_per_bf16_task = 64;

// The chain scores = q k^T [+ mask] -> softmax(* scale, causal) -> probs v
// (gpu::op_launch::attention_params) as one op: per batch entry and block
// of query rows, the keys the block can see, their scores in f32, the
// softmax of each row as run_softmax computes it, and the rows' sum of
// values. The products run on the CPU's bf16 units when q, k and v are bf16
// (bf16_gemm; the probabilities rounded to bf16 as the softmax op would
// store them), else through BLAS in f32; a decode step's few query rows
// (over a long cache) through few_row_product, reading k and v once in
// their dtype. The scores never leave the thread,
// and a causal block computes only the keys up to its last row's (a
// prefill's masked half is skipped), a masked one only up to the last its
// mask leaves visible (visible_end: a cache's rows past the sequence are
// never read). Tasks spread over the threads, each
// output row one task's: the same bits for any thread count.
void run_fused_attention(const op_launch& l, int threads) {
  const auto& at = l.attention;
  const nd q = pad(l.inputs[0]), k = pad(l.inputs[1]), v = pad(l.inputs[2]), out = pad(l.out);
  const nd mask = at.masked ? pad(l.inputs[3]) : nd{};
  const int64_t m_rows = q.d[2], dh = q.d[3], keys = k.d[2], S = at.softmax_rows;
  const int64_t batches = q.d[0] * q.d[1];
  const bool unit = q.s[3] == 1 && k.s[3] == 1 && v.s[3] == 1;
  const bool direct = q.t == dtype::f32 && k.t == dtype::f32 && v.t == dtype::f32 && unit;
  const bool bf16_units = q.t == dtype::bf16 && k.t == dtype::bf16 && v.t == dtype::bf16 && unit &&
                          bf16_gemm_available();
  const int64_t per_task = bf16_units ? attention_rows_per_bf16_task : attention_rows_per_task;
  // Decode-sized queries (a chain fused over a long cache, find_attention_fusions).
  const bool few = m_rows <= few_rows_max && unit;
  const int64_t k_size = static_cast<int64_t>(dtype_size(k.t)), v_size = static_cast<int64_t>(dtype_size(v.t));
  const int64_t blocks = (m_rows + per_task - 1) / per_task;
  // Keys softmax row i sees (before the mask).
  const auto visible = [&](int64_t i) { return at.causal ? causal_visible(i, S, keys) : keys; };
  const int64_t bytes = (q.d[0] * q.d[1] * (m_rows + 2 * keys) * dh) * static_cast<int64_t>(dtype_size(q.t));
  // One past the last key below `kv` that a mask row of batch b's rows
  // [m0, m0 + rows) leaves visible (above attention_hidden_limit, graph/
  // attention_mask.hpp): the keys past it are hidden from every row of the
  // block, so its products stop there (a generator's cache past its
  // sequence is never read). Each row's mask is scanned from its end down
  // to the best end so far; a row with nothing visible there is checked
  // from its first key up, and one that hides every key keeps all `kv`
  // (its softmax is over the hidden scores, as the reference's).
  const auto visible_end = [&](int64_t b, int64_t m0, int64_t rows, int64_t kv) {
    constexpr int64_t kPiece = 256;
    float piece[kPiece];
    const auto load = [&](int64_t i, int64_t lo, int64_t hi) {
      load_row(mask, mask.off(0, 0, i) + lo * mask.s[3], hi - lo, piece);
    };
    const auto hidden = [](float x) { return x <= attention_hidden_limit; };
    int64_t end = 0;
    for (int64_t m = m0; m < m0 + rows; ++m) {
      const int64_t i = (b * m_rows + m) % S, top = std::min(kv, visible(i));
      bool seen = false;
      for (int64_t hi = top; hi > end && !seen;) {
        const int64_t lo = std::max(end, hi - kPiece);
        load(i, lo, hi);
        int64_t n = hi - lo;
        while (n > 0 && hidden(piece[n - 1])) --n;
        if (n > 0) end = lo + n, seen = true;
        hi = lo;
      }
      for (int64_t lo = 0; lo < std::min(end, top) && !seen; lo += kPiece) {
        const int64_t hi = std::min({lo + kPiece, end, top});
        load(i, lo, hi);
        seen = std::any_of(piece, piece + (hi - lo), [&](float x) { return !hidden(x); });
      }
      if (!seen && top > 0) return kv;
    }
    return end;
  };
  for_item_ranges(batches * blocks, bytes, threads, 1, 1, [&](int64_t first, int64_t end) {
    std::vector<float> qf, kf, vf, scores, outf, mrow;
    std::vector<uint16_t> probs16;
    int64_t converted_batch = -1, converted_keys = 0;  // k and v rows already in kf / vf
    // Batch b's first kv rows of k and v in f32 (kf, vf), converting only
    // the rows the tasks before in this range did not.
    const auto keys_values_f32 = [&](int64_t b, int64_t i0, int64_t i1, int64_t kv) {
      if (converted_batch != b) converted_batch = b, converted_keys = 0;
      kf.resize(static_cast<std::size_t>(keys * dh));
      vf.resize(static_cast<std::size_t>(keys * dh));
      for (int64_t j = converted_keys; j < kv; ++j) {
        load_row(k, k.off(i0, i1, j), dh, kf.data() + j * dh);
        load_row(v, v.off(i0, i1, j), dh, vf.data() + j * dh);
      }
      converted_keys = std::max(converted_keys, kv);
    };
    for (int64_t task = first; task < end; ++task) {
      const int64_t b = task / blocks, m0 = task % blocks * per_task;
      const int64_t rows = std::min(per_task, m_rows - m0);
      const int64_t i0 = b / q.d[1], i1 = b % q.d[1];
      int64_t kv = 0;  // the keys any row of the block sees
      for (int64_t m = m0; m < m0 + rows; ++m) kv = std::max(kv, visible((b * m_rows + m) % S));
      if (at.masked) kv = visible_end(b, m0, rows, kv);
      outf.assign(static_cast<std::size_t>(rows * dh), 0.0f);
      if (kv > 0) {
        scores.resize(static_cast<std::size_t>(rows * kv));
        // A decode step's few rows: both products read k and v once in
        // their dtype (few_row_product), as the separate ops would.
        bool scored = false;
        if (few) {
          qf.resize(static_cast<std::size_t>(rows * dh));
          for (int64_t r = 0; r < rows; ++r) load_row(q, q.off(i0, i1, m0 + r), dh, qf.data() + r * dh);
          scored = few_row_product(rows, kv, dh, qf.data(), dh, k.p + k.off(i0, i1, 0) * k_size, k.t, 1, k.s[2],
                                   scores.data(), kv);
        }
        // scores = q k^T: on the bf16 units B is k read by columns
        const bool on_units =
            !scored && bf16_units &&
            bf16_gemm(rows, kv, dh, reinterpret_cast<const uint16_t*>(q.p) + q.off(i0, i1, m0), q.s[2], 1,
                      reinterpret_cast<const uint16_t*>(k.p) + k.off(i0, i1, 0), 1, k.s[2], scores.data(), false, kv,
                      1);
        if (!on_units && !scored) {
          if (direct) {
            gemm_f32(false, true, rows, kv, dh, 1.0f, reinterpret_cast<const float*>(q.p) + q.off(i0, i1, m0), q.s[2],
                     reinterpret_cast<const float*>(k.p) + k.off(i0, i1, 0), k.s[2], 0.0f, scores.data(), kv, 1, 1);
          } else {
            qf.resize(static_cast<std::size_t>(rows * dh));
            for (int64_t r = 0; r < rows; ++r) load_row(q, q.off(i0, i1, m0 + r), dh, qf.data() + r * dh);
            keys_values_f32(b, i0, i1, kv);
            gemm_f32(false, true, rows, kv, dh, 1.0f, qf.data(), dh, kf.data(), dh, 0.0f, scores.data(), kv, 1, 1);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = (b * m_rows + m0 + r) % S;
          float* row = scores.data() + r * kv;
          if (at.masked) {
            mrow.resize(static_cast<std::size_t>(kv));
            load_row(mask, mask.off(0, 0, i), kv, mrow.data());
            for (int64_t j = 0; j < kv; ++j) row[j] += mrow[static_cast<std::size_t>(j)];
          }
          softmax_row(row, kv, visible(i), at.scale);
        }
        bool summed = false;
        if (scored) {
          // The probabilities rounded to the dtype, as the softmax op stores them.
          if (v.t == dtype::bf16)
            for (float& x : scores) x = bf16_to_float(float_to_bf16(x));
          else if (v.t == dtype::f16)
            for (float& x : scores) x = half_to_float(float_to_half(x));
          summed = few_row_product(rows, dh, kv, scores.data(), kv, v.p + v.off(i0, i1, 0) * v_size, v.t, v.s[2], 1,
                                   outf.data(), dh);
        }
        if (on_units) {
          probs16.resize(static_cast<std::size_t>(rows * kv));
          for (std::size_t j = 0; j < probs16.size(); ++j) probs16[j] = float_to_bf16(scores[j]);
          summed = bf16_gemm(rows, dh, kv, probs16.data(), kv, 1,
                             reinterpret_cast<const uint16_t*>(v.p) + v.off(i0, i1, 0), v.s[2], 1, outf.data(), false,
                             dh, 1);
        }
        if (!summed) {  // v through BLAS in f32
          if (direct) {
            gemm_f32(false, false, rows, dh, kv, 1.0f, scores.data(), kv,
                     reinterpret_cast<const float*>(v.p) + v.off(i0, i1, 0), v.s[2], 0.0f, outf.data(), dh, 1, 1);
          } else {
            keys_values_f32(b, i0, i1, kv);
            gemm_f32(false, false, rows, dh, kv, 1.0f, scores.data(), kv, vf.data(), dh, 0.0f, outf.data(), dh, 1, 1);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) store_row(out, out.off(i0, i1, m0 + r), dh, outf.data() + r * dh);
    }
  });
}

error check_fused_attention(const op_launch& l) {
  const auto& at = l.attention;
  if (at.store_new_rows || at.rope_q || at.rope_k)
    return bad(errc::unsupported_op, l, "the cpu backend's fused attention takes no cache prologue");
  const std::size_t want = at.masked ? 4 : 3;
  if (l.inputs.size() != want)
    return bad(errc::invalid_argument, l, "fused attention got " + std::to_string(l.inputs.size()) +
                                              " inputs, needs " + std::to_string(want));
  for (std::size_t i = 0; i < want; ++i)
    if (!l.inputs[i].data || l.inputs[i].type != l.out.type || l.inputs[i].dims.rank() < 2)
      return bad(errc::invalid_argument, l, "fused attention input " + std::to_string(i) +
                                                " is null, of another dtype than the output, or of rank < 2");
  if (!l.out.data || !is_float(l.out.type)) return bad(errc::invalid_argument, l, "fused attention output");
  const shape &q = l.inputs[0].dims, &k = l.inputs[1].dims, &v = l.inputs[2].dims, &o = l.out.dims;
  const auto batch_of = [](const shape& x) { return x.numel() / std::max<int64_t>(1, x[-2] * x[-1]); };
  const int64_t S = at.softmax_rows;
  if (q.rank() > max_rank || k.rank() != q.rank() || v.rank() != q.rank() || o != q || k != v || k[-1] != q[-1] ||
      batch_of(k) != batch_of(q) || S < 1 || q[-2] % S != 0)
    return bad(errc::invalid_shape, l, "fused attention of q " + q.to_string() + ", k " + k.to_string() + ", v " +
                                           v.to_string() + " into " + o.to_string() + " (softmax rows " +
                                           std::to_string(S) + ")");
  if (at.masked && l.inputs[3].dims.numel() != S * k[-2])
    return bad(errc::invalid_shape, l, "fused attention mask " + l.inputs[3].dims.to_string() + " is not [" +
                                           std::to_string(S) + ", " + std::to_string(k[-2]) + "]");
  return {};
}

// --- checks ----------------------------------------------------------------

bool broadcasts(const shape& in, const shape& out) {
  if (in.rank() > out.rank()) return false;
  for (int i = 1; i <= in.rank(); ++i)
    if (in[-i] != 1 && in[-i] != out[-i]) return false;
  return true;
}

}  // namespace

error check_op(const op_launch& l) {
  if (!l.op) return error(errc::invalid_argument, "launch without an op");
  if (l.fused == op_launch::fusion::attention) return check_fused_attention(l);
  if (l.fused != op_launch::fusion::none)
    return bad(errc::unsupported_op, l, "the cpu backend runs no fused projections or decode steps");
  const node& nd_ = *l.op;
  const op_kind k = nd_.op;
  if (is_view_op(k) || is_leaf_op(k)) return {};
  if (is_collective_op(k))
    return bad(errc::unsupported_op, l, "a collective runs as a collective step, not as a kernel");
  std::size_t lo = 1, hi = 1;
  switch (k) {
    case op_kind::matmul: case op_kind::add: case op_kind::mul: case op_kind::rope:
    case op_kind::get_rows: case op_kind::store_rows: case op_kind::range_mask: lo = hi = 2; break;
    case op_kind::rms_norm: hi = 2; break;
    case op_kind::layer_norm: hi = 3; break;
    case op_kind::concat: hi = SIZE_MAX; break;
    default: break;
  }
  const std::size_t ni = l.inputs.size();
  if (ni < lo || ni > hi)
    return bad(errc::invalid_argument, l, "got " + std::to_string(ni) + " inputs, needs " + std::to_string(lo) +
                                              (hi == lo ? "" : hi == SIZE_MAX ? " or more" : ".." + std::to_string(hi)));
  if (l.out.dims != nd_.dims)
    return bad(errc::invalid_shape, l, "output is " + l.out.dims.to_string() + ", node is " + nd_.dims.to_string());
  if (l.out.type != nd_.type)
    return bad(errc::dtype_mismatch, l, std::string("output is ") + to_string(l.out.type) + ", node is " +
                                            to_string(nd_.type));
  if (!l.out.data) return bad(errc::invalid_argument, l, "output buffer is null");
  if (l.out.dims.rank() < 1 || l.out.dims.rank() > max_rank)
    return bad(errc::invalid_shape, l, "output rank " + std::to_string(l.out.dims.rank()));
  for (std::size_t i = 0; i < ni; ++i) {
    const auto& in = l.inputs[i];
    if (!in.data) return bad(errc::invalid_argument, l, "input " + std::to_string(i) + " buffer is null");
    if (in.dims.rank() > max_rank) return bad(errc::invalid_shape, l, "input " + std::to_string(i) + " rank > 4");
    const bool want_int =
        ((k == op_kind::rope || k == op_kind::get_rows || k == op_kind::store_rows) && i == 1) || k == op_kind::range_mask;
    // store_rows also keeps i32 rows (a token for the slot's next job).
    const bool any_type = k == op_kind::copy || (k == op_kind::store_rows && i == 0);
    if (want_int != (in.type == dtype::i32) && !any_type)
      return bad(errc::dtype_mismatch, l, "input " + std::to_string(i) + " is " + to_string(in.type));
  }
  const shape& o = l.out.dims;
  const shape& x = l.inputs[0].dims;
  switch (k) {
    case op_kind::matmul: {
      const shape& b = l.inputs[1].dims;
      if (x.rank() < 2 || b.rank() < 2 || o.rank() < 2)
        return bad(errc::invalid_shape, l, "operands need rank >= 2");
      const bool ta = nd_.attrs.trans_a, tb = nd_.attrs.trans_b;
      const int64_t m = ta ? x[-1] : x[-2], ka = ta ? x[-2] : x[-1];
      const int64_t kb = tb ? b[-1] : b[-2], n = tb ? b[-2] : b[-1];
      if (ka != kb || m != o[-2] || n != o[-1])
        return bad(errc::invalid_shape, l, "a " + x.to_string() + " x b " + b.to_string() + " does not give " +
                                               o.to_string());
      for (int i = 3; i <= o.rank(); ++i) {
        const int64_t da = i <= x.rank() ? x[-i] : 1, db = i <= b.rank() ? b[-i] : 1;
        if ((da != 1 && da != o[-i]) || (db != 1 && db != o[-i]))
          return bad(errc::invalid_shape, l, "batch dims of " + x.to_string() + " and " + b.to_string() +
                                                 " do not broadcast to " + o.to_string());
      }
      if (x.rank() > o.rank() || b.rank() > o.rank())
        return bad(errc::invalid_shape, l, "operand rank exceeds the output's");
      break;
    }
    case op_kind::add: case op_kind::mul:
      if (!broadcasts(x, o) || !broadcasts(l.inputs[1].dims, o))
        return bad(errc::invalid_shape, l, "inputs " + x.to_string() + ", " + l.inputs[1].dims.to_string() +
                                               " do not broadcast to " + o.to_string());
      break;
    case op_kind::scale: case op_kind::gelu: case op_kind::silu: case op_kind::softmax:
    case op_kind::copy:
      if (x != o) return bad(errc::invalid_shape, l, "input " + x.to_string() + " vs output " + o.to_string());
      break;
    case op_kind::argmax: {
      bool ok = x.rank() == o.rank() && o[-1] == 1 && x[-1] >= 1;
      for (int d = 0; ok && d + 1 < o.rank(); ++d) ok = x[d] == o[d];
      if (!ok) return bad(errc::invalid_shape, l, "input " + x.to_string() + " vs output " + o.to_string());
      if (l.out.type != dtype::i32) return bad(errc::dtype_mismatch, l, "output must be i32");
      break;
    }
    case op_kind::rms_norm: case op_kind::layer_norm:
      if (x != o) return bad(errc::invalid_shape, l, "input " + x.to_string() + " vs output " + o.to_string());
      for (std::size_t i = 1; i < ni; ++i)
        if (l.inputs[i].dims.numel() != o[-1] || l.inputs[i].dims.rank() != 1)
          return bad(errc::invalid_shape, l, (i == 1 ? "weight " : "bias ") + l.inputs[i].dims.to_string() +
                                                 " must be [" + std::to_string(o[-1]) + "]");
      break;
    case op_kind::rope:
      if (x != o || o.rank() < 3 || o[-1] % 2 != 0 || l.inputs[1].dims.numel() != o[-3])
        return bad(errc::invalid_shape, l, "x " + x.to_string() + ", positions " + l.inputs[1].dims.to_string() +
                                               ", output " + o.to_string());
      break;
    case op_kind::get_rows: {
      const shape& ids = l.inputs[1].dims;
      bool ok = x.rank() == 2 && ids.rank() <= 3 && o.rank() == ids.rank() + 1 && o[-1] == x[1];
      for (int i = 0; ok && i < ids.rank(); ++i) ok = ids[i] == o[i];
      if (!ok)
        return bad(errc::invalid_shape, l, "table " + x.to_string() + ", ids " + ids.to_string() + ", output " +
                                               o.to_string());
      if (x[0] > 0 && x[1] > 0 && l.inputs[0].stride[1] < 0)
        return bad(errc::invalid_argument, l, "negative table stride");
      break;
    }
    case op_kind::range_mask: {
      const shape& ranges = l.inputs[1].dims;
      if (x.rank() != 1 || ranges.rank() != 2 || ranges[1] != 2 || o.rank() != 2 || o[0] != ranges[0] || o[1] != x[0])
        return bad(errc::invalid_shape, l, "key_positions " + x.to_string() + ", query_ranges " + ranges.to_string() +
                                               ", output " + o.to_string() + " (needs [C], [T, 2], [T, C])");
      break;
    }
    case op_kind::store_rows: {
      const shape& pos = l.inputs[1].dims;
      const int axis = nd_.attrs.axis;
      bool ok = axis >= 0 && axis < o.rank() && x.rank() == o.rank() && pos.rank() == 1 && pos[0] == x[axis];
      for (int d = 0; ok && d < o.rank(); ++d) ok = d == axis || x[d] == o[d];
      if (!ok)
        return bad(errc::invalid_shape, l, "rows " + x.to_string() + ", positions " + pos.to_string() + ", state " +
                                               o.to_string() + " along axis " + std::to_string(axis));
      if (l.inputs[0].type != l.out.type)
        return bad(errc::dtype_mismatch, l, "rows dtype differs from the state's");
      break;
    }
    case op_kind::concat: {
      int axis = nd_.attrs.axis;
      if (axis < 0) axis += o.rank();
      if (axis < 0 || axis >= o.rank()) return bad(errc::invalid_argument, l, "axis out of range");
      int64_t sum = 0;
      for (std::size_t i = 0; i < ni; ++i) {
        const shape& s = l.inputs[i].dims;
        if (l.inputs[i].type != l.out.type)
          return bad(errc::dtype_mismatch, l, "input " + std::to_string(i) + " dtype differs from the output's");
        bool ok = s.rank() == o.rank();
        for (int d = 0; ok && d < o.rank(); ++d) ok = d == axis || s[d] == o[d];
        if (!ok) return bad(errc::invalid_shape, l, "input " + std::to_string(i) + " " + s.to_string() +
                                                        " does not fit output " + o.to_string());
        sum += s[axis];
      }
      if (sum != o[axis]) return bad(errc::invalid_shape, l, "inputs do not add up to the output along the axis");
      break;
    }
    default: break;
  }
  if (k != op_kind::copy && k != op_kind::get_rows && k != op_kind::concat && k != op_kind::argmax &&
      k != op_kind::store_rows && !is_float(l.out.type))
    return bad(errc::dtype_mismatch, l, "output must be a float type");
  return {};
}

error run_op(const op_launch& l, int threads, int parts) {
  if (error e = check_op(l)) return e;
  // Kernels run on backend worker threads: an exception there (a scratch
  // buffer the host cannot allocate) would terminate the process.
  try {
    if (l.fused == op_launch::fusion::attention) {
      run_fused_attention(l, threads);
      return {};
    }
    switch (l.op->op) {
      case op_kind::matmul: run_matmul(l, threads, parts); return {};
      case op_kind::add: case op_kind::mul: run_binary(l, threads); return {};
      case op_kind::scale: case op_kind::gelu: case op_kind::silu: run_unary(l, threads); return {};
      case op_kind::copy: copy_strided(pad(l.inputs[0]), pad(l.out), threads); return {};
      case op_kind::rms_norm: case op_kind::layer_norm: run_norm(l, threads); return {};
      case op_kind::softmax: run_softmax(l, threads); return {};
      case op_kind::argmax: run_argmax(l, threads); return {};
      case op_kind::range_mask: run_range_mask(l, threads); return {};
      case op_kind::rope: run_rope(l, threads); return {};
      case op_kind::get_rows: return run_get_rows(l);
      case op_kind::concat: run_concat(l); return {};
      case op_kind::store_rows: run_store_rows(l); return {};
      default: return {};  // views and leaves: nothing to compute
    }
  } catch (const std::bad_alloc&) {
    return bad(errc::out_of_memory, l, "the host could not allocate the kernel's scratch memory");
  } catch (const std::exception& e) {
    return bad(errc::internal, l, std::string("kernel threw: ") + e.what());
  }
}

void gemm_f32_fallback(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Pack op(B) row-major (k x n) once so the inner loop is unit-stride.
  std::vector<float> bp(static_cast<std::size_t>(k * n));
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) bp[p * n + j] = trans_b ? b[j * ldb + p] : b[p * ldb + j];
  std::vector<float> acc(static_cast<std::size_t>(n));
  constexpr int64_t kb = 256;  // a block of B rows stays in cache across a C row
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t p0 = 0; p0 < k; p0 += kb) {
      const int64_t p1 = std::min(k, p0 + kb);
      for (int64_t p = p0; p < p1; ++p) {
        const float av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const float* brow = bp.data() + p * n;
        for (int64_t j = 0; j < n; ++j) acc[j] += av * brow[j];
      }
    }
    float* crow = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) crow[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * crow[j]);
  }
}

#ifdef ACTORGRAPH_HAVE_BLAS
namespace {

// One BLAS call on the calling thread (BLAS runs single-threaded: the cpu
// device sets it so, and the team spreads the blocks).
void blas_gemm_block(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 1) {
    // One row (a decode step): sgemv reads B once; sgemm would pack all of
    // it first (2.3-2.5x slower for GPT-2's weights on the development
    // machine). c = alpha * op(B)^T a + beta * c; a's elements are a column
    // of A when A is transposed.
    if (beta == 0.0f) std::fill(c, c + n, 0.0f);  // "c need not be set" (NaNs in it must not survive)
    const int inc_a = trans_a ? static_cast<int>(lda) : 1;
    if (trans_b)  // B is n x k
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b,
                  static_cast<int>(ldb), a, inc_a, beta, c, 1);
    else  // B is k x n
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(k), static_cast<int>(n), alpha, b,
                  static_cast<int>(ldb), a, inc_a, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace
#endif

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads, int parts_wanted) {
#ifdef ACTORGRAPH_HAVE_BLAS
  const int64_t big = std::max({m, n, k, lda, ldb, ldc});
  if (big < INT_MAX) {
    // C in parts of columns where it is wide enough (each part packs A
    // again: small beside its columns of B), else of rows (each packs B
    // again), each part one BLAS call on one of up to `threads` threads.
    // How many parts is the caller's fixed `parts_wanted` (a device's share
    // of the machine) or the machine's, never `threads`: BLAS's sum for an
    // element can change with the cut (its sgemv by columns, its
    // small-matrix kernel for a thin part), so a fixed cut gives the same
    // bits for any thread count.
    constexpr int64_t column_align = 64, row_align = 16;
    // Below ~20 us of work (a product's flops, or a row's bytes of B) a
    // helper's wake-up costs more than it saves.
    const bool small = 2 * m * n * k < (int64_t{4} << 20) && (m * k + k * n + m * n) * 4 < (int64_t{256} << 10);
    int parts = small ? 1 : parts_wanted > 0 ? parts_wanted : machine_parts();
    const bool by_columns = n >= column_align * parts || m < row_align * parts;
    const int64_t extent = by_columns ? n : m, align = by_columns ? column_align : row_align;
    parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(parts, extent / align)));
    const auto edge = [&](int i) { return i == parts ? extent : extent * i / parts / align * align; };
    run_parts(parts, threads, [&](int i) {
      const int64_t lo = edge(i), len = edge(i + 1) - lo;
      if (len <= 0) return;
      if (by_columns)
        blas_gemm_block(trans_a, trans_b, m, len, k, alpha, a, lda, b + lo * (trans_b ? ldb : 1), ldb, beta, c + lo,
                        ldc);
      else
        blas_gemm_block(trans_a, trans_b, len, n, k, alpha, a + lo * (trans_a ? 1 : lda), lda, b, ldb, beta,
                        c + lo * ldc, ldc);
    });
    return;
  }
#endif
  gemm_f32_fallback(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool have_blas() noexcept {
#ifdef ACTORGRAPH_HAVE_BLAS
  return true;
#else
  return false;
#endif
}

}  // namespace ag::gpu::cpu
