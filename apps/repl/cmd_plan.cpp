// plan and set: the parallelism settings and the compiled plan, which is
// refused before loading when the devices that live in host memory would
// not fit this host.
#include <cstdlib>
#include <optional>

#include "actors/launch_program.hpp"
#include "apps/repl/memory_budget.hpp"
#include "apps/repl/session_impl.hpp"

namespace ag::repl {

const char* to_string(check_mode m) noexcept {
  switch (m) {
    case check_mode::automatic: return "auto";
    case check_mode::all: return "all";
    case check_mode::first: return "first";
    case check_mode::off: return "off";
  }
  return "?";
}

expected<std::optional<check_mode>> read_check(params& p) {
  const auto r = p.raw("check");
  if (!r) return std::optional<check_mode>{};
  if (*r == "auto") return std::optional<check_mode>{check_mode::automatic};
  if (*r == "all" || *r == "on") return std::optional<check_mode>{check_mode::all};
  if (*r == "first") return std::optional<check_mode>{check_mode::first};
  if (*r == "off") return std::optional<check_mode>{check_mode::off};
  return bad_arg("check: '" + *r + "' is not one of auto, all, first, off");
}

/// "3,1" or "3:1": positive proportions, one per tensor-parallel rank.
expected<std::vector<double>> parse_ratios(const std::string& text) {
  std::vector<double> r;
  if (text == "even" || text.empty()) return r;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = text.find_first_of(",:", at);
    const std::string item = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    char* stop = nullptr;
    const double v = std::strtod(item.c_str(), &stop);
    if (item.empty() || stop != item.c_str() + item.size() || !(v > 0) || v > 1e9)
      return bad_arg("ratios: '" + item + "' in '" + text + "' is not a positive number (write e.g. ratios=3,1 or ratios=even)");
    r.push_back(v);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return r;
}

expected<session::impl::layout> session::impl::read_layout(params& p) const {
  layout l{stages, lanes, tp, ratios, replay, sp, job_lanes};
  auto st = p.get_int("stages", 0, 4096);
  if (!st) return st.err();
  // lanes=auto (0): the planner decides (plan_options::lanes_per_device 0)
  std::optional<int64_t> lanes_given;
  if (auto r = p.raw("lanes"); r && *r == "auto") {
    lanes_given = 0;
  } else {
    auto ln = p.get_int("lanes", 1, 64);
    if (!ln) return ln.err();
    lanes_given = *ln;
  }
  auto t = p.get_int("tp", 1, 4096);
  if (!t) return t.err();
  if (*st) l.stages = static_cast<int>(**st);
  if (lanes_given) l.lanes = static_cast<int>(*lanes_given);
  if (*t) {
    l.tp = static_cast<int>(**t);
    l.ratios.clear();  // a new degree starts even unless ratios= says otherwise
  }
  if (auto r = p.raw("ratios")) {
    auto v = parse_ratios(*r);
    if (!v) return v.err();
    l.ratios = std::move(*v);
  }
  if (auto r = p.raw("replay")) {
    if (!parse_graph_replay_mode(*r, l.replay))
      return bad_arg("replay: '" + *r + "' is not on, off or auto");
  }
  // joblanes=auto (0) or a count (plan_options::job_lanes: 1 is off).
  if (auto r = p.raw("joblanes"); r && *r == "auto") {
    l.job_lanes = 0;
  } else {
    auto jl = p.get_int("joblanes", 1, 8);
    if (!jl) return jl.err();
    if (*jl) l.job_lanes = static_cast<int>(**jl);
  }
  if (auto r = p.raw("sp")) {
    if (!parse_sequence_parallel_mode(*r, l.sp)) return bad_arg("sp: '" + *r + "' is not on, off or auto");
  }
  if (!l.ratios.empty() && static_cast<int>(l.ratios.size()) != l.tp)
    return bad_arg(fmt("ratios: %zu entries for tp=%d (one per device of a stage)", l.ratios.size(), l.tp));
  return l;
}

void session::impl::apply_layout(layout l) {
  if (l.stages == stages && l.lanes == lanes && l.tp == tp && l.ratios == ratios && l.replay == replay && l.sp == sp &&
      l.job_lanes == job_lanes)
    return;
  job_lanes = l.job_lanes;
  replay = l.replay;
  sp = l.sp;
  stages = l.stages;
  lanes = l.lanes;
  tp = l.tp;
  ratios = std::move(l.ratios);
  plan_ptr.reset();
}

std::string session::impl::settings_text() const {
  std::string r;
  for (double v : ratios) r += (r.empty() ? "" : ",") + fmt("%g", v);
  return fmt("stages=%d%s tp=%d%s sp=%s microbatches=%d lanes=%s joblanes=%s replay=%s check=%s seed=%llu", stages,
             stages == 0 ? (tp > 1 ? " (devices / tp)" : " (all devices)") : "", tp,
             ratios.empty() ? "" : (" ratios=" + r).c_str(), to_string(sp), microbatches,
             lanes == 0 ? "auto" : std::to_string(lanes).c_str(),
             job_lanes == 0 ? "auto" : std::to_string(job_lanes).c_str(), to_string(replay), to_string(check),
             static_cast<unsigned long long>(seed));
}

bool session::impl::host_backed(const device_spec& d) const {
  return d.kind == device_kind::cpu || (d.kind == device_kind::sim && values);
}

expected<std::shared_ptr<const plan>> session::impl::get_plan() {
  if (!g) return bad_arg("no graph: build one with 'model gpt2' or 'graph ...' first");
  if (auto e = ensure_runtime()) return e;
  if (plan_ptr) return plan_ptr;
  plan_options po;
  po.pipeline_stages = stages;
  po.lanes_per_device = lanes;
  po.job_lanes = job_lanes;
  po.graph_replay = replay;
  po.tensor_parallel = tp;
  po.shard_ratios = ratios;
  po.sequence_parallel = sp;
  // Plan first without loading (the planner allocates nothing): a plan that
  // does not fit a device fails here with its sizes, and loading one whose
  // host-backed devices would not fit this host's memory is refused.
  auto dry = ag::compile(g, rt->devices(), po);
  if (!dry) return dry.err();
  double host = 0;
  std::string parts;
  for (int d : (*dry)->used_devices()) {
    const device_spec& ds = rt->devices()[static_cast<std::size_t>(d)];
    if (!host_backed(ds)) continue;
    const device_memory& m = (*dry)->memory()[static_cast<std::size_t>(d)];
    host += static_cast<double>(m.weight_bytes + m.arena_bytes);
    parts += fmt("%s%s: weights %s + arena %s", parts.empty() ? "" : "; ", ds.name.c_str(),
                 bytes_text(static_cast<double>(m.weight_bytes)).c_str(), bytes_text(static_cast<double>(m.arena_bytes)).c_str());
  }
  if (host > host_run_limit())
    return error(errc::out_of_memory,
                 fmt("loading the plan would take %s of host memory (%s), more than this host allows (%s, 3/4 of its "
                     "memory): cpu devices and sim devices with values=on keep their memory on the host ('devices ... "
                     "values=off' times the sim without it)",
                     bytes_text(host).c_str(), parts.c_str(), bytes_text(host_run_limit()).c_str()));
  auto p = rt->compile(g, po);
  if (!p) return p.err();
  plan_ptr = *p;
  return plan_ptr;
}

outcome session::impl::cmd_plan(const command_line& c) {
  params p(c);
  auto l = read_layout(p);
  if (!l) return fail(l.err());
  if (auto e = p.finish(0)) return fail(e);
  apply_layout(*l);
  auto pl = get_plan();
  if (!pl) return fail(pl.err(), !g);
  const std::string d = (*pl)->describe();
  out << d;
  if (!d.empty() && d.back() != '\n') out << "\n";
  // Whether the lowering ran the decode step as one kernel is the launch
  // program's to say (describe() can only say it may).
  if (d.find("decode step: may run as one kernel") != std::string::npos)
    if (auto prog = actors::lower(*pl)) out << "  " << (*prog)->decode_step_note() << "\n";
  return {};
}

outcome session::impl::cmd_set(const command_line& c) {
  params p(c);
  auto l = read_layout(p);
  if (!l) return fail(l.err());
  auto mb = p.get_int("microbatches", 1, 100000);
  if (!mb) return fail(mb.err());
  auto sd = p.get_int("seed", 0, INT64_MAX);
  if (!sd) return fail(sd.err());
  auto ck = read_check(p);
  if (!ck) return fail(ck.err());
  if (auto e = p.finish()) return fail(e);
  if (!c.positional.empty()) return fail(bad_arg("expected key=value, got '" + c.positional[0].text + "'"));
  apply_layout(*l);
  if (*mb) microbatches = static_cast<int>(**mb);
  if (*sd) seed = next_seed = static_cast<uint64_t>(**sd);
  if (*ck) check = **ck;
  out << settings_text() << "\n";
  return {};
}

}  // namespace ag::repl
