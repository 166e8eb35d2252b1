// KV events: what the prefix cache records (stored / removed / cleared, in
// order, nothing when off) and the engine's bounded event window.
#include "kv/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_test_util.h"

namespace pagellm {
namespace {

using namespace std::chrono_literals;

using test::iota_tokens;

KVCacheManager manager(int32_t num_blocks, bool events = true) {
  KVCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = 8;
  KVCacheManager kv(c);
  if (events) kv.set_record_events(true);
  return kv;
}

void compute(KVCacheManager& kv, SeqId id, const std::vector<TokenId>& tokens, uint64_t lora = 0) {
  const PrefixMatch m = kv.match_prefix(tokens, lora);
  const int32_t n = static_cast<int32_t>(tokens.size()) - m.num_tokens;
  ASSERT_TRUE(kv.allocate_slots(id, m.num_tokens, n, &m).has_value());
  kv.commit_computed(id, tokens, static_cast<int32_t>(tokens.size()), lora);
}

TEST(KvEvents, StoredCarriesTheChainItsParentAndTokens) {
  KVCacheManager kv = manager(16);
  auto events = kv.take_events();
  ASSERT_EQ(events.size(), 1u);  // turning recording on clears first
  EXPECT_EQ(events[0].type, KvEventType::AllBlocksCleared);

  const auto tokens = iota_tokens(20, 100);  // 2 full blocks of 8, 4 tokens over
  compute(kv, 1, tokens);
  events = kv.take_events();
  ASSERT_EQ(events.size(), 1u);  // one sequence's blocks make one event
  const KvEvent e = events[0];  // a copy: events is reused below
  EXPECT_EQ(e.type, KvEventType::BlockStored);
  EXPECT_FALSE(e.parent_block_hash.has_value());
  EXPECT_EQ(e.block_size, 8);
  EXPECT_EQ(e.lora_id, 0u);
  EXPECT_EQ(e.token_ids, std::vector<TokenId>(tokens.begin(), tokens.begin() + 16));
  ASSERT_EQ(e.block_hashes.size(), 2u);
  const BlockHash h0 = hash_block_tokens(kRootBlockHash, std::span(tokens).subspan(0, 8));
  EXPECT_EQ(e.block_hashes[0], h0);
  EXPECT_EQ(e.block_hashes[1], hash_block_tokens(h0, std::span(tokens).subspan(8, 8)));

  // A longer prompt over the same prefix: only its new block, parent named.
  auto longer = tokens;
  longer.insert(longer.end(), {7, 8, 9, 10});
  compute(kv, 2, longer);
  events = kv.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].block_hashes.size(), 1u);
  EXPECT_EQ(events[0].parent_block_hash, std::optional<BlockHash>(e.block_hashes[1]));
  EXPECT_EQ(events[0].token_ids, (std::vector<TokenId>{116, 117, 118, 119, 7, 8, 9, 10}));
}

TEST(KvEvents, EvictionRemovesInOrderAfterStored) {
  KVCacheManager kv = manager(5);  // 4 usable blocks
  (void)kv.take_events();
  compute(kv, 1, iota_tokens(17, 100));  // 2 full blocks + 1 partial
  kv.free(1);                           // the full ones stay cached
  compute(kv, 2, iota_tokens(25, 500)); // 4 blocks: evicts both cached ones
  const auto events = kv.take_events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, KvEventType::BlockStored);
  EXPECT_EQ(events[1].type, KvEventType::BlockRemoved);
  std::vector<BlockHash> removed = events[1].block_hashes;
  std::vector<BlockHash> stored = events[0].block_hashes;
  std::sort(removed.begin(), removed.end());
  std::sort(stored.begin(), stored.end());
  EXPECT_EQ(removed, stored);
  EXPECT_EQ(events[2].type, KvEventType::BlockStored);
  EXPECT_EQ(events[2].block_hashes.size(), 3u);
}

TEST(KvEvents, LoraIdAndNothingWhenOff) {
  KVCacheManager kv = manager(16);
  (void)kv.take_events();
  compute(kv, 1, iota_tokens(9, 100), 7);
  auto events = kv.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].lora_id, 7u);

  KVCacheManager off = manager(5, false);
  compute(off, 1, iota_tokens(17, 100));
  off.free(1);
  compute(off, 2, iota_tokens(25, 500));
  EXPECT_TRUE(off.take_events().empty());
  // Blocks cached before recording began are never announced, so never removed.
  off.set_record_events(true);
  off.free(2);
  compute(off, 3, iota_tokens(25, 900));
  events = off.take_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, KvEventType::AllBlocksCleared);
  EXPECT_EQ(events[1].type, KvEventType::BlockStored);
}

KvEvent stored(BlockHash h, std::optional<BlockHash> parent = std::nullopt) {
  KvEvent e = kv_event(KvEventType::BlockStored);
  e.block_hashes = {h};
  e.parent_block_hash = parent;
  e.token_ids = {1, 2};
  e.block_size = 2;
  e.medium = "CPU";
  return e;
}

TEST(KvEventLog, NewReaderGetsASnapshotThenBatchesInOrder) {
  KvEventLog log(100);
  log.publish({stored(1), stored(2, 1)});
  KvEvent removed = kv_event(KvEventType::BlockRemoved);
  removed.block_hashes = {2};
  removed.medium = "CPU";
  log.publish({removed});
  auto r = log.read({}, 0ms);
  ASSERT_TRUE(r.resync);
  ASSERT_EQ(r.batches.size(), 1u);
  EXPECT_EQ(r.batches[0].seq, 2u);
  ASSERT_EQ(r.batches[0].events.size(), 2u);  // cleared + block 1 (2 was removed)
  EXPECT_EQ(r.batches[0].events[0].type, KvEventType::AllBlocksCleared);
  EXPECT_EQ(r.batches[0].events[1].block_hashes, std::vector<BlockHash>{1});
  EXPECT_EQ(r.batches[0].events[1].token_ids, (std::vector<TokenId>{1, 2}));

  EXPECT_TRUE(log.read(r.cursor, 0ms).batches.empty());  // nothing new: waits, then nothing
  log.publish({stored(3, 1)});
  log.publish({});  // no batch
  log.publish({stored(4, 3)});
  r = log.read(r.cursor, 0ms);
  EXPECT_FALSE(r.resync);
  ASSERT_EQ(r.batches.size(), 2u);
  EXPECT_EQ(r.batches[0].seq, 3u);
  EXPECT_EQ(r.batches[1].seq, 4u);
  EXPECT_EQ(log.published_events(), 5u);
  EXPECT_EQ(log.stored_blocks(), 3u);
}

TEST(KvEventLog, ASlowReaderIsResyncedAndItsMissCounted) {
  KvEventLog log(3);  // 3 blocks' worth of events
  log.publish({stored(1)});
  auto r = log.read({}, 0ms);
  for (BlockHash h = 2; h <= 6; ++h) log.publish({stored(h, h - 1)});  // the window keeps 4, 5, 6
  r = log.read(r.cursor, 0ms);
  ASSERT_TRUE(r.resync);
  EXPECT_EQ(r.missed, 2u);  // 2 and 3
  EXPECT_EQ(log.dropped_events(), 2u);
  EXPECT_EQ(log.resyncs(), 1u);
  EXPECT_EQ(r.batches[0].events.size(), 7u);  // cleared + 6 blocks
  log.publish({stored(7, 6)});
  r = log.read(r.cursor, 0ms);
  EXPECT_FALSE(r.resync);
  ASSERT_EQ(r.batches.size(), 1u);
  EXPECT_EQ(r.batches[0].seq, 7u);
}

TEST(KvEventLog, AWaitingReaderWakesOnPublish) {
  KvEventLog log(10);
  auto r = log.read({}, 0ms);
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    log.publish({stored(1)});
  });
  r = log.read(r.cursor, 5s);
  writer.join();
  ASSERT_EQ(r.batches.size(), 1u);
  EXPECT_EQ(r.batches[0].seq, 1u);
}

}  // namespace
}  // namespace pagellm
