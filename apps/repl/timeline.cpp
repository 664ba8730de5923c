#include "apps/repl/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

namespace ag::repl {

char job_char(std::size_t i) noexcept {
  static const char chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  return chars[i % (sizeof chars - 1)];
}

namespace {

int lane_rank(const std::string& lane) {
  if (lane.rfind("compute", 0) == 0) return 0;
  if (lane == "h2d") return 1;
  if (lane == "d2h") return 2;
  if (lane == "peer") return 3;
  return 4;
}

bool is_compute(const std::string& lane) { return lane.rfind("compute", 0) == 0; }

std::string device_name(const trace& t, int d) {
  if (d >= 0 && static_cast<std::size_t>(d) < t.device_names.size()) return t.device_names[static_cast<std::size_t>(d)];
  return "dev" + std::to_string(d);
}

std::string fmt_time(double ns) {
  char buf[32];
  if (ns >= 1e9) std::snprintf(buf, sizeof buf, "%.3gs", ns / 1e9);
  else if (ns >= 1e6) std::snprintf(buf, sizeof buf, "%.4gms", ns / 1e6);
  else if (ns >= 1e3) std::snprintf(buf, sizeof buf, "%.4gus", ns / 1e3);
  else if (ns > 0) std::snprintf(buf, sizeof buf, "%.0fns", ns);
  else std::snprintf(buf, sizeof buf, "0");
  return buf;
}

void span_of(const trace& t, int64_t& t0, int64_t& t1) {
  t0 = INT64_MAX;
  t1 = INT64_MIN;
  for (const auto& r : t.records) {
    t0 = std::min(t0, r.start_ns);
    t1 = std::max(t1, std::max(r.end_ns, r.start_ns));
  }
}

// Length of the union of intervals.
int64_t union_length(std::vector<std::pair<int64_t, int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, cur_b = 0, cur_e = INT64_MIN;
  for (auto [b, e] : iv) {
    if (e <= b) continue;
    if (b > cur_e) {
      if (cur_e > cur_b) total += cur_e - cur_b;
      cur_b = b;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e > cur_b) total += cur_e - cur_b;
  return total;
}

double busy_fraction(const trace& t, int device, bool compute) {
  if (t.records.empty()) return 0;
  int64_t t0, t1;
  span_of(t, t0, t1);
  if (t1 <= t0) return 0;
  std::vector<std::pair<int64_t, int64_t>> iv;
  for (const auto& r : t.records)
    if (r.device == device && is_compute(r.lane) == compute) iv.emplace_back(r.start_ns, r.end_ns);
  return static_cast<double>(union_length(std::move(iv))) / static_cast<double>(t1 - t0);
}

}  // namespace

double compute_utilisation(const trace& t, int device) { return busy_fraction(t, device, true); }

std::string render_timeline(const trace& t, const timeline_options& options) {
  if (t.records.empty()) return "timeline: no trace records (run some jobs first)\n";
  const int width = std::max(10, options.width);
  int64_t t0, t1;
  span_of(t, t0, t1);
  const double span = std::max<double>(1.0, static_cast<double>(t1 - t0));
  const double cell = span / width;

  // Jobs in id order get characters 0, 1, 2...
  std::vector<uint64_t> jobs;
  for (const auto& r : t.records) jobs.push_back(r.job);
  std::sort(jobs.begin(), jobs.end());
  jobs.erase(std::unique(jobs.begin(), jobs.end()), jobs.end());
  auto job_index = [&](uint64_t j) {
    return static_cast<std::size_t>(std::lower_bound(jobs.begin(), jobs.end(), j) - jobs.begin());
  };

  using row_key = std::tuple<int, int, std::string>;  // device, lane rank, lane
  std::map<row_key, std::vector<const trace_record*>> rows;
  for (const auto& r : t.records) rows[{r.device, lane_rank(r.lane), r.lane}].push_back(&r);

  std::size_t label_w = 0;
  for (const auto& [k, v] : rows)
    label_w = std::max(label_w, device_name(t, std::get<0>(k)).size() + 1 + std::get<2>(k).size());

  std::string out;
  char head[160];
  std::snprintf(head, sizeof head, "timeline: %zu job%s, %zu device%s, %s (one column = %s)\n", jobs.size(),
                jobs.size() == 1 ? "" : "s", t.device_names.empty() ? rows.size() : t.device_names.size(),
                (t.device_names.size() == 1) ? "" : "s", fmt_time(span).c_str(), fmt_time(cell).c_str());
  out += head;
  for (const auto& [k, recs] : rows) {
    std::vector<double> best(static_cast<std::size_t>(width), 0.0);
    std::string line(static_cast<std::size_t>(width), '.');
    for (const trace_record* r : recs) {
      const double b = static_cast<double>(r->start_ns - t0), e = std::max(b, static_cast<double>(r->end_ns - t0));
      int c0 = static_cast<int>(std::floor(b / cell));
      int c1 = std::max(c0 + 1, static_cast<int>(std::ceil(e / cell)));
      c0 = std::clamp(c0, 0, width - 1);
      c1 = std::clamp(c1, c0 + 1, width);
      for (int c = c0; c < c1; ++c) {
        const double lo = std::max(b, c * cell), hi = std::min(e, (c + 1) * cell);
        // Tiny steps still get their cell (covering at least a sliver).
        const double cover = std::max(hi - lo, 1e-9);
        if (cover > best[static_cast<std::size_t>(c)]) {
          best[static_cast<std::size_t>(c)] = cover;
          line[static_cast<std::size_t>(c)] = job_char(job_index(r->job));
        }
      }
    }
    std::string label = device_name(t, std::get<0>(k)) + " " + std::get<2>(k);
    label.resize(label_w, ' ');
    out += label + " |" + line + "|\n";
  }

  // Axis: ticks at a 1/2/5 x 10^k step, about every 12 columns.
  const double raw_step = span / (width / 12.0);
  const double mag = std::pow(10.0, std::floor(std::log10(raw_step)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw_step) { step = m * mag; break; }
  std::string axis(static_cast<std::size_t>(width), '-');
  std::string labels(static_cast<std::size_t>(width) + 12, ' ');
  for (double tt = 0; tt <= span + 1e-9; tt += step) {
    const int c = std::min(width - 1, static_cast<int>(std::lround(tt / cell)));
    if (c > 0) axis[static_cast<std::size_t>(c)] = '+';  // the left border is the 0 tick
    const std::string l = fmt_time(tt);
    bool free = true;
    for (std::size_t i = 0; i < l.size() + 1 && c + i < labels.size(); ++i)
      free = free && labels[c + i] == ' ' && (c == 0 || labels[c - 1] == ' ');
    if (free && c + l.size() <= labels.size()) labels.replace(static_cast<std::size_t>(c), l.size(), l);
  }
  while (!labels.empty() && labels.back() == ' ') labels.pop_back();
  out += std::string(label_w, ' ') + " +" + axis + "+\n";
  out += std::string(label_w + 2, ' ') + labels + "\n";

  if (options.legend) {
    std::string legend = "jobs: ";
    if (jobs.size() <= 12) {
      for (std::size_t i = 0; i < jobs.size(); ++i)
        legend += std::string(i ? " " : "") + job_char(i) + "=" + std::to_string(jobs[i]);
    } else {
      if (jobs.size() <= 62)
        legend += std::string(1, job_char(0)) + ".." + job_char(jobs.size() - 1) + " = jobs " + std::to_string(jobs.front()) +
                  ".." + std::to_string(jobs.back()) + " in id order";
      else
        legend += std::to_string(jobs.front()) + ".." + std::to_string(jobs.back()) +
                  " drawn as 0-9, a-z, A-Z in id order, starting again after 62";
    }
    out += legend + "; '.' idle\n";
  }
  return out;
}

std::string render_utilisation(const trace& t) {
  if (t.records.empty()) return "util: no trace records (run some jobs first)\n";
  int64_t t0, t1;
  span_of(t, t0, t1);
  int max_dev = -1;
  for (const auto& r : t.records) max_dev = std::max(max_dev, r.device);
  const int n = std::max<int>(max_dev + 1, static_cast<int>(t.device_names.size()));
  std::size_t name_w = 4;
  for (int d = 0; d < n; ++d) name_w = std::max(name_w, device_name(t, d).size());
  std::string out = "utilisation over " + fmt_time(static_cast<double>(t1 - t0)) + ":\n";
  for (int d = 0; d < n; ++d) {
    const double c = busy_fraction(t, d, true), x = busy_fraction(t, d, false);
    const int filled = static_cast<int>(std::lround(c * 30));
    std::string name = device_name(t, d);
    name.resize(name_w, ' ');
    char buf[200];
    std::snprintf(buf, sizeof buf, "  %s compute %5.1f%% [%s%s]  copies %5.1f%%\n", name.c_str(), c * 100,
                  std::string(static_cast<std::size_t>(filled), '#').c_str(),
                  std::string(static_cast<std::size_t>(30 - filled), ' ').c_str(), x * 100);
    out += buf;
  }
  return out;
}

}  // namespace ag::repl
