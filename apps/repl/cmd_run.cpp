// run, wait, jobs, job, cancel: submitting micro-batch jobs without blocking
// the prompt, and turning their completions (and reference checks) into
// report lines on the main thread.
#include <poll.h>

#include <algorithm>

#include "apps/repl/memory_budget.hpp"
#include "apps/repl/session_impl.hpp"

namespace ag::repl {

namespace {

// Reference checks cost about this many graph flops per job: "auto" checks
// every job of small graphs, the first job of each run for medium ones, none
// for big ones.
constexpr double check_all_flops = 50e6;
constexpr double check_first_flops = 3e9;
// A check expected to take longer than this says so when the run starts.
constexpr double long_check_seconds = 2.0;

double node_bytes(const graph& g, node_id id) {
  const node& n = g.at(id);
  return approx_bytes(n.dims, n.type);
}

}  // namespace

// ------------------------------------------------------------ inputs

// Random inputs for a custom graph: i32 inputs hold valid ids for what reads them.
std::vector<host_tensor> session::impl::custom_inputs(uint64_t s) const {
  std::vector<host_tensor> in;
  for (std::size_t k = 0; k < g->inputs().size(); ++k) {
    const node& n = g->at(g->inputs()[k]);
    const uint64_t sd = s * 7919 + k;
    if (n.type != dtype::i32) {
      in.push_back(host_tensor::random_normal(n.type, n.dims, sd));
      continue;
    }
    int32_t limit = 16;
    for (node_id c : g->consumers(n.id)) {
      const node& cn = g->at(c);
      if (cn.op == op_kind::get_rows && cn.inputs.size() > 1 && cn.inputs[1] == n.id)
        limit = static_cast<int32_t>(std::min<int64_t>(limit == 16 ? INT32_MAX : limit, g->at(cn.inputs[0]).dims[0]));
    }
    in.push_back(host_tensor::random_ints(n.dims, sd, std::max<int32_t>(1, limit)));
  }
  return in;
}

std::vector<host_tensor> session::impl::inputs_for(uint64_t s) const {
  if (tcfg) return models::transformer_inputs(*tcfg, s);
  return custom_inputs(s);
}

error session::impl::check_run_memory(const plan& p, int n, int to_check) const {
  double in = 0, out_b = 0, all_nodes = 0;
  for (node_id id : g->inputs()) in += node_bytes(*g, id);
  for (node_id id : g->outputs()) out_b += node_bytes(*g, id);
  for (const node& nd : g->nodes())
    if (!nd.is_view()) all_nodes += approx_bytes(nd.dims, nd.type);
  struct part {
    const char* what;
    double bytes;
  };
  std::vector<part> parts = {{"job inputs", n * in}, {"job outputs", n * out_b}, {"inputs kept for checks", to_check * in}};
  // The reference evaluator keeps every node's value of the job it checks.
  if (to_check > 0) parts.push_back({"reference check", all_nodes});
  // Devices in host memory hold an arena per job in flight (the plan's
  // weights and first arena were counted when it was loaded).
  double arenas = 0;
  const int in_flight = std::min(n, std::max(1, rt_opts.arenas_per_device));
  for (int d : p.used_devices())
    if (host_backed(rt->devices()[static_cast<std::size_t>(d)]))
      arenas += static_cast<double>(p.memory()[static_cast<std::size_t>(d)].arena_bytes) * (in_flight - 1);
  parts.push_back({"device arenas in host memory", arenas});
  double total = 0;
  std::string detail;
  for (const auto& pt : parts) {
    total += pt.bytes;
    if (pt.bytes > 0) detail += fmt("%s%s %s", detail.empty() ? "" : ", ", pt.what, bytes_text(pt.bytes).c_str());
  }
  if (total <= host_run_limit()) return {};
  return error(errc::out_of_memory, fmt("run n=%d would take %s of host memory (%s), more than this host allows (%s, 3/4 of "
                                        "its memory); nothing was allocated: run fewer jobs (n=) or use smaller tensors",
                                        n, bytes_text(total).c_str(), detail.c_str(), bytes_text(host_run_limit()).c_str()));
}

// ------------------------------------------------------------ commands

outcome session::impl::cmd_run(const command_line& c) {
  params p(c);
  auto nn = p.get_int("n", 1, 100000);
  if (!nn) return fail(nn.err());
  auto ck = read_check(p);
  if (!ck) return fail(ck.err());
  if (auto e = p.finish()) return fail(e);
  if (!c.positional.empty()) return fail(bad_arg("unexpected '" + c.positional[0].text + "' (did you mean n=" + c.positional[0].text + "?)"));
  const check_mode mode = ck->value_or(check);
  const int n = *nn ? static_cast<int>(**nn) : microbatches;
  auto pl = get_plan();
  if (!pl) return fail(pl.err(), !g);

  batch_entry b;
  b.id = static_cast<int>(batches.size()) + 1;
  b.n = n;
  b.verbose = n <= 16;
  // Which jobs to compare with the reference evaluator.
  int to_check = 0;
  if (!values) {
    b.check_note = "check skipped: sim values are off";
  } else if (mode == check_mode::off) {
    b.check_note = "check off";
  } else if (mode == check_mode::all || (mode == check_mode::automatic && model_flops <= check_all_flops)) {
    to_check = n;
  } else if (mode == check_mode::first || model_flops <= check_first_flops) {
    to_check = 1;
    if (n > 1) b.check_note = "checked the first job only: the reference evaluator is slow for this model; 'run check=all' checks each";
  } else {
    b.check_note = fmt("check skipped: %.1f GFLOP per job is too big for the reference evaluator", model_flops / 1e9);
  }
  if (auto e = check_run_memory(**pl, n, to_check)) return fail(e, false);

  std::vector<std::vector<host_tensor>> inputs;
  inputs.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) inputs.push_back(inputs_for(next_seed++));
  std::vector<std::vector<host_tensor>> kept(inputs.begin(), inputs.begin() + std::min(n, to_check));
  b.submit_ns = gpu::host_clock_ns();
  std::vector<job> js = rt->submit_batch(*pl, std::move(inputs));
  // The REPL numbers jobs itself: runtime ids restart with each runtime
  // (`devices`), the REPL's stay unique for the whole session.
  std::vector<uint64_t> ids;
  for (std::size_t i = 0; i < js.size(); ++i) {
    job_entry e;
    e.id = next_job_id++;
    ids.push_back(e.id);
    rt_ids[js[i].id()] = e.id;
    e.batch = b.id;
    e.index = static_cast<int>(i);
    e.handle = js[i];
    if (static_cast<int>(i) < to_check) e.check = check_status::pending;
    b.jobs.push_back(e.id);
    jobs[e.id] = e;
  }
  batches.push_back(b);
  // Callbacks last: a job may be ready already and report at once.
  const uint64_t generation = chk->generation();
  for (std::size_t i = 0; i < js.size(); ++i) {
    std::shared_ptr<event_queue> q = events;
    std::shared_ptr<checker> checks = static_cast<int>(i) < to_check ? chk : nullptr;
    checker::task t;
    const uint64_t id = ids[i];
    if (checks) t = {id, js[i], g, std::move(kept[i]), generation};
    js[i].then([q, checks, id, t = std::move(t)](const job_result&) mutable {
      q->push({event::kind::done, id, check_status::none, {}});
      if (checks) checks->post(std::move(t));
    });
  }
  out << fmt("run %d: submitted %s (ids %llu..%llu) of %s on %s\n", b.id, count_text(n, "job").c_str(),
             static_cast<unsigned long long>(ids.empty() ? 0 : ids.front()),
             static_cast<unsigned long long>(ids.empty() ? 0 : ids.back()), tcfg ? models::to_string(tcfg->variant) : "graph",
             spec.c_str());
  // Say so up front when the checks will hold `wait` for a while.
  if (to_check > 0) {
    const double rate = reference_flops_per_second();
    const double seconds = model_flops * to_check / rate;
    if (seconds > long_check_seconds)
      out << fmt("note: the reference check of %s takes about %s on this host (%.1f GFLOP per job at %.2f GFLOP/s, one "
                 "thread); 'wait' waits for it, Ctrl-C stops waiting and the check; 'run check=off' skips it\n",
                 count_text(to_check, "job").c_str(), seconds_text(seconds).c_str(), model_flops / 1e9, rate / 1e9);
  }
  return {};
}

outcome session::impl::cmd_wait(const command_line& c) {
  if (auto e = params(c).finish(0)) return fail(e);
  wait_all();
  return {};
}

outcome session::impl::cmd_jobs(const command_line& c) {
  if (auto e = params(c).finish(1)) return fail(e);
  const bool all = !c.positional.empty() && c.positional[0].text == "all";
  if (!c.positional.empty() && !all) return fail(at_col(c.positional[0], "unexpected '" + c.positional[0].text + "' (all?)"));
  int counts[5] = {0, 0, 0, 0, 0};
  for (const auto& [id, j] : jobs) ++counts[static_cast<int>(j.handle.state())];
  out << fmt("%zu jobs: %d queued, %d running, %d done, %d failed, %d cancelled\n", jobs.size(), counts[0], counts[1], counts[2],
             counts[3], counts[4]);
  std::size_t skip = all || jobs.size() <= 20 ? 0 : jobs.size() - 20;
  if (skip) out << fmt("  (%zu older jobs not shown: 'jobs all')\n", skip);
  for (const auto& [id, j] : jobs) {
    if (skip) {
      --skip;
      continue;
    }
    out << "  " << job_summary(j) << "\n";
  }
  return {};
}

std::string session::impl::job_summary(const job_entry& j) const {
  const job_times t = j.handle.times();
  std::string s = fmt("job %-5llu run %-3d %-9s", static_cast<unsigned long long>(j.id), j.batch, ag::to_string(j.handle.state()));
  if (t.finished_ns) s += fmt(" %8s", ms_text(t.finished_ns - t.submitted_ns).c_str());
  if (!j.check_text.empty()) s += "  " + j.check_text;
  return s;
}

expected<uint64_t> session::impl::job_id_arg(const command_line& c) const {
  if (c.positional.size() != 1) return bad_arg("one job id expected");
  auto v = parse_int(c.positional[0].text, "job id", 0, INT64_MAX);
  if (!v) return v.err();
  if (!jobs.count(static_cast<uint64_t>(*v))) return bad_arg("no job " + c.positional[0].text + " (see 'jobs')");
  return static_cast<uint64_t>(*v);
}

outcome session::impl::cmd_job(const command_line& c) {
  params p(c);
  if (auto e = p.finish()) return fail(e);
  auto id = job_id_arg(c);
  if (!id) return fail(id.err());
  const job_entry& j = jobs.at(*id);
  const job_times t = j.handle.times();
  out << fmt("job %llu (run %d, #%d): %s\n", static_cast<unsigned long long>(j.id), j.batch, j.index, ag::to_string(j.handle.state()));
  if (t.started_ns) out << "  waited for arenas " << ms_text(t.started_ns - t.submitted_ns) << "\n";
  if (t.finished_ns) out << "  latency           " << ms_text(t.finished_ns - t.submitted_ns) << "\n";
  if (j.handle.ready()) {
    const job_result& r = j.handle.wait();
    if (r) {
      for (std::size_t i = 0; i < r->size(); ++i)
        out << fmt("  output %zu: %s %s\n", i, ag::to_string((*r)[i].type()), (*r)[i].dims().to_string().c_str());
    } else {
      out << "  error: " << r.err().to_string() << "\n";
    }
    out << "  "
        << (!j.check_text.empty() ? j.check_text : j.check == check_status::pending ? "check: running" : "check: skipped") << "\n";
  }
  return {};
}

outcome session::impl::cmd_cancel(const command_line& c) {
  params p(c);
  if (auto e = p.finish()) return fail(e);
  if (c.positional.size() == 1 && c.positional[0].text == "all") {
    const int n = running();
    cancel_all();
    out << "cancelling " << count_text(n, "running job") << "\n";
    return {};
  }
  auto id = job_id_arg(c);
  if (!id) return fail(id.err());
  const job_entry& j = jobs.at(*id);
  if (j.handle.ready()) {
    out << fmt("job %llu already %s\n", static_cast<unsigned long long>(*id), ag::to_string(j.handle.state()));
    return {};
  }
  j.handle.cancel();
  out << fmt("cancelling job %llu\n", static_cast<unsigned long long>(*id));
  return {};
}

void session::impl::cancel_all() {
  for (auto& [id, j] : jobs)
    if (!j.handle.ready()) j.handle.cancel();
}

int session::impl::running() const {
  int n = 0;
  for (const auto& [id, j] : jobs)
    if (!j.handle.ready()) ++n;
  return n;
}

int session::impl::unreported() const {
  int n = 0;
  for (const auto& [id, j] : jobs)
    if (!j.reported) ++n;
  return n;
}

bool session::impl::wait_all() {
  interrupted.store(false);
  bool progress_open = false;
  bool said_checking = false;
  int64_t checks_only_since = gpu::host_clock_ns();
  auto print = [&](const report& r) {
    if (opt.interactive && r.progress) {
      out << "\r\033[K" << r.text << std::flush;
      progress_open = true;
      return;
    }
    if (progress_open) out << "\r\033[K";
    progress_open = false;
    out << r.text << "\n";
  };
  for (;;) {
    for (const auto& r : drain()) print(r);
    out.flush();
    if (unreported() == 0) break;
    if (interrupted.load()) {
      interrupted.store(false);
      if (progress_open) out << "\n";
      int checking = 0;
      for (const auto& [id, j] : jobs) checking += j.check == check_status::pending ? 1 : 0;
      chk->stop_all();
      // A terminal echoed the ^C already.
      out << (opt.interactive ? "\n" : "^C: ") << fmt("back to the prompt; %s still running", count_text(running(), "job").c_str());
      if (checking) out << fmt("; stopped the reference check of %s", count_text(checking, "job").c_str());
      out << "\n";
      out.flush();
      return false;
    }
    // Every job finished and only reference checks are left: when they will
    // take a while (by the estimate, or already), say so once, since nothing
    // else will move until they are done.
    if (!said_checking) {
      int checking = 0;
      bool jobs_left = false;
      for (const auto& [id, j] : jobs) {
        if (j.reported) continue;
        if (j.done && j.check == check_status::pending) ++checking;
        else jobs_left = true;
      }
      const int64_t now = gpu::host_clock_ns();
      if (checking == 0 || jobs_left) checks_only_since = now;
      const double left = checking ? model_flops * checking / reference_flops_per_second() : 0;
      if (checking > 0 && !jobs_left && (left > 1.0 || now - checks_only_since > 3'000'000'000)) {
        said_checking = true;
        print({fmt("waiting for the reference check of %s (about %s; Ctrl-C stops it)", count_text(checking, "job").c_str(),
                   seconds_text(left).c_str()),
               false});
        out.flush();
      }
    }
    pollfd pfd{events->notify_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 200);
  }
  if (progress_open) out << "\n";
  return true;
}

// ------------------------------------------------------------ reports

batch_entry* session::impl::batch_of(int id) {
  for (auto& b : batches)
    if (b.id == id) return &b;
  return nullptr;
}

const batch_entry* session::impl::batch_of(int id) const {
  for (const auto& b : batches)
    if (b.id == id) return &b;
  return nullptr;
}

std::string session::impl::job_line(const job_entry& j, const batch_entry& b) const {
  const job_times t = j.handle.times();
  const job_result& r = j.handle.wait();  // ready: does not block
  // Throughput of the run so far: jobs reported by the time this one finished.
  const double rate = static_cast<double>(b.reported) / std::max(1e-9, static_cast<double>(t.finished_ns - b.submit_ns) / 1e9);
  std::string s = fmt("[job %llu] ", static_cast<unsigned long long>(j.id));
  if (r) {
    s += fmt("done in %s  (run %d: %d/%d, %.1f jobs/s)", ms_text(t.finished_ns - t.submitted_ns).c_str(), b.id, b.reported, b.n, rate);
    // No check asked for: the run's summary says why.
    if (!j.check_text.empty()) s += "  " + j.check_text;
  } else if (r.err().code == errc::cancelled) {
    s += "cancelled";
  } else {
    s += "failed: " + r.err().to_string();
  }
  return s;
}

void session::impl::finish_job(job_entry& j, std::vector<report>& outv) {
  if (j.reported) return;
  j.reported = true;
  batch_entry* b = batch_of(j.batch);
  if (!b) return;
  ++b->reported;
  const job_result& r = j.handle.wait();
  if (r) ++b->ok;
  else if (r.err().code == errc::cancelled) ++b->cancelled;
  else ++b->failed;
  // A job that failed or was cancelled had nothing to compare: its check
  // counts neither as ok nor as bad.
  if (j.check == check_status::ok) ++b->checks_ok;
  if (j.check == check_status::bad) ++b->checks_bad;
  if (j.check == check_status::stopped) ++b->checks_stopped;
  const bool failed_line = !r && r.err().code != errc::cancelled && b->failed <= 5;
  if (b->verbose || failed_line || j.check == check_status::bad) outv.push_back({job_line(j, *b), false});
  if (!b->verbose && b->reported < b->n) {
    const int64_t now = gpu::host_clock_ns();
    const int quarter = 4 * b->reported / b->n;
    const bool due = opt.interactive ? now - b->last_progress_ns > 250'000'000 : quarter > b->last_progress_quarter;
    if (due) {
      b->last_progress_ns = now;
      b->last_progress_quarter = quarter;
      outv.push_back({progress_line(*b), true});
    }
  }
  if (b->reported == b->n && !b->summarised) {
    b->summarised = true;
    collect_trace();
    outv.push_back({summary_line(*b), false});
  }
}

std::string session::impl::progress_line(const batch_entry& b) const {
  const double el = static_cast<double>(gpu::host_clock_ns() - b.submit_ns) / 1e9;
  const int w = 30, filled = b.n ? w * b.reported / b.n : w;
  return fmt("[run %d] [%s%s] %d/%d jobs  %.1f jobs/s", b.id, std::string(static_cast<std::size_t>(filled), '#').c_str(),
             std::string(static_cast<std::size_t>(w - filled), '.').c_str(), b.reported, b.n,
             static_cast<double>(b.reported) / std::max(el, 1e-9));
}

std::string session::impl::summary_line(const batch_entry& b) const {
  int64_t last = b.submit_ns;
  std::vector<double> lat;
  for (uint64_t id : b.jobs) {
    auto it = jobs.find(id);
    if (it == jobs.end()) continue;
    const job_times t = it->second.handle.times();
    last = std::max(last, t.finished_ns);
    if (it->second.handle.state() == job_state::done) lat.push_back(static_cast<double>(t.finished_ns - t.submitted_ns) / 1e6);
  }
  std::sort(lat.begin(), lat.end());
  const double el = static_cast<double>(last - b.submit_ns) / 1e9;
  std::string s = fmt("[run %d] %d/%d done", b.id, b.ok, b.n);
  if (b.failed) s += fmt(", %d failed", b.failed);
  if (b.cancelled) s += fmt(", %d cancelled", b.cancelled);
  s += fmt(" in %.1f ms: %.1f jobs/s", el * 1e3, static_cast<double>(b.ok) / std::max(el, 1e-9));
  if (!lat.empty()) s += fmt("; latency min %.1f / median %.1f / max %.1f ms", lat.front(), lat[lat.size() / 2], lat.back());
  if (b.checks_ok || b.checks_bad || b.checks_stopped) {
    s += fmt("; checks: %d ok, %d bad", b.checks_ok, b.checks_bad);
    if (b.checks_stopped) s += fmt(", %d stopped", b.checks_stopped);
  }
  if (!b.check_note.empty()) s += " (" + b.check_note + ")";
  return s;
}

std::vector<report> session::impl::drain() {
  std::vector<report> outv;
  for (event& e : events->take()) {
    auto it = jobs.find(e.job);
    if (it == jobs.end()) continue;
    job_entry& j = it->second;
    if (e.k == event::kind::done) {
      if (j.done) continue;
      j.done = true;
      if (j.check != check_status::pending) finish_job(j, outv);
    } else {
      j.check = e.status;
      j.check_text = e.text;
      if (j.done) finish_job(j, outv);
    }
  }
  return outv;
}

}  // namespace ag::repl
