#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"
#include "kv/block_hash.h"

namespace pagellm {

KVCacheManager::KVCacheManager(const KVCacheConfig& config)
    : config_(config), pool_(config.num_blocks, config.block_size) {}

PrefixMatch KVCacheManager::match_prefix(std::span<const TokenId> tokens) const {
  PrefixMatch match;
  if (!config_.enable_prefix_caching) return match;
  match.num_query_tokens = static_cast<int32_t>(tokens.size());
  if (tokens.empty()) return match;
  const int32_t bs = pool_.block_size();
  // (n-1)/bs: the last token is always recomputed, even when it ends a block.
  const int32_t max_blocks = static_cast<int32_t>((tokens.size() - 1) / bs);
  BlockHash parent_hash = kRootBlockHash;
  uint64_t parent_id = 0;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const auto chunk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash h = hash_block_tokens(parent_hash, chunk);
    const BlockId b = pool_.find_cached(h, parent_id, chunk);
    if (b == kNullBlock) break;
    match.blocks.push_back(b);
    match.hashes.push_back(h);
    parent_hash = h;
    parent_id = pool_.prefix_id(b);
  }
  match.num_tokens = static_cast<int32_t>(match.blocks.size()) * bs;
  return match;
}

std::optional<SlotAllocation> KVCacheManager::allocate_slots(SeqId seq, int32_t num_computed_tokens,
                                                             int32_t num_new_tokens,
                                                             const PrefixMatch* prefix) {
  PAGELLM_CHECK(num_computed_tokens >= 0 && num_new_tokens >= 0,
                "allocate_slots(seq {}): negative token counts ({} computed, {} new)", seq,
                num_computed_tokens, num_new_tokens);
  const int32_t bs = pool_.block_size();
  auto it = seqs_.find(seq);
  const SeqBlocks* existing = it == seqs_.end() ? nullptr : &it->second;
  const int32_t have = existing ? static_cast<int32_t>(existing->blocks.size()) : 0;
  int32_t num_prefix_blocks = 0;
  int32_t prefix_from_cache = 0;  // matched blocks that must leave the LRU
  if (prefix && !prefix->blocks.empty()) {
    PAGELLM_CHECK(have == 0, "allocate_slots(seq {}): prefix hit for a sequence that has blocks",
                  seq);
    PAGELLM_CHECK(num_computed_tokens == prefix->num_tokens,
                  "allocate_slots(seq {}): {} computed tokens but the prefix hit covers {}", seq,
                  num_computed_tokens, prefix->num_tokens);
    num_prefix_blocks = static_cast<int32_t>(prefix->blocks.size());
    for (BlockId b : prefix->blocks) prefix_from_cache += pool_.is_cached_free(b) ? 1 : 0;
  }
  const int32_t have_after_prefix = have + num_prefix_blocks;
  PAGELLM_CHECK(static_cast<int64_t>(have_after_prefix) * bs >= num_computed_tokens,
                "allocate_slots(seq {}): {} computed tokens but only {} blocks", seq,
                num_computed_tokens, have_after_prefix);

  const int32_t needed = blocks_for_tokens(int64_t{num_computed_tokens} + num_new_tokens, bs);
  const int32_t num_new_blocks = std::max(0, needed - have_after_prefix);
  // Blocks this step writes into that another sequence also holds.
  const int32_t first_written = num_computed_tokens / bs;
  const int32_t last_existing = std::min(needed, have);
  int32_t num_cow = 0;
  if (existing && num_new_tokens > 0) {
    for (int32_t i = first_written; i < last_existing; ++i) {
      num_cow += pool_.ref_count(existing->blocks[i]) > 1 ? 1 : 0;
    }
  }
  if (num_new_blocks + num_cow > pool_.num_available_blocks() - prefix_from_cache) {
    return std::nullopt;
  }

  // Apply: nothing below can fail for lack of blocks.
  SeqBlocks& s = existing ? it->second : seqs_[seq];
  SlotAllocation result;
  if (num_prefix_blocks > 0) {
    for (BlockId b : prefix->blocks) pool_.acquire(b);
    s.blocks.insert(s.blocks.end(), prefix->blocks.begin(), prefix->blocks.end());
    s.hashes.insert(s.hashes.end(), prefix->hashes.begin(), prefix->hashes.end());
  }
  if (prefix) {
    prefix_query_tokens_ += prefix->num_query_tokens;
    prefix_hit_tokens_ += prefix->num_tokens;
  }
  if (num_cow > 0) {
    std::vector<BlockId> fresh;
    for (int32_t i = first_written; i < last_existing; ++i) {
      const BlockId old = s.blocks[i];
      if (pool_.ref_count(old) <= 1) continue;
      fresh.clear();
      const BlockId before = i > 0 ? s.blocks[i - 1] : kNullBlock;
      (void)pool_.allocate(1, config_.allocation_policy, before, fresh);
      // Only a block holding computed tokens needs its contents copied.
      if (int64_t{i} * bs < num_computed_tokens) result.copies.push_back({old, fresh[0]});
      pool_.release(old);
      s.blocks[i] = fresh[0];
    }
  }
  if (num_new_blocks > 0) {
    const BlockId after = s.blocks.empty() ? kNullBlock : s.blocks.back();
    (void)pool_.allocate(num_new_blocks, config_.allocation_policy, after, s.blocks);
  }
  result.num_new_blocks = num_new_blocks;
  s.num_tokens = std::max(s.num_tokens, num_computed_tokens + num_new_tokens);
  return result;
}

void KVCacheManager::commit_computed(SeqId seq, std::span<const TokenId> tokens,
                                     int32_t num_computed_tokens) {
  if (!config_.enable_prefix_caching) return;
  auto it = seqs_.find(seq);
  PAGELLM_CHECK(it != seqs_.end(), "commit_computed: sequence {} has no KV blocks", seq);
  PAGELLM_CHECK(num_computed_tokens >= 0 && static_cast<size_t>(num_computed_tokens) <= tokens.size(),
                "commit_computed(seq {}): {} computed tokens but {} token ids", seq,
                num_computed_tokens, tokens.size());
  SeqBlocks& s = it->second;
  const int32_t bs = pool_.block_size();
  const int32_t full = std::min<int32_t>(num_computed_tokens / bs,
                                         static_cast<int32_t>(s.blocks.size()));
  for (int32_t i = static_cast<int32_t>(s.hashes.size()); i < full; ++i) {
    const BlockHash parent_hash = i > 0 ? s.hashes[i - 1] : kRootBlockHash;
    const uint64_t parent_id = i > 0 ? pool_.prefix_id(s.blocks[i - 1]) : 0;
    const auto chunk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash h = hash_block_tokens(parent_hash, chunk);
    pool_.commit_full_block(s.blocks[i], h, parent_id, chunk);
    s.hashes.push_back(h);
  }
}

void KVCacheManager::truncate(SeqId seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  PAGELLM_CHECK(it != seqs_.end(), "truncate: sequence {} has no KV blocks", seq);
  SeqBlocks& s = it->second;
  if (num_tokens >= s.num_tokens) return;
  const int32_t bs = pool_.block_size();
  const int32_t keep = blocks_for_tokens(num_tokens, bs);
  PAGELLM_CHECK(num_tokens >= 0 && int64_t{num_tokens} >= static_cast<int64_t>(s.hashes.size()) * bs,
                "truncate(seq {}): {} tokens would drop committed blocks ({} committed)", seq, num_tokens,
                s.hashes.size());
  while (static_cast<int32_t>(s.blocks.size()) > keep) {
    pool_.release(s.blocks.back());
    s.blocks.pop_back();
  }
  s.num_tokens = num_tokens;
}

int32_t KVCacheManager::evict(SeqId seq, int32_t first_block, int32_t end_block) {
  auto it = seqs_.find(seq);
  PAGELLM_CHECK(it != seqs_.end(), "evict: sequence {} has no KV blocks", seq);
  SeqBlocks& s = it->second;
  PAGELLM_CHECK(first_block >= 0 && end_block <= static_cast<int32_t>(s.blocks.size()),
                "evict(seq {}): blocks [{}, {}) outside a table of {}", seq, first_block, end_block, s.blocks.size());
  if (end_block <= std::max(first_block, s.evicted_end)) return 0;
  PAGELLM_CHECK(s.evicted_end == 0 || s.evicted_begin == first_block,
                "evict(seq {}): the evicted range starts at block {}, not {}", seq, s.evicted_begin, first_block);
  int32_t released = 0;
  for (int32_t i = std::max(first_block, s.evicted_end); i < end_block; ++i) {
    pool_.release(s.blocks[i]);
    s.blocks[i] = kNullBlock;
    ++released;
  }
  s.evicted_begin = first_block;
  s.evicted_end = end_block;
  return released;
}

int32_t sliding_window_tokens(int32_t sink_tokens, int32_t max_kv_tokens, int32_t block_size) {
  return (max_kv_tokens / block_size - blocks_for_tokens(sink_tokens, block_size)) * block_size;
}

int32_t KVCacheManager::slide_window(SeqId seq, int32_t sink_tokens, int32_t max_kv_tokens, int32_t end_tokens) {
  if (!has_seq(seq)) return 0;
  const int32_t bs = pool_.block_size();
  const int32_t first_kept =
      blocks_for_tokens(end_tokens, bs) - sliding_window_tokens(sink_tokens, max_kv_tokens, bs) / bs;
  // Only blocks the table already has (a later allocation adds the rest).
  const int32_t have = static_cast<int32_t>(block_table(seq).size());
  return evict(seq, blocks_for_tokens(sink_tokens, bs), std::min(first_kept, have));
}

int32_t KVCacheManager::evicted_end(SeqId seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.evicted_end;
}

void KVCacheManager::fork(SeqId parent, SeqId child) {
  const auto it = seqs_.find(parent);
  PAGELLM_CHECK(it != seqs_.end(), "fork: parent sequence {} has no KV blocks", parent);
  PAGELLM_CHECK(!seqs_.count(child), "fork: child sequence {} already has KV blocks", child);
  SeqBlocks copy = it->second;
  for (BlockId b : copy.blocks)
    if (b != kNullBlock) pool_.acquire(b);
  seqs_.emplace(child, std::move(copy));
}

void KVCacheManager::free(SeqId seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const auto& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)
    if (*b != kNullBlock) pool_.release(*b);  // evicted ones are gone already
  seqs_.erase(it);
}

std::span<const BlockId> KVCacheManager::block_table(SeqId seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

KVCacheStats KVCacheManager::stats() const {
  KVCacheStats st;
  st.block_size = pool_.block_size();
  st.total_blocks = pool_.num_usable_blocks();
  st.used_blocks = pool_.num_used_blocks();
  st.cached_blocks = pool_.num_cached_blocks();
  st.free_blocks = pool_.num_free_blocks();
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.evictions = pool_.num_evictions();
  st.following_allocations = pool_.num_following_allocations();
  st.contiguous_allocations = pool_.num_contiguous_allocations();
  if (st.used_blocks > 0) {
    // A shared block holds as many tokens as its fullest holder put there.
    const int32_t bs = st.block_size;
    std::vector<int32_t> filled(static_cast<size_t>(pool_.num_blocks()), 0);
    for (const auto& [id, s] : seqs_) {
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        if (s.blocks[i] == kNullBlock) continue;  // evicted
        const int64_t in_block = std::clamp<int64_t>(s.num_tokens - int64_t(i) * bs, 0, bs);
        filled[s.blocks[i]] = std::max(filled[s.blocks[i]], static_cast<int32_t>(in_block));
      }
    }
    int64_t held = 0;
    for (int32_t f : filled) held += f;
    const int64_t slots = int64_t{st.used_blocks} * bs;
    st.fragmentation = double(slots - held) / double(slots);
  }
  return st;
}

void KVCacheManager::check_invariants() const {
  pool_.check_invariants();
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> refs(static_cast<size_t>(pool_.num_blocks()), 0);
  std::vector<SeqId> last_holder(static_cast<size_t>(pool_.num_blocks()), 0);
  std::vector<uint8_t> held(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& [id, s] : seqs_) {
    PAGELLM_CHECK(static_cast<int32_t>(s.blocks.size()) == blocks_for_tokens(s.num_tokens, bs),
                  "sequence {} has {} blocks for {} tokens", id, s.blocks.size(), s.num_tokens);
    PAGELLM_CHECK(s.hashes.size() <= s.blocks.size(),
                  "sequence {} has {} committed hashes for {} blocks", id, s.hashes.size(),
                  s.blocks.size());
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const BlockId b = s.blocks[i];
      const bool evicted = static_cast<int32_t>(i) >= s.evicted_begin && static_cast<int32_t>(i) < s.evicted_end;
      PAGELLM_CHECK(evicted == (b == kNullBlock), "sequence {} block {} is {} but {} the evicted range", id, i,
                    b == kNullBlock ? "null" : "held", evicted ? "inside" : "outside");
      if (evicted) continue;
      PAGELLM_CHECK(b > kNullBlock && b < pool_.num_blocks(),
                    "sequence {} holds invalid block {}", id, b);
      PAGELLM_CHECK(!(held[b] && last_holder[b] == id), "sequence {} holds block {} twice", id, b);
      held[b] = 1;
      last_holder[b] = id;
      ++refs[b];
      if (i < s.hashes.size()) {
        PAGELLM_CHECK(pool_.prefix_id(b) != 0, "sequence {} block {} is committed without a prefix id",
                      id, b);
        const auto h = pool_.registered_hash(b);
        PAGELLM_CHECK(!h || *h == s.hashes[i],
                      "sequence {} block {} is registered under another hash", id, b);
      }
    }
  }
  for (BlockId b = 1; b < pool_.num_blocks(); ++b) {
    PAGELLM_CHECK(pool_.ref_count(b) == refs[b],
                  "block {} has ref count {} but {} block tables hold it", b, pool_.ref_count(b),
                  refs[b]);
  }
}

}  // namespace pagellm
