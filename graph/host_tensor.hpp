#pragma once
/// \file host_tensor.hpp
/// A dense, contiguous tensor in host memory: job inputs and outputs, weight
/// data, reference-evaluator values. Value semantics (copying copies the
/// bytes); move it into messages to avoid the copy.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/shape.hpp"

namespace ag {

/// A source of host memory for tensor storage other than the heap, e.g. the
/// CUDA backend's pool of pinned (page-locked) buffers that a GPU copies to and
/// from directly. Implementations are thread-safe, and must outlive every
/// buffer they hand out (the CUDA pool lives as long as the process).
class host_memory_resource {
 public:
  /// At least `bytes` bytes, aligned to 64. Throws std::bad_alloc on failure.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Returns a buffer that allocate(bytes) handed out (same `bytes`).
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  /// For messages and tests ("cuda pinned").
  virtual const char* name() const noexcept = 0;

 protected:
  ~host_memory_resource() = default;
};

/// The allocator of host_tensor storage: the heap, or a host_memory_resource.
/// Its value-less construct() default-initialises, so a buffer grows without
/// zero-filling (job outputs are written by a device copy right after; zero-
/// filling them first cost a full extra pass over memory).
/// A copy of a tensor is heap memory (select_on_container_copy_construction);
/// a move keeps the buffer and its resource.
template <class T>
class host_allocator {
 public:
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using propagate_on_container_copy_assignment = std::false_type;
  using is_always_equal = std::false_type;

  host_allocator() noexcept = default;
  explicit host_allocator(host_memory_resource* r) noexcept : r_(r) {}
  template <class U>
  host_allocator(const host_allocator<U>& o) noexcept : r_(o.resource()) {}

  T* allocate(std::size_t n) {
    if (!r_) return std::allocator<T>{}.allocate(n);
    return static_cast<T*>(r_->allocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (!r_) return std::allocator<T>{}.deallocate(p, n);
    r_->deallocate(p, n * sizeof(T));
  }
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) { ::new (static_cast<void*>(p)) U; }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) { ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...); }

  host_allocator select_on_container_copy_construction() const noexcept { return {}; }
  host_memory_resource* resource() const noexcept { return r_; }
  template <class U>
  bool operator==(const host_allocator<U>& o) const noexcept { return r_ == o.resource(); }
  template <class U>
  bool operator!=(const host_allocator<U>& o) const noexcept { return r_ != o.resource(); }

 private:
  host_memory_resource* r_ = nullptr;
};

/// The byte storage of a host_tensor.
using byte_buffer = std::vector<std::byte, host_allocator<std::byte>>;

class host_tensor {
 public:
  host_tensor() = default;
  /// Zero-filled tensor of this type and shape. Throws std::length_error for
  /// a size no host tensor can have here (see create(): never a wrapped size)
  /// and std::bad_alloc when the allocation fails.
  host_tensor(dtype type, shape dims);
  /// Tensor whose bytes are left unset: for buffers that are written in full
  /// right away (job outputs filled by a device-to-host copy). With `memory`,
  /// the bytes come from that resource (and return to it when the last
  /// host_tensor holding them is destroyed); else from the heap.
  static host_tensor uninitialized(dtype type, shape dims, host_memory_resource* memory = nullptr);
  /// The constructors above throw (std::bad_alloc, std::length_error) for a
  /// size that cannot be allocated. These checked factories return an error
  /// instead, for shapes that come from outside (job inputs and outputs,
  /// files): invalid_shape for a rank above 4, a negative dim, or a byte size
  /// over max_tensor_bytes; out_of_memory, naming the bytes, for more than
  /// this host has (host_memory_bytes(): refused before trying, since an
  /// overcommitted allocation would "succeed" and the process be killed on
  /// first touch) or a failed allocation. Zero-size dims are allowed.
  static expected<host_tensor> create(dtype type, shape dims);
  static expected<host_tensor> create_uninitialized(dtype type, shape dims,
                                                    host_memory_resource* memory = nullptr);

  /// The value factories below never throw: for a size no host tensor can
  /// have here (what create() refuses) or an allocation that fails they
  /// return a tensor with these dims and no bytes (bytes() == 0 <
  /// numel() * size), which graph validation and check_inputs refuse with an
  /// error naming the node or input. (A weight of [2^31, 2^31] used to wrap to
  /// 0 bytes and be written past its end.)
  ///
  /// Rounds each value to `type`. values.size() must equal dims.numel().
  static host_tensor from_floats(dtype type, shape dims, const std::vector<float>& values);
  static host_tensor from_ints(shape dims, const std::vector<int32_t>& values);
  /// Deterministic N(mean, stddev^2) values from `seed` (same seed, same values,
  /// on every platform: uses its own generator, not std::normal_distribution).
  static host_tensor random_normal(dtype type, shape dims, uint64_t seed,
                                   float stddev = 1.0f, float mean = 0.0f);
  /// Deterministic U[lo, hi) values from `seed`.
  static host_tensor random_uniform(dtype type, shape dims, uint64_t seed,
                                    float lo = -1.0f, float hi = 1.0f);
  /// Deterministic integers in [0, n) (for token ids), type i32.
  static host_tensor random_ints(shape dims, uint64_t seed, int32_t n);

  dtype type() const noexcept { return type_; }
  const shape& dims() const noexcept { return dims_; }
  int64_t numel() const noexcept { return dims_.numel(); }
  /// Elements the bytes hold: numel(), except for a tensor whose bytes do not
  /// match its dims (an empty one from a value factory, or reset()).
  int64_t stored_elements() const noexcept;
  std::size_t bytes() const noexcept { return data_.size(); }
  /// Where the bytes live: null for the heap.
  host_memory_resource* memory() const noexcept { return data_.get_allocator().resource(); }
  std::byte* data() noexcept { return data_.data(); }
  const std::byte* data() const noexcept { return data_.data(); }

  /// Element i (flat row-major index) converted to float.
  float at(int64_t i) const noexcept { return load_as_float(data_.data(), type_, static_cast<std::size_t>(i)); }
  void set(int64_t i, float v) noexcept { store_from_float(data_.data(), type_, static_cast<std::size_t>(i), v); }
  std::vector<float> to_floats() const;
  /// Same values converted to another dtype.
  host_tensor cast(dtype to) const;

  bool operator==(const host_tensor& o) const noexcept {
    return type_ == o.type_ && dims_ == o.dims_ && data_ == o.data_;
  }

  /// For serialization (messages/): raw byte access.
  byte_buffer& raw() noexcept { return data_; }
  const byte_buffer& raw() const noexcept { return data_; }
  void reset(dtype type, shape dims, byte_buffer bytes) {
    type_ = type; dims_ = dims; data_ = std::move(bytes);
  }

 private:
  dtype type_ = dtype::f32;
  shape dims_;
  byte_buffer data_;
};

/// Memory this process may use on this host, in bytes: the physical memory,
/// or the cgroup (container) limit when that is lower. Read once.
int64_t host_memory_bytes() noexcept;

/// Result of comparing two tensors elementwise.
struct compare_result {
  bool ok = false;
  double max_abs_err = 0;  ///< max |a - b|
  double max_rel_err = 0;  ///< max |a - b| / max(|b|, 1e-6) over elements
  int64_t worst_index = -1;
  std::string message;     ///< empty when ok; else what differs and where
};
/// |actual - expected| <= atol + rtol * |expected| for every element; shapes must match.
compare_result compare(const host_tensor& actual, const host_tensor& expected,
                       double atol, double rtol);

}  // namespace ag
