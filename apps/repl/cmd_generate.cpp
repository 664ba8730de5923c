// load and generate: a Hugging Face model folder as the current model, and
// text generation over a KV cache (ag::generator) with the tokens printed as
// they come.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "apps/repl/session_impl.hpp"

namespace ag::repl {

namespace {

// Tokens from the generator's on_token (a runtime thread) to the main thread.
struct token_queue {
  std::mutex m;
  std::deque<int32_t> q;
};

expected<std::vector<int32_t>> parse_ids(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  std::size_t i = 0;
  while (i <= text.size()) {
    const std::size_t comma = std::min(text.find(',', i), text.size());
    auto v = parse_int(text.substr(i, comma - i), "ids", 0, vocab - 1);
    if (!v) return v.err();
    ids.push_back(static_cast<int32_t>(*v));
    i = comma + 1;
  }
  return ids;
}

}  // namespace

outcome session::impl::cmd_load(const command_line& c) {
  if (c.positional.size() != 1) return fail(bad_arg(c.positional.empty() ? "which folder?" : "one folder expected"));
  params p(c);
  models::load_options lo;
  if (auto t = p.raw("dtype")) {
    dtype d;
    if (!parse_dtype(t->c_str(), d) || d == dtype::i32) return fail(bad_arg("dtype: '" + *t + "' is not one of f32, f16, bf16"));
    lo.dtype = d;
  }
  auto seq = p.get_int("seq", 1, 1 << 16);
  if (!seq) return fail(seq.err());
  if (auto e = p.finish(1)) return fail(e);
  auto m = models::hf_model::open(c.positional[0].text, lo);
  if (!m) return fail(m.err(), false);
  auto model = std::make_shared<const models::hf_model>(std::move(*m));
  const auto& cfg = model->config();
  int64_t S = seq->value_or(64);
  if (cfg.model.variant == models::model_variant::gpt2) S = std::min<int64_t>(S, cfg.max_positions);
  auto gr = model->build(S, 1);
  if (!gr) return fail(gr.err(), false);
  auto t = models::load_tokenizer(c.positional[0].text);
  std::string tok_note = "no tokenizer (token ids only)";
  tok.reset();
  if (!t) tok_note = "tokenizer unusable (" + t.err().message + "): token ids only";
  else if (*t) tok = *t, tok_note = "tokenizer: " + tok->kind();
  hf.reset();  // set_graph drops the generator, which may still refer to the old model
  set_graph(std::make_shared<const graph>(std::move(*gr)), c.positional[0].text);
  hf = model;
  tcfg = hf->model_config(S);
  out << fmt("loaded %s\n  %s, %d layers, d %lld, %d heads of %lld (%d kv), vocab %lld, %s, %s of weights; %s\n",
             c.positional[0].text.c_str(), cfg.model_type.c_str(), cfg.model.n_layers,
             static_cast<long long>(cfg.model.d_model), cfg.model.n_heads,
             static_cast<long long>(cfg.model.head_dim()), cfg.model.kv_heads(),
             static_cast<long long>(cfg.model.vocab), ag::to_string(hf->dtype()),
             bytes_text(static_cast<double>(hf->model_bytes())).c_str(), tok_note.c_str());
  return {};
}

outcome session::impl::cmd_generate(const command_line& c) {
  if (!tcfg) return fail(bad_arg("no model: 'load <folder>' or 'model llama' first"));
  params p(c);
  auto n = p.get_int("n", 1, 1 << 20);
  auto temperature = p.get_number("temperature", 0, 1e6);
  auto top_k = p.get_int("top_k", 0, 1 << 30);
  auto top_p = p.get_number("top_p", 0, 1);
  auto min_p = p.get_number("min_p", 0, 1);
  auto penalty = p.get_number("repetition_penalty", 1e-6, 1e6);
  auto sd = p.get_int("seed", 0, INT64_MAX);
  const auto stop_text = p.raw("stop");
  auto cache = p.get_int("cache", 1, 1 << 24);
  const auto ids_text = p.raw("ids");
  if (!n) return fail(n.err());
  if (!temperature) return fail(temperature.err());
  if (!top_k) return fail(top_k.err());
  if (!top_p) return fail(top_p.err());
  if (!min_p) return fail(min_p.err());
  if (!penalty) return fail(penalty.err());
  if (!sd) return fail(sd.err());
  if (!cache) return fail(cache.err());
  if (auto e = p.finish(1)) return fail(e);
  std::vector<int32_t> prompt;
  if (ids_text) {
    if (!c.positional.empty()) return fail(bad_arg("give text or ids=, not both"));
    auto ids = parse_ids(*ids_text, tcfg->vocab);
    if (!ids) return fail(ids.err());
    prompt = std::move(*ids);
  } else {
    if (c.positional.empty()) return fail(bad_arg("what prompt? \"text\" or ids=1,2,3"));
    if (!tok) return fail(bad_arg("the model has no tokenizer: give ids=1,2,3"));
    auto enc = tok->encode(c.positional[0].text);
    if (!enc) return fail(enc.err(), false);
    prompt = std::move(*enc);
    if (prompt.empty()) return fail(bad_arg("the prompt has no tokens"));
  }
  if (auto e = ensure_runtime()) return fail(e, false);
  if (const int busy = running())
    return fail(bad_arg(fmt("%d jobs running: 'wait' or 'cancel all' before generating", busy)), false);

  const int max_new = static_cast<int>(n->value_or(16));
  generator_options go;
  go.cache_tokens = cache->value_or(std::max<int64_t>(256, static_cast<int64_t>(prompt.size()) + max_new));
  if (tcfg->variant == models::model_variant::gpt2 && hf)
    go.cache_tokens = std::min<int64_t>(go.cache_tokens, hf->config().max_positions);
  go.max_sequences = 1;
  go.prefill_chunk = std::min<int64_t>(static_cast<int64_t>(prompt.size()), 64);
  // The layout 'set' chose, as 'run' plans it (get_plan): the cache is placed
  // like the layers, by stage and by kv head.
  go.plan.pipeline_stages = stages;
  go.plan.tensor_parallel = tp;
  go.plan.shard_ratios = ratios;
  go.plan.sequence_parallel = sp;
  go.plan.graph_replay = replay;
  const std::string key = fmt("%s|%s|%lld|%lld", model_desc.c_str(), settings_text().c_str(),
                              static_cast<long long>(go.cache_tokens), static_cast<long long>(go.prefill_chunk));
  if (!gen || gen_key != key) {
    gen.reset();
    models::transformer_config cfg = *tcfg;
    auto made = generator::create(*rt, cfg, hf ? hf->provider() : models::weight_provider{}, go);
    if (!made) return fail(made.err(), false);
    gen = std::move(*made);
    gen_key = key;
  }
  generate_options o;
  o.max_new_tokens = max_new;
  o.sampling = {.temperature = static_cast<float>(temperature->value_or(0.0)),
                .top_k = static_cast<int>(top_k->value_or(0)),
                .top_p = static_cast<float>(top_p->value_or(1.0)),
                .min_p = static_cast<float>(min_p->value_or(0.0)),
                .repetition_penalty = static_cast<float>(penalty->value_or(1.0)),
                .seed = static_cast<uint64_t>(sd->value_or(static_cast<int64_t>(seed)))};
  if (hf) o.stop_ids = hf->config().eos_token_ids;
  // stop="...", read on the runtime thread that streams the tokens.
  std::optional<models::stop_strings> stops;
  if (stop_text && !stop_text->empty()) {
    if (!tok) return fail(bad_arg("stop= needs the model's tokenizer to read the text (this model has none)"));
    stops.emplace(tok, prompt, std::vector<std::string>{*stop_text});
    o.stop_when = [&](int32_t t) { return stops->push(t); };
  }
  auto tq = std::make_shared<token_queue>();
  o.on_token = [tq](int32_t t, int64_t) {
    std::lock_guard lk(tq->m);
    tq->q.push_back(t);
  };
  interrupted.store(false);
  const auto t0 = std::chrono::steady_clock::now();
  const generation h = gen->generate(prompt, o);
  // Text streams through models::text_stream (a token's text depends on its
  // neighbours: SentencePiece's leading spaces, characters cut over tokens).
  std::optional<models::text_stream> text;
  if (tok) text.emplace(tok, prompt);
  auto print_new = [&] {
    std::deque<int32_t> got;
    {
      std::lock_guard lk(tq->m);
      got.swap(tq->q);
    }
    for (int32_t t : got) {
      auto piece = text ? text->push(t) : expected<std::string>(error{});
      out << (piece ? *piece : std::to_string(t) + " ");
    }
    if (!got.empty()) out.flush();
  };
  bool cancelled = false;
  while (!h.wait_for(std::chrono::milliseconds(20))) {
    print_new();
    if (interrupted.load() && !cancelled) {
      h.cancel();  // Ctrl-C: stop after the job in flight
      cancelled = true;
    }
  }
  print_new();
  if (text)
    if (auto rest = text->finish()) out << *rest;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& r = h.wait();
  out << "\n";
  if (!r) return fail(r.err(), false);
  // Pipelined: steps that read their token on the device, queued behind the
  // step before (generator_options::pipeline_depth; plans of one stage).
  // The layout as planned.
  const plan& dp = gen->decode_plan();
  out << fmt("%zu tokens (%s) in %.1f ms, %.1f tokens/s; %lld picked on the device, %lld of them pipelined; "
             "stages=%d tp=%d\n",
             r->tokens.size(), ag::to_string(r->reason), s * 1e3, static_cast<double>(r->tokens.size()) / s,
             static_cast<long long>(r->tokens_picked_on_device), static_cast<long long>(r->tokens_pipelined),
             dp.stage_count(), dp.tensor_degree());
  return {};
}

}  // namespace ag::repl
