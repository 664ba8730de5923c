#pragma once
/// \file error.hpp
/// Errors as values. Every fallible call in actorgraph returns `ag::error` or
/// `ag::expected<T>`; no exception crosses a library boundary or an actor
/// message handler. The one exception is a caller's bug: expected::value() on
/// an error throws bad_expected_access. graph/ is pure C++: the actors
/// translate these to caf::error at their boundary (messages/caf_error.hpp).

#include <cstdint>
#include <exception>
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
///
/// Besides the text, an error carries *what it concerns* as data, set where
/// the error is made: the device index, the plan step and the op (node name).
/// Callers decide on these fields and on `code`, never on the message text
/// (which is for people and may change). Unset fields are -1 / empty.
struct error {
  errc code = errc::ok;
  std::string message;
  int device = -1;     ///< index of the device it concerns (runtime order); -1: none
  int32_t step = -1;   ///< id of the plan step it concerns (ag::step_id); -1: none
  std::string op;      ///< name of the graph node (op) it concerns; empty: none

  error() = default;
  error(errc c, std::string msg) : code(c), message(std::move(msg)) {}
  error(errc c, std::string msg, int device_index, int32_t step_id = -1, std::string op_name = {})
      : code(c), message(std::move(msg)), device(device_index), step(step_id), op(std::move(op_name)) {}

  /// True when this holds an error (not ok).
  explicit operator bool() const noexcept { return code != errc::ok; }
  bool ok() const noexcept { return code == errc::ok; }
  /// "invalid_shape: matmul 'attn.qk': inner dims differ (64 vs 32)": the
  /// code and the message (the fields are named in the message where it
  /// matters to a reader; they are not repeated here).
  std::string to_string() const;

  /// Sets the fields still unset (keeps those already set: the innermost
  /// maker knows best). Returns *this for chaining.
  error& concerning(int device_index, int32_t step_id = -1, const std::string& op_name = {}) &;
  error&& concerning(int device_index, int32_t step_id = -1, const std::string& op_name = {}) &&;
};

/// Thrown by expected<T>::value() (and operator*, operator->) when the
/// expected holds an error: accessing the value of a failed call is a bug in
/// the caller, not a runtime condition, so it is reported loudly and with the
/// error itself (what() is error::to_string()), never as a bare
/// std::bad_variant_access. Library code checks has_value() first and never
/// lets this cross a library boundary or an actor message handler.
class bad_expected_access : public std::exception {
 public:
  explicit bad_expected_access(error e);
  const char* what() const noexcept override { return what_.c_str(); }
  /// The error the expected held.
  const ag::error& err() const noexcept { return err_; }

 private:
  ag::error err_;
  std::string what_;
};

/// Either a value or an error (C++23's std::expected is not in g++ 12).
template <class T>
class expected {
 public:
  expected(T value) : v_(std::move(value)) {}           // NOLINT: implicit on purpose
  expected(error err) : v_(std::move(err)) {}           // NOLINT: implicit on purpose

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value; throws bad_expected_access (carrying the error) when this
  /// holds an error.
  T& value() & {
    check();
    return std::get<0>(v_);
  }
  const T& value() const& {
    check();
    return std::get<0>(v_);
  }
  T&& value() && {
    check();
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; only valid when !has_value().
  const error& err() const& { return std::get<1>(v_); }

 private:
  void check() const {
    if (v_.index() != 0) throw bad_expected_access(std::get<1>(v_));
  }
  std::variant<T, error> v_;
};

}  // namespace ag
