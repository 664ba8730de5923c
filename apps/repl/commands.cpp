// The command table (names, usage, help, completion hints) and completion.
#include "apps/repl/graph_expr.hpp"
#include "apps/repl/session_impl.hpp"

namespace ag::repl {

namespace {

const char* const fault_details =
    "<device> is the name of the only simulated device (e.g. sim0 after 'devices cpu:1,sim:1'), or 'sim' for\n"
    "every simulated device: the sim backend takes one fault setting for all of its devices, and only when\n"
    "they are created (the runtime has no call that changes a live device's faults). So 'fault' creates the\n"
    "devices again with the same spec and parameters: refused while jobs run; the plan is compiled again at\n"
    "the next 'plan' or 'run'. Kinds add up ('fault sim error 0.1', then 'fault sim stall 0.2 seconds=5ms');\n"
    "'devices ...' creates healthy devices.\n"
    "  error [rate]  each op fails with probability rate (default 1); its job fails naming device, step and op\n"
    "  stall [rate]  each op takes seconds= longer (wall time, default 1 s) with probability rate (default 1)\n"
    "  die [ops]     the device dies after ops more ops (default 0: at once); every job that uses it fails\n"
    "  off           no faults\n";

const char* const graph_details =
    "Statements name=expr, separated by blanks, ';' or new lines; 'out a, b' marks the outputs.\n"
    "Leaves: input[d0,d1,...] and weight[d0,...] (dims in square brackets), optionally typed :f16 :bf16 :i32.\n"
    "Functions: matmul(a,b[,ta=1][,tb=1]) add(a,b) mul(a,b) scale(x,0.5) gelu(x) silu(x)\n"
    "  softmax(x[,causal=1][,scale=s]) rms_norm(x[,w][,eps=]) layer_norm(x[,w[,b]][,eps=]) get_rows(table,ids)\n"
    "  rope(x,pos[,theta=]) reshape(x,[2,32]) transpose(x,0,1) permute(x,[1,0]) slice(x,axis,begin,end)\n"
    "  concat(a,b,...,axis=k) copy(x,f16) contiguous(x) argmax(x)\n"
    "'graph @file' reads the statements from a file (at most 1 MiB; '#' starts a comment).\n";

const char* const run_details =
    "check=auto compares every job of graphs up to 50 MFLOP per job with the reference evaluator, the first\n"
    "job of each run up to 3 GFLOP, none above. A check that will take long says so when the run starts;\n"
    "Ctrl-C during 'wait' stops waiting and stops the checks (the jobs keep running). A run whose inputs,\n"
    "outputs and host-side device memory would not fit this host is refused before anything is allocated.\n";

}  // namespace

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
       "fault sim0 error 0.5", {"seconds="}, {"sim", "error", "stall", "die", "off"}, fault_details},
      {"model", "model gpt2|llama [layers=12 d=256 heads=8 kv=0 head_dim=0 bias=none qk_norm=0 window=0 ff=1024 seq=64 batch=1 vocab=512 dtype=f32 seed=1]",
       "build a transformer (the current graph); kv = llama's key/value heads (0: heads); head_dim = llama's heads' width "
       "(0: d / heads); bias = llama's attention biases: none, qkv (Qwen2's) or qkv_o; qk_norm=1: Qwen3's norms of q and k; window = llama's sliding window (Mistral's; 0: none)",
       "model llama layers=4 d=128 heads=4 kv=2 ff=256",
       {"layers=", "d=", "heads=", "kv=", "head_dim=", "bias=", "qk_norm=", "window=", "ff=", "seq=", "batch=", "vocab=", "dtype=", "seed="},
       {"gpt2", "llama"}},
      {"load", "load <folder> [seq=64 dtype=f32|f16|bf16]",
       "make a Hugging Face model folder (config.json + safetensors, optional tokenizer) the current model",
       "load /models/gpt2", {"seq=", "dtype="}, {}},
      {"generate", "generate \"<text>\"... | ids=1,2,3[;4,5...] [n=16 temperature=0 top_k=0 top_p=1 min_p=0 repetition_penalty=1 stop=<text> seed=S cache=<tokens> batch=N]",
       "generate text from the current model over a KV cache on the devices and layout set (set stages= tp=), tokens printed as they come (Ctrl-C stops); several prompts generate at once, decoding in shared steps (batch=N sequences a step, N = the prompts by default, 0: a step each), each printed when all end",
       "generate \"Once upon a time\" n=32 temperature=0.8 top_k=40", {"ids=", "n=", "temperature=", "top_k=", "top_p=", "min_p=", "repetition_penalty=", "stop=", "seed=", "cache=", "batch="}, {}},
      {"graph", "graph <name=expr ...> out <name> | graph @<file>",
       "build a custom graph from expressions (ops: matmul add mul scale gelu silu softmax rms_norm layer_norm get_rows rope reshape transpose permute slice concat copy contiguous argmax)",
       "graph x=input[8,64] w=weight[64,64] y=gelu(matmul(x,w)) out y", {}, {}, graph_details, true},
      {"plan", "plan [stages=N tp=T ratios=A,B sp=on|off|auto lanes=auto|L joblanes=auto|J]",
       "compile the current graph for the devices and describe the plan: splits, copies, shards and collectives (also sets the layout)",
       "plan stages=2 tp=2", {"stages=", "tp=", "ratios=", "sp=", "lanes=", "joblanes="}, {}},
      {"set", "set [stages=N tp=T ratios=A,B sp=on|off|auto microbatches=M lanes=auto|L joblanes=auto|J replay=on|off|auto check=auto|all|first|off seed=S]",
       "set parallelism (stages: pipeline stages, 0 = all devices / tp; tp: tensor-parallel devices per stage; ratios: "
       "shard proportions per device, even by default; sp: sequence parallelism, reduce-scatter and all-gather by rows "
       "instead of all-reduce (auto: where collectives run beside compute and messages take a ring); microbatches: jobs per run; lanes: compute streams per device (auto: where the cost model says branches pay); joblanes: copies of each device's queues that jobs in flight alternate over (auto: 2 on CUDA plans with collectives; 1: off); replay: graph replay of captured segments, "
       "see 'plan') and "
       "checking; no argument: show",
       "set tp=2 ratios=3,1", {"stages=", "tp=", "ratios=", "sp=", "microbatches=", "lanes=", "joblanes=", "replay=", "check=", "seed="}, {}},
      {"run", "run [n=<microbatches>] [check=auto|all|first|off]",
       "submit n micro-batch jobs of the current plan and return at once; each job reports when it finishes",
       "run n=32", {"n=", "check="}, {}, run_details},
      {"wait", "wait", "block until every submitted job finished (Ctrl-C returns to the prompt and stops reference checks; jobs keep running)",
       "wait", {}, {}},
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
      {"echo", "echo <text>", "print the text (for scripts)", "echo hello", {}, {}, nullptr, true},
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

// ------------------------------------------------------------ completion

namespace {

// Completion inside `graph`: the function name after the last '=', '(' or ','.
void complete_graph(const std::string& word, completion& r) {
  const auto cut = word.find_last_of("=(,");
  const std::string head = cut == std::string::npos ? "" : word.substr(0, cut + 1);
  const std::string tail = word.substr(head.size());
  if (head.empty() && tail.empty()) return;
  if (head.empty()) {
    if (std::string("out").rfind(tail, 0) == 0) r.candidates.push_back("out");
    if (!tail.empty() && tail[0] == '@') r.filenames = true;
    return;
  }
  for (const auto& f : graph_expr_functions())
    if (f.rfind(tail, 0) == 0) r.candidates.push_back(head + f + (f == "input" || f == "weight" ? "[" : "("));
}

bool key_given(const command_line& c, const std::string& key_with_eq) {
  for (const auto& p : c.named)
    if (p.key.text + "=" == key_with_eq) return true;
  return false;
}

}  // namespace

completion session::complete(const std::string& line, std::size_t word_start) const {
  completion r;
  if (word_start > line.size()) word_start = line.size();
  const std::string word = line.substr(word_start);
  const std::string before = line.substr(0, word_start);
  const auto head = split_command(before, true);
  const command_info* own = head && !head->empty() ? find_command(head->name.text) : nullptr;
  auto split = own && own->own_syntax ? head : split_command(before);
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
    complete_graph(word, r);
    return r;
  }
  if (const auto eq = word.find('='); eq != std::string::npos) {
    const std::string key = word.substr(0, eq + 1);
    std::vector<std::string> vals;
    if (key == "check=") vals = {"auto", "all", "first", "off"};
    else if (key == "dtype=") vals = {"f32", "f16", "bf16"};
    else if (key == "values=") vals = {"on", "off"};
    else if (key == "replay=" || key == "sp=") vals = {"on", "off", "auto"};
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
    if (split->positional.size() >= 2 && split->positional[1].text == "stall" && !key_given(*split, "seconds=")) add("seconds=");
    return r;
  }
  if ((name == "source" || name == "trace") && split->positional.empty()) {
    r.filenames = true;
    if (name == "source") return r;
  }
  if (split->positional.empty())
    for (const auto& w : ci->words) add(w);
  for (const auto& k : ci->keys)
    if (!key_given(*split, k)) add(k);
  if ((name == "job" || name == "cancel") && split->positional.empty()) {
    for (const auto& [id, j] : impl_->jobs)
      if (name == "job" || !j.handle.ready()) add(std::to_string(id));
  }
  return r;
}

}  // namespace ag::repl
