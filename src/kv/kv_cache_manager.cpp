#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/util.h"
#include "kv/block_hash.h"
#include "kv/kv_sizing.h"

namespace pagellm {

KVCacheManager::KVCacheManager(const KVCacheConfig& config)
    : config_(config), groups_(config.groups), pool_(config.num_blocks, config.block_size) {
  if (groups_.empty()) groups_.push_back(KvGroup{});
  PAGELLM_CHECK(keeps_every_token(groups_[0].kind), "KV-cache group 0 must keep every token (full attention)");
  for (const KvGroup& g : groups_)
    PAGELLM_CHECK(keeps_every_token(g.kind) || g.window > 0, "a sliding KV-cache group needs a window > 0");
  PAGELLM_CHECK(config_.num_state_slots >= 0, "negative number of state slots");
  PAGELLM_CHECK(config_.num_state_slots == 0 || !config_.enable_prefix_caching,
                "prefix caching cannot restore linear-attention states: turn it off for models that have them");
  for (int32_t i = config_.num_state_slots - 1; i >= 0; --i) free_state_slots_.push_back(i);
}

int32_t KVCacheManager::state_slot(SeqId seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() || it->second.state_slot < 0 ? -1 : config_.state_slot_base + it->second.state_slot;
}

std::vector<BlockCopy> KVCacheManager::take_state_copies() {
  std::vector<BlockCopy> copies = std::exchange(state_copies_, {});
  for (BlockCopy& c : copies) {
    c.src += config_.state_slot_base;
    c.dst += config_.state_slot_base;
  }
  return copies;
}

void KVCacheManager::snapshot_state(SeqId seq) {
  const auto it = seqs_.find(seq);
  const int32_t slot = it == seqs_.end() ? -1 : it->second.state_slot;
  PAGELLM_CHECK(config_.state_snapshots && slot >= 0, "sequence {} has no state snapshot slot", seq);
  state_copies_.push_back({slot, config_.num_state_slots + slot});
}

void KVCacheManager::restore_state(SeqId seq) {
  const auto it = seqs_.find(seq);
  const int32_t slot = it == seqs_.end() ? -1 : it->second.state_slot;
  PAGELLM_CHECK(config_.state_snapshots && slot >= 0, "sequence {} has no state snapshot slot", seq);
  state_copies_.push_back({config_.num_state_slots + slot, slot});
}

BlockHash KVCacheManager::group_hash(BlockHash h, int g) {
  return g == 0 ? h : mix64(h + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(g));
}

int32_t KVCacheManager::first_visible_block(int g, int32_t num_computed_tokens) const {
  const KvGroup& group = groups_[static_cast<size_t>(g)];
  if (keeps_every_token(group.kind)) return 0;
  // A query at position p sees keys p - window < j <= p.
  return std::max(0, num_computed_tokens - group.window + 1) / pool_.block_size();
}

int32_t KVCacheManager::blocks_for_step(int32_t num_computed_tokens, int32_t num_new_tokens) const {
  const int32_t end = blocks_for_tokens(int64_t{num_computed_tokens} + num_new_tokens, pool_.block_size());
  int32_t total = 0;
  for (int g = 0; g < num_groups(); ++g) total += end - std::min(end, first_visible_block(g, num_computed_tokens));
  return total;
}

int32_t KVCacheManager::blocks_held(int32_t num_tokens) const { return blocks_for_step(num_tokens, 0); }

int32_t KVCacheManager::max_blocks_per_seq(int32_t max_len, int32_t step_tokens) const {
  return kv_blocks_per_seq(groups_, pool_.block_size(), max_len, step_tokens);
}

namespace {

// A sequence's first block chains from its cache key's root: its hash, and the
// parent prefix id the pool checks (block ids count up from 1 and never reach
// the high bit, so a key's root is no block's id).
BlockHash root_hash(uint64_t cache_key) {
  return cache_key == 0 ? kRootBlockHash : kRootBlockHash ^ (cache_key * 0x9e3779b97f4a7c15ULL);
}
uint64_t root_prefix_id(uint64_t cache_key) { return cache_key == 0 ? 0 : (uint64_t{1} << 63) | cache_key; }

}  // namespace

PrefixMatch KVCacheManager::match_prefix(std::span<const TokenId> tokens, uint64_t cache_key) const {
  PrefixMatch match;
  if (!config_.enable_prefix_caching) return match;
  match.num_query_tokens = static_cast<int32_t>(tokens.size());
  if (tokens.empty()) return match;
  const int32_t bs = pool_.block_size();
  // (n-1)/bs: the last token is always recomputed, even when it ends a block.
  const int32_t max_blocks = static_cast<int32_t>((tokens.size() - 1) / bs);
  BlockHash parent_hash = root_hash(cache_key);
  uint64_t parent_id = root_prefix_id(cache_key);
  std::vector<uint64_t> parent_ids;  // [i]: the prefix id block i's parent has
  for (int32_t i = 0; i < max_blocks; ++i) {
    const auto chunk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash h = hash_block_tokens(parent_hash, chunk);
    const BlockId b = pool_.find_cached(h, parent_id, chunk);
    if (b == kNullBlock) break;
    match.blocks.push_back(b);
    match.hashes.push_back(h);
    parent_ids.push_back(parent_id);
    parent_hash = h;
    parent_id = pool_.prefix_id(b);
  }
  // A sliding group needs the blocks its window sees from the hit's end:
  // shorten the hit until every group has them.
  auto n = static_cast<int32_t>(match.blocks.size());
  std::vector<std::vector<BlockId>> found(groups_.size());
  for (int g = 1; g < num_groups(); ++g) {
    auto& f = found[static_cast<size_t>(g)];
    for (int32_t i = 0; i < n; ++i) {
      const auto chunk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
      f.push_back(pool_.find_cached(group_hash(match.hashes[i], g), parent_ids[i], chunk));
    }
    while (n > 0) {
      bool all = true;
      for (int32_t i = first_visible_block(g, n * bs); i < n && all; ++i) all = f[i] != kNullBlock;
      if (all) break;
      --n;
    }
  }
  match.blocks.resize(static_cast<size_t>(n));
  match.hashes.resize(static_cast<size_t>(n));
  for (int g = 1; g < num_groups(); ++g) {
    auto& f = found[static_cast<size_t>(g)];
    f.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < first_visible_block(g, n * bs) && i < n; ++i) f[i] = kNullBlock;
    match.group_blocks.push_back(std::move(f));
  }
  match.num_tokens = n * bs;
  return match;
}

KVCacheManager::SeqBlocks& KVCacheManager::new_seq(SeqId seq) {
  SeqBlocks& s = seqs_[seq];
  s.tables.resize(groups_.size());
  s.dropped.assign(groups_.size(), 0);
  return s;
}

void KVCacheManager::drop_invisible(SeqBlocks& s, int32_t num_computed_tokens) {
  for (int g = 1; g < num_groups(); ++g) {
    auto& table = s.tables[static_cast<size_t>(g)];
    const int32_t end = std::min(first_visible_block(g, num_computed_tokens), static_cast<int32_t>(table.size()));
    for (int32_t& i = s.dropped[static_cast<size_t>(g)]; i < end; ++i) {
      pool_.release(table[i]);
      table[i] = kNullBlock;
    }
  }
}

std::optional<SlotAllocation> KVCacheManager::allocate_slots(SeqId seq, int32_t num_computed_tokens,
                                                             int32_t num_new_tokens,
                                                             const PrefixMatch* prefix) {
  PAGELLM_CHECK(num_computed_tokens >= 0 && num_new_tokens >= 0,
                "allocate_slots(seq {}): negative token counts ({} computed, {} new)", seq,
                num_computed_tokens, num_new_tokens);
  const int32_t bs = pool_.block_size();
  auto it = seqs_.find(seq);
  if (it != seqs_.end()) drop_invisible(it->second, num_computed_tokens);
  const SeqBlocks* existing = it == seqs_.end() ? nullptr : &it->second;
  const int32_t have = existing ? static_cast<int32_t>(existing->tables[0].size()) : 0;
  int32_t num_prefix_blocks = 0;
  int32_t prefix_from_cache = 0;  // matched blocks that must leave the LRU
  if (prefix && !prefix->blocks.empty()) {
    PAGELLM_CHECK(have == 0, "allocate_slots(seq {}): prefix hit for a sequence that has blocks",
                  seq);
    PAGELLM_CHECK(num_computed_tokens == prefix->num_tokens,
                  "allocate_slots(seq {}): {} computed tokens but the prefix hit covers {}", seq,
                  num_computed_tokens, prefix->num_tokens);
    PAGELLM_CHECK(prefix->group_blocks.size() + 1 == groups_.size(),
                  "allocate_slots(seq {}): a prefix hit of {} groups for {}", seq, prefix->group_blocks.size() + 1,
                  groups_.size());
    num_prefix_blocks = static_cast<int32_t>(prefix->blocks.size());
    for (BlockId b : prefix->blocks) prefix_from_cache += pool_.is_cached_free(b) ? 1 : 0;
    for (const auto& blocks : prefix->group_blocks)
      for (BlockId b : blocks) prefix_from_cache += b != kNullBlock && pool_.is_cached_free(b) ? 1 : 0;
  }
  const int32_t have_after_prefix = have + num_prefix_blocks;
  PAGELLM_CHECK(static_cast<int64_t>(have_after_prefix) * bs >= num_computed_tokens,
                "allocate_slots(seq {}): {} computed tokens but only {} blocks", seq,
                num_computed_tokens, have_after_prefix);

  const int32_t needed = blocks_for_tokens(int64_t{num_computed_tokens} + num_new_tokens, bs);
  const int32_t grow = std::max(0, needed - have_after_prefix);
  int32_t num_new_blocks = 0;  // all groups; a sliding one skips what its window cannot see
  for (int g = 0; g < num_groups(); ++g)
    num_new_blocks += std::max(0, needed - std::max(have_after_prefix, first_visible_block(g, num_computed_tokens)));
  // Blocks this step writes into that another sequence also holds.
  const int32_t first_written = num_computed_tokens / bs;
  const int32_t last_existing = std::min(needed, have);
  int32_t num_cow = 0;
  if (existing && num_new_tokens > 0) {
    for (const auto& table : existing->tables)
      for (int32_t i = first_written; i < last_existing; ++i)
        num_cow += table[i] != kNullBlock && pool_.ref_count(table[i]) > 1 ? 1 : 0;
  }
  if (num_new_blocks + num_cow > pool_.num_available_blocks() - prefix_from_cache) {
    return std::nullopt;
  }
  const bool needs_state = has_state() && (!existing || existing->state_slot < 0);
  if (needs_state && free_state_slots_.empty()) return std::nullopt;

  // Apply: nothing below can fail for lack of blocks.
  SeqBlocks& s = existing ? it->second : new_seq(seq);
  if (needs_state) {
    s.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
  }
  SlotAllocation result;
  if (num_prefix_blocks > 0) {
    for (BlockId b : prefix->blocks) pool_.acquire(b);
    s.tables[0].insert(s.tables[0].end(), prefix->blocks.begin(), prefix->blocks.end());
    s.hashes.insert(s.hashes.end(), prefix->hashes.begin(), prefix->hashes.end());
    for (int g = 1; g < num_groups(); ++g) {
      const auto& blocks = prefix->group_blocks[static_cast<size_t>(g - 1)];
      for (BlockId b : blocks)
        if (b != kNullBlock) pool_.acquire(b);
      s.tables[static_cast<size_t>(g)] = blocks;
      s.dropped[static_cast<size_t>(g)] = first_visible_block(g, num_computed_tokens);
    }
  }
  if (prefix) {
    prefix_query_tokens_ += prefix->num_query_tokens;
    prefix_hit_tokens_ += prefix->num_tokens;
  }
  if (num_cow > 0) {
    std::vector<BlockId> fresh;
    for (auto& table : s.tables) {
      for (int32_t i = first_written; i < last_existing; ++i) {
        const BlockId old = table[i];
        if (old == kNullBlock || pool_.ref_count(old) <= 1) continue;
        fresh.clear();
        const BlockId before = i > 0 ? table[i - 1] : kNullBlock;
        (void)pool_.allocate(1, config_.allocation_policy, before, fresh);
        // Only a block holding computed tokens needs its contents copied.
        if (int64_t{i} * bs < num_computed_tokens) result.copies.push_back({old, fresh[0]});
        pool_.release(old);
        table[i] = fresh[0];
      }
    }
  }
  if (grow > 0) {
    for (int g = 0; g < num_groups(); ++g) {
      auto& table = s.tables[static_cast<size_t>(g)];
      // A fresh sliding table starts where the window does.
      const int32_t skip = std::clamp(first_visible_block(g, num_computed_tokens) - static_cast<int32_t>(table.size()),
                                      0, grow);
      table.resize(table.size() + static_cast<size_t>(skip), kNullBlock);
      if (skip > 0) s.dropped[static_cast<size_t>(g)] = static_cast<int32_t>(table.size());
      const BlockId after = table.empty() ? kNullBlock : table.back();
      (void)pool_.allocate(grow - skip, config_.allocation_policy, after, table);
    }
  }
  result.num_new_blocks = num_new_blocks;
  s.num_tokens = std::max(s.num_tokens, num_computed_tokens + num_new_tokens);
  return result;
}

std::optional<SlotAllocation> KVCacheManager::allocate_restored(SeqId seq, int32_t num_tokens) {
  PAGELLM_CHECK(!has_state(), "sequence {}: linear-attention states are not swapped (preempt by recompute)", seq);
  PAGELLM_CHECK(!has_seq(seq), "allocate_restored: sequence {} already has KV blocks", seq);
  PAGELLM_CHECK(num_tokens >= 0, "allocate_restored(seq {}): {} tokens", seq, num_tokens);
  const int32_t n = blocks_held(num_tokens);
  if (n > pool_.num_available_blocks()) return std::nullopt;
  SeqBlocks& s = new_seq(seq);
  const int32_t len = blocks_for_tokens(num_tokens, pool_.block_size());
  for (int g = 0; g < num_groups(); ++g) {
    auto& table = s.tables[static_cast<size_t>(g)];
    const int32_t skip = std::min(len, first_visible_block(g, num_tokens));
    table.assign(static_cast<size_t>(skip), kNullBlock);
    if (g > 0) s.dropped[static_cast<size_t>(g)] = skip;
    (void)pool_.allocate(len - skip, config_.allocation_policy, kNullBlock, table);
  }
  s.num_tokens = num_tokens;
  SlotAllocation result;
  result.num_new_blocks = n;
  return result;
}

void KVCacheManager::commit_computed(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed_tokens,
                                     uint64_t cache_key) {
  if (!config_.enable_prefix_caching) return;
  auto it = seqs_.find(seq);
  PAGELLM_CHECK(it != seqs_.end(), "commit_computed: sequence {} has no KV blocks", seq);
  PAGELLM_CHECK(num_computed_tokens >= 0 && static_cast<size_t>(num_computed_tokens) <= tokens.size(),
                "commit_computed(seq {}): {} computed tokens but {} token ids", seq,
                num_computed_tokens, tokens.size());
  SeqBlocks& s = it->second;
  const int32_t bs = pool_.block_size();
  const auto& full_table = s.tables[0];
  const int32_t full = std::min<int32_t>(num_computed_tokens / bs, static_cast<int32_t>(full_table.size()));
  for (int32_t i = static_cast<int32_t>(s.hashes.size()); i < full; ++i) {
    const BlockHash parent_hash = i > 0 ? s.hashes[i - 1] : root_hash(cache_key);
    // Every group's block i has group 0's block i - 1 as its parent prefix.
    const uint64_t parent_id = i > 0 ? pool_.prefix_id(full_table[i - 1]) : root_prefix_id(cache_key);
    const auto chunk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash h = hash_block_tokens(parent_hash, chunk);
    if (pool_.commit_full_block(full_table[i], h, parent_id, chunk))
      pool_.stored(full_table[i], i > 0 ? std::optional<BlockHash>(parent_hash) : std::nullopt, cache_key);
    if (config_.record_commits) committed_.push_back({seq, 0, i, full_table[i]});
    for (int g = 1; g < num_groups(); ++g) {
      const BlockId b = s.tables[static_cast<size_t>(g)][i];
      if (b == kNullBlock) continue;
      pool_.commit_full_block(b, group_hash(h, g), parent_id, chunk);
      if (config_.record_commits) committed_.push_back({seq, g, i, b});
    }
    s.hashes.push_back(h);
  }
}

void KVCacheManager::set_record_events(bool on) {
  if (on && !pool_.recording_events()) {
    pool_.set_record_events(true);
    pool_.record_cleared();
  }
  if (!on) pool_.set_record_events(false);
}

PrefixImport KVCacheManager::import_prefix(std::span<const TokenId> tokens, uint64_t cache_key, int32_t max_blocks,
                                           const std::function<bool(int, int32_t)>& supplied, int32_t max_fresh) {
  PrefixImport out;
  if (!config_.enable_prefix_caching || tokens.empty()) return out;
  const int32_t bs = pool_.block_size();
  const int32_t limit = std::min<int32_t>(max_blocks, static_cast<int32_t>((tokens.size() - 1) / bs));
  auto chunk_of = [&](int32_t i) { return tokens.subspan(static_cast<size_t>(i) * bs, bs); };
  // Group 0: the pool's blocks while its chain lasts, then the caller's. A
  // block after a fresh one gets a new prefix id, so no pool block can follow.
  std::vector<BlockHash> hashes;
  std::vector<BlockId> found0;        // kNullBlock: fresh
  std::vector<uint64_t> parent_ids;   // valid where parent_known
  std::vector<uint8_t> parent_known;
  BlockHash parent_hash = root_hash(cache_key);
  uint64_t parent_id = root_prefix_id(cache_key);
  bool known = true;
  for (int32_t i = 0; i < limit; ++i) {
    const BlockHash h = hash_block_tokens(parent_hash, chunk_of(i));
    const BlockId b = known ? pool_.find_cached(h, parent_id, chunk_of(i)) : kNullBlock;
    if (b == kNullBlock && !supplied(0, i)) break;
    hashes.push_back(h);
    found0.push_back(b);
    parent_ids.push_back(parent_id);
    parent_known.push_back(known ? 1 : 0);
    if (b != kNullBlock) parent_id = pool_.prefix_id(b);
    else known = false;
    parent_hash = h;
  }
  auto n = static_cast<int32_t>(hashes.size());
  // Sliding groups: their blocks in the pool (findable only under a known parent).
  std::vector<std::vector<BlockId>> found(groups_.size());
  for (int g = 1; g < num_groups(); ++g) {
    auto& f = found[static_cast<size_t>(g)];
    for (int32_t i = 0; i < n; ++i)
      f.push_back(parent_known[i] ? pool_.find_cached(group_hash(hashes[i], g), parent_ids[i], chunk_of(i))
                                  : kNullBlock);
  }
  // What a prefix of m blocks needs: fresh blocks, and cached pool blocks it
  // takes off the LRU (both out of the available ones).
  std::vector<int32_t> fresh0(static_cast<size_t>(n) + 1, 0), cached0(static_cast<size_t>(n) + 1, 0);
  for (int32_t i = 0; i < n; ++i) {
    fresh0[i + 1] = fresh0[i] + (found0[i] == kNullBlock ? 1 : 0);
    cached0[i + 1] = cached0[i] + (found0[i] != kNullBlock && pool_.is_cached_free(found0[i]) ? 1 : 0);
  }
  auto fits = [&](int32_t m) {
    int32_t fresh = fresh0[m], cached = cached0[m];
    for (int g = 1; g < num_groups(); ++g) {
      for (int32_t i = first_visible_block(g, m * bs); i < m; ++i) {
        const BlockId b = found[static_cast<size_t>(g)][i];
        if (b == kNullBlock && !supplied(g, i)) return false;
        fresh += b == kNullBlock ? 1 : 0;
        cached += b != kNullBlock && pool_.is_cached_free(b) ? 1 : 0;
      }
    }
    return fresh <= max_fresh && fresh + cached <= pool_.num_available_blocks();
  };
  while (n > 0 && !fits(n)) --n;
  out.num_blocks = n;
  if (fresh0[n] == 0 && n > 0) {
    bool any_fresh = false;
    for (int g = 1; g < num_groups() && !any_fresh; ++g)
      for (int32_t i = first_visible_block(g, n * bs); i < n; ++i) any_fresh |= found[static_cast<size_t>(g)][i] == kNullBlock;
    if (!any_fresh) return out;  // all in the pool already: match_prefix will find it
  }
  if (n == 0) return out;

  // Pin the pool's blocks first, so that allocating fresh ones cannot evict them.
  std::vector<std::vector<BlockId>> blocks(groups_.size(), std::vector<BlockId>(static_cast<size_t>(n), kNullBlock));
  for (int32_t i = 0; i < n; ++i) {
    if (found0[i] == kNullBlock) continue;
    pool_.acquire(found0[i]);
    blocks[0][i] = found0[i];
  }
  for (int g = 1; g < num_groups(); ++g) {
    for (int32_t i = first_visible_block(g, n * bs); i < n; ++i) {
      const BlockId b = found[static_cast<size_t>(g)][i];
      if (b == kNullBlock) continue;
      pool_.acquire(b);
      blocks[static_cast<size_t>(g)][i] = b;
    }
  }
  // Then the fresh ones, in chain order: each is committed as if computed.
  std::vector<BlockId> fresh;
  for (int32_t i = 0; i < n; ++i) {
    const uint64_t parent = i == 0 ? root_prefix_id(cache_key) : pool_.prefix_id(blocks[0][i - 1]);
    for (int g = 0; g < num_groups(); ++g) {
      auto& row = blocks[static_cast<size_t>(g)];
      if (row[i] != kNullBlock || (g > 0 && i < first_visible_block(g, n * bs))) continue;
      fresh.clear();
      const bool ok = pool_.allocate(1, config_.allocation_policy, i > 0 ? row[i - 1] : kNullBlock, fresh);
      PAGELLM_CHECK(ok, "import_prefix: no block available after counting them");
      row[i] = fresh[0];
      const bool registered =
          pool_.commit_full_block(row[i], g == 0 ? hashes[i] : group_hash(hashes[i], g), parent, chunk_of(i));
      if (registered && g == 0)
        pool_.stored(row[i], i > 0 ? std::optional<BlockHash>(hashes[i - 1]) : std::nullopt, cache_key);
      out.fills.push_back({g, i, row[i]});
    }
  }
  imported_blocks_ += static_cast<int64_t>(out.fills.size());
  // The pin releases tail first: the prefix's head is evicted last.
  std::vector<BlockId> held;
  for (int32_t i = 0; i < n; ++i)
    for (const auto& row : blocks)
      if (row[i] != kNullBlock) held.push_back(row[i]);
  pinned_blocks_ += static_cast<int32_t>(held.size());
  out.pin = next_pin_++;
  pins_.emplace(out.pin, std::move(held));
  return out;
}

void KVCacheManager::unpin(int32_t pin) {
  const auto it = pins_.find(pin);
  if (it == pins_.end()) return;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) pool_.release(*b);
  pinned_blocks_ -= static_cast<int32_t>(it->second.size());
  pins_.erase(it);
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
  for (int g = 0; g < num_groups(); ++g) {
    auto& table = s.tables[static_cast<size_t>(g)];
    while (static_cast<int32_t>(table.size()) > keep) {
      if (table.back() != kNullBlock) pool_.release(table.back());
      table.pop_back();
    }
    if (g > 0) s.dropped[static_cast<size_t>(g)] = std::min(s.dropped[static_cast<size_t>(g)], keep);
  }
  s.num_tokens = num_tokens;
}

int32_t KVCacheManager::evict(SeqId seq, int32_t first_block, int32_t end_block) {
  auto it = seqs_.find(seq);
  PAGELLM_CHECK(it != seqs_.end(), "evict: sequence {} has no KV blocks", seq);
  PAGELLM_CHECK(num_groups() == 1, "evict(seq {}): sliding KV eviction with {} KV-cache groups", seq, num_groups());
  SeqBlocks& s = it->second;
  auto& blocks = s.tables[0];
  PAGELLM_CHECK(first_block >= 0 && end_block <= static_cast<int32_t>(blocks.size()),
                "evict(seq {}): blocks [{}, {}) outside a table of {}", seq, first_block, end_block, blocks.size());
  if (end_block <= std::max(first_block, s.evicted_end)) return 0;
  PAGELLM_CHECK(s.evicted_end == 0 || s.evicted_begin == first_block,
                "evict(seq {}): the evicted range starts at block {}, not {}", seq, s.evicted_begin, first_block);
  int32_t released = 0;
  for (int32_t i = std::max(first_block, s.evicted_end); i < end_block; ++i) {
    pool_.release(blocks[i]);
    blocks[i] = kNullBlock;
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
  PAGELLM_CHECK(!has_state() || !free_state_slots_.empty(), "fork: no free state slot for sequence {}", child);
  SeqBlocks copy = it->second;
  for (const auto& table : copy.tables)
    for (BlockId b : table)
      if (b != kNullBlock) pool_.acquire(b);
  if (has_state()) {
    copy.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
    state_copies_.push_back({it->second.state_slot, copy.state_slot});
  }
  seqs_.emplace(child, std::move(copy));
}

void KVCacheManager::free(SeqId seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (const auto& table : it->second.tables)
    for (auto b = table.rbegin(); b != table.rend(); ++b)
      if (*b != kNullBlock) pool_.release(*b);  // evicted or dropped ones are gone already
  if (it->second.state_slot >= 0) {
    const int32_t slot = it->second.state_slot;
    free_state_slots_.push_back(slot);
    // A fork's copy or a restore not yet done has nowhere to go.
    std::erase_if(state_copies_, [&](const BlockCopy& c) {
      return c.dst == slot || c.dst == config_.num_state_slots + slot;
    });
  }
  seqs_.erase(it);
}

std::span<const BlockId> KVCacheManager::block_table(SeqId seq, int group) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  PAGELLM_CHECK(group >= 0 && group < num_groups(), "KV-cache group {} of {}", group, num_groups());
  return it->second.tables[static_cast<size_t>(group)];
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
  st.groups = groups_;
  st.group_used_blocks.assign(groups_.size(), 0);
  st.state_slots = config_.num_state_slots;
  st.used_state_slots = config_.num_state_slots - num_free_state_slots();
  if (st.used_blocks > 0) {
    // A shared block holds as many tokens as its fullest holder put there.
    const int32_t bs = st.block_size;
    std::vector<int32_t> filled(static_cast<size_t>(pool_.num_blocks()), -1);
    for (const auto& [id, s] : seqs_) {
      for (size_t g = 0; g < s.tables.size(); ++g) {
        const auto& blocks = s.tables[g];
        for (size_t i = 0; i < blocks.size(); ++i) {
          if (blocks[i] == kNullBlock) continue;  // evicted or out of the window
          const int64_t in_block = std::clamp<int64_t>(s.num_tokens - int64_t(i) * bs, 0, bs);
          int32_t& f = filled[blocks[i]];
          if (f < 0) ++st.group_used_blocks[g];
          f = std::max(f, static_cast<int32_t>(in_block));
        }
      }
    }
    // A pinned prefix's blocks (the offload tier's, for a waiting sequence) are full.
    for (const auto& [pin, blocks] : pins_)
      for (BlockId b : blocks) filled[b] = bs;
    int64_t held = 0;
    for (int32_t f : filled) held += std::max(f, 0);
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
    PAGELLM_CHECK(s.tables.size() == groups_.size() && s.dropped.size() == groups_.size(),
                  "sequence {} has {} block tables for {} groups", id, s.tables.size(), groups_.size());
    for (size_t g = 0; g < s.tables.size(); ++g) {
      const auto& blocks = s.tables[g];
      PAGELLM_CHECK(static_cast<int32_t>(blocks.size()) == blocks_for_tokens(s.num_tokens, bs),
                    "sequence {} has {} blocks in group {} for {} tokens", id, blocks.size(), g, s.num_tokens);
      PAGELLM_CHECK(s.hashes.size() <= blocks.size(), "sequence {} has {} committed hashes for {} blocks", id,
                    s.hashes.size(), blocks.size());
      for (size_t i = 0; i < blocks.size(); ++i) {
        const BlockId b = blocks[i];
        const auto at = static_cast<int32_t>(i);
        const bool gone = g == 0 ? at >= s.evicted_begin && at < s.evicted_end : at < s.dropped[g];
        PAGELLM_CHECK(gone == (b == kNullBlock), "sequence {} group {} block {} is {} but {} the released range", id,
                      g, i, b == kNullBlock ? "null" : "held", gone ? "inside" : "outside");
        if (gone) continue;
        PAGELLM_CHECK(b > kNullBlock && b < pool_.num_blocks(), "sequence {} holds invalid block {}", id, b);
        PAGELLM_CHECK(!(held[b] && last_holder[b] == id), "sequence {} holds block {} twice", id, b);
        held[b] = 1;
        last_holder[b] = id;
        ++refs[b];
        if (i < s.hashes.size()) {
          PAGELLM_CHECK(g > 0 || pool_.prefix_id(b) != 0, "sequence {} block {} is committed without a prefix id",
                        id, b);
          const auto h = pool_.registered_hash(b);
          PAGELLM_CHECK(!h || *h == group_hash(s.hashes[i], static_cast<int>(g)),
                        "sequence {} group {} block {} is registered under another hash", id, g, b);
        }
      }
    }
  }
  for (const auto& [pin, held] : pins_)
    for (BlockId b : held) {
      PAGELLM_CHECK(b > kNullBlock && b < pool_.num_blocks(), "pin {} holds invalid block {}", pin, b);
      ++refs[b];
    }
  std::vector<int32_t> slot_owners(static_cast<size_t>(config_.num_state_slots), 0);
  for (int32_t slot : free_state_slots_) {
    PAGELLM_CHECK(slot >= 0 && slot < config_.num_state_slots, "free state slot {} of {}", slot,
                  config_.num_state_slots);
    ++slot_owners[slot];
  }
  for (const auto& [id, s] : seqs_) {
    PAGELLM_CHECK(has_state() == (s.state_slot >= 0) && s.state_slot < config_.num_state_slots,
                  "sequence {} has state slot {} of {}", id, s.state_slot, config_.num_state_slots);
    if (s.state_slot >= 0) ++slot_owners[s.state_slot];
  }
  for (size_t i = 0; i < slot_owners.size(); ++i)
    PAGELLM_CHECK(slot_owners[i] == 1, "state slot {} is free or held {} times", i, slot_owners[i]);
  for (BlockId b = 1; b < pool_.num_blocks(); ++b) {
    PAGELLM_CHECK(pool_.ref_count(b) == refs[b],
                  "block {} has ref count {} but {} block tables hold it", b, pool_.ref_count(b),
                  refs[b]);
  }
}

}  // namespace pagellm
