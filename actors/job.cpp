// The public job handle and its shared state (actorgraph.hpp, job_state.hpp).
#include <caf/all.hpp>

#include "actors/job_state.hpp"
#include "messages/atoms.hpp"

namespace ag {

const char* to_string(job_state s) noexcept {
  switch (s) {
    case job_state::queued: return "queued";
    case job_state::running: return "running";
    case job_state::done: return "done";
    case job_state::failed: return "failed";
    case job_state::cancelled: return "cancelled";
  }
  return "?";
}

namespace {
// Depth of continuations running on this thread (a continuation may submit a
// job that fails at once and runs its own continuations inline).
thread_local int continuation_depth = 0;

struct continuation_scope {
  continuation_scope() noexcept { ++continuation_depth; }
  ~continuation_scope() { --continuation_depth; }
  continuation_scope(const continuation_scope&) = delete;
  continuation_scope& operator=(const continuation_scope&) = delete;
};

const job_result& wait_in_continuation_result() {
  static const job_result r{error{
      errc::invalid_argument,
      "job::wait() called inside a job continuation on a job that is not ready: the thread running the "
      "continuation may be the one that job needs, so waiting could deadlock; chain with then() instead"}};
  return r;
}
}  // namespace

namespace actors {
bool inside_continuation() noexcept { return continuation_depth > 0; }
}  // namespace actors

void job::shared_state::fulfil(job_result r, job_state final_state, const std::function<void()>& settled) {
  std::vector<std::function<void(const job_result&)>> conts;
  {
    std::lock_guard<std::mutex> lk(m);
    if (result) return;
    result.emplace(std::move(r));
    times.finished_ns = gpu::host_clock_ns();
    conts.swap(continuations);
    continuations_ran = conts.empty();
    actor = nullptr;
    state.store(final_state, std::memory_order_release);
    if (settled) settled();
  }
  if (!conts.empty()) {
    // Continuations first, then the blocked waiters: waking a thread is a
    // system call (1-3 us) the continuation would otherwise wait behind.
    // result is immutable from here on: continuations read it without the lock.
    continuation_scope scope;
    for (auto& f : conts) {
      try {
        f(*result);
      } catch (...) {
        // a throwing continuation must not take the runtime down
      }
    }
    std::lock_guard<std::mutex> lk(m);
    continuations_ran = true;
  }
  cv.notify_all();
}

void job::shared_state::mark_started(int64_t ns) {
  std::lock_guard<std::mutex> lk(m);
  times.started_ns = ns;
  if (!result) state.store(job_state::running, std::memory_order_release);
}

namespace {
const job_result& no_job_result() {
  static const job_result r{error{errc::invalid_argument, "empty job handle"}};
  return r;
}
}  // namespace

uint64_t job::id() const noexcept { return s_ ? s_->id : 0; }

job_state job::state() const noexcept { return s_ ? s_->state.load(std::memory_order_acquire) : job_state::failed; }

bool job::ready() const noexcept {
  if (!s_) return true;
  const auto st = s_->state.load(std::memory_order_acquire);
  return st == job_state::done || st == job_state::failed || st == job_state::cancelled;
}

job::job(std::shared_ptr<shared_state> s) : s_(std::move(s)) { retain(); }
job::job(const job& o) : s_(o.s_) { retain(); }
job::job(job&& o) noexcept : s_(std::move(o.s_)) {}
job& job::operator=(const job& o) {
  if (this != &o) {
    release();
    s_ = o.s_;
    retain();
  }
  return *this;
}
job& job::operator=(job&& o) noexcept {
  if (this != &o) {
    release();
    s_ = std::move(o.s_);
  }
  return *this;
}
job::~job() { release(); }
void job::retain() noexcept {
  if (s_) s_->handles.fetch_add(1, std::memory_order_relaxed);
}
void job::release() noexcept {
  // acq_rel: a handle's reads of the result happen before the last handle,
  // seeing the count drop to 1, moves it (wait() &&).
  if (s_) s_->handles.fetch_sub(1, std::memory_order_acq_rel);
}

job_result job::wait() && {
  const job& self = *this;
  const job_result& r = self.wait();
  // Inside a continuation (where wait() may also have returned its own
  // error) this thread may be running this job's own continuations, which
  // the move below would wait for: a copy.
  if (!s_ || actors::inside_continuation() || s_->handles.load(std::memory_order_acquire) != 1) return r;
  std::unique_lock<std::mutex> lk(s_->m);
  // The continuations fulfil() runs read the result outside the lock: they
  // end first (fulfil() is quick once it notified). Then, as the last handle,
  // nobody else can read it: the runtime reads results only through
  // continuations, and a new handle is only made by copying this one.
  s_->cv.wait(lk, [this] { return s_->continuations_ran; });
  if (s_->handles.load(std::memory_order_acquire) == 1) return std::move(*s_->result);
  return r;
}

const job_result& job::wait() const& {
  if (!s_) return no_job_result();
  std::unique_lock<std::mutex> lk(s_->m);
  if (!s_->result && actors::inside_continuation()) return wait_in_continuation_result();
  s_->cv.wait(lk, [this] { return s_->result.has_value(); });
  return *s_->result;
}

bool job::wait_for(std::chrono::nanoseconds d) const {
  if (!s_) return true;
  std::unique_lock<std::mutex> lk(s_->m);
  if (actors::inside_continuation()) return s_->result.has_value();  // never blocks there
  return s_->cv.wait_for(lk, d, [this] { return s_->result.has_value(); });
}

void job::then(std::function<void(const job_result&)> fn) const {
  if (!s_) return fn(no_job_result());
  {
    std::lock_guard<std::mutex> lk(s_->m);
    if (!s_->result) {
      s_->continuations.push_back(std::move(fn));
      return;
    }
  }
  // A job already ready runs `fn` here, on the caller's thread, under the same
  // rules as on a completion thread (wait() inside it fails at once): what a
  // continuation may do must not depend on whether the job finished before
  // then() was called (Continuation.WaitingOnAnotherJob... hung when it had).
  continuation_scope scope;
  fn(*s_->result);
}

void job::cancel() const {
  if (!s_) return;
  // Under the lock: while the job is not ready its runtime (and actor
  // system) cannot finish destruction, so the send is safe.
  std::lock_guard<std::mutex> lk(s_->m);
  if (s_->result) return;
  if (s_->actor)
    caf::anon_send(s_->actor, msg::cancel_atom::value);
  else
    s_->cancel_requested = true;
}

job_times job::times() const noexcept {
  if (!s_) return {};
  std::lock_guard<std::mutex> lk(s_->m);
  return s_->times;
}

}  // namespace ag
