// actorgraph-generate: runs a Hugging Face model folder (config.json +
// safetensors, optional tokenizer) on the runtime's devices.
//
//   actorgraph-generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT)...
//                       [--decode-batch N]
//                       [--devices SPEC] [--tp N] [--stages N] [--dtype f32|f16|bf16]
//                       [--max-new-tokens N] [--temperature T --top-k K --top-p P --min-p M --seed S]
//                       [--repetition-penalty R] [--stop TEXT ...]
//                       [--eos-ids 2,3] [--cache-tokens C]
//                       [--dump-logits FILE.npy] [--progress]      (--help: all flags)
//
// Loads the model (the checkpoint's tensors are memory-mapped and read
// straight to the devices: under --tp each device reads only its shard;
// --stages S x --tp T lays the model out over S * T devices), runs the
// prompt forward as one job, and prints:
//   generated: 5            the greedy next token
//   generated_text: ...     its text, when the folder has a tokenizer
// With --max-new-tokens N > 1 or a sampling flag it generates through
// ag::generator instead (prompt as one prefill job, then a decode job per
// token over the KV cache; stops at N tokens, an end-of-sequence id (the
// config's eos_token_id unless --eos-ids) or a full cache) and prints
// `generated: 5,6,7`, the text, prefill_ms (time to the first token) and
// decode_ms_per_token / decode_tokens_per_s.
//   prefill_ms, prefill_tokens_per_s, load_s, load_gb_per_s (the model's
//   checkpoint bytes over the seconds from opening the folder to the end of
//   compile(), which uploads the weights; device start-up is not included)
// Several --prompt-ids (or --prompt) flags generate that many sequences at
// once (a cache slot each; their decode steps shared, up to N of them in
// one job a step with --decode-batch N, all of them by default,
// generator_options::decode_batch; 0: a job a sequence) and print generated[i],
// generated_text[i] and stop_reason[i] for each, then the whole run's
// tokens, how many shared a step, and generated_tokens_per_s.
// --dump-logits writes the prompt's logits, float32 [prompt length, vocab],
// as a NumPy .npy file. Load progress (bytes, rate) goes to stderr when it is
// a terminal, or always with --progress.
//
// Exit status: 0 on success, 1 when loading or running fails (the error is
// printed, naming what and where), 2 for a bad command line.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/actorgraph.hpp"
#include "actors/generator.hpp"
#include "apps/common/flags.hpp"
#include "graph/checkpoint/hf_model.hpp"
#include "graph/checkpoint/npy.hpp"
#include "graph/checkpoint/tokenizer.hpp"

namespace {

struct options {
  std::string model;
  std::vector<std::string> prompt;      ///< --prompt, once per sequence
  std::vector<std::string> prompt_ids;  ///< --prompt-ids, once per sequence
  int decode_batch = -1;                ///< generator_options::decode_batch (-1: the prompts' count when several)
  std::string devices = "cpu:1";
  int cpu_threads = 0;  ///< backend_options::cpu_threads_per_stream (0: the machine's, shared among cpu devices)
  int stages = 0;
  int tp = 1;
  std::string dtype;
  std::string dump_logits;
  bool progress = false;
  int max_new_tokens = 1;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::string> stop_texts;
  uint64_t seed = 0;
  std::string eos_ids;
  int64_t cache_tokens = 0;
};

// "[i]" after a printed name when there are several sequences, else nothing.
std::string seq_tag(std::size_t i, bool several) { return several ? "[" + std::to_string(i) + "]" : std::string(); }

// Ids as "5,6,7".
std::string id_list(const std::vector<int32_t>& ids) {
  std::string list;
  for (std::size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
  return list;
}

bool parse_ids(const std::string& s, std::vector<int32_t>& ids, std::string& why) {
  std::size_t i = 0;
  while (i <= s.size()) {
    const std::size_t comma = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, comma - i);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0 || v > 0x7fffffff) {
      why = "--prompt-ids: '" + item + "' is not a token id";
      return false;
    }
    ids.push_back(static_cast<int32_t>(v));
    i = comma + 1;
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prints "loading: X / Y MB at Z MB/s" on stderr every 200 ms until stopped.
class progress_line {
 public:
  progress_line(const ag::models::checkpoint& ck, int64_t total, bool on) : ck_(ck), total_(total) {
    if (on) thread_ = std::thread([this] { run(); });
  }
  ~progress_line() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
      thread_.join();
      std::fputs("\n", stderr);
    }
  }

 private:
  void run() {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(m_);
    while (true) {
      const double s = seconds_since(t0);
      const double mb = static_cast<double>(ck_.bytes_read()) / 1e6;
      std::fprintf(stderr, "\rloading: %.1f / %.1f MB  %.1f MB/s   ", mb, static_cast<double>(total_) / 1e6,
                   s > 0 ? mb / s : 0.0);
      std::fflush(stderr);
      if (cv_.wait_for(lk, std::chrono::milliseconds(200), [this] { return done_; })) break;
    }
  }

  const ag::models::checkpoint& ck_;
  int64_t total_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The layout as planned: used devices, pipeline stages, devices per stage.
void print_layout(const std::string& devices, const ag::plan& p) {
  std::printf("devices: %s, %zu used, stages: %d, tp: %d\n", devices.c_str(), p.used_devices().size(), p.stage_count(),
              p.tensor_degree());
}

int fail(const ag::error& e) {
  std::fprintf(stderr, "error: %s\n", e.to_string().c_str());
  return 1;
}

// Generation through ag::generator: prints the tokens, their text and the
// prefill / decode figures; several prompts generate together (one slot
// each, their decode steps batched: --decode-batch, the prompts' count by default) and print their
// lines with [i]. Returns the exit status.
int generate_tokens(ag::runtime& rt, const ag::models::hf_model& model, const options& o,
                    const std::vector<std::vector<int32_t>>& prompts, const std::vector<int32_t>& eos,
                    const ag::models::tokenizer_ptr& tok, std::chrono::steady_clock::time_point t_open) {
  const std::size_t n = prompts.size();
  const bool several = n > 1;
  int64_t S = 0, prompt_tokens = 0;  // the longest prompt, all of them
  for (const auto& p : prompts) S = std::max<int64_t>(S, static_cast<int64_t>(p.size())), prompt_tokens += static_cast<int64_t>(p.size());
  ag::generator_options go;
  go.cache_tokens = o.cache_tokens > 0 ? o.cache_tokens : S + o.max_new_tokens;
  if (model.config().model.variant == ag::models::model_variant::gpt2)
    go.cache_tokens = std::min<int64_t>(go.cache_tokens, model.config().max_positions);
  go.max_sequences = static_cast<int>(n);
  go.prefill_chunk = S;
  go.short_prompt_chunk = 0;  // each prompt is one chunk (the shorter ones padded)
  go.decode_batch = o.decode_batch >= 0 ? o.decode_batch : several ? static_cast<int>(n) : 0;
  go.plan.pipeline_stages = o.stages;
  go.plan.tensor_parallel = o.tp;
  std::shared_ptr<ag::generator> gen;
  {
    progress_line progress(model.weights(), model.model_bytes(), o.progress || ::isatty(2));
    auto g = ag::generator::create(rt, model.model_config(1), model.provider(), go);
    progress.stop();
    if (!g) return fail(g.err());
    gen = std::move(*g);
  }
  const double load_s = seconds_since(t_open);
  ag::generate_options opt;
  opt.max_new_tokens = o.max_new_tokens;
  opt.stop_ids = eos;
  opt.sampling = {.temperature = o.temperature,
                  .top_k = o.top_k,
                  .top_p = o.top_p,
                  .min_p = o.min_p,
                  .repetition_penalty = o.repetition_penalty,
                  .seed = o.seed};
  if (!o.stop_texts.empty() && !tok)
    return fail({ag::errc::invalid_argument, "--stop needs the folder's tokenizer to read the text (" + o.model +
                                                 " has none): use --eos-ids for ids"});
  // Stop strings, one reader a sequence, each read on the runtime thread
  // that streams its tokens.
  std::vector<std::optional<ag::models::stop_strings>> stops(n);
  std::atomic<int64_t> first_token_ns{0};  // the first sequence's first token
  const auto t_run = std::chrono::steady_clock::now();
  std::vector<ag::generation> handles;
  for (std::size_t i = 0; i < n; ++i) {
    ag::generate_options oi = opt;
    if (!o.stop_texts.empty()) {
      stops[i].emplace(tok, prompts[i], o.stop_texts);
      oi.stop_when = [&stops, i](int32_t t) { return stops[i]->push(t); };
    }
    if (i == 0)
      oi.on_token = [&](int32_t, int64_t k) {
        if (k == 0)
          first_token_ns.store(
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t_run).count());
      };
    handles.push_back(gen->generate(prompts[i], oi));
  }
  for (const ag::generation& h : handles) h.wait();
  const double run_s = seconds_since(t_run);
  int64_t generated = 0, batched = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const ag::generation_outcome& r = handles[i].wait();  // valid while handles[i] lives
    if (!r) return fail(r.err());
    const std::string at = seq_tag(i, several);
    std::printf("generated%s: %s\n", at.c_str(), id_list(r->tokens).c_str());
    if (tok) {
      auto text = tok->decode(r->tokens);
      if (text) std::printf("generated_text%s: %s\n", at.c_str(), text->c_str());
    }
    std::printf("stop_reason%s: %s\n", at.c_str(), ag::to_string(r->reason));
    generated += static_cast<int64_t>(r->tokens.size());
    batched += r->tokens_batched;
  }
  print_layout(o.devices, gen->decode_plan());
  // Rows a layer's cache holds: every position, or a ring of the sliding window.
  std::printf("kv_cache: %lld positions, %lld rows a layer, %lld bytes\n", static_cast<long long>(go.cache_tokens),
              static_cast<long long>(gen->cache_rows()), static_cast<long long>(gen->cache_bytes()));
  const double prefill_s = static_cast<double>(first_token_ns.load()) / 1e9;
  if (several) {
    // Sequences overlap: whole-run figures, not one sequence's phases.
    std::printf("sequences: %zu, %lld tokens generated, %lld of them in steps shared with other sequences\n", n,
                static_cast<long long>(generated), static_cast<long long>(batched));
    std::printf("generated_tokens_per_s: %.1f\n", run_s > 0 ? static_cast<double>(generated) / run_s : 0.0);
    std::printf("prompt_tokens: %lld\n", static_cast<long long>(prompt_tokens));
  } else {
    const auto t = static_cast<double>(generated);
    std::printf("prefill_ms: %.3f\n", prefill_s * 1e3);
    std::printf("prefill_tokens_per_s: %.1f\n", prefill_s > 0 ? static_cast<double>(S) / prefill_s : 0.0);
    if (t > 1) {
      std::printf("decode_ms_per_token: %.3f\n", (run_s - prefill_s) * 1e3 / (t - 1));
      std::printf("decode_tokens_per_s: %.1f\n", (t - 1) / (run_s - prefill_s));
    }
  }
  std::printf("load_s: %.3f\n", load_s);
  std::printf("load_gb_per_s: %.3f\n", load_s > 0 ? static_cast<double>(model.model_bytes()) / 1e9 / load_s : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  ag::apps::flags app("actorgraph-generate",
                      "Runs a Hugging Face model folder (config.json, model.safetensors or shards, optional "
                      "vocab.json + merges.txt, tokenizer.model or tokenizer.json) on the runtime's devices: the prompt forward as "
                      "one job, the greedy next token, load and prefill figures.");
  app.add_option("--model", o.model, "the model folder")->required();
  app.add_option("--prompt-ids", o.prompt_ids,
                 "comma-separated token ids (repeat the flag for several sequences, generated together)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--prompt", o.prompt,
                 "text, encoded with the folder's tokenizer (repeat the flag for several sequences)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--decode-batch", o.decode_batch,
                 "several prompts: decode up to this many sequences in one job a step "
                 "(generator_options::decode_batch; default: the prompts' count; 0: a job a sequence)")
      ->check(CLI::Range(0, 256));
  app.add_option("--devices", o.devices, "device spec (sim:2, cpu:1, cuda:0, cuda:all, ...)");
  app.add_option("--cpu-threads", o.cpu_threads,
                 "threads each cpu device's kernels use (0: the machine's hardware threads, shared among the cpu devices)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--stages", o.stages, "pipeline stages (0: every device, or devices / tp)")->check(CLI::Range(0, 4096));
  app.add_option("--tp", o.tp, "tensor-parallel degree: devices per stage, each holding its heads' and columns' share")
      ->check(CLI::Range(1, 4096));
  app.add_option("--dtype", o.dtype, "f32, f16 or bf16 (default: the config's torch_dtype)")
      ->check(CLI::IsMember({"", "f32", "f16", "bf16"}));
  app.add_option("--dump-logits", o.dump_logits, "write the prompt's logits, float32 [tokens, vocab], as .npy");
  app.add_flag("--progress", o.progress, "print load progress even when stderr is not a terminal");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate (1: the prompt forward's next token)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", o.temperature, "0: greedy; > 0: sample")->check(CLI::Range(0.0f, 1e6f));
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)")->check(CLI::Range(0, 1 << 30));
  app.add_option("--top-p", o.top_p, "sample among the most likely tokens holding this mass")
      ->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--min-p", o.min_p, "drop tokens less likely than this times the most likely one (0: off)")
      ->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--repetition-penalty", o.repetition_penalty,
                 "> 1 makes tokens already in the sequence less likely (transformers' repetition_penalty; 1: off)")
      ->check(CLI::Range(1e-6f, 1e6f));
  app.add_option("--stop", o.stop_texts,
                 "end generation once the text holds this string (repeatable; needs the folder's tokenizer)");
  app.add_option("--seed", o.seed, "sampling seed");
  app.add_option("--eos-ids", o.eos_ids, "comma-separated ids that end generation (default: the config's)");
  app.add_option("--cache-tokens", o.cache_tokens, "KV cache positions (default: prompt + max-new-tokens)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  const bool single_decode = o.max_new_tokens > 1 || ag::apps::given(app, "--temperature") ||
                      ag::apps::given(app, "--top-k") || ag::apps::given(app, "--top-p") ||
                      ag::apps::given(app, "--min-p") || ag::apps::given(app, "--repetition-penalty") ||
                      ag::apps::given(app, "--stop");
  std::vector<int32_t> eos;
  if (!o.eos_ids.empty()) {
    std::string eos_why;
    if (!parse_ids(o.eos_ids, eos, eos_why)) {
      std::fprintf(stderr, "actorgraph-generate: --eos-ids%s\n", eos_why.substr(eos_why.find(':')).c_str());
      return ag::apps::bad_flags_status;
    }
  }
  const bool have_prompt = ag::apps::given(app, "--prompt");
  if (have_prompt == ag::apps::given(app, "--prompt-ids")) {
    std::fprintf(stderr, "actorgraph-generate: give exactly one of --prompt-ids and --prompt (either may repeat)\n");
    return ag::apps::bad_flags_status;
  }
  // One sequence a --prompt / --prompt-ids; several generate together.
  const std::size_t n_prompts = have_prompt ? o.prompt.size() : o.prompt_ids.size();
  const bool several = n_prompts > 1;
  if (several && !o.dump_logits.empty()) {
    std::fprintf(stderr, "actorgraph-generate: --dump-logits writes one prompt's logits, got %zu prompts\n", n_prompts);
    return ag::apps::bad_flags_status;
  }
  const bool decode = single_decode || several || ag::apps::given(app, "--decode-batch");
  std::string why;
  std::vector<std::vector<int32_t>> prompts(n_prompts);
  for (std::size_t i = 0; i < n_prompts && !have_prompt; ++i)
    if (!parse_ids(o.prompt_ids[i], prompts[i], why)) {
      std::fprintf(stderr, "actorgraph-generate: --prompt-ids%s%s\n", seq_tag(i, several).c_str(),
                   why.substr(why.find(':')).c_str());
      return ag::apps::bad_flags_status;
    }
  ag::models::load_options lo;
  if (ag::dtype t; !o.dtype.empty() && ag::parse_dtype(o.dtype.c_str(), t)) lo.dtype = t;

  // The runtime first: device start-up (a CUDA context) is not load time.
  ag::runtime_options ro;
  ro.backend.cpu_threads_per_stream = o.cpu_threads;
  auto rt = ag::runtime::create(o.devices, ro);
  if (!rt) return fail(rt.err());

  const auto t_open = std::chrono::steady_clock::now();
  auto model = ag::models::hf_model::open(o.model, lo);
  if (!model) return fail(model.err());
  const auto& cfg = model->config();
  const std::string window =
      cfg.model.sliding_window > 0 ? ", a sliding window of " + std::to_string(cfg.model.sliding_window) : "";
  std::printf("model: %s, %d layers, d_model %lld, %d heads (%d kv)%s, d_ff %lld, vocab %lld, %s, %lld weight bytes in %zu file(s)\n",
              cfg.model_type.c_str(), cfg.model.n_layers, static_cast<long long>(cfg.model.d_model),
              cfg.model.n_heads, cfg.model.kv_heads(), window.c_str(), static_cast<long long>(cfg.model.d_ff),
              static_cast<long long>(cfg.model.vocab), ag::to_string(model->dtype()),
              static_cast<long long>(model->model_bytes()), model->weights().files().size());

  auto tok = ag::models::load_tokenizer(o.model);
  if (!tok) {
    // Token ids work without a tokenizer: a broken one only costs the text.
    if (have_prompt) return fail(tok.err());
    std::fprintf(stderr, "warning: no generated_text: %s\n", tok.err().to_string().c_str());
    tok = ag::models::tokenizer_ptr{};
  }
  if (have_prompt) {
    if (!*tok)
      return fail({ag::errc::invalid_argument, o.model + " has no tokenizer (vocab.json + merges.txt, "
                                                           "tokenizer.model or tokenizer.json): pass --prompt-ids"});
    for (std::size_t i = 0; i < n_prompts; ++i) {
      auto enc = (*tok)->encode(o.prompt[i]);
      if (!enc) return fail(enc.err());
      prompts[i] = std::move(*enc);
      std::printf("prompt_ids%s: %s\n", seq_tag(i, several).c_str(), id_list(prompts[i]).c_str());
    }
  }
  for (std::size_t i = 0; i < n_prompts; ++i) {
    const std::string which = several ? "prompt " + std::to_string(i) : "the prompt";
    if (prompts[i].empty()) return fail({ag::errc::invalid_argument, which + " has no tokens"});
    for (int32_t id : prompts[i])
      if (id >= cfg.model.vocab)
        return fail({ag::errc::invalid_argument, (several ? which + "'s token " : "prompt token ") + std::to_string(id) +
                                                     " is outside the vocabulary of " + std::to_string(cfg.model.vocab)});
  }
  const std::vector<int32_t>& ids = prompts.front();
  const auto S = static_cast<int64_t>(ids.size());
  if (decode) {
    if (o.eos_ids.empty()) eos = cfg.eos_token_ids;
    const int rc = generate_tokens(**rt, *model, o, prompts, eos, *tok, t_open);
    if (rc != 0 || o.dump_logits.empty()) return rc;
  }

  auto g = model->build(S, 1);
  if (!g) return fail(g.err());
  std::shared_ptr<const ag::plan> plan;
  {
    progress_line progress(model->weights(), model->model_bytes(), o.progress || ::isatty(2));
    auto p = (*rt)->compile(std::move(*g), {.pipeline_stages = o.stages, .tensor_parallel = o.tp});
    progress.stop();
    if (!p) return fail(p.err());
    plan = std::move(*p);
  }
  const double load_s = seconds_since(t_open);

  std::vector<int32_t> pos(ids.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const auto t_run = std::chrono::steady_clock::now();
  ag::job j = (*rt)->submit(plan, {ag::host_tensor::from_ints({1, S}, ids), ag::host_tensor::from_ints({S}, pos)});
  const ag::job_result& r = j.wait();
  const double run_s = seconds_since(t_run);
  if (!r) return fail(r.err());
  const ag::host_tensor& logits = (*r)[0];  // [1, S, vocab] f32
  const int64_t V = logits.dims()[2];

  if (!o.dump_logits.empty()) {
    ag::host_tensor two_d;
    two_d.reset(ag::dtype::f32, {S, V}, ag::byte_buffer(logits.raw().begin(), logits.raw().end()));
    if (auto e = ag::models::save_npy(o.dump_logits, two_d)) return fail(e);
  }
  int32_t next = 0;
  float best = -INFINITY;
  for (int64_t v = 0; v < V; ++v) {
    const float x = logits.at((S - 1) * V + v);
    if (x > best) best = x, next = static_cast<int32_t>(v);
  }
  if (decode) return 0;  // --dump-logits alongside generation: the tokens are printed
  std::printf("generated: %d\n", next);
  if (*tok) {
    auto text = (*tok)->decode({next});
    if (text) std::printf("generated_text: %s\n", text->c_str());
  }
  const double gb = static_cast<double>(model->model_bytes()) / 1e9;
  print_layout(o.devices, *plan);
  std::printf("prefill_ms: %.3f\n", run_s * 1e3);
  std::printf("prefill_tokens_per_s: %.1f\n", static_cast<double>(S) / run_s);
  std::printf("load_s: %.3f\n", load_s);
  std::printf("load_gb_per_s: %.3f\n", load_s > 0 ? gb / load_s : 0.0);
  return 0;
}
