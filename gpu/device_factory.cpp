#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cpu/cpu_device.hpp"
#include "gpu/device.hpp"
#include "gpu/device_factory.hpp"
#include "gpu/sim/sim_device.hpp"

#ifdef ACTORGRAPH_HAVE_CUDA
#include "gpu/cuda/cuda_backend.hpp"
#endif

namespace ag::gpu {

namespace {

struct item {
  std::string text;   // as written (trimmed)
  std::size_t pos;    // character offset in the spec
  int number;         // 1-based item number
};

error bad(const item& it, const std::string& what) {
  return error(errc::bad_device_spec, "device spec item " + std::to_string(it.number) + " '" +
                                          it.text + "' at position " + std::to_string(it.pos) +
                                          ": " + what);
}
error bad(const device_request& r, const std::string& what) { return bad(item{r.text, r.pos, r.item}, what); }

std::string trim(const std::string& s, std::size_t& lead) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  lead = b;
  return s.substr(b, e - b);
}

/// Parses a non-negative decimal integer (no sign, no spaces, at most 9 digits).
bool parse_uint(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

}  // namespace

expected<std::vector<device_request>> parse_device_spec(const std::string& spec) {
  std::size_t lead = 0;
  if (trim(spec, lead).empty())
    return error(errc::bad_device_spec, "empty device spec (expected e.g. \"sim:4\", \"cpu:2\", \"cuda:all\")");
  std::vector<device_request> reqs;
  std::size_t start = 0;
  int number = 0;
  for (;;) {
    const std::size_t comma = spec.find(',', start);
    const std::string raw = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item it{trim(raw, lead), start, ++number};
    it.pos = start + lead;
    if (it.text.empty()) return bad(it, "empty item");
    const std::size_t colon = it.text.find(':');
    if (colon == std::string::npos) {
      int ord = 0;
      if (parse_uint(it.text, ord) && !reqs.empty() && reqs.back().kind == device_kind::cuda &&
          !reqs.back().all) {
        // A repeated ordinal is a second logical device on the same GPU
        // ("cuda:0,0": tensor parallelism tested on one GPU).
        reqs.back().text += "," + it.text;
        reqs.back().ordinals.push_back(ord);
      } else if (parse_uint(it.text, ord)) {
        return bad(it, "a bare number continues only a \"cuda:N\" item's ordinals");
      } else {
        return bad(it, "expected kind:count (e.g. \"sim:4\")");
      }
    } else {
      const std::string kind = trim(it.text.substr(0, colon), lead);
      const std::string arg = trim(it.text.substr(colon + 1), lead);
      device_request r;
      r.pos = it.pos;
      r.item = it.number;
      r.text = it.text;
      if (kind == "sim") r.kind = device_kind::sim;
      else if (kind == "cpu") r.kind = device_kind::cpu;
      else if (kind == "cuda") r.kind = device_kind::cuda;
      else return bad(it, "unknown device kind '" + kind + "' (expected sim, cpu or cuda)");
      for (std::size_t k = 0; k < reqs.size(); ++k)
        if (reqs[k].kind == r.kind)
          return bad(it, "duplicate kind '" + kind + "' (already given by item " +
                             std::to_string(reqs[k].item) + ")");
      if (arg.empty()) return bad(it, "missing count after '" + kind + ":'");
      if (r.kind == device_kind::cuda) {
        int ord = 0;
        if (arg == "all") r.all = true;
        else if (parse_uint(arg, ord)) r.ordinals.push_back(ord);
        else return bad(it, "expected \"all\" or a GPU ordinal after 'cuda:', got '" + arg + "'");
      } else {
        int n = 0;
        if (arg[0] == '-') return bad(it, "negative count " + arg);
        if (!parse_uint(arg, n)) return bad(it, "count '" + arg + "' is not a number");
        if (n == 0) return bad(it, "zero count");
        if (n > 1024) return bad(it, "count " + arg + " is too large (at most 1024)");
        r.count = n;
      }
      reqs.push_back(std::move(r));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return reqs;
}

error validate(const backend_options& o) {
  const auto bad_option = [](const std::string& name, double v, const char* range) {
    return error(errc::invalid_argument, "backend option " + name + " = " + std::to_string(v) + ": must be " + range);
  };
  const auto in = [](double v, double lo, double hi) { return v >= lo && v <= hi; };  // false for NaN
  const sim_options& s = o.sim;
  if (!in(s.time_scale, 0, 1e6)) return bad_option("sim.time_scale", s.time_scale, "in [0, 1e6]");
  if (!in(s.jitter, 0, 100)) return bad_option("sim.jitter", s.jitter, "in [0, 100]");
  if (!in(s.faults.op_error_rate, 0, 1))
    return bad_option("sim.faults.op_error_rate", s.faults.op_error_rate, "a probability in [0, 1]");
  if (!in(s.faults.op_stall_rate, 0, 1))
    return bad_option("sim.faults.op_stall_rate", s.faults.op_stall_rate, "a probability in [0, 1]");
  if (!in(s.faults.stall_seconds, 0, 1e6))
    return bad_option("sim.faults.stall_seconds", s.faults.stall_seconds, "in [0, 1e6] seconds");
  if (s.faults.die_after_ops < -1)
    return error(errc::invalid_argument, "backend option sim.faults.die_after_ops = " +
                                             std::to_string(s.faults.die_after_ops) + ": must be >= 0, or -1 for never");
  if (error e = ag::validate(s.spec)) return error(e.code, "backend option sim.spec: " + e.message);
  if (o.cpu_threads_per_stream < 0 || o.cpu_threads_per_stream > 1024)
    return error(errc::invalid_argument, "backend option cpu_threads_per_stream = " +
                                             std::to_string(o.cpu_threads_per_stream) + ": must be 0 (the machine's threads shared among the cpu devices) .. 1024");
  if (o.cpu_oneshot_max_bytes < -1)
    return error(errc::invalid_argument, "backend option cpu_oneshot_max_bytes = " +
                                             std::to_string(o.cpu_oneshot_max_bytes) + ": must be >= 0, or -1 for the default");
  if (o.cuda_gemv_tensor_core_rows != 0 && (o.cuda_gemv_tensor_core_rows < 2 || o.cuda_gemv_tensor_core_rows > 8))
    return error(errc::invalid_argument, "backend option cuda_gemv_tensor_core_rows = " +
                                             std::to_string(o.cuda_gemv_tensor_core_rows) +
                                             ": must be 0 (never) or 2..8 (the rows from which GEMVs take the "
                                             "tensor cores)");
  if (o.cuda_nccl_min_bytes < 1)
    return error(errc::invalid_argument, "backend option cuda_nccl_min_bytes = " +
                                             std::to_string(o.cuda_nccl_min_bytes) + ": must be >= 1");
  if (o.cuda_sequence_parallel_min_bytes < 0)
    return error(errc::invalid_argument, "backend option cuda_sequence_parallel_min_bytes = " +
                                             std::to_string(o.cuda_sequence_parallel_min_bytes) + ": must be >= 0");
  if (o.cuda_in_stream_max_bytes < 0)
    return error(errc::invalid_argument, "backend option cuda_in_stream_max_bytes = " +
                                             std::to_string(o.cuda_in_stream_max_bytes) + ": must be >= 0");
  if (!(o.cuda_collective_timeout_s > 0) || !std::isfinite(o.cuda_collective_timeout_s))
    return error(errc::invalid_argument, "backend option cuda_collective_timeout_s = " +
                                             std::to_string(o.cuda_collective_timeout_s) + ": must be > 0 and finite");
  if (o.cuda_nccl_min_bytes_wide < 1)
    return error(errc::invalid_argument, "backend option cuda_nccl_min_bytes_wide = " +
                                             std::to_string(o.cuda_nccl_min_bytes_wide) + ": must be >= 1");
  return {};
}

expected<std::vector<device_ptr>> make_devices(const std::string& spec, const backend_options& options) {
  if (error e = validate(options)) return e;
  auto reqs = parse_device_spec(spec);
  if (!reqs) return reqs.err();
  int cpu_devices = 0;  // cpu_threads_per_stream 0 shares the machine among them
  for (const auto& r : *reqs)
    if (r.kind == device_kind::cpu) cpu_devices += r.count;
  std::vector<device_ptr> devices;
  for (const auto& r : *reqs) {
    const int first = static_cast<int>(devices.size());
    switch (r.kind) {
      case device_kind::sim:
        for (int i = 0; i < r.count; ++i) devices.push_back(sim::make_sim_device(i, first + i, options.sim));
        break;
      case device_kind::cpu:
        for (int i = 0; i < r.count; ++i)
          devices.push_back(cpu::make_cpu_device(cpu::default_cpu_spec(i), first + i, options, cpu_devices));
        break;
      case device_kind::cuda: {
#ifdef ACTORGRAPH_HAVE_CUDA
        if (cuda::device_count() <= 0) return bad(r, "no usable CUDA GPU on this machine");
        auto made = cuda::make_cuda_devices(r.all ? std::vector<int>{} : r.ordinals, options, first);
        if (!made) {
          error e = made.err();
          e.message = "device spec item " + std::to_string(r.item) + " '" + r.text + "': " + e.message;
          return e;
        }
        for (auto& d : *made) devices.push_back(std::move(d));
#else
        return bad(r, "this build has no CUDA support (configure with ACTORGRAPH_CUDA=ON)");
#endif
        break;
      }
    }
  }
  return devices;
}

bool cuda_available() noexcept {
#ifdef ACTORGRAPH_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

}  // namespace ag::gpu
