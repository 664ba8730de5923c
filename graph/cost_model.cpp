#include "graph/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <limits>

namespace ag {

const char* to_string(device_kind k) noexcept {
  switch (k) {
    case device_kind::sim: return "sim";
    case device_kind::cpu: return "cpu";
    case device_kind::cuda: return "cuda";
  }
  return "unknown";
}

bool device_spec::supports(op_kind k) const noexcept {
  return std::find(unsupported.begin(), unsupported.end(), k) == unsupported.end();
}

error validate(const device_spec& d) {
  const std::string who = "device spec '" + d.name + "': ";
  if (d.name.empty()) return error(errc::invalid_argument, "device spec: empty name");
  const auto positive = [&](const char* field, double v) -> error {
    if (!(v > 0) || !std::isfinite(v))
      return error(errc::invalid_argument, who + field + " must be a finite number > 0, got " + std::to_string(v));
    return {};
  };
  const auto non_negative = [&](const char* field, double v) -> error {
    if (!(v >= 0) || !std::isfinite(v))
      return error(errc::invalid_argument, who + field + " must be a finite number >= 0, got " + std::to_string(v));
    return {};
  };
  if (auto e = positive("flops_f32", d.flops_f32)) return e;
  if (auto e = positive("flops_bf16", d.flops_bf16)) return e;
  if (auto e = positive("mem_bandwidth", d.mem_bandwidth)) return e;
  if (auto e = positive("link_bandwidth", d.link_bandwidth)) return e;
  if (auto e = positive("host_bandwidth", d.host_bandwidth)) return e;
  for (auto [field, v] : {std::pair{"compute_efficiency", d.compute_efficiency},
                          std::pair{"memory_efficiency", d.memory_efficiency}})
    if (!(v > 0 && v <= 1))
      return error(errc::invalid_argument, who + field + " must be in (0, 1], got " + std::to_string(v));
  if (auto e = non_negative("launch_latency", d.launch_latency)) return e;
  if (auto e = non_negative("kernel_latency", d.kernel_latency)) return e;
  if (auto e = non_negative("kernel_issue_interval", d.kernel_issue_interval)) return e;
  if (auto e = non_negative("link_latency", d.link_latency)) return e;
  if (auto e = non_negative("host_latency", d.host_latency)) return e;
  if (d.mem_bytes < 0)
    return error(errc::invalid_argument, who + "mem_bytes must be >= 0, got " + std::to_string(d.mem_bytes));
  if (d.sequence_parallel_min_bytes < 0)
    return error(errc::invalid_argument,
                 who + "sequence_parallel_min_bytes must be >= 0, got " + std::to_string(d.sequence_parallel_min_bytes));
  if (d.gemm_row_tile < 1 || d.gemm_row_tile > 4096)
    return error(errc::invalid_argument, who + "gemm_row_tile must be 1..4096, got " + std::to_string(d.gemm_row_tile));
  if (d.gemm_sms < 0 || d.gemm_sms > 65536)
    return error(errc::invalid_argument, who + "gemm_sms must be 0..65536, got " + std::to_string(d.gemm_sms));
  if (d.max_overlap_chunks < 1 || d.max_overlap_chunks > 64)
    return error(errc::invalid_argument,
                 who + "max_overlap_chunks must be 1..64, got " + std::to_string(d.max_overlap_chunks));
  if (d.copy_engines < 1 || d.copy_engines > 64)
    return error(errc::invalid_argument, who + "copy_engines must be 1..64, got " + std::to_string(d.copy_engines));
  if (d.max_lanes < 1 || d.max_lanes > 64)
    return error(errc::invalid_argument, who + "max_lanes must be 1..64, got " + std::to_string(d.max_lanes));
  if (static_cast<int>(d.kind) > static_cast<int>(device_kind::cuda))
    return error(errc::invalid_argument, who + "unknown kind " + std::to_string(static_cast<int>(d.kind)));
  return {};
}

namespace {

double tensor_bytes(const node& n) {
  return static_cast<double>(n.dims.numel()) * static_cast<double>(dtype_size(n.type));
}

double input_bytes(const graph& g, const node& n) {
  double b = 0;
  for (node_id i : n.inputs) b += tensor_bytes(g.at(i));
  return b;
}

// Flops per output element of the pointwise ops. Rough counts of the
// arithmetic a kernel does (gelu's tanh ~ a handful of ops); only their order
// of magnitude matters, since these ops are bandwidth bound.
double flops_per_element(op_kind k) {
  switch (k) {
    case op_kind::add:
    case op_kind::mul:
    case op_kind::scale: return 1;
    case op_kind::silu: return 4;
    case op_kind::rope: return 4;
    case op_kind::gelu: return 8;
    case op_kind::rms_norm:
    case op_kind::layer_norm:
    case op_kind::softmax: return 5;
    case op_kind::argmax:
    case op_kind::range_mask: return 1;
    default: return 0;
  }
}

}  // namespace

op_cost cost_of(const graph& g, const node& n) {
  op_cost c;
  if (is_leaf_op(n.op) || is_view_op(n.op)) return c;
  const double out_bytes = tensor_bytes(n);
  const double out_elems = static_cast<double>(n.dims.numel());
  switch (n.op) {
    case op_kind::matmul: {
      // out [.., M, N]; K is a's reduced dim (last, or second last when transposed).
      const node& a = g.at(n.inputs.at(0));
      const int64_t k = n.attrs.trans_a ? a.dims[a.dims.rank() - 2] : a.dims[a.dims.rank() - 1];
      c.flops = 2.0 * out_elems * static_cast<double>(k);  // = 2 * M * N * K * batch
      c.bytes = input_bytes(g, n) + out_bytes;
      break;
    }
    case op_kind::get_rows: {
      // Reads only the rows it gathers (= output bytes) plus the ids.
      const node& ids = g.at(n.inputs.at(1));
      c.bytes = tensor_bytes(ids) + 2 * out_bytes;
      break;
    }
    case op_kind::store_rows:
      // Writes only the rows it stores (the rest of the state stays put):
      // reads them and the positions, writes them.
      c.bytes = input_bytes(g, n) + tensor_bytes(g.at(n.inputs.at(0)));
      break;
    default:
      c.flops = flops_per_element(n.op) * out_elems;
      c.bytes = input_bytes(g, n) + out_bytes;
      break;
  }
  return c;
}

namespace {
// An op's time bound by arithmetic and by memory traffic on `d`.
struct bounds {
  double compute, memory;
};
bounds bounds_of(const device_spec& d, op_cost c, dtype type) {
  const double rate = (type == dtype::f16 || type == dtype::bf16) ? d.flops_bf16 : d.flops_f32;
  return {rate > 0 ? c.flops / (rate * d.compute_efficiency) : 0.0,
          d.mem_bandwidth > 0 ? c.bytes / (d.mem_bandwidth * d.memory_efficiency) : 0.0};
}
}  // namespace

double estimate_seconds(const device_spec& d, op_cost c, dtype type) {
  const bounds b = bounds_of(d, c, type);
  return d.launch_latency + std::max(b.compute, b.memory);
}

double estimate_wave_tail_seconds(const device_spec& d, const graph& g, const node& n) {
  if (d.gemm_sms <= 0 || n.op != op_kind::matmul || n.dims.rank() < 2) return 0.0;
  const auto [compute, memory] = bounds_of(d, cost_of(g, n), n.type);
  if (!(compute > memory)) return 0.0;  // bound by memory: the tiles' count is not what limits it
  // A weight shared by the batch ([.., M, K] x [K, N]) is one product of
  // all the rows; otherwise each batch entry is a product of its own.
  const int64_t cols = n.dims[-1], all_rows = cols > 0 ? n.dims.numel() / cols : 0;
  const bool shared_weight = n.inputs.size() > 1 && g.at(n.inputs[1]).dims.rank() == 2;
  const int64_t rows = shared_weight ? all_rows : n.dims[-2];
  const int64_t batch = rows > 0 ? all_rows / rows : 0;
  const int64_t tile = d.gemm_row_tile;
  const double tiles = static_cast<double>((rows + tile - 1) / tile) * static_cast<double>((cols + tile - 1) / tile) *
                       static_cast<double>(batch);
  // Fewer tiles than SMs: cuBLAS takes smaller tiles or splits K to fill
  // the GPU, so the count of 128-tiles says little (not measured here).
  if (!(tiles >= d.gemm_sms)) return 0.0;
  const double waves = std::ceil(tiles / d.gemm_sms);
  return compute * (waves * d.gemm_sms / tiles - 1.0);
}

double estimate_replayed_seconds(const device_spec& d, double plain_seconds) {
  if (!(plain_seconds > 0)) return 0.0;
  return plain_seconds - std::min(plain_seconds, d.launch_latency) + d.kernel_latency;
}

double replayed_kernel_overlap_seconds(const device_spec& d) {
  return d.kernel_latency - std::min(d.kernel_latency, d.kernel_issue_interval);
}

double estimate_seconds(const device_spec& d, const graph& g, const node& n) {
  if (is_leaf_op(n.op) || is_view_op(n.op)) return 0.0;
  // The rate follows the node's own dtype, so the sim backend (which may only
  // see tensor_args) gets the same number.
  return estimate_seconds(d, cost_of(g, n), n.type);
}

double estimate_peer_copy_seconds(const device_spec& src, const device_spec& dst, int64_t bytes) {
  const double bw = std::min(src.link_bandwidth, dst.link_bandwidth);
  const double lat = std::max(src.link_latency, dst.link_latency);
  return lat + (bw > 0 ? static_cast<double>(bytes) / bw : 0.0);
}

double estimate_host_copy_seconds(const device_spec& d, int64_t bytes) {
  return d.host_latency + (d.host_bandwidth > 0 ? static_cast<double>(bytes) / d.host_bandwidth : 0.0);
}

}  // namespace ag

namespace ag {

const char* to_string(collective_algo a) noexcept {
  switch (a) {
    case collective_algo::none: return "none";
    case collective_algo::ring: return "ring";
    case collective_algo::one_shot: return "one-shot";
    case collective_algo::in_stream: return "in-stream";
    case collective_algo::copy_engine: return "copy-engine";
  }
  return "unknown";
}

namespace {
/// Two of `members` are CUDA devices of one GPU (logical devices, "cuda:0,0").
bool shares_a_gpu(const std::vector<const device_spec*>& members) {
  for (std::size_t i = 0; i < members.size(); ++i)
    for (std::size_t j = i + 1; j < members.size(); ++j)
      if (members[i]->kind == device_kind::cuda && members[j]->kind == device_kind::cuda &&
          members[i]->ordinal == members[j]->ordinal)
        return true;
  return false;
}
}  // namespace

const char* to_string(in_stream_mode m) noexcept {
  switch (m) {
    case in_stream_mode::off: return "off";
    case in_stream_mode::distinct_gpus: return "distinct GPUs";
    case in_stream_mode::on: return "on";
  }
  return "?";
}

collective_algo choose_collective_algo(const std::vector<const device_spec*>& members, int64_t bytes, op_kind op,
                                       in_stream_mode in_stream) {
  const bool allow_in_stream = in_stream == in_stream_mode::on ||
                               (in_stream == in_stream_mode::distinct_gpus && !shares_a_gpu(members));
  if (allow_in_stream && op == op_kind::all_reduce && members.size() >= 2 &&
      members.size() <= static_cast<std::size_t>(max_in_stream_members) &&
      std::all_of(members.begin(), members.end(),
                  [&](const device_spec* d) { return d->in_stream_max_bytes > 0 && bytes <= d->in_stream_max_bytes; }))
    return collective_algo::in_stream;
  // Three or more members take the wide limit.
  const bool wide = members.size() >= 3;
  int64_t limit = std::numeric_limits<int64_t>::max();
  for (const device_spec* d : members)
    limit = std::min(limit, wide && d->oneshot_max_bytes_wide >= 0 ? d->oneshot_max_bytes_wide : d->oneshot_max_bytes);
  if (bytes > limit && (op == op_kind::reduce_scatter || op == op_kind::all_gather) && !members.empty() &&
      std::all_of(members.begin(), members.end(), [](const device_spec* d) { return d->copy_engine_collectives; }))
    return collective_algo::copy_engine;
  // Two logical devices of one GPU ("cuda:0,0"): NCCL refuses a GPU twice,
  // so the backend runs them one-shot at any size (gpu/collective_path.hpp).
  if (shares_a_gpu(members)) return collective_algo::one_shot;
  return bytes <= limit ? collective_algo::one_shot : collective_algo::ring;
}

bool sequence_parallel_pays(const device_spec& d, int64_t bytes, int64_t width) {
  if (width < 1) width = sequence_parallel_reference_width;
  // In doubles: the minimum may be set near INT64_MAX to turn it off.
  return static_cast<double>(bytes) * static_cast<double>(width) >=
         static_cast<double>(d.sequence_parallel_min_bytes) * static_cast<double>(sequence_parallel_reference_width);
}

double estimate_collective_seconds(op_kind op, collective_algo algo, const std::vector<const device_spec*>& members,
                                   int64_t bytes) {
  const double n = static_cast<double>(members.size());
  if (members.size() <= 1) return 0.0;
  double lat = 0, bw = std::numeric_limits<double>::infinity();
  for (const device_spec* d : members) {
    lat = std::max(lat, d->collective_latency);
    bw = std::min(bw, d->link_bandwidth);
  }
  const double b = static_cast<double>(bytes);
  auto xfer = [&](double x) { return bw > 0 ? x / bw : 0.0; };
  if (op == op_kind::all_reduce) {
    if (algo == collective_algo::one_shot || algo == collective_algo::in_stream) return lat + xfer((n - 1) * b);
    return 2 * (n - 1) * lat + xfer(2 * (n - 1) / n * b);
  }
  if (algo == collective_algo::one_shot) return lat + xfer((n - 1) / n * b);
  if (algo == collective_algo::copy_engine) {
    double t = lat + xfer((n - 1) / n * b);
    if (op == op_kind::reduce_scatter) {
      double mem = std::numeric_limits<double>::infinity(), launch = 0;
      for (const device_spec* d : members) {
        mem = std::min(mem, d->mem_bandwidth * d->memory_efficiency);
        launch = std::max(launch, d->launch_latency);
      }
      t += launch + (mem > 0 ? (n + 1) / n * b / mem : 0.0);
    }
    return t;
  }
  return (n - 1) * lat + xfer((n - 1) / n * b);
}

}  // namespace ag
