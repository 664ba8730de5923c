// Hop probes (hop_probe.hpp): a fixed table of stamps by job id.
#include "actors/hop_probe.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <utility>
#include <vector>

#include "gpu/device.hpp"

namespace ag::actors::hop_probe {
#ifdef AG_HOP_PROBES
namespace {

constexpr int points = static_cast<int>(point::count);
constexpr std::size_t rows = std::size_t{1} << 16;

const char* name(point p) {
  static constexpr std::array<const char*, points> names = {
      "submit",          "context made",  "actor bound",   "arenas taken",  "slots sized",
      "outputs made",    "buffers ready", "prepared",      "registered",    "run_job sent",
      "actor has it",    "graph found",   "replay called", "launched",      "notify called",
      "notify registered", "poller saw it", "fulfilled"};
  return names[static_cast<std::size_t>(p)];
}

using row = std::array<std::atomic<int64_t>, points>;
std::vector<row>& table() {
  static std::vector<row> t(rows);  // zeroed
  return t;
}

}  // namespace

void stamp(point p, uint64_t job) noexcept {
  table()[job % rows][static_cast<std::size_t>(p)].store(gpu::host_clock_ns(), std::memory_order_relaxed);
}

std::string report() {
  std::vector<std::vector<double>> us(points);
  std::size_t jobs = 0;
  constexpr auto first = static_cast<std::size_t>(point::submit), last = static_cast<std::size_t>(point::fulfilled);
  for (row& r : table()) {
    const int64_t t0 = r[first].load(std::memory_order_relaxed);
    if (t0 != 0 && r[last].load(std::memory_order_relaxed) != 0) {
      ++jobs;
      // A path may pass some points by (a launch handed to the backend has no `launched`).
      for (int k = 1; k < points; ++k)
        if (const int64_t t = r[static_cast<std::size_t>(k)].load(std::memory_order_relaxed); t != 0)
          us[static_cast<std::size_t>(k)].push_back(static_cast<double>(t - t0) / 1e3);
    }
    for (auto& t : r) t.store(0, std::memory_order_relaxed);
  }
  std::string out = "hop probes (median us after submit";
  if (jobs == 0) return out + "): no job stamped both submit and fulfilled\n";
  out += ", " + std::to_string(jobs) + " jobs):\n";
  std::vector<std::pair<double, int>> order;
  for (int k = 1; k < points; ++k) {
    auto& v = us[static_cast<std::size_t>(k)];
    if (v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    order.emplace_back(v[v.size() / 2], k);
  }
  std::sort(order.begin(), order.end());
  char line[120];
  for (auto [m, k] : order) {
    const std::size_t n = us[static_cast<std::size_t>(k)].size();
    if (n == jobs)
      std::snprintf(line, sizeof line, "  %-20s %8.2f\n", name(static_cast<point>(k)), m);
    else
      std::snprintf(line, sizeof line, "  %-20s %8.2f  (%zu jobs)\n", name(static_cast<point>(k)), m, n);
    out += line;
  }
  return out;
}
#else
void stamp(point, uint64_t) noexcept {}
std::string report() { return {}; }
#endif

}  // namespace ag::actors::hop_probe
