// The CUDA backend's choice between NCCL and its own one-shot collective
// (gpu/collective_path.hpp), and the planner's matching algorithm pick
// (graph/cost_model.hpp): pure functions, tested without a GPU.
#include <gtest/gtest.h>

#include "gpu/collective_path.hpp"
#include "graph/cost_model.hpp"
#include "graph/plan.hpp"

namespace ag {
namespace {

using gpu::collective_path;
using gpu::choose_cuda_collective_path;

constexpr int64_t kib = 1024;

TEST(CollectivePath, NcclFromTheCrossoverOnOneShotBelowIt) {
  const std::vector<int> gpus{0, 1};
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_reduce, 256 * kib, gpus, {}, 256 * kib, true).path,
            collective_path::nccl);
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_reduce, 256 * kib - 1, gpus, {}, 256 * kib, true).path,
            collective_path::one_shot);
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_reduce, 8 * kib, gpus, {}, 256 * kib, true).path,
            collective_path::one_shot);
  // The override moves the crossover.
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_reduce, 8 * kib, gpus, {}, 4 * kib, true).path,
            collective_path::nccl);
  const auto c = choose_cuda_collective_path(op_kind::all_reduce, 8 * kib, gpus, {}, 256 * kib, true);
  EXPECT_NE(c.reason.find("crossover 262144"), std::string::npos) << c.reason;
}

TEST(CollectivePath, TwoLogicalDevicesOfOneGpuAlwaysRunOneShot) {
  for (const std::vector<int>& gpus : {std::vector<int>{0, 0}, std::vector<int>{1, 2, 1}}) {
    const auto c = choose_cuda_collective_path(op_kind::all_reduce, int64_t{1} << 30, gpus, {}, 1, true);
    EXPECT_EQ(c.path, collective_path::one_shot);
    EXPECT_NE(c.reason.find("share GPU"), std::string::npos) << c.reason;
  }
}

TEST(CollectivePath, WithoutNcclInTheBuildEverythingIsOneShot) {
  const auto c = choose_cuda_collective_path(op_kind::all_reduce, int64_t{1} << 30, {0, 1}, {}, 1, false);
  EXPECT_EQ(c.path, collective_path::one_shot);
  EXPECT_NE(c.reason.find("no NCCL"), std::string::npos) << c.reason;
  EXPECT_EQ(gpu::nccl_built(),
#ifdef ACTORGRAPH_HAVE_NCCL
            true
#else
            false
#endif
  );
}

TEST(CollectivePath, UnevenAllGatherRunsOneShotEvenGatherAndReductionsUseNccl) {
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_gather, kib * kib, {0, 1}, {300, 200}, 1, true).path,
            collective_path::one_shot);
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_gather, kib * kib, {0, 1}, {256, 256}, 1, true).path,
            collective_path::nccl);
  // Operand sizes do not matter for reductions (all members' are equal).
  EXPECT_EQ(choose_cuda_collective_path(op_kind::reduce_scatter, kib * kib, {0, 1}, {256, 256}, 1, true).path,
            collective_path::nccl);
}

// Every member decides alone: the rule reads nothing rank-specific, so
// members of one group always agree (NCCL would hang otherwise).
TEST(CollectivePath, EveryMemberOfAGroupPicksTheSamePath) {
  for (int64_t bytes : {int64_t{1}, 8 * kib, 256 * kib, 16 * kib * kib})
    for (const std::vector<int>& gpus : {std::vector<int>{0, 1}, std::vector<int>{0, 0}, std::vector<int>{3, 1, 2}}) {
      const auto first = choose_cuda_collective_path(op_kind::all_reduce, bytes, gpus, {}, 256 * kib, true).path;
      for (std::size_t r = 1; r < gpus.size(); ++r)
        EXPECT_EQ(choose_cuda_collective_path(op_kind::all_reduce, bytes, gpus, {}, 256 * kib, true).path, first);
    }
}

// Groups of three or more distinct GPUs take the wide crossover (on 4 H200s
// NCCL won at every size), groups of two the narrow one; logical devices of
// one GPU count once.
TEST(CollectivePath, GroupsOfThreeOrMoreGpusTakeTheWideCrossover) {
  EXPECT_EQ(gpu::nccl_crossover_for({0, 1}, 256 * kib, 1), 256 * kib);
  EXPECT_EQ(gpu::nccl_crossover_for({0, 1, 2}, 256 * kib, 1), 1);
  EXPECT_EQ(gpu::nccl_crossover_for({3, 1, 2, 0}, 256 * kib, 1), 1);
  EXPECT_EQ(gpu::nccl_crossover_for({0, 0, 1}, 256 * kib, 1), 256 * kib);
  // The planner agrees: 8 KiB is one-shot on 2 GPUs, ring (NCCL) on 4.
  std::vector<device_spec> specs(4);
  std::vector<const device_spec*> two, four;
  for (int k = 0; k < 4; ++k) {
    specs[static_cast<std::size_t>(k)].kind = device_kind::cuda;
    specs[static_cast<std::size_t>(k)].ordinal = k;
    specs[static_cast<std::size_t>(k)].oneshot_max_bytes = 256 * kib - 1;
    specs[static_cast<std::size_t>(k)].oneshot_max_bytes_wide = 0;
    four.push_back(&specs[static_cast<std::size_t>(k)]);
    if (k < 2) two.push_back(&specs[static_cast<std::size_t>(k)]);
  }
  EXPECT_EQ(choose_collective_algo(two, 8 * kib, op_kind::all_reduce), collective_algo::one_shot);
  EXPECT_EQ(choose_collective_algo(four, 8 * kib, op_kind::all_reduce), collective_algo::ring);
  // Without a wide limit (-1: sim, cpu) a group of four keeps the narrow one.
  for (auto& sp : specs) sp.oneshot_max_bytes_wide = -1;
  EXPECT_EQ(choose_collective_algo(four, 8 * kib, op_kind::all_reduce), collective_algo::one_shot);
}

// The planner says one-shot for members on one GPU at any size (describe and
// the trace then name the path the backend runs), ring on distinct GPUs
// above the devices' one-shot limit.
TEST(CollectivePath, PlannerPicksOneShotForMembersOnOneGpu) {
  device_spec a, b;
  a.kind = b.kind = device_kind::cuda;
  a.ordinal = b.ordinal = 0;
  a.oneshot_max_bytes = b.oneshot_max_bytes = 256 * kib - 1;
  EXPECT_EQ(choose_collective_algo({&a, &b}, int64_t{1} << 30, op_kind::all_reduce), collective_algo::one_shot);
  b.ordinal = 1;
  EXPECT_EQ(choose_collective_algo({&a, &b}, int64_t{1} << 30, op_kind::all_reduce), collective_algo::ring);
  EXPECT_EQ(choose_collective_algo({&a, &b}, 8 * kib, op_kind::all_reduce), collective_algo::one_shot);
  // Simulated devices share no GPU: ordinals alone do not make them one-shot.
  a.kind = b.kind = device_kind::sim;
  b.ordinal = 0;
  EXPECT_EQ(choose_collective_algo({&a, &b}, int64_t{1} << 30, op_kind::all_reduce), collective_algo::ring);
}

// In-stream all-reduces (plan_options::in_stream_collectives): by default
// only where every member is a GPU of its own; `on` also between logical
// devices of one GPU; never `off`, never past a member's in_stream_max_bytes,
// never for devices without the path (0) or other collectives.
TEST(CollectivePath, InStreamAllReducesByDefaultOnlyBetweenDistinctGpus) {
  device_spec a, b;
  a.kind = b.kind = device_kind::cuda;
  a.ordinal = 0;
  b.ordinal = 1;
  a.in_stream_max_bytes = b.in_stream_max_bytes = 256 * kib;
  const auto algo = [&](int64_t bytes, in_stream_mode m, op_kind op = op_kind::all_reduce) {
    return choose_collective_algo({&a, &b}, bytes, op, m);
  };
  EXPECT_EQ(plan_options{}.in_stream_collectives, in_stream_mode::distinct_gpus) << "the default";
  EXPECT_EQ(algo(8 * kib, in_stream_mode::distinct_gpus), collective_algo::in_stream);
  EXPECT_EQ(algo(256 * kib, in_stream_mode::distinct_gpus), collective_algo::in_stream);
  EXPECT_EQ(algo(256 * kib + 1, in_stream_mode::distinct_gpus), collective_algo::one_shot);  // the queue's path
  EXPECT_EQ(algo(8 * kib, in_stream_mode::off), collective_algo::one_shot);
  EXPECT_EQ(algo(8 * kib, in_stream_mode::distinct_gpus, op_kind::all_gather), collective_algo::one_shot);
  b.ordinal = 0;  // logical devices of GPU 0
  EXPECT_EQ(algo(8 * kib, in_stream_mode::distinct_gpus), collective_algo::one_shot);
  EXPECT_EQ(algo(8 * kib, in_stream_mode::on), collective_algo::in_stream);
  b.in_stream_max_bytes = 0;  // a device without the path
  EXPECT_EQ(algo(8 * kib, in_stream_mode::on), collective_algo::one_shot);
}

// Reduce-scatters and all-gathers above the one-shot limit move by the
// copy engines when every member offers them (CUDA GPUs, distinct or one
// GPU's logical devices); all-reduces, small messages and groups with a
// member without copy-engine collectives keep the old rule. The backend's
// rule follows the plan's algorithm, for those two ops only.
TEST(CollectivePath, ReduceScattersAndAllGathersAboveTheOneShotLimitMoveByTheCopyEngines) {
  device_spec a, b;
  a.kind = b.kind = device_kind::cuda;
  a.ordinal = 0;
  b.ordinal = 1;
  a.oneshot_max_bytes = b.oneshot_max_bytes = 256 * kib - 1;
  a.copy_engine_collectives = b.copy_engine_collectives = true;
  const int64_t big = int64_t{32} << 20;
  EXPECT_EQ(choose_collective_algo({&a, &b}, big, op_kind::reduce_scatter), collective_algo::copy_engine);
  EXPECT_EQ(choose_collective_algo({&a, &b}, big, op_kind::all_gather), collective_algo::copy_engine);
  EXPECT_EQ(choose_collective_algo({&a, &b}, big, op_kind::all_reduce), collective_algo::ring);
  EXPECT_EQ(choose_collective_algo({&a, &b}, 8 * kib, op_kind::reduce_scatter), collective_algo::one_shot);
  b.ordinal = 0;  // logical devices of one GPU: the copy engines too (how one GPU tests the path)
  EXPECT_EQ(choose_collective_algo({&a, &b}, big, op_kind::reduce_scatter), collective_algo::copy_engine);
  EXPECT_EQ(choose_collective_algo({&a, &b}, big, op_kind::all_reduce), collective_algo::one_shot);
  b.copy_engine_collectives = false;
  EXPECT_EQ(choose_collective_algo({&a, &b}, big, op_kind::reduce_scatter), collective_algo::one_shot);
  EXPECT_STREQ(to_string(collective_algo::copy_engine), "copy-engine");

  // Time: the pulls move what a ring moves; a reduce-scatter adds its sum.
  a.copy_engine_collectives = b.copy_engine_collectives = true;
  b.ordinal = 1;
  const double gather = estimate_collective_seconds(op_kind::all_gather, collective_algo::copy_engine, {&a, &b}, big);
  const double scatter =
      estimate_collective_seconds(op_kind::reduce_scatter, collective_algo::copy_engine, {&a, &b}, big);
  EXPECT_NEAR(gather, a.collective_latency + 0.5 * static_cast<double>(big) / a.link_bandwidth, 1e-9);
  EXPECT_NEAR(scatter - gather,
              a.launch_latency + 1.5 * static_cast<double>(big) / (a.mem_bandwidth * a.memory_efficiency), 1e-9);

  for (op_kind op : {op_kind::reduce_scatter, op_kind::all_gather}) {
    const auto c = choose_cuda_collective_path(op, big, {0, 1}, {}, 256 * kib, true, collective_algo::copy_engine);
    EXPECT_EQ(c.path, collective_path::copy_engine) << c.reason;
    EXPECT_NE(c.reason.find("copy-engine"), std::string::npos) << c.reason;
    EXPECT_EQ(choose_cuda_collective_path(op, big, {0, 1}, {}, 256 * kib, true, collective_algo::ring).path,
              collective_path::nccl);
  }
  EXPECT_EQ(choose_cuda_collective_path(op_kind::all_reduce, big, {0, 1}, {}, 256 * kib, true,
                                        collective_algo::copy_engine)
                .path,
            collective_path::nccl);
}

}  // namespace
}  // namespace ag
