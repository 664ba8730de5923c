// Graph replay through the public API on simulated devices (issue 16 item 1):
// the executing actors capture each replay segment once per set of job
// buffers (arena) and replay it; the sim's capture records the launches with
// their buffers, so a graph replayed for the wrong arena would compute into
// another job's memory and these value checks would fail. Also: a refused
// capture falls back to plain launches, visibly; a device that dies while
// jobs replay fails only the jobs that touch it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "../graph/random_dag.hpp"

#include "actors/actorgraph.hpp"
#include "actors/runtime_core.hpp"
#include "gpu/sim/sim_device.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

ag::runtime_options replay_sim(int arenas) {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-2;
  o.backend.sim.jitter = 0.3;
  o.arenas_per_device = arenas;
  return o;
}

ag::models::transformer_config small_gpt2() {
  ag::models::transformer_config cfg;
  cfg.variant = ag::models::model_variant::gpt2;
  cfg.n_layers = 3;
  return cfg;
}

void expect_matches_reference(const ag::graph& g, const std::vector<ag::host_tensor>& in, const ag::job_result& r,
                              const std::string& what) {
  ASSERT_TRUE(r.has_value()) << what << ": " << r.err().to_string();
  auto ref = ag::evaluate_reference(g, in);
  ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
  ASSERT_EQ(r->size(), ref->size());
  for (std::size_t i = 0; i < ref->size(); ++i) {
    auto c = ag::compare((*r)[i], (*ref)[i], 1e-3, 1e-2);
    EXPECT_TRUE(c.ok) << what << " output " << i << ": " << c.message;
  }
}

/// Submits `waves` x `per_wave` jobs of `p` (each wave in flight together,
/// more jobs than arenas) and checks each against the reference.
void run_waves(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p, const ag::graph& g,
               const ag::models::transformer_config& cfg, int waves, int per_wave) {
  for (int w = 0; w < waves; ++w) {
    std::vector<std::vector<ag::host_tensor>> ins;
    for (int k = 0; k < per_wave; ++k)
      ins.push_back(ag::models::transformer_inputs(cfg, 1000 + static_cast<uint64_t>(w * per_wave + k)));
    auto jobs = rt.submit_batch(p, ins);
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      ASSERT_TRUE(jobs[k].wait_for(60s)) << "wave " << w << " job " << k << " hung";
      expect_matches_reference(g, ins[k], jobs[k].wait(), "wave " + std::to_string(w) + " job " + std::to_string(k));
    }
  }
}

/// Segments replayed as graphs: every segment with a kernel or host copy.
int segments_with_kernels(const ag::plan& p) {
  int n = 0;
  for (const auto& seg : ag::replay_segments(p))
    if (seg.launches() >= 1) ++n;
  return n;
}

/// A runtime on `spec` and GPT-2 (small_gpt2) compiled there with `po`.
struct replay_setup {
  std::unique_ptr<ag::runtime> rt;
  ag::models::transformer_config cfg = small_gpt2();
  ag::graph g;
  std::shared_ptr<const ag::plan> p;

  replay_setup(const std::string& spec, const ag::runtime_options& o, const ag::plan_options& po) {
    auto r = ag::runtime::create(spec, o);
    if (!r) throw std::runtime_error(r.err().to_string());
    rt = std::move(*r);
    auto built = ag::models::build_transformer(cfg);
    if (!built) throw std::runtime_error(built.err().to_string());
    g = std::move(*built);
    auto compiled = rt->compile(g, po);
    if (!compiled) throw std::runtime_error(compiled.err().to_string());
    p = *compiled;
  }
};

ag::plan_options replay_on(int stages = 0) {
  ag::plan_options po;
  po.pipeline_stages = stages;
  po.graph_replay = ag::graph_replay_mode::on;
  return po;
}

TEST(GraphReplay, ReplayedJobsEqualTheReferenceAcrossArenasAndJobsInFlight) {
  replay_setup t("sim:2", replay_sim(3), replay_on(2));
  const int segments = segments_with_kernels(*t.p);
  ASSERT_GE(segments, 2) << t.p->describe();
  run_waves(*t.rt, t.p, t.g, t.cfg, 4, 6);  // 6 jobs in flight over 3 arenas per device
  const ag::replay_stats s = t.rt->replay_statistics();
  // Each segment runs plainly once, then once per arena it meets is captured;
  // every other run is a replay of a graph keyed by that arena.
  EXPECT_EQ(s.plain, segments);
  EXPECT_GE(s.captured, segments);
  EXPECT_LE(s.captured, segments * 3);
  EXPECT_EQ(s.plain + s.captured + s.replayed, segments * 24);
  EXPECT_GT(s.replayed, s.captured);
  EXPECT_EQ(s.fallbacks, 0);
  EXPECT_EQ(s.last_fallback, "");
}

TEST(GraphReplay, TraceMarksReplayedSegmentsAsOneRecord) {
  ag::plan_options po;
  po.graph_replay = ag::graph_replay_mode::automatic;
  replay_setup t("sim:1", replay_sim(2), po);
  run_waves(*t.rt, t.p, t.g, t.cfg, 3, 2);
  const ag::trace tr = t.rt->take_trace();
  int plain = 0, captured = 0, replayed = 0;
  for (const auto& r : tr.records) {
    if (r.label.find("[graph replay: plain") != std::string::npos) ++plain;
    if (r.label.find("[graph replay: captured") != std::string::npos) ++captured;
    if (r.label.find("[graph replay: replayed") != std::string::npos) {
      ++replayed;
      EXPECT_GE(r.end_ns, r.start_ns) << r.label;
    }
  }
  const ag::replay_stats s = t.rt->replay_statistics();
  EXPECT_EQ(plain, s.plain);
  EXPECT_EQ(captured, s.captured);
  EXPECT_EQ(replayed, s.replayed);
  EXPECT_GT(replayed, 0);
}

TEST(GraphReplay, RefusedCaptureFallsBackToPlainLaunchesWithTheSameValues) {
  auto o = replay_sim(2);
  o.backend.sim.faults.refuse_capture = true;
  replay_setup t("sim:2", o, replay_on(2));
  const int segments = segments_with_kernels(*t.p);
  run_waves(*t.rt, t.p, t.g, t.cfg, 3, 4);
  const ag::replay_stats s = t.rt->replay_statistics();
  EXPECT_EQ(s.captured, 0);
  EXPECT_EQ(s.replayed, 0);
  EXPECT_EQ(s.plain, segments);
  EXPECT_EQ(s.fallbacks, segments * 11);  // every run after the first
  EXPECT_NE(s.last_fallback.find("refused the capture"), std::string::npos) << s.last_fallback;
  bool traced = false;
  for (const auto& r : t.rt->take_trace().records)
    traced = traced || r.label.find("[graph replay: fallback") != std::string::npos;
  EXPECT_TRUE(traced) << "no trace record says the segment fell back";
}

// Folded lanes (plan_options::fold_lanes): the device's compute lanes run
// from one queue, and its replay segments span them, each captured as one
// graph whose branches are the lanes (the sim runs them on lane streams of
// their own, forked and joined by events). Jobs in flight over three arenas
// get the reference's values; the trace names the lanes of the replayed
// segments; a refused capture runs the queue plainly, one step after
// another, with the same values.
TEST(GraphReplay, FoldedLanesReplayAsOneGraphWithTheReferenceValues) {
  const ag::graph g = ag::test::chains_graph(4, 3);
  for (bool refuse : {false, true}) {
    auto o = replay_sim(3);
    o.backend.sim.faults.refuse_capture = refuse;
    auto rt = ag::runtime::create("sim:1", o);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    ag::plan_options po = replay_on();
    po.lanes_per_device = 4;
    po.min_branch_seconds = 0;
    auto p = (*rt)->compile(g, po);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    const auto& prog = *ag::actors::runtime_core::loaded(*p)->program;
    ASSERT_GE(prog.folded_lanes(0), 2) << (*p)->describe();
    EXPECT_NE((*p)->describe().find("compute lanes run from one queue"), std::string::npos) << (*p)->describe();
    int spanning = 0;
    for (const auto& ls : prog.steps()) spanning += ls.replay_lanes >= 2;
    ASSERT_GE(spanning, 1) << "no segment spans two lanes: " << (*p)->describe();
    for (int wave = 0; wave < 4; ++wave) {
      std::vector<std::vector<ag::host_tensor>> ins;
      for (int k = 0; k < 6; ++k)
        ins.push_back({ag::host_tensor::random_normal(ag::dtype::f32, {4, 32}, 700 + static_cast<uint64_t>(wave * 6 + k), 1.0f)});
      auto jobs = (*rt)->submit_batch(*p, ins);
      for (std::size_t k = 0; k < jobs.size(); ++k) {
        ASSERT_TRUE(jobs[k].wait_for(60s)) << "job " << k << " hung";
        expect_matches_reference(g, ins[k], jobs[k].wait(), (refuse ? "refused, wave " : "wave ") + std::to_string(wave));
      }
    }
    const ag::replay_stats st = (*rt)->replay_statistics();
    int lanes_replayed = 0;
    for (const auto& r : (*rt)->take_trace().records)
      lanes_replayed += r.label.find("[graph replay: replayed") != std::string::npos &&
                        r.label.find(" lanes]") != std::string::npos;
    if (refuse) {
      EXPECT_EQ(st.replayed, 0);
      EXPECT_GT(st.fallbacks, 0);
      EXPECT_EQ(lanes_replayed, 0);
    } else {
      EXPECT_EQ(st.fallbacks, 0) << st.last_fallback;
      EXPECT_GT(lanes_replayed, 0) << "no replayed segment of several lanes in the trace";
    }
  }
}

/// The tiny job's graph: y = x + w over 256 floats.
ag::graph tiny_add_graph() {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {256});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {256}, 3, 1.0f));
  b.output(b.add(x, w, "y"));
  return std::move(b).build().value();
}

// A tiny job (its input copied in, one add, its output copied out) is one
// segment whose copies move through the host window of the job's arena:
// captured once per arena and replayed, with its input and output copies
// inside the graph. Each job, in flight beside others on other arenas and
// after others on the same arena, gets its own sum; a refused capture runs
// the same copies plainly, with the same values.
TEST(GraphReplay, TinyJobsReplayTheirHostCopiesInsideTheGraph) {
  const ag::graph g = tiny_add_graph();
  for (bool refuse : {false, true}) {
    SCOPED_TRACE(refuse ? "capture refused" : "captured");
    auto o = replay_sim(4);
    o.trace = true;
    o.backend.sim.faults.refuse_capture = refuse;
    auto rt = ag::runtime::create("sim:1", o).value();
    auto p = rt->compile(g, replay_on()).value();
    const auto segs = ag::replay_segments(*p);
    ASSERT_EQ(segs.size(), 1u) << p->describe();
    ASSERT_EQ(segs[0].copies, 2) << p->describe();
    constexpr int waves = 4, per_wave = 8;  // 8 jobs in flight over 4 arenas
    for (int wv = 0; wv < waves; ++wv) {
      std::vector<std::vector<ag::host_tensor>> ins;
      for (int k = 0; k < per_wave; ++k)
        ins.push_back({ag::host_tensor::random_normal(ag::dtype::f32, {256}, 77 + static_cast<uint64_t>(wv * per_wave + k), 1.0f)});
      auto jobs = rt->submit_batch(p, ins);
      for (std::size_t k = 0; k < jobs.size(); ++k) {
        ASSERT_TRUE(jobs[k].wait_for(60s)) << "wave " << wv << " job " << k << " hung";
        expect_matches_reference(g, ins[k], jobs[k].wait(), "wave " + std::to_string(wv) + " job " + std::to_string(k));
      }
    }
    const ag::replay_stats s = rt->replay_statistics();
    EXPECT_EQ(s.plain, 1);
    if (refuse) {
      EXPECT_EQ(s.fallbacks, waves * per_wave - 1);
      continue;
    }
    EXPECT_GE(s.captured, 1);
    EXPECT_LE(s.captured, 4) << "more graphs than arenas";
    EXPECT_EQ(s.plain + s.captured + s.replayed, waves * per_wave);
    EXPECT_EQ(s.fallbacks, 0);
    int replayed_records = 0;
    for (const auto& r : rt->take_trace().records)
      if (r.label.find("[graph replay: replayed, 3 steps, 1 kernels]") != std::string::npos) ++replayed_records;
    EXPECT_EQ(replayed_records, s.replayed) << "a replayed tiny job is one trace record of its 3 steps";
  }
}

// A segment of one kernel is replayed too (a graph launch costs a GPU's host
// less than the kernel's own launch): the tiny job with its host copies
// launched on their own leaves one kernel in its segment, which is captured
// per arena and replayed, with the reference's values.
TEST(GraphReplay, SegmentsOfOneKernelAreReplayedToo) {
  const ag::graph g = tiny_add_graph();
  auto o = replay_sim(2);
  o.trace = true;
  auto rt = ag::runtime::create("sim:1", o).value();
  ag::plan_options po = replay_on();
  po.replay_host_copies = false;
  auto p = rt->compile(g, po).value();
  const auto segs = ag::replay_segments(*p);
  ASSERT_EQ(segs.size(), 1u) << p->describe();
  ASSERT_EQ(segs[0].launches(), 1) << p->describe();
  constexpr int jobs = 12;
  for (int k = 0; k < jobs; ++k) {
    const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {256}, 500 + static_cast<uint64_t>(k), 1.0f)};
    auto j = rt->submit(p, in);
    ASSERT_TRUE(j.wait_for(60s)) << "job " << k << " hung";
    expect_matches_reference(g, in, j.wait(), "job " + std::to_string(k));
  }
  const ag::replay_stats s = rt->replay_statistics();
  EXPECT_EQ(s.plain, 1) << "the segment's first run";
  EXPECT_GE(s.captured, 1);
  EXPECT_LE(s.captured, 2) << "more graphs than arenas";
  EXPECT_EQ(s.plain + s.captured + s.replayed, jobs);
  int replayed_records = 0;
  for (const auto& r : rt->take_trace().records)
    if (r.label.find("[graph replay: replayed, 1 steps, 1 kernels]") != std::string::npos) ++replayed_records;
  EXPECT_EQ(replayed_records, s.replayed);
}

TEST(GraphReplay, OffAndCpuNeverCapture) {
  for (const char* spec : {"sim:1", "cpu:1"}) {
    ag::plan_options po;
    // sim: replay off; cpu: replay on, which the cpu device never applies.
    po.graph_replay = std::string(spec) == "cpu:1" ? ag::graph_replay_mode::on : ag::graph_replay_mode::off;
    replay_setup t(spec, replay_sim(2), po);
    run_waves(*t.rt, t.p, t.g, t.cfg, 2, 2);
    const ag::replay_stats s = t.rt->replay_statistics();
    EXPECT_EQ(s.plain + s.captured + s.replayed + s.fallbacks, 0) << spec;
  }
}

// Plan `one` runs on device 0 alone, plan `both` pipelines over devices 0
// and 1; device 1 dies a few ops into a wave of replayed jobs of both plans.
// Jobs of `both` fail naming sim1 (or finished before the death, with right
// values); every job of `one` keeps succeeding with right values.
TEST(GraphReplay, DeviceDeathDuringReplayFailsOnlyTheJobsThatTouchIt) {
  auto rt = ag::runtime::create("sim:2", replay_sim(2));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const auto cfg = small_gpt2();
  auto g = ag::models::build_transformer(cfg);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  single.graph_replay = ag::graph_replay_mode::on;
  ag::plan_options pipe;
  pipe.pipeline_stages = 2;
  pipe.graph_replay = ag::graph_replay_mode::on;
  auto one = (*rt)->compile(*g, single);
  auto both = (*rt)->compile(*g, pipe);
  ASSERT_TRUE(one.has_value() && both.has_value());
  run_waves(**rt, *one, *g, cfg, 2, 2);  // graphs captured on both plans' queues
  run_waves(**rt, *both, *g, cfg, 2, 2);
  ASSERT_GT((*rt)->replay_statistics().replayed, 0);

  auto* dev1 = dynamic_cast<ag::gpu::sim::sim_device*>((*rt)->device(1).get());
  ASSERT_NE(dev1, nullptr);
  ag::gpu::fault_config f;
  f.die_after_ops = 5;
  dev1->set_faults(f);
  std::vector<std::vector<ag::host_tensor>> in_one, in_both;
  std::vector<ag::job> j_one, j_both;
  for (int k = 0; k < 6; ++k) {
    in_both.push_back(ag::models::transformer_inputs(cfg, 3000 + static_cast<uint64_t>(k)));
    j_both.push_back((*rt)->submit(*both, in_both.back()));
    in_one.push_back(ag::models::transformer_inputs(cfg, 4000 + static_cast<uint64_t>(k)));
    j_one.push_back((*rt)->submit(*one, in_one.back()));
  }
  int failed = 0;
  for (std::size_t k = 0; k < j_both.size(); ++k) {
    ASSERT_TRUE(j_both[k].wait_for(60s)) << "job of the dying pipeline hung";
    const auto& r = j_both[k].wait();
    if (r.has_value()) {
      expect_matches_reference(*g, in_both[k], r, "pipeline job " + std::to_string(k) + " (before the death)");
    } else {
      ++failed;
      EXPECT_EQ(r.err().code, ag::errc::device_failed) << r.err().to_string();
      EXPECT_NE(r.err().message.find("sim1"), std::string::npos) << r.err().to_string();
    }
  }
  EXPECT_GT(failed, 0) << "device 1 died, yet every job that uses it succeeded";
  for (std::size_t k = 0; k < j_one.size(); ++k) {
    ASSERT_TRUE(j_one[k].wait_for(60s)) << "job on the healthy device hung";
    expect_matches_reference(*g, in_one[k], j_one[k].wait(), "single-device job " + std::to_string(k));
  }
  // The healthy device keeps replaying afterwards.
  const int64_t before = (*rt)->replay_statistics().replayed;
  run_waves(**rt, *one, *g, cfg, 1, 2);
  EXPECT_GT((*rt)->replay_statistics().replayed, before);
}

// Tensor-parallel jobs in flight on two job lanes (plan_options::job_lanes):
// each lane's executing actors keep their graphs per arena, and a job runs
// on the lane its arena belongs to (plan_memory::lane_of), so each arena's
// segments are captured once, however the rounds take the arenas. (When a
// job's lane was its collective number modulo the lanes, the rounds' jobs
// met arenas on either lane and captured each (lane, arena) pair: twice
// the graphs, the last of them four rounds in.) Values checked against the
// reference all along.
TEST(GraphReplay, JobLanesCaptureEachArenaOnce) {
  constexpr int arenas = 8, rounds = 10;
  ag::runtime_options o = replay_sim(arenas);
  o.trace = true;
  auto rt = ag::runtime::create("sim:2", o).value();
  ag::models::transformer_config cfg;
  cfg.variant = ag::models::model_variant::llama;
  cfg.n_layers = 2;
  cfg.d_model = 32;
  cfg.n_heads = 4;
  cfg.d_ff = 48;
  cfg.vocab = 41;
  cfg.seq_len = 6;
  cfg.batch = 2;
  auto g = std::make_shared<const ag::graph>(ag::models::build_transformer(cfg).value());
  ag::plan_options po = replay_on();
  po.tensor_parallel = 2;
  po.job_lanes = 2;
  auto p = rt->compile(g, po).value();
  std::string per_round;
  int64_t segments_per_job = 0;
  ag::replay_stats last{};
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::vector<ag::host_tensor>> ins;
    for (int k = 0; k < arenas; ++k)
      ins.push_back(ag::models::transformer_inputs(cfg, 100 + static_cast<uint64_t>(r * arenas + k)));
    auto jobs = rt->submit_batch(p, ins);
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      ASSERT_TRUE(jobs[k].wait_for(60s)) << "round " << r << " job " << k << " hung";
      if (r == 0 || r == rounds - 1)
        expect_matches_reference(*g, ins[k], jobs[k].wait(), "round " + std::to_string(r) + " job " + std::to_string(k));
    }
    const ag::replay_stats s = rt->replay_statistics();
    const int64_t runs = (s.plain + s.captured + s.replayed) - (last.plain + last.captured + last.replayed);
    if (r == 0) segments_per_job = runs / arenas;
    per_round += " " + std::to_string(s.captured - last.captured);
    last = s;
  }
  ASSERT_GT(segments_per_job, 0);
  EXPECT_EQ(last.fallbacks, 0);
  std::set<std::string> lanes;  // the plan ran on both job lanes' compute queues
  for (const auto& rec : rt->take_trace().records)
    if (rec.lane.rfind("compute", 0) == 0) lanes.insert(rec.lane);
  EXPECT_EQ(lanes, (std::set<std::string>{"compute0", "compute1"}));
  // A graph per arena and segment (an arena of a lane meets that lane's
  // segments: the job's), the arena of a lane's first job captured on its
  // second use. Room for a few jobs that found only the other lane's arenas
  // free (a round's submits can come before the last round's arenas are
  // back): each pair of lane and arena, as before, would be twice as many.
  const int64_t once = segments_per_job * arenas;
  EXPECT_LE(last.captured, once + once / 2) << "captures by round:" << per_round;
  EXPECT_GE(last.captured, once - last.plain) << "captures by round:" << per_round;
}
}  // namespace
