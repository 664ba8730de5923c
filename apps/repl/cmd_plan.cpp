// plan and set: the parallelism settings and the compiled plan, which is
// refused before loading when the devices that live in host memory would
// not fit this host.
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

expected<session::impl::layout> session::impl::read_layout(params& p) const {
  layout l{stages, lanes};
  auto st = p.get_int("stages", 0, 4096);
  if (!st) return st.err();
  auto ln = p.get_int("lanes", 1, 64);
  if (!ln) return ln.err();
  if (*st) l.stages = static_cast<int>(**st);
  if (*ln) l.lanes = static_cast<int>(**ln);
  return l;
}

void session::impl::apply_layout(layout l) {
  if (l.stages == stages && l.lanes == lanes) return;
  stages = l.stages;
  lanes = l.lanes;
  plan_ptr.reset();
}

std::string session::impl::settings_text() const {
  return fmt("stages=%d%s microbatches=%d lanes=%d check=%s seed=%llu", stages, stages == 0 ? " (all devices)" : "", microbatches,
             lanes, to_string(check), static_cast<unsigned long long>(seed));
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
