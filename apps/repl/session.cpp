#include "apps/repl/session.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "apps/repl/graph_expr.hpp"
#include "apps/repl/timeline.hpp"
#include "graph/cost_model.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace ag::repl {

// ---------------------------------------------------------------- commands

const std::vector<command_info>& commands() {
  static const std::vector<command_info> table = {
      {"help", "help [command]", "list the commands, or show one with an example", "help run", {}, {}},
      {"devices", "devices [sim:N|cpu:N|cuda:all|cuda:0,1|sim:2,cpu:1] [flops=60T bw=3.35T link=450G latency=4.5us jitter=0 scale=20 mem=80G values=on arenas=8]",
       "choose the devices (no argument: show them); sim parameters set every simulated GPU; scale = wall seconds per simulated second",
       "devices sim:4 scale=50 jitter=0.1", {"flops=", "bw=", "link=", "latency=", "jitter=", "scale=", "mem=", "values=", "arenas="},
       {"sim:4", "sim:2", "cpu:2", "cuda:all", "sim:2,cpu:1"}},
      {"fault", "fault [<device>|sim error [rate]|stall [rate] [seconds=1]|die [ops]|off]",
       "inject faults into simulated GPUs (error: ops fail; stall: ops take seconds= longer; die: the device dies after ops ops; off: "
       "none); recreates the devices; no argument: show",
       "fault sim0 error 0.5", {"seconds="}, {"sim", "error", "stall", "die", "off"}},
      {"model", "model gpt2|llama [layers=12 d=256 heads=8 kv=0 ff=1024 seq=64 batch=1 vocab=512 dtype=f32 seed=1]",
       "build a transformer (the current graph); kv = llama's key/value heads (0: heads)",
       "model llama layers=4 d=128 heads=4 kv=2 ff=256",
       {"layers=", "d=", "heads=", "kv=", "ff=", "seq=", "batch=", "vocab=", "dtype=", "seed="}, {"gpt2", "llama"}},
      {"graph", "graph <name=expr ...> out <name> | graph @<file>",
       "build a custom graph from expressions (ops: matmul add mul scale gelu silu softmax rms_norm layer_norm get_rows rope reshape transpose permute slice concat copy contiguous)",
       "graph x=input[8,64] w=weight[64,64] y=gelu(matmul(x,w)) out y", {}, {}},
      {"plan", "plan [stages=N lanes=L]", "compile the current graph for the devices and describe the plan (also sets stages/lanes)",
       "plan stages=4", {"stages=", "lanes="}, {}},
      {"set", "set [stages=N microbatches=M lanes=L check=auto|all|first|off seed=S]",
       "set parallelism (stages: devices to pipeline over, 0 = all; microbatches: jobs per run; lanes: streams per device) and checking; no argument: show",
       "set stages=4 microbatches=32", {"stages=", "microbatches=", "lanes=", "check=", "seed="}, {}},
      {"run", "run [n=<microbatches>] [check=auto|all|first|off]",
       "submit n micro-batch jobs of the current plan and return at once; each job reports when it finishes",
       "run n=32", {"n=", "check="}, {}},
      {"wait", "wait", "block until every submitted job finished (Ctrl-C returns to the prompt; jobs keep running)", "wait", {}, {}},
      {"jobs", "jobs [all]", "list recent jobs (all: every job) and counts per state", "jobs", {}, {"all"}},
      {"job", "job <id>", "show one job: state, times, check, error", "job 3", {}, {}},
      {"cancel", "cancel <id>|all", "cancel one job or every running job", "cancel all", {}, {"all"}},
      {"timeline", "timeline [width=96] [batch=K]",
       "draw the last run (or batch K): a row per device lane, a character per job, time left to right", "timeline width=120",
       {"width=", "batch="}, {}},
      {"util", "util [batch=K]", "busy fraction of each device over the last run", "util", {"batch="}, {}},
      {"trace", "trace <file.json> [batch=K]", "write the last run as Chrome trace JSON (open in Perfetto or chrome://tracing)",
       "trace run.json", {"batch="}, {}},
      {"source", "source <file>", "run the commands of a file (as --script does)", "source examples/pipeline.ag", {}, {}},
      {"echo", "echo <text>", "print the text (for scripts)", "echo hello", {}, {}},
      {"quit", "quit [wait|cancel]", "leave; with jobs running wait for them or cancel them (default: ask; in a script: wait). Ctrl-D too",
       "quit cancel", {}, {"wait", "cancel"}},
      {"exit", "exit [wait|cancel]", "same as quit", "exit", {}, {"wait", "cancel"}},
  };
  return table;
}

const command_info* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

// ------------------------------------------------------------ formatting

namespace {

// What `help <command>` prints below the example, for commands whose rules do
// not fit the one-line summary.
const char* help_details(const std::string& command) {
  if (command == "fault")
    return "<device> is the name of the only simulated device (e.g. sim0 after 'devices cpu:1,sim:1'), or 'sim' for\n"
           "every simulated device: the sim backend takes one fault setting for all of its devices, and only when\n"
           "they are created (the runtime has no call that changes a live device's faults). So 'fault' creates the\n"
           "devices again with the same spec and parameters: refused while jobs run; the plan is compiled again at\n"
           "the next 'plan' or 'run'. Kinds add up ('fault sim error 0.1', then 'fault sim stall 0.2 seconds=5ms');\n"
           "'devices ...' creates healthy devices.\n"
           "  error [rate]  each op fails with probability rate (default 1); its job fails naming device, step and op\n"
           "  stall [rate]  each op takes seconds= longer (wall time, default 1 s) with probability rate (default 1)\n"
           "  die [ops]     the device dies after ops more ops (default 0: at once); every job that uses it fails\n"
           "  off           no faults\n";
  return nullptr;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string ms(int64_t ns) { return fmt("%.1f ms", static_cast<double>(ns) / 1e6); }

std::string bytes_text(double b) {
  if (b >= 1 << 30) return fmt("%.2f GiB", b / (1 << 30));
  if (b >= 1 << 20) return fmt("%.2f MiB", b / (1 << 20));
  if (b >= 1 << 10) return fmt("%.1f KiB", b / (1 << 10));
  return fmt("%.0f B", b);
}

int64_t now_ns() { return gpu::host_clock_ns(); }

// A usage error prints the command's usage after the reason; an operational
// one (a plan that does not fit, a failed job) only the reason.
struct outcome {
  error e;
  bool usage = true;
};
outcome fail(error e, bool usage = true) { return {std::move(e), usage}; }

// Checks one item of a device spec ("sim:4", "cuda:all", "cuda:0,1") enough
// to name an unknown kind here; runtime::create checks the rest.
error check_device_spec(const std::string& spec) {
  if (spec.empty()) return bad_arg("empty device spec");
  std::size_t start = 0;
  while (start <= spec.size()) {
    std::size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(start, comma - start);
    const bool bare_number = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
    if (!bare_number || start == 0) {
      const auto colon = item.find(':');
      const std::string kind = item.substr(0, colon);
      if (kind != "sim" && kind != "cpu" && kind != "cuda")
        return error(errc::bad_device_spec, "unknown device '" + item + "' at col " + std::to_string(start + 1) +
                                                " (expected sim:N, cpu:N, cuda:all or cuda:I)");
      if (colon == std::string::npos || colon + 1 == item.size())
        return error(errc::bad_device_spec, "'" + item + "' needs a count after ':' (e.g. " + kind + ":2)");
    }
    start = comma + 1;
  }
  return {};
}

}  // namespace

// ----------------------------------------------------------- event queue

namespace {

struct event {
  enum class kind : uint8_t { done, checked } k = kind::done;
  uint64_t job = 0;
  bool ok = false;
  std::string text;
};

// Written by runtime threads (job callbacks) and the checker; read by the main
// thread. Shared with the callbacks, so it (and its pipe) lives until the last
// callback has run, even if that is after the session is gone.
struct event_queue {
  std::mutex m;
  std::deque<event> q;
  int rfd = -1, wfd = -1;
  event_queue() {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
      rfd = fds[0];
      wfd = fds[1];
    }
  }
  ~event_queue() {
    if (rfd >= 0) ::close(rfd);
    if (wfd >= 0) ::close(wfd);
  }
  event_queue(const event_queue&) = delete;
  event_queue& operator=(const event_queue&) = delete;
  void push(event e) {
    {
      std::lock_guard<std::mutex> g(m);
      q.push_back(std::move(e));
    }
    poke();
  }
  void poke() const noexcept {
    const char c = 1;
    [[maybe_unused]] auto r = ::write(wfd, &c, 1);  // a full pipe is fine: the reader drains all
  }
  std::deque<event> take() {
    std::lock_guard<std::mutex> g(m);
    std::deque<event> out;
    out.swap(q);
    return out;
  }
};

// Compares finished jobs with the reference evaluator off the main thread:
// a reference run of a model can take a second.
class checker {
 public:
  struct task {
    uint64_t id = 0;
    job handle;
    std::shared_ptr<const graph> g;
    std::vector<host_tensor> inputs;
  };
  explicit checker(std::shared_ptr<event_queue> events) : events_(std::move(events)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~checker() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(task t) {
    {
      std::lock_guard<std::mutex> g(m_);
      q_.push_back(std::move(t));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      task t;
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [this] { return stop_ || !q_.empty(); });
        if (stop_) return;
        t = std::move(q_.front());
        q_.pop_front();
      }
      event e;
      e.k = event::kind::checked;
      e.job = t.id;
      try {
        check(t, e);
      } catch (const std::exception& ex) {
        e.ok = false;
        e.text = std::string("check: error (") + ex.what() + ")";
      }
      events_->push(std::move(e));
    }
  }
  static void check(const task& t, event& e) {
    const job_result& r = t.handle.wait();
    if (!r) {
      e.text = "check: skipped (job failed)";
      return;
    }
    auto ref = evaluate_reference(*t.g, t.inputs);
    if (!ref) {
      e.text = "check: reference failed: " + ref.err().to_string();
      return;
    }
    if (ref->size() != r->size()) {
      e.text = fmt("check: MISMATCH (%zu outputs, reference has %zu)", r->size(), ref->size());
      return;
    }
    double max_err = 0;
    for (std::size_t i = 0; i < r->size(); ++i) {
      const dtype ty = (*ref)[i].type();
      const double tol = ty == dtype::f32 ? 2e-3 : ty == dtype::f16 ? 3e-2 : ty == dtype::bf16 ? 1e-1 : 0;
      const compare_result c = compare((*r)[i], (*ref)[i], tol, tol);
      max_err = std::max(max_err, c.max_abs_err);
      if (!c.ok) {
        e.text = fmt("check: MISMATCH (output %zu: %s)", i, c.message.c_str());
        return;
      }
    }
    e.ok = true;
    e.text = fmt("check: ok (max err %.2g)", max_err);
  }

  std::shared_ptr<event_queue> events_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<task> q_;
  bool stop_ = false;
  std::thread thread_;
};

enum class check_mode : uint8_t { automatic, all, first, off };
const char* to_string(check_mode m) {
  switch (m) {
    case check_mode::automatic: return "auto";
    case check_mode::all: return "all";
    case check_mode::first: return "first";
    case check_mode::off: return "off";
  }
  return "?";
}
expected<check_mode> parse_check(const std::string& s) {
  if (s == "auto") return check_mode::automatic;
  if (s == "all" || s == "on") return check_mode::all;
  if (s == "first") return check_mode::first;
  if (s == "off") return check_mode::off;
  return bad_arg("check: '" + s + "' is not one of auto, all, first, off");
}

// Reference checks cost about this many graph flops per second (double
// accumulation, one thread): "auto" checks every job of small models, the
// first job of each run for medium ones, none for big ones.
constexpr double check_all_flops = 50e6;
constexpr double check_first_flops = 3e9;

struct job_entry {
  uint64_t id = 0;
  int batch = 0;
  int index = 0;
  job handle;
  bool done = false;
  bool check_pending = false;
  bool reported = false;
  std::string check_text;
  bool check_ok = false;
};

struct batch_entry {
  int id = 0;
  int n = 0;
  int64_t submit_ns = 0;
  std::vector<uint64_t> jobs;
  bool verbose = true;
  int finished = 0, reported = 0, ok = 0, failed = 0, cancelled = 0;
  int checks_ok = 0, checks_bad = 0;
  int64_t last_progress_ns = 0;
  int last_progress_quarter = 0;
  std::string check_note;
  bool summarised = false;
};

}  // namespace

// ------------------------------------------------------------------ impl

struct session::impl {
  impl(session& s, std::ostream& o, session_options opts) : self(s), out(o), opt(std::move(opts)) {
    events = std::make_shared<event_queue>();
    rfd = events->rfd;
    chk = std::make_shared<checker>(events);
    time_scale = opt.default_time_scale;
  }
  ~impl() {
    try {
      if (rt) rt->wait_idle();
    } catch (...) {
    }
    chk.reset();  // joins unless a late job callback still holds it; pending tasks are dropped
    plan_ptr.reset();
    jobs.clear();
    rt.reset();
  }

  session& self;
  std::ostream& out;
  session_options opt;
  int rfd = -1;
  std::shared_ptr<event_queue> events;
  std::shared_ptr<checker> chk;
  std::atomic<bool> interrupted{false};

  // devices
  std::string spec;
  runtime_options rt_opts;
  double time_scale = 20;
  bool values = true;
  std::unique_ptr<runtime> rt;

  // model and plan
  std::shared_ptr<const graph> g;
  std::string model_desc;
  std::optional<models::transformer_config> tcfg;
  double model_flops = 0;
  std::shared_ptr<const plan> plan_ptr;

  // settings
  int stages = 0, microbatches = 16, lanes = 1;
  check_mode check = check_mode::automatic;
  uint64_t seed = 1, next_seed = 1;

  // jobs
  std::map<uint64_t, job_entry> jobs;
  uint64_t next_job_id = 1;
  std::map<uint64_t, uint64_t> rt_ids;  // current runtime's job id -> REPL job id
  std::vector<batch_entry> batches;
  std::vector<trace_record> records;
  std::vector<std::string> device_names;
  int source_depth = 0;
  bool quit_from_source = false;

  // ---- helpers
  void print_error(const outcome& o, const command_info* c) {
    out << "error: " << o.e.message << "\n";
    if (o.usage && c) out << "usage: " << c->usage << "\n";
  }

  error ensure_runtime() {
    if (rt) return {};
    std::string s = spec;
    if (s.empty()) s = !opt.default_devices.empty() ? opt.default_devices : gpu::cuda_available() ? "cuda:all" : "sim:4";
    return create_runtime(s, rt_opts, time_scale, values);
  }

  error create_runtime(const std::string& s, runtime_options o, double scale, bool vals) {
    o.backend.sim.time_scale = scale;
    o.backend.sim.compute_values = vals;
    o.scheduler_threads = opt.scheduler_threads;
    auto r = runtime::create(s, o);
    if (!r) return r.err();
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

  std::string devices_text() const {
    std::string t = "devices (" + spec + "):";
    for (const auto& d : rt->devices())
      t += fmt("\n  %-6s %-4s %6.1f TFLOP/s f32  %6.2f TB/s  %s  launch %.1f us  link %.0f GB/s", d.name.c_str(),
               ag::to_string(d.kind), d.flops_f32 / 1e12, d.mem_bandwidth / 1e12, bytes_text(static_cast<double>(d.mem_bytes)).c_str(),
               d.launch_latency * 1e6, d.link_bandwidth / 1e9);
    if (spec.find("sim") != std::string::npos)
      t += fmt("\n  sim: time scale %g (a simulated ms takes %.3g ms), jitter %g, values %s", time_scale, time_scale,
               rt_opts.backend.sim.jitter, values ? "computed" : "off (timing only)");
    t += fmt("\n  arenas per device: %d (jobs of one plan in flight)", rt_opts.arenas_per_device);
    if (faults_injected()) t += "\n  " + faults_text();
    return t;
  }

  std::vector<std::string> sim_device_names() const {
    std::vector<std::string> names;
    if (rt)
      for (const auto& d : rt->devices())
        if (d.kind == device_kind::sim) names.push_back(d.name);
    return names;
  }

  bool faults_injected() const {
    const gpu::fault_config& f = rt_opts.backend.sim.faults;
    return f.op_error_rate > 0 || f.op_stall_rate > 0 || f.die_after_ops >= 0;
  }

  std::string faults_text() const {
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

  int running() const {
    int n = 0;
    for (const auto& [id, j] : jobs)
      if (!j.handle.ready()) ++n;
    return n;
  }
  int unreported() const {
    int n = 0;
    for (const auto& [id, j] : jobs)
      if (!j.reported) ++n;
    return n;
  }

  expected<std::shared_ptr<const plan>> get_plan() {
    if (!g) return bad_arg("no graph: build one with 'model gpt2' or 'graph ...' first");
    if (auto e = ensure_runtime()) return e;
    if (plan_ptr) return plan_ptr;
    plan_options po;
    po.pipeline_stages = stages;
    po.lanes_per_device = lanes;
    auto p = rt->compile(g, po);
    if (!p) return p.err();
    plan_ptr = *p;
    return plan_ptr;
  }

  // Random inputs for a custom graph: i32 inputs hold valid ids for what reads them.
  std::vector<host_tensor> custom_inputs(uint64_t s) const {
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

  std::vector<host_tensor> inputs_for(uint64_t s) const {
    if (tcfg) return models::transformer_inputs(*tcfg, s);
    return custom_inputs(s);
  }

  // ---- reports (main thread)
  batch_entry* batch_of(int id) {
    for (auto& b : batches)
      if (b.id == id) return &b;
    return nullptr;
  }

  std::string job_line(const job_entry& j, const batch_entry& b) {
    const job_times t = j.handle.times();
    const job_result& r = j.handle.wait();  // ready: does not block
    // Throughput of the run so far: jobs reported by the time this one finished.
    const double rate =
        static_cast<double>(b.reported) / std::max(1e-9, static_cast<double>(t.finished_ns - b.submit_ns) / 1e9);
    std::string s = fmt("[job %llu] ", static_cast<unsigned long long>(j.id));
    if (r) {
      s += fmt("done in %s  (run %d: %d/%d, %.1f jobs/s)  ", ms(t.finished_ns - t.submitted_ns).c_str(), b.id, b.reported,
               b.n, rate);
      s += j.check_text.empty() ? "check: skipped" : j.check_text;
    } else if (r.err().code == errc::cancelled) {
      s += "cancelled";
    } else {
      s += "failed: " + r.err().to_string();
    }
    return s;
  }

  void finish_job(job_entry& j, std::vector<report>& outv) {
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
    // says "skipped" and counts neither as ok nor as bad.
    const bool compared = !j.check_text.empty() && j.check_text.find("skipped") == std::string::npos;
    if (compared) (j.check_ok ? b->checks_ok : b->checks_bad)++;
    const bool failed_line = !r && r.err().code != errc::cancelled && b->failed <= 5;
    const bool bad_check = compared && !j.check_ok;
    if (b->verbose || failed_line || bad_check)
      outv.push_back({job_line(j, *b), false});
    if (!b->verbose && b->reported < b->n) {
      const int64_t now = now_ns();
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

  std::string progress_line(const batch_entry& b) const {
    const double el = static_cast<double>(now_ns() - b.submit_ns) / 1e9;
    const int w = 30, filled = b.n ? w * b.reported / b.n : w;
    return fmt("[run %d] [%s%s] %d/%d jobs  %.1f jobs/s", b.id, std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(w - filled), '.').c_str(), b.reported, b.n,
               static_cast<double>(b.reported) / std::max(el, 1e-9));
  }

  std::string summary_line(const batch_entry& b) {
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
    if (b.checks_ok || b.checks_bad) s += fmt("; checks: %d ok, %d bad", b.checks_ok, b.checks_bad);
    if (!b.check_note.empty()) s += " (" + b.check_note + ")";
    return s;
  }

  void collect_trace() {
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

  std::vector<report> drain() {
    std::vector<report> outv;
    if (rfd >= 0) {
      char buf[256];
      while (::read(rfd, buf, sizeof buf) > 0) {
      }
    }
    for (event& e : events->take()) {
      auto it = jobs.find(e.job);
      if (it == jobs.end()) continue;
      job_entry& j = it->second;
      if (e.k == event::kind::done) {
        if (j.done) continue;
        j.done = true;
        if (batch_entry* b = batch_of(j.batch)) ++b->finished;
        if (!j.check_pending) finish_job(j, outv);
      } else {
        j.check_pending = false;
        j.check_text = e.text;
        j.check_ok = e.ok;
        if (j.done) finish_job(j, outv);
      }
    }
    return outv;
  }

  trace trace_of(int batch_id) const {
    trace t;
    t.device_names = device_names;
    const batch_entry* b = nullptr;
    for (const auto& x : batches)
      if (x.id == batch_id) b = &x;
    if (!b) return t;
    std::vector<uint64_t> ids = b->jobs;
    std::sort(ids.begin(), ids.end());
    for (const auto& r : records)
      if (std::binary_search(ids.begin(), ids.end(), r.job)) t.records.push_back(r);
    return t;
  }

  // ---- commands
  outcome cmd_help(const command_line& c) {
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
    if (const char* details = help_details(ci->name)) out << details;
    return {};
  }

  outcome cmd_devices(const command_line& c) {
    params p(c);
    if (c.positional.size() > 1) return fail(bad_arg("one device spec expected, got " + std::to_string(c.positional.size())));
    runtime_options o = rt_opts;
    double scale = time_scale;
    bool vals = values;
    auto& sp = o.backend.sim.spec;
    if (auto v = p.get_number("flops", 1e6, 1e18); !v) return fail(v.err());
    else if (*v) { sp.flops_bf16 *= **v / sp.flops_f32; sp.flops_f32 = **v; }
    if (auto v = p.get_number("bw", 1e6, 1e16); !v) return fail(v.err());
    else if (*v) sp.mem_bandwidth = **v;
    if (auto v = p.get_number("link", 1e6, 1e16); !v) return fail(v.err());
    else if (*v) sp.link_bandwidth = **v;
    if (auto v = p.get_number("latency", 0, 1); !v) return fail(v.err());
    else if (*v) sp.launch_latency = **v;
    if (auto v = p.get_number("jitter", 0, 2); !v) return fail(v.err());
    else if (*v) o.backend.sim.jitter = **v;
    if (auto v = p.get_number("scale", 0, 1e6); !v) return fail(v.err());
    else if (*v) scale = **v;
    if (auto v = p.get_number("mem", 1 << 20, 1e15); !v) return fail(v.err());
    else if (*v) sp.mem_bytes = static_cast<int64_t>(**v);
    if (auto v = p.get_bool("values"); !v) return fail(v.err());
    else if (*v) vals = **v;
    if (auto v = p.get_int("arenas", 1, 1024); !v) return fail(v.err());
    else if (*v) o.arenas_per_device = static_cast<int>(**v);
    if (auto e = p.finish()) return fail(e);
    // Faults were injected into the devices being replaced ('fault' names
    // them): new devices start healthy.
    o.backend.sim.faults = {};
    const bool changes = !c.positional.empty() || !c.named.empty();
    if (!changes) {
      if (auto e = ensure_runtime()) return fail(e, false);
      out << devices_text() << "\n";
      return {};
    }
    const std::string s = c.positional.empty() ? (spec.empty() ? "sim:4" : spec) : c.positional[0].text;
    if (auto e = check_device_spec(s)) return fail(e);
    if (s.find("sim") == std::string::npos) {
      for (const char* k : {"flops", "bw", "link", "latency", "jitter", "scale", "mem", "values"})
        for (const auto& pr : c.named)
          if (pr.key.text == k) return fail(bad_arg(std::string(k) + "= applies to sim devices only ('" + s + "' has none)"));
    }
    if (const int n = running()) return fail(error(errc::invalid_argument, fmt("%d jobs are running: 'wait' or 'cancel all' before changing devices", n)), false);
    // The old runtime goes first: one set of actors at a time.
    plan_ptr.reset();
    collect_trace();
    rt.reset();
    if (auto e = create_runtime(s, o, scale, vals)) return fail(error(e.code, e.to_string()), false);
    out << devices_text() << "\n";
    return {};
  }

  // The public API sets sim faults only through runtime_options, for every sim
  // device at once and when the devices are created: so this command checks
  // that the device named is the only sim device (or takes 'sim' for all of
  // them) and creates the devices again with the new fault_config.
  outcome cmd_fault(const command_line& c) {
    auto at = [](const word& w, const std::string& what) { return bad_arg(fmt("col %zu: ", w.pos + 1) + what); };
    params p(c);
    auto stall_seconds = p.get_number("seconds", 0, 3600);
    if (!stall_seconds) {
      for (const auto& pr : c.named)
        if (pr.key.text == "seconds") return fail(at(pr.value, stall_seconds.err().message));
      return fail(stall_seconds.err());
    }
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
      if (sims.empty()) return fail(at(target, "no sim devices here (devices: " + all_names + ")"));
    } else {
      const device_spec* named = nullptr;
      for (const auto& d : rt->devices())
        if (d.name == target.text) named = &d;
      if (!named) return fail(at(target, "no device '" + target.text + "' (devices: " + all_names + "; 'sim' = every sim device)"));
      if (named->kind != device_kind::sim)
        return fail(at(target, "'" + target.text + "' is a " + ag::to_string(named->kind) +
                                   " device: faults can be injected into sim devices only"));
      if (sims.size() > 1)
        return fail(at(target, fmt("'%s' is one of %zu sim devices, and the sim backend gives all of them one fault setting: "
                                   "'fault sim ...' injects into every one; to fault one alone, choose devices with one sim "
                                   "device (e.g. 'devices cpu:1,sim:1')",
                                   target.text.c_str(), sims.size())));
    }
    if (c.positional.size() < 2)
      return fail(bad_arg(fmt("col %zu: which fault? error, stall, die or off", target.pos + target.text.size() + 2)));
    if (c.positional.size() > 3) return fail(at(c.positional[3], "unexpected '" + c.positional[3].text + "'"));
    const word& kind = c.positional[1];
    const word* value = c.positional.size() > 2 ? &c.positional[2] : nullptr;
    gpu::fault_config f = rt_opts.backend.sim.faults;
    if (kind.text == "error" || kind.text == "stall") {
      double rate = 1;
      if (value) {
        auto r = parse_number(value->text, "rate", 0, 1);
        if (!r) return fail(at(*value, r.err().message));
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
        if (!n) return fail(at(*value, n.err().message));
        after = *n;
      }
      f.die_after_ops = after;
    } else if (kind.text == "off") {
      if (value) return fail(at(*value, "'off' takes no value"));
      f = {};
    } else {
      return fail(at(kind, "unknown fault kind '" + kind.text + "' (expected error, stall, die or off)"));
    }
    if (*stall_seconds && kind.text != "stall")
      for (const auto& pr : c.named)
        if (pr.key.text == "seconds") return fail(at(pr.key, "seconds= applies to 'stall' only"));
    if (const int n = running()) return fail(error(errc::invalid_argument, fmt("%d jobs are running: 'wait' or 'cancel all' before injecting faults", n)), false);
    runtime_options o = rt_opts;
    o.backend.sim.faults = f;
    // The old runtime goes first: one set of actors at a time.
    plan_ptr.reset();
    collect_trace();
    rt.reset();
    if (auto e = create_runtime(spec, o, time_scale, values)) return fail(error(e.code, e.to_string()), false);
    out << faults_text() << " (devices " << spec << " created again)\n";
    return {};
  }

  outcome cmd_model(const command_line& c) {
    if (c.positional.size() != 1) return fail(bad_arg(c.positional.empty() ? "which model? gpt2 or llama" : "one model name expected"));
    models::transformer_config cfg;
    if (!models::parse_variant(c.positional[0].text, cfg.variant))
      return fail(bad_arg("unknown model '" + c.positional[0].text + "' (gpt2 or llama)"));
    cfg.n_layers = 12;
    cfg.d_model = 256;
    cfg.n_heads = 8;
    cfg.d_ff = 1024;
    cfg.seq_len = 64;
    cfg.batch = 1;
    cfg.vocab = 512;
    params p(c);
    auto geti = [&](const char* k, int64_t lo, int64_t hi, auto& field) -> error {
      auto v = p.get_int(k, lo, hi);
      if (!v) return v.err();
      if (*v) field = static_cast<std::remove_reference_t<decltype(field)>>(**v);
      return {};
    };
    if (auto e = geti("layers", 1, 4096, cfg.n_layers)) return fail(e);
    if (auto e = geti("d", 1, 1 << 16, cfg.d_model)) return fail(e);
    if (auto e = geti("heads", 1, 1024, cfg.n_heads)) return fail(e);
    if (auto e = geti("kv", 0, 1024, cfg.n_kv_heads)) return fail(e);
    if (auto e = geti("ff", 1, 1 << 18, cfg.d_ff)) return fail(e);
    if (auto e = geti("seq", 1, 1 << 16, cfg.seq_len)) return fail(e);
    if (auto e = geti("batch", 1, 4096, cfg.batch)) return fail(e);
    if (auto e = geti("vocab", 1, 1 << 22, cfg.vocab)) return fail(e);
    int64_t sd = static_cast<int64_t>(cfg.seed);
    if (auto e = geti("seed", 0, INT64_MAX, sd)) return fail(e);
    cfg.seed = static_cast<uint64_t>(sd);
    if (auto t = p.raw("dtype"); t && !parse_dtype(t->c_str(), cfg.dtype))
      return fail(bad_arg("dtype: '" + *t + "' is not one of f32, f16, bf16"));
    if (auto e = p.finish()) return fail(e);
    if (cfg.dtype == dtype::i32) return fail(bad_arg("dtype: i32 cannot hold weights (f32, f16 or bf16)"));
    if (auto e = models::validate(cfg)) return fail(bad_arg(e.message));
    // Building draws every weight: refuse sizes that would take minutes.
    const int64_t params_n = models::parameter_count(cfg);
    const double weight_bytes = static_cast<double>(params_n) * static_cast<double>(dtype_size(cfg.dtype));
    const double phys = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    if (phys > 0 && weight_bytes > phys / 4)
      return fail(bad_arg(fmt("%.2f G parameters (%s of weights) is too big to build on this host (%s of memory)",
                              static_cast<double>(params_n) / 1e9, bytes_text(weight_bytes).c_str(), bytes_text(phys).c_str())),
                  false);
    auto gr = models::build_transformer(cfg);
    if (!gr) return fail(gr.err(), false);
    tcfg = cfg;
    set_graph(std::make_shared<const graph>(std::move(*gr)),
              fmt("%s: %d layers, d %lld, %d heads%s, ff %lld, seq %lld, batch %lld, vocab %lld, %s", models::to_string(cfg.variant),
                  cfg.n_layers, static_cast<long long>(cfg.d_model), cfg.n_heads,
                  cfg.variant == models::model_variant::llama && cfg.kv_heads() != cfg.n_heads ? fmt(" (%d kv)", cfg.kv_heads()).c_str() : "",
                  static_cast<long long>(cfg.d_ff), static_cast<long long>(cfg.seq_len), static_cast<long long>(cfg.batch),
                  static_cast<long long>(cfg.vocab), ag::to_string(cfg.dtype)));
    out << fmt("model %s\n  %.2f M parameters, %s of weights, %zu nodes, %.3f GFLOP per job\n", model_desc.c_str(),
               static_cast<double>(params_n) / 1e6, bytes_text(static_cast<double>(g->weight_bytes())).c_str(), g->size(), model_flops / 1e9);
    return {};
  }

  void set_graph(std::shared_ptr<const graph> ng, std::string desc) {
    g = std::move(ng);
    model_desc = std::move(desc);
    plan_ptr.reset();
    model_flops = 0;
    for (const node& n : g->nodes()) model_flops += cost_of(*g, n).flops;
  }

  outcome cmd_graph(const command_line& c) {
    std::string text = c.rest;
    std::size_t offset = c.rest_pos;
    const auto first = text.find_first_not_of(" \t");
    if (first == std::string::npos) return fail(bad_arg("no expression"));
    if (text[first] == '@') {
      std::string path = text.substr(first + 1);
      path.erase(path.find_last_not_of(" \t") + 1);
      std::ifstream f(path);
      if (!f) return fail(bad_arg("cannot read '" + path + "'"));
      std::string all, l;
      while (std::getline(f, l)) {
        if (const auto h = l.find('#'); h != std::string::npos) l.replace(h, std::string::npos, l.size() - h, ' ');
        all += l + "\n";
      }
      auto gr = graph_from_expr(all, seed, 0);
      if (!gr) return fail(error(gr.err().code, path + ": " + gr.err().message));
      return adopt_graph(std::move(*gr), path);
    }
    auto gr = graph_from_expr(text, seed, offset);
    if (!gr) return fail(gr.err());
    return adopt_graph(std::move(*gr), "custom graph");
  }

  outcome adopt_graph(graph gr, const std::string& what) {
    tcfg.reset();
    auto sp = std::make_shared<const graph>(std::move(gr));
    std::string io;
    for (node_id id : sp->inputs()) io += " " + sp->at(id).name + sp->at(id).dims.to_string();
    io += " ->";
    for (node_id id : sp->outputs()) io += " " + sp->at(id).name + sp->at(id).dims.to_string();
    set_graph(sp, what + ":" + io);
    out << fmt("graph %s\n  %zu nodes, %s of weights, %.3f MFLOP per job\n", model_desc.c_str(), g->size(),
               bytes_text(static_cast<double>(g->weight_bytes())).c_str(), model_flops / 1e6);
    return {};
  }

  outcome cmd_plan(const command_line& c) {
    params p(c);
    auto st = p.get_int("stages", 0, 4096);
    if (!st) return fail(st.err());
    auto ln = p.get_int("lanes", 1, 64);
    if (!ln) return fail(ln.err());
    if (auto e = p.finish()) return fail(e);
    if (!c.positional.empty()) return fail(bad_arg("unexpected '" + c.positional[0].text + "'"));
    if (*st && static_cast<int>(**st) != stages) { stages = static_cast<int>(**st); plan_ptr.reset(); }
    if (*ln && static_cast<int>(**ln) != lanes) { lanes = static_cast<int>(**ln); plan_ptr.reset(); }
    auto pl = get_plan();
    if (!pl) return fail(pl.err(), pl.err().code == errc::invalid_argument && !g);
    out << (*pl)->describe();
    if (!(*pl)->describe().empty() && (*pl)->describe().back() != '\n') out << "\n";
    return {};
  }

  std::string settings_text() const {
    return fmt("stages=%d%s microbatches=%d lanes=%d check=%s seed=%llu", stages, stages == 0 ? " (all devices)" : "", microbatches,
               lanes, to_string(check), static_cast<unsigned long long>(seed));
  }

  outcome cmd_set(const command_line& c) {
    params p(c);
    auto st = p.get_int("stages", 0, 4096);
    if (!st) return fail(st.err());
    auto mb = p.get_int("microbatches", 1, 100000);
    if (!mb) return fail(mb.err());
    auto ln = p.get_int("lanes", 1, 64);
    if (!ln) return fail(ln.err());
    auto sd = p.get_int("seed", 0, INT64_MAX);
    if (!sd) return fail(sd.err());
    std::optional<check_mode> ck;
    if (auto r = p.raw("check")) {
      auto m = parse_check(*r);
      if (!m) return fail(m.err());
      ck = *m;
    }
    if (auto e = p.finish()) return fail(e);
    if (!c.positional.empty()) return fail(bad_arg("expected key=value, got '" + c.positional[0].text + "'"));
    if (*st && static_cast<int>(**st) != stages) { stages = static_cast<int>(**st); plan_ptr.reset(); }
    if (*ln && static_cast<int>(**ln) != lanes) { lanes = static_cast<int>(**ln); plan_ptr.reset(); }
    if (*mb) microbatches = static_cast<int>(**mb);
    if (*sd) seed = next_seed = static_cast<uint64_t>(**sd);
    if (ck) check = *ck;
    out << settings_text() << "\n";
    return {};
  }

  outcome cmd_run(const command_line& c) {
    params p(c);
    auto nn = p.get_int("n", 1, 100000);
    if (!nn) return fail(nn.err());
    check_mode mode = check;
    if (auto r = p.raw("check")) {
      auto m = parse_check(*r);
      if (!m) return fail(m.err());
      mode = *m;
    }
    if (auto e = p.finish()) return fail(e);
    if (!c.positional.empty()) return fail(bad_arg("unexpected '" + c.positional[0].text + "' (did you mean n=" + c.positional[0].text + "?)"));
    const int n = *nn ? static_cast<int>(**nn) : microbatches;
    auto pl = get_plan();
    if (!pl) return fail(pl.err(), !g);

    batch_entry b;
    b.id = static_cast<int>(batches.size()) + 1;
    b.n = n;
    b.verbose = n <= 16;
    // Which jobs to check against the reference evaluator.
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
    std::vector<std::vector<host_tensor>> inputs;
    inputs.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) inputs.push_back(inputs_for(next_seed++));
    std::vector<std::vector<host_tensor>> kept(inputs.begin(), inputs.begin() + std::min(n, to_check));
    b.submit_ns = now_ns();
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
      e.check_pending = static_cast<int>(i) < to_check;
      b.jobs.push_back(e.id);
      jobs[e.id] = e;
    }
    batches.push_back(b);
    // Callbacks last: a job may be ready already and report at once.
    for (std::size_t i = 0; i < js.size(); ++i) {
      std::shared_ptr<event_queue> q = events;
      std::shared_ptr<checker> ck = static_cast<int>(i) < to_check ? chk : nullptr;
      checker::task t;
      const uint64_t id = ids[i];
      if (ck) t = {id, js[i], g, std::move(kept[i])};
      js[i].then([q, ck, id, t = std::move(t)](const job_result&) mutable {
        q->push({event::kind::done, id, true, {}});
        if (ck) ck->post(std::move(t));
      });
    }
    out << fmt("run %d: submitted %d job%s (ids %llu..%llu) of %s on %s\n", b.id, n, n == 1 ? "" : "s",
               static_cast<unsigned long long>(ids.empty() ? 0 : ids.front()),
               static_cast<unsigned long long>(ids.empty() ? 0 : ids.back()), tcfg ? models::to_string(tcfg->variant) : "graph",
               spec.c_str());
    return {};
  }

  outcome cmd_jobs(const command_line& c) {
    params p(c);
    if (auto e = p.finish()) return fail(e);
    const bool all = !c.positional.empty() && c.positional[0].text == "all";
    if (!c.positional.empty() && !all) return fail(bad_arg("unexpected '" + c.positional[0].text + "'"));
    int counts[5] = {0, 0, 0, 0, 0};
    for (const auto& [id, j] : jobs) ++counts[static_cast<int>(j.handle.state())];
    out << fmt("%zu jobs: %d queued, %d running, %d done, %d failed, %d cancelled\n", jobs.size(), counts[0], counts[1], counts[2],
               counts[3], counts[4]);
    std::size_t skip = all || jobs.size() <= 20 ? 0 : jobs.size() - 20;
    if (skip) out << fmt("  (%zu older jobs not shown: 'jobs all')\n", skip);
    for (const auto& [id, j] : jobs) {
      if (skip) { --skip; continue; }
      out << "  " << job_summary(j) << "\n";
    }
    return {};
  }

  std::string job_summary(const job_entry& j) const {
    const job_times t = j.handle.times();
    std::string s = fmt("job %-5llu run %-3d %-9s", static_cast<unsigned long long>(j.id), j.batch, ag::to_string(j.handle.state()));
    if (t.finished_ns) s += fmt(" %8s", ms(t.finished_ns - t.submitted_ns).c_str());
    if (!j.check_text.empty()) s += "  " + j.check_text;
    return s;
  }

  expected<uint64_t> job_id_arg(const command_line& c) {
    if (c.positional.size() != 1) return bad_arg("one job id expected");
    auto v = parse_int(c.positional[0].text, "job id", 0, INT64_MAX);
    if (!v) return v.err();
    if (!jobs.count(static_cast<uint64_t>(*v))) return bad_arg("no job " + c.positional[0].text + " (see 'jobs')");
    return static_cast<uint64_t>(*v);
  }

  outcome cmd_job(const command_line& c) {
    params p(c);
    if (auto e = p.finish()) return fail(e);
    auto id = job_id_arg(c);
    if (!id) return fail(id.err());
    const job_entry& j = jobs.at(*id);
    const job_times t = j.handle.times();
    out << fmt("job %llu (run %d, #%d): %s\n", static_cast<unsigned long long>(j.id), j.batch, j.index, ag::to_string(j.handle.state()));
    if (t.started_ns) out << "  waited for arenas " << ms(t.started_ns - t.submitted_ns) << "\n";
    if (t.finished_ns) out << "  latency           " << ms(t.finished_ns - t.submitted_ns) << "\n";
    if (j.handle.ready()) {
      const job_result& r = j.handle.wait();
      if (r) {
        for (std::size_t i = 0; i < r->size(); ++i)
          out << fmt("  output %zu: %s %s\n", i, ag::to_string((*r)[i].type()), (*r)[i].dims().to_string().c_str());
      } else {
        out << "  error: " << r.err().to_string() << "\n";
      }
      out << "  " << (j.check_text.empty() ? j.check_pending ? "check: running" : "check: skipped" : j.check_text) << "\n";
    }
    return {};
  }

  outcome cmd_cancel(const command_line& c) {
    params p(c);
    if (auto e = p.finish()) return fail(e);
    if (c.positional.size() == 1 && c.positional[0].text == "all") {
      const int n = running();
      cancel_all();
      out << fmt("cancelling %d running job%s\n", n, n == 1 ? "" : "s");
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

  void cancel_all() {
    for (auto& [id, j] : jobs)
      if (!j.handle.ready()) j.handle.cancel();
  }

  expected<int> batch_arg(params& p) {
    auto b = p.get_int("batch", 1, 1 << 30);
    if (!b) return b.err();
    if (batches.empty()) return bad_arg("nothing has run yet: 'run' first");
    if (!*b) return batches.back().id;
    if (!batch_of(static_cast<int>(**b))) return bad_arg(fmt("no run %lld (runs 1..%zu)", static_cast<long long>(**b), batches.size()));
    return static_cast<int>(**b);
  }

  std::string partial_note(int id) {
    const batch_entry* b = batch_of(id);
    if (b && b->reported < b->n) return fmt("(run %d still running: %d/%d jobs finished)\n", id, b->reported, b->n);
    return {};
  }

  outcome cmd_timeline(const command_line& c) {
    params p(c);
    auto w = p.get_int("width", 20, 1000);
    if (!w) return fail(w.err());
    auto b = batch_arg(p);
    if (!b) return fail(b.err());
    if (auto e = p.finish()) return fail(e);
    if (!c.positional.empty()) return fail(bad_arg("unexpected '" + c.positional[0].text + "'"));
    collect_trace();
    timeline_options o;
    o.width = *w ? static_cast<int>(**w) : opt.width;
    out << render_timeline(trace_of(*b), o) << partial_note(*b);
    return {};
  }

  outcome cmd_util(const command_line& c) {
    params p(c);
    auto b = batch_arg(p);
    if (!b) return fail(b.err());
    if (auto e = p.finish()) return fail(e);
    if (!c.positional.empty()) return fail(bad_arg("unexpected '" + c.positional[0].text + "'"));
    collect_trace();
    out << render_utilisation(trace_of(*b)) << partial_note(*b);
    return {};
  }

  outcome cmd_trace(const command_line& c) {
    params p(c);
    if (c.positional.size() != 1) return fail(bad_arg("one file name expected"));
    auto b = batch_arg(p);
    if (!b) return fail(b.err());
    if (auto e = p.finish()) return fail(e);
    collect_trace();
    const trace t = trace_of(*b);
    std::ofstream f(c.positional[0].text);
    if (!f) return fail(bad_arg("cannot write '" + c.positional[0].text + "'"), false);
    f << t.to_chrome_json();
    f.close();
    if (!f) return fail(bad_arg("writing '" + c.positional[0].text + "' failed"), false);
    out << fmt("wrote %zu events of run %d to %s (open in https://ui.perfetto.dev or chrome://tracing)\n", t.records.size(), *b,
               c.positional[0].text.c_str());
    out << partial_note(*b);
    return {};
  }

  outcome cmd_source(const command_line& c) {
    if (c.positional.size() != 1 || !c.named.empty()) return fail(bad_arg("one file name expected"));
    if (source_depth >= 8) return fail(bad_arg("'source' nested more than 8 deep"), false);
    std::ifstream f(c.positional[0].text);
    if (!f) return fail(bad_arg("cannot read '" + c.positional[0].text + "'"));
    ++source_depth;
    std::string l;
    int line_no = 0;
    outcome result;
    while (std::getline(f, l)) {
      ++line_no;
      print_reports(drain());
      if (l.find_first_not_of(" \t\r") == std::string::npos) continue;
      out << "> " << l << "\n";
      const exec_status st = self.execute(l);
      if (st == exec_status::quit) {
        quit_from_source = true;  // a `quit` in a sourced file ends the session
        break;
      }
      if (st == exec_status::failed && !self.keep_going) {
        result = fail(bad_arg(fmt("%s:%d: command failed", c.positional[0].text.c_str(), line_no)), false);
        break;
      }
    }
    --source_depth;
    return result;
  }

  outcome cmd_quit(const command_line& c, bool& quit) {
    params p(c);
    if (auto e = p.finish()) return fail(e);
    std::string mode = c.positional.empty() ? "" : c.positional[0].text;
    if (c.positional.size() > 1 || (!mode.empty() && mode != "wait" && mode != "cancel"))
      return fail(bad_arg("'" + mode + "': say 'quit wait' or 'quit cancel'"));
    const int n = running();
    if (n > 0 && mode.empty()) {
      if (opt.interactive && self.ask) {
        const std::string a = self.ask(fmt("%d job%s running: [w]ait for them, [c]ancel them, or stay? [w/c/s] ", n, n == 1 ? " is" : "s are"));
        if (a == "w" || a == "wait") mode = "wait";
        else if (a == "c" || a == "cancel") mode = "cancel";
        else {
          out << "staying\n";
          return {};
        }
      } else {
        mode = "wait";
      }
    }
    if (n > 0 && mode == "cancel") {
      cancel_all();
      out << fmt("cancelled %d job%s\n", n, n == 1 ? "" : "s");
    }
    if (n > 0 && mode == "wait") out << fmt("waiting for %d job%s\n", n, n == 1 ? "" : "s");
    if (!wait_all()) {
      out << fmt("interrupted: not quitting; %d job%s still running\n", running(), running() == 1 ? "" : "s");
      return {};
    }
    quit = true;
    return {};
  }

  void print_reports(const std::vector<report>& rs) {
    for (const auto& r : rs) out << r.text << "\n";
    out.flush();
  }

  bool wait_all() {
    interrupted.store(false);
    bool progress_open = false;
    auto flush_reports = [&] {
      for (const auto& r : drain()) {
        if (opt.interactive && r.progress) {
          out << "\r\033[K" << r.text << std::flush;
          progress_open = true;
          continue;
        }
        if (progress_open) out << "\r\033[K";
        progress_open = false;
        out << r.text << "\n";
      }
      out.flush();
    };
    for (;;) {
      flush_reports();
      if (unreported() == 0) break;
      if (interrupted.load()) {
        if (progress_open) out << "\n";
        out << fmt("^C: back to the prompt; %d job%s still running\n", running(), running() == 1 ? "" : "s");
        interrupted.store(false);
        return false;
      }
      pollfd pfd{rfd, POLLIN, 0};
      ::poll(&pfd, 1, 200);
    }
    if (progress_open) out << "\n";
    return true;
  }

  exec_status execute(const std::string& line) {
    auto split = split_command(line);
    if (!split) {
      out << "error: " << split.err().message << "\n";
      return exec_status::failed;
    }
    const command_line& c = *split;
    if (c.empty()) return exec_status::ok;
    const command_info* ci = find_command(c.name.text);
    if (!ci) {
      std::string near;
      for (const auto& x : commands())
        if (std::string(x.name).rfind(c.name.text.substr(0, 2), 0) == 0 && c.name.text.size() >= 2) near = x.name;
      out << "error: unknown command '" << c.name.text << "'" << (near.empty() ? "" : " (did you mean '" + near + "'?)")
          << "; type 'help' for the list\n";
      return exec_status::failed;
    }
    const std::string& n = c.name.text;
    outcome o;
    bool quit = false;
    if (n == "help") o = cmd_help(c);
    else if (n == "devices") o = cmd_devices(c);
    else if (n == "fault") o = cmd_fault(c);
    else if (n == "model") o = cmd_model(c);
    else if (n == "graph") o = cmd_graph(c);
    else if (n == "plan") o = cmd_plan(c);
    else if (n == "set") o = cmd_set(c);
    else if (n == "run") o = cmd_run(c);
    else if (n == "wait") {
      params p(c);
      if (auto e = p.finish(); e || !c.positional.empty()) o = fail(e ? e : bad_arg("'wait' takes no arguments"));
      else wait_all();
    } else if (n == "jobs") o = cmd_jobs(c);
    else if (n == "job") o = cmd_job(c);
    else if (n == "cancel") o = cmd_cancel(c);
    else if (n == "timeline") o = cmd_timeline(c);
    else if (n == "util") o = cmd_util(c);
    else if (n == "trace") o = cmd_trace(c);
    else if (n == "source") {
      o = cmd_source(c);
      quit = quit_from_source && source_depth == 0;
      if (source_depth == 0) quit_from_source = false;
    }
    else if (n == "echo") out << (c.rest.empty() ? "" : c.rest.substr(c.rest.find_first_not_of(" \t") == std::string::npos ? c.rest.size() : c.rest.find_first_not_of(" \t"))) << "\n";
    else if (n == "quit" || n == "exit") o = cmd_quit(c, quit);
    if (o.e) {
      print_error(o, ci);
      out.flush();
      return exec_status::failed;
    }
    out.flush();
    return quit ? exec_status::quit : exec_status::ok;
  }
};

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
int session::notify_fd() const noexcept { return impl_->rfd; }
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

completion session::complete(const std::string& line, std::size_t word_start) const {
  completion r;
  if (word_start > line.size()) word_start = line.size();
  const std::string word = line.substr(word_start);
  auto split = split_command(line.substr(0, word_start));
  auto add = [&](const std::string& cand) {
    if (cand.rfind(word, 0) == 0) r.candidates.push_back(cand);
  };
  if (!split || split->empty()) {
    for (const auto& c : commands()) add(c.name);
    return r;
  }
  const command_info* ci = find_command(split->name.text);
  if (!ci) return r;
  const std::string name = ci->name;
  if (name == "help") {
    if (split->positional.empty())
      for (const auto& c : commands()) add(c.name);
    return r;
  }
  if (name == "graph") {
    // Complete the function name after the last '=', '(' or ','.
    const auto cut = word.find_last_of("=(,");
    const std::string head = cut == std::string::npos ? "" : word.substr(0, cut + 1);
    const std::string tail = word.substr(head.size());
    if (head.empty() && tail.empty()) return r;
    if (head.empty()) {
      if (std::string("out").rfind(tail, 0) == 0) r.candidates.push_back("out");
      if (tail.size() && tail[0] == '@') r.filenames = true;
      return r;
    }
    for (const auto& f : graph_expr_functions())
      if (f.rfind(tail, 0) == 0) r.candidates.push_back(head + f + (f == "input" || f == "weight" ? "[" : "("));
    return r;
  }
  if (const auto eq = word.find('='); eq != std::string::npos) {
    const std::string key = word.substr(0, eq + 1);
    std::vector<std::string> vals;
    if (key == "check=") vals = {"auto", "all", "first", "off"};
    else if (key == "dtype=") vals = {"f32", "f16", "bf16"};
    else if (key == "values=") vals = {"on", "off"};
    for (const auto& v : vals) add(key + v);
    return r;
  }
  if (name == "fault") {
    // Positional words in order: a device (names come from the live runtime), a kind, a value.
    if (split->positional.empty()) {
      add("sim");
      for (const auto& d : impl_->sim_device_names()) add(d);
    } else if (split->positional.size() == 1) {
      for (const char* k : {"error", "stall", "die", "off"}) add(k);
    }
    bool seconds_given = false;
    for (const auto& p : split->named) seconds_given = seconds_given || p.key.text == "seconds";
    if (split->positional.size() >= 2 && split->positional[1].text == "stall" && !seconds_given) add("seconds=");
    return r;
  }
  if ((name == "source" || name == "trace") && split->positional.empty()) {
    r.filenames = true;
    if (name == "source") return r;
  }
  for (const auto& w : ci->words)
    if (split->positional.empty()) add(w);
  for (const auto& k : ci->keys) {
    bool given = false;
    for (const auto& p : split->named) given = given || p.key.text + "=" == k;
    if (!given) add(k);
  }
  if ((name == "job" || name == "cancel") && split->positional.empty()) {
    for (const auto& [id, j] : impl_->jobs)
      if (name == "job" || !j.handle.ready()) add(std::to_string(id));
  }
  return r;
}

// ---------------------------------------------------------------- script

int run_script(session& s, std::istream& in, std::ostream& out, bool keep_going) {
  s.keep_going = keep_going;
  int status = 0;
  std::string line;
  auto print = [&] {
    for (const auto& r : s.drain()) out << r.text << "\n";
    out.flush();
  };
  while (std::getline(in, line)) {
    print();
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    out << "> " << line << "\n";
    out.flush();
    const exec_status st = s.execute(line);
    if (st == exec_status::quit) {
      print();
      return status;
    }
    if (st == exec_status::failed) {
      status = 1;
      if (!keep_going) {
        out << "stopping: the command above failed (--keep-going continues after errors)\n";
        s.cancel_all();
        s.wait_all();
        print();
        return status;
      }
    }
  }
  // End of input: as `quit wait`.
  s.wait_all();
  print();
  return status;
}

}  // namespace ag::repl
