#include "gpu/device.hpp"

#include <chrono>

namespace ag::gpu {

int64_t host_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

error device::collective(stream&, const collective_launch& c) {
  return error(errc::unsupported_op,
               "device '" + spec().name + "' has no collectives" +
                   (c.op ? " (op '" + c.op->name + "', " + to_string(c.op->op) + ")" : std::string{}),
               index(), -1, c.op ? c.op->name : std::string{});
}

error device::copy_d2h_blocks(stream& s, void* dst, int64_t dst_pitch, const void* src, int64_t block_bytes,
                              int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b)
    if (error e = copy_d2h(s, static_cast<char*>(dst) + b * dst_pitch, static_cast<const char*>(src) + b * block_bytes,
                           block_bytes))
      return e;
  return {};
}

error device::set_collective_tag(stream&, uint64_t) {
  return error(errc::unsupported_op, "device '" + spec().name + "' runs no in-stream collectives", index());
}

expected<std::unique_ptr<replay_graph>> device::capture_segment(stream&, const segment_op*, std::size_t) {
  return error(errc::unsupported_op, "device '" + spec().name + "' does not capture graphs", index());
}

expected<std::unique_ptr<replay_graph>> device::capture_lanes(stream* const* lanes, int count, const segment_op* ops,
                                                              std::size_t n) {
  if (count < 1 || !lanes || !lanes[0])
    return error(errc::invalid_argument, "device '" + spec().name + "': capture_lanes without a stream", index());
  for (std::size_t i = 0; i < n; ++i)
    if (ops[i].lane != 0)
      return error(errc::unsupported_op, "device '" + spec().name + "' does not capture several lanes in one graph",
                   index());
  return capture_segment(*lanes[0], ops, n);
}

expected<std::unique_ptr<replay_graph>> device::capture(stream& s, const op_launch* ops, std::size_t n) {
  std::vector<segment_op> seg(n);
  for (std::size_t i = 0; i < n; ++i) seg[i].launch = &ops[i];
  return capture_segment(s, seg.data(), n);
}

error device::replay(stream&, replay_graph&) {
  return error(errc::unsupported_op, "device '" + spec().name + "' does not replay graphs", index());
}

error device::replay_and_notify(stream& s, replay_graph& g, std::function<void(const error&)> done) {
  if (error e = replay(s, g)) return e;
  notify(s, std::move(done));
  return {};
}

error device::reset() {
  if (alive()) return {};
  // The death reason, as every call of a dead device refuses with it.
  const error why = download(nullptr, nullptr, 0);
  return error(errc::device_failed,
               "device '" + spec().name + "' is dead and its backend cannot revive it in this process" +
                   (why ? " (" + why.message + ")" : std::string{}),
               index());
}

}  // namespace ag::gpu
