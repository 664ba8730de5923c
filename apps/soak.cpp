// actorgraph-soak: drives the public API as hard as a user could, with faults,
// and proves that every job ends exactly once, correctly or with an error that
// names the device and the fault (issue 13).
//
// Jobs of five plan shapes run in one runtime at a time, each plan on its own
// devices (pins), so a dead device fails only the plans that touch it:
//   pipeline  a matmul + gelu chain over the first half of the devices (one
//             stage per device),
//   lanes     three independent branches on one device with 2 compute lanes,
//   random    a random DAG (add, mul, matmul, gelu, softmax, transpose,
//             slice + concat) pipelined over the remaining devices,
//   tensor-parallel  column- then row-parallel matmul over devices 0 and 1
//             (tensor_parallel = 2: an all-reduce per job), on two job lanes
//             (plan_options::job_lanes: jobs spread over copies of the
//             devices' queues by the arena they hold),
//   tensor-parallel-2x2  two such blocks at tensor degree 2 on 2 stages
//             (devices 0-3, one job lane): its collectives share devices 0
//             and 1 with the plan above (where there are 4 devices).
// Faults (on by default, sim devices): random op errors, stalls (ops taking
// stall_seconds longer), devices dying after a drawn number of ops; random
// cancels (at once after submit), deadlines (submit_options::deadline, 1 us
// to 2 ms), continuations that submit more jobs (from
// the runtime's completion thread). The run is split in epochs: each epoch is
// one runtime; the next epoch creates a fresh runtime over fresh devices
// (dead devices come back that way, and through runtime::reset_device a few
// times an epoch: revived devices serve the epoch's later jobs).
//
// Checks: every job's continuation ran exactly once (counted after the
// runtime is destroyed, which waits for every job); no job stays unfinished
// past the watchdog (hung); every finished job is done with outputs equal to
// evaluate_reference (all of them up to --check-all-below jobs, then one in
// --check-every), or failed with a fault error (op_failed / device_failed
// naming a device, message saying "injected fault"), or cancelled by the soak,
// or failed with errc::timeout at the deadline it was given. With
// --check-collective-order (on by default) every collective part also
// checks NCCL's pairing rule (gpu/host/collective_sequence.hpp): a part
// that would pair with another job's fails with errc::internal.
// Anything else counts as wrong. Exit status 1 if anything was lost, hung or
// wrong; 2 for bad flags.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "actors/actorgraph.hpp"
#include "apps/common/flags.hpp"
#include "gpu/host/collective_sequence.hpp"
#include "graph/reference.hpp"

namespace {

using clk = std::chrono::steady_clock;

struct options {
  int64_t jobs = 20000;
  std::string devices = "sim:8";
  int in_flight = 64;
  uint64_t seed = 1;
  bool faults = true;
  std::string values = "on";
  int epochs = 0;               // 0: one per 10,000 jobs, at least 2
  double time_scale = 1e-4;
  double jitter = 1.0;
  double op_error_rate = 2e-4;
  double op_stall_rate = 1e-4;
  double stall_seconds = 0.02;
  double death_fraction = 0.75;   // share of epochs in which devices die
  double cancel_rate = 0.02;
  double deadline_rate = 0.02;
  double continuation_rate = 0.05;
  int64_t check_all_below = 5000;
  int64_t check_every = 16;
  double watchdog_s = 60;
  int arenas = 8;
};

/// Resident set size of this process in bytes (/proc/self/statm).
int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// ---- plans -----------------------------------------------------------------

struct soak_plan {
  std::string name;
  ag::graph g;
  ag::plan_options po;
  std::vector<std::vector<ag::host_tensor>> inputs;  // a few input sets
  std::vector<std::vector<ag::host_tensor>> refs;    // their reference outputs
};

ag::host_tensor weight_data(int64_t r, int64_t c, uint64_t seed) {
  return ag::host_tensor::random_normal(ag::dtype::f32, {r, c}, seed, 0.2f);
}

/// Devices [first, first + count) spread over `units` units in order.
int device_of(int unit, int units, int first, int count) {
  return first + static_cast<int>(static_cast<int64_t>(unit) * count / std::max(units, 1));
}

ag::expected<ag::graph> pipeline_graph(int first, int count) {
  ag::graph_builder b;
  constexpr int layers = 6;
  auto x = b.input("x", ag::dtype::f32, {8, 32});
  b.pin(x, first);
  for (int l = 0; l < layers; ++l) {
    b.set_layer(l);
    const int d = device_of(l, layers, first, count);
    auto w = b.weight("w" + std::to_string(l), weight_data(32, 32, 100 + static_cast<uint64_t>(l)));
    b.pin(w, d);
    auto m = b.matmul(x, w, false, false, "mm" + std::to_string(l));
    b.pin(m, d);
    x = b.gelu(m, ag::gelu_mode::tanh, "act" + std::to_string(l));
    b.pin(x, d);
  }
  b.output(x);
  return std::move(b).build();
}

ag::expected<ag::graph> lanes_graph(int device) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {16, 16});
  b.pin(x, device);
  std::vector<ag::tensor> branches;
  for (int k = 0; k < 3; ++k) {
    auto w = b.weight("bw" + std::to_string(k), weight_data(16, 16, 200 + static_cast<uint64_t>(k)));
    auto m = b.matmul(x, w, false, false, "bm" + std::to_string(k));
    auto a = b.gelu(m, ag::gelu_mode::tanh, "ba" + std::to_string(k));
    for (auto t : {w, m, a}) b.pin(t, device);
    branches.push_back(a);
  }
  auto s = b.add(branches[0], branches[1], "sum01");
  b.pin(s, device);
  auto y = b.add(s, branches[2], "sum");
  b.pin(y, device);
  b.output(y);
  b.output(branches[2]);
  return std::move(b).build();
}

ag::expected<ag::graph> random_graph(uint64_t seed, int first, int count) {
  std::mt19937_64 r(seed);
  auto pick = [&](int n) { return static_cast<int>(r() % static_cast<uint64_t>(n)); };
  ag::graph_builder b;
  constexpr int ops = 14, d = 16;
  std::vector<ag::tensor> pool{b.input("in0", ag::dtype::f32, {d, d}), b.input("in1", ag::dtype::f32, {d, d})};
  for (auto t : pool) b.pin(t, first);
  for (int i = 0; i < ops; ++i) {
    const int dev = device_of(i, ops, first, count);
    const auto a = pool[pool.size() - 1 - static_cast<std::size_t>(pick(std::min<int>(4, static_cast<int>(pool.size()))))];
    const auto c = pool[static_cast<std::size_t>(pick(static_cast<int>(pool.size())))];
    const std::string n = "op" + std::to_string(i);
    ag::tensor out;
    switch (pick(7)) {
      case 0: out = b.add(a, c, n); break;
      case 1: out = b.mul(a, c, n); break;
      case 2: {
        auto w = b.weight("rw" + std::to_string(i), weight_data(d, d, seed * 100 + static_cast<uint64_t>(i)));
        b.pin(w, dev);
        out = b.matmul(a, w, false, false, n);
        break;
      }
      case 3: out = b.gelu(a, ag::gelu_mode::tanh, n); break;
      case 4: out = b.softmax(a, pick(2) == 0, 0.5f, n); break;
      case 5: out = b.transpose(a, 0, 1, n); break;
      default: {
        auto lo = b.slice(a, 1, 0, d / 2, n + "lo");
        auto hi = b.slice(c, 1, d / 2, d, n + "hi");
        b.pin(lo, dev);
        b.pin(hi, dev);
        out = b.concat({hi, lo}, 1, n);
        break;
      }
    }
    b.pin(out, dev);
    pool.push_back(out);
  }
  b.output(pool.back());
  b.output(pool[pool.size() / 2]);
  return std::move(b).build();
}

// x -> column-parallel matmul -> gelu -> row-parallel matmul: one
// all-reduce per job when compiled with tensor_parallel = 2.
ag::expected<ag::graph> tensor_parallel_graph() {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {8, 32});
  auto up = b.matmul(x, b.weight("up", weight_data(32, 64, 300)), false, false, "up_proj");
  auto a = b.gelu(up, ag::gelu_mode::tanh, "act");
  auto y = b.matmul(a, b.weight("down", weight_data(64, 32, 301)), false, false, "down_proj");
  b.output(y);
  return std::move(b).build();
}

// Two column- then row-parallel blocks with a residual add between them:
// two all-reduces per job, split over two stages when compiled with
// pipeline_stages = 2.
ag::expected<ag::graph> tensor_parallel_stages_graph() {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {8, 32});
  for (int k = 0; k < 2; ++k) {
    const std::string n = std::to_string(k);
    auto up = b.matmul(x, b.weight("up" + n, weight_data(32, 64, 310 + k)), false, false, "up_proj" + n);
    auto a = b.gelu(up, ag::gelu_mode::tanh, "act" + n);
    auto y = b.matmul(a, b.weight("down" + n, weight_data(64, 32, 320 + k)), false, false, "down_proj" + n);
    x = b.add(x, y, "residual" + n);
  }
  b.output(x);
  return std::move(b).build();
}

ag::expected<std::vector<soak_plan>> make_plans(int devices, uint64_t seed) {
  // Disjoint device sets where there are enough devices.
  const int pipe_n = std::max(1, devices / 2);
  const int lanes_dev = devices > 1 ? pipe_n : 0;
  const int rnd_first = devices > 2 ? pipe_n + 1 : 0;
  const int rnd_n = devices > 2 ? devices - rnd_first : 1;
  std::vector<soak_plan> plans;
  auto add = [&](std::string name, ag::expected<ag::graph> g, ag::plan_options po) -> ag::error {
    if (!g) return g.err();
    soak_plan p{std::move(name), std::move(*g), po, {}, {}};
    for (int s = 0; s < 4; ++s) {
      std::vector<ag::host_tensor> in;
      uint64_t k = seed * 7919 + static_cast<uint64_t>(s) * 31 + plans.size() * 1000;
      for (ag::node_id id : p.g.inputs())
        in.push_back(ag::host_tensor::random_normal(ag::dtype::f32, p.g.at(id).dims, k++));
      auto ref = ag::evaluate_reference(p.g, in);
      if (!ref) return ref.err();
      p.inputs.push_back(std::move(in));
      p.refs.push_back(std::move(*ref));
    }
    plans.push_back(std::move(p));
    return {};
  };
  ag::plan_options lanes_po;
  lanes_po.lanes_per_device = 2;
  lanes_po.min_branch_seconds = 0;
  for (auto e : {add("pipeline", pipeline_graph(0, pipe_n), {}), add("lanes", lanes_graph(lanes_dev), lanes_po),
                 add("random", random_graph(seed, rnd_first, rnd_n), {})})
    if (!e.ok()) return e;
  if (devices >= 2) {
    // Tensor parallel over devices 0 and 1 (the pipeline's first stages).
    ag::plan_options tp;
    tp.tensor_parallel = 2;
    tp.pipeline_stages = 1;
    tp.job_lanes = 2;
    if (auto e = add("tensor-parallel", tensor_parallel_graph(), tp); !e.ok()) return e;
  }
  if (devices >= 4) {
    // Tensor degree 2 on 2 stages (devices 0-3), one job lane: its jobs share
    // devices 0 and 1 with the plan above, so the two plans' collectives meet
    // on the same streams and communicators and must issue in one order on
    // every member (the runtime's issue lines).
    ag::plan_options tp2;
    tp2.tensor_parallel = 2;
    tp2.pipeline_stages = 2;
    tp2.job_lanes = 1;
    if (auto e = add("tensor-parallel-2x2", tensor_parallel_stages_graph(), tp2); !e.ok()) return e;
  }
  return plans;
}

// ---- jobs ------------------------------------------------------------------

enum class outcome : uint8_t { pending, done_ok, done_unchecked, wrong, fault, cancelled, deadline, hung, unexplained };

struct job_record {
  ag::job handle;
  int plan = 0;
  int set = 0;
  bool check = false;
  bool cancelled_by_us = false;
  bool has_deadline = false;
  bool followup = false;
  outcome result = outcome::pending;
};

struct counts {
  int64_t jobs = 0, done = 0, checked = 0, wrong = 0, lost = 0, duplicate = 0, hung = 0, faults = 0;
  int64_t fault_op = 0, fault_death = 0, fault_other = 0, cancelled = 0, deadline = 0, unexplained = 0;
  int64_t followups = 0, epochs = 0, deaths_configured = 0, revivals = 0;
};

/// Shared between the main thread and the continuations of one epoch.
struct epoch_shared {
  std::mutex mutex;
  std::vector<std::shared_ptr<job_record>> spawned;  // follow-ups submitted by continuations
  std::atomic<int64_t> budget{0};                    // jobs this epoch may still submit
};

class soak {
 public:
  explicit soak(options o) : o_(std::move(o)), rng_(o_.seed) {}

  int run() {
    const auto t0 = clk::now();
    if (o_.epochs == 0) o_.epochs = static_cast<int>(std::max<int64_t>(2, o_.jobs / 10000));
    const int64_t per_epoch = (o_.jobs + o_.epochs - 1) / o_.epochs;
    int64_t left = o_.jobs;
    for (int e = 0; e < o_.epochs && left > 0; ++e) {
      const int64_t n = std::min(per_epoch, left);
      if (!run_epoch(e, n)) return 1;
      left -= n;
    }
    const double secs = std::chrono::duration<double>(clk::now() - t0).count();
    report(secs);
    return (c_.lost || c_.hung || c_.wrong || c_.unexplained || c_.duplicate) ? 1 : 0;
  }

 private:
  bool values() const { return o_.values == "on"; }
  double uni() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  bool run_epoch(int epoch, int64_t n) {
    ag::runtime_options ro;
    ro.trace = false;
    ro.arenas_per_device = o_.arenas;
    auto& sim = ro.backend.sim;
    sim.time_scale = o_.time_scale;
    sim.jitter = o_.jitter;
    sim.compute_values = values();
    sim.seed = o_.seed * 1000 + static_cast<uint64_t>(epoch);
    const bool deaths = o_.faults && uni() < o_.death_fraction;
    if (o_.faults) {
      sim.faults.op_error_rate = o_.op_error_rate;
      sim.faults.op_stall_rate = o_.op_stall_rate;
      sim.faults.stall_seconds = o_.stall_seconds;
      // Devices die after as many ops as the busiest ones run in 40..120% of
      // the epoch (about one op per job there: three plans over disjoint
      // devices, a few ops per plan and device), so some epochs end first.
      if (deaths) {
        sim.faults.die_after_ops = static_cast<int64_t>(static_cast<double>(n) * (0.4 + 0.8 * uni()));
        ++c_.deaths_configured;
      }
    }
    auto rt_or = ag::runtime::create(o_.devices, ro);
    if (!rt_or) {
      std::cerr << "actorgraph-soak: " << rt_or.err().to_string() << "\n";
      return false;
    }
    auto rt = std::move(*rt_or);
    const int ndev = static_cast<int>(rt->devices().size());
    if (plans_.empty()) {
      auto p = make_plans(ndev, o_.seed);
      if (!p) {
        std::cerr << "actorgraph-soak: " << p.err().to_string() << "\n";
        return false;
      }
      plans_ = std::move(*p);
    }
    std::vector<std::shared_ptr<const ag::plan>> compiled;
    for (auto& p : plans_) {
      auto c = rt->compile(p.g, p.po);
      if (!c) {
        std::cerr << "actorgraph-soak: plan " << p.name << ": " << c.err().to_string() << "\n";
        return false;
      }
      compiled.push_back(std::move(*c));
    }

    auto shared = std::make_shared<epoch_shared>();
    shared->budget = n;
    std::deque<std::shared_ptr<job_record>> flight;
    std::vector<std::shared_ptr<job_record>> all;
    std::vector<std::shared_ptr<std::atomic<int>>> calls;  // continuation runs per job in `all`
    all.reserve(static_cast<std::size_t>(n));

    ag::runtime* rtp = rt.get();
    // Submits one job of plan `pi` (from this thread or a continuation).
    // Continuations draw from their own generator, seeded by the parent.
    std::function<std::shared_ptr<job_record>(int, int, bool, bool, uint64_t)> submit;
    auto watch = [&](const std::shared_ptr<job_record>& rec, bool may_follow, uint64_t child_seed) {
      auto cnt = std::make_shared<std::atomic<int>>(0);
      calls.push_back(cnt);
      all.push_back(rec);
      rec->handle.then([cnt, may_follow, child_seed, shared, rtp, &compiled, this](const ag::job_result&) {
        cnt->fetch_add(1);
        if (!may_follow) return;
        if (shared->budget.fetch_sub(1) <= 0) {
          shared->budget.fetch_add(1);
          return;
        }
        auto child = std::make_shared<job_record>();
        child->plan = static_cast<int>(child_seed % plans_.size());
        child->set = static_cast<int>((child_seed >> 8) % 4);
        child->followup = true;
        child->check = true;
        child->handle = rtp->submit(compiled[static_cast<std::size_t>(child->plan)],
                                    plans_[static_cast<std::size_t>(child->plan)].inputs[static_cast<std::size_t>(child->set)]);
        std::lock_guard lk(shared->mutex);
        shared->spawned.push_back(std::move(child));
      });
    };

    int64_t main_submitted = 0;
    auto submit_one = [&] {
      if (shared->budget.fetch_sub(1) <= 0) {
        shared->budget.fetch_add(1);
        return false;
      }
      auto rec = std::make_shared<job_record>();
      rec->plan = static_cast<int>(rng_() % plans_.size());
      rec->set = static_cast<int>(rng_() % 4);
      const int64_t index = c_.jobs + main_submitted;
      rec->check = index < o_.check_all_below || index % o_.check_every == 0;
      ag::submit_options so;
      if (uni() < o_.deadline_rate) {
        rec->has_deadline = true;
        // Deadlines from 1 us to 2 ms: some pass, some fire.
        so.deadline = std::chrono::microseconds(1 + static_cast<int64_t>(2000 * uni()));
      }
      rec->handle = rt->submit(compiled[static_cast<std::size_t>(rec->plan)],
                               plans_[static_cast<std::size_t>(rec->plan)].inputs[static_cast<std::size_t>(rec->set)], so);
      ++main_submitted;
      if (!rec->has_deadline && uni() < o_.cancel_rate) {
        rec->cancelled_by_us = true;
        rec->handle.cancel();
      }
      const bool follow = uni() < o_.continuation_rate;
      watch(rec, follow, rng_());
      flight.push_back(std::move(rec));
      return true;
    };
    auto adopt_spawned = [&] {
      std::vector<std::shared_ptr<job_record>> got;
      {
        std::lock_guard lk(shared->mutex);
        got.swap(shared->spawned);
      }
      for (auto& r : got) {
        watch(r, false, 0);
        ++c_.followups;
        flight.push_back(std::move(r));
      }
    };
    auto retire_front = [&] {
      auto rec = flight.front();
      flight.pop_front();
      if (!rec->handle.wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::duration<double>(o_.watchdog_s)))) {
        rec->result = outcome::hung;
        return;
      }
      classify(*rec);
      rec->handle = ag::job{};  // drop the outputs: memory must stay flat
    };

    const int64_t rss_mark_at = std::max<int64_t>(1, o_.jobs / 10);
    // Dead devices are revived (runtime::reset_device) a few times an epoch,
    // so later jobs of the same runtime run on them again.
    const int64_t revive_every = std::max<int64_t>(1, n / 6);
    int64_t retired = 0;
    while (true) {
      if (++retired % revive_every == 0)
        for (int d = 0; d < ndev; ++d)
          if (!rt->device_in_service(d)) {
            if (ag::error e = rt->reset_device(d)) {
              ++c_.unexplained;
              std::cerr << "reset_device(" << d << ") failed: " << e.to_string() << "\n";
            } else {
              ++c_.revivals;
            }
          }
      adopt_spawned();
      while (static_cast<int>(flight.size()) < o_.in_flight && submit_one()) {
        if (rss_first10_ < 0 && c_.jobs + main_submitted >= rss_mark_at) rss_first10_ = rss_bytes();
      }
      if (flight.empty()) {
        // Continuations may still be submitting: wait for the runtime to settle.
        rt->wait_idle();
        adopt_spawned();
        if (flight.empty()) break;
        continue;
      }
      retire_front();
    }
    const int64_t epoch_jobs = static_cast<int64_t>(all.size());
    rt->wait_idle();
    compiled.clear();
    rt.reset();  // waits for every job: every continuation has run by now
    for (std::size_t i = 0; i < all.size(); ++i) {
      const int k = calls[i]->load();
      if (k == 0) ++c_.lost;
      if (k > 1) ++c_.duplicate;
      if (all[i]->result == outcome::hung) ++c_.hung;
    }
    c_.jobs += epoch_jobs;
    ++c_.epochs;
    return true;
  }

  void classify(job_record& rec) {
    const auto& r = rec.handle.wait();
    if (r.has_value()) {
      ++c_.done;
      if (!rec.check || !values()) return;
      ++c_.checked;
      const auto& ref = plans_[static_cast<std::size_t>(rec.plan)].refs[static_cast<std::size_t>(rec.set)];
      bool ok = r->size() == ref.size();
      for (std::size_t i = 0; ok && i < ref.size(); ++i) ok = ag::compare((*r)[i], ref[i], 2e-4, 2e-3).ok;
      if (!ok) {
        ++c_.wrong;
        if (c_.wrong <= 5) std::cerr << "wrong output: job " << rec.handle.id() << " plan " << plans_[static_cast<std::size_t>(rec.plan)].name
                  << (rec.cancelled_by_us ? " (cancel asked)" : "") << (rec.has_deadline ? " (deadline)" : "")
                  << (rec.followup ? " (continuation's)" : "") << " epoch " << c_.epochs << "\n";
      }
      return;
    }
    const ag::error& e = r.err();
    if (e.code == ag::errc::cancelled && rec.cancelled_by_us) {
      ++c_.cancelled;
      return;
    }
    if (e.code == ag::errc::timeout && rec.has_deadline && e.message.find("deadline") != std::string::npos) {
      ++c_.deadline;
      return;
    }
    const bool names_fault = e.device >= 0 && e.message.find("injected fault") != std::string::npos;
    if (o_.faults && names_fault && (e.code == ag::errc::op_failed || e.code == ag::errc::device_failed)) {
      ++c_.faults;
      if (e.code == ag::errc::op_failed) ++c_.fault_op;
      else ++c_.fault_death;
      return;
    }
    ++c_.unexplained;
    if (c_.unexplained <= 5) std::cerr << "unexplained failure: job " << rec.handle.id() << ": " << e.to_string() << " (device " << e.device << ")\n";
  }

  void report(double secs) {
    const int64_t rss_end = rss_bytes();
    const double growth = rss_first10_ > 0 ? static_cast<double>(rss_end) / static_cast<double>(rss_first10_) : 1.0;
    std::printf("%-28s %12s\n", "outcome", "jobs");
    std::printf("%-28s %12" PRId64 "\n", "done", c_.done);
    std::printf("%-28s %12" PRId64 "\n", "  checked against reference", c_.checked);
    std::printf("%-28s %12" PRId64 "\n", "failed: injected op error", c_.fault_op);
    std::printf("%-28s %12" PRId64 "\n", "failed: device died", c_.fault_death);
    std::printf("%-28s %12" PRId64 "\n", "cancelled by the soak", c_.cancelled);
    std::printf("%-28s %12" PRId64 "\n", "failed at their deadline", c_.deadline);
    std::printf("%-28s %12" PRId64 "\n", "submitted by continuations", c_.followups);
    std::printf("%-28s %12" PRId64 "\n", "unexplained failure", c_.unexplained);
    std::printf("%-28s %12" PRId64 "\n", "continuation run twice", c_.duplicate);
    std::printf("epochs: %" PRId64 " (devices die in %" PRId64 ", revived %" PRId64 " times), devices %s, in flight %d, values %s, faults %s\n",
                c_.epochs, c_.deaths_configured, c_.revivals, o_.devices.c_str(), o_.in_flight, o_.values.c_str(),
                o_.faults ? "on" : "off");
    std::printf("soak_jobs: %" PRId64 "\n", c_.jobs);
    std::printf("soak_lost: %" PRId64 "\n", c_.lost);
    std::printf("soak_hung: %" PRId64 "\n", c_.hung);
    std::printf("soak_wrong: %" PRId64 "\n", c_.wrong + c_.unexplained + c_.duplicate);
    std::printf("soak_failed_by_faults: %" PRId64 "\n", c_.faults);
    std::printf("soak_jobs_per_s: %.0f\n", static_cast<double>(c_.jobs) / std::max(secs, 1e-9));
    std::printf("soak_rss_growth: %.3f\n", growth);
    std::printf("soak_seconds: %.1f\n", secs);
  }

  options o_;
  std::mt19937_64 rng_;
  std::vector<soak_plan> plans_;
  counts c_;
  int64_t rss_first10_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  ag::apps::flags app("actorgraph-soak",
                      "Soak test through the public API: many jobs of several plan shapes with injected faults, "
                      "cancels, deadlines and continuations; every job must end exactly once, correctly or with "
                      "an error naming the device and fault.");
  app.add_option("--jobs", o.jobs, "jobs in all (continuations' jobs included)")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--devices", o.devices, "device spec (sim devices get the faults)");
  app.add_option("--in-flight", o.in_flight, "jobs the soak keeps in flight")->check(CLI::Range(1, 100000));
  app.add_option("--seed", o.seed, "seed of every random choice");
  bool check_order = true;
  app.add_option("--check-collective-order", check_order,
                 "host devices check NCCL's pairing rule at every collective part (gpu/host/collective_sequence.hpp): "
                 "a broken order fails the part, naming both (on/off)");
  app.add_option("--faults", o.faults, "inject op errors, stalls and device deaths (on/off)");
  ag::apps::add_on_off(app, "--values", o.values, "compute values and check them (on), or timing only (off)");
  app.add_option("--epochs", o.epochs, "runtimes created one after the other (dead devices return in the next); 0: one per 10,000 jobs, at least 2")
      ->check(CLI::Range(1, 100000));
  app.add_option("--time-scale", o.time_scale, "sim wall seconds per simulated second")->check(CLI::Range(0.0, 10.0));
  app.add_option("--jitter", o.jitter, "sim lognormal jitter (relative stddev)")->check(CLI::Range(0.0, 10.0));
  app.add_option("--op-error-rate", o.op_error_rate, "injected op errors per op")->check(CLI::Range(0.0, 1.0));
  app.add_option("--op-stall-rate", o.op_stall_rate, "injected stalls per op")->check(CLI::Range(0.0, 1.0));
  app.add_option("--stall-seconds", o.stall_seconds, "wall seconds a stalled op takes extra")->check(CLI::Range(0.0, 10.0));
  app.add_option("--death-fraction", o.death_fraction, "share of epochs whose devices die")->check(CLI::Range(0.0, 1.0));
  app.add_option("--cancel-rate", o.cancel_rate, "share of jobs cancelled")->check(CLI::Range(0.0, 1.0));
  app.add_option("--deadline-rate", o.deadline_rate, "share of jobs submitted with a 1 us..2 ms deadline")->check(CLI::Range(0.0, 1.0));
  app.add_option("--continuation-rate", o.continuation_rate, "share of jobs whose continuation submits a job")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--check-all-below", o.check_all_below, "check every job's outputs up to this many jobs");
  app.add_option("--check-every", o.check_every, "then check one job in this many")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--watchdog", o.watchdog_s, "seconds after which an unfinished job counts as hung")->check(CLI::Range(0.1, 3600.0));
  app.add_option("--arenas", o.arenas, "arenas per device and plan")->check(CLI::Range(1, 65536));
  if (auto st = ag::apps::parse_flags(app, argc, argv)) return *st;
  ag::gpu::host::collective_sequence::checking().store(check_order);
  return soak(o).run();
}
