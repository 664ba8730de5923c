#include "actors/generator.hpp"

#include "actors/launch_program.hpp"
#include "graph/fusion.hpp"
#include "graph/state_pool.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

namespace ag {

const char* to_string(stop_reason r) noexcept {
  switch (r) {
    case stop_reason::eos: return "eos";
    case stop_reason::max_tokens: return "max_tokens";
    case stop_reason::cache_full: return "cache_full";
    case stop_reason::cancelled: return "cancelled";
    case stop_reason::stop_condition: return "stop_condition";
  }
  return "?";
}

// ---- the handle --------------------------------------------------------------

struct generation::state {
  mutable std::mutex m;
  std::condition_variable cv;
  bool done = false;
  generation_outcome result{generation_result{}};
  std::vector<int32_t> tokens;
  std::vector<std::function<void(const generation_outcome&)>> continuations;
  std::atomic<bool> cancel_requested{false};
  // Set by the generator before generate() returns, then only read: takes a
  // sequence still waiting for a cache slot out of the queue at once.
  std::function<void()> on_cancel;

  void finish(generation_outcome r) {
    std::vector<std::function<void(const generation_outcome&)>> conts;
    {
      std::lock_guard lk(m);
      if (done) return;
      result = std::move(r);
      done = true;
      conts.swap(continuations);
    }
    cv.notify_all();
    for (auto& f : conts) f(result);  // result is immutable once done
  }
};

bool generation::ready() const {
  if (!s_) return true;
  std::lock_guard lk(s_->m);
  return s_->done;
}

generation_outcome generation::wait() && {
  return static_cast<const generation&>(*this).wait();
}

const generation_outcome& generation::wait() const& {
  static const generation_outcome empty{error{errc::invalid_argument, "generation: empty handle"}};
  if (!s_) return empty;
  std::unique_lock lk(s_->m);
  s_->cv.wait(lk, [&] { return s_->done; });
  return s_->result;
}

bool generation::wait_for(std::chrono::nanoseconds d) const {
  if (!s_) return true;
  std::unique_lock lk(s_->m);
  return s_->cv.wait_for(lk, d, [&] { return s_->done; });
}

void generation::then(std::function<void(const generation_outcome&)> fn) const {
  if (!s_) return;
  {
    std::lock_guard lk(s_->m);
    if (!s_->done) {
      s_->continuations.push_back(std::move(fn));
      return;
    }
  }
  fn(s_->result);
}

void generation::cancel() const {
  if (!s_) return;
  s_->cancel_requested.store(true);
  if (s_->on_cancel) s_->on_cancel();
}

std::vector<int32_t> generation::tokens() const {
  if (!s_) return {};
  std::lock_guard lk(s_->m);
  return s_->tokens;
}

// ---- sampling ----------------------------------------------------------------

namespace {

uint64_t next_random(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

namespace {

/// The index of the first maximum of `v` (NaNs never win; 0 when all are
/// NaN). Eight running maxima the compiler keeps in one vector register,
/// then a scan for the first element equal to the maximum: 8.5 us for
/// 32000 logits on the 2-core dev machine, where std::max_element's
/// dependent compare chain took 95 us, and a decode step waits for it.
int32_t first_argmax(std::span<const float> v) {
  constexpr int lanes = 8;
  float m[lanes];
  for (float& x : m) x = -std::numeric_limits<float>::infinity();
  const std::size_t n = v.size();
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int k = 0; k < lanes; ++k) m[k] = v[i + k] > m[k] ? v[i + k] : m[k];
  float best = m[0];
  for (int k = 1; k < lanes; ++k) best = m[k] > best ? m[k] : best;
  for (; i < n; ++i) best = v[i] > best ? v[i] : best;
  for (std::size_t j = 0; j < n; ++j)
    if (v[j] == best) return static_cast<int32_t>(j);
  return 0;
}

}  // namespace

int32_t sample_token(std::span<const float> logits, const sampling_options& s, uint64_t& rng_state,
                     std::span<const int32_t> history) {
  if (logits.empty()) return 0;
  std::vector<float> penalised;
  if (s.repetition_penalty != 1.0f && !history.empty()) {
    // From the original logit each time: a token seen twice is penalised once.
    penalised.assign(logits.begin(), logits.end());
    const float pen = s.repetition_penalty;
    for (int32_t id : history)
      if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) {
        const float x = logits[static_cast<std::size_t>(id)];
        penalised[static_cast<std::size_t>(id)] = x > 0.0f ? x / pen : x * pen;
      }
    logits = penalised;
  }
  if (!(s.temperature > 0.0f)) return first_argmax(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ties by id so that the draw is deterministic.
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
           (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
  };
  std::size_t keep = order.size();
  if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < keep) keep = static_cast<std::size_t>(s.top_k);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), more_likely);
  order.resize(keep);
  const double top = logits[static_cast<std::size_t>(order[0])];
  std::vector<double> p(keep);
  double sum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[static_cast<std::size_t>(order[i])] - top) / static_cast<double>(s.temperature));
    sum += p[i];
  }
  if (s.top_p < 1.0f && s.top_p > 0.0f) {
    double mass = 0.0;
    std::size_t n = 0;
    while (n < keep) {
      mass += p[n] / sum;
      ++n;
      if (mass >= static_cast<double>(s.top_p)) break;
    }
    keep = n;
    sum = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  if (s.min_p > 0.0f) {  // p[0] is the most likely kept token's (1 before normalising)
    std::size_t n = 1;
    while (n < keep && p[n] >= static_cast<double>(s.min_p) * p[0]) ++n;
    keep = n;
    sum = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  const double u = static_cast<double>(next_random(rng_state) >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

// ---- the generator -----------------------------------------------------------

namespace {

struct step_plan {
  std::shared_ptr<const plan> p;
  int64_t new_tokens = 1;  // T
  bool token_input = true;  // false: the step reads its token from state (token_state_in)
  // Where its attention mask ([T, C], the last input) is built: memory the
  // device copies from directly (runtime::input_memory). A prefill chunk's
  // is 32 MiB at 1024 x 16,384: in fresh heap its page faults cost 16 ms of
  // the host's 17.5 (session 68), and a GPU copied it through staging.
  host_memory_resource* mask_memory = nullptr;
  // Its mask is built on the device from key_positions and query_ranges
  // (the last two inputs; transformer_config::mask_from_positions).
  bool mask_from_positions = false;
  // A one-token plan over a cache of more than decode_step_max_cache_rows
  // rows keeps a decode step's records (the one-kernel step's attention
  // grows too fast with the rows its mask shows); its twin runs the step
  // as one kernel (plan_options::decode_step_max_cache_rows raised) and
  // takes the steps of a sequence that holds at most that many positions
  // (step_for). Null where the plan fuses already or the twin would not.
  std::shared_ptr<const step_plan> short_twin;
};

// The plan of a one-token step at `position`: `sp`'s twin while the
// sequence, this token included, holds at most decode_step_max_cache_rows
// positions (the mask shows no more rows than that: its rows are the
// positions until a sliding window's ring wraps, which takes more than that
// many positions), else `sp`.
const step_plan& step_for(const step_plan& sp, int64_t position) {
  return sp.short_twin && position + 1 <= decode_step_max_cache_rows ? *sp.short_twin : sp;
}

// The states a pipelined greedy step reads its token from and keeps its own
// in (transformer_config::token_state_in / out). The last prompt token's
// step keeps the first new token in the first; then the two chain plans
// alternate.
constexpr const char* token_state_names[2] = {"token_state_a", "token_state_b"};

// A job's attention mask (models::cache_attention_mask) in `memory`, a
// large one in parts of at least 4 MiB on a few threads: one thread writes
// about 9 GB/s, and a prompt chunk of 1024 over a cache of 65,536 rows is
// 128 MiB (14 ms of an H200 host's time to first token, session 68).
host_tensor attention_mask(dtype t, int64_t T, int64_t C, int64_t cached, int64_t n, int64_t window,
                           host_memory_resource* memory) {
  host_tensor mask = host_tensor::uninitialized(t, {T, C}, memory);
  constexpr std::size_t part_min = std::size_t{4} << 20;
  // Asked once: every decode token's mask passes here, and on glibc
  // hardware_concurrency reads /sys.
  static const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const auto parts = static_cast<int64_t>(
      std::min<std::size_t>({mask.bytes() / part_min, static_cast<std::size_t>(std::max<int64_t>(T, 1)), 8, hw}));
  if (parts < 2) {
    models::fill_cache_attention_mask_rows(mask, cached, n, window, 0, T);
    return mask;
  }
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<std::size_t>(parts - 1));
  for (int64_t k = 1; k < parts; ++k)
    helpers.emplace_back([&mask, cached, n, window, i0 = T * k / parts, i1 = T * (k + 1) / parts] {
      models::fill_cache_attention_mask_rows(mask, cached, n, window, i0, i1);
    });
  models::fill_cache_attention_mask_rows(mask, cached, n, window, 0, T / parts);
  for (std::thread& h : helpers) h.join();
  return mask;
}

struct sequence;
struct lane_group;

// True on a thread inside generator::generate(). Work started there submits
// but never takes a step's result: tokens stream, and sequences end, on
// runtime threads (the header's promise), so an on_token that waits for the
// handle generate() is about to return cannot wait for itself.
thread_local bool inside_generate = false;

}  // namespace

struct generator::impl : std::enable_shared_from_this<generator::impl> {
  runtime* rt = nullptr;
  models::transformer_config cfg;
  generator_options opt;
  step_plan decode, prefill;  // prefill.p null: the prompt goes through decode
  // Plans of prompt pieces shorter than a prefill chunk, ascending
  // (generator_options::short_prompt_chunk, doubling_prompt_plans); empty
  // unless prefill_chunk > short_prompt_chunk > 1.
  std::vector<step_plan> prompt_pieces;
  step_plan decode_greedy;    // null without generator_options::device_greedy: outputs the token
                              // (pipelined: also keeps it in token_state_a)
  // Pipelined greedy decoding (generator_options::pipeline_depth > 1, one
  // stream): chain[0] reads token_state_a and keeps its token in
  // token_state_b, chain[1] the other way round. Null otherwise.
  step_plan chain[2];
  // Batched decode steps (generator_options::decode_batch): plans of 2, 4,
  // ... `lanes` rows, each row a sequence, all its rows' logits out. Empty
  // without batching.
  std::vector<step_plan> batch_steps;
  // Their twins whose output is each row's greedy token, picked on the
  // device (generator_options::device_greedy; empty without it): a step
  // whose every sampling row is greedy_on_device() copies 4 bytes a row to
  // the host, not a row of f32 logits, and the host scans nothing.
  std::vector<step_plan> batch_greedy_steps;
  // Pipelined batched greedy steps (decode_batch with pipeline_depth > 1 and
  // device_greedy; empty otherwise): batch_chains[i] are batch_greedy_steps[i]'s
  // size reading each row's token from a token state, [0] from token_state_a
  // keeping theirs in token_state_b, [1] the other way round; the greedy
  // steps then keep their tokens in token_state_a. A state of `lanes` rows.
  std::vector<std::array<step_plan, 2>> batch_chains;
  // With them, a sequence alone in its slot runs the same way on one-token
  // plans: decode_greedy keeps its token in row 0 of token_state_a, and
  // these two read it from row 0 of one state and keep theirs in the other.
  std::array<step_plan, 2> lone_chain;
  int lanes = 1;            // sequences a state slot holds (decode_batch, or 1)
  int64_t lane_rows = 0;    // cache rows a sequence holds (cache_rows()); a slot's are lanes x lane_rows
  // One per state slot under batching: the slot's sequences and its job.
  std::vector<std::shared_ptr<lane_group>> groups;
  int64_t cache_bytes = 0;   // device memory of every slot's cache, all devices
  int64_t weight_bytes = 0;  // device memory of the plans' weights, all devices (shared uploads once)

  mutable std::mutex m;
  // Which sequence (by ticket) holds which state slot, and who waits, FIFO
  // (graph/state_pool.hpp); the waiting sequences by ticket. Guarded by m.
  state_slots slot_table{0};
  uint64_t next_ticket = 1;
  std::unordered_map<uint64_t, std::shared_ptr<sequence>> waiting;

  // The plan of a prompt piece with `left` tokens to go: the smallest prompt
  // plan that holds them, else the prefill plan (chunks of its size; null
  // without one).
  const step_plan* prompt_plan_for(std::size_t left) const {
    const step_plan* piece = prefill.p ? &prefill : nullptr;
    for (auto it = prompt_pieces.rbegin(); it != prompt_pieces.rend(); ++it)
      if (left <= static_cast<std::size_t>(it->new_tokens)) piece = &*it;
    return piece;
  }

  void start_or_queue(const std::shared_ptr<sequence>& s);
  void release_slot(uint64_t ticket);
  // A cancelled sequence still waiting for a slot leaves the queue and ends.
  void cancel_waiting(uint64_t ticket);
};

namespace {

struct sequence : std::enable_shared_from_this<sequence> {
  std::shared_ptr<generator::impl> gen;
  std::shared_ptr<generation::state> st;
  std::vector<int32_t> prompt;
  generate_options opt;
  uint64_t rng = 0;
  uint64_t ticket = 0;  // its name in gen->slot_table
  int slot = -1;
  int64_t cached = 0;         // positions in the cache
  std::size_t prompt_fed = 0; // prompt tokens submitted
  int32_t next_token = 0;     // the token the next decode job feeds
  std::vector<float> row_scratch;  // a row of logits that are not f32, as f32
  std::vector<int32_t> history;  // prompt and generated tokens, for a repetition penalty
  generation_result out;

  // Pipelined greedy decoding (generator_options::pipeline_depth): from the
  // last prompt token (or the first token, sampled from a prefill chunk's
  // logits) on, steps are submitted ahead; step k feeds first_token (k 0) or
  // the token step k - 1 kept on the device, at cache position
  // first_position + k, and gives output token base_tokens + k. Its result
  // may come back on any thread: results wait in `arrived` until their turn,
  // and one thread at a time (`draining`) takes them in order and submits more.
  bool pipelined = false;
  int64_t first_position = 0;
  int32_t first_token = 0;
  int64_t base_tokens = 0;
  std::mutex pm;  // guards the fields below
  int64_t steps_submitted = 0;
  int64_t steps_taken = 0;
  int in_flight = 0;
  bool draining = false;
  bool ended = false;
  std::map<int64_t, job_result> arrived;

  // Inputs of a job over `toks` at positions cached.. (padded to
  // plan.new_tokens, the padding first: the last real token is always the
  // job's last row, the one a prefill plan's head takes alone,
  // transformer_config::last_row_logits). The keys and values of real token
  // j go to cache row cached + j; padding stores nothing (cache position -1)
  // and reads a valid position. Real query j sees cache rows 0 .. cached + j
  // (padding: 0 .. cached), all written by then: by earlier jobs of the
  // slot or this one.
  std::vector<host_tensor> inputs(const step_plan& sp, const std::vector<int32_t>& toks) const {
    return inputs_at(sp, toks, cached, static_cast<int64_t>(toks.size()));
  }
  // The same at cache position `cached` for `n` tokens (toks may be empty
  // for a step that reads its token from state: it then has no tokens input).
  std::vector<host_tensor> inputs_at(const step_plan& sp, const std::vector<int32_t>& toks, int64_t cached,
                                     int64_t n) const {
    const models::transformer_config& c = gen->cfg;
    // Position p's keys and values live in cache row p % C: row p itself
    // when the cache holds every position (C = cache_tokens), a ring
    // under a sliding window (generator::cache_rows()).
    const int64_t T = sp.new_tokens, C = c.kv_cache_capacity;
    std::vector<int32_t> tk(static_cast<std::size_t>(T), 0), pos(static_cast<std::size_t>(T)),
        store(static_cast<std::size_t>(T));
    const int64_t padding = T - n;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t j = i - padding;  // the real token's index (< 0: padding)
      if (j >= 0 && j < static_cast<int64_t>(toks.size())) tk[static_cast<std::size_t>(i)] = toks[static_cast<std::size_t>(j)];
      pos[static_cast<std::size_t>(i)] = static_cast<int32_t>(j >= 0 ? cached + j : cached);
      store[static_cast<std::size_t>(i)] = static_cast<int32_t>(j >= 0 ? (cached + j) % C : -1);
    }
    // Each query sees the rows holding its positions (cache_attention_mask:
    // rows an earlier sequence of the slot left past this one's are hidden).
    // A ring of at least window + new_tokens - 1 rows still holds every
    // position a query of the job sees (generator::create sizes it so).
    std::vector<host_tensor> in;
    in.reserve(5);
    if (sp.token_input) in.push_back(host_tensor::from_ints({1, T}, tk));
    in.push_back(host_tensor::from_ints({T}, pos));
    in.push_back(host_tensor::from_ints({T}, store));
    if (sp.mask_from_positions) {
      models::cache_mask_positions m = models::cache_mask_inputs(T, C, cached, n, c.sliding_window);
      in.push_back(std::move(m.key_positions));
      in.push_back(std::move(m.query_ranges));
    } else {
      in.push_back(attention_mask(c.dtype, T, C, cached, n, c.sliding_window, sp.mask_memory));
    }
    return in;
  }

  // Whether its one-token steps may take the plan that picks the token on
  // the device (generator_options::device_greedy): greedy, no repetition
  // penalty (the device's argmax has no history), no logits kept.
  bool greedy_on_device() const {
    return gen->decode_greedy.p && !(opt.sampling.temperature > 0.0f) && !opt.keep_logits &&
           opt.sampling.repetition_penalty == 1.0f;
  }

  // Its first job, once it holds a slot (under decode_batch: a lane of a
  // slot, whose group runs its jobs).
  void start();

  void submit_next() {
    if (st->cancel_requested.load()) return finish(stop_reason::cancelled);
    const bool prompting = prompt_fed < prompt.size();
    const std::size_t left = prompt.size() - prompt_fed;
    // A greedy sequence's decode steps take the plan that picks the token on
    // the device (generator_options::device_greedy); the last prompt token's
    // job too, as its output is the first new token.
    const bool on_device = greedy_on_device() && (!prompting || left == 1);
    if (on_device && gen->chain[0].p) {
      // The last prompt token, or a first token sampled from a prefill
      // chunk's logits: from here on, steps go ahead of the tokens.
      pipelined = true;
      first_position = cached;
      first_token = prompting ? prompt.back() : next_token;
      base_tokens = static_cast<int64_t>(out.tokens.size());
      prompt_fed = prompt.size();
      if (!inside_generate) return drain();
      // Only the first step from inside generate(): its end, on a runtime
      // thread, takes its token and queues the steps behind it (the one
      // host round trip of the sequence's pipelined steps).
      {
        std::lock_guard lk(pm);
        steps_submitted = 1;
        in_flight = 1;
      }
      return submit_step(0);
    }
    // A prompt's piece of more than one token: the smallest prompt plan
    // that holds it, else the prefill plan (chunks of its size).
    const step_plan* piece = gen->prompt_plan_for(left);
    const step_plan& sp = on_device                              ? step_for(gen->decode_greedy, cached)
                          : prompting && piece && left > 1 ? *piece
                                                           : step_for(gen->decode, cached);
    std::vector<int32_t> toks;
    if (prompting) {
      const std::size_t n = std::min(left, static_cast<std::size_t>(sp.new_tokens));
      toks.assign(prompt.begin() + static_cast<std::ptrdiff_t>(prompt_fed),
                  prompt.begin() + static_cast<std::ptrdiff_t>(prompt_fed + n));
      prompt_fed += n;
    } else {
      toks.push_back(next_token);
    }
    const int64_t n = static_cast<int64_t>(toks.size());
    submit_options so;
    so.state_slot = slot;  // the sequence's KV cache on the devices
    // Chained at submission, so it runs on the runtime thread that ends the job.
    so.on_done = [self = shared_from_this(), n, on_device](const job_result& r) { self->on_step(r, n, on_device); };
    gen->rt->submit(sp.p, inputs(sp, toks), so);
  }

  void on_step(const job_result& r, int64_t n, bool token_out) {
    if (!r) return fail(r.err());
    const std::vector<host_tensor>& outs = *r;
    cached += n;  // the job stored its rows in the slot's cache
    if (prompt_fed < prompt.size()) return submit_next();
    if (token_out) {
      // next_token, i32 [1, T, 1]: the last row's (the last real token's).
      int32_t tok = 0;
      std::memcpy(&tok, outs[0].data() + outs[0].bytes() - sizeof tok, sizeof tok);
      ++out.tokens_picked_on_device;
      return take(tok);
    }
    // Sample from the last row of logits [1, T, V] (the last real token's;
    // a prefill plan's are [1, 1, V]): in place when they are f32 (the
    // model's logits are), else converted into a buffer kept across tokens.
    // A decode step's host work between two jobs is on the device's
    // critical path.
    take(sample_row(outs[0], outs[0].numel() / gen->cfg.vocab - 1));
  }

  // The token this sequence's options pick from row `r` of logits [.., V].
  int32_t sample_row(const host_tensor& lg, int64_t r) {
    const int64_t V = gen->cfg.vocab;
    std::span<const float> row;
    if (lg.type() == dtype::f32) {
      row = std::span<const float>(reinterpret_cast<const float*>(lg.data()) + r * V, static_cast<std::size_t>(V));
    } else {
      row_scratch.resize(static_cast<std::size_t>(V));
      for (int64_t i = 0; i < V; ++i) row_scratch[static_cast<std::size_t>(i)] = lg.at(r * V + i);
      row = row_scratch;
    }
    if (opt.sampling.repetition_penalty != 1.0f) {
      history.assign(prompt.begin(), prompt.end());
      history.insert(history.end(), out.tokens.begin(), out.tokens.end());
    }
    const int32_t tok = sample_token(row, opt.sampling, rng, history);
    if (opt.keep_logits) out.logits.emplace_back(row.begin(), row.end());
    return tok;
  }

  // A new token: streamed, then the sequence stops or goes on.
  void take(int32_t tok) {
    if (!stream(tok)) return;
    next_token = tok;
    submit_next();
  }
  // Streams `tok`; false when the sequence stopped with it.
  bool stream(int32_t tok) {
    out.tokens.push_back(tok);
    {
      std::lock_guard lk(st->m);
      st->tokens.push_back(tok);
    }
    if (opt.on_token) opt.on_token(tok, static_cast<int64_t>(out.tokens.size()) - 1);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), tok) != opt.stop_ids.end()) {
      finish(stop_reason::eos);
      return false;
    }
    if (opt.stop_when && opt.stop_when(tok)) {
      finish(stop_reason::stop_condition);
      return false;
    }
    if (static_cast<int>(out.tokens.size()) >= opt.max_new_tokens) {
      finish(stop_reason::max_tokens);
      return false;
    }
    if (cached >= gen->opt.cache_tokens) {
      finish(stop_reason::cache_full);
      return false;
    }
    return true;
  }

  // ---- pipelined greedy decoding ----

  // Whether step `k` (output token k) is wanted: within max_new_tokens and
  // the cache.
  bool step_wanted(int64_t k) const {
    return base_tokens + k < opt.max_new_tokens && first_position + k < gen->opt.cache_tokens;
  }

  // Submits step k: k 0 feeds first_token from the host (and keeps its own
  // in token_state_a), later ones are chain[(k - 1) % 2], reading the token
  // the step before kept on the device.
  void submit_step(int64_t k) {
    const step_plan& sp = step_for(k == 0 ? gen->decode_greedy : gen->chain[(k - 1) % 2], first_position + k);
    std::vector<int32_t> toks;
    if (k == 0) toks.push_back(first_token);
    submit_options so;
    so.state_slot = slot;
    so.on_done = [self = shared_from_this(), k](const job_result& r) { self->arrive(k, r); };
    gen->rt->submit(sp.p, inputs_at(sp, toks, first_position + k, 1), so);
  }

  void arrive(int64_t k, const job_result& r) {
    {
      std::lock_guard lk(pm);
      arrived.emplace(k, r);
      --in_flight;
    }
    drain();  // or the thread draining now takes it
  }

  void drain() {
    {
      std::lock_guard lk(pm);
      if (draining) return;
      draining = true;
    }
    drain_held();
  }

  // One thread at a time (draining set): takes the results in token order
  // and keeps pipeline_depth steps in flight. Submits and streams without
  // the lock (a failed submit runs its continuation at once, on this thread).
  void drain_held() {
    for (;;) {
      int64_t k = -1;
      std::optional<job_result> r;
      bool submit = false;
      {
        std::lock_guard lk(pm);
        auto it = ended ? arrived.end() : arrived.find(steps_taken);
        if (it != arrived.end()) {
          k = steps_taken++;
          r = std::move(it->second);
          arrived.erase(it);
        } else if (!ended && !st->cancel_requested.load() && in_flight < gen->opt.pipeline_depth &&
                   step_wanted(steps_submitted)) {
          k = steps_submitted++;
          ++in_flight;
          submit = true;
        } else if (!ended && in_flight == 0 && st->cancel_requested.load()) {
          k = -2;  // cancelled with nothing in flight: end below
        } else {
          draining = false;
          return;
        }
      }
      if (k == -2) {
        finish(stop_reason::cancelled);
        continue;
      }
      if (submit) {
        submit_step(k);
        continue;
      }
      if (!*r) {
        fail(r->err());
        continue;
      }
      int32_t tok = 0;
      std::memcpy(&tok, (**r)[0].data(), sizeof tok);
      cached = first_position + k + 1;  // the step stored its keys and values
      ++out.tokens_picked_on_device;
      if (k > 0) ++out.tokens_pipelined;
      if (!stream(tok)) continue;
      if (st->cancel_requested.load()) finish(stop_reason::cancelled);
    }
  }

  void finish(stop_reason why) {
    out.reason = why;
    end(std::move(out));
  }
  void fail(const error& e) { end(e); }
  void end(generation_outcome r) {
    {
      // Steps still in flight (pipelined) run on; their results are dropped.
      std::lock_guard lk(pm);
      ended = true;
    }
    auto g = gen;
    const int s = slot;
    slot = -1;
    // The slot first: once a handle is ready, its sequence no longer counts
    // as active (the next waiting sequence may start on this thread).
    if (s >= 0) {
      leave_lane(s);
      g->release_slot(ticket);
    }
    st->finish(std::move(r));
  }
  void leave_lane(int lane);  // under decode_batch: its group forgets it
};

// ---- batched decode steps (generator_options::decode_batch) ----
//
// A state slot holds `lanes` sequences' caches side by side: lane l's
// position p lives in row l * lane_rows + p % lane_rows of the slot's
// cache, and the masks are built on the device from key positions that
// keep the lanes apart (lane l's position p is key l * cache_tokens + p, a
// query of lane l sees keys of its lane only). A group runs its slot's
// jobs one at a time: a prompt piece of one sequence, or a decode step of
// every sequence that feeds one token (its next token, or the next of a
// prompt that goes one token a job), each a row of the step. Prompt pieces
// and decode steps take turns while both wait (a run of pipelined steps
// yields to a waiting prompt after the steps it has in flight).

// One sequence's rows of a lane job: `tokens` (n real ones) at positions
// cached.., in `rows` rows, the rows - n before them padding (a prompt
// piece's: padding first, as sequence::inputs_at puts them).
struct lane_piece {
  int lane = 0;
  int64_t cached = 0;
  std::vector<int32_t> tokens;
  int64_t rows = 1;
};

struct lane_group : std::enable_shared_from_this<lane_group> {
  generator::impl* gen = nullptr;  // owns the group; a job's sequences keep it alive
  int slot = 0;
  std::mutex m;
  std::vector<std::shared_ptr<sequence>> lanes;  // guarded by m; null: free
  bool busy = false;          // a job of the slot in flight (guarded by m)
  bool prompt_turn = true;    // guarded by m

  // A sequence's part of a job: `n` tokens stored in its lane; `row` is the
  // logits row its next token comes from (-1: none, the prompt goes on),
  // or its token with a plan that picks it on the device (`token_out`).
  struct part {
    std::shared_ptr<sequence> s;
    int64_t n = 1;
    int64_t row = -1;
  };

  void join(const std::shared_ptr<sequence>& s) {
    {
      std::lock_guard lk(m);
      lanes[static_cast<std::size_t>(s->slot % gen->lanes)] = s;
    }
    pump();
  }
  void leave(int lane, const sequence* s) {
    std::lock_guard lk(m);
    auto& held = lanes[static_cast<std::size_t>(lane % gen->lanes)];
    if (held.get() == s) held.reset();
  }

  // Starts the slot's next job, if it has none in flight and work waits.
  void pump();
  void on_job(const job_result& r, const std::vector<part>& parts, bool token_out);

  // ---- pipelined batched greedy steps (generator::impl::batch_chains) ----
  //
  // A step whose every row yields a token picked on the device starts a run
  // of the same sequences in the same rows: step 0 feeds their tokens from
  // the host and keeps each row's token in token_state_a; step k > 0 reads
  // the tokens step k - 1 kept (the chain plans alternate the two states)
  // at each row's position + k, so up to pipeline_depth steps are in flight
  // and the device need not wait for the host between them. The run
  // submits no more steps once a row's sequence ends (or may end: its token
  // count or the cache), is cancelled, or another sequence waits in the
  // slot (a new one, or a prompt); the steps still in flight run on, their
  // rows of ended sequences dropped (they store past the end of their
  // lanes, which the mask hides from whoever takes the lane next, after
  // them). When nothing is in flight the slot's turn goes back to pump().
  struct run_state {
    bool active = false;    // guarded by m, like everything here unless said
    bool stopping = false;  // submit no more steps
    std::vector<part> rows;             // the run's sequences, row i in row i
    std::vector<int> row_lane;          // row i's lane
    std::vector<int64_t> first_cached;  // row i's `cached` before step 0
    std::vector<int64_t> first_tokens;  // row i's tokens before step 0
    std::vector<char> live;             // row i's sequence still runs (the draining thread's)
    std::size_t plan = 0;               // batch_greedy_steps / batch_chains index
    int64_t submitted = 0, taken = 0;
    int in_flight = 0;
    bool draining = false;  // one thread takes results and submits, in order
    std::map<int64_t, job_result> arrived;
  } run;

  // Whether pump's step of `parts` (a row each, token_out) may start a run.
  bool may_run(const std::vector<part>& parts, bool token_out) const;
  // Under m: whether the run's next step (run.submitted) may be submitted now.
  bool run_may_submit() const;
  // Submits step k of the run over `pieces` (k > 0: the plan reads the
  // rows' tokens from the state, the pieces' tokens unused).
  void submit_run_step(int64_t k, const std::vector<lane_piece>& pieces);
  void arrive(int64_t k, const job_result& r);
  void drain();
  void take_run_step(int64_t k, const job_result& r);
};

// Inputs of a lane job: each piece's rows in order, then padding rows that
// repeat the first row and store nothing. A real token's keys and values go
// to its lane's row of its position; its query sees what cache_mask_inputs
// says (the positions from its window's first to its own), shifted into its
// lane's keys (lane l's position p is key l * cache_tokens + p). Keys: the
// positions each lane of the job holds once the job stored its rows; other
// lanes' rows -1 (no query of the job is theirs).
std::vector<host_tensor> lane_inputs(const generator::impl& g, const step_plan& sp,
                                     const std::vector<lane_piece>& pieces) {
  const models::transformer_config& c = g.cfg;
  const int64_t T = sp.new_tokens, R = g.lane_rows, K = g.opt.cache_tokens, W = c.sliding_window;
  const int64_t rows_all = R * g.lanes;
  std::vector<int32_t> tk, pos, store, ranges;
  // The key positions and query ranges only for a plan that builds its mask
  // from them (a one-token plan reads the host mask below).
  const bool positions = sp.mask_from_positions;
  host_tensor keys = positions ? host_tensor::uninitialized(dtype::i32, {rows_all}) : host_tensor();
  auto* key = reinterpret_cast<int32_t*>(keys.data());
  if (positions) std::fill(key, key + rows_all, -1);
  for (const lane_piece& pc : pieces) {
    const auto n = static_cast<int64_t>(pc.tokens.size());
    const int64_t base = pc.lane * K;
    const int32_t* seen = nullptr;
    models::cache_mask_positions m;
    if (positions) {
      m = models::cache_mask_inputs(pc.rows, R, pc.cached, n, W);
      const auto* held = reinterpret_cast<const int32_t*>(m.key_positions.data());
      seen = reinterpret_cast<const int32_t*>(m.query_ranges.data());
      for (int64_t r = 0; r < R; ++r) key[pc.lane * R + r] = held[r] < 0 ? -1 : static_cast<int32_t>(base + held[r]);
    }
    for (int64_t i = 0; i < pc.rows; ++i) {
      const int64_t j = i - (pc.rows - n);  // the real token's index (< 0: padding)
      tk.push_back(j >= 0 ? pc.tokens[static_cast<std::size_t>(j)] : 0);
      pos.push_back(static_cast<int32_t>(j >= 0 ? pc.cached + j : pc.cached));
      store.push_back(j >= 0 ? static_cast<int32_t>(pc.lane * R + (pc.cached + j) % R) : -1);
      if (positions) {
        ranges.push_back(static_cast<int32_t>(base + seen[2 * i]));
        ranges.push_back(static_cast<int32_t>(base + seen[2 * i + 1]));
      }
    }
  }
  while (static_cast<int64_t>(tk.size()) < T) {
    tk.push_back(tk.front());
    pos.push_back(pos.front());
    store.push_back(-1);
    if (positions) {
      ranges.push_back(ranges[0]);
      ranges.push_back(ranges[1]);
    }
  }
  std::vector<host_tensor> in;
  in.reserve(5);
  if (sp.token_input) in.push_back(host_tensor::from_ints({1, T}, tk));
  in.push_back(host_tensor::from_ints({T}, pos));
  in.push_back(host_tensor::from_ints({T}, store));
  if (positions) {
    in.push_back(std::move(keys));
    in.push_back(host_tensor::from_ints({T, 2}, ranges));
    return in;
  }
  // A one-token plan reads a host mask [1, lanes x R]: its lane's row of
  // cache_attention_mask, every other lane's rows hidden.
  const lane_piece& pc = pieces.front();
  host_tensor mask = host_tensor::uninitialized(c.dtype, {1, rows_all}, sp.mask_memory);
  const host_tensor hidden = models::cache_attention_mask(c.dtype, 1, R, 0, 0, W);
  const host_tensor own = models::cache_attention_mask(c.dtype, 1, R, pc.cached, 1, W);
  for (int l = 0; l < g.lanes; ++l)
    std::memcpy(mask.data() + static_cast<std::size_t>(l) * own.bytes(), (l == pc.lane ? own : hidden).data(), own.bytes());
  in.push_back(std::move(mask));
  return in;
}

void lane_group::pump() {
  std::vector<std::shared_ptr<sequence>> cancelled;
  const step_plan* sp = nullptr;
  std::vector<part> parts;
  std::vector<lane_piece> pieces;
  bool token_out = false;
  bool run_started = false;
  {
    std::lock_guard lk(m);
    if (busy) return;
    std::vector<int> prompting, feeding;  // lanes with a prompt piece to run; lanes feeding one token
    for (int l = 0; l < gen->lanes; ++l) {
      std::shared_ptr<sequence>& s = lanes[static_cast<std::size_t>(l)];
      if (!s) continue;
      if (s->st->cancel_requested.load()) {
        cancelled.push_back(std::move(s));
        s.reset();
        continue;
      }
      const std::size_t left = s->prompt.size() - s->prompt_fed;
      (left > 1 && gen->prefill.p ? prompting : feeding).push_back(l);
    }
    if (!prompting.empty() && (feeding.empty() || prompt_turn)) {
      // The oldest prompting sequence's next piece: the smallest prompt plan
      // that holds what is left, else the prefill plan (chunks of its size).
      const int l = *std::min_element(prompting.begin(), prompting.end(), [&](int a, int b) {
        return lanes[static_cast<std::size_t>(a)]->ticket < lanes[static_cast<std::size_t>(b)]->ticket;
      });
      const std::shared_ptr<sequence>& s = lanes[static_cast<std::size_t>(l)];
      const std::size_t left = s->prompt.size() - s->prompt_fed;
      sp = gen->prompt_plan_for(left);
      const auto n = static_cast<std::size_t>(std::min<int64_t>(static_cast<int64_t>(left), sp->new_tokens));
      const auto from = s->prompt.begin() + static_cast<std::ptrdiff_t>(s->prompt_fed);
      pieces.push_back({l, s->cached, std::vector<int32_t>(from, from + static_cast<std::ptrdiff_t>(n)), sp->new_tokens});
      s->prompt_fed += n;
      parts.push_back({s, static_cast<int64_t>(n), s->prompt_fed == s->prompt.size() ? 0 : -1});
      prompt_turn = false;
    } else if (!feeding.empty()) {
      // One token of each feeding sequence: a one-token plan for one (the
      // device's argmax where its options allow), else the smallest batch
      // plan that holds them, a row each (padding rows repeat the first and
      // store nothing).
      const int64_t count = static_cast<int64_t>(feeding.size());
      for (std::size_t i = 0; i < feeding.size(); ++i) {
        const int l = feeding[i];
        const std::shared_ptr<sequence>& s = lanes[static_cast<std::size_t>(l)];
        const bool prompting_now = s->prompt_fed < s->prompt.size();
        const int32_t tok = prompting_now ? s->prompt[s->prompt_fed++] : s->next_token;
        pieces.push_back({l, s->cached, {tok}, 1});
        parts.push_back({s, 1, s->prompt_fed == s->prompt.size() ? static_cast<int64_t>(i) : -1});
      }
      if (count == 1) {
        const std::shared_ptr<sequence>& s = parts.front().s;
        token_out = s->greedy_on_device() && parts.front().row >= 0;
        sp = &step_for(token_out ? gen->decode_greedy : gen->decode, s->cached);
      } else {
        // The rows' tokens picked on the device when every row that samples
        // is greedy there (rows that only feed a prompt token take none).
        token_out = !gen->batch_greedy_steps.empty() && std::all_of(parts.begin(), parts.end(), [](const part& p) {
                      return p.row < 0 || p.s->greedy_on_device();
                    });
        for (const step_plan& b : token_out ? gen->batch_greedy_steps : gen->batch_steps)
          if (!sp && b.new_tokens >= count) sp = &b;
      }
      if (may_run(parts, token_out)) {
        run.active = true;
        run.stopping = false;
        // The batch plans' index (a lone row takes the one-token plans).
        run.plan = count > 1 ? static_cast<std::size_t>(sp - gen->batch_greedy_steps.data()) : 0;
        run.rows = parts;
        run.row_lane = feeding;
        run.first_cached.clear();
        run.first_tokens.clear();
        for (const part& p : parts) {
          run.first_cached.push_back(p.s->cached);
          run.first_tokens.push_back(static_cast<int64_t>(p.s->out.tokens.size()));
        }
        run.live.assign(parts.size(), 1);
        run.submitted = 1;
        run.taken = 0;
        run.in_flight = 1;
        run_started = true;
      }
      prompt_turn = true;
    }
    busy = sp != nullptr;
  }
  for (const std::shared_ptr<sequence>& s : cancelled) s->finish(stop_reason::cancelled);
  if (!sp) return;
  if (run_started) return submit_run_step(0, pieces);
  submit_options so;
  so.state_slot = slot;  // the lanes' caches
  so.on_done = [self = shared_from_this(), parts, token_out](const job_result& r) { self->on_job(r, parts, token_out); };
  gen->rt->submit(sp->p, lane_inputs(*gen, *sp, pieces), so);
}

bool lane_group::may_run(const std::vector<part>& parts, bool token_out) const {
  return token_out && (parts.size() > 1 ? !gen->batch_chains.empty() : gen->lone_chain[0].p != nullptr) &&
         std::all_of(parts.begin(), parts.end(), [](const part& p) { return p.row >= 0; });
}

bool lane_group::run_may_submit() const {
  if (!run.active || run.stopping || run.in_flight >= gen->opt.pipeline_depth) return false;
  const int64_t k = run.submitted;
  for (std::size_t i = 0; i < run.rows.size(); ++i) {
    const sequence& s = *run.rows[i].s;
    // Step k gives each row its token first_tokens + k, at position
    // first_cached + k: wanted while every row's sequence still runs then.
    if (run.first_tokens[i] + k >= s.opt.max_new_tokens || run.first_cached[i] + k >= gen->opt.cache_tokens ||
        s.st->cancel_requested.load())
      return false;
  }
  // Another sequence waits in the slot (a new one, or one whose turn the
  // run holds up): the run ends with the steps in flight.
  for (int l = 0; l < gen->lanes; ++l) {
    const std::shared_ptr<sequence>& held = lanes[static_cast<std::size_t>(l)];
    if (!held) continue;
    bool in_run = false;
    for (std::size_t i = 0; i < run.rows.size() && !in_run; ++i) in_run = run.rows[i].s == held;
    if (!in_run) return false;
  }
  return true;
}

void lane_group::submit_run_step(int64_t k, const std::vector<lane_piece>& pieces) {
  // run.rows and run.plan are set before step 0 and stay for the run.
  const step_plan& sp =
      run.rows.size() == 1 ? step_for(k == 0 ? gen->decode_greedy : gen->lone_chain[(k - 1) % 2], run.first_cached[0] + k)
      : k == 0             ? gen->batch_greedy_steps[run.plan]
                           : gen->batch_chains[run.plan][(k - 1) % 2];
  submit_options so;
  so.state_slot = slot;
  so.on_done = [self = shared_from_this(), k](const job_result& r) { self->arrive(k, r); };
  gen->rt->submit(sp.p, lane_inputs(*gen, sp, pieces), so);
}

void lane_group::arrive(int64_t k, const job_result& r) {
  {
    std::lock_guard lk(m);
    run.arrived.emplace(k, r);
    --run.in_flight;
  }
  drain();  // or the thread draining now takes it
}

// One thread at a time (run.draining): takes the steps' results in order,
// keeps up to pipeline_depth steps in flight, and hands the slot back to
// pump() when the run is over. Submits and streams without the lock (a
// failed submit runs its continuation at once, on this thread).
void lane_group::drain() {
  // The run's sequences may end here, and with them the last references to
  // the generator: keep it alive until the slot's next job is submitted.
  std::shared_ptr<generator::impl> keep;
  {
    std::lock_guard lk(m);
    if (run.draining) return;
    run.draining = true;
    keep = run.rows.front().s->gen;
  }
  for (;;) {
    int64_t k = -1;
    std::optional<job_result> r;
    std::vector<lane_piece> pieces;
    {
      std::lock_guard lk(m);
      if (auto it = run.arrived.find(run.taken); it != run.arrived.end()) {
        k = run.taken++;
        r = std::move(it->second);
        run.arrived.erase(it);
      } else if (run_may_submit()) {
        k = run.submitted++;
        ++run.in_flight;
        for (std::size_t i = 0; i < run.rows.size(); ++i)
          pieces.push_back({run.row_lane[i], run.first_cached[i] + k, {0}, 1});  // the token: from the state
      } else if (run.in_flight == 0) {
        run = run_state{};  // over: the slot's turn goes back to pump()
        busy = false;
      } else {
        run.draining = false;
        return;
      }
    }
    if (r) {
      take_run_step(k, *r);
    } else if (k >= 0) {
      submit_run_step(k, pieces);
    } else {
      pump();
      return;
    }
  }
}

void lane_group::take_run_step(int64_t k, const job_result& r) {
  bool stop = false;
  for (std::size_t i = 0; i < run.rows.size(); ++i) {
    if (!run.live[i]) continue;  // ended: this step's row of it dropped
    sequence& s = *run.rows[i].s;
    if (!r) {
      s.fail(r.err());
      run.live[i] = 0;
      stop = true;
      continue;
    }
    // The state's rows, i32 [lanes]: row i is this row's token.
    int32_t tok = 0;
    std::memcpy(&tok, (*r)[0].data() + static_cast<int64_t>(i) * static_cast<int64_t>(sizeof tok), sizeof tok);
    s.cached = run.first_cached[i] + k + 1;  // the step stored the row in its lane
    ++s.out.tokens_picked_on_device;
    if (run.rows.size() > 1) ++s.out.tokens_batched;
    if (k > 0) ++s.out.tokens_pipelined;
    if (!s.stream(tok)) {
      run.live[i] = 0;
      stop = true;
      continue;
    }
    s.next_token = tok;
    if (s.st->cancel_requested.load()) {
      s.finish(stop_reason::cancelled);
      run.live[i] = 0;
      stop = true;
    }
  }
  if (stop) {
    std::lock_guard lk(m);
    run.stopping = true;
  }
}

void lane_group::on_job(const job_result& r, const std::vector<part>& parts, bool token_out) {
  // The sequences may end here, and with them the last references to the
  // generator: keep it alive until the slot's next job is submitted.
  const std::shared_ptr<generator::impl> keep = parts.front().s->gen;
  for (const part& p : parts) {
    sequence& s = *p.s;
    if (!r) {
      s.fail(r.err());
      continue;
    }
    s.cached += p.n;  // the job stored its rows in the lane
    if (p.row < 0) continue;  // the prompt goes on
    int32_t tok = 0;
    if (token_out) {  // next_token, i32 [1, rows, 1]: the part's row's
      std::memcpy(&tok, (*r)[0].data() + p.row * static_cast<int64_t>(sizeof tok), sizeof tok);
      ++s.out.tokens_picked_on_device;
    } else {
      tok = s.sample_row((*r)[0], p.row);
    }
    if (parts.size() > 1) ++s.out.tokens_batched;
    if (s.stream(tok)) s.next_token = tok;
  }
  {
    std::lock_guard lk(m);
    busy = false;
  }
  pump();
}

void sequence::start() {
  if (gen->lanes > 1) return gen->groups[static_cast<std::size_t>(slot / gen->lanes)]->join(shared_from_this());
  submit_next();
}

void sequence::leave_lane(int lane) {
  if (gen->lanes > 1) gen->groups[static_cast<std::size_t>(lane / gen->lanes)]->leave(lane, this);
}

}  // namespace

void generator::impl::start_or_queue(const std::shared_ptr<sequence>& s) {
  {
    std::lock_guard lk(m);
    s->ticket = next_ticket++;
    expected<std::optional<int>> got = slot_table.acquire(s->ticket, opt.queue_when_full);
    if (!got) {
      if (got.err().code != errc::out_of_memory) {  // a fresh ticket cannot be refused otherwise
        s->st->finish(error{errc::internal, "generate: " + got.err().message});
        return;
      }
      s->st->finish(error{errc::out_of_memory,
                          "generate: all " + std::to_string(opt.max_sequences) +
                              " KV cache slots are taken (generator_options::max_sequences; "
                              "queue_when_full is off)"});
      return;
    }
    if (!got->has_value()) {
      waiting.emplace(s->ticket, s);
      s->st->on_cancel = [weak = weak_from_this(), ticket = s->ticket] {
        if (auto g = weak.lock()) g->cancel_waiting(ticket);
      };
      return;
    }
    s->slot = **got;
  }
  // A slot keeps its last sequence's rows: the mask hides every row at or
  // beyond `cached`, so a fresh sequence needs no clearing.
  s->start();
}

void generator::impl::release_slot(uint64_t ticket) {
  std::shared_ptr<sequence> next;
  {
    std::lock_guard lk(m);
    expected<std::optional<state_slots::grant>> handed = slot_table.release(ticket);
    // A sequence releases only the slot it holds (end() runs once per sequence).
    if (!handed || !handed->has_value()) return;
    auto it = waiting.find((*handed)->ticket);
    next = std::move(it->second);
    waiting.erase(it);
    next->slot = (*handed)->slot;
  }
  next->start();
}

void generator::impl::cancel_waiting(uint64_t ticket) {
  std::shared_ptr<sequence> s;
  {
    std::lock_guard lk(m);
    if (!slot_table.cancel_wait(ticket)) return;  // holds a slot: submit_next sees the flag
    auto it = waiting.find(ticket);
    s = std::move(it->second);
    waiting.erase(it);
  }
  s->finish(stop_reason::cancelled);  // holds no slot: end() releases nothing
}

generator::generator(std::shared_ptr<impl> p) : impl_(std::move(p)) {}
generator::~generator() = default;

int64_t generator::cache_bytes() const noexcept { return impl_->cache_bytes; }
int64_t generator::cache_rows() const noexcept { return impl_->lane_rows; }
int generator::lanes_per_slot() const noexcept { return impl_->lanes; }
std::vector<const plan*> generator::batch_decode_plans() const {
  std::vector<const plan*> out;
  for (const step_plan& sp : impl_->batch_steps) out.push_back(sp.p.get());
  return out;
}
int64_t generator::weight_bytes() const noexcept { return impl_->weight_bytes; }
const plan& generator::decode_plan() const noexcept { return *impl_->decode.p; }
const plan* generator::prefill_plan() const noexcept { return impl_->prefill.p.get(); }
const plan* generator::short_prompt_plan() const noexcept {
  return impl_->prompt_pieces.empty() ? nullptr : impl_->prompt_pieces.front().p.get();
}
const plan* generator::short_sequence_decode_plan() const noexcept {
  return impl_->decode.short_twin ? impl_->decode.short_twin->p.get() : nullptr;
}
std::vector<const plan*> generator::greedy_decode_plans() const {
  std::vector<const plan*> out;
  for (const step_plan* sp : {&impl_->decode_greedy, &impl_->chain[0], &impl_->chain[1]})
    if (sp->p) out.push_back(sp->p.get());
  return out;
}
std::vector<const plan*> generator::prompt_plans() const {
  std::vector<const plan*> out;
  for (const step_plan& sp : impl_->prompt_pieces) out.push_back(sp.p.get());
  if (impl_->prefill.p) out.push_back(impl_->prefill.p.get());
  return out;
}

int generator::active_sequences() const {
  std::lock_guard lk(impl_->m);
  return impl_->slot_table.in_use();
}

int generator::waiting_sequences() const {
  std::lock_guard lk(impl_->m);
  return static_cast<int>(impl_->waiting.size());
}

namespace {

// generator_options::decode_batch = -1: batched decode steps where the plans
// run as one pipeline stage (one device, or one tensor-parallel group), the
// max_sequences spread over as few slots of at most 8 lanes as hold them
// (12: two slots of 6), so that the caches take what max_sequences asks,
// give or take a lane a slot. Over several stages each sequence keeps a slot
// of its own: the stages then interleave the sequences' steps, which one
// batch, a stage at a time, would not.
int automatic_decode_batch(const runtime& rt, const generator_options& o) {
  const plan_options& p = o.plan;
  const int degree = std::max(p.tensor_parallel, 1);
  const bool one_stage = p.policy == placement_policy::single || p.pipeline_stages == 1 ||
                         (p.pipeline_stages == 0 && static_cast<int>(rt.devices().size()) <= degree);
  if (!one_stage || o.max_sequences < 2) return 0;
  const int slots = (o.max_sequences + 7) / 8;  // max_sequences is 1..65536 here
  const int lanes = (o.max_sequences + slots - 1) / slots;
  // The lanes' masks key positions as i32 (checked below for a chosen N).
  if (static_cast<int64_t>(lanes) * o.cache_tokens > std::numeric_limits<int32_t>::max()) return 0;
  return lanes;
}

}  // namespace

expected<std::shared_ptr<generator>> generator::create(runtime& rt, models::transformer_config cfg,
                                                       models::weight_provider weights, generator_options options) {
  auto bad = [](std::string msg) { return error{errc::invalid_argument, "generator: " + std::move(msg)}; };
  if (options.cache_tokens < 1) return bad("cache_tokens must be >= 1, got " + std::to_string(options.cache_tokens));
  if (options.max_sequences < 1)
    return bad("max_sequences must be >= 1, got " + std::to_string(options.max_sequences));
  if (options.max_sequences > 65536)
    return bad("max_sequences must be at most 65536 (state slots), got " + std::to_string(options.max_sequences));
  if (options.prefill_chunk < 0)
    return bad("prefill_chunk must be >= 0, got " + std::to_string(options.prefill_chunk));
  if (options.short_prompt_chunk < 0)
    return bad("short_prompt_chunk must be >= 0, got " + std::to_string(options.short_prompt_chunk));
  if (options.decode_batch < -1 || options.decode_batch > 256)
    return bad("decode_batch must be -1 (automatic) or 0..256, got " + std::to_string(options.decode_batch));
  if (options.decode_batch == -1) options.decode_batch = automatic_decode_batch(rt, options);
  cfg.batch = 1;
  // Under a sliding window a query sees its last `window` positions, a
  // prefill chunk's first query reaching chunk - 1 positions further back
  // than its last: a ring of window + chunk - 1 rows holds all of them
  // (position p in row p % rows), however long the sequence.
  const int64_t ring_rows = cfg.sliding_window + std::max<int64_t>(options.prefill_chunk, 1) - 1;
  const int64_t lane_rows = cfg.sliding_window > 0 ? std::min(options.cache_tokens, ring_rows) : options.cache_tokens;
  // Under decode_batch a slot's cache is its lanes' side by side, and the
  // masks key lane l's position p as l * cache_tokens + p (i32).
  const int lanes = std::max(options.decode_batch, 1);
  const int groups = (options.max_sequences + lanes - 1) / lanes;
  if (lanes > 1 && lanes * options.cache_tokens > std::numeric_limits<int32_t>::max())
    return bad("decode_batch " + std::to_string(lanes) + " x cache_tokens " + std::to_string(options.cache_tokens) +
               " exceed the 2^31 - 1 positions the lanes' masks can key");
  cfg.kv_cache_capacity = lane_rows * lanes;
  if (cfg.variant == models::model_variant::gpt2) {
    if (cfg.max_positions == 0) cfg.max_positions = options.cache_tokens;
    if (cfg.max_positions < options.cache_tokens)
      return bad("cache_tokens " + std::to_string(options.cache_tokens) + " exceed the gpt2 position table (" +
                 std::to_string(cfg.max_positions) + " rows, n_positions)");
  }
  auto impl = std::make_shared<generator::impl>();
  impl->rt = &rt;
  impl->opt = options;
  impl->lanes = lanes;
  impl->lane_rows = lane_rows;
  // Every plan keeps the caches on the devices: one plan owns the weights
  // and max_sequences state slots (the decode plan, or a chain plan when
  // greedy steps are pipelined), the others read and store into the same.
  if (options.pipeline_depth < 1 || options.pipeline_depth > 16)
    return bad("pipeline_depth must be 1..16, got " + std::to_string(options.pipeline_depth));
  // A step graph: new_tokens tokens a job; greedy: its output is the token
  // (kept in state token_out, read from state token_in, where named).
  struct step_shape {
    int64_t new_tokens = 1;
    bool greedy = false;
    const char* token_in = nullptr;
    const char* token_out = nullptr;
    bool all_rows = false;  // logits of every row (a batched decode step's), not the last row's
    int64_t token_rows = 1;  // rows of the token states (a batched step's: lanes)
  };
  // Prompt plans, and under decode_batch every plan of more than one row,
  // build their masks on the device.
  const auto masks_on_device = [&](const step_shape& sh) {
    return sh.new_tokens > 1 && (options.prompt_masks_on_device || lanes > 1);
  };
  auto step_graph = [&](const step_shape& sh) {
    models::transformer_config c = cfg;
    c.seq_len = sh.new_tokens;
    c.argmax_output = sh.greedy;
    c.last_row_logits = !sh.all_rows;  // a chunk's real tokens are last (inputs_at): only its last row goes on
    c.mask_from_positions = masks_on_device(sh);
    // A batched step's rows are sequences in lanes of their own (lane_inputs:
    // padding rows repeat the first row's range and store nothing).
    c.rows_apart = sh.all_rows && c.mask_from_positions;
    if (sh.token_in) c.token_state_in = sh.token_in;
    if (sh.token_out) c.token_state_out = sh.token_out;
    c.token_state_rows = sh.token_rows;
    return models::build_transformer(c, weights);
  };
  auto plan_opts = [&](std::shared_ptr<const plan> share) {
    plan_options po = options.plan;
    po.state_slots = groups;
    po.share_weights_with = share;  // one upload of the model: the owner holds every weight
    po.share_state_with = std::move(share);
    return po;
  };
  auto make_plan = [&](const step_shape& sh, step_plan& out, std::shared_ptr<const plan> share) -> error {
    expected<graph> g = step_graph(sh);
    if (!g) return g.err();
    expected<std::shared_ptr<const plan>> p = rt.compile(std::move(*g), plan_opts(share));
    if (!p) return p.err();
    out.p = std::move(*p);
    out.new_tokens = sh.new_tokens;
    out.token_input = sh.token_in == nullptr;
    // The inputs: [tokens,] positions, store positions, then the mask or
    // the key positions and query ranges it is built from.
    out.mask_from_positions = masks_on_device(sh);
    if (!out.mask_from_positions) out.mask_memory = rt.input_memory(out.p, out.token_input ? 3 : 2);
    // A one-token step over a cache too long for the one-kernel step: a
    // twin that runs it as one kernel anyway, for short sequences, sharing
    // this plan's weights (or its owner's) and caches. Compiled only for a
    // plan on one CUDA device (nowhere else can the step fuse), and kept
    // only where the lowering fuses it.
    const int64_t rows = cfg.kv_cache_capacity;
    const bool one_cuda = out.p->used_devices().size() == 1 && out.p->tensor_degree() == 1 &&
                          out.p->devices().at(static_cast<std::size_t>(out.p->used_devices().front())).kind ==
                              device_kind::cuda;
    if (sh.new_tokens == 1 && one_cuda && options.plan.fuse_decode_step && rows > decode_step_max_cache_rows &&
        options.plan.decode_step_max_cache_rows < rows) {
      plan_options po = plan_opts(share ? share : out.p);
      po.decode_step_max_cache_rows = rows;
      expected<graph> g2 = step_graph(sh);
      if (!g2) return g2.err();
      expected<std::shared_ptr<const plan>> twin = rt.compile(std::move(*g2), po);
      if (!twin) return twin.err();
      auto prog = actors::lower(*twin);
      if (prog && (*prog)->decode_step_fused()) {
        auto t = std::make_shared<step_plan>(out);  // out has no twin yet
        t->p = std::move(*twin);
        out.short_twin = std::move(t);
      }
    }
    return {};
  };
  const step_shape chain_b{1, true, token_state_names[0], token_state_names[1]};
  const step_shape chain_a{1, true, token_state_names[1], token_state_names[0]};
  // Pipelined greedy decoding needs plans that hand the token on through
  // the token states: the chain plans and the greedy plan of the first new
  // token are planned (not loaded) first to see that they compile sharing
  // them. On one stream a step is queued behind the last one as soon as
  // that one is issued; over tensor-parallel ranks it starts when the last
  // one ended (the slot's turn), each rank reading the token it kept,
  // without the host's round trip for the token (LLaMA-1B shape at degree 2
  // on logical devices of one H200: 1.277 -> 1.155-1.237 ms a token). Over
  // pipeline stages the token crosses from the last stage to the first as a
  // peer copy before each step, which measured slower than the host's round
  // trip (0.887 -> 0.944-0.960 ms), so several stages keep one step at a
  // time unless pipeline_across_stages. chain[1] owns the weights and the
  // state (the token states too), and the other plans use them.
  const auto probe = [&](const step_shape& sh, std::shared_ptr<const plan> share) -> std::shared_ptr<const plan> {
    expected<graph> g = step_graph(sh);
    if (!g) return nullptr;
    auto p = compile(std::make_shared<const graph>(std::move(*g)), rt.devices(), plan_opts(std::move(share)));
    return p ? std::move(*p) : nullptr;
  };
  bool pipelined = false;
  if (options.device_greedy && options.pipeline_depth > 1 && lanes == 1) {
    const std::shared_ptr<const plan> owner = probe(chain_a, nullptr);
    pipelined = owner && (owner->stage_count() == 1 || options.pipeline_across_stages) && probe(chain_b, owner) &&
                probe({1, true, nullptr, token_state_names[0]}, owner);
  }
  // Batched steps pipelined the same way (lane_group's runs): plans of n
  // rows over token states of `lanes` rows, the chain of `lanes` rows from
  // token_state_b to token_state_a owning the weights and the state.
  const auto batch_shape = [&](int64_t n, const char* in, const char* out) {
    step_shape sh{n, true, in, out, true};
    sh.token_rows = lanes;
    return sh;
  };
  // A sequence alone in its slot: one-token plans over the same states, row 0.
  const auto lone_shape = [&](const char* in, const char* out) {
    step_shape sh{1, true, in, out};
    sh.token_rows = lanes;
    return sh;
  };
  bool batch_pipelined = false;
  if (options.device_greedy && options.pipeline_depth > 1 && lanes > 1) {
    const std::shared_ptr<const plan> owner = probe(batch_shape(lanes, token_state_names[1], token_state_names[0]), nullptr);
    batch_pipelined = owner && (owner->stage_count() == 1 || options.pipeline_across_stages) &&
                      probe(batch_shape(lanes, token_state_names[0], token_state_names[1]), owner) &&
                      probe(batch_shape(lanes, nullptr, token_state_names[0]), owner) &&
                      probe(lone_shape(token_state_names[0], token_state_names[1]), owner);
  }
  step_plan batch_owner;
  if (pipelined) {
    if (error e = make_plan(chain_a, impl->chain[1], nullptr)) return e;
    const std::shared_ptr<const plan> owner = impl->chain[1].p;
    if (error e = make_plan(chain_b, impl->chain[0], owner)) return e;
    if (error e = make_plan({1, true, nullptr, token_state_names[0]}, impl->decode_greedy, owner)) return e;
    if (error e = make_plan({1}, impl->decode, owner)) return e;
  } else if (batch_pipelined) {
    if (error e = make_plan(batch_shape(lanes, token_state_names[1], token_state_names[0]), batch_owner, nullptr))
      return e;
    if (error e = make_plan({1}, impl->decode, batch_owner.p)) return e;
    if (error e = make_plan(lone_shape(nullptr, token_state_names[0]), impl->decode_greedy, batch_owner.p)) return e;
    if (error e = make_plan(lone_shape(token_state_names[0], token_state_names[1]), impl->lone_chain[0], batch_owner.p))
      return e;
    if (error e = make_plan(lone_shape(token_state_names[1], token_state_names[0]), impl->lone_chain[1], batch_owner.p))
      return e;
  } else {
    if (error e = make_plan({1}, impl->decode, nullptr)) return e;
    if (options.device_greedy)
      if (error e = make_plan({1, true}, impl->decode_greedy, impl->decode.p)) return e;
  }
  const std::shared_ptr<const plan> owner = pipelined ? impl->chain[1].p : batch_pipelined ? batch_owner.p : impl->decode.p;
  if (options.prefill_chunk > 1)
    if (error e = make_plan({options.prefill_chunk}, impl->prefill, owner)) return e;
  if (options.short_prompt_chunk > 1)
    for (int64_t n = options.short_prompt_chunk; n < options.prefill_chunk; n *= 2) {
      step_plan& piece = impl->prompt_pieces.emplace_back();
      if (error e = make_plan({n}, piece, owner)) return e;
      if (!options.doubling_prompt_plans) break;
    }
  // Batched decode steps: 2, 4, ... rows, and `lanes`; with device_greedy,
  // each also as a plan that outputs its rows' greedy tokens (pipelined:
  // kept in token_state_a, and the two chain plans of its size).
  for (int64_t n = 2; lanes > 1; n = std::min<int64_t>(2 * n, lanes)) {
    step_shape sh{n};
    sh.all_rows = true;
    if (error e = make_plan(sh, impl->batch_steps.emplace_back(), owner)) return e;
    if (options.device_greedy) {
      sh.greedy = true;
      if (batch_pipelined) sh = batch_shape(n, nullptr, token_state_names[0]);
      if (error e = make_plan(sh, impl->batch_greedy_steps.emplace_back(), owner)) return e;
    }
    if (batch_pipelined) {
      std::array<step_plan, 2>& chain = impl->batch_chains.emplace_back();
      if (error e = make_plan(batch_shape(n, token_state_names[0], token_state_names[1]), chain[0], owner)) return e;
      if (n == lanes) chain[1] = std::move(batch_owner);
      else if (error e = make_plan(batch_shape(n, token_state_names[1], token_state_names[0]), chain[1], owner))
        return e;
    }
    if (n == lanes) break;
  }
  cfg.seq_len = 1;
  impl->cfg = cfg;
  for (const device_memory& m : impl->decode.p->memory()) impl->cache_bytes += m.state_bytes * groups;
  std::vector<const step_plan*> all{&impl->decode,   &impl->prefill,       &impl->decode_greedy, &impl->chain[0],
                                    &impl->chain[1], &impl->lone_chain[0], &impl->lone_chain[1]};
  for (const step_plan& sp : impl->prompt_pieces) all.push_back(&sp);
  for (const step_plan& sp : impl->batch_steps) all.push_back(&sp);
  for (const step_plan& sp : impl->batch_greedy_steps) all.push_back(&sp);
  for (const std::array<step_plan, 2>& chain : impl->batch_chains)
    for (const step_plan& sp : chain) all.push_back(&sp);
  for (std::size_t i = 0, n = all.size(); i < n; ++i)
    if (all[i]->short_twin) all.push_back(all[i]->short_twin.get());
  for (const step_plan* sp : all)
    if (sp->p)
      for (const device_memory& m : sp->p->memory()) impl->weight_bytes += m.weights_shared ? 0 : m.weight_bytes;
  // Under decode_batch the table hands out lanes: lane i is lane i %
  // lanes of slot i / lanes, lowest first, so sequences fill a slot's batch
  // before the next slot's.
  impl->slot_table = state_slots(groups * lanes);
  if (lanes > 1)
    for (int g = 0; g < groups; ++g) {
      auto group = std::make_shared<lane_group>();
      group->gen = impl.get();
      group->slot = g;
      group->lanes.resize(static_cast<std::size_t>(lanes));
      impl->groups.push_back(std::move(group));
    }
  return std::make_shared<generator>(std::move(impl));
}

generation generator::generate(std::vector<int32_t> prompt, generate_options options) {
  auto st = std::make_shared<generation::state>();
  generation handle(st);
  auto fail_now = [&](std::string msg) {
    st->finish(error{errc::invalid_argument, "generate: " + std::move(msg)});
    return handle;
  };
  if (prompt.empty()) return fail_now("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) > impl_->opt.cache_tokens)
    return fail_now("the prompt's " + std::to_string(prompt.size()) + " tokens exceed cache_tokens " +
                    std::to_string(impl_->opt.cache_tokens));
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= impl_->cfg.vocab)
      return fail_now("prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]) +
                      ", outside the vocabulary [0, " + std::to_string(impl_->cfg.vocab) + ")");
  if (options.max_new_tokens < 1)
    return fail_now("max_new_tokens must be >= 1, got " + std::to_string(options.max_new_tokens));
  const sampling_options& so = options.sampling;
  if (!(so.repetition_penalty > 0.0f) || !std::isfinite(so.repetition_penalty))
    return fail_now("sampling.repetition_penalty must be a finite number > 0 (1: off), got " +
                    std::to_string(so.repetition_penalty));
  if (!(so.min_p >= 0.0f && so.min_p <= 1.0f))
    return fail_now("sampling.min_p must be in [0, 1] (0: off), got " + std::to_string(so.min_p));
  auto s = std::make_shared<sequence>();
  s->gen = impl_;
  s->st = st;
  s->prompt = std::move(prompt);
  s->opt = std::move(options);
  s->rng = s->opt.sampling.seed;
  struct inside_scope {
    bool was = inside_generate;
    inside_scope() { inside_generate = true; }
    ~inside_scope() { inside_generate = was; }
  } const scope;
  impl_->start_or_queue(s);
  return handle;
}

}  // namespace ag
