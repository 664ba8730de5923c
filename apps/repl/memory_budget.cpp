#include "apps/repl/memory_budget.hpp"

#include <unistd.h>

#include "apps/repl/format.hpp"

namespace ag::repl {

std::optional<int64_t> checked_bytes(const shape& dims, dtype type) {
  int64_t n = static_cast<int64_t>(dtype_size(type));
  for (int k = 0; k < dims.rank(); ++k)
    if (dims[k] < 0 || __builtin_mul_overflow(n, dims[k], &n)) return std::nullopt;
  return n;
}

double approx_bytes(const shape& dims, dtype type) {
  double n = static_cast<double>(dtype_size(type));
  for (int k = 0; k < dims.rank(); ++k) n *= static_cast<double>(dims[k]);
  return n;
}

std::string overflow_text(const shape& dims, dtype type) {
  std::string d;
  for (int k = 0; k < dims.rank(); ++k) d += (k ? " x " : "") + std::to_string(dims[k]);
  return d + " " + to_string(type) + " = " + bytes_text(approx_bytes(dims, type)) +
         ", more than a 64-bit byte count holds";
}

double host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

double host_weight_limit() {
  const double m = host_memory_bytes();
  return m > 0 ? m / 4 : 1e300;
}

double host_run_limit() {
  const double m = host_memory_bytes();
  return m > 0 ? m * 3 / 4 : 1e300;
}

error check_node_sizes(const graph& g) {
  for (const node& n : g.nodes())
    if (!checked_bytes(n.dims, n.type))
      return error(errc::invalid_shape, "'" + n.name + "' is " + overflow_text(n.dims, n.type));
  return {};
}

}  // namespace ag::repl
