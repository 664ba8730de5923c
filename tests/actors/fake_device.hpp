#pragma once
/// \file fake_device.hpp
/// A deterministic test-only gpu::device: every launch and copy runs inline
/// in the calling actor's handler (values through the cpu kernels), events
/// complete at record, notify() calls back before it returns. Under CAF's
/// test coordinator this makes every run reproducible, message by message.
/// It logs each compute op it runs (node id) for ordering checks, and can be
/// killed (on_fault fires inline) or told to fail launches of one op, or
/// one kind of stream/event call.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/cpu/collective.hpp"
#include "gpu/cpu/kernels.hpp"
#include "gpu/device.hpp"

namespace ag::test {

class fake_device final : public gpu::device {
 public:
  fake_device(int index, int64_t mem_bytes = 1LL << 30) : index_(index) {
    spec_.name = "fake" + std::to_string(index);
    spec_.kind = device_kind::sim;
    spec_.ordinal = index;
    spec_.mem_bytes = mem_bytes;
  }
  ~fake_device() override {
    for (auto& [p, n] : blocks_) delete[] static_cast<std::byte*>(p);
  }

  struct logged_op {
    node_id node;
    int64_t seq;
    const void* out = nullptr;  // its output buffer
  };
  std::vector<logged_op> log;        // compute ops run, in order
  struct logged_collective {
    node_id node;
    int64_t seq;
    const void* own_operand;  // this member's operand buffer
    double checksum;          // sum of the result (equal on every member of an all_reduce)
  };
  std::vector<logged_collective> collectives;  // collective parts run, in order
  struct logged_copy {
    int64_t seq;
    std::vector<float> tail;  // up to its last 4 floats (what it copied identifies the job)
  };
  std::vector<logged_copy> peer_copies;  // peer copies into this device, in order
  std::string fail_op;               // launch of a node with this name fails
  std::string fail_call;             // "create_stream", "create_event", "record" or "wait" fails
  bool pairs_collectives = false;    // collective_syncs_members() answers this (as NCCL's parts would)
  int64_t collective_stream_waits = 0;  // waits enqueued on collective streams
  host_memory_resource* host_mem = nullptr;  // what host_memory() offers (null: heap)
  int64_t launches = 0;
  /// Launching the op of this name stalls the device: the op still runs
  /// (values), but events recorded from then on stay incomplete and
  /// notify() callbacks wait, until release() or reset() (a stalled kernel
  /// as the runtime sees it).
  std::string hold_op;
  /// False: reset() is gpu::device's default (a dead device stays dead, as
  /// CUDA after a sticky error).
  bool revivable = true;
  int64_t resets = 0;

  bool held() const { return hold_ != nullptr; }
  /// Ends the stall: held events complete, waiting notifications run (with `why`).
  void release(const error& why = {}) {
    if (hold_) *hold_ = false;
    hold_.reset();
    auto waiting = std::move(deferred_);
    deferred_.clear();
    for (auto& d : waiting) d(why);
  }
  /// Revives (when revivable): abandons the held work as host_device::reset does.
  error reset() override {
    if (!revivable) return gpu::device::reset();
    ++resets;
    dead_ = false;
    hold_op.clear();
    release(error{errc::device_failed, spec_.name + " was reset with this work pending", index_});
    return {};
  }

  /// Kills the device: later launches, copies and notifications fail with an
  /// error that carries `why` (as the real backends' do), and the fault
  /// handler hears of it at once, unless `report` is false: then the test
  /// delivers the fault later with report_fault() (a fault notice that is
  /// still on its way while the device's queues already refuse work).
  void kill(const std::string& why, bool report = true) {
    dead_ = true;
    why_ = why;
    if (report) report_fault();
  }
  void report_fault() {
    if (fault_) fault_(error{errc::device_failed, why_});
  }

  const device_spec& spec() const noexcept override { return spec_; }
  int index() const noexcept override { return index_; }

  expected<void*> allocate(int64_t bytes) override {
    if (in_use_ + bytes > spec_.mem_bytes)
      return error{errc::out_of_memory, spec_.name + ": " + std::to_string(bytes) + " bytes wanted, " +
                                            std::to_string(spec_.mem_bytes - in_use_) + " free"};
    void* p = new std::byte[static_cast<std::size_t>(bytes)]();
    blocks_[p] = bytes;
    in_use_ += bytes;
    return p;
  }
  void deallocate(void* p) noexcept override {
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return;
    in_use_ -= it->second;
    delete[] static_cast<std::byte*>(p);
    blocks_.erase(it);
  }
  expected<void*> allocate_host(int64_t bytes) override { return allocate(bytes); }
  void deallocate_host(void* p) noexcept override { deallocate(p); }
  host_memory_resource* host_memory() noexcept override { return host_mem; }
  int64_t memory_capacity() const noexcept override { return spec_.mem_bytes; }
  int64_t memory_in_use() const noexcept override { return in_use_; }
  error upload(void* dst, const void* src, int64_t bytes) override {
    if (dead_) return dead_error();  // as every call of a dead device (gpu::device::reset reads the reason so)
    if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    return {};
  }
  error download(void* dst, const void* src, int64_t bytes) override { return upload(dst, src, bytes); }

  struct fake_stream : gpu::stream {
    ag::step_kind r;
    explicit fake_stream(ag::step_kind x) : r(x) {}
    ag::step_kind kind() const noexcept override { return r; }
  };
  struct fake_event : gpu::event {
    int64_t t = 0;
    std::shared_ptr<const bool> held;  // recorded during a stall: complete once *held is false
    bool query() const override { return !held || !*held; }
    void host_wait() const override {}
    int64_t completion_ns() const override { return t; }
  };
  expected<std::unique_ptr<gpu::stream>> create_stream(ag::step_kind kind) override {
    if (fail_call == "create_stream") return error{errc::device_failed, spec_.name + ": no stream (injected)", index_};
    return std::unique_ptr<gpu::stream>(std::make_unique<fake_stream>(kind));
  }
  expected<std::unique_ptr<gpu::event>> create_event(bool) override {
    if (fail_call == "create_event") return error{errc::device_failed, spec_.name + ": no event (injected)", index_};
    return std::unique_ptr<gpu::event>(std::make_unique<fake_event>());
  }
  error record(gpu::event& e, gpu::stream&) override {
    if (fail_call == "record") return error{errc::device_failed, spec_.name + ": record failed (injected)", index_};
    static_cast<fake_event&>(e).t = ++clock_;
    static_cast<fake_event&>(e).held = hold_;
    return {};
  }
  error wait(gpu::stream& s, const gpu::event&) override {
    if (fail_call == "wait") return error{errc::device_failed, spec_.name + ": wait failed (injected)", index_};
    collective_stream_waits += s.kind() == ag::step_kind::collective;
    return {};
  }
  bool collective_syncs_members(const gpu::collective_launch&) const override { return pairs_collectives; }

  error launch(gpu::stream&, const gpu::op_launch& l) override {
    if (dead_) return dead_error();
    if (!fail_op.empty() && l.op->name == fail_op) return {errc::op_failed, "injected fault"};
    ++launches;
    if (!hold_op.empty() && l.op->name == hold_op && !hold_) hold_ = std::make_shared<bool>(true);
    log.push_back({l.op->id, ++clock_, l.out.data});
    return gpu::cpu::run_op(l);
  }
  /// Runs the part inline (one-shot over the members' memory, as the host
  /// backends do) and logs it.
  error collective(gpu::stream&, const gpu::collective_launch& c) override {
    if (dead_) return dead_error();
    if (error e = gpu::cpu::run_collective(c)) return e;
    double sum = 0;
    if (c.out.type == dtype::f32)
      for (int64_t i = 0; i < c.out.dims.numel(); ++i) sum += static_cast<const float*>(c.out.data)[i];
    collectives.push_back({c.op->id, ++clock_, c.inputs[static_cast<std::size_t>(c.rank)].data, sum});
    return {};
  }
  error copy_h2d(gpu::stream&, void* dst, const void* src, int64_t bytes) override { return copy(dst, src, bytes); }
  error copy_d2h(gpu::stream&, void* dst, const void* src, int64_t bytes) override { return copy(dst, src, bytes); }
  error copy_peer(gpu::stream&, void* dst, device&, const void* src, int64_t bytes) override {
    if (error e = copy(dst, src, bytes)) return e;
    const auto* f = static_cast<const float*>(src);
    const int64_t n = bytes / 4;
    peer_copies.push_back({++clock_, std::vector<float>(f + n - std::min<int64_t>(4, n), f + n)});
    return {};
  }
  void notify(gpu::stream&, std::function<void(const error&)> done) override {
    if (hold_ && !dead_) return deferred_.push_back(std::move(done));
    done(dead_ ? dead_error() : error{});
  }
  error synchronize(gpu::stream&) override { return {}; }
  void on_fault(std::function<void(const error&)> handler) override { fault_ = std::move(handler); }
  bool alive() const noexcept override { return !dead_; }

 private:
  error copy(void* dst, const void* src, int64_t bytes) {
    if (dead_) return dead_error();
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    return {};
  }
  device_spec spec_;
  int index_;
  error dead_error() const { return {errc::device_failed, spec_.name + " is dead (" + why_ + ")", index_}; }
  bool dead_ = false;
  std::string why_;
  int64_t in_use_ = 0;
  int64_t clock_ = 0;
  std::map<void*, int64_t> blocks_;
  std::function<void(const error&)> fault_;
  std::shared_ptr<bool> hold_;  // set while stalled (hold_op)
  std::vector<std::function<void(const error&)>> deferred_;  // notifications waiting for the stall
};

}  // namespace ag::test
