#pragma once
/// \file generator.hpp
/// Text generation over a runtime: prefill and decode jobs of one sequence
/// chained through a KV cache, many sequences in flight at once.
///
///     auto gen = ag::generator::create(*rt, cfg, weights, {}).value();
///     ag::generate_options o;
///     o.max_new_tokens = 32;
///     o.on_token = [](int32_t tok, int64_t i) { /* runtime thread */ };
///     ag::generation g = gen->generate({1, 2, 3}, o);   // returns at once
///     const ag::generation_outcome& r = g.wait();       // or g.then(...)
///
/// How it runs. `create` compiles two step graphs of the model
/// (models::build_transformer in cache mode, see graph/models/transformer.hpp):
/// a decode plan (1 new token) and, when prefill_chunk > 1, a prefill plan
/// (prefill_chunk new tokens, its real tokens last and its head over the
/// last row), with plans of shorter prompt pieces beside it
/// (short_prompt_chunk, doubling_prompt_plans). A
/// sequence is a chain of jobs: the prompt in chunks, then one decode job
/// per token.
///
/// The KV cache lives on the devices, as state of the plans: each block's
/// keys and values (store_rows nodes) stay on the device that runs the
/// block (its pipeline stage; its kv-head shard under tensor parallelism),
/// one copy per state slot, and the prefill plan shares the decode plan's
/// (plan_options::share_state_with). A job names its sequence's slot
/// (submit_options::state_slot), stores its tokens' keys and values there
/// and attends over the slot in place; only tokens, positions and a mask go
/// up and the logits come down. The completion of a sequence's job submits
/// its next one (the slot orders them); jobs of different sequences are
/// independent, so a pipeline interleaves them. Greedy sequences pick their
/// tokens on the device (device_greedy) and, where every step runs on one
/// stream, queue their next steps behind the running one, the token passed
/// on the device (pipeline_depth; docs/ARCHITECTURE.md "Pipelined greedy
/// decoding").
///
/// With decode_batch N a slot holds N sequences (lanes) and its decode
/// steps carry a token of each, one job a step: the weights are read once
/// for all of them (generator_options::decode_batch); greedy ones are
/// pipelined too, each row's token passed on the device.
///
/// The prefill plan also uses the decode plan's weights (one upload of the
/// model, weight_bytes()) wherever the two plans lay them out alike.
///
/// Cache memory is planned at `create`: max_sequences slots of
/// cache_tokens positions each (cache_bytes(), device memory; a model with
/// a sliding window keeps only the rows its queries can still see, a ring:
/// cache_rows()). A sequence
/// holds a slot from its first job to its end; when all are taken a new
/// sequence waits for one (queue_when_full) or fails at once with
/// errc::out_of_memory saying so.
///
/// Threads: create() on the caller's thread (it compiles and uploads);
/// generate(), cancel() and the handle's calls from any thread; on_token and
/// then() continuations run on runtime threads (keep them short; a
/// sequence cancelled while it waits for a slot: see cancel()), never
/// inside generate() however fast the steps end, so an on_token may wait for
/// the handle generate() returns (e.g. to cancel its own sequence). The
/// generator and the runtime must outlive the sequences' completion (the
/// runtime's destructor waits for their jobs; a sequence whose job the
/// stopping runtime refuses fails with that error).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "actors/actorgraph.hpp"
#include "graph/models/transformer.hpp"

namespace ag {

/// How the next token is chosen from a logits row.
struct sampling_options {
  /// 0: greedy (argmax, lowest id on ties). > 0: sample from
  /// softmax(logits / temperature) after the top-k and top-p filters.
  float temperature = 0.0f;
  int top_k = 0;        ///< keep the k most likely tokens (0: all)
  float top_p = 1.0f;   ///< keep the smallest set of most likely tokens whose mass reaches top_p
  /// After top-k and top-p: drop the tokens less likely than min_p times the
  /// most likely one (transformers' min_p; 0: off). In [0, 1].
  float min_p = 0.0f;
  /// Tokens already in the sequence (its prompt and what it generated) made
  /// less likely, as transformers' repetition_penalty: a positive logit
  /// divided by it, a negative one multiplied, once however often the token
  /// occurs (1: off; > 1 discourages repeats). Greedy sequences with a
  /// penalty pick their tokens on the host (the device's argmax has no
  /// history). Finite and > 0.
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;    ///< the sequence's random stream (same seed, same tokens)
};

/// Why a sequence ended.
/// stop_condition: generate_options::stop_when said so (stop strings).
enum class stop_reason : uint8_t { eos, max_tokens, cache_full, cancelled, stop_condition };
const char* to_string(stop_reason r) noexcept;

struct generate_options {
  int max_new_tokens = 16;
  /// Stops after emitting one of these ids (end of sequence).
  std::vector<int32_t> stop_ids;
  sampling_options sampling;
  /// Called once per generated token, in order, on a runtime thread.
  std::function<void(int32_t token, int64_t index)> on_token;
  /// Called with each token after on_token, on the same thread; true ends the
  /// sequence there as an end-of-sequence id does (the token kept;
  /// stop_reason::stop_condition). Stop strings: models::stop_strings
  /// (graph/checkpoint/tokenizer.hpp), as actorgraph-generate's --stop does.
  std::function<bool(int32_t token)> stop_when;
  /// Keep the logits row each generated token was sampled from (tests).
  bool keep_logits = false;
};

struct generation_result {
  std::vector<int32_t> tokens;  ///< generated tokens (the prompt not included)
  stop_reason reason = stop_reason::max_tokens;
  std::vector<std::vector<float>> logits;  ///< per token, with keep_logits
  /// Of `tokens`, those picked on the device (generator_options::device_greedy).
  int64_t tokens_picked_on_device = 0;
  /// Of those, the ones whose step read its token on the device, queued
  /// behind the step before (generator_options::pipeline_depth).
  int64_t tokens_pipelined = 0;
  /// Of `tokens`, those whose decode step carried other sequences' tokens
  /// too (generator_options::decode_batch).
  int64_t tokens_batched = 0;
};

/// The generated tokens, or the error of the job that failed (naming it).
using generation_outcome = expected<generation_result>;

/// Handle to one sequence. Copyable; all copies refer to the same sequence.
class generation {
 public:
  struct state;  ///< implementation detail (generator.cpp)
  generation() = default;
  explicit generation(std::shared_ptr<state> s) : s_(std::move(s)) {}
  bool ready() const;
  /// Blocks until the sequence ended; the result is valid while a handle to
  /// the sequence lives.
  const generation_outcome& wait() const&;
  /// On a temporary handle (`gen->generate(p).wait()`): blocks, then returns
  /// a copy (a reference would outlive the sequence's state).
  generation_outcome wait() &&;
  bool wait_for(std::chrono::nanoseconds d) const;
  /// Runs `fn` when the sequence ends (at once on this thread if it has).
  void then(std::function<void(const generation_outcome&)> fn) const;
  /// Stops the sequence after the job in flight (pipelined greedy steps:
  /// when the next step's token arrives; the steps queued behind it run on
  /// and their tokens are dropped): the result keeps the tokens generated so
  /// far, with stop_reason::cancelled. Non-blocking. A sequence still
  /// waiting for a cache slot ends at once, so its then() continuations run
  /// on this thread, inside cancel().
  void cancel() const;
  /// Tokens generated so far.
  std::vector<int32_t> tokens() const;

 private:
  std::shared_ptr<state> s_;
};

struct generator_options {
  /// Positions per sequence (prompt + generated tokens); a sequence that
  /// reaches it stops with stop_reason::cache_full. The cache holds them
  /// all, or under a sliding window only the ones still seen (cache_rows()).
  int64_t cache_tokens = 256;
  int max_sequences = 8;        ///< cache slots: sequences holding a cache at once (1..65536)
  bool queue_when_full = true;  ///< false: generate() fails at once when no slot is free
  /// New tokens per prefill job (a plan of its own); 0 or 1: the prompt
  /// goes through the decode plan one token per job.
  int64_t prefill_chunk = 0;
  /// With prefill_chunk larger than this, a second prefill plan of this many
  /// tokens takes a prompt (or a prompt's last piece) of at most as many:
  /// a 20-token prompt then computes 64 rows, not prefill_chunk's 1024
  /// (sharing the weights and caches; its arena is the smaller one). 0 or
  /// 1: none.
  int64_t short_prompt_chunk = 64;
  /// With a short prompt plan, more of them: twice short_prompt_chunk, four
  /// times, ... while below prefill_chunk (64, 128, 256, 512 beside a chunk
  /// of 1024), and a prompt's piece takes the smallest that holds it, so
  /// that it computes fewer than twice its rows (a 512-token prompt: 512
  /// rows, not 1024). The plans share the weights and caches; each has an
  /// arena of its own (together about the prefill plan's). false: the
  /// short_prompt_chunk plan alone.
  bool doubling_prompt_plans = true;
  /// The prompt plans (prefill_chunk, short_prompt_chunk) build their
  /// attention masks on the device from the cache rows' positions
  /// (transformer_config::mask_from_positions): a job copies a few KiB, not
  /// a [chunk, cache rows] mask the host filled (128 MiB for a chunk of 1024
  /// over 65,536 rows). false: the host builds and copies the masks. Decode
  /// steps copy their one-row mask either way.
  bool prompt_masks_on_device = true;
  /// Greedy sequences (sampling temperature <= 0, no repetition penalty, no keep_logits) decode
  /// with a third plan whose output is the token, picked on the device
  /// (transformer_config::argmax_output), sharing the decode plan's weights
  /// and caches: a step copies 4 bytes to the host instead of its logits,
  /// and the host does not scan them. false: every sequence samples on the host.
  bool device_greedy = true;
  /// Greedy sequences decoding on the device (above) keep up to this many
  /// decode steps in flight: step n + 1 reads its token where step n kept it
  /// on the device (transformer_config::token_state_in / token_state_out:
  /// two more plans that alternate, sharing the weights and caches). Where
  /// every step of the plan runs on one stream (one device, one compute
  /// lane, small copies inlined there: single_lane_of) step n + 1 is queued
  /// behind step n, which passes its slot's turn on once it is issued
  /// (slot_table::leave_issued): the device does not wait for the host
  /// between tokens. Over tensor-parallel ranks (one stage) step n + 1
  /// starts when step n ended (the slot's turn), each rank reading the
  /// token it kept, without the token's round trip through the generator.
  /// Layouts of several pipeline stages keep one step at a time unless
  /// pipeline_across_stages (below): there the token crosses from the last
  /// stage to the first as a peer copy. The host still sees each token, in
  /// order, as its step ends. A sequence that stops (end of sequence,
  /// cancel) lets the steps already queued run and drops their tokens. 1:
  /// one step at a time, the host submitting each after the last one's
  /// token arrived. 1..16.
  int pipeline_depth = 2;
  /// Pipelines greedy steps over pipeline stages too: each step's token
  /// then crosses from the last stage to the first as a peer copy before
  /// the step. Off by default: on two logical devices of one H200 (LLaMA-1B
  /// shape) it took 0.944-0.960 ms a token against 0.884-0.890 one step at
  /// a time, measured before a slot's turn took its arenas at once; on
  /// zero-delay sim devices (host costs only) it now takes 0.017 against
  /// 0.023 ms (0.031 with the old turn). To be measured on GPUs again.
  bool pipeline_across_stages = false;
  /// Decode steps of up to this many sequences in one job (continuous
  /// batching); 0 or 1: each sequence's steps are jobs of their own; -1 (the
  /// default): automatic, below. With
  /// N >= 2 a state slot holds N sequences' caches side by side (lanes of
  /// cache_rows() rows each; max_sequences rounded up to a multiple of N),
  /// and the sequences of a slot decode together: one job carries one new
  /// token of each, so the model's weights are read once for all of them
  /// (plans of 2, 4, ... N rows, each row a sequence, masks built on the
  /// device from the lanes' positions; a sequence alone in its slot takes
  /// the one-token plans). Sequences take the lanes of a slot before the
  /// next slot's. A prompt's pieces are jobs of the slot too, taking
  /// turns with the slot's decode steps, so a new sequence joins the batch
  /// after its prompt. Each sequence samples its own token (its own options)
  /// on the host, from its row of the step's logits; a step whose every
  /// sampling row is greedy on the device (device_greedy, as a one-sequence
  /// step decides it) takes the twin of its plan that outputs each row's
  /// token instead (4 bytes a row to the host; on the zero-delay sim a step
  /// of 8 rows went from 0.068-0.076 to 0.019-0.020 ms of host time).
  /// Such greedy steps are pipelined like one sequence's (pipeline_depth,
  /// the same layouts): while the same sequences feed a token a step and no
  /// other waits in the slot, step k + 1 reads each row's token from a
  /// state of N rows that step k kept and is queued behind it, so the
  /// device does not wait for the host between steps; a sequence alone in
  /// its slot does the same on one-token plans that keep its token in row 0
  /// of those states. The run stops submitting when a row's sequence ends
  /// or may end (its token count, the cache), is cancelled, or a new
  /// sequence or a prompt waits; steps in flight run on and the rows of
  /// sequences that ended are dropped. A job that fails fails every
  /// sequence in it. -1..256.
  ///
  /// Automatic (-1): where the plans run as one pipeline stage (one device,
  /// or one tensor-parallel group: placement_policy::single,
  /// pipeline_stages 1, or no more devices than tensor_parallel), N spreads
  /// max_sequences over as few slots of at most 8 lanes as hold them (8: one
  /// slot of 8; 12: two of 6; 1: off), so the caches take what max_sequences
  /// asks, give or take a lane a slot; over several stages it is off, each
  /// sequence in a slot of its own, so that the stages interleave the
  /// sequences' steps. Measured on one H100 (LLaMA-1B's shape, 512-token
  /// prompts, 128 new tokens; docs/BENCHMARKS.md, session 74), tokens a
  /// second against each sequence a job of its own: 1.19 x at 2 sequences,
  /// 2.28 x at 4, 4.24 x at 8, 5.32 x at 16 (a step of 8 rows 1.68 ms
  /// against 0.91 for one sequence's); a sequence alone in a slot of 2 or 8
  /// lanes 1.00 x (0.913 / 0.915 ms a token). On cpu:1 (2 layers of
  /// LLaMA-1B) 2.7 x at 4 sequences, a lone one 0.96-0.99 (the machine's
  /// noise).
  int decode_batch = -1;
  plan_options plan;            ///< layout of both plans (stages, devices); state_slots and
                                ///< share_state_with are set by the generator
};

class generator {
 public:
  struct impl;
  /// Compiles the step plans of `cfg` (batch forced to 1; seq_len and
  /// kv_cache_capacity set from the options) with `weights` (empty: the
  /// config's seeded random weights) and plans the cache slots. Errors: an
  /// invalid config or option (naming it), a gpt2 cache longer than its
  /// position table, compile errors.
  static expected<std::shared_ptr<generator>> create(runtime& rt, models::transformer_config cfg,
                                                     models::weight_provider weights = {},
                                                     generator_options options = {});
  ~generator();

  /// Starts a sequence; returns at once. An empty prompt, a prompt that does
  /// not fit cache_tokens, an id outside the vocabulary or no free slot
  /// (queue_when_full off) give a handle that is already failed.
  generation generate(std::vector<int32_t> prompt, generate_options options = {});

  /// Bytes of device memory the caches take (all slots, all devices).
  int64_t cache_bytes() const noexcept;
  /// Rows of keys (and of values) each sequence's cache holds a layer (a
  /// slot's lane under decode_batch): cache_tokens,
  /// or for a model with a sliding window W (transformer_config::sliding_window)
  /// at most W + max(prefill_chunk, 1) - 1, a ring that position p takes row
  /// p % rows of: every position a query still sees stays, and a sequence
  /// still runs to cache_tokens positions.
  int64_t cache_rows() const noexcept;
  /// Bytes of device memory the model's weights take (all devices): the
  /// prefill plan uses the decode plan's upload wherever both lay the
  /// weights out alike (plan_options::share_weights_with), so usually one
  /// copy of the model (of each device's part of it).
  int64_t weight_bytes() const noexcept;
  /// The plan of one decode step (its layout: used_devices(),
  /// tensor_parallel()); the other step plans share its devices.
  const plan& decode_plan() const noexcept;
  /// The plan of one prefill chunk (generator_options::prefill_chunk
  /// tokens), or nullptr when the prompt goes through the decode plan.
  const plan* prefill_plan() const noexcept;
  /// The plan of a short prompt (generator_options::short_prompt_chunk
  /// tokens), or nullptr without one.
  const plan* short_prompt_plan() const noexcept;
  /// Over a cache of more than decode_step_max_cache_rows (2048) rows the
  /// decode plan keeps its records (the one-kernel step's attention grows
  /// too fast with the rows its mask shows); then a twin of it (and of the
  /// greedy and pipelined step plans) runs the step as one kernel for a
  /// sequence while it holds at most 2048 positions, sharing the weights
  /// and caches. The decode plan's twin, or nullptr without one.
  const plan* short_sequence_decode_plan() const noexcept;
  /// The one-token plans whose output is the greedy token picked on the
  /// device (generator_options::device_greedy): the greedy decode step, then
  /// its pipelined chain's two (generator_options::pipeline_depth > 1);
  /// empty without device_greedy.
  std::vector<const plan*> greedy_decode_plans() const;
  /// Every plan a prompt's pieces take, ascending by tokens a job: the
  /// short prompt plans (generator_options::doubling_prompt_plans), then
  /// the prefill plan; empty when the prompt goes through the decode plan.
  std::vector<const plan*> prompt_plans() const;
  /// Sequences holding a slot now, and sequences waiting for one.
  int active_sequences() const;
  int waiting_sequences() const;
  /// The plans of batched decode steps (generator_options::decode_batch),
  /// ascending by rows a job (2, 4, ... decode_batch); empty without. (With
  /// device_greedy each has a twin that outputs its rows' greedy tokens.)
  std::vector<const plan*> batch_decode_plans() const;
  /// Sequences a state slot holds: decode_batch, or 1 without batching.
  int lanes_per_slot() const noexcept;

  explicit generator(std::shared_ptr<impl> p);

 private:
  std::shared_ptr<impl> impl_;
};

/// The token `s` picks from `logits` with `rng_state` (advanced when sampling).
/// Greedy (temperature 0) is the first maximum; a NaN never wins.
/// `history`: the sequence's tokens so far (prompt and generated), which
/// s.repetition_penalty penalises; ids outside the logits are ignored.
int32_t sample_token(std::span<const float> logits, const sampling_options& s, uint64_t& rng_state,
                     std::span<const int32_t> history = {});

}  // namespace ag
