#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/error.h"
#include "kv/kv_test_util.h"

namespace pagellm {
namespace {

using test::iota_tokens;

std::vector<BlockId> table(const KVCacheManager& kv, SeqId id) {
  const auto t = kv.block_table(id);
  return {t.begin(), t.end()};
}

KVCacheConfig config(int32_t num_blocks, int32_t bs = 16, bool prefix = true) {
  KVCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = bs;
  c.enable_prefix_caching = prefix;
  return c;
}

// Runs a whole prompt through: allocate with prefix lookup, then commit.
int32_t admit_and_compute(KVCacheManager& kv, SeqId id, const std::vector<TokenId>& tokens) {
  const PrefixMatch m = kv.match_prefix(tokens);
  const int32_t n = static_cast<int32_t>(tokens.size()) - m.num_tokens;
  EXPECT_TRUE(kv.allocate_slots(id, m.num_tokens, n, &m).has_value());
  kv.commit_computed(id, tokens, static_cast<int32_t>(tokens.size()));
  kv.check_invariants();
  return m.num_tokens;
}

// Speculative decoding: slots of rejected drafts go back, tail first; the
// blocks that hold accepted tokens stay, and only full accepted blocks are
// ever hashed for the prefix cache.
TEST(KVCacheManager, TruncateReleasesTheTailOfRejectedDrafts) {
  KVCacheManager kv(config(11));
  const auto tokens = iota_tokens(40);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 14));
  kv.commit_computed(1, tokens, 14);
  // 14 computed, then 1 real + 4 draft tokens: positions 14..18, two blocks.
  ASSERT_TRUE(kv.allocate_slots(1, 14, 5));
  EXPECT_EQ(table(kv, 1).size(), 2u);
  EXPECT_EQ(kv.stats().used_blocks, 2);
  // Nothing accepted: 15 computed + the next token = 16 slots, one block.
  kv.commit_computed(1, tokens, 15);
  kv.truncate(1, 16);
  kv.check_invariants();
  EXPECT_EQ(table(kv, 1).size(), 1u);
  EXPECT_EQ(kv.stats().used_blocks, 1);
  EXPECT_EQ(kv.stats().cached_blocks, 0);  // the released block held no committed contents
  kv.truncate(1, 30);                      // longer than the table: nothing to do
  EXPECT_EQ(table(kv, 1).size(), 1u);
  // A full committed block is never dropped.
  ASSERT_TRUE(kv.allocate_slots(1, 16, 8));
  kv.commit_computed(1, tokens, 20);
  EXPECT_THROW(kv.truncate(1, 10), Error);
  kv.truncate(1, 16);
  kv.check_invariants();
  EXPECT_THROW(kv.truncate(2, 1), Error);  // unknown sequence
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KVCacheManager, AllocatesBlocksAsTokensGrow) {
  KVCacheManager kv(config(11));
  kv.check_invariants();
  auto a = kv.allocate_slots(1, 0, 20);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->num_new_blocks, 2);
  EXPECT_TRUE(a->copies.empty());
  EXPECT_EQ(table(kv, 1), (std::vector<BlockId>{1, 2}));
  kv.check_invariants();
  // Tokens 20..31 fit the second block; token 32 needs a third.
  a = kv.allocate_slots(1, 20, 12);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->num_new_blocks, 0);
  a = kv.allocate_slots(1, 32, 1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->num_new_blocks, 1);
  EXPECT_EQ(table(kv, 1), (std::vector<BlockId>{1, 2, 3}));
  kv.check_invariants();
  const KVCacheStats st = kv.stats();
  EXPECT_EQ(st.total_blocks, 10);
  EXPECT_EQ(st.used_blocks, 3);
  EXPECT_EQ(st.free_blocks, 7);
  EXPECT_EQ(st.cached_blocks, 0);
  // 33 tokens in 48 slots.
  EXPECT_DOUBLE_EQ(st.fragmentation, 15.0 / 48.0);
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().used_blocks, 0);
  EXPECT_EQ(kv.stats().fragmentation, 0.0);
  EXPECT_FALSE(kv.has_seq(1));
  kv.free(1);  // unknown: no-op
}

TEST(KVCacheManager, FailedAllocationChangesNothing) {
  KVCacheManager kv(config(6, 8));  // 5 usable blocks of 8
  const auto prompt = iota_tokens(24);
  admit_and_compute(kv, 1, prompt);  // 3 blocks, 3 committed
  kv.free(1);                        // 3 cached (LRU), 2 free
  ASSERT_TRUE(kv.allocate_slots(2, 0, 8));  // takes a free block: 1 free left + 3 cached
  kv.check_invariants();
  // Sequence 3 hits 2 cached blocks (the last token is recomputed: block 3 is
  // not a hit), which leaves 1 free + 1 cached = 2 blocks for fresh ones.
  const PrefixMatch m = kv.match_prefix(prompt);
  ASSERT_EQ(m.num_tokens, 16);
  const auto stats_before = kv.stats();
  const auto lru_before = kv.pool().cached_lru_order();
  const auto free_before = kv.pool().free_list_order();
  EXPECT_FALSE(kv.allocate_slots(3, 16, 8 + 17, &m));  // needs 4 fresh blocks
  EXPECT_FALSE(kv.has_seq(3));
  EXPECT_EQ(kv.pool().cached_lru_order(), lru_before);
  EXPECT_EQ(kv.pool().free_list_order(), free_before);
  EXPECT_EQ(kv.stats().prefix_query_tokens, stats_before.prefix_query_tokens);
  EXPECT_EQ(kv.stats().used_blocks, stats_before.used_blocks);
  kv.check_invariants();
  // An existing sequence's failed growth leaves its table alone.
  const auto t2 = table(kv, 2);
  EXPECT_FALSE(kv.allocate_slots(2, 8, 8 * 5));
  EXPECT_EQ(table(kv, 2), t2);
  kv.check_invariants();
  // Exactly enough succeeds: 2 hits + 2 fresh.
  auto a = kv.allocate_slots(3, 16, 8 + 8, &m);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->num_new_blocks, 2);
  EXPECT_EQ(kv.stats().free_blocks + kv.stats().cached_blocks, 0);
  kv.check_invariants();
  kv.free(2);
  kv.free(3);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KVCacheManager, PrefixHitsReuseLeadingFullBlocksAndLeaveTheLastToken) {
  struct Case {
    int32_t prompt_len;     // tokens of the second sequence (same ids as the first)
    int32_t expected_hit;   // tokens found in the cache
  };
  // The first sequence computed 40 tokens: blocks [0,16) and [16,32) are full.
  const Case cases[] = {
      {40, 32}, {33, 32}, {32, 16},  // 32: block 2 would hold the last token
      {17, 16}, {16, 0},  {1, 0},   {60, 32},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.prompt_len);
    KVCacheManager kv(config(20));
    const auto first = iota_tokens(40);
    admit_and_compute(kv, 1, first);
    auto second = iota_tokens(c.prompt_len);
    const PrefixMatch m = kv.match_prefix(second);
    EXPECT_EQ(m.num_tokens, c.expected_hit);
    EXPECT_EQ(m.num_query_tokens, c.prompt_len);
    ASSERT_TRUE(kv.allocate_slots(2, m.num_tokens, c.prompt_len - m.num_tokens, &m));
    kv.check_invariants();
    const auto t1 = table(kv, 1), t2 = table(kv, 2);
    for (int32_t i = 0; i < c.expected_hit / 16; ++i) {
      EXPECT_EQ(t2[i], t1[i]);
      EXPECT_EQ(kv.pool().ref_count(t1[i]), 2);  // shared while both run
    }
    const auto st = kv.stats();
    EXPECT_EQ(st.prefix_query_tokens, 40 + c.prompt_len);
    EXPECT_EQ(st.prefix_hit_tokens, c.expected_hit);
    kv.free(1);
    kv.free(2);
    kv.check_invariants();
    EXPECT_EQ(kv.stats().used_blocks, 0);
  }
}

TEST(KVCacheManager, DifferentEarlierBlockMeansNoHitLater) {
  KVCacheManager kv(config(20, 8));
  const auto a = iota_tokens(32);
  admit_and_compute(kv, 1, a);
  auto b = a;
  b[2] = 7;  // first block differs; blocks 1.. have the same tokens as a's
  EXPECT_EQ(kv.match_prefix(b).num_tokens, 0);
  auto c = a;
  c[12] = 7;  // second block differs
  EXPECT_EQ(kv.match_prefix(c).num_tokens, 8);
}

TEST(KVCacheManager, FreedSequencesAreEvictedTailFirst) {
  KVCacheManager kv(config(5, 8));  // 4 usable
  const auto prompt = iota_tokens(25);  // 3 full blocks + 1 token
  admit_and_compute(kv, 1, prompt);
  const auto t = table(kv, 1);
  kv.free(1);
  kv.check_invariants();
  // Full blocks cached head-last (MRU); the partial block is plain free.
  EXPECT_EQ(kv.pool().cached_lru_order(), (std::vector<BlockId>{t[2], t[1], t[0]}));
  EXPECT_EQ(kv.stats().cached_blocks, 3);
  EXPECT_EQ(kv.stats().free_blocks, 1);
  // A new sequence needing 2 blocks: the free one, then the tail block t[2].
  ASSERT_TRUE(kv.allocate_slots(2, 0, 16));
  EXPECT_EQ(table(kv, 2), (std::vector<BlockId>{t[3], t[2]}));
  // The head of the old prompt still hits.
  EXPECT_EQ(kv.match_prefix(prompt).num_tokens, 16);
  kv.free(2);
  kv.check_invariants();
}

TEST(KVCacheManager, ForkSharesBlocksAndCopiesOnWrite) {
  const int32_t bs = 16;
  KVCacheManager kv(config(10, bs));
  const auto prompt = iota_tokens(20);  // 1 full + 1 partial block
  admit_and_compute(kv, 1, prompt);
  kv.fork(1, 2);
  kv.check_invariants();
  const auto parent = table(kv, 1);
  EXPECT_EQ(table(kv, 2), parent);
  EXPECT_EQ(kv.pool().ref_count(parent[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(parent[1]), 2);
  // The child writes position 20, inside the shared partial block: it gets a copy.
  auto a = kv.allocate_slots(2, 20, 1);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->copies.size(), 1u);
  EXPECT_EQ(a->copies[0].src, parent[1]);
  const BlockId copy = a->copies[0].dst;
  EXPECT_NE(copy, parent[1]);
  EXPECT_EQ(table(kv, 2), (std::vector<BlockId>{parent[0], copy}));
  EXPECT_EQ(kv.pool().ref_count(parent[1]), 1);
  EXPECT_EQ(kv.pool().ref_count(parent[0]), 2);  // full block: never written, stays shared
  kv.check_invariants();
  // Now the parent holds its partial block alone: it writes in place.
  a = kv.allocate_slots(1, 20, 1);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->copies.empty());
  EXPECT_EQ(table(kv, 1), parent);
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KVCacheManager, ForkAtABlockBoundaryNeedsNoCopy) {
  KVCacheManager kv(config(10, 8));
  const auto prompt = iota_tokens(16);
  admit_and_compute(kv, 1, prompt);
  kv.fork(1, 2);
  auto a = kv.allocate_slots(2, 16, 1);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->copies.empty());
  EXPECT_EQ(a->num_new_blocks, 1);
  kv.check_invariants();
  EXPECT_THROW(kv.fork(1, 2), Error);   // child exists
  EXPECT_THROW(kv.fork(7, 8), Error);   // unknown parent
  kv.free(2);
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KVCacheManager, CopyOnWriteCountsTowardsTransactionalFailure) {
  KVCacheManager kv(config(4, 8));  // 3 usable
  const auto prompt = iota_tokens(12);
  admit_and_compute(kv, 1, prompt);  // 2 blocks
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(3, 0, 8));  // last block gone
  const auto t2 = table(kv, 2);
  EXPECT_FALSE(kv.allocate_slots(2, 12, 1));  // needs a copy of the partial block
  EXPECT_EQ(table(kv, 2), t2);
  kv.check_invariants();
  kv.free(3);
  EXPECT_TRUE(kv.allocate_slots(2, 12, 1));
  kv.check_invariants();
}

TEST(KVCacheManager, PrefixCachingOffCachesNothing) {
  KVCacheManager kv(config(10, 8, /*prefix=*/false));
  const auto prompt = iota_tokens(30);
  EXPECT_EQ(admit_and_compute(kv, 1, prompt), 0);
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.stats().cached_blocks, 0);
  EXPECT_EQ(kv.stats().free_blocks, 9);
  EXPECT_EQ(kv.match_prefix(prompt).num_tokens, 0);
  EXPECT_EQ(kv.stats().prefix_query_tokens, 0);
}

TEST(KVCacheManager, FragmentationCountsSharedBlocksOnce) {
  KVCacheManager kv(config(10, 8));
  admit_and_compute(kv, 1, iota_tokens(12));  // 2 blocks: 8 + 4
  kv.fork(1, 2);
  // 2 used blocks, 12 tokens held: 4 of 16 slots empty.
  EXPECT_DOUBLE_EQ(kv.stats().fragmentation, 4.0 / 16.0);
  ASSERT_TRUE(kv.allocate_slots(2, 12, 1));  // copy of block 2 holding 13
  EXPECT_DOUBLE_EQ(kv.stats().fragmentation, (24.0 - 8 - 4 - 5) / 24.0);
}

TEST(KVCacheManager, RejectsInconsistentCalls) {
  KVCacheManager kv(config(10, 8));
  EXPECT_THROW((void)kv.allocate_slots(1, -1, 2), Error);
  EXPECT_THROW((void)kv.allocate_slots(1, 5, 2), Error);  // computed tokens without blocks
  admit_and_compute(kv, 1, iota_tokens(20));
  const PrefixMatch m = kv.match_prefix(iota_tokens(20));
  ASSERT_EQ(m.num_tokens, 16);
  EXPECT_THROW((void)kv.allocate_slots(2, 8, 4, &m), Error);   // computed != hit
  EXPECT_THROW((void)kv.allocate_slots(1, 16, 4, &m), Error);  // seq already has blocks
  EXPECT_THROW(kv.commit_computed(9, iota_tokens(8), 8), Error);
  kv.check_invariants();
}

TEST(KVCacheManager, SlidingEvictionReleasesTheMiddleAndKeepsInvariants) {
  KVCacheConfig c;
  c.num_blocks = 16;
  c.block_size = 8;
  KVCacheManager kv(c);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 80).has_value());  // 10 blocks
  const int32_t before = kv.num_available_blocks();
  EXPECT_EQ(kv.evict(1, 1, 6), 5);
  EXPECT_EQ(kv.num_available_blocks(), before + 5);
  EXPECT_EQ(kv.evicted_end(1), 6);
  for (int32_t i = 1; i < 6; ++i) EXPECT_EQ(kv.block_table(1)[i], kNullBlock);
  kv.check_invariants();
  EXPECT_EQ(kv.evict(1, 1, 4), 0);  // already gone
  EXPECT_EQ(kv.evict(1, 1, 8), 2);  // the window moves on
  EXPECT_THROW(kv.evict(1, 2, 9), Error);  // the range keeps its start
  ASSERT_TRUE(kv.allocate_slots(1, 80, 16).has_value());
  kv.fork(1, 2);
  kv.check_invariants();
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.num_available_blocks(), kv.num_usable_blocks());
}

}  // namespace
}  // namespace pagellm
