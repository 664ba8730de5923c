// State that outlives a job (op_kind::store_rows, e.g. a KV cache): kept on
// the device that computes it, one copy per state slot; a job names its slot
// and sees what the slot's previous job stored. Checked against the reference
// evaluator run over one reference_state per slot, on sim and cpu, with a
// pipeline that copies the state to the next stage, with graph replay, with
// two plans sharing one state (and one weight upload), with jobs of one slot
// taking turns in submission order, with a job on one stream passing its
// slot on once issued; the planner's memory accounting and the submit-time
// errors; and the generator's pipelined greedy decoding under real threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "actors/actorgraph.hpp"
#include "actors/generator.hpp"
#include "gpu/sim/sim_device.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

constexpr int64_t H = 2, D = 4, C = 8;

ag::runtime_options fast_sim() {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-2;
  o.backend.sim.jitter = 0.2;
  return o;
}

/// rows [1, H, S, D] f32 and positions i32 [S] -> store_rows (capacity C,
/// axis 2) -> out = state x w [1, H, C, 5] and out2 = 2 * state. Layer 0 holds
/// the store, layer 1 the readers, so a 2-stage pipeline copies the state.
ag::graph state_graph(int64_t S, uint64_t weight_seed = 7) {
  ag::graph_builder b;
  b.set_layer(0);
  auto rows = b.input("rows", ag::dtype::f32, {1, H, S, D});
  auto pos = b.input("positions", ag::dtype::i32, {S});
  auto st = b.store_rows(rows, pos, 2, C, "cache");
  b.set_layer(1);
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {D, 5}, weight_seed, 1.0f));
  b.output(b.matmul(st, w, false, false, "out"));
  b.output(b.scale(st, 2.0f, "out2"));
  auto g = std::move(b).build();
  EXPECT_TRUE(g.has_value()) << g.err().to_string();
  return std::move(*g);
}

std::vector<ag::host_tensor> step_inputs(int64_t S, std::vector<int32_t> positions, uint64_t seed) {
  return {ag::host_tensor::random_normal(ag::dtype::f32, {1, H, S, D}, seed, 1.0f),
          ag::host_tensor::from_ints({S}, std::move(positions))};
}

ag::submit_options slot(int s) {
  ag::submit_options o;
  o.state_slot = s;
  return o;
}

void expect_equal(const std::vector<ag::host_tensor>& got, const std::vector<ag::host_tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto c = ag::compare(got[i], want[i], 1e-4, 1e-4);
    EXPECT_TRUE(c.ok) << what << " output " << i << ": " << c.message;
  }
}

// Jobs on slots 0 and 1, interleaved; positions outside [0, C) store nothing.
void run_slots(const std::string& spec, ag::plan_options po) {
  SCOPED_TRACE(spec + ", stages " + std::to_string(po.pipeline_stages) + ", replay " +
               std::to_string(static_cast<int>(po.graph_replay)));
  auto rt = ag::runtime::create(spec, fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const ag::graph g = state_graph(3);
  po.state_slots = 2;
  auto p = (*rt)->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  std::map<int, ag::reference_state> ref;  // by slot
  const struct {
    int slot;
    std::vector<int32_t> pos;
  } steps[] = {{0, {0, 1, 2}}, {1, {5, 6, 7}}, {0, {3, -1, 9}}, {1, {0, 1, 2}}, {0, {4, 5, 6}}, {0, {7, 0, 1}}};
  uint64_t seed = 100;
  for (const auto& s : steps) {
    const auto in = step_inputs(3, s.pos, seed++);
    ag::job j = (*rt)->submit(*p, in, slot(s.slot));
    ASSERT_TRUE(j.wait_for(30s)) << "job hung";
    const ag::job_result& r = j.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    auto want = ag::evaluate_reference(g, in, ref[s.slot]);
    ASSERT_TRUE(want.has_value()) << want.err().to_string();
    expect_equal(*r, *want, "slot " + std::to_string(s.slot) + " job " + std::to_string(seed));
  }
}

TEST(State, EachSlotKeepsItsRowsAcrossJobsOnSimAndCpu) {
  run_slots("sim:1", {});
  run_slots("cpu:1", {});
}

TEST(State, APipelineCopiesTheStateToTheStageThatReadsIt) {
  ag::plan_options po;
  po.pipeline_stages = 2;
  run_slots("sim:2", po);
  run_slots("cpu:2", po);
}

// A sim:2 runtime with `ro`, and state_graph(3) compiled on it as 2 stages
// with 2 state slots.
void two_stage_state_plan(const ag::runtime_options& ro, std::unique_ptr<ag::runtime>& rt,
                          std::shared_ptr<const ag::plan>& p) {
  auto created = ag::runtime::create("sim:2", ro);
  ASSERT_TRUE(created.has_value()) << created.err().to_string();
  rt = std::move(*created);
  ag::plan_options po;
  po.pipeline_stages = 2;
  po.state_slots = 2;
  auto compiled = rt->compile(state_graph(3), po);
  ASSERT_TRUE(compiled.has_value()) << compiled.err().to_string();
  p = std::move(*compiled);
}

// Jobs submitted all at once on two slots of a 2-stage plan: each waits for
// its slot's turn, and on its turn takes the arenas itself when they are
// free or asks the devices for them when another slot's job holds them (one
// arena per device forces both). Every job equals the reference evaluated
// slot by slot in submission order.
TEST(State, JobsQueuedForTheirSlotRunInOrderWhetherTheArenasAreFreeOnTheirTurnOrNot) {
  for (int arenas : {1, 4}) {
    SCOPED_TRACE(std::to_string(arenas) + " arena(s) per device");
    ag::runtime_options ro = fast_sim();
    ro.arenas_per_device = arenas;
    ro.backend.sim.jitter = 0.5;
    std::unique_ptr<ag::runtime> rt;
    std::shared_ptr<const ag::plan> p;
    ASSERT_NO_FATAL_FAILURE(two_stage_state_plan(ro, rt, p));
    const ag::graph g = state_graph(3);
    std::map<int, ag::reference_state> ref;
    std::vector<std::vector<ag::host_tensor>> want;
    std::vector<ag::job> jobs;
    for (int k = 0; k < 24; ++k) {
      const int s = (k * 7 / 3) % 2;
      const auto at = [&](int row) { return static_cast<int32_t>(row % C); };
      const auto in = step_inputs(3, {at(k), at(k + 3), -1}, 500 + static_cast<uint64_t>(k));
      auto w = ag::evaluate_reference(g, in, ref[s]);
      ASSERT_TRUE(w.has_value()) << w.err().to_string();
      want.push_back(std::move(*w));
      jobs.push_back(rt->submit(p, in, slot(s)));
    }
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      ASSERT_TRUE(jobs[k].wait_for(30s)) << "job " << k << " hung";
      const ag::job_result& r = jobs[k].wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      expect_equal(*r, want[k], "job " + std::to_string(k));
    }
  }
}

TEST(State, ReplayedSegmentsStoreIntoTheSlotOfEachJob) {
  ag::plan_options po;
  po.graph_replay = ag::graph_replay_mode::on;
  run_slots("sim:1", po);
}

TEST(State, TwoPlansSharingStateSeeEachOthersRows) {
  auto rt = ag::runtime::create("sim:2", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const ag::graph g3 = state_graph(3), g1 = state_graph(1);
  ag::plan_options po;
  po.pipeline_stages = 2;
  po.state_slots = 3;
  auto p3 = (*rt)->compile(g3, po);
  ASSERT_TRUE(p3.has_value()) << p3.err().to_string();
  ag::plan_options po1 = po;
  po1.state_slots = 1;  // taken from the other plan
  po1.share_state_with = *p3;
  auto p1 = (*rt)->compile(g1, po1);
  ASSERT_TRUE(p1.has_value()) << p1.err().to_string();
  EXPECT_EQ((*p1)->options().state_slots, 3);
  // Same device and offset for the state in both plans.
  const ag::node_id c3 = (*p3)->source().find("cache"), c1 = (*p1)->source().find("cache");
  const int dev = (*p3)->placement()[static_cast<std::size_t>(c3)];
  EXPECT_EQ((*p1)->placement()[static_cast<std::size_t>(c1)], dev);
  auto l3 = (*p3)->locate(c3, dev), l1 = (*p1)->locate(c1, dev);
  ASSERT_TRUE(l3.has_value() && l1.has_value());
  EXPECT_EQ(l3->where, ag::region::state);
  EXPECT_EQ(l1->where, ag::region::state);
  EXPECT_EQ(l3->byte_offset, l1->byte_offset);
  // A prefill-like job of 3 rows, then one-row jobs, on slot 2; the
  // reference keeps one state for both graphs (same node name).
  ag::reference_state ref;
  const struct {
    bool three;
    std::vector<int32_t> pos;
  } steps[] = {{true, {0, 1, 2}}, {false, {3}}, {false, {4}}, {true, {5, 6, -1}}, {false, {7}}};
  uint64_t seed = 300;
  for (const auto& s : steps) {
    const ag::graph& g = s.three ? g3 : g1;
    const auto in = step_inputs(s.three ? 3 : 1, s.pos, seed++);
    ag::job j = (*rt)->submit(s.three ? *p3 : *p1, in, slot(2));
    ASSERT_TRUE(j.wait_for(30s)) << "job hung";
    ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
    auto want = ag::evaluate_reference(g, in, ref);
    ASSERT_TRUE(want.has_value()) << want.err().to_string();
    expect_equal(*j.wait(), *want, "shared state job " + std::to_string(seed));
  }

  // A state the other plan lacks is refused at compile time, naming it.
  ag::graph_builder b;
  auto rows = b.input("rows", ag::dtype::f32, {1, H, 1, D});
  auto pos = b.input("positions", ag::dtype::i32, {1});
  b.output(b.scale(b.store_rows(rows, pos, 2, C, "other_cache"), 1.0f, "o"));
  auto lone = std::move(b).build();
  ASSERT_TRUE(lone.has_value());
  auto bad = (*rt)->compile(*lone, po1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.err().code, ag::errc::invalid_argument);
  EXPECT_NE(bad.err().message.find("'other_cache' is not in the other plan"), std::string::npos) << bad.err().message;
}

// A second plan of the same model uses the first plan's weight upload where
// both lay the weights out alike (the generator's prefill and decode plans);
// other values under the same name get their own upload. Both run right.
TEST(State, APlanUsesAnotherPlansUploadOfTheSameWeights) {
  auto rt = ag::runtime::create("sim:1", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const ag::graph g3 = state_graph(3), g1 = state_graph(1), other_w = state_graph(1, 99);
  auto p3 = (*rt)->compile(g3, {});
  ASSERT_TRUE(p3.has_value()) << p3.err().to_string();
  ag::plan_options po;
  po.share_weights_with = *p3;
  auto p1 = (*rt)->compile(g1, po);
  ASSERT_TRUE(p1.has_value()) << p1.err().to_string();
  auto p_other = (*rt)->compile(other_w, po);
  ASSERT_TRUE(p_other.has_value()) << p_other.err().to_string();
  EXPECT_FALSE((*p3)->memory()[0].weights_shared);
  EXPECT_TRUE((*p1)->memory()[0].weights_shared);
  EXPECT_FALSE((*p_other)->memory()[0].weights_shared);
  EXPECT_NE((*p1)->describe().find("another plan's upload, shared"), std::string::npos) << (*p1)->describe();
  // Each plan keeps its own state (no share_state_with): slot 0 of each is fresh.
  for (const auto& [p, g] : {std::pair{*p1, &g1}, std::pair{*p_other, &other_w}}) {
    const auto in = step_inputs(1, {0}, 400);
    ag::job j = (*rt)->submit(p, in, slot(0));
    ASSERT_TRUE(j.wait_for(30s));
    ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
    ag::reference_state fresh;
    auto want = ag::evaluate_reference(*g, in, fresh);
    ASSERT_TRUE(want.has_value());
    expect_equal(*j.wait(), *want, p == *p1 ? "the shared upload" : "its own upload");
  }
}

TEST(State, SubmitNamesASlotOfAPlanWithStateOrFailsSayingWhy) {
  auto rt = ag::runtime::create("sim:1", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const ag::graph g = state_graph(3);
  ag::plan_options po;
  po.state_slots = 2;
  auto p = (*rt)->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  const auto in = step_inputs(3, {0, 1, 2}, 1);
  auto fails_with = [&](ag::job j, const std::string& text) {
    ASSERT_TRUE(j.wait_for(30s));
    ASSERT_FALSE(j.wait().has_value()) << "expected: " << text;
    EXPECT_EQ(j.wait().err().code, ag::errc::invalid_argument);
    EXPECT_NE(j.wait().err().message.find(text), std::string::npos) << j.wait().err().message;
  };
  fails_with((*rt)->submit(*p, in), "state_slot must be 0..1, got -1");
  fails_with((*rt)->submit(*p, in, slot(2)), "state_slot must be 0..1, got 2");
  // A continuation may submit the slot's next job (the generator's pattern).
  ag::job first = (*rt)->submit(*p, in, slot(0));
  std::promise<ag::job> next_p;
  first.then([&](const ag::job_result&) { next_p.set_value((*rt)->submit(*p, step_inputs(3, {3, 4, 5}, 2), slot(0))); });
  ASSERT_TRUE(first.wait_for(30s));
  ASSERT_TRUE(first.wait().has_value()) << first.wait().err().to_string();
  ag::job next = next_p.get_future().get();
  ASSERT_TRUE(next.wait_for(30s));
  EXPECT_TRUE(next.wait().has_value()) << next.wait().err().to_string();
  // A plan without state takes no slot.
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {2, 2});
  b.output(b.scale(x, 2.0f, "y"));
  auto plain = (*rt)->compile(*std::move(b).build(), {});
  ASSERT_TRUE(plain.has_value());
  const std::vector<ag::host_tensor> xin{ag::host_tensor::random_normal(ag::dtype::f32, {2, 2}, 3, 1.0f)};
  fails_with((*rt)->submit(*plain, xin, slot(0)), "the plan keeps no state");
  ag::job ok = (*rt)->submit(*plain, xin);
  ASSERT_TRUE(ok.wait_for(30s));
  EXPECT_TRUE(ok.wait().has_value());
}

// Jobs submitted at once on one slot take turns in submission order, each
// seeing the rows the previous one stored (no job may overlap another of its
// slot); a job cancelled while it waits leaves the queue; other slots run
// alongside. Real threads, jittered sim delays.
TEST(State, JobsOfOneSlotTakeTurnsInSubmissionOrder) {
  ag::runtime_options o = fast_sim();
  o.backend.sim.time_scale = 20.0;  // a job runs for about a ms of wall time: the later ones really wait
  std::unique_ptr<ag::runtime> rt;
  std::shared_ptr<const ag::plan> p;
  ASSERT_NO_FATAL_FAILURE(two_stage_state_plan(o, rt, p));
  const ag::graph g = state_graph(3);
  std::map<int, ag::reference_state> ref;  // by slot; the slots keep their rows from round to round
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::vector<ag::host_tensor>> ins;
    std::vector<ag::job> jobs;
    std::vector<int> slots;
    const int n = 12;
    for (int k = 0; k < n; ++k) {
      // Slot 0 gets 2 of every 3 jobs; each stores 3 rows where the last left off.
      const int s = k % 3 == 2 ? 1 : 0;
      const int32_t at = static_cast<int32_t>((3 * k) % static_cast<int>(C));
      ins.push_back(step_inputs(3, {at, static_cast<int32_t>((at + 1) % C), static_cast<int32_t>((at + 2) % C)},
                                static_cast<uint64_t>(1000 * round + k)));
      jobs.push_back(rt->submit(p, ins.back(), slot(s)));
      slots.push_back(s);
    }
    // One job waiting on slot 0 is cancelled: it must leave the queue, and
    // the jobs after it still run (the reference skips it).
    const int cancelled = n - 3;  // slot 0 (k % 3 == 0)
    jobs[static_cast<std::size_t>(cancelled)].cancel();
    for (int k = 0; k < n; ++k) {
      ASSERT_TRUE(jobs[static_cast<std::size_t>(k)].wait_for(30s)) << "job " << k << " hung";
      const ag::job_result& r = jobs[static_cast<std::size_t>(k)].wait();
      if (k == cancelled) {
        // It may have had its turn and finished before the cancel arrived.
        if (!r.has_value()) {
          EXPECT_EQ(r.err().code, ag::errc::cancelled) << r.err().to_string();
          continue;
        }
      }
      ASSERT_TRUE(r.has_value()) << "job " << k << ": " << r.err().to_string();
      auto want = ag::evaluate_reference(g, ins[static_cast<std::size_t>(k)], ref[slots[static_cast<std::size_t>(k)]]);
      ASSERT_TRUE(want.has_value());
      expect_equal(*r, *want, "job " + std::to_string(k) + " on slot " + std::to_string(slots[static_cast<std::size_t>(k)]));
    }
  }
}

// A plan whose every step runs on one stream (single_lane_of) passes its
// slot's turn on as soon as a job is issued: the next job of the slot is
// queued behind it on the device, not after the host saw it end. A plan on
// copy queues sharing the state waits for the jobs before it to end. Every
// job still sees exactly the rows of the ones before it.
TEST(State, AJobOnOneStreamPassesItsSlotOnOnceIssued) {
  ag::runtime_options o = fast_sim();
  // A job takes about 10 ms of wall time: far longer than issuing the next
  // one, also under the sanitizers on a loaded 2-core machine (at 100, about
  // 1 ms, an ASan run once saw the host take 0.4 ms longer than a job).
  o.backend.sim.time_scale = 1000.0;
  o.backend.sim.jitter = 0;
  o.trace = true;
  auto rt = ag::runtime::create("sim:1", o);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const ag::graph g = state_graph(3);
  ag::plan_options po;
  po.state_slots = 2;
  po.lanes_per_device = 1;
  auto one = (*rt)->compile(g, po);
  ASSERT_TRUE(one.has_value()) << one.err().to_string();
  ASSERT_TRUE(ag::single_lane_of(**one).has_value()) << (*one)->describe();
  ag::plan_options copies = po;  // the same graph with its host copies on the copy queues
  copies.inline_small_copies = false;
  copies.share_state_with = *one;
  auto queued = (*rt)->compile(g, copies);
  ASSERT_TRUE(queued.has_value()) << queued.err().to_string();
  ASSERT_FALSE(ag::single_lane_of(**queued).has_value());
  ag::reference_state ref;  // slot 0's rows, as the jobs leave them
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    (void)(*rt)->take_trace();
    const std::vector<std::vector<int32_t>> pos{{0, 1, 2}, {3, 4, 5}, {6, 7, 1}, {2, 0, 4}};
    std::vector<std::vector<ag::host_tensor>> ins;
    std::vector<ag::job> jobs;
    for (std::size_t k = 0; k < pos.size(); ++k) {
      ins.push_back(step_inputs(3, pos[k], 10 * round + k));
      // Jobs 0-2 on one stream; job 3 on the copy queues, after them.
      jobs.push_back((*rt)->submit(k < 3 ? *one : *queued, ins.back(), slot(0)));
    }
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      ASSERT_TRUE(jobs[k].wait_for(30s)) << "job " << k << " hung";
      ASSERT_TRUE(jobs[k].wait().has_value()) << jobs[k].wait().err().to_string();
      auto want = ag::evaluate_reference(g, ins[k], ref);
      ASSERT_TRUE(want.has_value());
      expect_equal(*jobs[k].wait(), *want, "job " + std::to_string(k));
    }
    const ag::trace t = (*rt)->take_trace();
    // The first round is the plan's first jobs: its actors start, its
    // segment is captured, and under the sanitizers that may take longer
    // than a job. The later rounds are timed.
    if (round == 0) continue;
    std::map<uint64_t, std::pair<int64_t, int64_t>> span;  // job -> first enqueue, last end
    for (const auto& r : t.records) {
      auto [it, fresh] = span.try_emplace(r.job, r.enqueue_ns, r.end_ns);
      if (!fresh) {
        it->second.first = std::min(it->second.first, r.enqueue_ns);
        it->second.second = std::max(it->second.second, r.end_ns);
      }
    }
    std::vector<std::pair<int64_t, int64_t>> by_job;
    for (const auto& j : jobs) by_job.push_back(span.at(j.id()));
    for (int k = 1; k < 3; ++k)
      EXPECT_LT(by_job[k].first, by_job[k - 1].second)
          << "job " << k << " was queued only after job " << k - 1 << " ended: the slot waited for the host";
    EXPECT_GE(by_job[3].first, by_job[2].second) << "the copy-queue plan's job started before the slot's jobs ended";
  }
}

// Pipelined greedy decoding (generator_options::pipeline_depth) with many
// sequences on one device, under real threads with jittered sim delays:
// steps of a sequence queued behind each other, sequences sharing the two
// chain plans, slots handed to the next sequence while a dropped step of the
// last one may still run. Each sequence equals its solo run one step at a
// time; one stops at an end-of-sequence id with steps in flight, one is
// cancelled. Seeded random weights (no checkpoint), so that the actor tests
// (and ThreadSanitizer's run of them) cover the generator's threads.
ag::models::transformer_config tiny_generator_model(ag::models::model_variant v) {
  ag::models::transformer_config c;
  c.variant = v;
  c.n_layers = 2;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = v == ag::models::model_variant::llama ? 2 : 0;
  c.d_ff = 48;
  c.vocab = 41;
  c.max_positions = v == ag::models::model_variant::gpt2 ? 16 : 0;
  c.seed = 23;
  c.initializer_range = 0.2f;
  return c;
}

std::vector<int32_t> generate_alone(ag::runtime& rt, const ag::models::transformer_config& cfg,
                                    const std::vector<int32_t>& prompt, int max_new) {
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 1;
  go.pipeline_depth = 1;  // one step at a time: the host feeds every token
  auto gen = ag::generator::create(rt, cfg, {}, go);
  EXPECT_TRUE(gen.has_value()) << gen.err().to_string();
  if (!gen) return {};
  ag::generate_options o;
  o.max_new_tokens = max_new;
  auto r = (*gen)->generate(prompt, o).wait();
  EXPECT_TRUE(r.has_value()) << r.err().to_string();
  if (!r) return {};
  EXPECT_EQ(r->tokens_pipelined, 0);
  return r->tokens;
}

TEST(GeneratePipelined, ManySequencesOnOneDeviceEqualTheirSoloRunsOneStepAtATime) {
  for (auto variant : {ag::models::model_variant::gpt2, ag::models::model_variant::llama}) {
    const auto cfg = tiny_generator_model(variant);
    SCOPED_TRACE(to_string(variant));
    ag::runtime_options ro = fast_sim();
    ro.backend.sim.jitter = 0.3;
    auto rt = ag::runtime::create("sim:1", ro);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    ag::generator_options go;
    go.cache_tokens = 16;
    go.max_sequences = 3;  // 7 sequences: four wait for a slot
    go.pipeline_depth = 3;
    go.decode_batch = 0;  // a slot a sequence: each pipelines on its own
    auto gen = ag::generator::create(**rt, cfg, {}, go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {7, 7}, {40, 0, 13, 2}, {5},
                                                    {9, 8, 7, 6, 5}, {11, 22}, {3, 3, 3}};
    std::vector<std::vector<int32_t>> solo;
    for (const auto& p : prompts) solo.push_back(generate_alone(**rt, cfg, p, 8));
    const std::size_t cancelled = 2, stopped = 4;
    ASSERT_EQ(solo[stopped].size(), 8u);
    std::vector<ag::generation> hs;
    // The cancelled sequence is cancelled from its own first token, so that
    // it is cancelled mid-way however fast it runs (cancelling it after the
    // loop let it finish all its tokens first on a loaded machine).
    std::promise<ag::generation> cancelled_handle;
    std::shared_future<ag::generation> cancel_it = cancelled_handle.get_future().share();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      ag::generate_options o;
      o.max_new_tokens = 8;
      if (i == stopped) o.stop_ids = {solo[stopped][2]};  // ends at its third token, steps queued behind
      if (i == cancelled)
        o.on_token = [cancel_it](int32_t, int64_t index) {
          if (index == 0) cancel_it.get().cancel();  // waits the instant until generate() returned
        };
      hs.push_back((*gen)->generate(prompts[i], o));
      if (i == cancelled) cancelled_handle.set_value(hs.back());
    }
    for (std::size_t i = 0; i < hs.size(); ++i) {
      ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
      const auto& r = hs[i].wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      if (i == cancelled) {
        EXPECT_EQ(r->reason, ag::stop_reason::cancelled);
        EXPECT_LT(r->tokens.size(), 8u);
        continue;
      }
      if (i == stopped) {
        EXPECT_EQ(r->reason, ag::stop_reason::eos);
        const auto first = std::find(solo[i].begin(), solo[i].end(), solo[i][2]) - solo[i].begin() + 1;
        EXPECT_EQ(r->tokens, std::vector<int32_t>(solo[i].begin(), solo[i].begin() + first));
        continue;
      }
      EXPECT_EQ(r->reason, ag::stop_reason::max_tokens);
      EXPECT_EQ(r->tokens, solo[i]) << "sequence " << i << " differs from its solo run";
      EXPECT_EQ(r->tokens_pipelined, 7) << "sequence " << i;
    }
    EXPECT_EQ((*gen)->active_sequences(), 0);
    EXPECT_EQ((*gen)->waiting_sequences(), 0);
    // The slots work on after the dropped steps: a fresh round equals solo again.
    for (std::size_t i = 0; i < 3; ++i) {
      ag::generate_options o;
      o.max_new_tokens = 8;
      auto r = (*gen)->generate(prompts[i], o).wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      EXPECT_EQ(r->tokens, solo[i]) << "second round, sequence " << i;
    }
  }
}

// generate() returns at once and streams nothing itself: on_token runs on
// runtime threads, never on the thread inside generate(), however fast the
// steps end. A step that ended before the generator chained its
// continuation used to run it there (job::then runs at once on a ready
// job), so a sequence's first tokens could stream inside generate(): an
// on_token that waited for generate()'s handle (to cancel it) then waited
// for itself (CI hung in ManySequencesOnOneDevice... on a loaded machine).
// Steps of microseconds and sixteen in flight make that window wide.
TEST(GeneratePipelined, NoTokenIsStreamedOnTheThreadInsideGenerate) {
  const auto cfg = tiny_generator_model(ag::models::model_variant::llama);
  ag::runtime_options ro = fast_sim();
  ro.backend.sim.time_scale = 1e-4;
  ro.backend.sim.jitter = 0;
  auto rt = ag::runtime::create("sim:1", ro);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  // A slot a sequence, and slots of 8 lanes (the automatic choice on one device).
  for (auto [depth, batch] : {std::pair{1, 0}, std::pair{16, 0}, std::pair{1, -1}, std::pair{16, -1}}) {
    SCOPED_TRACE("pipeline_depth " + std::to_string(depth) + ", decode_batch " + std::to_string(batch));
    ag::generator_options go;
    go.cache_tokens = 16;
    go.max_sequences = 24;  // every sequence starts inside its generate()
    go.pipeline_depth = depth;
    go.decode_batch = batch;
    auto gen = ag::generator::create(**rt, cfg, {}, go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<int> streamed{0}, on_caller{0};
    std::vector<ag::generation> hs;
    for (int i = 0; i < 24; ++i) {
      ag::generate_options o;
      o.max_new_tokens = 12;
      o.on_token = [&](int32_t, int64_t) {
        ++streamed;
        if (std::this_thread::get_id() == caller) ++on_caller;
      };
      hs.push_back((*gen)->generate({1 + i % 30, 2, 3}, o));
    }
    for (std::size_t i = 0; i < hs.size(); ++i) {
      ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
      ASSERT_TRUE(hs[i].wait().has_value()) << hs[i].wait().err().to_string();
      EXPECT_EQ(hs[i].wait()->tokens.size(), 12u);
    }
    EXPECT_EQ(streamed.load(), 24 * 12);
    EXPECT_EQ(on_caller.load(), 0) << "tokens streamed on the thread that called generate()";
  }
}

// A device that dies while sequences have steps queued behind each other:
// every sequence ends (the steps in flight fail with it, none hangs), those
// that finished first equal their solo runs, and after reset_device the same
// generator generates the solo tokens again. The device is killed from the
// token stream when the first sequence streams its fourth token, so the death
// always lands with decode steps in flight, however the threads are timed
// (an op-count fault landed before any decode step on a slow ASan run).
TEST(GeneratePipelined, ADeviceDyingUnderQueuedStepsEndsItsSequencesAndTheGeneratorServesOn) {
  const auto cfg = tiny_generator_model(ag::models::model_variant::llama);
  ag::runtime_options ro = fast_sim();
  ro.backend.sim.jitter = 0.3;
  auto rt = ag::runtime::create("sim:1", ro);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {7, 7}, {40, 0, 13, 2}};
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : prompts) solo.push_back(generate_alone(**rt, cfg, p, 12));
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 3;
  go.pipeline_depth = 3;
  go.decode_batch = 0;  // a slot a sequence (batched runs: GenerateBatched.ADeviceDyingMidRun...)
  auto gen = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  auto* dev = dynamic_cast<ag::gpu::sim::sim_device*>((*rt)->device(0).get());
  ASSERT_NE(dev, nullptr);
  constexpr int64_t kill_at_index = 3;
  std::atomic<bool> killed{false};
  std::vector<ag::generation> hs;
  for (const auto& p : prompts) {
    ag::generate_options o;
    o.max_new_tokens = 12;
    o.on_token = [&](int32_t, int64_t index) {
      if (index == kill_at_index && !killed.exchange(true)) dev->kill("pulled with decode steps queued (test)");
    };
    hs.push_back((*gen)->generate(p, o));
  }
  int failed = 0;
  std::size_t most_streamed = 0;  // by a failed sequence: it had pipelined steps in flight
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(60s)) << "sequence " << i << " hung on the dead device";
    const auto& r = hs[i].wait();
    if (r.has_value()) {
      EXPECT_EQ(r->tokens, solo[i]) << "sequence " << i << " finished before the death";
      continue;
    }
    ++failed;
    EXPECT_EQ(r.err().code, ag::errc::device_failed) << r.err().to_string();
    EXPECT_NE(r.err().message.find("sim0"), std::string::npos) << r.err().to_string();
    const std::vector<int32_t> streamed = hs[i].tokens();
    EXPECT_EQ(streamed, std::vector<int32_t>(solo[i].begin(), solo[i].begin() + static_cast<std::ptrdiff_t>(streamed.size())))
        << "sequence " << i << ": the tokens streamed before the death";
    most_streamed = std::max(most_streamed, streamed.size());
  }
  EXPECT_TRUE(killed.load()) << "no sequence streamed a fourth token";
  // The sequence that streamed the fourth token first had 8 more to go: it
  // cannot have finished, and no other had got further.
  EXPECT_EQ(failed, 3) << "a sequence finished although the device died before any had 5 tokens";
  EXPECT_GE(most_streamed, static_cast<std::size_t>(kill_at_index + 1));
  EXPECT_EQ((*gen)->active_sequences(), 0);
  ASSERT_FALSE((*rt)->reset_device(0)) << "a sim device comes back";
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    ag::generate_options o;
    o.max_new_tokens = 12;
    auto r = (*gen)->generate(prompts[i], o).wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    EXPECT_EQ(r->tokens, solo[i]) << "after the reset, sequence " << i;
    EXPECT_EQ(r->tokens_pipelined, 11);
  }
}

/// rows [1, H, 1, D] and positions i32 [1] stored into "cache" (capacity C,
/// axis 2); the only output is the rows scaled by 3, so no output needs the
/// store.
ag::expected<ag::graph> echoing_store_graph() {
  ag::graph_builder b;
  auto rows = b.input("rows", ag::dtype::f32, {1, H, 1, D});
  auto pos = b.input("positions", ag::dtype::i32, {1});
  (void)b.store_rows(rows, pos, 2, C, "cache");
  b.output(b.scale(rows, 3.0f, "echo"));
  return std::move(b).build();
}

// A store whose result no output needs still runs: a later job of the slot
// reads what it stored (the planner prunes from the outputs and every state
// store). The writer's output is its input scaled; a second plan sharing the
// state reads the rows through a store that stores nothing (position -1).
TEST(State, AStoreNoOutputNeedsStillStoresForTheSlotsNextJob) {
  auto rt = ag::runtime::create("sim:1", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto writer_graph = echoing_store_graph();
  ASSERT_TRUE(writer_graph.has_value()) << writer_graph.err().to_string();
  ag::graph_builder rb;
  auto none = rb.input("rows", ag::dtype::f32, {1, H, 1, D});
  auto nowhere = rb.input("positions", ag::dtype::i32, {1});
  rb.output(rb.scale(rb.store_rows(none, nowhere, 2, C, "cache"), 1.0f, "cache_now"));
  auto reader_graph = std::move(rb).build();
  ASSERT_TRUE(reader_graph.has_value()) << reader_graph.err().to_string();
  ag::plan_options po;
  po.state_slots = 2;
  auto writer = (*rt)->compile(std::move(*writer_graph), po);
  ASSERT_TRUE(writer.has_value()) << writer.err().to_string();
  EXPECT_GE((*writer)->placement()[static_cast<std::size_t>((*writer)->source().find("cache"))], 0)
      << "the store was pruned";
  po.share_state_with = *writer;
  auto reader = (*rt)->compile(std::move(*reader_graph), po);
  ASSERT_TRUE(reader.has_value()) << reader.err().to_string();
  // Fill slot 1 with known rows, then store a random row at position 5.
  ag::host_tensor stored = ag::host_tensor::random_normal(ag::dtype::f32, {1, H, 1, D}, 77, 1.0f);
  for (int32_t p = 0; p < C; ++p) {
    const ag::host_tensor r = p == 5 ? stored : ag::host_tensor::random_normal(ag::dtype::f32, {1, H, 1, D}, 100 + p, 1.0f);
    auto w = (*rt)->submit(*writer, {r, ag::host_tensor::from_ints({1}, {p})}, slot(1)).wait();
    ASSERT_TRUE(w.has_value()) << w.err().to_string();
    EXPECT_FLOAT_EQ((*w)[0].at(0), 3.0f * r.at(0)) << "the writer's own output";
  }
  auto r = (*rt)->submit(*reader, {ag::host_tensor::random_normal(ag::dtype::f32, {1, H, 1, D}, 9, 1.0f),
                                   ag::host_tensor::from_ints({1}, {-1})}, slot(1)).wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  const ag::host_tensor& cache = (*r)[0];  // [1, H, C, D]
  ASSERT_EQ(cache.dims(), ag::shape({1, H, C, D}));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_EQ(cache.at((h * C + 5) * D + d), stored.at(h * D + d)) << "head " << h << ", element " << d;
}

// A store_rows whose positions are a constant outside its capacity stores
// nothing: a read of the slot (the generator's token_state_in). It runs no
// kernel (plan::runs_nothing, named in describe()), the hazard checker
// passes with its state read but not written, and its readers see what the
// slot's earlier jobs stored, on sim and cpu, replayed or not, and when a
// pipeline copies the state to another stage. A constant with one position
// in range still stores.
TEST(State, AStoreOfNothingRunsNoKernelAndItsReadersSeeTheSlot) {
  const auto writes = echoing_store_graph();
  ASSERT_TRUE(writes.has_value()) << writes.err().to_string();
  // positions {-1} (or {-1, in_range}) as a constant, rows of zeros; two
  // readers on layer 1, so a two-stage pipeline may place them apart.
  const auto reader_graph = [](std::vector<int32_t> positions) {
    ag::graph_builder b;
    const auto n = static_cast<int64_t>(positions.size());
    b.set_layer(0);
    auto none = b.weight("none.rows", ag::host_tensor(ag::dtype::f32, {1, H, n, D}));
    auto where = b.weight("none.at", ag::host_tensor::from_ints({n}, std::move(positions)));
    auto st = b.store_rows(none, where, 2, C, "cache");
    b.set_layer(1);
    auto x = b.input("x", ag::dtype::f32, {1, H, C, D});
    b.output(b.add(st, x, "cache_plus_x"));
    auto g = std::move(b).build();
    EXPECT_TRUE(g.has_value()) << g.err().to_string();
    return std::move(*g);
  };
  const ag::graph reads = reader_graph({-1});
  for (const std::string spec : {"sim:1", "cpu:1", "sim:2"})
    for (const ag::graph_replay_mode replay : {ag::graph_replay_mode::off, ag::graph_replay_mode::on}) {
      SCOPED_TRACE(spec + (replay == ag::graph_replay_mode::on ? ", replayed" : ""));
      auto rt = ag::runtime::create(spec, fast_sim());
      ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
      ag::plan_options po;
      po.state_slots = 2;
      po.graph_replay = replay;
      po.pipeline_stages = spec == "sim:2" ? 2 : 1;
      auto writer = (*rt)->compile(*writes, po);
      ASSERT_TRUE(writer.has_value()) << writer.err().to_string();
      po.share_state_with = *writer;
      auto reader = (*rt)->compile(reads, po);
      ASSERT_TRUE(reader.has_value()) << reader.err().to_string();
      const ag::node_id store = (*reader)->source().find("cache");
      EXPECT_TRUE((*reader)->runs_nothing(store));
      EXPECT_FALSE((*writer)->runs_nothing((*writer)->source().find("cache")));
      EXPECT_NE((*reader)->describe().find("1 store_rows storing nothing run no kernel"), std::string::npos)
          << (*reader)->describe();
      EXPECT_FALSE(ag::check_hazards(**reader)) << ag::check_hazards(**reader).to_string();
      auto partly = (*rt)->compile(reader_graph({-1, 3}), po);
      ASSERT_TRUE(partly.has_value()) << partly.err().to_string();
      EXPECT_FALSE((*partly)->runs_nothing((*partly)->source().find("cache"))) << "position 3 is stored";

      ag::reference_state ref;
      for (int32_t p = 0; p < C; p += 3) {
        const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {1, H, 1, D}, 50 + p, 1.0f),
                                              ag::host_tensor::from_ints({1}, {p})};
        auto w = (*rt)->submit(*writer, in, slot(1)).wait();
        ASSERT_TRUE(w.has_value()) << w.err().to_string();
        ASSERT_TRUE(ag::evaluate_reference(*writes, in, ref).has_value());
        const std::vector<ag::host_tensor> x{ag::host_tensor::random_normal(ag::dtype::f32, {1, H, C, D}, 90 + p, 1.0f)};
        auto r = (*rt)->submit(*reader, x, slot(1)).wait();
        ASSERT_TRUE(r.has_value()) << r.err().to_string();
        auto want = ag::evaluate_reference(reads, x, ref);
        ASSERT_TRUE(want.has_value()) << want.err().to_string();
        expect_equal(*r, *want, "the read after position " + std::to_string(p));
      }
    }
}

TEST(State, ThePlanKeepsStatePerSlotInTheStateRegionAndCountsEverySlot) {
  const ag::graph g = state_graph(3);
  auto gp = std::make_shared<const ag::graph>(g);
  std::vector<ag::device_spec> devs(1);
  devs[0].name = "sim0";
  ag::plan_options po;
  po.state_slots = 4;
  auto p = ag::compile(gp, devs, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  const int64_t one = H * C * D * 4;  // f32 [1, 2, 8, 4]
  EXPECT_GE((*p)->memory()[0].state_bytes, one);
  EXPECT_LT((*p)->memory()[0].state_bytes, one + 256);
  auto loc = (*p)->locate(g.find("cache"), 0);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->where, ag::region::state);
  EXPECT_NE((*p)->describe().find("state 4 slot(s)"), std::string::npos) << (*p)->describe();
  // Every slot counts against the device: too many slots do not fit.
  devs[0].mem_bytes = 64 << 10;
  po.state_slots = 65536;
  auto big = ag::compile(gp, devs, po);
  ASSERT_FALSE(big.has_value());
  EXPECT_EQ(big.err().code, ag::errc::out_of_memory);
  EXPECT_NE(big.err().message.find("state 65536 x"), std::string::npos) << big.err().message;
  po.state_slots = 0;
  auto none = ag::compile(gp, devs, po);
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.err().message.find("state_slots must be 1..65536, got 0"), std::string::npos) << none.err().message;
}

TEST(State, StoreRowsRefusesWhatItCannotStoreNamingTheNode) {
  // rows [1, 2, 3, 4]; positions of `pos_type` [pos_len]; axis; capacity.
  auto err_of = [](int axis, ag::dtype pos_type, int64_t pos_len, int64_t capacity) {
    ag::graph_builder b;
    auto rows = b.input("rows", ag::dtype::f32, {1, 2, 3, 4});
    b.output(b.store_rows(rows, b.input("p", pos_type, {pos_len}), axis, capacity, "s"));
    auto g = std::move(b).build();
    return g.has_value() ? std::string("built") : g.err().message;
  };
  const struct {
    int axis;
    ag::dtype pos_type;
    int64_t pos_len, capacity;
    const char* error;
  } bad[] = {
      {4, ag::dtype::i32, 3, 8, "store_rows 's': axis 4 is outside rows"},
      {2, ag::dtype::f32, 3, 8, "positions 'p' are f32, must be i32"},
      {2, ag::dtype::i32, 4, 8, "must be [3] (one per row along axis 2"},
      {2, ag::dtype::i32, 3, 0, "capacity (attrs.end) must be >= 1, got 0"},
  };
  for (const auto& c : bad) EXPECT_NE(err_of(c.axis, c.pos_type, c.pos_len, c.capacity).find(c.error), std::string::npos) << c.error;
  EXPECT_EQ(err_of(2, ag::dtype::i32, 3, 8), "built");
  // Rows of i32 (a token kept for the slot's next job) are stored too.
  ag::graph_builder b;
  auto ids = b.input("ids", ag::dtype::i32, {3});
  b.output(b.store_rows(ids, b.input("p", ag::dtype::i32, {3}), 0, 5, "kept"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  ag::reference_state st;
  const std::vector<ag::host_tensor> in{ag::host_tensor::from_ints({3}, {7, 8, 9}), ag::host_tensor::from_ints({3}, {4, -1, 1})};
  auto want = ag::evaluate_reference(*g, in, st);
  ASSERT_TRUE(want.has_value()) << want.err().to_string();
  EXPECT_EQ((*want)[0].to_floats(), (std::vector<float>{0, 9, 0, 0, 7}));
  for (const char* spec : {"sim:1", "cpu:1"}) {
    auto rt = ag::runtime::create(spec, fast_sim());
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    auto p = (*rt)->compile(*g, {});
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    auto r = (*rt)->submit(*p, in, slot(0)).wait();
    ASSERT_TRUE(r.has_value()) << spec << ": " << r.err().to_string();
    EXPECT_EQ((*r)[0].to_floats(), (*want)[0].to_floats()) << spec;
  }
}

}  // namespace
