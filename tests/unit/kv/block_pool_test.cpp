#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.h"
#include "kv/block_hash.h"
#include "kv/kv_test_util.h"

namespace pagellm {
namespace {

using test::iota_tokens;

// Chain hashes of every full block of `tokens`.
std::vector<BlockHash> chain(const std::vector<TokenId>& tokens, int32_t bs) {
  std::vector<BlockHash> out;
  BlockHash parent = kRootBlockHash;
  for (size_t i = 0; i + bs <= tokens.size(); i += bs) {
    parent = hash_block_tokens(parent, std::span<const TokenId>(tokens).subspan(i, bs));
    out.push_back(parent);
  }
  return out;
}

TEST(BlockHash, SamePrefixSameHashesDifferentParentDifferentHash) {
  const int32_t bs = 4;
  std::vector<TokenId> a = iota_tokens(16, 100);
  std::vector<TokenId> b = a;
  b[9] = 7;  // third block differs
  const auto ha = chain(a, bs), hb = chain(b, bs);
  ASSERT_EQ(ha.size(), 4u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  // Same tokens in block 3, but the parent differs, so the hash differs.
  EXPECT_NE(ha[3], hb[3]);
  // Same tokens, different parents.
  const std::vector<TokenId> blk = {1, 2, 3, 4};
  EXPECT_NE(hash_block_tokens(kRootBlockHash, blk), hash_block_tokens(kRootBlockHash + 1, blk));
  // Token order matters; so does every bit of a token.
  EXPECT_NE(hash_block_tokens(kRootBlockHash, std::vector<TokenId>{1, 2, 3, 4}),
            hash_block_tokens(kRootBlockHash, std::vector<TokenId>{2, 1, 3, 4}));
  EXPECT_NE(hash_block_tokens(kRootBlockHash, std::vector<TokenId>{1, 2, 3, 4}),
            hash_block_tokens(kRootBlockHash, std::vector<TokenId>{1, 2, 3, 4 | (1 << 30)}));
  // Deterministic.
  EXPECT_EQ(chain(a, bs), chain(a, bs));
}

TEST(BlockHash, NoCollisionsOverManySmallBlocks) {
  // Every 2-token block over a 300-token vocabulary, under two parents.
  std::vector<BlockHash> seen;
  for (BlockHash parent : {kRootBlockHash, BlockHash{1}}) {
    for (TokenId x = 0; x < 300; ++x) {
      for (TokenId y = 0; y < 300; ++y) {
        const TokenId blk[2] = {x, y};
        seen.push_back(hash_block_tokens(parent, blk));
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
}

TEST(BlockPool, CountsContiguousPlacementAndAvailableRuns) {
  BlockPool pool(11, 16);  // blocks 1..10
  std::vector<BlockId> a, b;
  ASSERT_TRUE(pool.allocate(3, AllocationPolicy::Contiguous, kNullBlock, a));  // 1 2 3
  EXPECT_EQ(a, (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(pool.num_following_allocations(), 2);  // 2 after 1, 3 after 2
  EXPECT_EQ(pool.num_contiguous_allocations(), 2);
  ASSERT_TRUE(pool.allocate(1, AllocationPolicy::Contiguous, kNullBlock, b));  // 4
  ASSERT_TRUE(pool.allocate(1, AllocationPolicy::Contiguous, a.back(), a));     // after 3: 4 is taken
  EXPECT_EQ(pool.num_following_allocations(), 3);
  EXPECT_EQ(pool.num_contiguous_allocations(), 2);
  // Available now: the free blocks after the 5 used ones, one run.
  EXPECT_EQ(pool.available_runs(), (std::vector<std::pair<int32_t, int32_t>>{{5, 1}}));
  pool.release(2);
  EXPECT_EQ(pool.available_runs(), (std::vector<std::pair<int32_t, int32_t>>{{1, 1}, {5, 1}}));
}

TEST(BlockPool, ValidatesSizes) {
  EXPECT_THROW(BlockPool(10, 12), Error);
  EXPECT_THROW(BlockPool(10, 0), Error);
  EXPECT_THROW(BlockPool(1, 16), Error);
  for (int32_t bs : {8, 16, 32, 64}) EXPECT_NO_THROW(BlockPool(4, bs));
}

TEST(BlockPool, NeverHandsOutBlockZeroAndFailedAllocationChangesNothing) {
  BlockPool pool(9, 8);
  pool.check_invariants();
  EXPECT_EQ(pool.num_usable_blocks(), 8);
  EXPECT_EQ(pool.num_free_blocks(), 8);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(5, AllocationPolicy::Any, kNullBlock, got));
  pool.check_invariants();
  const auto free_before = pool.free_list_order();
  EXPECT_FALSE(pool.allocate(4, AllocationPolicy::Any, kNullBlock, got));
  EXPECT_EQ(got.size(), 5u);
  EXPECT_EQ(pool.free_list_order(), free_before);
  ASSERT_TRUE(pool.allocate(3, AllocationPolicy::Any, kNullBlock, got));
  pool.check_invariants();
  std::set<BlockId> unique(got.begin(), got.end());
  EXPECT_EQ(unique.size(), 8u);
  EXPECT_EQ(unique.count(kNullBlock), 0u);
  EXPECT_EQ(pool.num_used_blocks(), 8);
  EXPECT_EQ(pool.num_available_blocks(), 0);
  for (BlockId b : got) pool.release(b);
  pool.check_invariants();
  EXPECT_EQ(pool.num_used_blocks(), 0);
  EXPECT_THROW(pool.ref_count(0), Error);
  EXPECT_THROW(pool.acquire(got[0]), Error);  // free: nothing to share
  EXPECT_THROW(pool.release(got[0]), Error);
}

TEST(BlockPool, RefCounts) {
  BlockPool pool(5, 8);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(1, AllocationPolicy::Any, kNullBlock, got));
  const BlockId b = got[0];
  EXPECT_EQ(pool.ref_count(b), 1);
  pool.acquire(b);
  pool.acquire(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  pool.check_invariants();
  pool.release(b);
  pool.release(b);
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.num_used_blocks(), 1);
  pool.release(b);
  EXPECT_EQ(pool.ref_count(b), 0);
  EXPECT_EQ(pool.num_used_blocks(), 0);
  pool.check_invariants();
}

// Allocates one block, fills and commits it as a root block with `tokens`.
BlockId committed_block(BlockPool& pool, const std::vector<TokenId>& tokens, uint64_t parent_id = 0,
                        BlockHash parent_hash = kRootBlockHash) {
  std::vector<BlockId> got;
  EXPECT_TRUE(pool.allocate(1, AllocationPolicy::Any, kNullBlock, got));
  pool.commit_full_block(got[0], hash_block_tokens(parent_hash, tokens), parent_id, tokens);
  return got[0];
}

TEST(BlockPool, CachedBlocksAreEvictedLeastRecentlyFreedFirst) {
  const int32_t bs = 8;
  BlockPool pool(5, bs);  // 4 usable
  std::vector<BlockId> blocks;
  std::vector<std::vector<TokenId>> contents;
  for (int i = 0; i < 3; ++i) {
    contents.push_back(iota_tokens(bs, 10 * i));
    blocks.push_back(committed_block(pool, contents.back()));
  }
  pool.check_invariants();
  // Free in the order 1, 0, 2: LRU order is the same.
  for (int i : {1, 0, 2}) pool.release(blocks[i]);
  pool.check_invariants();
  EXPECT_EQ(pool.num_cached_blocks(), 3);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_EQ(pool.cached_lru_order(), (std::vector<BlockId>{blocks[1], blocks[0], blocks[2]}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(pool.find_cached(hash_block_tokens(kRootBlockHash, contents[i]), 0, contents[i]),
              blocks[i]);
  }
  // The plain free block goes first; then the LRU cached ones, losing their hash.
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(1, AllocationPolicy::Any, kNullBlock, got));
  EXPECT_EQ(pool.num_cached_blocks(), 3);
  EXPECT_EQ(pool.num_evictions(), 0);
  ASSERT_TRUE(pool.allocate(2, AllocationPolicy::Any, kNullBlock, got));
  pool.check_invariants();
  EXPECT_EQ(got[1], blocks[1]);
  EXPECT_EQ(got[2], blocks[0]);
  EXPECT_EQ(pool.num_evictions(), 2);
  EXPECT_EQ(pool.find_cached(hash_block_tokens(kRootBlockHash, contents[1]), 0, contents[1]),
            kNullBlock);
  EXPECT_FALSE(pool.is_registered(blocks[0]));
  EXPECT_EQ(pool.prefix_id(blocks[0]), 0u);
  EXPECT_EQ(pool.cached_lru_order(), (std::vector<BlockId>{blocks[2]}));
  for (BlockId b : got) pool.release(b);
  pool.check_invariants();
}

TEST(BlockPool, ReusingACachedBlockTakesItOutOfTheMiddleOfTheLru) {
  const int32_t bs = 8;
  BlockPool pool(6, bs);
  std::vector<BlockId> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(committed_block(pool, iota_tokens(bs, 10 * i)));
  for (BlockId b : blocks) pool.release(b);
  EXPECT_TRUE(pool.is_cached_free(blocks[1]));
  pool.acquire(blocks[1]);
  pool.check_invariants();
  EXPECT_EQ(pool.ref_count(blocks[1]), 1);
  EXPECT_FALSE(pool.is_cached_free(blocks[1]));
  EXPECT_TRUE(pool.is_registered(blocks[1]));
  EXPECT_EQ(pool.cached_lru_order(), (std::vector<BlockId>{blocks[0], blocks[2]}));
  // Released again, it goes to the MRU end.
  pool.release(blocks[1]);
  EXPECT_EQ(pool.cached_lru_order(), (std::vector<BlockId>{blocks[0], blocks[2], blocks[1]}));
  pool.check_invariants();
}

TEST(BlockPool, HitsAreVerifiedByTokensAndParentIdentity) {
  const int32_t bs = 8;
  BlockPool pool(8, bs);
  const auto t0 = iota_tokens(bs, 0), t1 = iota_tokens(bs, 50);
  const BlockId parent = committed_block(pool, t0);
  const uint64_t pid = pool.prefix_id(parent);
  const BlockHash hp = hash_block_tokens(kRootBlockHash, t0);
  const BlockId child = committed_block(pool, t1, pid, hp);
  const BlockHash hc = hash_block_tokens(hp, t1);
  EXPECT_EQ(pool.find_cached(hc, pid, t1), child);
  EXPECT_EQ(pool.find_cached(hc, pid + 99, t1), kNullBlock);  // other parent
  auto other = t1;
  other[3] = 999;
  EXPECT_EQ(pool.find_cached(hc, pid, other), kNullBlock);    // forced collision: tokens differ

  // A colliding commit (same hash, other tokens) stays unregistered with a new identity.
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(2, AllocationPolicy::Any, kNullBlock, got));
  pool.commit_full_block(got[0], hc, pid, other);
  EXPECT_FALSE(pool.is_registered(got[0]));
  EXPECT_NE(pool.prefix_id(got[0]), pool.prefix_id(child));
  // A duplicate (same prefix computed twice) shares the identity of the registered one.
  pool.commit_full_block(got[1], hc, pid, t1);
  EXPECT_FALSE(pool.is_registered(got[1]));
  EXPECT_EQ(pool.prefix_id(got[1]), pool.prefix_id(child));
  const uint64_t before = pool.prefix_id(got[1]);
  pool.commit_full_block(got[1], hc, pid, t1);  // idempotent
  EXPECT_EQ(pool.prefix_id(got[1]), before);
  pool.check_invariants();
  // Unregistered blocks become plain free, forgetting their identity.
  pool.release(got[0]);
  pool.release(got[1]);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
  EXPECT_EQ(pool.prefix_id(got[0]), 0u);
  pool.check_invariants();
}

TEST(BlockPool, ChildOfAnEvictedParentIsNotMatchedUnderARecomputedParent) {
  const int32_t bs = 8;
  BlockPool pool(4, bs);  // 3 usable
  const auto t0 = iota_tokens(bs, 0), t1 = iota_tokens(bs, 50);
  const BlockHash hp = hash_block_tokens(kRootBlockHash, t0);
  const BlockHash hc = hash_block_tokens(hp, t1);
  const BlockId parent = committed_block(pool, t0);
  const BlockId child = committed_block(pool, t1, pool.prefix_id(parent), hp);
  pool.release(child);
  pool.release(parent);
  pool.acquire(child);  // keep the child while the parent gets evicted
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(2, AllocationPolicy::Any, kNullBlock, got));  // free one, then the parent
  EXPECT_EQ(got[1], parent);
  pool.release(child);
  for (BlockId b : got) pool.release(b);
  // The parent's contents are recomputed into another block: new identity.
  const BlockId parent2 = committed_block(pool, t0);
  EXPECT_EQ(pool.find_cached(hp, 0, t0), parent2);
  EXPECT_EQ(pool.find_cached(hc, pool.prefix_id(parent2), t1), kNullBlock);
  pool.release(parent2);
  pool.check_invariants();
}

TEST(BlockPool, ContiguousPlacementPrefersTheNextBlockAnyTakesTheFreeListHead) {
  for (AllocationPolicy policy : {AllocationPolicy::Any, AllocationPolicy::Contiguous}) {
    SCOPED_TRACE(policy == AllocationPolicy::Any ? "any" : "contiguous");
    BlockPool pool(17, 8);
    std::vector<BlockId> a, b, c;
    ASSERT_TRUE(pool.allocate(1, policy, kNullBlock, a));  // 1
    ASSERT_TRUE(pool.allocate(1, policy, kNullBlock, b));  // 2
    ASSERT_TRUE(pool.allocate(1, policy, kNullBlock, c));  // 3
    EXPECT_EQ(a[0], 1);
    EXPECT_EQ(b[0], 2);
    EXPECT_EQ(c[0], 3);
    pool.release(b[0]);  // free list: 4..16, 2
    ASSERT_TRUE(pool.allocate(2, policy, a.back(), a));
    pool.check_invariants();
    if (policy == AllocationPolicy::Contiguous) {
      EXPECT_EQ(a, (std::vector<BlockId>{1, 2, 4}));  // 2 follows 1; 3 is taken, so a new run
    } else {
      EXPECT_EQ(a, (std::vector<BlockId>{1, 4, 5}));
    }
  }
}

TEST(BlockPool, ContiguousPlacementFindsAFreeRun) {
  BlockPool pool(17, 8);
  std::vector<BlockId> all;
  ASSERT_TRUE(pool.allocate(16, AllocationPolicy::Any, kNullBlock, all));
  // Free 2, 5, 9, 10, 11, 12 (in that order): the run 9..12 is third on the list.
  for (BlockId b : {2, 5, 9, 10, 11, 12}) pool.release(b);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.allocate(3, AllocationPolicy::Contiguous, kNullBlock, got));
  EXPECT_EQ(got, (std::vector<BlockId>{9, 10, 11}));
  std::vector<BlockId> any;
  ASSERT_TRUE(pool.allocate(2, AllocationPolicy::Any, kNullBlock, any));
  EXPECT_EQ(any, (std::vector<BlockId>{2, 5}));
  pool.check_invariants();
}

}  // namespace
}  // namespace pagellm
