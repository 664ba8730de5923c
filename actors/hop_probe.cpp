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
  for (row& r : table()) {
    bool all = true;
    for (const auto& t : r) all = all && t.load(std::memory_order_relaxed) != 0;
    if (all) {
      const int64_t t0 = r[0].load(std::memory_order_relaxed);
      for (int k = 1; k < points; ++k)
        us[static_cast<std::size_t>(k)].push_back(static_cast<double>(r[static_cast<std::size_t>(k)].load() - t0) / 1e3);
    }
    for (auto& t : r) t.store(0, std::memory_order_relaxed);
  }
  std::string out = "hop probes (median us after submit";
  if (us[1].empty()) return out + "): no job stamped every point\n";
  out += ", " + std::to_string(us[1].size()) + " jobs):\n";
  std::vector<std::pair<double, int>> order;
  for (int k = 1; k < points; ++k) {
    auto& v = us[static_cast<std::size_t>(k)];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    order.emplace_back(v[v.size() / 2], k);
  }
  std::sort(order.begin(), order.end());
  char line[96];
  for (auto [m, k] : order) {
    std::snprintf(line, sizeof line, "  %-20s %8.2f\n", name(static_cast<point>(k)), m);
    out += line;
  }
  return out;
}
#else
void stamp(point, uint64_t) noexcept {}
std::string report() { return {}; }
#endif

}  // namespace ag::actors::hop_probe
