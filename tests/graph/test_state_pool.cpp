// State pools: per-device slot layout (aligned, stable offsets), the slot
// count bounded by each device's budget, clear out-of-memory errors, and
// the slot table's FIFO waiting, cancelled waits and misuse errors.

#include <gtest/gtest.h>

#include "graph/state_pool.hpp"

namespace {

using namespace ag;

// A block's key and value cache of one sequence: [1, Hkv, C, dh].
std::vector<state_tensor_spec> kv_cache(int blocks, int devices, int64_t hkv, int64_t tokens, int64_t dh,
                                        dtype t) {
  std::vector<state_tensor_spec> v;
  for (int b = 0; b < blocks; ++b)
    for (const char* kind : {".k_cache", ".v_cache"}) {
      std::string name = "l";
      name.append(std::to_string(b)).append(kind);  // (operator+ chains trip GCC 12's -Wrestrict)
      v.push_back({name, t, shape{1, hkv, tokens, dh}, b * devices / blocks});
    }
  return v;
}

TEST(StatePool, LaysOutEachDeviceSlotAlignedAndBoundsSlotsByTheTightestBudget) {
  // 4 blocks on 2 stages: blocks 0,1 on device 0, 2,3 on device 1.
  const auto tensors = kv_cache(4, 2, 2, 10, 3, dtype::f16);  // 120 bytes each
  auto plan = plan_state_pool(tensors, {10 * 1024, 4 * 1024}, 0);
  ASSERT_TRUE(plan.has_value()) << plan.err().to_string();
  ASSERT_EQ(plan->slot_bytes.size(), 2u);
  // Each tensor starts 256-aligned: 4 tensors of 120 bytes per device.
  EXPECT_EQ(plan->slot_bytes[0], 4 * state_alignment);
  EXPECT_EQ(plan->slot_bytes[1], 4 * state_alignment);
  ASSERT_EQ(plan->offsets.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(plan->offsets[i] % state_alignment, 0) << tensors[i].name;
    EXPECT_EQ(plan->offsets[i], static_cast<int64_t>(i % 4) * state_alignment) << tensors[i].name;
  }
  // Device 1's 4 KiB hold 4 slots of 1 KiB; device 0 would hold 10.
  EXPECT_EQ(plan->slots, 4);
  EXPECT_EQ(plan->region_bytes(1), 4 * 1024);
  EXPECT_LE(plan->region_bytes(0), 10 * 1024);
}

TEST(StatePool, WantedSlotsBeyondABudgetFailNamingTheDevice) {
  const auto tensors = kv_cache(2, 2, 1, 64, 64, dtype::f32);  // k and v: 32 KiB per slot and device
  auto ok = plan_state_pool(tensors, {128 * 1024, 128 * 1024}, 4);
  ASSERT_TRUE(ok.has_value()) << ok.err().to_string();
  EXPECT_EQ(ok->slots, 4);
  auto full = plan_state_pool(tensors, {128 * 1024, 96 * 1024}, 4);
  ASSERT_FALSE(full.has_value());
  EXPECT_EQ(full.err().code, errc::out_of_memory);
  EXPECT_EQ(full.err().device, 1);
  EXPECT_NE(full.err().message.find("device 1 holds 3 state slot"), std::string::npos) << full.err().message;
  // No budget for a device that holds state: not even one slot.
  auto none = plan_state_pool(tensors, {128 * 1024}, 0);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.err().code, errc::out_of_memory);
  EXPECT_EQ(none.err().device, 1);
}

TEST(StatePool, RefusesNegativeDevicesBudgetsAndCounts) {
  EXPECT_EQ(plan_state_pool({{"x", dtype::f32, shape{4}, -1}}, {1024}, 0).err().code, errc::invalid_argument);
  EXPECT_EQ(plan_state_pool({{"x", dtype::f32, shape{4}, 0}}, {-1}, 0).err().code, errc::invalid_argument);
  EXPECT_EQ(plan_state_pool({{"x", dtype::f32, shape{4}, 0}}, {1024}, -2).err().code, errc::invalid_argument);
  auto huge = plan_state_pool({{"big", dtype::f32, shape{int64_t{1} << 40, int64_t{1} << 40}, 0}}, {1024}, 1);
  ASSERT_FALSE(huge.has_value());
  EXPECT_NE(huge.err().message.find("'big'"), std::string::npos) << huge.err().message;
}

TEST(StateSlots, HandsOutFreeSlotsThenQueuesFifoAndGrantsOnRelease) {
  state_slots slots(2);
  EXPECT_EQ(slots.acquire(10, true).value(), std::optional<int>{0});
  EXPECT_EQ(slots.acquire(11, true).value(), std::optional<int>{1});
  EXPECT_EQ(slots.acquire(12, true).value(), std::nullopt);
  EXPECT_EQ(slots.acquire(13, true).value(), std::nullopt);
  EXPECT_EQ(slots.in_use(), 2);
  EXPECT_EQ(slots.waiting(), 2);
  // Releasing ticket 11's slot 1 hands it to the oldest waiter, 12.
  auto g = slots.release(11).value();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->ticket, 12u);
  EXPECT_EQ(g->slot, 1);
  EXPECT_EQ(slots.slot_of(12), std::optional<int>{1});
  EXPECT_EQ(slots.slot_of(11), std::nullopt);
  g = slots.release(10).value();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->ticket, 13u);
  EXPECT_EQ(g->slot, 0);
  EXPECT_EQ(slots.waiting(), 0);
  // No waiter: the slot becomes free and the next acquire takes it.
  EXPECT_FALSE(slots.release(12).value().has_value());
  EXPECT_EQ(slots.in_use(), 1);
  EXPECT_EQ(slots.acquire(14, false).value(), std::optional<int>{1});
}

TEST(StateSlots, FullWithoutWaitingFailsClearlyAndCancelledWaitersLeaveTheQueue) {
  state_slots slots(1);
  ASSERT_EQ(slots.acquire(1, false).value(), std::optional<int>{0});
  auto refused = slots.acquire(2, false);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.err().code, errc::out_of_memory);
  EXPECT_NE(refused.err().message.find("all 1 slots are taken"), std::string::npos);
  EXPECT_EQ(slots.waiting(), 0);
  ASSERT_EQ(slots.acquire(3, true).value(), std::nullopt);
  ASSERT_EQ(slots.acquire(4, true).value(), std::nullopt);
  EXPECT_TRUE(slots.cancel_wait(3));
  EXPECT_FALSE(slots.cancel_wait(3));
  auto g = slots.release(1).value();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->ticket, 4u);  // the cancelled 3 was skipped
}

TEST(StateSlots, MisuseIsAnErrorNotACorruption) {
  state_slots slots(1);
  ASSERT_TRUE(slots.acquire(1, true).has_value());
  EXPECT_EQ(slots.acquire(1, true).err().code, errc::invalid_argument);  // holds already
  ASSERT_TRUE(slots.acquire(2, true).has_value());
  EXPECT_EQ(slots.acquire(2, true).err().code, errc::invalid_argument);  // waits already
  EXPECT_EQ(slots.release(7).err().code, errc::invalid_argument);        // holds nothing
  EXPECT_EQ(slots.release(2).err().code, errc::invalid_argument);        // only waits
  EXPECT_EQ(slots.in_use(), 1);
  EXPECT_EQ(slots.waiting(), 1);
  state_slots empty(0);
  EXPECT_EQ(empty.acquire(1, false).err().code, errc::out_of_memory);
}

}  // namespace
