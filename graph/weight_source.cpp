#include "graph/weight_source.hpp"

#include <cstring>
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
  explicit host_weight(host_tensor t) : t_(std::move(t)) {}
  dtype type() const noexcept override { return t_.type(); }
  const shape& dims() const noexcept override { return t_.dims(); }
  error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    if (auto e = check_slice(t_.dims(), dim, begin, end, origin())) return e;
    copy_slice(t_.data(), t_.dims(), dtype_size(t_.type()), dim, begin, end, dst);
    return {};
  }
  std::string origin() const override { return "in memory"; }
  const host_tensor* in_memory() const noexcept override { return &t_; }

 private:
  host_tensor t_;
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

}  // namespace

expected<weight_source_ptr> make_slice_weight(weight_source_ptr base, int dim, int64_t begin, int64_t end) {
  if (!base) return error(errc::invalid_argument, "make_slice_weight: null base");
  if (auto e = check_slice(base->dims(), dim, begin, end, base->origin())) return e;
  if (begin == end) return error(errc::invalid_argument, base->origin() + ": empty slice along dim " + std::to_string(dim));
  if (begin == 0 && end == base->dims()[dim]) return base;
  if (const auto* s = dynamic_cast<const slice_weight*>(base.get()); s && s->dim() == dim)
    return weight_source_ptr(std::make_shared<slice_weight>(s->base(), dim, s->begin() + begin, s->begin() + end));
  return weight_source_ptr(std::make_shared<slice_weight>(std::move(base), dim, begin, end));
}

weight_source_ptr make_host_weight(host_tensor values) { return std::make_shared<host_weight>(std::move(values)); }

weight_source_ptr make_shape_only_weight(dtype type, shape dims) {
  return std::make_shared<shape_only_weight>(type, dims);
}

bool same_values(const weight_source& a, const weight_source& b) {
  if (&a == &b) return a.has_values();
  if (a.type() != b.type() || a.dims() != b.dims() || !a.has_values() || !b.has_values()) return false;
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
