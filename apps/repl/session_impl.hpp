#pragma once
/// \file session_impl.hpp
/// The inside of ag::repl::session, shared by the files that implement it,
/// one command family each:
///   session.cpp       construction, the command dispatch, the runtime,
///                     help / source / echo / quit, scripts
///   commands.cpp      the command table and completion
///   cmd_devices.cpp   devices, fault
///   cmd_graph.cpp     model, graph
///   cmd_generate.cpp  load, generate
///   cmd_plan.cpp      plan, set
///   cmd_run.cpp       run, wait, jobs, job, cancel, and the job reports
///   cmd_view.cpp      timeline, util, trace
/// Not a public header: only apps/repl/*.cpp include it.
///
/// Threading: everything here runs on the session's main thread, except the
/// event queue and the checker (see checker.hpp).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "apps/repl/args.hpp"
#include "apps/repl/checker.hpp"
#include "apps/repl/format.hpp"
#include "actors/generator.hpp"
#include "apps/repl/session.hpp"
#include "graph/checkpoint/hf_model.hpp"
#include "graph/checkpoint/tokenizer.hpp"
#include "graph/models/transformer.hpp"

namespace ag::repl {

/// A command's result: ok, or an error. A usage error prints the command's
/// usage after the reason; an operational one (a plan that does not fit, a
/// runtime that cannot start) only the reason.
struct outcome {
  error e;
  bool usage = true;
};
inline outcome fail(error e, bool usage = true) { return {std::move(e), usage}; }
/// An error at a column of the command line ("col 12: ...").
inline error at_col(const word& w, const std::string& what) { return bad_arg(fmt("col %zu: ", w.pos + 1) + what); }

/// Which jobs of a run are compared with the reference evaluator.
enum class check_mode : uint8_t { automatic, all, first, off };
const char* to_string(check_mode m) noexcept;
/// Reads check= (auto, all, first, off; "on" = all) if given.
expected<std::optional<check_mode>> read_check(params& p);

struct job_entry {
  uint64_t id = 0;  ///< the REPL's id, unique for the whole session
  int batch = 0;    ///< the run it belongs to
  int index = 0;    ///< its place in the run
  job handle;
  bool done = false;      ///< its "done" event arrived
  bool reported = false;  ///< its line (or its share of a progress line) was printed
  check_status check = check_status::none;
  std::string check_text;
};

/// One `run`: its jobs and what was reported of them.
struct batch_entry {
  int id = 0;
  int n = 0;
  int64_t submit_ns = 0;
  std::vector<uint64_t> jobs;
  bool verbose = true;  ///< a line per job (small runs), else progress lines
  int reported = 0, ok = 0, failed = 0, cancelled = 0;
  int checks_ok = 0, checks_bad = 0, checks_stopped = 0;
  int64_t last_progress_ns = 0;
  int last_progress_quarter = 0;
  std::string check_note;
  bool summarised = false;
};

struct session::impl {
  impl(session& s, std::ostream& o, session_options opts);
  ~impl();

  session& self;
  std::ostream& out;
  session_options opt;
  std::shared_ptr<event_queue> events;
  std::shared_ptr<checker> chk;
  std::atomic<bool> interrupted{false};

  // devices
  std::string spec;
  // cpu devices use the machine's threads, shared among them (the library's
  // default is the stream's thread alone).
  runtime_options rt_opts = [] {
    runtime_options o;
    o.backend.cpu_threads_per_stream = 0;
    return o;
  }();
  double time_scale = 20;
  bool values = true;
  std::unique_ptr<runtime> rt;

  // model and plan
  std::shared_ptr<const graph> g;
  std::string model_desc;
  std::optional<models::transformer_config> tcfg;
  double model_flops = 0;
  std::shared_ptr<const plan> plan_ptr;
  /// `load`: the folder's model (its mappings back g's weights) and tokenizer.
  std::shared_ptr<const models::hf_model> hf;
  models::tokenizer_ptr tok;
  /// `generate`: the generator of the current model, layout and cache size
  /// (gen_key); dropped with the plan (model, devices or layout change).
  std::shared_ptr<generator> gen;
  std::string gen_key;

  // settings
  int stages = 0, microbatches = 16, lanes = 0;  // lanes 0: auto (the planner decides)
  int job_lanes = 0;                             // plan_options::job_lanes (0: auto)
  graph_replay_mode replay = graph_replay_mode::automatic;  ///< plan_options::graph_replay (set replay=)
  int tp = 1;                  ///< tensor-parallel degree ('set tp=N')
  std::vector<double> ratios;  ///< shard ratios ('set ratios=3,1'); empty: even
  /// plan_options::sequence_parallel ('set sp=on|off|auto')
  sequence_parallel_mode sp = sequence_parallel_mode::automatic;
  check_mode check = check_mode::automatic;
  uint64_t seed = 1, next_seed = 1;

  // jobs
  std::map<uint64_t, job_entry> jobs;
  uint64_t next_job_id = 1;
  std::map<uint64_t, uint64_t> rt_ids;  ///< current runtime's job id -> REPL job id
  std::vector<batch_entry> batches;
  std::vector<trace_record> records;
  std::vector<std::string> device_names;
  int source_depth = 0;
  bool quit_from_source = false;

  // ---- session.cpp: dispatch, runtime, the small commands
  exec_status execute(const std::string& line);
  void print_error(const outcome& o, const command_info* c);
  void print_reports(const std::vector<report>& rs);
  error ensure_runtime();
  /// Creates the runtime (the old one must be gone).
  error create_runtime(const std::string& s, runtime_options o, double scale, bool vals);
  /// Stops the current runtime (after its trace was collected) and creates
  /// another: one set of actors at a time. Refused while jobs run.
  outcome replace_runtime(const std::string& s, runtime_options o, double scale, bool vals, const char* why);
  outcome cmd_help(const command_line& c);
  outcome cmd_source(const command_line& c);
  outcome cmd_echo(const command_line& c);
  outcome cmd_quit(const command_line& c);
  bool quit_requested = false;  ///< set by cmd_quit / a sourced quit

  // ---- cmd_devices.cpp
  outcome cmd_devices(const command_line& c);
  outcome cmd_fault(const command_line& c);
  std::string devices_text() const;
  std::vector<std::string> sim_device_names() const;
  bool faults_injected() const;
  std::string faults_text() const;

  // ---- cmd_graph.cpp
  outcome cmd_model(const command_line& c);
  outcome cmd_graph(const command_line& c);
  outcome adopt_graph(graph gr, const std::string& what);
  void set_graph(std::shared_ptr<const graph> ng, std::string desc);

  // ---- cmd_generate.cpp
  outcome cmd_load(const command_line& c);
  outcome cmd_generate(const command_line& c);
  /// generate with several prompts: `base` each, with its own stop= reader.
  outcome generate_several(const std::vector<std::vector<int32_t>>& prompts, const generate_options& base,
                           const std::string& stop_text);

  // ---- cmd_plan.cpp
  outcome cmd_plan(const command_line& c);
  outcome cmd_set(const command_line& c);
  /// stages= and lanes=: the current ones with the given ones replaced.
  struct layout {
    int stages = 0, lanes = 0;
    int tp = 1;                  ///< tensor-parallel degree (devices per stage)
    std::vector<double> ratios;  ///< shard ratios (empty: even)
    graph_replay_mode replay = graph_replay_mode::automatic;
    sequence_parallel_mode sp = sequence_parallel_mode::automatic;
    int job_lanes = 0;           ///< plan_options::job_lanes (0: auto)
  };
  expected<layout> read_layout(params& p) const;
  /// Takes them; a change drops the compiled plan.
  void apply_layout(layout l);
  /// The plan of the current graph on the current devices, compiled when
  /// needed; refused before loading when it would not fit this host.
  expected<std::shared_ptr<const plan>> get_plan();
  /// True when device `d` keeps its memory in the host's (cpu; sim with values).
  bool host_backed(const device_spec& d) const;
  std::string settings_text() const;

  // ---- cmd_run.cpp
  outcome cmd_run(const command_line& c);
  outcome cmd_wait(const command_line& c);
  outcome cmd_jobs(const command_line& c);
  outcome cmd_job(const command_line& c);
  outcome cmd_cancel(const command_line& c);
  /// Refuses a run whose inputs, outputs, checks and host-backed device
  /// memory would not fit this host, before anything is allocated.
  error check_run_memory(const plan& p, int n, int to_check) const;
  std::vector<host_tensor> inputs_for(uint64_t s) const;
  std::vector<host_tensor> custom_inputs(uint64_t s) const;
  expected<uint64_t> job_id_arg(const command_line& c) const;
  std::string job_summary(const job_entry& j) const;
  int running() const;
  int unreported() const;
  bool wait_all();
  void cancel_all();
  // reports (main thread)
  std::vector<report> drain();
  void finish_job(job_entry& j, std::vector<report>& outv);
  std::string job_line(const job_entry& j, const batch_entry& b) const;
  std::string progress_line(const batch_entry& b) const;
  std::string summary_line(const batch_entry& b) const;
  batch_entry* batch_of(int id);
  const batch_entry* batch_of(int id) const;

  // ---- cmd_view.cpp
  outcome cmd_timeline(const command_line& c);
  outcome cmd_util(const command_line& c);
  outcome cmd_trace(const command_line& c);
  expected<int> batch_arg(params& p);
  std::string partial_note(int id) const;
  void collect_trace();
  trace trace_of(int batch_id) const;
};

/// Reads a text file of at most `max_bytes` (scripts, graph files): a clear
/// error for a file that cannot be read, is larger (`graph @/dev/zero`), or
/// holds NUL bytes.
expected<std::string> read_text_file(const std::string& path, std::size_t max_bytes);

}  // namespace ag::repl
