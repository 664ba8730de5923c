#pragma once
/// \file thread_team.hpp
/// Helper threads for the cpu backend's kernels: the independent parts of
/// one kernel (a decode step's matmul in ranges of columns, a bf16 weight
/// converted to f32 in ranges of columns) run on the stream's own thread and
/// on helpers, so that one cpu device uses several cores
/// (backend_options::cpu_threads_per_stream).
///
/// One team per process, shared by every cpu device's streams: it starts
/// helpers as calls ask for them, up to the most any call asked for. A
/// helper out of work polls for the next call for 100 us (AG_CPU_SPIN_US;
/// 0: never), then sleeps on a condition variable; a caller waiting for its
/// helpers to finish polls as long, then sleeps. A job's kernels follow
/// each other within microseconds, and a futex wake-up costs tens of them.
///
/// Threading: run_parts may be called from any number of threads at once.
/// A call runs parts on its calling thread too and waits only for helpers
/// that took some of its parts and are running them, so it completes even
/// when every helper is busy with other calls.

#include <functional>

namespace ag::gpu::cpu {

/// The most threads one call may use (the bound on cpu_threads_per_stream).
inline constexpr int team_threads_max = 1024;

/// Runs part(i) once for every i in [0, parts), on the calling thread and on
/// up to threads - 1 of the team's helpers, and returns when every part has
/// returned; whatever the parts wrote is then visible to the caller. Which
/// thread runs which part is not fixed: parts must be independent. parts <=
/// 0 does nothing; threads <= 1 or parts == 1 runs the parts on the calling
/// thread, in order, without touching the team. A part that throws on the
/// calling thread stops the parts not yet started, and the exception leaves
/// run_parts once the helpers are done; one that throws on a helper ends
/// the process (as any exception leaving a thread does): parts that may
/// throw must catch on their own.
void run_parts(int parts, int threads, const std::function<void(int)>& part);

/// Helper threads the team has started so far (0 until a call asks for one).
int team_helpers() noexcept;

/// How many parts the kernels cut a large f32 product into (gemm_f32): the
/// machine's hardware threads, which one
/// cpu device uses by default, at most 64. Constant for the process, and
/// never the call's thread count, so that a cut, and with it every sum,
/// does not depend on how many threads run it.
int machine_parts() noexcept;

}  // namespace ag::gpu::cpu
