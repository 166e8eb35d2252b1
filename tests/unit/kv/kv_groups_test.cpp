// KV-cache groups: a sliding-window group holds only the blocks its window
// sees, shares the pool with the full group, and survives prefix hits,
// forks, truncation and swap-style restore with the invariants intact.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/kv_layout.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_sizing.h"

namespace pagellm {
namespace {

KVCacheConfig grouped(int32_t num_blocks, int32_t window) {
  KVCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = 16;
  c.groups = {KvGroup{}, KvGroup{KvGroupKind::Sliding, window}};
  return c;
}

int32_t held(const KVCacheManager& kv, SeqId id, int g) {
  int32_t n = 0;
  for (BlockId b : kv.block_table(id, g)) n += b != kNullBlock ? 1 : 0;
  return n;
}

TEST(KvGroupPlan, FullLayersFormGroupZeroAndSlidingOnesFillGroupsOfEqualSize) {
  // Gemma 3 270M: 18 layers, every 6th full, window 512.
  std::vector<int32_t> w(18, 512);
  for (int l = 5; l < 18; l += 6) w[l] = 0;
  const KvGroupPlan p = plan_kv_groups(w, 32768);
  ASSERT_EQ(p.groups.size(), 6u);
  EXPECT_EQ(p.slots, 3);
  EXPECT_EQ(p.layer_group[5], 0);
  EXPECT_EQ(p.layer_slot[11], 1);
  EXPECT_EQ(p.groups[1], (KvGroup{KvGroupKind::Sliding, 512}));
  EXPECT_EQ(p.layer_group[0], 1);
  EXPECT_EQ(p.layer_group[17], 0);
  // A window that covers max_model_len is full attention: one group.
  EXPECT_FALSE(plan_kv_groups(w, 512).grouped());
  int32_t slots = 0;
  const auto stage = stage_kv_slots(p, 0, 9, slots);  // first pipeline stage
  EXPECT_EQ(stage.size(), 9u);
  EXPECT_EQ(slots, 3);
}

TEST(KvGroups, SlidingTableKeepsOnlyTheWindowAsTheSequenceGrows) {
  KVCacheManager kv(grouped(200, 32));
  ASSERT_TRUE(kv.allocate_slots(1, 0, 64));
  EXPECT_EQ(held(kv, 1, 0), 4);
  EXPECT_EQ(held(kv, 1, 1), 4);
  int32_t computed = 64;
  for (int step = 0; step < 100; ++step, ++computed) {
    ASSERT_TRUE(kv.allocate_slots(1, computed, 1));
    kv.check_invariants();
  }
  EXPECT_EQ(held(kv, 1, 0), blocks_for_tokens(computed, 16));
  EXPECT_LE(held(kv, 1, 1), 4);  // 32-token window + the block being written
  EXPECT_EQ(kv.block_table(1, 1).size(), kv.block_table(1, 0).size());
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.num_available_blocks(), 199);
}

TEST(KvGroups, PrefixHitTakesTheWindowBlocksOfEveryGroup) {
  KVCacheManager kv(grouped(200, 32));
  std::vector<TokenId> tokens(160);
  std::iota(tokens.begin(), tokens.end(), 7);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 160));
  kv.commit_computed(1, tokens, 160);
  kv.free(1);
  const PrefixMatch m = kv.match_prefix(tokens);
  EXPECT_EQ(m.num_tokens, 144);  // the last token is always computed
  ASSERT_EQ(m.group_blocks.size(), 1u);
  EXPECT_EQ(m.group_blocks[0][0], kNullBlock);  // out of the window
  EXPECT_NE(m.group_blocks[0][8], kNullBlock);
  ASSERT_TRUE(kv.allocate_slots(2, m.num_tokens, 16, &m));
  kv.check_invariants();
  EXPECT_EQ(held(kv, 2, 1), 10 - kv.first_visible_block(1, 144));
}

TEST(KvGroups, ForkTruncateAndRestoreKeepTheInvariants) {
  KVCacheManager kv(grouped(300, 48));
  ASSERT_TRUE(kv.allocate_slots(1, 0, 100));
  ASSERT_TRUE(kv.allocate_slots(1, 100, 40));
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(2, 140, 5));  // copy-on-write of the shared last blocks
  kv.truncate(2, 141);
  kv.check_invariants();
  const int32_t n = kv.blocks_held(141);
  kv.free(2);
  ASSERT_TRUE(kv.allocate_restored(3, 141));
  EXPECT_EQ(held(kv, 3, 0) + held(kv, 3, 1), n);
  kv.check_invariants();
  EXPECT_EQ(kv.max_blocks_per_seq(1000, 64), blocks_for_tokens(1000, 16) + blocks_for_tokens(64 + 48, 16) + 1);
  EXPECT_EQ(describe_kv_groups(kv.stats().groups), "full x1, sliding 48 x1");
}

}  // namespace
}  // namespace pagellm
