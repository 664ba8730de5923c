#pragma once
/// \file error.hpp
/// Errors as values. Every fallible call in actorgraph returns `ag::error` or
/// `ag::expected<T>`; no exception crosses a library boundary or an actor
/// message handler. graph/ is pure C++: the actors translate these to
/// caf::error at their boundary (messages/caf_error.hpp).

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace ag {

/// Documented error codes. Stable numbers: they cross process boundaries.
enum class errc : uint8_t {
  ok = 0,
  invalid_argument = 1,   ///< a call's argument is out of range or malformed
  invalid_shape = 2,      ///< shapes do not fit an op, or an input has the wrong shape
  dtype_mismatch = 3,     ///< dtypes do not fit an op, or an input has the wrong dtype
  cycle = 4,              ///< the graph has a cycle
  unknown_input = 5,      ///< a node names an input id that does not exist (dangling)
  missing_input = 6,      ///< an op has fewer inputs than it needs, or a job lacks an input
  unsupported_op = 7,     ///< no device of the plan can run this op
  out_of_memory = 8,      ///< a plan or job does not fit a device's memory
  bad_device_spec = 9,    ///< a device spec string names an unknown device or is malformed
  device_failed = 10,     ///< a device died or reported a fault
  op_failed = 11,         ///< a kernel / op failed while running
  cancelled = 12,         ///< the job was cancelled by its owner
  timeout = 13,           ///< a wait or request ran past its deadline
  shutting_down = 14,     ///< the runtime is stopping and takes no new work
  internal = 15,          ///< a bug in actorgraph: please report it
};

/// Short stable name of a code, e.g. "invalid_shape".
const char* to_string(errc code) noexcept;

/// An error code with a human-readable message that says what was wrong and
/// where (node name, device, split, op). A default-constructed error is "ok".
struct error {
  errc code = errc::ok;
  std::string message;

  error() = default;
  error(errc c, std::string msg) : code(c), message(std::move(msg)) {}

  /// True when this holds an error (not ok).
  explicit operator bool() const noexcept { return code != errc::ok; }
  bool ok() const noexcept { return code == errc::ok; }
  /// "invalid_shape: matmul 'attn.qk': inner dims differ (64 vs 32)"
  std::string to_string() const;
};

/// Either a value or an error (C++23's std::expected is not in g++ 12).
template <class T>
class expected {
 public:
  expected(T value) : v_(std::move(value)) {}           // NOLINT: implicit on purpose
  expected(error err) : v_(std::move(err)) {}           // NOLINT: implicit on purpose

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; only valid when !has_value().
  const error& err() const& { return std::get<1>(v_); }

 private:
  std::variant<T, error> v_;
};

}  // namespace ag
