#include "gpu/cpu/ring.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/cpu/collective.hpp"
#include "gpu/host/host_stream.hpp"

namespace ag::gpu::cpu {

namespace {

/// A run of elements of one chunk. `at`: offset in the full operand
/// (reductions) or in the gathered result (all_gather); `out_at`: where it
/// lands in this member's output for reduce_scatter's last step; `src_at`:
/// all_gather, offset in the owner's operand.
struct segment {
  int64_t at = 0;
  int64_t out_at = 0;
  int64_t src_at = 0;
  int64_t len = 0;
};
using chunk = std::vector<segment>;

/// The meeting point of one collective's parts.
struct session {
  explicit session(int t) : progress(static_cast<std::size_t>(t)), ranges(static_cast<std::size_t>(t)),
                            outs(static_cast<std::size_t>(t)), scratch(static_cast<std::size_t>(t)) {
    for (auto& p : progress) p = std::make_unique<host::event_state>();
  }
  /// Member r's progress: generation 1 once it joined (its range, output and
  /// scratch published), 1 + k once it finished step k.
  std::vector<std::unique_ptr<host::event_state>> progress;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // reduce_scatter: each rank's [begin, end)
  std::vector<std::byte*> outs;                     // each member's output
  std::vector<std::unique_ptr<std::byte[]>> scratch;  // reduce_scatter: each member's partial sums
  std::mutex mutex;                                 // joined / left / failed
  int joined = 0;
  int left = 0;
  std::atomic<bool> aborted{false};
  error failed;  // the first part's error that stopped it
};

/// (job, rank 0's operand, group, op, members): equal for the parts of one
/// collective, distinct among collectives in flight (ring.hpp).
using session_key = std::tuple<const void*, const void*, int, int, std::size_t>;

std::mutex registry_mutex;
std::map<session_key, std::shared_ptr<session>>& registry() {
  static std::map<session_key, std::shared_ptr<session>> r;
  return r;
}

std::shared_ptr<session> join(const session_key& key, int t) {
  std::lock_guard<std::mutex> lk(registry_mutex);
  auto& s = registry()[key];
  if (!s) s = std::make_shared<session>(t);
  std::lock_guard<std::mutex> sl(s->mutex);
  ++s->joined;
  return s;
}

/// The part leaves; the session goes once every member left, or once every
/// part that came left after one failed (a member that never comes belongs to
/// a failed job: it finds its own reason to stop, in a fresh session).
void leave(const session_key& key, session& s, int t, const error* failure) {
  std::lock_guard<std::mutex> lk(registry_mutex);
  std::lock_guard<std::mutex> sl(s.mutex);
  ++s.left;
  if (failure && !s.aborted.load()) {
    s.failed = *failure;
    s.aborted.store(true, std::memory_order_release);
  }
  if (s.left == t || (s.aborted.load() && s.left == s.joined)) {
    auto it = registry().find(key);
    if (it != registry().end() && it->second.get() == &s) registry().erase(it);
  }
  // Neighbours parked on this part's progress see `aborted` at their next
  // poll (wait_for's abort check, every millisecond).
}

/// dst[d + i] = a[a0 + i] + b[b0 + i] for i < n, in the dtype (f16 / bf16
/// through f32, rounded once per step; i32 in 64 bits, saturated).
void add(std::byte* dst, int64_t d, const std::byte* a, int64_t a0, const std::byte* b, int64_t b0, int64_t n,
         dtype t) {
  if (t == dtype::i32) {
    for (int64_t i = 0; i < n; ++i) {
      int32_t x, y;
      std::memcpy(&x, a + (a0 + i) * 4, 4);
      std::memcpy(&y, b + (b0 + i) * 4, 4);
      const int64_t s = std::clamp<int64_t>(int64_t{x} + y, std::numeric_limits<int32_t>::min(),
                                            std::numeric_limits<int32_t>::max());
      const auto v = static_cast<int32_t>(s);
      std::memcpy(dst + (d + i) * 4, &v, 4);
    }
    return;
  }
  if (t == dtype::f32) {
    float tmp_a, tmp_b;  // memcpy: operands need not be float-aligned views
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&tmp_a, a + (a0 + i) * 4, 4);
      std::memcpy(&tmp_b, b + (b0 + i) * 4, 4);
      const float s = tmp_a + tmp_b;
      std::memcpy(dst + (d + i) * 4, &s, 4);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_element(dst, t, d + i, static_cast<float>(load_element(a, t, a0 + i)) + static_cast<float>(load_element(b, t, b0 + i)));
}

/// The chunks of `c` (one per rank) and the byte size of its operand.
std::vector<chunk> chunks_of(const collective_launch& c, const session& s) {
  const node& n = *c.op;
  const auto t = static_cast<int64_t>(c.inputs.size());
  std::vector<chunk> out(static_cast<std::size_t>(t));
  if (n.op == op_kind::all_reduce) {
    const int64_t total = c.inputs[0].dims.numel();
    for (int64_t k = 0; k < t; ++k) {
      const int64_t b = total * k / t, e = total * (k + 1) / t;
      out[static_cast<std::size_t>(k)].push_back({b, b, 0, e - b});
    }
  } else if (n.op == op_kind::reduce_scatter) {
    const shape& full = c.inputs[0].dims;
    const int axis = n.attrs.axis;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= full[d];
    for (int d = axis + 1; d < full.rank(); ++d) inner *= full[d];
    for (int64_t k = 0; k < t; ++k) {
      const auto [b, e] = s.ranges[static_cast<std::size_t>(k)];
      for (int64_t o = 0; o < outer; ++o)
        out[static_cast<std::size_t>(k)].push_back({(o * full[axis] + b) * inner, o * (e - b) * inner, 0, (e - b) * inner});
    }
  } else {  // all_gather: per outer row, the ranks' parts one after another
    int64_t outer = 1;
    for (int d = 0; d < n.attrs.axis; ++d) outer *= n.dims[d];
    const int64_t row = n.dims.numel() / outer;
    int64_t prefix = 0;
    for (int64_t k = 0; k < t; ++k) {
      const int64_t part = c.inputs[static_cast<std::size_t>(k)].dims.numel() / outer;
      for (int64_t o = 0; o < outer; ++o) out[static_cast<std::size_t>(k)].push_back({o * row + prefix, 0, o * part, part});
      prefix += part;
    }
  }
  return out;
}

int mod(int a, int t) { return ((a % t) + t) % t; }

}  // namespace

int ring_sessions_in_flight() noexcept {
  std::lock_guard<std::mutex> lk(registry_mutex);
  return static_cast<int>(registry().size());
}

error run_ring_collective(const collective_launch& c, const ring_abort& should_abort) {
  const node& n = *c.op;
  const int t = static_cast<int>(c.inputs.size());
  const int r = c.rank;
  const dtype type = n.type;
  const auto es = static_cast<int64_t>(dtype_size(type));
  auto* out = static_cast<std::byte*>(c.out.data);
  if (t == 1) return run_collective(c);  // a group of one: nothing to meet
  const session_key key{c.cancelled.get(), c.inputs[0].data, n.attrs.group, static_cast<int>(n.op), c.inputs.size()};
  const std::shared_ptr<session> s = join(key, t);
  const auto fail = [&](error e) {
    leave(key, *s, t, &e);
    return e;
  };
  const auto in = [&](int k) { return static_cast<const std::byte*>(c.inputs[static_cast<std::size_t>(k)].data); };
  const int left = mod(r - 1, t), right = mod(r + 1, t);
  const std::string where = "ring " + std::string(to_string(n.op)) + " '" + n.name + "' rank " + std::to_string(r);
  // Waits until member k's progress reaches `gen`; stops when the caller's
  // abort says so, the job was cancelled or another part of the collective failed.
  const auto wait_for = [&](int k, uint64_t gen) -> error {
    const host::event_state& ev = *s->progress[static_cast<std::size_t>(k)];
    error why;
    const auto stop = [&] {
      if (s->aborted.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lk(s->mutex);
        why = s->failed;
        why.message = where + ": another part stopped: " + why.message;
        return true;
      }
      if (c.cancelled && c.cancelled->load(std::memory_order_acquire)) {
        why = error(errc::cancelled, where + ": its job was cancelled while it waited for rank " + std::to_string(k));
        return true;
      }
      if (should_abort) why = should_abort();
      return static_cast<bool>(why);
    };
    if (ev.wait_for(gen, stop, 1'000'000)) return {};
    return why;
  };

  // Join: publish what the neighbours read of this member.
  {
    std::lock_guard<std::mutex> lk(s->mutex);
    s->ranges[static_cast<std::size_t>(r)] = {n.attrs.begin, n.attrs.end};
    s->outs[static_cast<std::size_t>(r)] = out;
    if (n.op == op_kind::reduce_scatter)
      s->scratch[static_cast<std::size_t>(r)] =
          std::make_unique<std::byte[]>(static_cast<std::size_t>(c.inputs[0].dims.numel() * es));
  }
  if (n.op == op_kind::all_gather) {
    // This member's own chunk first: the right neighbour's first step reads it.
    const auto own = chunks_of(c, *s)[static_cast<std::size_t>(r)];
    for (const segment& g : own)
      std::memcpy(out + g.at * es, in(r) + g.src_at * es, static_cast<std::size_t>(g.len * es));
  }
  s->progress[static_cast<std::size_t>(r)]->reach(1, host_clock_ns());
  for (int k = 0; k < t; ++k)  // every member's range and buffers are known
    if (error e = wait_for(k, 1)) return fail(std::move(e));
  const std::vector<chunk> chunks = chunks_of(c, *s);
  const bool reduces = n.op != op_kind::all_gather;
  const bool gathers = n.op != op_kind::reduce_scatter;
  const int rs_steps = reduces ? t - 1 : 0;
  const int steps = rs_steps + (gathers ? t - 1 : 0);
  const auto acc = [&](int k) {  // where member k keeps its partial sums
    return n.op == op_kind::reduce_scatter ? s->scratch[static_cast<std::size_t>(k)].get()
                                           : s->outs[static_cast<std::size_t>(k)];
  };
  int step = 0;
  // Reduce-scatter: step k (s = k-1) adds the own operand to chunk r-2-s of
  // the left neighbour's step before (its operand at s = 0); the last step
  // leaves chunk r finished here.
  for (int st = 0; st < rs_steps; ++st) {
    if (error e = wait_for(left, static_cast<uint64_t>(1 + step))) return fail(std::move(e));
    const chunk& ch = chunks[static_cast<std::size_t>(mod(r - 2 - st, t))];
    const std::byte* from = st == 0 ? in(left) : acc(left);
    const bool last_rs = n.op == op_kind::reduce_scatter && st == rs_steps - 1;
    for (const segment& g : ch)
      add(last_rs ? out : acc(r), last_rs ? g.out_at : g.at, from, g.at, in(r), g.at, g.len, type);
    ++step;
    s->progress[static_cast<std::size_t>(r)]->reach(static_cast<uint64_t>(1 + step), host_clock_ns());
  }
  // All-gather: step j copies chunk r-1-j, which the left neighbour finished
  // (or received) in its step before, from its output into this one.
  for (int j = 0; gathers && j < t - 1; ++j) {
    if (error e = wait_for(left, static_cast<uint64_t>(1 + step))) return fail(std::move(e));
    // all_reduce: the chunk this overwrites held a partial sum that the right
    // neighbour reads in its reduce-scatter step j+1: wait until it did.
    if (reduces && j >= 1)
      if (error e = wait_for(right, static_cast<uint64_t>(2 + j))) return fail(std::move(e));
    const chunk& ch = chunks[static_cast<std::size_t>(mod(r - 1 - j, t))];
    const std::byte* from = s->outs[static_cast<std::size_t>(left)];
    for (const segment& g : ch)
      std::memcpy(out + g.at * es, from + g.at * es, static_cast<std::size_t>(g.len * es));
    ++step;
    s->progress[static_cast<std::size_t>(r)]->reach(static_cast<uint64_t>(1 + step), host_clock_ns());
  }
  // Done once the right neighbour no longer reads this member's memory (its
  // operand, partial sums, output): the runtime may reuse it after this part.
  if (error e = wait_for(right, static_cast<uint64_t>(1 + steps))) return fail(std::move(e));
  leave(key, *s, t, nullptr);
  return {};
}

}  // namespace ag::gpu::cpu
