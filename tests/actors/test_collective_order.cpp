// The agreed collective issue order (actors/collective_order.hpp, the class
// every communication queue's actor uses) against a model of a group's
// members whose operands become ready in different orders, deterministically.
//
// Why a model and not the actors on the test coordinator: there, every
// channel is FIFO and a job's run_job fan-out is one handler, so `ready`
// messages reach every member in job-number order and the order is never
// exercised (the runtime's randomized protocol test passes with it off).
// The race it guards against needs two scheduler threads interleaving two
// jobs' fan-outs; this model delivers exactly such orders.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actors/collective_order.hpp"
#include "graph/random.hpp"

namespace {

using collective_issue_order = ag::actors::collective_issue_order<>;
using issued_t = std::pair<int, int>;  // (job number, position in the job's queue)

/// One member's communication queue, issuing as stream_actor's advance()
/// does: a job's collectives in queue position order, each once its operand
/// is ready and the issue order says it is the job's turn; a job that issued
/// its last one finishes its turn and resumes the job parked next.
struct member {
  collective_issue_order order;
  int positions;
  std::vector<int> next;                 // per job: next position to issue
  std::vector<std::vector<bool>> ready;  // per job, per position: operand ready here
  std::vector<issued_t> issued;          // what the communicator sees, in order

  member(int jobs, int positions_per_job, bool enforce)
      : order(enforce), positions(positions_per_job), next(static_cast<std::size_t>(jobs), 0),
        ready(static_cast<std::size_t>(jobs), std::vector<bool>(static_cast<std::size_t>(positions_per_job), false)) {}

  void operand_ready(int job, int pos) {
    ready[static_cast<std::size_t>(job)][static_cast<std::size_t>(pos)] = true;
    advance(job);
  }
  void advance(int job) {
    auto& n = next[static_cast<std::size_t>(job)];
    while (n < positions && ready[static_cast<std::size_t>(job)][static_cast<std::size_t>(n)]) {
      if (!order.may_issue(static_cast<uint64_t>(job), static_cast<uint64_t>(job))) return;
      issued.emplace_back(job, n);
      ++n;
    }
    if (n == positions)
      if (auto resumed = order.finish(static_cast<uint64_t>(job))) advance(static_cast<int>(*resumed));
  }
};

/// A rendezvous library (NCCL) pairs each member's k-th call with every
/// other member's k-th call. Empty when all members' k-th calls are the same
/// collective for every k; otherwise what got paired wrongly (mixed data, or
/// a hang where the sizes differ).
std::string rendezvous_mismatch(const std::vector<member>& ms) {
  for (std::size_t m = 1; m < ms.size(); ++m) {
    const auto& a = ms[0].issued;
    const auto& b = ms[m].issued;
    for (std::size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
      const std::string x = k < a.size() ? "job " + std::to_string(a[k].first) + " pos " + std::to_string(a[k].second) : "nothing";
      const std::string y = k < b.size() ? "job " + std::to_string(b[k].first) + " pos " + std::to_string(b[k].second) : "nothing";
      if (x != y) return "call " + std::to_string(k) + ": member 0 issued " + x + ", member " + std::to_string(m) + " " + y;
    }
  }
  return {};
}

/// Member 0 sees job 1's operands before job 0's; member 1 the opposite.
std::vector<member> run_crossed(bool enforce, std::size_t* parked_midway = nullptr) {
  std::vector<member> ms(2, member(2, 2, enforce));
  ms[0].operand_ready(1, 0);
  ms[0].operand_ready(1, 1);
  ms[1].operand_ready(0, 0);
  ms[1].operand_ready(0, 1);
  if (parked_midway) *parked_midway = ms[0].order.parked();
  ms[0].operand_ready(0, 0);
  ms[0].operand_ready(0, 1);
  ms[1].operand_ready(1, 0);
  ms[1].operand_ready(1, 1);
  return ms;
}

TEST(CollectiveOrder, CrossedReadyOrdersStillIssueByJobNumberOnEveryMember) {
  std::size_t parked = 0;
  const auto ms = run_crossed(true, &parked);
  EXPECT_EQ(parked, 1u) << "member 0 must hold job 1 back until job 0 issued";
  const std::vector<issued_t> agreed{{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  for (const auto& m : ms) {
    EXPECT_EQ(m.issued, agreed);
    EXPECT_EQ(m.order.parked(), 0u) << "a job still waits: deadlock";
    EXPECT_EQ(m.order.next(), 2u);
  }
  EXPECT_EQ(rendezvous_mismatch(ms), "");
}

// The hook that turns the order off reproduces the hazard, and the check
// above detects it: the test of the order can fail.
TEST(CollectiveOrder, WithoutTheOrderCrossedReadyOrdersMispairCollectives) {
  const auto ms = run_crossed(false);
  EXPECT_EQ(ms[0].issued.front(), issued_t(1, 0));
  EXPECT_EQ(ms[1].issued.front(), issued_t(0, 0));
  EXPECT_EQ(rendezvous_mismatch(ms), "call 0: member 0 issued job 1 pos 0, member 1 job 0 pos 0");
}

/// Hands member `m` the operands of positions 0..positions-1 of every job
/// that `has(job)` accepts, in a random order drawn from `r`.
template <class Member, class Has>
void deliver_shuffled(Member& m, int jobs, int positions, ag::rng& r, Has has) {
  std::vector<issued_t> events;
  for (int j = 0; j < jobs; ++j)
    if (has(j))
      for (int p = 0; p < positions; ++p) events.emplace_back(j, p);
  for (std::size_t i = events.size(); i > 1; --i) std::swap(events[i - 1], events[r.next() % i]);
  for (auto [j, p] : events) m.operand_ready(j, p);
}

/// Every member gets every (job, position) operand in its own random order.
std::vector<member> run_random(uint64_t seed, int members, int jobs, int positions, bool enforce) {
  std::vector<member> ms(static_cast<std::size_t>(members), member(jobs, positions, enforce));
  ag::rng r(seed);
  for (auto& m : ms) deliver_shuffled(m, jobs, positions, r, [](int) { return true; });
  return ms;
}

TEST(CollectiveOrder, RandomReadyOrdersOnThreeMembersAgreeAndNeverDeadlock) {
  int hazards_without = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto ms = run_random(seed, 3, 5, 3, true);
    for (const auto& m : ms) {
      ASSERT_EQ(m.issued.size(), 15u) << "a collective was never issued: deadlock";
      EXPECT_TRUE(std::is_sorted(m.issued.begin(), m.issued.end())) << "not in (job number, position) order";
      EXPECT_EQ(m.order.parked(), 0u);
    }
    EXPECT_EQ(rendezvous_mismatch(ms), "");
    hazards_without += !rendezvous_mismatch(run_random(seed, 3, 5, 3, false)).empty();
  }
  // The same orders without the agreed order mispair collectives (nearly always).
  EXPECT_GT(hazards_without, 150);
}

// A cancelled job gives up its turn: the job parked behind it issues.
TEST(CollectiveOrder, CancellingTheJobInTurnResumesTheNextOne) {
  member m(3, 1, true);
  m.operand_ready(2, 0);
  m.operand_ready(1, 0);
  EXPECT_TRUE(m.issued.empty());
  EXPECT_EQ(m.order.parked(), 2u);
  // Job 0 is cancelled (stream_actor: forget, then finish its turn).
  m.order.forget(0);
  const auto resumed = m.order.finish(0);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(*resumed, 1u);
  m.advance(1);
  EXPECT_EQ(m.issued, (std::vector<issued_t>{{1, 0}, {2, 0}}));
  EXPECT_EQ(m.order.next(), 3u);
  EXPECT_FALSE(m.order.finish(0).has_value()) << "finishing twice counts once";
  EXPECT_EQ(m.order.next(), 3u);
}

// ---- Across plans: the runtime's issue lines (issue_lines) ----
//
// Two plans' jobs on the same devices (a generator's prompt and decode
// plans with several sequences in flight) meet the same communicator, stream
// and in-stream inboxes. Below, plan 0 spans members 0, 1 and 2, plan 1
// members 0 and 1; each job has `positions` collectives on its members'
// lines. Jobs start (draw) in a random order that interleaves the plans, and
// each member sees their operands ready in its own random order.

struct model_job {
  int plan = 0;
  std::vector<uint64_t> turns;  // by member: its turn on that member's line (or its plan's number)
};

const std::vector<std::vector<int>> plan_members{{0, 1, 2}, {0, 1}};

bool uses(const model_job& j, int member) {
  const auto& ms = plan_members[static_cast<std::size_t>(j.plan)];
  return std::find(ms.begin(), ms.end(), member) != ms.end();
}

/// One member's line as stream_actor runs it: one collective_issue_order for
/// the line (`per_plan` false, the runtime since session 89) or one per plan
/// (`per_plan`, the runtime before: each plan numbered its own jobs).
struct line_member {
  int id;
  int positions;
  bool per_plan;
  const std::vector<model_job>* jobs;
  std::map<int, collective_issue_order> orders;  // by plan, or just [0]
  std::map<int, int> next;                      // by job: next position to issue
  std::map<int, std::vector<bool>> ready;       // by job, per position
  std::vector<issued_t> issued;

  collective_issue_order& order_of(int job) {
    return orders.try_emplace(per_plan ? (*jobs)[static_cast<std::size_t>(job)].plan : 0, true).first->second;
  }
  uint64_t turn(int job) const { return (*jobs)[static_cast<std::size_t>(job)].turns[static_cast<std::size_t>(id)]; }
  void operand_ready(int job, int pos) {
    auto& r = ready[job];
    r.resize(static_cast<std::size_t>(positions), false);
    r[static_cast<std::size_t>(pos)] = true;
    advance(job);
  }
  void advance(int job) {
    auto& n = next[job];
    auto& r = ready[job];
    r.resize(static_cast<std::size_t>(positions), false);
    while (n < positions && r[static_cast<std::size_t>(n)]) {
      if (!order_of(job).may_issue(turn(job), static_cast<uint64_t>(job))) return;
      issued.emplace_back(job, n);
      ++n;
    }
    if (n == positions)
      if (auto resumed = order_of(job).finish(turn(job))) advance(static_cast<int>(*resumed));
  }
};

/// Empty when every two members issued their shared jobs' collectives in
/// the same order (what a rendezvous needs); else the first difference.
std::string shared_mismatch(const std::vector<line_member>& ms, const std::vector<model_job>& jobs) {
  for (std::size_t a = 0; a < ms.size(); ++a)
    for (std::size_t b = a + 1; b < ms.size(); ++b) {
      std::vector<issued_t> x, y;
      for (auto i : ms[a].issued)
        if (uses(jobs[static_cast<std::size_t>(i.first)], static_cast<int>(b))) x.push_back(i);
      for (auto i : ms[b].issued)
        if (uses(jobs[static_cast<std::size_t>(i.first)], static_cast<int>(a))) y.push_back(i);
      for (std::size_t k = 0; k < std::min(x.size(), y.size()); ++k)
        if (x[k] != y[k])
          return "members " + std::to_string(a) + " and " + std::to_string(b) + ", shared call " + std::to_string(k) +
                 ": job " + std::to_string(x[k].first) + " against job " + std::to_string(y[k].first);
    }
  return {};
}

struct cross_plan_run {
  std::vector<model_job> jobs;
  std::vector<line_member> members;
  std::size_t expected_calls(int member) const {
    std::size_t n = 0;
    for (const auto& j : jobs) n += uses(j, member) ? static_cast<std::size_t>(members[0].positions) : 0;
    return n;
  }
};

cross_plan_run run_cross_plan(uint64_t seed, int jobs_count, int positions, bool per_plan) {
  ag::rng r(seed);
  cross_plan_run run;
  // Jobs start in this order; plans interleave at random.
  ag::actors::issue_lines dealer;
  const std::vector<ag::actors::issue_line> lines{{101, 0}, {102, 0}, {103, 0}};  // each member's comm actor, lane 0
  std::vector<uint64_t> plan_count(plan_members.size(), 0);
  for (int j = 0; j < jobs_count; ++j) {
    model_job mj;
    mj.plan = static_cast<int>(r.next() % plan_members.size());
    if (per_plan) {
      mj.turns.assign(lines.size(), plan_count[static_cast<std::size_t>(mj.plan)]++);
    } else {
      std::vector<ag::actors::issue_line> mine(lines.size());  // none where the plan has no queue
      for (int m : plan_members[static_cast<std::size_t>(mj.plan)]) mine[static_cast<std::size_t>(m)] = lines[static_cast<std::size_t>(m)];
      dealer.draw(mine, mj.turns);
    }
    run.jobs.push_back(std::move(mj));
  }
  for (int m = 0; m < 3; ++m) run.members.push_back(line_member{m, positions, per_plan, &run.jobs, {}, {}, {}, {}});
  for (auto& m : run.members) {
    m.jobs = &run.jobs;
    deliver_shuffled(m, jobs_count, positions, r,
                     [&](int j) { return uses(run.jobs[static_cast<std::size_t>(j)], m.id); });
  }
  return run;
}

TEST(CollectiveOrder, TwoPlansOnSharedDevicesIssueInOneOrderOnEveryLine) {
  int hazards_per_plan = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto run = run_cross_plan(seed, 8, 2, false);
    for (const auto& m : run.members) {
      ASSERT_EQ(m.issued.size(), run.expected_calls(m.id)) << "member " << m.id << ": a collective never issued (deadlock)";
      for (const auto& [plan, order] : m.orders) EXPECT_EQ(order.parked(), 0u);
    }
    EXPECT_EQ(shared_mismatch(run.members, run.jobs), "");
    const auto old = run_cross_plan(seed, 8, 2, true);
    hazards_per_plan += !shared_mismatch(old.members, old.jobs).empty();
  }
  // Each plan numbering its own jobs (the runtime before session 89) keeps
  // each plan's order but mispairs the two plans' collectives.
  EXPECT_GT(hazards_per_plan, 100);
}

TEST(CollectiveOrder, ALinesTurnsRunWithoutGapsAndOnlyWhereAJobHasAQueue) {
  ag::actors::issue_lines dealer;
  const ag::actors::issue_line a{7, 0}, a1{7, 1}, b{8, 0}, none{};
  std::vector<uint64_t> t;
  EXPECT_EQ(dealer.draw({a, b}, t), 0u);
  EXPECT_EQ(t, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(dealer.draw({a, none}, t), 1u);
  EXPECT_EQ(t, (std::vector<uint64_t>{1, 0})) << "no turn is taken on a queue that orders nothing";
  EXPECT_EQ(dealer.draw({a1, b}, t), 2u);
  EXPECT_EQ(t, (std::vector<uint64_t>{0, 1})) << "another lane of the same actor is a line of its own";
  dealer.draw({b, a}, t);
  EXPECT_EQ(t, (std::vector<uint64_t>{2, 2}));
}

}  // namespace
