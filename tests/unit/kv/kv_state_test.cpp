// Linear-attention state slots: one per sequence from a fixed set, taken with
// the sequence's first blocks, given back when it is freed, copied to a fork;
// admission fails cleanly when none is free; prefix caching is refused.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kv/kv_cache_manager.h"

namespace pagellm {
namespace {

KVCacheConfig with_states(int32_t slots) {
  KVCacheConfig c;
  c.num_blocks = 64;
  c.block_size = 16;
  c.enable_prefix_caching = false;
  c.num_state_slots = slots;
  return c;
}

TEST(KvStateSlots, EachSequenceTakesOneSlotAndGivesItBack) {
  KVCacheManager kv(with_states(2));
  EXPECT_TRUE(kv.has_state());
  ASSERT_TRUE(kv.allocate_slots(1, 0, 40));
  ASSERT_TRUE(kv.allocate_slots(2, 0, 10));
  EXPECT_EQ(kv.state_slot(1), 0);
  EXPECT_EQ(kv.state_slot(2), 1);
  // Growing keeps the slot.
  ASSERT_TRUE(kv.allocate_slots(1, 40, 1));
  EXPECT_EQ(kv.state_slot(1), 0);
  // A third sequence has blocks to spare but no slot: nothing changes.
  const int32_t available = kv.num_available_blocks();
  EXPECT_FALSE(kv.allocate_slots(3, 0, 5));
  EXPECT_FALSE(kv.has_seq(3));
  EXPECT_EQ(kv.num_available_blocks(), available);
  kv.check_invariants();
  kv.free(1);
  EXPECT_EQ(kv.state_slot(1), -1);
  ASSERT_TRUE(kv.allocate_slots(3, 0, 5));
  EXPECT_EQ(kv.state_slot(3), 0);
  const KVCacheStats st = kv.stats();
  EXPECT_EQ(st.state_slots, 2);
  EXPECT_EQ(st.used_state_slots, 2);
  kv.check_invariants();
}

TEST(KvStateSlots, AForkTakesAFreshSlotAndAsksForTheParentsStateCopied) {
  KVCacheManager kv(with_states(3));
  ASSERT_TRUE(kv.allocate_slots(7, 0, 20));
  kv.fork(7, 8);
  kv.fork(7, 9);
  EXPECT_EQ(kv.state_slot(8), 1);
  EXPECT_EQ(kv.state_slot(9), 2);
  const auto copies = kv.take_state_copies();
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].src, 0);
  EXPECT_EQ(copies[0].dst, 1);
  EXPECT_EQ(copies[1].dst, 2);
  EXPECT_TRUE(kv.take_state_copies().empty());
  // No slot left: a fork is a caller's bug, and says so.
  EXPECT_THROW(kv.fork(7, 10), Error);
  kv.check_invariants();
  // A child freed before its copy ran takes the copy with it.
  kv.free(8);
  kv.fork(9, 11);
  kv.free(11);
  EXPECT_TRUE(kv.take_state_copies().empty());
  kv.check_invariants();
}

// Pipeline virtual engines share one backend's slots: each pool's slots and
// the copies it asks for start at its state_slot_base; snapshots stay in
// its own range (base + num_state_slots + s).
TEST(KvStateSlots, APoolsSlotsStartAtItsBase) {
  KVCacheConfig c = with_states(2);
  c.state_snapshots = true;
  c.state_slot_base = 4;  // the second of two engines with 2 slots + 2 snapshots
  KVCacheManager kv(c);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 20));
  EXPECT_EQ(kv.state_slot(1), 4);
  kv.fork(1, 2);
  EXPECT_EQ(kv.state_slot(2), 5);
  kv.snapshot_state(2);
  kv.restore_state(1);
  const auto copies = kv.take_state_copies();
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].src, 4);  // the fork
  EXPECT_EQ(copies[0].dst, 5);
  EXPECT_EQ(copies[1].src, 5);  // 2's snapshot slot: 4 + 2 + 1
  EXPECT_EQ(copies[1].dst, 7);
  EXPECT_EQ(copies[2].src, 6);  // 1's back from 4 + 2 + 0
  EXPECT_EQ(copies[2].dst, 4);
  kv.check_invariants();
}

TEST(KvStateSlots, PrefixCachingAndSwapAreRefused) {
  KVCacheConfig c = with_states(1);
  c.enable_prefix_caching = true;
  EXPECT_THROW(KVCacheManager{c}, Error);
  KVCacheManager kv(with_states(1));
  EXPECT_THROW((void)kv.allocate_restored(1, 16), Error);
  KVCacheManager plain(with_states(0));
  EXPECT_FALSE(plain.has_state());
  ASSERT_TRUE(plain.allocate_slots(1, 0, 16));
  EXPECT_EQ(plain.state_slot(1), -1);
  plain.check_invariants();
}

}  // namespace
}  // namespace pagellm
