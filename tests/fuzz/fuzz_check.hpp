#pragma once
/// \file fuzz_check.hpp
/// What every fuzz target shares: FUZZ_CHECK (a property that must hold for
/// any input: a violated one aborts, which libFuzzer reports as a crash with
/// the input saved) and a small reader that turns the fuzzer's bytes into
/// values. Each target defines LLVMFuzzerTestOneInput; the same source also
/// builds with replay_main.cpp into a gtest-free program that runs a corpus
/// (the regression run in the normal test suite).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "graph/error.hpp"

#define FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                              \
      std::fprintf(stderr, "\n");                                                     \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

namespace ag::fuzz {

/// AG_FUZZ_VERBOSE=1 in the environment: targets say how far each input got
/// (to check that seeds reach the code they are meant for).
inline bool verbose() {
  static const bool v = std::getenv("AG_FUZZ_VERBOSE") != nullptr;
  return v;
}

/// An error value as the API promises it: a real code and a message that says
/// what was wrong.
inline void check_error(const error& e, const char* where) {
  FUZZ_CHECK(!e.ok(), "%s: failed without an error code", where);
  FUZZ_CHECK(!e.message.empty(), "%s: error %s without a message", where, to_string(e.code));
  if (verbose()) std::fprintf(stderr, "%s: %s\n", where, e.to_string().c_str());
}

/// Notes a stage reached, with AG_FUZZ_VERBOSE.
inline void reached(const char* what) {
  if (verbose()) std::fprintf(stderr, "reached: %s\n", what);
}

/// Consumes the fuzzer's bytes front to back; past the end every read is 0.
class byte_reader {
 public:
  byte_reader(const uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
  bool empty() const noexcept { return p_ >= end_; }
  std::size_t left() const noexcept { return static_cast<std::size_t>(end_ - p_); }
  uint8_t u8() noexcept { return p_ < end_ ? *p_++ : 0; }
  template <class T>
  T raw() noexcept {
    T v{};
    const std::size_t n = left() < sizeof(T) ? left() : sizeof(T);
    std::memcpy(&v, p_, n);
    p_ += n;
    return v;
  }
  /// A dimension / index: mostly small, sometimes an edge value (0, -1, huge),
  /// sometimes any 64-bit value: where size arithmetic breaks.
  int64_t dim() noexcept {
    const uint8_t tag = u8();
    switch (tag >> 5) {
      case 0: case 1: case 2: case 3: return tag & 0x1f;              // 0..31
      case 4: return static_cast<int64_t>(u8()) + 1;                  // 1..256
      case 5: return int64_t{1} << ((tag & 0x1f) * 2);                // 2^0 .. 2^62
      case 6: return -static_cast<int64_t>(tag & 0x1f);                // 0..-31
      default: return raw<int64_t>();                                  // anything
    }
  }
  /// A string of up to `max` bytes (length first).
  std::string str(std::size_t max) {
    const std::size_t n = u8() % (max + 1);
    std::string s;
    for (std::size_t i = 0; i < n && !empty(); ++i) s += static_cast<char>(u8());
    return s;
  }
  /// The rest of the input.
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), left());
    p_ = end_;
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace ag::fuzz
