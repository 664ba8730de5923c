#include "graph/host_tensor.hpp"

#include <cmath>
#include <sstream>

#include "graph/random.hpp"

namespace ag {

host_tensor::host_tensor(dtype type, shape dims)
    : type_(type), dims_(dims),
      data_(static_cast<std::size_t>(dims.numel()) * dtype_size(type), std::byte{0}) {}

host_tensor host_tensor::uninitialized(dtype type, shape dims, host_memory_resource* memory) {
  host_tensor t;
  t.type_ = type;
  t.dims_ = dims;
  t.data_ = byte_buffer(host_allocator<std::byte>(memory));
  t.data_.resize(static_cast<std::size_t>(dims.numel()) * dtype_size(type));
  return t;
}

host_tensor host_tensor::from_floats(dtype type, shape dims, const std::vector<float>& values) {
  host_tensor t(type, dims);
  const std::size_t n = std::min<std::size_t>(values.size(), static_cast<std::size_t>(dims.numel()));
  for (std::size_t i = 0; i < n; ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

host_tensor host_tensor::from_ints(shape dims, const std::vector<int32_t>& values) {
  host_tensor t(dtype::i32, dims);
  const std::size_t n = std::min<std::size_t>(values.size(), static_cast<std::size_t>(dims.numel()));
  auto* p = reinterpret_cast<int32_t*>(t.data());
  for (std::size_t i = 0; i < n; ++i) p[i] = values[i];
  return t;
}

host_tensor host_tensor::random_normal(dtype type, shape dims, uint64_t seed, float stddev, float mean) {
  host_tensor t(type, dims);
  rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(mean + stddev * r.normal()));
  return t;
}

host_tensor host_tensor::random_uniform(dtype type, shape dims, uint64_t seed, float lo, float hi) {
  host_tensor t(type, dims);
  rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(lo + (hi - lo) * r.uniform()));
  return t;
}

host_tensor host_tensor::random_ints(shape dims, uint64_t seed, int32_t n) {
  host_tensor t(dtype::i32, dims);
  rng r(seed);
  auto* p = reinterpret_cast<int32_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int32_t>(r.next() % static_cast<uint64_t>(n));
  return t;
}

std::vector<float> host_tensor::to_floats() const {
  std::vector<float> v(static_cast<std::size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[static_cast<std::size_t>(i)] = at(i);
  return v;
}

host_tensor host_tensor::cast(dtype to) const {
  host_tensor t(to, dims_);
  if (to == type_) {
    t.data_ = data_;
    return t;
  }
  for (int64_t i = 0; i < numel(); ++i) t.set(i, at(i));
  return t;
}

compare_result compare(const host_tensor& actual, const host_tensor& expected, double atol, double rtol) {
  compare_result r;
  if (actual.dims() != expected.dims()) {
    r.message = "shape " + actual.dims().to_string() + " differs from expected " + expected.dims().to_string();
    return r;
  }
  bool ok = true;
  double worst_excess = -1;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = actual.at(i), e = expected.at(i);
    const double d = std::fabs(a - e);
    if (std::isnan(a) != std::isnan(e)) {
      ok = false;
      if (r.worst_index < 0) r.worst_index = i;
      continue;
    }
    r.max_abs_err = std::max(r.max_abs_err, d);
    r.max_rel_err = std::max(r.max_rel_err, d / std::max(std::fabs(e), 1e-6));
    const double excess = d - (atol + rtol * std::fabs(e));
    if (excess > 0) ok = false;
    if (excess > worst_excess) {
      worst_excess = excess;
      r.worst_index = i;
    }
  }
  r.ok = ok;
  if (!ok) {
    std::ostringstream os;
    os << "max abs err " << r.max_abs_err << ", max rel err " << r.max_rel_err << "; worst at flat index "
       << r.worst_index << ": got " << actual.at(r.worst_index) << ", expected " << expected.at(r.worst_index)
       << " (atol " << atol << ", rtol " << rtol << ")";
    r.message = os.str();
  }
  return r;
}

}  // namespace ag
