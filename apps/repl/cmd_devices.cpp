// devices and fault: choosing the devices, and injecting faults into the
// simulated ones (both create the runtime again).
#include "apps/repl/session_impl.hpp"

namespace ag::repl {

namespace {

// The spec's items as the library's parser reads them; the error says where
// in the command line the spec word starts.
expected<std::vector<gpu::device_request>> parse_spec_word(const word& w) {
  auto r = gpu::parse_device_spec(w.text);
  if (!r) return error(r.err().code, fmt("col %zu: ", w.pos + 1) + r.err().message);
  return r;
}

bool has_kind(const std::vector<gpu::device_request>& items, device_kind k) {
  for (const auto& it : items)
    if (it.kind == k) return true;
  return false;
}

}  // namespace

std::string session::impl::devices_text() const {
  std::string t = "devices (" + spec + "):";
  bool any_sim = false;
  for (const auto& d : rt->devices()) {
    any_sim = any_sim || d.kind == device_kind::sim;
    t += fmt("\n  %-6s %-4s %6.1f TFLOP/s f32  %6.2f TB/s  %s  launch %.1f us  link %.0f GB/s", d.name.c_str(),
             ag::to_string(d.kind), d.flops_f32 / 1e12, d.mem_bandwidth / 1e12, bytes_text(static_cast<double>(d.mem_bytes)).c_str(),
             d.launch_latency * 1e6, d.link_bandwidth / 1e9);
  }
  if (any_sim)
    t += fmt("\n  sim: time scale %g (a simulated ms takes %.3g ms), jitter %g, values %s", time_scale, time_scale,
             rt_opts.backend.sim.jitter, values ? "computed" : "off (timing only)");
  t += fmt("\n  arenas per device: %d (jobs of one plan in flight)", rt_opts.arenas_per_device);
  if (faults_injected()) t += "\n  " + faults_text();
  return t;
}

std::vector<std::string> session::impl::sim_device_names() const {
  std::vector<std::string> names;
  if (rt)
    for (const auto& d : rt->devices())
      if (d.kind == device_kind::sim) names.push_back(d.name);
  return names;
}

bool session::impl::faults_injected() const {
  const gpu::fault_config& f = rt_opts.backend.sim.faults;
  return f.op_error_rate > 0 || f.op_stall_rate > 0 || f.die_after_ops >= 0;
}

std::string session::impl::faults_text() const {
  const gpu::fault_config& f = rt_opts.backend.sim.faults;
  if (!faults_injected()) return "faults: none";
  std::string names;
  for (const auto& n : sim_device_names()) names += (names.empty() ? "" : ", ") + n;
  std::string t = "faults on " + names + ":";
  if (f.op_error_rate > 0) t += fmt(" op errors in %g%% of ops;", f.op_error_rate * 100);
  if (f.op_stall_rate > 0)
    t += fmt(" stalls of %s in %g%% of ops;", f.stall_seconds < 1 ? fmt("%g ms", f.stall_seconds * 1e3).c_str() : fmt("%g s", f.stall_seconds).c_str(),
             f.op_stall_rate * 100);
  if (f.die_after_ops >= 0) t += fmt(" dies after %lld ops;", static_cast<long long>(f.die_after_ops));
  t.pop_back();
  return t;
}

outcome session::impl::cmd_devices(const command_line& c) {
  params p(c);
  if (c.positional.size() > 1) return fail(bad_arg("one device spec expected, got " + std::to_string(c.positional.size())));
  runtime_options o = rt_opts;
  double scale = time_scale;
  bool vals = values;
  auto& sp = o.backend.sim.spec;
  // Each sim parameter: read it, and apply it when given.
  auto number = [&](const char* key, double lo, double hi, auto apply) -> error {
    auto v = p.get_number(key, lo, hi);
    if (!v) return v.err();
    if (*v) apply(**v);
    return {};
  };
  for (error e : {number("flops", 1e6, 1e18, [&](double v) { sp.flops_bf16 *= v / sp.flops_f32; sp.flops_f32 = v; }),
                  number("bw", 1e6, 1e16, [&](double v) { sp.mem_bandwidth = v; }),
                  number("link", 1e6, 1e16, [&](double v) { sp.link_bandwidth = v; }),
                  number("latency", 0, 1, [&](double v) { sp.launch_latency = v; }),
                  number("jitter", 0, 2, [&](double v) { o.backend.sim.jitter = v; }),
                  number("scale", 0, 1e6, [&](double v) { scale = v; }),
                  number("mem", 1 << 20, 1e15, [&](double v) { sp.mem_bytes = static_cast<int64_t>(v); })})
    if (e) return fail(e);
  if (auto v = p.get_bool("values"); !v) return fail(v.err());
  else if (*v) vals = **v;
  if (auto v = p.get_int("arenas", 1, 1024); !v) return fail(v.err());
  else if (*v) o.arenas_per_device = static_cast<int>(**v);
  if (auto e = p.finish()) return fail(e);
  // Faults were injected into the devices being replaced ('fault' names
  // them): new devices start healthy.
  o.backend.sim.faults = {};
  if (c.positional.empty() && c.named.empty()) {
    if (auto e = ensure_runtime()) return fail(e, false);
    out << devices_text() << "\n";
    return {};
  }
  const word w = c.positional.empty() ? word{spec.empty() ? "sim:4" : spec, c.rest_pos} : c.positional[0];
  auto items = parse_spec_word(w);
  if (!items) return fail(items.err());
  if (!has_kind(*items, device_kind::sim)) {
    for (const auto& pr : c.named)
      if (pr.key.text != "arenas")
        return fail(at_col(pr.key, pr.key.text + "= applies to sim devices only ('" + w.text + "' has none)"));
  }
  if (auto r = replace_runtime(w.text, o, scale, vals, "changing devices"); r.e) return r;
  out << devices_text() << "\n";
  return {};
}

// The public API sets sim faults only through runtime_options, for every sim
// device at once and when the devices are created: so this command checks
// that the device named is the only sim device (or takes 'sim' for all of
// them) and creates the devices again with the new fault_config.
outcome session::impl::cmd_fault(const command_line& c) {
  params p(c);
  auto stall_seconds = p.get_number("seconds", 0, 3600);
  const word* seconds_word = nullptr;
  for (const auto& pr : c.named)
    if (pr.key.text == "seconds") seconds_word = &pr.value;
  if (!stall_seconds) return fail(seconds_word ? at_col(*seconds_word, stall_seconds.err().message) : stall_seconds.err());
  if (auto e = p.finish()) return fail(e);
  if (auto e = ensure_runtime()) return fail(e, false);
  if (c.positional.empty() && c.named.empty()) {
    out << faults_text() << "\n";
    return {};
  }
  if (c.positional.empty()) return fail(bad_arg("which device? a sim device's name, or 'sim' for every sim device"));
  const word& target = c.positional[0];
  const std::vector<std::string> sims = sim_device_names();
  std::string all_names;
  for (const auto& d : rt->devices()) all_names += (all_names.empty() ? "" : ", ") + d.name;
  if (target.text == "sim") {
    if (sims.empty()) return fail(at_col(target, "no sim devices here (devices: " + all_names + ")"));
  } else {
    const device_spec* named = nullptr;
    for (const auto& d : rt->devices())
      if (d.name == target.text) named = &d;
    if (!named) return fail(at_col(target, "no device '" + target.text + "' (devices: " + all_names + "; 'sim' = every sim device)"));
    if (named->kind != device_kind::sim)
      return fail(at_col(target, "'" + target.text + "' is a " + ag::to_string(named->kind) +
                                     " device: faults can be injected into sim devices only"));
    if (sims.size() > 1)
      return fail(at_col(target, fmt("'%s' is one of %zu sim devices, and the sim backend gives all of them one fault setting: "
                                     "'fault sim ...' injects into every one; to fault one alone, choose devices with one sim "
                                     "device (e.g. 'devices cpu:1,sim:1')",
                                     target.text.c_str(), sims.size())));
  }
  if (c.positional.size() < 2)
    return fail(bad_arg(fmt("col %zu: which fault? error, stall, die or off", target.pos + target.text.size() + 2)));
  if (c.positional.size() > 3) return fail(at_col(c.positional[3], "unexpected '" + c.positional[3].text + "'"));
  const word& kind = c.positional[1];
  const word* value = c.positional.size() > 2 ? &c.positional[2] : nullptr;
  gpu::fault_config f = rt_opts.backend.sim.faults;
  if (kind.text == "error" || kind.text == "stall") {
    double rate = 1;
    if (value) {
      auto r = parse_number(value->text, "rate", 0, 1);
      if (!r) return fail(at_col(*value, r.err().message));
      rate = *r;
    }
    if (kind.text == "error") {
      f.op_error_rate = rate;
    } else {
      f.op_stall_rate = rate;
      if (*stall_seconds) f.stall_seconds = **stall_seconds;
    }
  } else if (kind.text == "die") {
    int64_t after = 0;
    if (value) {
      auto n = parse_int(value->text, "ops", 0, 1000000000000);
      if (!n) return fail(at_col(*value, n.err().message));
      after = *n;
    }
    f.die_after_ops = after;
  } else if (kind.text == "off") {
    if (value) return fail(at_col(*value, "'off' takes no value"));
    f = {};
  } else {
    return fail(at_col(kind, "unknown fault kind '" + kind.text + "' (expected error, stall, die or off)"));
  }
  if (*stall_seconds && kind.text != "stall") {
    for (const auto& pr : c.named)
      if (pr.key.text == "seconds") return fail(at_col(pr.key, "seconds= applies to 'stall' only"));
  }
  runtime_options o = rt_opts;
  o.backend.sim.faults = f;
  if (auto r = replace_runtime(spec, o, time_scale, values, "injecting faults"); r.e) return r;
  out << faults_text() << " (devices " << spec << " created again)\n";
  return {};
}

}  // namespace ag::repl
