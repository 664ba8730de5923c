#pragma once
/// \file shape.hpp
/// Shapes of up to 4 dimensions, row-major like PyTorch: dims[0] is the
/// outermost, dims[rank-1] the innermost (contiguous) one. Strides count
/// elements, not bytes, so views (permute, transpose, slice) are free.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace ag {

constexpr int max_rank = 4;

class shape {
 public:
  shape() = default;
  /// rank = dims.size(). More than max_rank dims give an invalid shape:
  /// rank() == -dims.size() (e.g. -5), the first max_rank dims kept, which
  /// graph validation rejects with an error naming the node and the count.
  shape(std::initializer_list<int64_t> dims);
  template <class It>
  static shape from_range(It first, It last) {
    shape s;
    int n = 0;
    for (; first != last; ++first, ++n)
      if (n < max_rank) s.d_[n] = static_cast<int64_t>(*first);
    s.rank_ = n <= max_rank ? n : -n;
    return s;
  }

  /// 0..max_rank; negative for an invalid shape of -rank() (> max_rank) dims.
  int rank() const noexcept { return rank_; }
  /// False for a shape of more than max_rank dims.
  bool valid_rank() const noexcept { return rank_ >= 0; }
  /// Dimension i; negative i counts from the end (-1 = innermost).
  int64_t operator[](int i) const noexcept { return d_[i < 0 ? rank_ + i : i]; }
  int64_t& operator[](int i) noexcept { return d_[i < 0 ? rank_ + i : i]; }
  /// Product of the dims (1 for rank 0). Unchecked: may overflow for shapes
  /// that no valid graph holds; use checked_numel() on untrusted shapes.
  int64_t numel() const noexcept;
  const std::array<int64_t, max_rank>& dims() const noexcept { return d_; }
  void set_rank(int r) noexcept { rank_ = r; }

  bool operator==(const shape& o) const noexcept;
  bool operator!=(const shape& o) const noexcept { return !(*this == o); }
  /// "[2, 3, 4]"
  std::string to_string() const;

 private:
  int rank_ = 0;
  std::array<int64_t, max_rank> d_{};  // unused trailing entries are 0
};

/// Element strides per dimension (same indexing as shape).
using strides = std::array<int64_t, max_rank>;

// ---- checked size arithmetic ------------------------------------------------
// Every size a valid graph holds is computed with these: a shape whose element
// count or byte size does not fit in int64 is an error, never a wrapped value.

/// The largest tensor a graph may hold, in bytes (4 EiB: far beyond any host
/// or device, and small enough that a few sizes can be added and aligned
/// without overflow). Validation refuses larger tensors, naming the node.
constexpr int64_t max_tensor_bytes = int64_t{1} << 62;

/// out = a * b; false when it overflows int64.
inline bool checked_mul(int64_t a, int64_t b, int64_t& out) noexcept { return !__builtin_mul_overflow(a, b, &out); }
/// out = a + b; false when it overflows int64.
inline bool checked_add(int64_t a, int64_t b, int64_t& out) noexcept { return !__builtin_add_overflow(a, b, &out); }
/// Number of elements of `s`; false for an invalid rank, a negative dim, or
/// a product that overflows int64.
bool checked_numel(const shape& s, int64_t& out) noexcept;
/// Bytes of a contiguous tensor of shape `s` with `element_bytes`-byte
/// elements; false where checked_numel is, or when the bytes overflow int64.
bool checked_bytes(const shape& s, int64_t element_bytes, int64_t& out) noexcept;
/// Largest element index a (dims, strides, offset) layout reaches:
/// offset + sum((dims[i] - 1) * strides[i]); false on overflow.
bool checked_max_index(const shape& s, const strides& st, int64_t offset, int64_t& out) noexcept;
/// The exact element count as a decimal string, even past int64 (e.g.
/// "4611686018427387904" or "21267647932558653966460912964485513216"), for errors.
std::string numel_string(const shape& s, int64_t element_bytes = 1);

/// Row-major strides of a contiguous tensor of this shape.
strides contiguous_strides(const shape& s) noexcept;
/// True when strides are the row-major strides of s (size-1 dims ignored).
bool is_contiguous(const shape& s, const strides& st) noexcept;

}  // namespace ag
