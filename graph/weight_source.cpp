#include "graph/weight_source.hpp"
#include "graph/target_clones.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#include <utility>

namespace ag {

int64_t weight_source::slice_bytes(int dim, int64_t rows) const noexcept {
  const shape& d = dims();
  if (dim < 0 || dim >= d.rank() || d[dim] == 0) return 0;
  return d.numel() / d[dim] * rows * static_cast<int64_t>(dtype_size(type()));
}

error check_slice(const shape& dims, int dim, int64_t begin, int64_t end, const std::string& origin) {
  if (dim < 0 || dim >= dims.rank())
    return {errc::invalid_argument,
            origin + ": slice along dim " + std::to_string(dim) + " of a rank-" + std::to_string(dims.rank()) + " weight"};
  if (begin < 0 || end < begin || end > dims[dim])
    return {errc::invalid_argument, origin + ": slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                        ") along dim " + std::to_string(dim) + " of " + dims.to_string()};
  return {};
}

void copy_slice(const std::byte* src, const shape& dims, std::size_t elem_bytes, int dim, int64_t begin,
                int64_t end, void* dst) noexcept {
  // outer x [dims[dim]] x inner: a slice along `dim` is `outer` runs of
  // (end - begin) * inner contiguous elements.
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < dim; ++k) outer *= dims[k];
  for (int k = dim + 1; k < dims.rank(); ++k) inner *= dims[k];
  const auto row = static_cast<std::size_t>(inner) * elem_bytes;
  const auto run = static_cast<std::size_t>(end - begin) * row;
  auto* out = static_cast<std::byte*>(dst);
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out, src + (static_cast<std::size_t>(o * dims[dim] + begin)) * row, run);
    out += run;
  }
}

namespace {

class host_weight final : public weight_source {
 public:
  host_weight(host_tensor t, std::string origin) : t_(std::move(t)), origin_(std::move(origin)) {}
  dtype type() const noexcept override { return t_.type(); }
  const shape& dims() const noexcept override { return t_.dims(); }
  error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    if (auto e = check_slice(t_.dims(), dim, begin, end, origin())) return e;
    copy_slice(t_.data(), t_.dims(), dtype_size(t_.type()), dim, begin, end, dst);
    return {};
  }
  std::string origin() const override { return origin_; }
  const host_tensor* in_memory() const noexcept override { return &t_; }

 private:
  host_tensor t_;
  std::string origin_;
};

class shape_only_weight final : public weight_source {
 public:
  shape_only_weight(dtype type, shape dims) : type_(type), dims_(dims) {}
  dtype type() const noexcept override { return type_; }
  const shape& dims() const noexcept override { return dims_; }
  bool has_values() const noexcept override { return false; }
  error read_slice(int, int64_t, int64_t, void*) const override {
    return {errc::invalid_argument, "weight has no values (built with shapes only)"};
  }
  std::string origin() const override { return "shapes only"; }

 private:
  dtype type_;
  shape dims_;
};

class slice_weight final : public weight_source {
 public:
  slice_weight(weight_source_ptr base, int dim, int64_t begin, int64_t end)
      : base_(std::move(base)), dim_(dim), begin_(begin), dims_(base_->dims()) {
    dims_[dim] = end - begin;
  }
  dtype type() const noexcept override { return base_->type(); }
  const shape& dims() const noexcept override { return dims_; }
  bool has_values() const noexcept override { return base_->has_values(); }
  error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    if (auto e = check_slice(dims_, dim, begin, end, origin())) return e;
    if (dim == dim_) return base_->read_slice(dim_, begin_ + begin, begin_ + end, dst);
    if (begin == 0 && end == dims_[dim]) return base_->read_slice(dim_, begin_, begin_ + dims_[dim_], dst);
    // Another dim: read this shard whole, then cut the slice out of it.
    host_tensor whole = host_tensor::uninitialized(type(), dims_);
    if (auto e = base_->read_slice(dim_, begin_, begin_ + dims_[dim_], whole.data())) return e;
    copy_slice(whole.data(), dims_, dtype_size(type()), dim, begin, end, dst);
    return {};
  }
  std::string origin() const override {
    return base_->origin() + " [dim " + std::to_string(dim_) + ": " + std::to_string(begin_) + ".." +
           std::to_string(begin_ + dims_[dim_]) + ")";
  }
  const weight_source_ptr& base() const noexcept { return base_; }
  int dim() const noexcept { return dim_; }
  int64_t begin() const noexcept { return begin_; }

 private:
  weight_source_ptr base_;
  int dim_;
  int64_t begin_;
  shape dims_;
};

// One element times a factor, rounded back: the load / scale / store of
// each float dtype, branch-free (scale_elements below), and the magnitude
// of a value as bits ordered as the magnitudes are.
struct bf16_elems {
  using type = uint16_t;
  static float load(uint16_t h) noexcept { return bf16_to_float(h); }
  static uint16_t store(float f) noexcept {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
  static uint16_t magnitude(uint16_t h) noexcept { return h & 0x7fffu; }
  static float from_magnitude(uint16_t m) noexcept { return bf16_to_float(m); }
  static constexpr float max = 3.38953139e38f;
};
struct f16_elems {
  using type = uint16_t;
  static float load(uint16_t h) noexcept { return half_to_float(h); }
  static uint16_t store(float f) noexcept { return float_to_half(f); }
  static uint16_t magnitude(uint16_t h) noexcept { return h & 0x7fffu; }
  static float from_magnitude(uint16_t m) noexcept { return half_to_float(m); }
  static constexpr float max = 65504.0f;
};
struct f32_elems {
  using type = float;
  static float load(float v) noexcept { return v; }
  static float store(float v) noexcept { return v; }
  static uint32_t magnitude(float v) noexcept {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
  }
  static float from_magnitude(uint32_t m) noexcept {
    float f;
    std::memcpy(&f, &m, 4);
    return f;
  }
  static constexpr float max = 3.40282347e38f;
};

// Multiplies a row-major outer x [factor.size()] x inner block in place by
// factor[k] (computed in float, rounded once). Returns false when a product
// may not fit the dtype: a factor beyond 1 and the largest |weight| times
// the largest |factor| beyond the dtype's range (or a weight not finite);
// the caller then checks element by element on a fresh copy. Factors of at
// most 1 cannot overflow: a product's magnitude and its rounding stay at
// most the weight's. The loops are branch-free and their pointers do not
// alias, so that they vectorise: a load and store through load_as_float /
// store_from_float ran at 0.5 GB/s and made loading a model with folded
// norms 7x slower.
template <class E>
[[gnu::always_inline]] inline bool scale_elements(typename E::type* __restrict data, int64_t outer,
                                                  const std::vector<float>& factor, int64_t inner) {
  const float* __restrict fs = factor.data();
  const auto count = static_cast<int64_t>(factor.size());
  float largest_factor = 0.f;  // (a NaN compares false and is dropped)
  for (int64_t k = 0; k < count; ++k) largest_factor = std::fabs(fs[k]) > largest_factor ? std::fabs(fs[k]) : largest_factor;
  bool fits = std::isfinite(largest_factor);
  if (fits && largest_factor > 1.f) {
    // The largest magnitude, by its bits (ordered as the values are; a NaN's
    // bits are above inf's, so a NaN weight fails the test too).
    decltype(E::magnitude(data[0])) top = 0;
    const int64_t n = outer * count * inner;
    for (int64_t i = 0; i < n; ++i) top = E::magnitude(data[i]) > top ? E::magnitude(data[i]) : top;
    const float largest_weight = E::from_magnitude(top);
    fits = std::isfinite(largest_weight) && static_cast<double>(largest_weight) * largest_factor <= E::max;
  }
  typename E::type* __restrict row = data;
  if (inner == 1) {  // scaled along the last dim ([N, K] read transposed): a factor per element
    for (int64_t o = 0; o < outer; ++o, row += count)
      for (int64_t k = 0; k < count; ++k) row[k] = E::store(E::load(row[k]) * fs[k]);
  } else {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < count; ++k, row += inner)
        for (int64_t j = 0; j < inner; ++j) row[j] = E::store(E::load(row[j]) * fs[k]);
  }
  return fits;
}

// scale_elements per dtype, built for AVX2 and for the baseline on x86-64
// (graph/target_clones.hpp; 3.0-3.3 against 2.2 GB/s for bf16 on the 2-core
// development machine).
#define AG_SCALE_CLONES AG_AVX2_CLONES
#define AG_SCALE_FOR(E)                                                                                 \
  AG_SCALE_CLONES bool scale_##E(E::type* data, int64_t outer, const std::vector<float>& factor,     \
                                 int64_t inner) {                                                    \
    return scale_elements<E>(data, outer, factor, inner);                                             \
  }
AG_SCALE_FOR(bf16_elems)
AG_SCALE_FOR(f16_elems)
AG_SCALE_FOR(f32_elems)
#undef AG_SCALE_FOR
#undef AG_SCALE_CLONES

// The exact check behind scale_elements' false: the index of the first
// element where finite operands give a product that is not finite once
// stored, with that product; -1 when there is none (the weight held a NaN
// or inf of its own, which stays as it was).
template <class E>
int64_t first_overflow(const typename E::type* original, int64_t outer, const std::vector<float>& factor,
                       int64_t inner, float& product) {
  int64_t i = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (const float f : factor)
      for (int64_t j = 0; j < inner; ++j, ++i) {
        const float w = E::load(original[i]);
        if (std::isfinite(w) && std::isfinite(f) && !std::isfinite(E::load(E::store(w * f)))) {
          product = w * f;
          return i;
        }
      }
  return -1;
}

// W'[.., k, ..] = W[.., k, ..] * scale[k] (make_scaled_weight).
class scaled_weight final : public weight_source {
 public:
  scaled_weight(weight_source_ptr base, weight_source_ptr scale, int dim)
      : base_(std::move(base)), scale_(std::move(scale)), dim_(dim) {}
  dtype type() const noexcept override { return base_->type(); }
  const shape& dims() const noexcept override { return base_->dims(); }
  bool has_values() const noexcept override { return base_->has_values() && scale_->has_values(); }
  error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    if (auto e = check_slice(dims(), dim, begin, end, origin())) return e;
    if (auto e = base_->read_slice(dim, begin, end, dst)) return e;
    // The scale's entries this slice meets: [begin, end) along dim_ when the
    // slice is along it, else all of them, as floats.
    const int64_t s_begin = dim == dim_ ? begin : 0, s_end = dim == dim_ ? end : dims()[dim_];
    const auto count = static_cast<std::size_t>(s_end - s_begin);
    std::vector<std::byte> raw(count * dtype_size(scale_->type()));
    if (auto e = scale_->read_slice(0, s_begin, s_end, raw.data())) return e;
    std::vector<float> factor(count);
    for (std::size_t k = 0; k < count; ++k) factor[k] = load_as_float(raw.data(), scale_->type(), k);
    // The slice is outer x [count] x inner, row-major.
    shape sliced = dims();
    sliced[dim] = end - begin;
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < dim_; ++k) outer *= sliced[k];
    for (int k = dim_ + 1; k < sliced.rank(); ++k) inner *= sliced[k];
    const auto scale_as = [&](auto elems) -> error {
      using E = decltype(elems);
      auto* values = static_cast<typename E::type*>(dst);
      bool fits = false;
      if constexpr (std::is_same_v<E, bf16_elems>) fits = scale_bf16_elems(values, outer, factor, inner);
      else if constexpr (std::is_same_v<E, f16_elems>) fits = scale_f16_elems(values, outer, factor, inner);
      else fits = scale_f32_elems(values, outer, factor, inner);
      if (fits) return {};
      // A product may have overflowed: read the slice again and find it.
      std::vector<typename E::type> original(static_cast<std::size_t>(outer * inner) * factor.size());
      if (auto e = base_->read_slice(dim, begin, end, original.data())) return e;
      float product = 0.f;
      const int64_t at = first_overflow<E>(original.data(), outer, factor, inner, product);
      if (at < 0) return {};
      return {errc::invalid_argument, origin() + ": element " + std::to_string(at) + " of the slice [" +
                                          std::to_string(begin) + ", " + std::to_string(end) + ") along dim " +
                                          std::to_string(dim) + ", scaled to " + std::to_string(product) +
                                          ", overflows " + to_string(type())};
    };
    switch (type()) {
      case dtype::f32: return scale_as(f32_elems{});
      case dtype::bf16: return scale_as(bf16_elems{});
      case dtype::f16: return scale_as(f16_elems{});
      default: return {errc::internal, origin() + ": not a float type"};
    }
  }
  std::string origin() const override {
    return base_->origin() + " scaled along dim " + std::to_string(dim_) + " by " + scale_->origin();
  }
  const weight_source_ptr& base() const noexcept { return base_; }
  const weight_source_ptr& scale() const noexcept { return scale_; }
  int dim() const noexcept { return dim_; }

 private:
  weight_source_ptr base_, scale_;
  int dim_;
};

}  // namespace

expected<weight_source_ptr> make_scaled_weight(weight_source_ptr base, weight_source_ptr scale, int dim) {
  if (!base || !scale) return error(errc::invalid_argument, "make_scaled_weight: null weight");
  if (!is_float(base->type()) || !is_float(scale->type()))
    return error(errc::invalid_argument, base->origin() + " scaled by " + scale->origin() + ": " +
                                             to_string(base->type()) + " x " + to_string(scale->type()) +
                                             ", both must be float types");
  if (dim < 0 || dim >= base->dims().rank())
    return error(errc::invalid_argument, base->origin() + ": scaled along dim " + std::to_string(dim) + " of a rank-" +
                                             std::to_string(base->dims().rank()) + " weight");
  if (scale->dims().rank() != 1 || scale->dims()[0] != base->dims()[dim])
    return error(errc::invalid_argument, base->origin() + " " + base->dims().to_string() + " scaled along dim " +
                                             std::to_string(dim) + " by " + scale->origin() + " " +
                                             scale->dims().to_string() + ": expected [" +
                                             std::to_string(base->dims()[dim]) + "]");
  return weight_source_ptr(std::make_shared<scaled_weight>(std::move(base), std::move(scale), dim));
}

expected<weight_source_ptr> make_slice_weight(weight_source_ptr base, int dim, int64_t begin, int64_t end) {
  if (!base) return error(errc::invalid_argument, "make_slice_weight: null base");
  if (auto e = check_slice(base->dims(), dim, begin, end, base->origin())) return e;
  if (begin == end) return error(errc::invalid_argument, base->origin() + ": empty slice along dim " + std::to_string(dim));
  if (begin == 0 && end == base->dims()[dim]) return base;
  if (const auto* s = dynamic_cast<const slice_weight*>(base.get()); s && s->dim() == dim)
    return weight_source_ptr(std::make_shared<slice_weight>(s->base(), dim, s->begin() + begin, s->begin() + end));
  return weight_source_ptr(std::make_shared<slice_weight>(std::move(base), dim, begin, end));
}

weight_source_ptr make_host_weight(host_tensor values, std::string origin) {
  return std::make_shared<host_weight>(std::move(values), std::move(origin));
}

weight_source_ptr make_shape_only_weight(dtype type, shape dims) {
  return std::make_shared<shape_only_weight>(type, dims);
}

bool same_values(const weight_source& a, const weight_source& b) {
  if (&a == &b) return a.has_values();
  if (a.type() != b.type() || a.dims() != b.dims() || !a.has_values() || !b.has_values()) return false;
  const auto* ca = dynamic_cast<const scaled_weight*>(&a);
  const auto* cb = dynamic_cast<const scaled_weight*>(&b);
  if (ca || cb)
    return ca && cb && ca->dim() == cb->dim() && same_values(*ca->base(), *cb->base()) &&
           same_values(*ca->scale(), *cb->scale());
  const auto* sa = dynamic_cast<const slice_weight*>(&a);
  const auto* sb = dynamic_cast<const slice_weight*>(&b);
  if (sa || sb)
    return sa && sb && sa->dim() == sb->dim() && sa->begin() == sb->begin() && same_values(*sa->base(), *sb->base());
  const host_tensor* ta = a.in_memory();
  const host_tensor* tb = b.in_memory();
  if (ta || tb) return ta && tb && ta->bytes() == tb->bytes() && std::memcmp(ta->data(), tb->data(), ta->bytes()) == 0;
  return a.origin() == b.origin();
}

expected<host_tensor> read_all(const weight_source& w) {
  if (const host_tensor* t = w.in_memory()) return *t;
  host_tensor t = host_tensor::uninitialized(w.type(), w.dims());
  if (w.dims().rank() == 0 || w.dims().numel() == 0) return t;
  if (auto e = w.read_slice(0, 0, w.dims()[0], t.data())) return e;
  return t;
}

}  // namespace ag
