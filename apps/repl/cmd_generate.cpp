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

// One prompt's ids: "1,2,3".
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

// The text of `tokens` after `prompt` (models::text_stream), or the ids
// with a space between them.
std::string tokens_text(const models::tokenizer_ptr& tok, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& tokens) {
  std::string s;
  std::optional<models::text_stream> text;
  if (tok) text.emplace(tok, prompt);
  for (int32_t t : tokens) {
    auto piece = text ? text->push(t) : expected<std::string>(error{});
    s += piece ? *piece : std::to_string(t) + " ";
  }
  if (text) {
    if (auto rest = text->finish()) s += *rest;
  } else if (!s.empty()) {
    s.pop_back();  // the last id's space
  }
  return s;
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
  auto batch = p.get_int("batch", 0, 256);
  const auto ids_text = p.raw("ids");
  if (!n) return fail(n.err());
  if (!temperature) return fail(temperature.err());
  if (!top_k) return fail(top_k.err());
  if (!top_p) return fail(top_p.err());
  if (!min_p) return fail(min_p.err());
  if (!penalty) return fail(penalty.err());
  if (!sd) return fail(sd.err());
  if (!cache) return fail(cache.err());
  if (!batch) return fail(batch.err());
  if (auto e = p.finish()) return fail(e);
  // The prompts: each quoted text, or ids=1,2,3;4,5 (';' between prompts).
  std::vector<std::vector<int32_t>> prompts;
  if (ids_text) {
    if (!c.positional.empty()) return fail(bad_arg("give text or ids=, not both"));
    for (std::size_t i = 0; i <= ids_text->size();) {
      const std::size_t semi = std::min(ids_text->find(';', i), ids_text->size());
      auto ids = parse_ids(ids_text->substr(i, semi - i), tcfg->vocab);
      if (!ids) return fail(prompts.empty() && semi == ids_text->size()
                                ? ids.err()
                                : bad_arg(fmt("prompt %zu of ids=: %s", prompts.size(), ids.err().message.c_str())));
      prompts.push_back(std::move(*ids));
      i = semi + 1;
    }
  } else {
    if (c.positional.empty()) return fail(bad_arg("what prompt? \"text\" or ids=1,2,3"));
    if (!tok) return fail(bad_arg("the model has no tokenizer: give ids=1,2,3"));
    for (const word& w : c.positional) {
      auto enc = tok->encode(w.text);
      if (!enc) return fail(enc.err(), false);
      if (enc->empty())
        return fail(bad_arg(c.positional.size() == 1 ? std::string("the prompt has no tokens")
                                                     : fmt("col %zu: the prompt has no tokens", w.pos + 1)));
      prompts.push_back(std::move(*enc));
    }
  }
  if (prompts.size() > 256) return fail(bad_arg(fmt("%zu prompts: at most 256 at once", prompts.size())));
  if (auto e = ensure_runtime()) return fail(e, false);
  if (const int busy = running())
    return fail(bad_arg(fmt("%d jobs running: 'wait' or 'cancel all' before generating", busy)), false);

  const int max_new = static_cast<int>(n->value_or(16));
  std::size_t longest = 0;
  for (const auto& pr : prompts) longest = std::max(longest, pr.size());
  generator_options go;
  go.cache_tokens = cache->value_or(std::max<int64_t>(256, static_cast<int64_t>(longest) + max_new));
  if (tcfg->variant == models::model_variant::gpt2 && hf)
    go.cache_tokens = std::min<int64_t>(go.cache_tokens, hf->config().max_positions);
  // A cache slot a prompt; several prompts decode together, a token of each
  // a job (decode_batch), unless batch= says otherwise.
  go.max_sequences = static_cast<int>(prompts.size());
  go.decode_batch = static_cast<int>(batch->value_or(prompts.size() > 1 ? static_cast<int64_t>(prompts.size()) : 0));
  go.prefill_chunk = std::min<int64_t>(static_cast<int64_t>(longest), 64);
  // The layout 'set' chose, as 'run' plans it (get_plan): the cache is placed
  // like the layers, by stage and by kv head.
  go.plan.pipeline_stages = stages;
  go.plan.tensor_parallel = tp;
  go.plan.shard_ratios = ratios;
  go.plan.sequence_parallel = sp;
  go.plan.graph_replay = replay;
  const std::string key = fmt("%s|%s|%lld|%lld|%d|%d", model_desc.c_str(), settings_text().c_str(),
                              static_cast<long long>(go.cache_tokens), static_cast<long long>(go.prefill_chunk),
                              go.max_sequences, go.decode_batch);
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
  if (stop_text && !stop_text->empty() && !tok)
    return fail(bad_arg("stop= needs the model's tokenizer to read the text (this model has none)"));
  if (prompts.size() > 1) return generate_several(prompts, o, stop_text.value_or(""));
  const std::vector<int32_t>& prompt = prompts.front();
  // stop="...", read on the runtime thread that streams the tokens.
  std::optional<models::stop_strings> stops;
  if (stop_text && !stop_text->empty()) {
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

// Several prompts at once: each a sequence of the generator (a cache slot
// or lane each, decode_batch as set), all started before any is waited
// for; each one's text printed when all have ended, then the run's figures.
// Ctrl-C cancels them all.
outcome session::impl::generate_several(const std::vector<std::vector<int32_t>>& prompts,
                                        const generate_options& base, const std::string& stop_text) {
  const std::size_t count = prompts.size();
  // stop="...": one reader a sequence, each read on the thread that streams
  // that sequence's tokens.
  std::vector<std::optional<models::stop_strings>> stops(count);
  std::vector<generation> hs;
  interrupted.store(false);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < count; ++i) {
    generate_options o = base;
    if (!stop_text.empty()) {
      stops[i].emplace(tok, prompts[i], std::vector<std::string>{stop_text});
      o.stop_when = [&stop = stops[i]](int32_t t) { return stop->push(t); };
    }
    hs.push_back(gen->generate(prompts[i], o));
  }
  bool cancelled = false;
  for (const generation& h : hs)
    while (!h.wait_for(std::chrono::milliseconds(20)))
      if (interrupted.load() && !cancelled) {
        for (const generation& each : hs) each.cancel();  // Ctrl-C: each stops after the job in flight
        cancelled = true;
      }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t tokens = 0, batched = 0, on_device = 0, pipelined = 0;
  std::optional<error> first_error;
  for (std::size_t i = 0; i < count; ++i) {
    const auto& r = hs[i].wait();
    if (!r) {
      out << fmt("[%zu] failed: %s\n", i, r.err().to_string().c_str());
      if (!first_error) first_error = r.err();
      continue;
    }
    out << fmt("[%zu] %s (%zu tokens, %s)\n", i, tokens_text(tok, prompts[i], r->tokens).c_str(), r->tokens.size(),
               ag::to_string(r->reason));
    tokens += static_cast<int64_t>(r->tokens.size());
    batched += r->tokens_batched;
    on_device += r->tokens_picked_on_device;
    pipelined += r->tokens_pipelined;
  }
  if (first_error) return fail(*first_error, false);
  // Shared steps: tokens decoded beside other sequences' (decode_batch).
  const plan& dp = gen->decode_plan();
  out << fmt("%zu sequences: %lld tokens in %.1f ms, %.1f tokens/s; %lld in shared steps (batch=%d), %lld picked on "
             "the device, %lld of them pipelined; stages=%d tp=%d\n",
             count, static_cast<long long>(tokens), s * 1e3, static_cast<double>(tokens) / s,
             static_cast<long long>(batched), gen->lanes_per_slot() > 1 ? gen->lanes_per_slot() : 0,
             static_cast<long long>(on_device), static_cast<long long>(pipelined), dp.stage_count(), dp.tensor_degree());
  return {};
}

}  // namespace ag::repl
