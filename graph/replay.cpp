#include "graph/replay.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "graph/plan.hpp"

namespace ag {

const char* to_string(graph_replay_mode m) noexcept {
  switch (m) {
    case graph_replay_mode::off: return "off";
    case graph_replay_mode::on: return "on";
    case graph_replay_mode::automatic: return "auto";
  }
  return "?";
}

bool replays_on(graph_replay_mode m, device_kind kind) noexcept {
  return m != graph_replay_mode::off && kind != device_kind::cpu;
}

bool parse_graph_replay_mode(const std::string& text, graph_replay_mode& out) noexcept {
  if (text == "off") out = graph_replay_mode::off;
  else if (text == "on") out = graph_replay_mode::on;
  else if (text == "auto") out = graph_replay_mode::automatic;
  else return false;
  return true;
}

namespace {

bool same_queue(const step& a, const step& b) noexcept {
  return on_compute_lane(a) && on_compute_lane(b) && a.device == b.device && a.lane == b.lane;
}

int kernels_of(const plan& p, const step& s) {
  int n = 0;
  for (node_id id : s.ops) n += !p.runs_nothing(id);
  return n;
}

}  // namespace

bool captures_host_copy(const plan& p, const step& s) {
  if (!p.options().replay_host_copies || !s.on_compute_stream || s.ops.size() != 1) return false;
  if (s.kind == step_kind::copy_h2d) return true;
  if (s.kind != step_kind::copy_d2h || s.host_blocks != 1) return false;
  const node& n = p.source().at(s.ops.front());
  return !n.is_view() || n.contiguous();
}

std::vector<int> folded_lanes(const plan& p) {
  std::vector<int> lanes(p.devices().size(), 0);
  const bool has_collectives = std::any_of(p.steps().begin(), p.steps().end(),
                                           [](const step& s) { return s.kind == step_kind::collective; });
  if (!p.options().fold_lanes || has_collectives || p.options().graph_replay == graph_replay_mode::off) return lanes;
  for (const step& s : p.steps())
    if (on_compute_lane(s) && s.device >= 0 && static_cast<std::size_t>(s.device) < lanes.size()) {
      int& n = lanes[static_cast<std::size_t>(s.device)];
      n = std::max(n, s.lane + 1);
    }
  for (std::size_t d = 0; d < lanes.size(); ++d)
    if (lanes[d] < 2 || !replays_on(p.options().graph_replay, p.devices()[d].kind)) lanes[d] = 0;
  return lanes;
}

std::vector<replay_segment> replay_segments(const plan& p) {
  // Steps of one (device, lane) queue come in increasing step id (plan.hpp),
  // so one pass in id order sees each queue in lane order.
  std::map<std::pair<int, int>, std::vector<replay_segment>> by_queue;
  std::map<std::pair<int, int>, bool> open;  // last segment of the queue may grow
  const auto waited = waited_deps(p);
  for (const step& s : p.steps()) {
    if (!on_compute_lane(s)) continue;
    const std::pair<int, int> key{s.device, s.lane};
    const bool copy = s.on_compute_stream;
    if (copy && !captures_host_copy(p, s)) {
      // Launched on its own: its host side is the job's own buffer.
      open[key] = false;
      continue;
    }
    auto& segs = by_queue[key];
    bool internal_deps = true;
    for (step_id d : waited[static_cast<std::size_t>(s.id)])
      if (!same_queue(p.at(d), s)) internal_deps = false;
    if (segs.empty() || !open[key] || !internal_deps) segs.push_back(replay_segment{s.device, s.lane, {}, 0});
    segs.back().steps.push_back(s.id);
    if (copy) ++segs.back().copies;
    else segs.back().kernels += kernels_of(p, s);
    bool internal_consumers = true;
    for (step_id c : s.consumers)
      if (!same_queue(p.at(c), s) && waits_for(waited, c, s.id)) internal_consumers = false;
    open[key] = internal_consumers;
  }
  std::vector<replay_segment> out;
  for (auto& [key, segs] : by_queue)
    for (auto& seg : segs) out.push_back(std::move(seg));
  return out;
}

double replay_launch_seconds_saved(const plan& p, const std::vector<replay_segment>& segments, int device) {
  double saved = 0;
  for (const replay_segment& seg : segments) {
    if (device >= 0 && seg.device != device) continue;
    if (seg.kernels < 2) continue;
    const device_spec& d = p.devices().at(static_cast<std::size_t>(seg.device));
    saved += (seg.kernels - 1) * std::max(0.0, d.launch_latency - d.kernel_latency);
  }
  return saved;
}

}  // namespace ag
