// The session: construction, the command dispatch, the runtime it owns, the
// small commands (help, source, echo, quit) and script mode. The command
// families live in cmd_*.cpp (see session_impl.hpp).
#include "apps/repl/session.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "apps/repl/session_impl.hpp"

namespace ag::repl {

namespace {

using handler = outcome (session::impl::*)(const command_line&);

// Every command of commands() has its handler here (a test runs each one).
const std::map<std::string, handler>& handlers() {
  static const std::map<std::string, handler> h = {
      {"help", &session::impl::cmd_help},         {"devices", &session::impl::cmd_devices},
      {"fault", &session::impl::cmd_fault},       {"model", &session::impl::cmd_model},
      {"graph", &session::impl::cmd_graph},       {"plan", &session::impl::cmd_plan},
      {"set", &session::impl::cmd_set},           {"run", &session::impl::cmd_run},
      {"wait", &session::impl::cmd_wait},         {"jobs", &session::impl::cmd_jobs},
      {"job", &session::impl::cmd_job},           {"cancel", &session::impl::cmd_cancel},
      {"timeline", &session::impl::cmd_timeline}, {"util", &session::impl::cmd_util},
      {"trace", &session::impl::cmd_trace},       {"source", &session::impl::cmd_source},
      {"load", &session::impl::cmd_load},         {"generate", &session::impl::cmd_generate},
      {"echo", &session::impl::cmd_echo},         {"quit", &session::impl::cmd_quit},
      {"exit", &session::impl::cmd_quit},
  };
  return h;
}

// Scripts and graph files are read whole, up to these sizes; a line of a
// script read from a pipe up to max_line_bytes.
constexpr std::size_t max_script_bytes = 16u << 20;
constexpr std::size_t max_line_bytes = 1u << 20;

// std::getline with a length limit: false at the end of input or when the
// line is longer than `max` (then `too_long` is set).
bool read_line(std::istream& in, std::string& line, std::size_t max, bool& too_long) {
  line.clear();
  too_long = false;
  for (int c; (c = in.get()) != std::char_traits<char>::eof();) {
    if (c == '\n') return true;
    if (line.size() >= max) {
      too_long = true;
      return false;
    }
    line += static_cast<char>(c);
  }
  return !line.empty();
}

// Lines of a script that are not commands: not echoed.
bool blank_or_comment(const std::string& line) {
  const auto first = line.find_first_not_of(" \t\r");
  return first == std::string::npos || line[first] == '#';
}

}  // namespace

expected<std::string> read_text_file(const std::string& path, std::size_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return bad_arg("'" + path + "' is a directory");
  std::ifstream f(path, std::ios::binary);
  if (!f) return bad_arg("cannot read '" + path + "'");
  std::string text(max_bytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(f.gcount()));
  if (f.bad()) return bad_arg("reading '" + path + "' failed");
  if (text.size() > max_bytes)
    return bad_arg("'" + path + "' is larger than " + bytes_text(static_cast<double>(max_bytes)) + ": not a script or graph file");
  if (text.find('\0') != std::string::npos) return bad_arg("'" + path + "' holds NUL bytes: not a text file");
  return text;
}

// ------------------------------------------------------------------ impl

session::impl::impl(session& s, std::ostream& o, session_options opts) : self(s), out(o), opt(std::move(opts)) {
  events = std::make_shared<event_queue>();
  chk = std::make_shared<checker>(events);
  time_scale = opt.default_time_scale;
}

session::impl::~impl() {
  try {
    if (rt) rt->wait_idle();
  } catch (...) {
  }
  chk.reset();  // stops a running check; joins unless a late job callback still holds it
  gen.reset();
  plan_ptr.reset();
  jobs.clear();
  rt.reset();
}

void session::impl::print_error(const outcome& o, const command_info* c) {
  out << "error: " << o.e.message << "\n";
  if (o.usage && c) out << "usage: " << c->usage << "\n" << "example: " << c->example << "\n";
}

void session::impl::print_reports(const std::vector<report>& rs) {
  for (const auto& r : rs) out << r.text << "\n";
  out.flush();
}

exec_status session::impl::execute(const std::string& line) {
  // The name first: `graph` and `echo` read the rest of the line themselves.
  auto head = split_command(line, true);
  const command_info* ci = head && !head->empty() ? find_command(head->name.text) : nullptr;
  auto split = ci && ci->own_syntax ? head : split_command(line);
  if (!split) {
    out << "error: " << split.err().message << "\n";
    if (ci) out << "usage: " << ci->usage << "\n";
    return exec_status::failed;
  }
  const command_line& c = *split;
  if (c.empty()) return exec_status::ok;
  const auto h = ci ? handlers().find(ci->name) : handlers().end();
  if (h == handlers().end()) {
    std::string near;
    for (const auto& x : commands())
      if (c.name.text.size() >= 2 && std::string(x.name).rfind(c.name.text.substr(0, 2), 0) == 0) near = x.name;
    out << "error: unknown command '" << c.name.text << "'" << (near.empty() ? "" : " (did you mean '" + near + "'?)")
        << "; type 'help' for the list\n";
    return exec_status::failed;
  }
  const outcome o = (this->*(h->second))(c);
  if (o.e) print_error(o, ci);
  out.flush();
  if (o.e) return exec_status::failed;
  if (quit_requested && source_depth == 0) {
    quit_requested = false;
    return exec_status::quit;
  }
  return exec_status::ok;
}

error session::impl::ensure_runtime() {
  if (rt) return {};
  std::string s = spec;
  if (s.empty()) s = !opt.default_devices.empty() ? opt.default_devices : gpu::cuda_available() ? "cuda:all" : "sim:4";
  return create_runtime(s, rt_opts, time_scale, values);
}

error session::impl::create_runtime(const std::string& s, runtime_options o, double scale, bool vals) {
  o.backend.sim.time_scale = scale;
  o.backend.sim.compute_values = vals;
  o.scheduler_threads = opt.scheduler_threads;
  auto r = runtime::create(s, o);
  if (!r) return r.err();
  gen.reset();
  plan_ptr.reset();
  rt = std::move(*r);
  rt_ids.clear();
  spec = s;
  rt_opts = o;
  time_scale = scale;
  values = vals;
  device_names.clear();
  for (const auto& d : rt->devices()) device_names.push_back(d.name);
  return {};
}

outcome session::impl::replace_runtime(const std::string& s, runtime_options o, double scale, bool vals, const char* why) {
  if (const int n = running())
    return fail(bad_arg(fmt("%s running: 'wait' or 'cancel all' before %s", n == 1 ? "1 job is" : fmt("%d jobs are", n).c_str(), why)),
                false);
  gen.reset();
  plan_ptr.reset();
  collect_trace();
  rt.reset();
  if (auto e = create_runtime(s, o, scale, vals)) return fail(error(e.code, e.to_string()), false);
  return {};
}

// ------------------------------------------------------- small commands

outcome session::impl::cmd_help(const command_line& c) {
  if (auto e = params(c).finish(1)) return fail(e);
  if (c.positional.empty()) {
    out << "commands (help <command> for details and an example):\n";
    for (const auto& ci : commands()) out << fmt("  %-9s %s\n", ci.name, ci.summary);
    out << "Lines are edited with readline keys; TAB completes commands and parameters; Ctrl-C clears the line or\n"
           "stops a 'wait'; Ctrl-D quits. '#' starts a comment.\n";
    return {};
  }
  const command_info* ci = find_command(c.positional[0].text);
  if (!ci) return fail(bad_arg("no command '" + c.positional[0].text + "' (type 'help' for the list)"));
  out << "usage:   " << ci->usage << "\n" << "         " << ci->summary << "\n" << "example: " << ci->example << "\n";
  if (ci->details) out << ci->details;
  return {};
}

outcome session::impl::cmd_echo(const command_line& c) {
  const auto first = c.rest.find_first_not_of(" \t");
  out << (first == std::string::npos ? std::string() : c.rest.substr(first)) << "\n";
  return {};
}

outcome session::impl::cmd_source(const command_line& c) {
  if (c.positional.size() != 1 || !c.named.empty()) return fail(bad_arg("one file name expected"));
  if (source_depth >= 8) return fail(bad_arg("'source' nested more than 8 deep"), false);
  const std::string& path = c.positional[0].text;
  auto text = read_text_file(path, max_script_bytes);
  if (!text) return fail(text.err(), false);
  std::istringstream in(*text);
  ++source_depth;
  outcome result;
  int line_no = 0;
  for (std::string l; std::getline(in, l);) {
    ++line_no;
    print_reports(drain());
    if (blank_or_comment(l)) continue;
    out << "> " << l << "\n";
    const exec_status st = self.execute(l);
    if (st == exec_status::quit || quit_requested) {
      quit_requested = true;  // a `quit` in a sourced file ends the session
      break;
    }
    if (st == exec_status::failed && !self.keep_going) {
      result = fail(bad_arg(fmt("%s:%d: command failed", path.c_str(), line_no)), false);
      break;
    }
  }
  --source_depth;
  return result;
}

outcome session::impl::cmd_quit(const command_line& c) {
  params p(c);
  if (auto e = p.finish()) return fail(e);
  std::string mode = c.positional.empty() ? "" : c.positional[0].text;
  if (c.positional.size() > 1 || (!mode.empty() && mode != "wait" && mode != "cancel"))
    return fail(bad_arg("'" + mode + "': say 'quit wait' or 'quit cancel'"));
  const int n = running();
  if (n > 0 && mode.empty()) {
    if (opt.interactive && self.ask) {
      const std::string a = self.ask(fmt("%s running: [w]ait for them, [c]ancel them, or stay? [w/c/s] ",
                                         n == 1 ? "1 job is" : fmt("%d jobs are", n).c_str()));
      if (a == "w" || a == "wait") {
        mode = "wait";
      } else if (a == "c" || a == "cancel") {
        mode = "cancel";
      } else {
        out << "staying\n";
        return {};
      }
    } else {
      mode = "wait";
    }
  }
  if (n > 0 && mode == "cancel") {
    cancel_all();
    out << "cancelled " << count_text(n, "job") << "\n";
  }
  if (n > 0 && mode == "wait") out << "waiting for " << count_text(n, "job") << "\n";
  // A person leaving does not wait minutes for reference checks nobody will
  // read (a script does: its output is the record).
  if (opt.interactive) {
    int checking = 0;
    for (const auto& [id, j] : jobs) checking += j.check == check_status::pending ? 1 : 0;
    if (checking > 0) {
      chk->stop_all();
      out << "stopping the reference check of " << count_text(checking, "job") << "\n";
    }
  }
  if (!wait_all()) {
    out << fmt("interrupted: not quitting; %s still running\n", count_text(running(), "job").c_str());
    return {};
  }
  quit_requested = true;
  return {};
}

// --------------------------------------------------------------- session

session::session(std::ostream& out, session_options options)
    : impl_(std::make_unique<impl>(*this, out, std::move(options))) {}

session::~session() = default;

exec_status session::execute(const std::string& line) {
  try {
    return impl_->execute(line);
  } catch (const std::exception& e) {
    impl_->out << "error: internal: " << e.what() << "\n";
  } catch (...) {
    impl_->out << "error: internal: unknown exception\n";
  }
  return exec_status::failed;
}

std::vector<report> session::drain() { return impl_->drain(); }
int session::notify_fd() const noexcept { return impl_->events->notify_fd(); }
void session::interrupt() noexcept {
  impl_->interrupted.store(true);
  impl_->events->poke();
}
int64_t session::jobs_running() const { return impl_->running(); }
bool session::wait_all() { return impl_->wait_all(); }
void session::cancel_all() { impl_->cancel_all(); }

trace session::last_trace() const {
  impl_->collect_trace();
  if (impl_->batches.empty()) return {};
  return impl_->trace_of(impl_->batches.back().id);
}

// ---------------------------------------------------------------- script

int run_script(session& s, std::istream& in, std::ostream& out, bool keep_going) {
  s.keep_going = keep_going;
  int status = 0;
  auto print = [&] {
    for (const auto& r : s.drain()) out << r.text << "\n";
    out.flush();
  };
  auto stop = [&](const char* why) {
    out << why;
    s.cancel_all();
    s.wait_all();
    print();
    return 1;
  };
  std::string line;
  int line_no = 0;
  for (bool too_long = false;;) {
    const bool got = read_line(in, line, max_line_bytes, too_long);
    ++line_no;
    if (too_long)
      return stop(fmt("error: line %d is longer than %s: not a script; stopping\n", line_no,
                      bytes_text(static_cast<double>(max_line_bytes)).c_str())
                      .c_str());
    if (!got) break;
    print();
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (blank_or_comment(line)) continue;
    out << "> " << line << "\n";
    out.flush();
    const exec_status st = s.execute(line);
    if (st == exec_status::quit) {
      print();
      return status;
    }
    if (st == exec_status::failed) {
      status = 1;
      if (!keep_going) return stop("stopping: the command above failed (--keep-going continues after errors)\n");
    }
  }
  // End of input: as `quit wait`.
  s.wait_all();
  print();
  return status;
}

int run_script_file(session& s, const std::string& path, std::ostream& out, bool keep_going) {
  auto text = read_text_file(path, max_script_bytes);
  if (!text) {
    out << "error: " << text.err().message << "\n";
    return 1;
  }
  std::istringstream in(*text);
  return run_script(s, in, out, keep_going);
}

}  // namespace ag::repl
