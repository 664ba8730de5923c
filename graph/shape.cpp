#include "graph/shape.hpp"

namespace ag {

shape::shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > static_cast<std::size_t>(max_rank)) {
    rank_ = -1;  // marks the shape invalid: validation rejects rank outside 1..4 with the node's name
    return;
  }
  for (int64_t d : dims) d_[rank_++] = d;
}

int64_t shape::numel() const noexcept {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= d_[i];
  return n;
}

bool shape::operator==(const shape& o) const noexcept {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (d_[i] != o.d_[i]) return false;
  return true;
}

std::string shape::to_string() const {
  if (rank_ < 0) return "[more than 4 dims]";
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(d_[i]);
  }
  return s + "]";
}

strides contiguous_strides(const shape& s) noexcept {
  strides st{};
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

bool is_contiguous(const shape& s, const strides& st) noexcept {
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    if (s[i] != 1 && st[i] != acc) return false;
    acc *= s[i];
  }
  return true;
}

}  // namespace ag
