// KVCacheManager's side of the KV offload tier: committed blocks are
// recorded for the store, and import_prefix brings a prefix into the pool
// (the pool's own blocks where it still has them, fresh registered blocks
// for the caller's) so that match_prefix finds it, pinned until unpin.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/kv_test_util.h"

namespace pagellm {
namespace {

using test::iota_tokens;

KVCacheConfig config(int32_t num_blocks, std::vector<KvGroup> groups = {}) {
  KVCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = 16;
  c.groups = std::move(groups);
  return c;
}

const auto kAll = [](int, int32_t) { return true; };

void compute(KVCacheManager& kv, SeqId id, const std::vector<TokenId>& tokens) {
  const PrefixMatch m = kv.match_prefix(tokens);
  ASSERT_TRUE(kv.allocate_slots(id, m.num_tokens, static_cast<int32_t>(tokens.size()) - m.num_tokens, &m));
  kv.commit_computed(id, tokens, static_cast<int32_t>(tokens.size()));
}

TEST(KvImport, CommittedBlocksAreRecordedOnlyWhenAsked) {
  KVCacheManager kv(config(10));
  const auto tokens = iota_tokens(40);
  compute(kv, 1, tokens);
  EXPECT_TRUE(kv.take_committed().empty());
  kv.set_record_commits(true);
  compute(kv, 2, iota_tokens(40, 5000));
  const std::vector<CommittedBlock> c = kv.take_committed();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].seq, 2u);
  EXPECT_EQ(c[1].index, 1);
  EXPECT_EQ(c[1].block, kv.block_table(2)[1]);
  EXPECT_TRUE(kv.take_committed().empty());
}

TEST(KvImport, AnImportedPrefixIsFoundByTheNextMatch) {
  KVCacheManager kv(config(12));
  const auto tokens = iota_tokens(5 * 16 + 3);
  const PrefixImport imp = kv.import_prefix(tokens, 0, 100, kAll, 100);
  EXPECT_EQ(imp.num_blocks, 5);
  ASSERT_EQ(imp.fills.size(), 5u);
  EXPECT_GE(imp.pin, 0);
  EXPECT_EQ(kv.num_pinned_blocks(), 5);
  EXPECT_EQ(kv.stats().used_blocks, 5);
  EXPECT_EQ(kv.stats().fragmentation, 0.0) << "pinned blocks are full";
  kv.check_invariants();
  const PrefixMatch m = kv.match_prefix(tokens);
  ASSERT_EQ(m.num_tokens, 80);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(imp.fills[i].index, static_cast<int32_t>(i));
    EXPECT_EQ(m.blocks[i], imp.fills[i].block);
  }
  ASSERT_TRUE(kv.allocate_slots(1, m.num_tokens, 3, &m));
  kv.unpin(imp.pin);
  EXPECT_EQ(kv.num_pinned_blocks(), 0);
  kv.check_invariants();
  kv.free(1);
  EXPECT_EQ(kv.stats().cached_blocks, 5);
  kv.check_invariants();
}

TEST(KvImport, ThePoolsOwnBlocksComeFirstAndTheCallersContinueThem) {
  KVCacheManager kv(config(12));
  const auto tokens = iota_tokens(5 * 16 + 1);
  compute(kv, 1, std::vector<TokenId>(tokens.begin(), tokens.begin() + 40));  // 2 full blocks
  const std::vector<BlockId> pooled(kv.block_table(1).begin(), kv.block_table(1).begin() + 2);
  kv.free(1);
  const PrefixImport imp = kv.import_prefix(tokens, 0, 100, [](int, int32_t i) { return i >= 2; }, 100);
  EXPECT_EQ(imp.num_blocks, 5);
  ASSERT_EQ(imp.fills.size(), 3u);
  EXPECT_EQ(imp.fills[0].index, 2);
  const PrefixMatch m = kv.match_prefix(tokens);
  ASSERT_EQ(m.num_tokens, 80);
  EXPECT_EQ(m.blocks[0], pooled[0]);
  EXPECT_EQ(m.blocks[1], pooled[1]);
  kv.check_invariants();
  kv.unpin(imp.pin);
  kv.check_invariants();
}

TEST(KvImport, StopsAtAGapAtTheLastTokenAndAtItsLimits) {
  KVCacheManager kv(config(12));
  const auto tokens = iota_tokens(5 * 16);  // the last token is computed: 4 blocks at most
  PrefixImport imp = kv.import_prefix(tokens, 0, 100, [](int, int32_t i) { return i != 2; }, 100);
  EXPECT_EQ(imp.num_blocks, 2);
  kv.unpin(imp.pin);
  imp = kv.import_prefix(tokens, 0, 100, kAll, 100);
  EXPECT_EQ(imp.num_blocks, 4);
  kv.unpin(imp.pin);
  // (Those 4 are in the pool now: a new key keeps this import apart.)
  imp = kv.import_prefix(tokens, 7, 3, kAll, 100);
  EXPECT_EQ(imp.num_blocks, 3) << "max_blocks";
  kv.unpin(imp.pin);
  imp = kv.import_prefix(tokens, 8, 100, kAll, 1);
  EXPECT_EQ(imp.num_blocks, 1) << "max_fresh";
  kv.unpin(imp.pin);
  imp = kv.import_prefix(tokens, 0, 100, kAll, 100);
  EXPECT_EQ(imp.pin, -1) << "all in the pool already: nothing to pin";
  EXPECT_EQ(imp.num_blocks, 4);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KvImport, ALoRAsPrefixStaysApartFromTheBaseModels) {
  KVCacheManager kv(config(12));
  const auto tokens = iota_tokens(3 * 16 + 1);
  const PrefixImport imp = kv.import_prefix(tokens, 5, 100, kAll, 100);
  EXPECT_EQ(kv.match_prefix(tokens, 5).num_tokens, 48);
  EXPECT_EQ(kv.match_prefix(tokens, 0).num_tokens, 0);
  kv.unpin(imp.pin);
}

TEST(KvImport, ASlidingGroupGetsTheBlocksItsWindowSees) {
  // Window 32 tokens: from a 5-block prefix the sliding group needs blocks 3 and 4.
  KVCacheManager kv(config(20, {KvGroup{}, KvGroup{KvGroupKind::Sliding, 32}}));
  const auto tokens = iota_tokens(5 * 16 + 2);
  std::set<std::pair<int, int32_t>> asked;
  const PrefixImport imp = kv.import_prefix(
      tokens, 0, 100, [&](int g, int32_t i) { asked.insert({g, i}); return true; }, 100);
  EXPECT_EQ(imp.num_blocks, 5);
  ASSERT_EQ(imp.fills.size(), 7u);
  EXPECT_TRUE(asked.count({1, 3}) && asked.count({1, 4}));
  kv.check_invariants();
  const PrefixMatch m = kv.match_prefix(tokens);
  EXPECT_EQ(m.num_tokens, 80);
  ASSERT_TRUE(kv.allocate_slots(1, m.num_tokens, 2, &m));
  kv.unpin(imp.pin);
  kv.check_invariants();
  // Without the sliding group's blocks there is no hit past its window's start.
  KVCacheManager kv2(config(20, {KvGroup{}, KvGroup{KvGroupKind::Sliding, 32}}));
  const PrefixImport none = kv2.import_prefix(tokens, 0, 100, [](int g, int32_t) { return g == 0; }, 100);
  EXPECT_LE(none.num_blocks, 1);
  kv2.unpin(none.pin);
  kv2.check_invariants();
}

}  // namespace
}  // namespace pagellm
