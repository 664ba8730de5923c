#include "graph/host_tensor.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <sstream>

#include "graph/random.hpp"

namespace ag {

namespace {

error check_host_size(dtype type, const shape& dims, int64_t& bytes);

// The byte size of (type, dims), or throws std::length_error for a size no
// host tensor can have here (never a wrapped product: [2^31, 2^31] f32 is
// 2^64 bytes, which an unchecked product made 0).
std::size_t bytes_or_throw(dtype type, const shape& dims) {
  int64_t bytes = 0;
  if (error e = check_host_size(type, dims, bytes)) throw std::length_error(e.message);
  return static_cast<std::size_t>(bytes);
}

}  // namespace

host_tensor::host_tensor(dtype type, shape dims)
    : type_(type), dims_(dims), data_(bytes_or_throw(type, dims), std::byte{0}) {}

host_tensor host_tensor::uninitialized(dtype type, shape dims, host_memory_resource* memory) {
  host_tensor t;
  t.type_ = type;
  t.dims_ = dims;
  t.data_ = byte_buffer(host_allocator<std::byte>(memory));
  t.data_.resize(bytes_or_throw(type, dims));
  return t;
}

namespace {

// Checks that `dims` of `type` can be a host tensor here; its byte size in `bytes`.
error check_host_size(dtype type, const shape& dims, int64_t& bytes) {
  // Built only for an error: a job's outputs pass here on submit's path.
  const auto what = [&] { return std::string(to_string(type)) + " " + dims.to_string(); };
  if (!dims.valid_rank())
    return error(errc::invalid_shape, "host tensor " + what() + ": more than " + std::to_string(max_rank) + " dims");
  for (int i = 0; i < dims.rank(); ++i)
    if (dims[i] < 0) return error(errc::invalid_shape, "host tensor " + what() + ": negative dim");
  if (static_cast<int>(type) > static_cast<int>(dtype::i32))
    return error(errc::invalid_argument, "host tensor: unknown dtype " + std::to_string(static_cast<int>(type)));
  if (!checked_bytes(dims, static_cast<int64_t>(dtype_size(type)), bytes) || bytes > max_tensor_bytes)
    return error(errc::invalid_shape, "host tensor " + what() + " needs " +
                                          numel_string(dims, static_cast<int64_t>(dtype_size(type))) +
                                          " bytes, more than a tensor may have (2^62)");
  if (bytes > host_memory_bytes())
    return error(errc::out_of_memory, "host tensor " + what() + " needs " + std::to_string(bytes) +
                                          " bytes, more than this host's " + std::to_string(host_memory_bytes()) +
                                          " bytes of memory");
  return {};
}

error allocation_failed(dtype type, const shape& dims, int64_t bytes, const char* why) {
  return error(errc::out_of_memory, "host tensor " + std::string(to_string(type)) + " " + dims.to_string() +
                                        ": allocating " + std::to_string(bytes) + " bytes failed (" + why + ")");
}

}  // namespace

expected<host_tensor> host_tensor::create(dtype type, shape dims) {
  int64_t bytes = 0;
  if (error e = check_host_size(type, dims, bytes)) return e;
  try {
    return host_tensor(type, dims);
  } catch (const std::exception& e) {
    return allocation_failed(type, dims, bytes, e.what());
  }
}

expected<host_tensor> host_tensor::create_uninitialized(dtype type, shape dims, host_memory_resource* memory) {
  int64_t bytes = 0;
  if (error e = check_host_size(type, dims, bytes)) return e;
  try {
    return uninitialized(type, dims, memory);
  } catch (const std::exception& e) {
    return allocation_failed(type, dims, bytes, e.what());
  }
}

int64_t host_memory_bytes() noexcept {
  static const int64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    int64_t b = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : max_tensor_bytes;
    // cgroup v2 limit of this container ("max" when unlimited)
    if (std::FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
      long long limit = 0;
      if (std::fscanf(f, "%lld", &limit) == 1 && limit > 0 && limit < b) b = limit;
      std::fclose(f);
    }
    return b;
  }();
  return bytes;
}

namespace {

// The value factories make weights and test data: for a size no host tensor
// can have here they return a tensor with these dims and no bytes, which
// graph validation and check_inputs refuse with an error naming the node,
// instead of throwing through code (the REPL's graph language) that builds
// weights from a user's dims.
host_tensor zeros_or_empty(dtype type, const shape& dims) {
  int64_t bytes = 0;
  if (check_host_size(type, dims, bytes)) {
    host_tensor t;
    t.reset(type, dims, {});
    return t;
  }
  try {
    return host_tensor(type, dims);
  } catch (const std::bad_alloc&) {
    host_tensor t;
    t.reset(type, dims, {});
    return t;
  }
}

}  // namespace

int64_t host_tensor::stored_elements() const noexcept {
  return static_cast<int64_t>(data_.size() / dtype_size(type_));
}

host_tensor host_tensor::from_floats(dtype type, shape dims, const std::vector<float>& values) {
  host_tensor t = zeros_or_empty(type, dims);
  const std::size_t n = std::min<std::size_t>(values.size(), static_cast<std::size_t>(t.stored_elements()));
  for (std::size_t i = 0; i < n; ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

host_tensor host_tensor::from_ints(shape dims, const std::vector<int32_t>& values) {
  host_tensor t = zeros_or_empty(dtype::i32, dims);
  const std::size_t n = std::min<std::size_t>(values.size(), static_cast<std::size_t>(t.stored_elements()));
  auto* p = reinterpret_cast<int32_t*>(t.data());
  for (std::size_t i = 0; i < n; ++i) p[i] = values[i];
  return t;
}

host_tensor host_tensor::random_normal(dtype type, shape dims, uint64_t seed, float stddev, float mean) {
  host_tensor t = zeros_or_empty(type, dims);
  rng r(seed);
  for (int64_t i = 0; i < t.stored_elements(); ++i) t.set(i, static_cast<float>(mean + stddev * r.normal()));
  return t;
}

host_tensor host_tensor::random_uniform(dtype type, shape dims, uint64_t seed, float lo, float hi) {
  host_tensor t = zeros_or_empty(type, dims);
  rng r(seed);
  for (int64_t i = 0; i < t.stored_elements(); ++i) t.set(i, static_cast<float>(lo + (hi - lo) * r.uniform()));
  return t;
}

host_tensor host_tensor::random_ints(shape dims, uint64_t seed, int32_t n) {
  host_tensor t = zeros_or_empty(dtype::i32, dims);
  rng r(seed);
  auto* p = reinterpret_cast<int32_t*>(t.data());
  const uint64_t range = n > 0 ? static_cast<uint64_t>(n) : 1;  // n <= 0: zeros, not a division by zero
  for (int64_t i = 0; i < t.stored_elements(); ++i) p[i] = static_cast<int32_t>(r.next() % range);
  return t;
}

std::vector<float> host_tensor::to_floats() const {
  std::vector<float> v(static_cast<std::size_t>(stored_elements()));
  for (int64_t i = 0; i < stored_elements(); ++i) v[static_cast<std::size_t>(i)] = at(i);
  return v;
}

host_tensor host_tensor::cast(dtype to) const {
  if (to == type_) return *this;
  host_tensor t = zeros_or_empty(to, dims_);
  const int64_t n = std::min(stored_elements(), t.stored_elements());
  for (int64_t i = 0; i < n; ++i) t.set(i, at(i));
  return t;
}

compare_result compare(const host_tensor& actual, const host_tensor& expected, double atol, double rtol) {
  compare_result r;
  if (actual.dims() != expected.dims()) {
    r.message = "shape " + actual.dims().to_string() + " differs from expected " + expected.dims().to_string();
    return r;
  }
  for (const host_tensor* t : {&actual, &expected}) {
    if (static_cast<int64_t>(t->bytes()) != t->numel() * static_cast<int64_t>(dtype_size(t->type()))) {
      r.message = std::string(t == &actual ? "actual" : "expected") + " tensor " + t->dims().to_string() + " holds " +
                  std::to_string(t->bytes()) + " bytes, its shape needs " + numel_string(t->dims(), static_cast<int64_t>(dtype_size(t->type())));
      return r;
    }
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
