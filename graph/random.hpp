#pragma once
/// \file random.hpp
/// A small deterministic generator (splitmix64 seeding xoshiro256**): the same
/// seed gives the same numbers on every platform and compiler, unlike the
/// std:: distributions. Used for weights, test data and sim jitter.

#include <cmath>
#include <cstdint>

namespace ag {

class rng {
 public:
  explicit rng(uint64_t seed) noexcept {
    for (auto& w : s_) w = splitmix(seed);
  }
  uint64_t next() noexcept {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  /// Uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Standard normal (Box-Muller, both values used).
  double normal() noexcept {
    if (has_spare_) { has_spare_ = false; return spare_; }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(6.283185307179586 * u2);
    has_spare_ = true;
    return r * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t& x) noexcept {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace ag
