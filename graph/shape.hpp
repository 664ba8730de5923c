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
  /// rank = dims.size(); more than max_rank dims give an invalid shape (rank() == -1)
  /// that graph validation rejects with an error naming the node.
  shape(std::initializer_list<int64_t> dims);
  template <class It>
  static shape from_range(It first, It last) {
    shape s;
    for (; first != last && s.rank_ < max_rank; ++first) s.d_[s.rank_++] = static_cast<int64_t>(*first);
    return s;
  }

  int rank() const noexcept { return rank_; }
  /// Dimension i; negative i counts from the end (-1 = innermost).
  int64_t operator[](int i) const noexcept { return d_[i < 0 ? rank_ + i : i]; }
  int64_t& operator[](int i) noexcept { return d_[i < 0 ? rank_ + i : i]; }
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

/// Row-major strides of a contiguous tensor of this shape.
strides contiguous_strides(const shape& s) noexcept;
/// True when strides are the row-major strides of s (size-1 dims ignored).
bool is_contiguous(const shape& s, const strides& st) noexcept;

}  // namespace ag
