#include "graph/error.hpp"

namespace ag {

const char* to_string(errc code) noexcept {
  switch (code) {
    case errc::ok: return "ok";
    case errc::invalid_argument: return "invalid_argument";
    case errc::invalid_shape: return "invalid_shape";
    case errc::dtype_mismatch: return "dtype_mismatch";
    case errc::cycle: return "cycle";
    case errc::unknown_input: return "unknown_input";
    case errc::missing_input: return "missing_input";
    case errc::unsupported_op: return "unsupported_op";
    case errc::out_of_memory: return "out_of_memory";
    case errc::bad_device_spec: return "bad_device_spec";
    case errc::device_failed: return "device_failed";
    case errc::op_failed: return "op_failed";
    case errc::cancelled: return "cancelled";
    case errc::timeout: return "timeout";
    case errc::shutting_down: return "shutting_down";
    case errc::internal: return "internal";
  }
  return "unknown_error";
}

std::string error::to_string() const {
  if (ok()) return "ok";
  std::string s = ag::to_string(code);
  if (!message.empty()) {
    s += ": ";
    s += message;
  }
  return s;
}

error& error::concerning(int device_index, int32_t step_id, const std::string& op_name) & {
  if (device < 0) device = device_index;
  if (step < 0) step = step_id;
  if (op.empty()) op = op_name;
  return *this;
}

error&& error::concerning(int device_index, int32_t step_id, const std::string& op_name) && {
  concerning(device_index, step_id, op_name);
  return std::move(*this);
}

bad_expected_access::bad_expected_access(error e) : err_(std::move(e)), what_(err_.to_string()) {}

}  // namespace ag
