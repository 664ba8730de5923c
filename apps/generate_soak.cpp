// actorgraph-generate-soak: drives the generation API (actors/generator.hpp)
// as hard as a user could, with faults, and proves that every sequence ends
// exactly once, with the tokens its solo run gives, or with an error that
// names the device and the fault.
//
// Each epoch is one runtime over fresh sim devices (jittered delays, injected
// op errors) with three generators on it, each drawn at random: GPT-2 or
// LLaMA (GQA) of seeded random weights, a layout (one device, 2 stages,
// tensor degree 2, 2 x 2), pipelined greedy steps (pipeline_depth 1..4, also
// across stages), prefill chunks or not, tokens picked on the device or on
// the host, 1..4 cache slots (so most sequences queue for one), a third
// with batched decode steps (decode_batch 2..4; greedy ones pipelined
// where pipeline_depth > 1). Sequences of
// random prompts, lengths and sampling (greedy or seeded top-k) run many at
// once, some with stop ids, some cancelled (from their own token stream,
// right after generate(), or from the soak's thread a little later); a few
// times an epoch a device is killed and later reset while sequences run.
//
// Checks, per sequence: its handle's continuation ran exactly once (counted
// after the runtime is destroyed); it ended within the watchdog; the tokens
// it streamed are the ones it ended with, each once, in order; a sequence
// that ended normally has exactly the tokens and stop reason of its solo run
// (the same generator options one step at a time, on a fault-free runtime of
// the same devices) cut by its max_new_tokens and stop ids; a cancelled one a
// prefix of them; a failed one failed with an injected op error or the death
// of a device of its layout, naming that device, and streamed a prefix.
// With --check-collective-order (on by default) every collective part also
// checks NCCL's pairing rule (gpu/host/collective_sequence.hpp). --layout
// and --decode-batch narrow a run to one shape of generator (the draws
// still happen, so the rest of a seed's run stays the same).
// Anything else counts as wrong. At the end of an epoch every generator has
// no sequence active or waiting. Exit status 1 if anything was lost, hung or
// wrong; 2 for bad flags.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/actorgraph.hpp"
#include "actors/generator.hpp"
#include "apps/common/flags.hpp"
#include "gpu/host/collective_sequence.hpp"
#include "gpu/sim/sim_device.hpp"

namespace {

using clk = std::chrono::steady_clock;

struct options {
  int64_t sequences = 2000;
  std::string devices = "sim:4";
  int epochs = 2;
  int in_flight = 24;
  uint64_t seed = 1;
  bool faults = true;
  double op_error_rate = 3e-4;
  int kills_per_epoch = 2;
  double cancel_rate = 0.25;
  double stop_rate = 0.2;
  double sampled_rate = 0.25;
  double time_scale = 1e-3;
  double jitter = 0.3;
  double watchdog_s = 120;
  // Narrowing a run to one shape of generator (a hazard found in the mix):
  // every generator of every epoch on this layout ("SxT": stages by tensor
  // degree; empty: drawn) and with this decode_batch (-2: drawn). The draws
  // still happen, so the rest of a seed's run stays the same.
  int layout_stages = 0, layout_tp = 0;  // 0: drawn
  int decode_batch = -2;
};

constexpr int max_new_limit = 12;
constexpr int64_t cache_tokens = 16;
constexpr int prompt_count = 8;
constexpr int sampling_count = 3;  // 0: greedy; 1, 2: top-k sampling with seed 1, 2

ag::sampling_options sampling_of(int k) {
  ag::sampling_options s;
  if (k > 0) {
    s.temperature = 0.8f;
    s.top_k = 10;
    s.seed = static_cast<uint64_t>(k);
  }
  return s;
}

// One generator of an epoch, and the solo runs every sequence is checked against.
struct generator_case {
  ag::models::transformer_config model;
  ag::generator_options options;
  std::string name;
  std::shared_ptr<ag::generator> gen;
  std::set<int> devices;  // of its layout
  // solo[prompt][sampling]: the tokens of max_new_limit new tokens and why it ended.
  struct solo_run {
    std::vector<int32_t> tokens;
    ag::stop_reason reason = ag::stop_reason::max_tokens;
  };
  std::vector<std::vector<solo_run>> solo;
};

enum class cancel_mode : uint8_t { none, from_token, at_once, later };

struct sequence_record {
  int gen = 0, prompt = 0, sampling = 0, max_new = 0;
  std::vector<int32_t> stop_ids;
  cancel_mode cancel = cancel_mode::none;
  int64_t cancel_at_token = 0;
  clk::time_point submitted, cancel_after;
  ag::generation handle;
  std::mutex m;  // streamed, stream_ok
  std::vector<int32_t> streamed;
  bool stream_ok = true;  // indices arrived 0, 1, 2, ... each once
  bool streamed_inside_generate = false;
  std::atomic<int> ends{0};
  std::atomic<bool> handle_published{false};
  bool cancelled_later = false;  // the soak's thread only
};

struct counts {
  int64_t sequences = 0, tokens = 0, ok = 0, eos = 0, cache_full = 0, cancelled = 0, failed_op = 0, failed_death = 0;
  int64_t wrong = 0, lost = 0, duplicate = 0, hung = 0, kills = 0, resets = 0, epochs = 0;
  int64_t windowed_generators = 0;  // generators of a model with a sliding window (a ring cache)
  int64_t batched_generators = 0;   // generators with batched decode steps (decode_batch)
  int64_t tokens_batched = 0;       // tokens whose step carried other sequences' tokens too
  int64_t batched_pipelined = 0;    // tokens of those generators whose step read them from the step before's state
};

class soak {
 public:
  explicit soak(options o) : o_(std::move(o)), rng_(o_.seed) {}

  int run() {
    const auto t0 = clk::now();
    int64_t left = o_.sequences;
    for (int e = 0; e < o_.epochs && left > 0; ++e) {
      const int64_t n = e + 1 == o_.epochs ? left : o_.sequences / o_.epochs;
      if (!run_epoch(e, n)) return 1;
      left -= n;
    }
    report(std::chrono::duration<double>(clk::now() - t0).count());
    return (c_.wrong || c_.lost || c_.duplicate || c_.hung) ? 1 : 0;
  }

 private:
  double uni() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  void wrong(const sequence_record& r, const std::string& what) {
    ++c_.wrong;
    if (c_.wrong <= 10)
      std::cerr << "WRONG: generator " << cases_[static_cast<std::size_t>(r.gen)].name << ", prompt " << r.prompt
                << ", sampling " << r.sampling << ", max_new " << r.max_new << ": " << what << "\n";
  }

  // The three generators of an epoch, drawn at random, with their solo runs
  // on `ref` (same devices, no faults, no delays).
  bool make_cases(ag::runtime& rt, ag::runtime& ref, int ndev) {
    cases_.clear();
    struct layout {
      int stages, tp;
    };
    std::vector<layout> layouts{{1, 1}};
    if (ndev >= 2) layouts.insert(layouts.end(), {{2, 1}, {1, 2}});
    if (ndev >= 4) layouts.push_back({2, 2});
    for (int k = 0; k < 3; ++k) {
      generator_case gc;
      auto& m = gc.model;
      m.variant = uni() < 0.5 ? ag::models::model_variant::gpt2 : ag::models::model_variant::llama;
      m.n_layers = 2;
      m.d_model = 32;
      m.n_heads = 4;
      m.n_kv_heads = m.variant == ag::models::model_variant::llama ? 2 : 0;
      m.d_ff = 48;
      m.vocab = 41;
      m.max_positions = m.variant == ag::models::model_variant::gpt2 ? cache_tokens : 0;
      m.seed = rng_() % 1000;
      m.initializer_range = 0.2f;
      // A third of the LLaMAs with a sliding window: their caches are rings
      // (window + chunk - 1 rows) that the sequences go round.
      if (m.variant == ag::models::model_variant::llama && uni() < 1.0 / 3) m.sliding_window = 3 + pick(4);
      layout l = layouts[static_cast<std::size_t>(pick(static_cast<int>(layouts.size())))];
      if (o_.layout_stages > 0) l = {o_.layout_stages, o_.layout_tp};
      auto& go = gc.options;
      go.cache_tokens = cache_tokens;
      go.max_sequences = 1 + pick(4);
      go.pipeline_depth = 1 + pick(4);
      go.pipeline_across_stages = uni() < 0.5;
      go.device_greedy = uni() < 0.8;
      go.prefill_chunk = uni() < 0.5 ? 4 : 0;
      // A third batch their decode steps: 2..4 sequences a slot, a job a
      // step for all of them (its faults fail every sequence in it); a
      // third leave it to the generator (-1: batched on one stage), a third
      // step each sequence alone.
      const double batching = uni();
      go.decode_batch = batching < 1.0 / 3 ? 2 + pick(3) : batching < 2.0 / 3 ? -1 : 0;
      if (o_.decode_batch > -2) go.decode_batch = o_.decode_batch;
      go.plan.pipeline_stages = l.stages;
      go.plan.tensor_parallel = l.tp;
      char name[192];
      std::snprintf(name, sizeof name, "%s %dx%d depth %d%s slots %d%s%s%s%s", ag::models::to_string(m.variant), l.stages,
                    l.tp, go.pipeline_depth, go.pipeline_across_stages ? " (across stages)" : "", go.max_sequences,
                    go.prefill_chunk ? " prefill 4" : "", go.device_greedy ? "" : " host sampling",
                    m.sliding_window ? (" window " + std::to_string(m.sliding_window)).c_str() : "",
                    go.decode_batch < 0   ? " batch auto"
                    : go.decode_batch > 0 ? (" batch " + std::to_string(go.decode_batch)).c_str()
                                          : "");
      gc.name = name;
      auto g = ag::generator::create(rt, m, {}, go);
      if (!g) {
        std::cerr << "actorgraph-generate-soak: " << gc.name << ": " << g.err().to_string() << "\n";
        return false;
      }
      gc.gen = std::move(*g);
      c_.windowed_generators += m.sliding_window > 0;
      c_.batched_generators += gc.gen->lanes_per_slot() > 1;
      for (int d : gc.gen->decode_plan().used_devices()) gc.devices.insert(d);
      ag::generator_options solo_opts = go;
      solo_opts.pipeline_depth = 1;
      solo_opts.max_sequences = 1;
      auto solo_gen = ag::generator::create(ref, m, {}, solo_opts);
      if (!solo_gen) {
        std::cerr << "actorgraph-generate-soak: solo " << gc.name << ": " << solo_gen.err().to_string() << "\n";
        return false;
      }
      gc.solo.resize(prompt_count);
      for (int p = 0; p < prompt_count; ++p)
        for (int s = 0; s < sampling_count; ++s) {
          ag::generate_options go1;
          go1.max_new_tokens = max_new_limit;
          go1.sampling = sampling_of(s);
          auto r = (*solo_gen)->generate(prompts_[static_cast<std::size_t>(p)], go1).wait();
          if (!r) {
            std::cerr << "actorgraph-generate-soak: solo run of " << gc.name << ": " << r.err().to_string() << "\n";
            return false;
          }
          gc.solo[static_cast<std::size_t>(p)].push_back({r->tokens, r->reason});
        }
      cases_.push_back(std::move(gc));
    }
    return true;
  }

  std::shared_ptr<sequence_record> draw() {
    auto r = std::make_shared<sequence_record>();
    r->gen = pick(static_cast<int>(cases_.size()));
    r->prompt = pick(prompt_count);
    r->sampling = uni() < o_.sampled_rate ? 1 + pick(sampling_count - 1) : 0;
    r->max_new = 1 + pick(max_new_limit);
    const auto& solo = cases_[static_cast<std::size_t>(r->gen)].solo[static_cast<std::size_t>(r->prompt)]
                           [static_cast<std::size_t>(r->sampling)];
    if (uni() < o_.stop_rate && !solo.tokens.empty())
      r->stop_ids = {solo.tokens[static_cast<std::size_t>(pick(static_cast<int>(solo.tokens.size())))]};
    if (uni() < o_.cancel_rate) {
      const double u = uni();
      r->cancel = u < 0.4 ? cancel_mode::from_token : u < 0.6 ? cancel_mode::at_once : cancel_mode::later;
      r->cancel_at_token = pick(r->max_new);
    }
    return r;
  }

  void start(const std::shared_ptr<sequence_record>& r) {
    ag::generate_options go;
    go.max_new_tokens = r->max_new;
    go.stop_ids = r->stop_ids;
    go.sampling = sampling_of(r->sampling);
    // The record outlives the sequence: the soak keeps every record until
    // the runtime is destroyed. A raw pointer, so the token stream does not
    // keep its own handle alive.
    sequence_record* rec = r.get();
    go.on_token = [rec, soak_thread = std::this_thread::get_id()](int32_t tok, int64_t index) {
      bool cancel = false;
      {
        std::lock_guard lk(rec->m);
        if (index != static_cast<int64_t>(rec->streamed.size())) rec->stream_ok = false;
        // generate() runs on the soak's thread: a token streamed there was
        // streamed inside it (waiting for the handle below would hang).
        if (std::this_thread::get_id() == soak_thread) rec->streamed_inside_generate = true;
        rec->streamed.push_back(tok);
        cancel = rec->cancel == cancel_mode::from_token && index == rec->cancel_at_token;
      }
      // on_token runs on a runtime thread, never inside generate(): the
      // handle is there (generate() has returned) or comes in an instant.
      if (cancel && !rec->streamed_inside_generate) {
        while (!rec->handle_published.load(std::memory_order_acquire)) std::this_thread::yield();
        rec->handle.cancel();
      }
    };
    r->submitted = clk::now();
    r->cancel_after = r->submitted + std::chrono::microseconds(50 + pick(2000));
    r->handle = cases_[static_cast<std::size_t>(r->gen)].gen->generate(prompts_[static_cast<std::size_t>(r->prompt)], go);
    // The token stream may now read the handle (publication of r->handle).
    r->handle_published.store(true, std::memory_order_release);
    r->handle.then([rec, this](const ag::generation_outcome&) {
      rec->ends.fetch_add(1);
      {
        std::lock_guard lk(done_m_);
        ++ended_;
      }
      done_cv_.notify_one();
    });
    if (r->cancel == cancel_mode::at_once) r->handle.cancel();
  }

  // What the sequence should have ended with, from its solo run.
  void check(sequence_record& r, const std::set<int>& killed) {
    const generator_case& gc = cases_[static_cast<std::size_t>(r.gen)];
    const auto& solo = gc.solo[static_cast<std::size_t>(r.prompt)][static_cast<std::size_t>(r.sampling)];
    const ag::generation_outcome& out = r.handle.wait();
    std::vector<int32_t> streamed;
    bool stream_ok = false, inside = false;
    {
      std::lock_guard lk(r.m);
      streamed = r.streamed;
      stream_ok = r.stream_ok;
      inside = r.streamed_inside_generate;
    }
    if (!stream_ok) wrong(r, "tokens streamed out of order or twice");
    if (inside) wrong(r, "a token streamed on the thread inside generate()");
    auto is_solo_prefix = [&](const std::vector<int32_t>& t) {
      return t.size() <= solo.tokens.size() && std::equal(t.begin(), t.end(), solo.tokens.begin());
    };
    c_.tokens += static_cast<int64_t>(streamed.size());
    if (!out) {
      const ag::error& e = out.err();
      const bool in_layout = gc.devices.count(e.device) > 0;
      if (o_.faults && in_layout && e.code == ag::errc::op_failed && e.message.find("injected fault") != std::string::npos)
        ++c_.failed_op;
      else if (in_layout && e.code == ag::errc::device_failed && killed.count(e.device))
        ++c_.failed_death;
      else
        return wrong(r, "failed with an error no fault explains: " + e.to_string());
      if (!is_solo_prefix(streamed)) wrong(r, "a failed sequence streamed tokens its solo run does not have");
      return;
    }
    const ag::generation_result& res = *out;
    c_.tokens_batched += res.tokens_batched;
    if (gc.options.decode_batch > 1) c_.batched_pipelined += res.tokens_pipelined;
    if (res.tokens != streamed) wrong(r, "the result's tokens are not the ones streamed");
    if (res.reason == ag::stop_reason::cancelled) {
      if (r.cancel == cancel_mode::none) wrong(r, "cancelled, but the soak never cancelled it");
      if (!is_solo_prefix(res.tokens) || static_cast<int>(res.tokens.size()) > r.max_new)
        wrong(r, "a cancelled sequence's tokens are not a prefix of its solo run");
      ++c_.cancelled;
      return;
    }
    // The solo run cut by max_new_tokens and the stop ids.
    std::size_t n = solo.tokens.size();
    ag::stop_reason why = solo.reason;
    // A token that both reaches max_new_tokens and fills the cache ends the
    // sequence as max_tokens (a stop id before either).
    if (static_cast<std::size_t>(r.max_new) <= n) {
      n = static_cast<std::size_t>(r.max_new);
      why = ag::stop_reason::max_tokens;
    }
    for (std::size_t i = 0; i < n; ++i)
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), solo.tokens[i]) != r.stop_ids.end()) {
        n = i + 1;
        why = ag::stop_reason::eos;
        break;
      }
    if (res.tokens.size() != n || !std::equal(res.tokens.begin(), res.tokens.end(), solo.tokens.begin()))
      return wrong(r, "tokens differ from the solo run (" + std::to_string(res.tokens.size()) + " tokens, expected " +
                          std::to_string(n) + ")");
    if (res.reason != why)
      return wrong(r, std::string("ended with ") + ag::to_string(res.reason) + ", its solo run with " + ag::to_string(why));
    ++c_.ok;
    if (why == ag::stop_reason::eos) ++c_.eos;
    if (why == ag::stop_reason::cache_full) ++c_.cache_full;
  }

  bool run_epoch(int epoch, int64_t n) {
    ag::runtime_options ro;
    ro.backend.sim.time_scale = o_.time_scale;
    ro.backend.sim.jitter = o_.jitter;
    ro.backend.sim.seed = o_.seed * 1000 + static_cast<uint64_t>(epoch);
    ag::runtime_options ref_opts;
    ref_opts.backend.sim.zero_delay = true;
    auto ref = ag::runtime::create(o_.devices, ref_opts);
    if (!ref) {
      std::cerr << "actorgraph-generate-soak: " << ref.err().to_string() << "\n";
      return false;
    }
    auto rt_or = ag::runtime::create(o_.devices, ro);
    if (!rt_or) {
      std::cerr << "actorgraph-generate-soak: " << rt_or.err().to_string() << "\n";
      return false;
    }
    auto rt = std::move(*rt_or);
    const int ndev = static_cast<int>(rt->devices().size());
    if (!make_cases(*rt, **ref, ndev)) return false;
    ref->reset();
    if (o_.faults) {
      // Op errors from here on (the generators' uploads are done).
      ag::gpu::fault_config f;
      f.op_error_rate = o_.op_error_rate;
      for (int d = 0; d < ndev; ++d)
        if (auto* s = dynamic_cast<ag::gpu::sim::sim_device*>(rt->device(d).get())) s->set_faults(f);
    }
    std::vector<std::shared_ptr<sequence_record>> all, flight;
    std::set<int> killed;
    int dead = -1, kills_done = 0;
    const int kills = o_.faults ? o_.kills_per_epoch : 0;
    int64_t started = 0, retired = 0, next_kill = kills ? n / (kills + 1) : -1, revive_at = -1;
    while (retired < n) {
      while (static_cast<int>(flight.size()) < o_.in_flight && started < n) {
        auto r = draw();
        start(r);
        all.push_back(r);
        flight.push_back(r);
        ++started;
      }
      {
        std::unique_lock lk(done_m_);
        done_cv_.wait_for(lk, std::chrono::microseconds(500), [&] { return ended_ > 0; });
        ended_ = 0;
      }
      const auto now = clk::now();
      for (auto it = flight.begin(); it != flight.end();) {
        sequence_record& r = **it;
        if (r.cancel == cancel_mode::later && !r.cancelled_later && now >= r.cancel_after) {
          r.handle.cancel();
          r.cancelled_later = true;
        }
        if (r.ends.load() > 0) {
          check(r, killed);
          it = flight.erase(it);
          ++retired;
          continue;
        }
        if (now - r.submitted > std::chrono::duration<double>(o_.watchdog_s)) {
          ++c_.hung;
          std::cerr << "HUNG: generator " << cases_[static_cast<std::size_t>(r.gen)].name << ", prompt " << r.prompt
                    << ": no end after " << o_.watchdog_s << " s\n";
          it = flight.erase(it);
          ++retired;
          continue;
        }
        ++it;
      }
      // A device dies with sequences running, and comes back a while later.
      if (dead < 0 && next_kill >= 0 && retired >= next_kill) {
        dead = pick(ndev);
        if (auto* s = dynamic_cast<ag::gpu::sim::sim_device*>(rt->device(dead).get())) {
          s->kill("pulled by actorgraph-generate-soak");
          killed.insert(dead);
          ++c_.kills;
        }
        ++kills_done;
        revive_at = retired + std::max<int64_t>(1, n / (4 * (kills + 1)));
        next_kill = kills_done < kills ? next_kill + n / (kills + 1) : -1;
      }
      if (dead >= 0 && retired >= revive_at) {
        if (ag::error e = rt->reset_device(dead)) {
          std::cerr << "actorgraph-generate-soak: reset_device(" << dead << "): " << e.to_string() << "\n";
          return false;
        }
        ++c_.resets;
        dead = -1;
      }
    }
    for (const auto& gc : cases_)
      if (gc.gen->active_sequences() != 0 || gc.gen->waiting_sequences() != 0) {
        ++c_.wrong;
        std::cerr << "WRONG: generator " << gc.name << " still has " << gc.gen->active_sequences() << " active and "
                  << gc.gen->waiting_sequences() << " waiting sequences after every sequence ended\n";
      }
    cases_.clear();
    rt.reset();  // waits for every job: every continuation has run by now
    for (const auto& r : all) {
      const int k = r->ends.load();
      if (k == 0) ++c_.lost;
      if (k > 1) ++c_.duplicate;
    }
    c_.sequences += static_cast<int64_t>(all.size());
    ++c_.epochs;
    return true;
  }

  void report(double secs) {
    std::printf("%-34s %12s\n", "sequences", "count");
    const std::pair<const char*, int64_t> rows[] = {
        {"ended as their solo run", c_.ok},      {"  of which at a stop id", c_.eos},
        {"  of which with a full cache", c_.cache_full}, {"cancelled (a prefix)", c_.cancelled},
        {"failed: injected op error", c_.failed_op}, {"failed: device killed", c_.failed_death},
        {"wrong", c_.wrong},                     {"lost (no end)", c_.lost},
        {"ended twice", c_.duplicate},           {"hung", c_.hung}};
    for (const auto& [name, v] : rows) std::printf("%-34s %12" PRId64 "\n", name, v);
    std::printf("epochs: %" PRId64 ", devices %s, %" PRId64 " kills and %" PRId64 " resets, faults %s, %" PRId64
                " of the generators with a sliding window, %" PRId64 " with batched decode steps (%" PRId64
                " tokens batched; %" PRId64 " of their tokens pipelined)\n",
                c_.epochs, o_.devices.c_str(), c_.kills, c_.resets, o_.faults ? "on" : "off", c_.windowed_generators,
                c_.batched_generators, c_.tokens_batched, c_.batched_pipelined);
    std::printf("generate_soak_sequences: %" PRId64 "\n", c_.sequences);
    std::printf("generate_soak_tokens: %" PRId64 "\n", c_.tokens);
    std::printf("generate_soak_failed_by_faults: %" PRId64 "\n", c_.failed_op + c_.failed_death);
    std::printf("generate_soak_wrong: %" PRId64 "\n", c_.wrong);
    std::printf("generate_soak_lost: %" PRId64 "\n", c_.lost + c_.duplicate);
    std::printf("generate_soak_hung: %" PRId64 "\n", c_.hung);
    std::printf("generate_soak_seconds: %.1f\n", secs);
  }

  options o_;
  std::mt19937_64 rng_;
  const std::vector<std::vector<int32_t>> prompts_{{1, 2, 3}, {7, 7},    {40, 0, 13, 2}, {5},
                                                   {9, 8, 7, 6, 5}, {11, 22}, {3, 3, 3},      {2, 4, 6, 8, 10, 12, 14, 16, 18}};
  std::vector<generator_case> cases_;
  std::mutex done_m_;
  std::condition_variable done_cv_;
  int64_t ended_ = 0;  // under done_m_: sequences ended since the soak last looked
  counts c_;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  ag::apps::flags app("actorgraph-generate-soak",
                      "Soak test of generation: many sequences over random generators and layouts on sim devices, "
                      "with cancels, stop ids, injected op errors and killed devices; every sequence must end "
                      "exactly once, as its solo run or with an error naming the device and fault.");
  app.add_option("--sequences", o.sequences, "sequences in all")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--devices", o.devices, "sim device spec (sim:N; 4 allows every layout)");
  app.add_option("--epochs", o.epochs, "runtimes one after the other, each with three fresh generators")
      ->check(CLI::Range(1, 100000));
  app.add_option("--in-flight", o.in_flight, "sequences the soak keeps running")->check(CLI::Range(1, 100000));
  app.add_option("--seed", o.seed, "seed of every random choice");
  bool check_order = true;
  app.add_option("--check-collective-order", check_order,
                 "host devices check NCCL's pairing rule at every collective part (gpu/host/collective_sequence.hpp): "
                 "a broken order fails the part, naming both (on/off)");
  app.add_option("--faults", o.faults, "inject op errors and kill devices (on/off)");
  app.add_option("--op-error-rate", o.op_error_rate, "injected op errors per op")->check(CLI::Range(0.0, 1.0));
  app.add_option("--kills", o.kills_per_epoch, "devices killed (and later reset) per epoch")->check(CLI::Range(0, 1000));
  app.add_option("--cancel-rate", o.cancel_rate, "share of sequences cancelled")->check(CLI::Range(0.0, 1.0));
  app.add_option("--stop-rate", o.stop_rate, "share of sequences given a stop id")->check(CLI::Range(0.0, 1.0));
  app.add_option("--sampled-rate", o.sampled_rate, "share of sequences sampled (top-k, seeded) instead of greedy")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--time-scale", o.time_scale, "sim wall seconds per simulated second")->check(CLI::Range(0.0, 10.0));
  app.add_option("--jitter", o.jitter, "sim lognormal jitter (relative stddev)")->check(CLI::Range(0.0, 10.0));
  app.add_option("--watchdog", o.watchdog_s, "seconds after which an unfinished sequence counts as hung")
      ->check(CLI::Range(0.1, 3600.0));
  std::string layout;
  app.add_option("--layout", layout,
                 "every generator on this layout, SxT: pipeline stages by tensor degree (default: drawn per generator)");
  app.add_option("--decode-batch", o.decode_batch,
                 "every generator with this decode_batch (-1: automatic, 0: none, 2..: lanes; default: drawn)")
      ->check(CLI::Range(-1, 64));
  if (auto st = ag::apps::parse_flags(app, argc, argv)) return *st;
  ag::gpu::host::collective_sequence::checking().store(check_order);
  if (!layout.empty()) {
    char x = 0, extra = 0;
    const int got = std::sscanf(layout.c_str(), "%d%c%d%c", &o.layout_stages, &x, &o.layout_tp, &extra);
    const int ndev = std::atoi(o.devices.c_str() + (o.devices.rfind("sim:", 0) == 0 ? 4 : 0));
    if (got != 3 || x != 'x' || o.layout_stages < 1 || o.layout_tp < 1 || o.layout_stages * o.layout_tp > ndev) {
      std::cerr << "actorgraph-generate-soak: --layout must be SxT (stages x tensor degree) with S*T at most the "
                   "devices of --devices ("
                << o.devices << "), got '" << layout << "'\n";
      return ag::apps::bad_flags_status;
    }
  }
  if (o.devices.rfind("sim:", 0) != 0) {
    std::cerr << "actorgraph-generate-soak: --devices must be sim devices (sim:N), got '" << o.devices << "'\n";
    return ag::apps::bad_flags_status;
  }
  return soak(o).run();
}
