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

/// Every member gets every (job, position) operand in its own random order.
std::vector<member> run_random(uint64_t seed, int members, int jobs, int positions, bool enforce) {
  std::vector<member> ms(static_cast<std::size_t>(members), member(jobs, positions, enforce));
  ag::rng r(seed);
  for (auto& m : ms) {
    std::vector<issued_t> events;
    for (int j = 0; j < jobs; ++j)
      for (int p = 0; p < positions; ++p) events.emplace_back(j, p);
    for (std::size_t i = events.size(); i > 1; --i) std::swap(events[i - 1], events[r.next() % i]);
    for (auto [j, p] : events) m.operand_ready(j, p);
  }
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

}  // namespace
