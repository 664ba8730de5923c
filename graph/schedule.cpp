// Step order by the cost model: a simulation of one job over the plan's
// queues, and a search over the order of the collectives on the
// communication queues (planner::order_steps, plan::modelled_seconds).
//
// Why: the step builder numbers steps close to the graph's order, and each
// queue runs its steps in that order. Across two chunked tensor-parallel
// regions that is not what keeps the compute lanes busy: the next region's
// first all-gather queues behind the previous region's last reduce-scatter,
// and its first chunk of compute waits for both. The search's simulation
// lets each compute lane take the lowest-numbered step whose inputs are
// ready (not the next in line) while each communication queue runs its
// collectives in the order searched, waiting for the next one as the
// runtime's queue does; the search swaps neighbouring collectives on the
// communication queues while the modelled span of the job shrinks (a swap
// may make a queue wait for an all-gather whose operand is made 20 us
// later, so that a reduce-scatter that no one needs yet runs after it).

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>
#include <vector>

#include "graph/planner_internal.hpp"

namespace ag {

namespace {

/// One job's steps as the simulation sees them: units (a step, or every part
/// of one collective together, since its parts start together), each on one
/// or more queues ((device, compute lane), a device's communication queue,
/// a device's copy queue of one kind).
struct sim_model {
  std::vector<int> unit_of;                 // [step] -> unit
  std::vector<std::vector<step_id>> steps;  // [unit] -> its steps
  std::vector<std::vector<int>> queues;     // [unit] -> its queues
  std::vector<std::vector<int>> succ;       // [unit] -> units that wait for it
  std::vector<int> indeg;                   // [unit] -> units it waits for
  std::vector<double> seconds;              // [unit]
  std::vector<char> on_comm;                // [unit] -> a collective on communication queues
  std::vector<char> comm_queue;             // [queue] -> a communication queue
  int nqueues = 0;
};

sim_model build_model(const std::vector<step>& steps) {
  sim_model m;
  m.unit_of.assign(steps.size(), -1);
  std::map<std::tuple<int, int, int>, int> queue_ids;
  const auto queue_of = [&](const step& st) {
    std::tuple<int, int, int> key;
    if (on_compute_lane(st)) key = {st.device, -1, st.lane};
    else key = {st.device, static_cast<int>(st.kind), 0};
    auto [it, fresh] = queue_ids.try_emplace(key, static_cast<int>(queue_ids.size()));
    return it->second;
  };
  for (const step& st : steps) {
    if (m.unit_of[static_cast<std::size_t>(st.id)] >= 0) continue;
    const int u = static_cast<int>(m.steps.size());
    std::vector<step_id> members =
        st.kind == step_kind::collective && !st.peers.empty() ? st.peers : std::vector<step_id>{st.id};
    double t = 0;
    std::vector<int> qs;
    for (step_id s : members) {
      m.unit_of[static_cast<std::size_t>(s)] = u;
      const step& ms = steps[static_cast<std::size_t>(s)];
      t = std::max(t, ms.est_seconds);  // the planner's estimate
      qs.push_back(queue_of(ms));
    }
    std::sort(qs.begin(), qs.end());
    qs.erase(std::unique(qs.begin(), qs.end()), qs.end());
    m.steps.push_back(std::move(members));
    m.queues.push_back(std::move(qs));
    m.seconds.push_back(t);
    m.on_comm.push_back(st.kind == step_kind::collective && !runs_in_stream(st));
  }
  const std::size_t n = m.steps.size();
  m.succ.assign(n, {});
  m.indeg.assign(n, 0);
  for (std::size_t u = 0; u < n; ++u) {
    std::vector<int> pred;
    for (step_id s : m.steps[u])
      for (step_id d : steps[static_cast<std::size_t>(s)].deps) {
        const int du = m.unit_of[static_cast<std::size_t>(d)];
        if (du != static_cast<int>(u)) pred.push_back(du);
      }
    std::sort(pred.begin(), pred.end());
    pred.erase(std::unique(pred.begin(), pred.end()), pred.end());
    for (int d : pred) m.succ[static_cast<std::size_t>(d)].push_back(static_cast<int>(u));
    m.indeg[u] = static_cast<int>(pred.size());
  }
  m.nqueues = static_cast<int>(queue_ids.size());
  m.comm_queue.assign(queue_ids.size(), 0);
  for (std::size_t u = 0; u < n; ++u)
    if (m.on_comm[u])
      for (int q : m.queues[u]) m.comm_queue[static_cast<std::size_t>(q)] = 1;
  return m;
}

/// How the simulation's queues pick their next unit.
enum class queue_order {
  /// Every queue runs its units in priority order, the next waiting for its
  /// inputs: how the runtime runs a plan.
  all,
  /// Communication queues so; a compute or copy queue takes the ready unit
  /// of lowest priority (list scheduling). The search's model: the order of
  /// the collectives is what it chooses (a queue may wait for the one it
  /// put first, as the runtime's does), the compute lanes' follows from it.
  communication,
};

/// One job simulated: each unit starts when its inputs are ready and each of
/// its queues is free, its queues picking as `order` says. Returns the span
/// (seconds), each unit's start and the time its inputs were ready; a
/// negative span when the units cannot all run (priorities that disagree
/// across a collective's queues).
double simulate(const sim_model& m, const std::vector<double>& priority, queue_order order, std::vector<double>& start,
                std::vector<double>& ready) {
  const std::size_t n = m.steps.size();
  const auto nq = static_cast<std::size_t>(m.nqueues);
  start.assign(n, -1.0);
  ready.assign(n, 0.0);
  std::vector<double> free(nq, 0.0);
  std::vector<int> indeg = m.indeg;
  std::vector<char> available(n, 0);
  using by_priority = std::pair<double, int>;
  // A queue in order: its units by priority and a cursor; else a heap of
  // the available ones.
  std::vector<char> in_order(nq, 1);
  if (order == queue_order::communication)
    for (std::size_t q = 0; q < nq; ++q) in_order[q] = m.comm_queue[q];
  std::vector<std::vector<int>> line(nq);
  std::vector<std::size_t> cursor(nq, 0);
  std::vector<std::priority_queue<by_priority, std::vector<by_priority>, std::greater<>>> heap(nq);
  for (std::size_t u = 0; u < n; ++u)
    for (int q : m.queues[u])
      if (in_order[static_cast<std::size_t>(q)]) line[static_cast<std::size_t>(q)].push_back(static_cast<int>(u));
  for (auto& l : line)
    std::sort(l.begin(), l.end(), [&](int a, int b) {
      return priority[static_cast<std::size_t>(a)] < priority[static_cast<std::size_t>(b)];
    });
  // Events: (time, kind, id): kind 0 = unit id becomes available, 1 = queue
  // id checks for work. Availability first at equal times.
  using event = std::tuple<double, int, int>;
  std::priority_queue<event, std::vector<event>, std::greater<>> events;
  for (std::size_t u = 0; u < n; ++u)
    if (indeg[u] == 0) events.emplace(0.0, 0, static_cast<int>(u));
  std::size_t started = 0;
  double span = 0;
  const auto next_of = [&](std::size_t q) -> int {
    if (in_order[q]) {
      while (cursor[q] < line[q].size() && start[static_cast<std::size_t>(line[q][cursor[q]])] >= 0) ++cursor[q];
      if (cursor[q] == line[q].size()) return -1;
      const int u = line[q][cursor[q]];
      return available[static_cast<std::size_t>(u)] ? u : -1;
    }
    while (!heap[q].empty() && start[static_cast<std::size_t>(heap[q].top().second)] >= 0) heap[q].pop();
    return heap[q].empty() ? -1 : heap[q].top().second;
  };
  while (!events.empty()) {
    const auto [t, kind, id] = events.top();
    events.pop();
    if (kind == 0) {
      const auto u = static_cast<std::size_t>(id);
      available[u] = 1;
      for (int q : m.queues[u]) {
        if (!in_order[static_cast<std::size_t>(q)]) heap[static_cast<std::size_t>(q)].emplace(priority[u], id);
        events.emplace(std::max(t, free[static_cast<std::size_t>(q)]), 1, q);
      }
      continue;
    }
    const auto q = static_cast<std::size_t>(id);
    if (free[q] > t) continue;  // busy: it checks again when it frees
    const int u = next_of(q);
    if (u < 0) continue;
    const auto uu = static_cast<std::size_t>(u);
    // A unit on several queues starts when all of them are free and have it
    // next; the last of them to check starts it.
    bool go = true;
    for (int o : m.queues[uu]) go = go && free[static_cast<std::size_t>(o)] <= t && next_of(static_cast<std::size_t>(o)) == u;
    if (!go) continue;
    start[uu] = t;
    ++started;
    const double end = t + m.seconds[uu];
    span = std::max(span, end);
    for (int o : m.queues[uu]) {
      free[static_cast<std::size_t>(o)] = end;
      events.emplace(end, 1, o);
    }
    for (int s : m.succ[uu]) {
      const auto su = static_cast<std::size_t>(s);
      ready[su] = std::max(ready[su], end);
      if (--indeg[su] == 0) events.emplace(ready[su], 0, s);
    }
  }
  return started == n ? span : -1.0;
}

std::vector<double> step_order_priority(const sim_model& m) {
  std::vector<double> pr(m.steps.size());
  for (std::size_t u = 0; u < pr.size(); ++u) pr[u] = static_cast<double>(*std::min_element(m.steps[u].begin(), m.steps[u].end()));
  return pr;
}

}  // namespace

double plan::modelled_seconds() const {
  if (steps_.empty()) return 0;
  const sim_model m = build_model(steps_);
  std::vector<double> start, ready;
  return std::max(0.0, simulate(m, step_order_priority(m), queue_order::all, start, ready));
}

void planner::order_steps(plan& p) {
  // Only plans with collectives on communication queues: their order is what
  // the search changes (other plans keep the builder's order).
  const sim_model m = build_model(p.steps_);
  int comm_units = 0;
  for (char c : m.on_comm) comm_units += c;
  if (comm_units < 2) return;
  const std::vector<double> given = step_order_priority(m);
  std::vector<double> start, ready;
  const double before = simulate(m, given, queue_order::all, start, ready);
  if (before <= 0) return;

  std::vector<double> best_priority = given, best_start, best_ready;
  double best = simulate(m, best_priority, queue_order::communication, best_start, best_ready);
  if (best < 0) return;
  // Hill climbing: swap two collectives that follow each other on a
  // communication queue (their priorities: every member queue sees the
  // swap), keep it when the span shrinks. Bounded work: at most 5e4 / units
  // simulations (at least 1), so about 5e4 units simulated in all: a plan of
  // 80 layers over 64 devices (16k units) takes well under 0.1 s more to
  // compile, and tries few swaps; a layer of 100 units tries 500.
  const std::size_t n = m.steps.size();
  long budget = std::max<long>(1, static_cast<long>(5e4 / static_cast<double>(std::max<std::size_t>(n, 1))));
  bool improved = true;
  while (improved && budget > 0) {
    improved = false;
    // The collectives of each communication queue in the order they ran.
    std::vector<std::vector<int>> seq(static_cast<std::size_t>(m.nqueues));
    for (std::size_t u = 0; u < n; ++u)
      if (m.on_comm[u])
        for (int q : m.queues[u]) seq[static_cast<std::size_t>(q)].push_back(static_cast<int>(u));
    std::vector<std::pair<int, int>> pairs;
    for (auto& s : seq) {
      std::sort(s.begin(), s.end(), [&](int a, int b) {
        return std::make_pair(best_start[static_cast<std::size_t>(a)], best_priority[static_cast<std::size_t>(a)]) <
               std::make_pair(best_start[static_cast<std::size_t>(b)], best_priority[static_cast<std::size_t>(b)]);
      });
      // Only a pair whose second was ready before the first ended: the
      // queue could have run it first (waiting for it, if it was not ready
      // yet, while the first was), else the swap cannot start it sooner.
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const auto a = static_cast<std::size_t>(s[i]);
        if (best_ready[static_cast<std::size_t>(s[i + 1])] < best_start[a] + m.seconds[a]) pairs.emplace_back(s[i], s[i + 1]);
      }
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    for (auto [a, b] : pairs) {
      if (budget-- <= 0) break;
      std::vector<double> trial = best_priority;
      std::swap(trial[static_cast<std::size_t>(a)], trial[static_cast<std::size_t>(b)]);
      std::vector<double> trial_start, trial_ready;
      const double t = simulate(m, trial, queue_order::communication, trial_start, trial_ready);
      if (t > 0 && t < best * (1 - 1e-6)) {
        best = t;
        best_priority = std::move(trial);
        best_start = std::move(trial_start);
        best_ready = std::move(trial_ready);
        improved = true;  // the next pass takes the pairs of the new order
      }
    }
  }
  // Worth a new order only if the model says so (0.1%): else the builder's.
  p.builder_order_seconds_ = p.kept_order_seconds_ = before;
  if (!(best < before * 0.999)) return;
  p.kept_order_seconds_ = best;

  // New ids: by simulated start, ties by the old id (a topological order:
  // a unit starts no earlier than its inputs finish, and ties keep the old
  // order, which was one).
  std::vector<step_id> order(p.steps_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<step_id>(i);
  std::stable_sort(order.begin(), order.end(), [&](step_id a, step_id b) {
    return best_start[static_cast<std::size_t>(m.unit_of[static_cast<std::size_t>(a)])] <
           best_start[static_cast<std::size_t>(m.unit_of[static_cast<std::size_t>(b)])];
  });
  std::vector<step_id> new_id(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) new_id[static_cast<std::size_t>(order[i])] = static_cast<step_id>(i);
  std::vector<step> result;
  result.reserve(order.size());
  for (step_id old : order) result.push_back(std::move(p.steps_[static_cast<std::size_t>(old)]));
  for (step& st : result) {
    st.id = new_id[static_cast<std::size_t>(st.id)];
    for (step_id& d : st.deps) d = new_id[static_cast<std::size_t>(d)];
    std::sort(st.deps.begin(), st.deps.end());
    for (step_id& q : st.peers) q = new_id[static_cast<std::size_t>(q)];
    st.consumers.clear();
  }
  for (step& st : result)
    for (step_id d : st.deps) result[static_cast<std::size_t>(d)].consumers.push_back(st.id);
  p.steps_ = std::move(result);
}

}  // namespace ag
