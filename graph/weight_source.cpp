#include "graph/weight_source.hpp"

#include <cstring>

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

}  // namespace

weight_source_ptr make_host_weight(host_tensor values) { return std::make_shared<host_weight>(std::move(values)); }

weight_source_ptr make_shape_only_weight(dtype type, shape dims) {
  return std::make_shared<shape_only_weight>(type, dims);
}

expected<host_tensor> read_all(const weight_source& w) {
  if (const host_tensor* t = w.in_memory()) return *t;
  host_tensor t = host_tensor::uninitialized(w.type(), w.dims());
  if (w.dims().rank() == 0 || w.dims().numel() == 0) return t;
  if (auto e = w.read_slice(0, 0, w.dims()[0], t.data())) return e;
  return t;
}

}  // namespace ag
