// timeline, util, trace: views of what ran, from the runtime's trace records
// of the session's own jobs.
#include <algorithm>
#include <fstream>

#include "apps/repl/session_impl.hpp"
#include "apps/repl/timeline.hpp"

namespace ag::repl {

void session::impl::collect_trace() {
  if (!rt) return;
  trace t = rt->take_trace();
  if (!t.device_names.empty()) device_names = t.device_names;
  for (trace_record& r : t.records) {
    auto it = rt_ids.find(r.job);
    if (it == rt_ids.end()) continue;  // not a job of this session
    r.job = it->second;
    records.push_back(std::move(r));
  }
  // Bound memory across long sessions: keep the newest records.
  constexpr std::size_t cap = 500000;
  if (records.size() > cap) records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(records.size() - cap));
}

trace session::impl::trace_of(int batch_id) const {
  trace t;
  t.device_names = device_names;
  const batch_entry* b = batch_of(batch_id);
  if (!b) return t;
  std::vector<uint64_t> ids = b->jobs;
  std::sort(ids.begin(), ids.end());
  for (const auto& r : records)
    if (std::binary_search(ids.begin(), ids.end(), r.job)) t.records.push_back(r);
  return t;
}

expected<int> session::impl::batch_arg(params& p) {
  auto b = p.get_int("batch", 1, 1 << 30);
  if (!b) return b.err();
  if (batches.empty()) return bad_arg("nothing has run yet: 'run' first");
  if (!*b) return batches.back().id;
  if (!batch_of(static_cast<int>(**b))) return bad_arg(fmt("no run %lld (runs 1..%zu)", static_cast<long long>(**b), batches.size()));
  return static_cast<int>(**b);
}

std::string session::impl::partial_note(int id) const {
  const batch_entry* b = batch_of(id);
  if (b && b->reported < b->n) return fmt("(run %d still running: %d/%d jobs finished)\n", id, b->reported, b->n);
  return {};
}

outcome session::impl::cmd_timeline(const command_line& c) {
  params p(c);
  auto w = p.get_int("width", 20, 1000);
  if (!w) return fail(w.err());
  auto b = batch_arg(p);
  if (!b) return fail(b.err());
  if (auto e = p.finish(0)) return fail(e);
  collect_trace();
  timeline_options o;
  o.width = *w ? static_cast<int>(**w) : opt.width;
  out << render_timeline(trace_of(*b), o) << partial_note(*b);
  return {};
}

outcome session::impl::cmd_util(const command_line& c) {
  params p(c);
  auto b = batch_arg(p);
  if (!b) return fail(b.err());
  if (auto e = p.finish(0)) return fail(e);
  collect_trace();
  out << render_utilisation(trace_of(*b)) << partial_note(*b);
  return {};
}

outcome session::impl::cmd_trace(const command_line& c) {
  params p(c);
  if (c.positional.size() != 1) return fail(bad_arg("one file name expected"));
  auto b = batch_arg(p);
  if (!b) return fail(b.err());
  if (auto e = p.finish()) return fail(e);
  collect_trace();
  const trace t = trace_of(*b);
  const std::string& path = c.positional[0].text;
  std::ofstream f(path);
  if (!f) return fail(bad_arg("cannot write '" + path + "'"), false);
  f << t.to_chrome_json();
  f.close();
  if (!f) return fail(bad_arg("writing '" + path + "' failed"), false);
  out << fmt("wrote %zu events of run %d to %s (open in https://ui.perfetto.dev or chrome://tracing)\n", t.records.size(), *b,
             path.c_str());
  out << partial_note(*b);
  return {};
}

}  // namespace ag::repl
