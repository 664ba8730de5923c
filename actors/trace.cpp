// trace export (actorgraph.hpp): Chrome trace JSON and utilisation.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "actors/actorgraph.hpp"

namespace ag {

namespace {

void json_escape(std::string& out, const std::string& s) {
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

}  // namespace

std::string trace::to_chrome_json() const {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const auto& r : records) t0 = std::min(t0, std::min(r.enqueue_ns ? r.enqueue_ns : r.start_ns, r.start_ns));
  if (records.empty()) t0 = 0;
  // Threads: one per (device, lane), numbered in order of first appearance per device.
  std::map<std::pair<int, std::string>, int> tid;
  for (const auto& r : records) {
    auto key = std::make_pair(r.device, r.lane);
    if (!tid.count(key)) tid.emplace(key, static_cast<int>(tid.size()) + 1);
  }
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",";
    first = false;
  };
  std::set<int> devs;
  for (const auto& r : records) devs.insert(r.device);
  for (int d : devs) {
    sep();
    out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(d) + ",\"args\":{\"name\":\"";
    json_escape(out, d >= 0 && static_cast<std::size_t>(d) < device_names.size() ? device_names[static_cast<std::size_t>(d)]
                                                                                   : "device" + std::to_string(d));
    out += "\"}}";
  }
  for (const auto& [key, id] : tid) {
    sep();
    out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(key.first) + ",\"tid\":" +
           std::to_string(id) + ",\"args\":{\"name\":\"";
    json_escape(out, key.second);
    out += "\"}}";
  }
  char buf[64];
  for (const auto& r : records) {
    sep();
    out += "{\"name\":\"";
    json_escape(out, r.label.empty() ? "step " + std::to_string(r.step) : r.label);
    out += "\",\"cat\":\"";
    json_escape(out, r.lane);
    out += "\",\"ph\":\"X\",\"pid\":" + std::to_string(r.device) +
           ",\"tid\":" + std::to_string(tid[std::make_pair(r.device, r.lane)]);
    std::snprintf(buf, sizeof buf, ",\"ts\":%.3f", static_cast<double>(r.start_ns - t0) / 1e3);
    out += buf;
    std::snprintf(buf, sizeof buf, ",\"dur\":%.3f", static_cast<double>(std::max<int64_t>(0, r.end_ns - r.start_ns)) / 1e3);
    out += buf;
    out += ",\"args\":{\"job\":" + std::to_string(r.job) + ",\"step\":" + std::to_string(r.step);
    std::snprintf(buf, sizeof buf, ",\"enqueue_us\":%.3f}}", static_cast<double>(r.enqueue_ns - t0) / 1e3);
    out += buf;
  }
  out += "]}";
  return out;
}

double trace::utilisation(int device) const {
  // Busy time of the device's compute lanes (union of intervals per lane,
  // averaged over lanes) over [first start, last end] of that device.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> lanes;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const auto& r : records) {
    if (r.device != device || r.end_ns < r.start_ns) continue;
    lo = std::min(lo, r.start_ns);
    hi = std::max(hi, r.end_ns);
    if (r.lane.rfind("compute", 0) == 0) lanes[r.lane].emplace_back(r.start_ns, r.end_ns);
  }
  if (lanes.empty() || hi <= lo) return 0.0;
  double sum = 0;
  for (auto& [name, iv] : lanes) {
    std::sort(iv.begin(), iv.end());
    int64_t busy = 0, cur_s = iv.front().first, cur_e = iv.front().second;
    for (const auto& [s, e] : iv) {
      if (s > cur_e) {
        busy += cur_e - cur_s;
        cur_s = s;
        cur_e = e;
      } else {
        cur_e = std::max(cur_e, e);
      }
    }
    busy += cur_e - cur_s;
    sum += static_cast<double>(busy) / static_cast<double>(hi - lo);
  }
  return sum / static_cast<double>(lanes.size());
}

}  // namespace ag
