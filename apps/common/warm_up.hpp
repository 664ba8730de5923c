#pragma once
/// \file warm_up.hpp
/// How many jobs of a plan the benchmark programs run before they time any.

namespace ag::apps {

/// Jobs each timed configuration runs before its timed ones, the same on
/// every side of a ratio. Two job lanes (plan_options::job_lanes, auto on
/// CUDA plans with collectives) each launch their first job plainly and
/// capture the graphs they replay on their second, so a tensor-parallel
/// plan replays from its fifth job on, a one-GPU plan from its third. With
/// one warm-up job (until 2026-11-30) the median of a tensor-parallel run of
/// five jobs was a capturing job while one GPU's was a replayed one (the
/// d-1024 layer at degree 2: 0.39-0.52 ms against 0.19 replayed,
/// docs/BENCHMARKS.md session 41), and the generation bench's best of three
/// prefills at degree 2 was never a replayed one (session 43).
constexpr int warm_up_jobs = 4;

}  // namespace ag::apps
