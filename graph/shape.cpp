#include "graph/shape.hpp"

#include <limits>

#include <vector>

namespace ag {

shape::shape(std::initializer_list<int64_t> dims) { *this = from_range(dims.begin(), dims.end()); }

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
  std::string s = "[";
  const int shown = rank_ < 0 ? max_rank : rank_;
  for (int i = 0; i < shown; ++i) {
    if (i) s += ", ";
    s += std::to_string(d_[i]);
  }
  // an invalid shape keeps only its first max_rank dims
  if (rank_ < 0) s += ", ... (" + std::to_string(-rank_) + " dims)";
  return s + "]";
}

bool checked_numel(const shape& s, int64_t& out) noexcept {
  if (s.rank() < 0) return false;
  int64_t n = 1;
  for (int i = 0; i < s.rank(); ++i)
    if (s[i] < 0 || !checked_mul(n, s[i], n)) return false;
  out = n;
  return true;
}

bool checked_bytes(const shape& s, int64_t element_bytes, int64_t& out) noexcept {
  int64_t n = 0;
  return checked_numel(s, n) && checked_mul(n, element_bytes, out);
}

bool checked_max_index(const shape& s, const strides& st, int64_t offset, int64_t& out) noexcept {
  if (s.rank() < 0) return false;
  int64_t m = offset;
  for (int i = 0; i < s.rank(); ++i) {
    int64_t reach = 0;
    if (s[i] < 1 || !checked_mul(s[i] - 1, st[static_cast<std::size_t>(i)], reach) || !checked_add(m, reach, m))
      return false;
  }
  out = m;
  return true;
}

std::string numel_string(const shape& s, int64_t element_bytes) {
  // Little-endian base-1e9 digits: the product of up to 4 int64 dims and an
  // element size needs up to ~260 bits, past any builtin integer.
  constexpr uint64_t base = 1000000000;
  std::vector<uint64_t> digits{1};
  auto times = [&](int64_t v) {
    const uint64_t m = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);  // |v|
    // a digit (< 2^30) times m (< 2^64) plus the carry fits in 128 bits
    unsigned __int128 carry = 0;
    for (auto& d : digits) {
      const unsigned __int128 p = static_cast<unsigned __int128>(d) * m + carry;
      d = static_cast<uint64_t>(p % base);
      carry = p / base;
    }
    while (carry) {
      digits.push_back(static_cast<uint64_t>(carry % base));
      carry /= base;
    }
  };
  bool negative = element_bytes < 0;
  const int shown = s.rank() < 0 ? max_rank : s.rank();
  for (int i = 0; i < shown; ++i) {
    negative ^= s[i] < 0;
    times(s[i]);
  }
  times(element_bytes);
  while (digits.size() > 1 && digits.back() == 0) digits.pop_back();
  if (digits.size() == 1 && digits[0] == 0) negative = false;
  std::string r = std::to_string(digits.back());
  for (std::size_t i = digits.size() - 1; i-- > 0;) {
    std::string part = std::to_string(digits[i]);
    r += std::string(9 - part.size(), '0') + part;
  }
  return negative ? "-" + r : r;
}

strides contiguous_strides(const shape& s) noexcept {
  strides st{};
  // Saturating: a shape whose element count overflows is refused by
  // validation, which may ask for its strides first (no signed overflow).
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, s[i], &acc)) acc = std::numeric_limits<int64_t>::max();
  }
  return st;
}

bool is_contiguous(const shape& s, const strides& st) noexcept {
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    if (s[i] != 1 && st[i] != acc) return false;
    if (__builtin_mul_overflow(acc, s[i], &acc)) acc = std::numeric_limits<int64_t>::max();
  }
  return true;
}

}  // namespace ag
