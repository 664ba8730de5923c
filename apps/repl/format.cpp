#include "apps/repl/format.hpp"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace ag::repl {

std::string fmt(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, format, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    std::vector<char> buf(static_cast<std::size_t>(n) + 1);
    std::vsnprintf(buf.data(), buf.size(), format, again);
    out.assign(buf.data(), static_cast<std::size_t>(n));
  }
  va_end(again);
  return out;
}

std::string ms_text(int64_t ns) { return fmt("%.1f ms", static_cast<double>(ns) / 1e6); }

std::string seconds_text(double s) {
  if (s < 1) return fmt("%.0f ms", s * 1e3);
  if (s < 90) return fmt("%.0f s", s);
  if (s < 90 * 60) return fmt("%.0f min", s / 60);
  return fmt("%.1f h", s / 3600);
}

std::string bytes_text(double b) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (b < 1024) return fmt("%.0f B", b);
  int u = -1;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  return fmt(u == 0 ? "%.1f %s" : "%.2f %s", b, units[u]);
}

std::string count_text(long long n, const char* word) { return fmt("%lld %s%s", n, word, n == 1 ? "" : "s"); }

}  // namespace ag::repl
