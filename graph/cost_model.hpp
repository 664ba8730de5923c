#pragma once
/// \file cost_model.hpp
/// What an op costs (flops, bytes moved) and how long a device takes for it.
/// Used by the planner to balance pipeline stages and by the sim backend to
/// delay ops; the same numbers, so simulated runs match the plan's estimates.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace ag {

enum class device_kind : uint8_t { sim = 0, cpu = 1, cuda = 2 };
const char* to_string(device_kind k) noexcept;

/// The row width (elements) at which device_spec::sequence_parallel_min_bytes
/// is stated; a tensor of another width scales it (sequence_parallel_pays).
constexpr int64_t sequence_parallel_reference_width = 4096;

/// Everything the planner and the cost model know about one device.
/// Defaults model one H100 SXM (dense bf16 ~ 990 TFLOP/s, f32 ~ 60 TFLOP/s,
/// HBM3 3.35 TB/s, NVLink 450 GB/s one way).
struct device_spec {
  std::string name = "sim0";           ///< unique: "sim0", "cpu1", "cuda0"
  device_kind kind = device_kind::sim;
  int ordinal = 0;                     ///< index within its kind (CUDA device number)
  double flops_f32 = 60e12;            ///< FLOP/s for f32 matmul (peak)
  double flops_bf16 = 990e12;          ///< FLOP/s for f16 / bf16 matmul (peak)
  double mem_bandwidth = 3.35e12;      ///< bytes/s, device memory (peak)
  /// Shares of those peaks that kernels reach, which the cost model divides
  /// by too: (0, 1]. 1 on sim (the spec is the model) and cpu; a CUDA device
  /// sets what was measured on its kind of GPU (gpu/cuda/enumerate.cpp).
  double compute_efficiency = 1.0;
  double memory_efficiency = 1.0;
  int64_t mem_bytes = 80LL << 30;      ///< device memory
  double launch_latency = 4.5e-6;      ///< s, per kernel
  /// s, per kernel of a replayed graph (plan_options::graph_replay): the time
  /// a kernel holds its stream on the device beyond its throughput-bound work
  /// (block scheduling, ramp-up, tail), which kernels of other streams
  /// overlap. A replayed kernel costs this instead of launch_latency, which
  /// is host time one launching thread pays kernel after kernel (measured on
  /// an H100: tiny kernels of a replayed graph took 3.9 us each on one stream,
  /// and four streams ran them about 1.7x faster: docs/BENCHMARKS.md).
  double kernel_latency = 3.5e-6;
  /// s, the part of kernel_latency that holds the whole device, not only the
  /// kernel's stream: a GPU's front end starts the kernels of a replayed
  /// graph's side-by-side branches one at a time, so branches of tiny kernels
  /// are bound by their kernel count times this, however many run at once.
  /// Counts as at most kernel_latency. Measured on an H100: 8 chains of 17
  /// tiny kernels in one graph took 93 us (one chain 64 us), 0.69 us a
  /// kernel (docs/BENCHMARKS.md, session 77).
  double kernel_issue_interval = 0.65e-6;
  double link_bandwidth = 450e9;       ///< bytes/s, device <-> device (one way)
  double link_latency = 5e-6;          ///< s, per peer copy
  double host_bandwidth = 55e9;        ///< bytes/s, pinned host <-> device
  double host_latency = 8e-6;          ///< s, per host copy
  /// s, one synchronisation step of a collective: a ring all-reduce takes
  /// 2 (n - 1) of them, a one-shot collective one (its barrier).
  double collective_latency = 5e-6;
  /// Collectives of at most this many bytes use the one-shot algorithm (each
  /// member reads every peer's operand over the links, then reduces), larger
  /// ones a ring. The crossover is a property of the machine (about 0.5 MiB
  /// on H100 NVLink, ../shared/TP-NOTES.md) and is measured there.
  int64_t oneshot_max_bytes = int64_t{512} << 10;
  /// The same limit for groups of three or more distinct devices (each
  /// member's one-shot reads n - 1 peers); -1: oneshot_max_bytes. CUDA
  /// devices set it from backend_options::cuda_nccl_min_bytes_wide.
  int64_t oneshot_max_bytes_wide = -1;
  /// All-reduces of at most this many bytes over members that all allow it
  /// run in-stream (collective_algo::in_stream): each member's part is a
  /// kernel on its compute lane 0 that meets the other members' parts on the
  /// devices (flags in device memory), so a job's compute stream runs
  /// through its collectives without the host and a replayed segment spans
  /// them. 0 (sim, cpu): never. CUDA devices set it from
  /// backend_options::cuda_in_stream_max_bytes.
  int64_t in_stream_max_bytes = 0;
  /// Host copies (h2d, d2h) of at most this many bytes may run on the
  /// compute lane that reads or wrote them (plan_options::inline_small_copies):
  /// below it the transfer (host_latency plus a few microseconds at
  /// host_bandwidth) costs less than a hand-off between a copy queue and a
  /// compute lane (an event each way and a message between actors). 0: never.
  int64_t inline_copy_max_bytes = int64_t{64} << 10;
  /// Whether a collective runs at its own speed beside a compute kernel of
  /// its device, so that a row-parallel matmul split in chunks hides each
  /// chunk's all-reduce behind the next chunk (plan_options::tp_overlap).
  /// True on sim (the model gives collectives a lane of their own) and cpu.
  /// False on CUDA GPUs: NCCL's kernels need SMs that a GEMM's full grid
  /// holds, so they wait for its last wave, and the chunks only add a
  /// concat and smaller GEMMs (measured on H200s, docs/BENCHMARKS.md: a d-8192
  /// layer took 7.04 ms unchunked against 7.17 chunked at degree 2, 4.27
  /// against 4.45 at degree 4; cuBLAS SM-count targets that left 24-48 SMs
  /// to NCCL did not change that).
  bool collectives_overlap_compute = true;
  /// Reduce-scatters and all-gathers of more than the one-shot limit move
  /// their data with the copy engines (collective_algo::copy_engine): each
  /// member pulls its peers' pieces with peer copies, DMA that needs no SM,
  /// so they run beside a GEMM even where collectives_overlap_compute is
  /// false, and sequence parallelism's chunks overlap there. CUDA devices set
  /// it from backend_options::cuda_copy_engine_collectives; false on sim
  /// (unless its spec is a CUDA device's) and cpu (whose ring already runs
  /// on the copy-engine workers).
  bool copy_engine_collectives = false;
  /// Sequence parallelism on copy-engine collectives pays only for
  /// activations of at least this many bytes in rows of
  /// sequence_parallel_reference_width elements; rows of w elements need
  /// this x reference / w bytes (plan_options::sequence_parallel auto).
  /// Each all-reduce becomes a reduce-scatter and an all-gather, each a fan
  /// of peer copies with their events, which only enough matmul work beside
  /// it hides, and a layer's matmuls do w times the work per byte of its
  /// [rows, w] activations (measured on two H200s: break-even at 16 MiB for
  /// w 4096, at 32 MiB for w 2048; docs/BENCHMARKS.md, session 43). 0 (sim,
  /// cpu): no limit. CUDA devices set it from
  /// backend_options::cuda_sequence_parallel_min_bytes.
  int64_t sequence_parallel_min_bytes = 0;
  /// Rows of a GEMM tile: a matmul split in chunks of rows
  /// (plan_options::tp_overlap) gets chunks whose rows are multiples of it
  /// where the rows allow, so that no chunk pays a partly empty wave of
  /// tiles. 1 on sim (the model is linear in rows) and cpu; 128 on CUDA GPUs.
  int64_t gemm_row_tile = 1;
  /// Streaming multiprocessors a GEMM's tiles (gemm_row_tile square) are
  /// dealt over, a wave of tiles at a time: a product of T tiles holds its
  /// stream for ceil(T / gemm_sms) waves, so its last wave leaves part of
  /// the GPU idle, which a product on another lane fills
  /// (estimate_wave_tail_seconds; the planner's auto lanes count it). 0: no
  /// waves, time linear in work (sim, cpu). CUDA devices: the GPU's SM count.
  int gemm_sms = 0;
  /// Most chunks of rows the planner splits a sequence-parallel region into
  /// (plan_options::tp_overlap): 4 on sim and cpu; 2 on CUDA GPUs, where a
  /// GEMM of fewer rows fills fewer waves of the SMs and the finer split
  /// lost more than its overlap gained (a d-8192 layer at degree 2 on two
  /// H100s: 6.87 ms in 2 chunks, 7.40 in 4; docs/BENCHMARKS.md, session 18).
  int max_overlap_chunks = 4;
  int copy_engines = 3;                ///< async copy engines
  /// Compute streams (lanes) the device offers the planner. 8: a graph of
  /// 8 independent chains of small matmuls (actorgraph-lanes-bench) ran
  /// 2.05-2.14x faster than one lane on an H200 with a lane each, against
  /// 1.88-1.89x with 4 lanes, side by side in one call (docs/BENCHMARKS.md,
  /// session 75); the planner still uses a lane only where the cost model
  /// predicts a gain and the arena allows it. cpu devices offer 2.
  int max_lanes = 8;
  std::vector<op_kind> unsupported;    ///< ops this device cannot run
  /// The device's memory is this host's memory (cpu devices, sim devices that
  /// compute values): compile() counts its arena and weights against
  /// host_memory_bytes() together with the job's inputs and outputs.
  bool in_host_memory = false;

  bool supports(op_kind k) const noexcept;
};

/// Refuses a spec the planner and cost model cannot use, naming the device,
/// the field and the value (errc::invalid_argument): an empty name, rates,
/// bandwidths or latencies that are NaN, infinite, negative or (rates and
/// bandwidths) zero, mem_bytes < 0, copy_engines or max_lanes outside 1..64.
error validate(const device_spec& spec);

/// Work of one op.
struct op_cost {
  double flops = 0;  ///< floating-point operations
  double bytes = 0;  ///< bytes read + written from device memory
};

/// Cost of node `n` of graph `g` (0 for leaves and views).
op_cost cost_of(const graph& g, const node& n);
/// launch_latency + max(flops / (rate(dtype) x compute_efficiency), bytes /
/// (mem_bandwidth x memory_efficiency)); 0 for views/leaves.
double estimate_seconds(const device_spec& d, const graph& g, const node& n);
double estimate_seconds(const device_spec& d, op_cost c, dtype type);
/// The part of matmul `n`'s time on `d` that its last, partly filled wave
/// of tiles adds (device_spec::gemm_sms): compute time x (waves x gemm_sms /
/// tiles - 1), tiles = ceil(M / tile) x ceil(N / tile) x batch. 0 where
/// gemm_sms is 0, for other ops, for products bound by memory and for
/// fewer tiles than SMs (which cuBLAS deals in smaller pieces). On its
/// own lane a product pays it; a product on another lane fills those SMs.
/// (LLaMA's gate and up at B 8, T 128, d 2048, ff 5632: 352 tiles of 128
/// on an H100's 132 SMs, 2.67 waves taking 3: 12.5% of each product, where
/// two lanes ran them 11% faster, docs/BENCHMARKS.md session 79.)
double estimate_wave_tail_seconds(const device_spec& d, const graph& g, const node& n);
/// The same kernel replayed inside a captured graph (not its first): its
/// launch latency replaced by d.kernel_latency, device time on its own
/// stream. `plain_seconds` is estimate_seconds' figure (0 stays 0).
double estimate_replayed_seconds(const device_spec& d, double plain_seconds);
/// The part of a replayed kernel's cost that kernels of other lanes overlap:
/// kernel_latency less kernel_issue_interval (the rest, with the kernel's
/// throughput-bound work, holds the device; the sim device and the planner's
/// lanes model both split it so).
double replayed_kernel_overlap_seconds(const device_spec& d);
/// Peer copy: latency + bytes / min(link bandwidths).
double estimate_peer_copy_seconds(const device_spec& src, const device_spec& dst, int64_t bytes);
/// Host <-> device copy: host_latency + bytes / host_bandwidth.
double estimate_host_copy_seconds(const device_spec& d, int64_t bytes);

/// How a collective moves its data.
enum class collective_algo : uint8_t {
  none = 0,      ///< not a collective
  ring = 1,      ///< ring over the members (NCCL's, for large messages)
  one_shot = 2,  ///< each member reads every peer's operand directly, then reduces (small messages)
  /// one-shot all_reduce whose members meet on the devices, each part a
  /// kernel on its member's compute lane 0 (device_spec::in_stream_max_bytes)
  in_stream = 3,
  /// reduce_scatter / all_gather by the copy engines
  /// (device_spec::copy_engine_collectives): each member pulls its peers'
  /// pieces with peer copies (no SMs), then a reduce_scatter sums them with
  /// one local kernel
  copy_engine = 4,
};
const char* to_string(collective_algo a) noexcept;
/// Where all-reduces may run in-stream (collective_algo::in_stream;
/// plan_options::in_stream_collectives).
enum class in_stream_mode : uint8_t {
  off = 0,            ///< never: every collective takes the communication queue
  distinct_gpus = 1,  ///< the default: only where no two members are logical devices of one GPU
  /// Also between logical devices of one GPU: how the path is tested on one
  /// GPU. Not the default there: in one of two whole-suite runs on 4 H100s
  /// two tests' parts found none of a peer's pushed lines (docs/BENCHMARKS.md,
  /// session 24), a cause not yet found.
  on = 2,
};
const char* to_string(in_stream_mode m) noexcept;
/// The algorithm for a collective of `bytes` over `members`: one_shot when
/// bytes <= the smallest oneshot_max_bytes among them, or when two members
/// are CUDA devices of one GPU (NCCL cannot run there), else ring (on CUDA:
/// NCCL, whose threshold is the devices' oneshot_max_bytes). An all_reduce
/// of 2..8 members of at most every member's in_stream_max_bytes is
/// in_stream as `in_stream` allows (plan_options::in_stream_collectives).
/// Two CUDA members of one ordinal are logical devices of one GPU.
/// A reduce_scatter or all_gather above the one-shot limit over members that
/// all have copy_engine_collectives is copy_engine (also on logical devices
/// of one GPU, where it is how the path is tested on one GPU).
collective_algo choose_collective_algo(const std::vector<const device_spec*>& members, int64_t bytes, op_kind op,
                                       in_stream_mode in_stream = in_stream_mode::off);
/// Whether sequence parallelism on copy-engine collectives pays on `d` for
/// a tensor of `bytes` in rows of `width` elements: bytes x width >=
/// d.sequence_parallel_min_bytes x sequence_parallel_reference_width (a
/// width < 1 counts as the reference width).
bool sequence_parallel_pays(const device_spec& d, int64_t bytes, int64_t width);
/// Most members of an in-stream all-reduce (its kernel takes their pointers by value).
constexpr int max_in_stream_members = 8;
/// Time of one member's part of collective `op` (all_reduce, all_gather,
/// reduce_scatter) of `bytes` (all_reduce / reduce_scatter: one operand;
/// all_gather: the gathered result) over n = members.size() devices, with
/// lat = the largest collective_latency and bw = the smallest link_bandwidth:
///   all_reduce     ring: 2 (n-1) lat + 2 (n-1)/n bytes / bw;  one_shot, in_stream: lat + (n-1) bytes / bw
///   all_gather / reduce_scatter  ring: (n-1) lat + (n-1)/n bytes / bw;  one_shot: lat + (n-1)/n bytes / bw
///   copy_engine: one_shot's, and for reduce_scatter the local sum of n
///   pieces of bytes / n (read) into one (written) at the slowest member's
///   memory bandwidth x memory_efficiency, plus one launch_latency
double estimate_collective_seconds(op_kind op, collective_algo algo, const std::vector<const device_spec*>& members,
                                   int64_t bytes);

}  // namespace ag
