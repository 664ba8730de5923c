// The state slot table: FIFO waiting, cancelled waits and misuse errors.

#include <gtest/gtest.h>

#include "graph/state_pool.hpp"

namespace {

using namespace ag;

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
