// KVCacheManager: per-sequence block tables over one BlockPool, prefix-cache
// lookup, copy-on-write for forked sequences, and the statistics the engine
// reports. Pure bookkeeping: no tensors; the runner owns the memory.
//
// Per sequence it keeps one block table per KV-cache group (block i holds
// token positions [i*block_size, (i+1)*block_size) of that group's layers),
// the chain hashes of its committed full blocks, and how many token slots
// the tables were sized for. Group 0 is full attention. A sliding-window
// group holds only the blocks its window can still see: blocks that fall out
// of it go back to the pool (kNullBlock in the table), so a long sequence
// holds window-sized tables there. Every group's blocks come from one pool.
//
// Models with linear-attention layers (Gated DeltaNet) also give each
// sequence one state slot from a separate, fixed set (the backend holds a
// fixed-size state per slot, not per token). A state is not per block, so
// it cannot be found again from a token prefix: prefix caching is off for
// such models, and a sequence that loses its slot recomputes from token 0.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/kv_layout.h"
#include "kv/block_pool.h"
#include "kv/kv_types.h"

namespace pagellm {

struct KVCacheConfig {
  int32_t num_blocks = 0;  // including the reserved null block 0
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
  AllocationPolicy allocation_policy = AllocationPolicy::Any;
  // KV-cache groups (core/kv_layout.h); empty: one full-attention group.
  std::vector<KvGroup> groups;
  // Linear-attention layers: sequences that can hold a state at once (0: the
  // model has none). Needs enable_prefix_caching off.
  int32_t num_state_slots = 0;
  // Speculative decoding over such a model: slot s has a snapshot slot
  // num_state_slots + s (the backend holds twice the slots), where the
  // state before a verification waits in case a draft is rejected.
  bool state_snapshots = false;
  // The backend's slot of this pool's slot 0: pipeline virtual engines each
  // own a range of one backend's slots (block ids are shifted likewise, by
  // the runner).
  int32_t state_slot_base = 0;
  // Keep a list of the blocks commit_computed registers (take_committed):
  // the KV offload tier copies them out.
  bool record_commits = false;
};

// A full block just committed under its hash (KVCacheConfig::record_commits).
struct CommittedBlock {
  SeqId seq = 0;
  int group = 0;
  int32_t index = 0;  // the block's place in the sequence
  BlockId block = kNullBlock;
};

// A prefix brought into the pool from outside it (the KV offload tier), so
// that the next match_prefix finds it as cached blocks.
struct PrefixImport {
  int32_t num_blocks = 0;  // group 0's blocks of the prefix now in the pool, from block 0
  // Fresh blocks registered as computed: the caller fills each with its
  // contents before the next forward pass (nothing reads them before).
  struct Fill {
    int group = 0;
    int32_t index = 0;
    BlockId block = kNullBlock;
  };
  std::vector<Fill> fills;
  int32_t pin = -1;  // every block of the prefix is held until unpin(pin); -1: none
};

// Leading full blocks of a token sequence already present in the cache.
struct PrefixMatch {
  std::vector<BlockId> blocks;    // group 0's
  std::vector<BlockHash> hashes;  // chain hash of each matched block
  // Groups 1..: a sliding group's blocks, kNullBlock before its window.
  std::vector<std::vector<BlockId>> group_blocks;
  int32_t num_tokens = 0;         // blocks.size() * block_size
  int32_t num_query_tokens = 0;   // tokens looked up (hit-rate denominator)
};

// A successful allocate_slots: the copies the runner does before the forward pass.
struct SlotAllocation {
  int32_t num_new_blocks = 0;        // fresh blocks appended to the table
  std::vector<BlockCopy> copies;     // copy-on-write (usually none)
};

struct KVCacheStats {
  int32_t block_size = 0;
  int32_t total_blocks = 0;   // usable blocks (block 0 excluded)
  int32_t used_blocks = 0;
  int32_t cached_blocks = 0;  // free but holding reusable prefix contents
  int32_t free_blocks = 0;
  // Prefix cache, in tokens, counted once per admission (a new sequence or a
  // preempted one resuming): queries = tokens looked up, hits = tokens found.
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t evictions = 0;      // cached blocks reused for new contents
  int64_t following_allocations = 0, contiguous_allocations = 0;  // see BlockPool
  // Token slots in used blocks that hold no token (computed or being computed
  // this step) / all token slots in used blocks; 0 when nothing is used.
  double fragmentation = 0.0;
  // Per KV-cache group: blocks its tables hold (a block shared by several
  // sequences counts once).
  std::vector<KvGroup> groups;
  std::vector<int32_t> group_used_blocks;
  int32_t state_slots = 0, used_state_slots = 0;  // linear-attention states

  double usage() const { return total_blocks ? double(used_blocks) / total_blocks : 0.0; }
  double prefix_hit_rate() const {
    return prefix_query_tokens ? double(prefix_hit_tokens) / prefix_query_tokens : 0.0;
  }
};

// The recent tokens a sliding window keeps besides its sink blocks, in whole
// blocks: max_kv_tokens of KV in all (KVCacheManager::slide_window).
int32_t sliding_window_tokens(int32_t sink_tokens, int32_t max_kv_tokens, int32_t block_size);

class KVCacheManager {
 public:
  // Throws Error for a bad block size or fewer than 2 blocks.
  explicit KVCacheManager(const KVCacheConfig& config);

  // The longest run of leading full blocks of `tokens` found in the cache,
  // always leaving at least the last token to compute (so there are logits to
  // sample). Empty when prefix caching is off. No side effects: pass the
  // result to allocate_slots in the same scheduling pass to take the blocks.
  // `cache_key` keeps prefixes apart that equal tokens do not make equal K/V
  // (each LoRA adapter's: Sequence::lora_id); 0: the base model's.
  PrefixMatch match_prefix(std::span<const TokenId> tokens, uint64_t cache_key = 0) const;

  // Make room for tokens [num_computed_tokens, num_computed_tokens +
  // num_new_tokens) of sequence `seq`. With `prefix` (a sequence with no blocks
  // yet), its blocks come first and num_computed_tokens must equal
  // prefix->num_tokens. Blocks about to be written that are shared with another
  // sequence are replaced by fresh copies (returned as copies). Transactional:
  // nullopt means not enough blocks, and nothing changed, except that blocks
  // no query from num_computed_tokens on can see (sliding groups) are
  // released first either way.
  [[nodiscard]] std::optional<SlotAllocation> allocate_slots(SeqId seq, int32_t num_computed_tokens,
                                                             int32_t num_new_tokens,
                                                             const PrefixMatch* prefix = nullptr);

  // Tokens up to num_computed_tokens now have their K/V in the cache: hash and
  // register the blocks that became full. `tokens` is the sequence's token ids
  // (at least num_computed_tokens of them).
  void commit_computed(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed_tokens,
                       uint64_t cache_key = 0);

  // Rejected speculative tokens: the sequence keeps the blocks that hold its
  // first num_tokens token slots and releases the rest, tail first (their
  // contents were never committed). num_tokens must cover the committed
  // blocks; a table already that short is left alone.
  void truncate(SeqId seq, int32_t num_tokens);

  // Sliding eviction: the blocks [first_block, end_block) of the sequence go
  // back to the pool (full ones stay cached) and its table holds kNullBlock
  // there. Blocks already evicted are skipped; the evicted range only grows,
  // from the same first_block. Returns how many blocks were released.
  int32_t evict(SeqId seq, int32_t first_block, int32_t end_block);
  // The end of the sequence's evicted block range (0: none evicted).
  int32_t evicted_end(SeqId seq) const;
  // The sliding window (StreamingLLM) over the sequence's first end_tokens
  // tokens: it keeps the blocks of its first sink_tokens tokens and its most
  // recent sliding_window_tokens(...) tokens, max_kv_tokens in all, and
  // evicts the blocks in between that its table already has. Returns how many
  // blocks were released.
  int32_t slide_window(SeqId seq, int32_t sink_tokens, int32_t max_kv_tokens, int32_t end_tokens);

  // A swapped-out sequence comes back with num_tokens computed tokens: fresh
  // blocks for what it holds (blocks_held(num_tokens) in all, kNullBlock where
  // a sliding group's window no longer reaches). nullopt, with nothing
  // changed, when too few blocks are available. The caller fills them.
  [[nodiscard]] std::optional<SlotAllocation> allocate_restored(SeqId seq, int32_t num_tokens);

  // `child` shares all of `parent`'s blocks (parallel sampling, n > 1). With
  // state slots, the child takes a free one, and the parent's state must be
  // copied there (take_state_copies) before the child's next step; throws
  // Error when no slot is free (callers check num_free_state_slots).
  void fork(SeqId parent, SeqId child);

  // Drop the sequence's blocks, tail first, so its full blocks are cached with
  // the head most recently used (evicted last). No-op for an unknown sequence.
  void free(SeqId seq);

  bool has_seq(SeqId seq) const { return seqs_.count(seq) != 0; }

  // ---- KV events (kv/kv_events.h): off by default. Turning them on records
  // an AllBlocksCleared first (what was stored before was never announced).
  // Group 0's blocks are announced: a prefix is findable when they are.
  void set_record_events(bool on);
  std::vector<KvEvent> take_events() { return pool_.take_events(); }

  // ---- the KV offload tier
  // The blocks committed since the last call (record_commits), in order.
  std::vector<CommittedBlock> take_committed() { return std::exchange(committed_, {}); }
  void set_record_commits(bool on) { config_.record_commits = on; }
  // Brings the longest prefix of `tokens` (at most max_blocks full blocks,
  // and never the last token) into the pool that the pool's own blocks and
  // the blocks the caller holds (supplied(group, index)) make up: the pool's
  // are used as they are, the caller's get fresh blocks (at most max_fresh),
  // registered under their chain hashes. A sliding group needs the blocks its
  // window sees from the prefix's end, as match_prefix does. All of them are
  // held (pinned) until unpin, so that a waiting sequence finds them. Empty
  // when prefix caching is off or nothing fits.
  PrefixImport import_prefix(std::span<const TokenId> tokens, uint64_t cache_key, int32_t max_blocks,
                             const std::function<bool(int group, int32_t index)>& supplied, int32_t max_fresh);
  // Releases a pin's blocks (tail first; committed ones stay cached). No-op for -1.
  void unpin(int32_t pin);
  int32_t num_pinned_blocks() const { return pinned_blocks_; }
  int64_t imported_blocks() const { return imported_blocks_; }

  // ---- linear-attention state slots
  bool has_state() const { return config_.num_state_slots > 0; }
  // The sequence's backend slot (state_slot_base on), -1 without one.
  int32_t state_slot(SeqId seq) const;
  int32_t num_state_slots() const { return config_.num_state_slots; }
  int32_t num_free_state_slots() const { return static_cast<int32_t>(free_state_slots_.size()); }
  // Slots the backend holds: twice num_state_slots with snapshots.
  int32_t num_backend_state_slots() const {
    return config_.num_state_slots * (config_.state_snapshots ? 2 : 1);
  }
  // Queue a copy of the sequence's state into its snapshot slot (before a
  // step that verifies drafts), or back from it (after one that rejected
  // some: the state went past the accepted tokens and must be recomputed
  // from there). Needs state_snapshots.
  void snapshot_state(SeqId seq);
  void restore_state(SeqId seq);
  // (src slot, dst slot) of the forks, snapshots and restores since the last
  // call, in the order they were asked for (backend slots).
  std::vector<BlockCopy> take_state_copies();
  // Block ids of the sequence in a group (empty when it has none). The span
  // stays valid until the sequence's next allocate_slots / free.
  std::span<const BlockId> block_table(SeqId seq, int group = 0) const;

  // ---- groups
  int num_groups() const { return static_cast<int>(groups_.size()); }
  const KvGroup& group(int g) const { return groups_[static_cast<size_t>(g)]; }
  // The first block of group g that a query at position num_computed_tokens
  // (or later) can see: 0 for full attention.
  int32_t first_visible_block(int g, int32_t num_computed_tokens) const;
  // Blocks a sequence holds, all groups together, once its first num_tokens
  // tokens are computed and nothing else is.
  int32_t blocks_held(int32_t num_tokens) const;
  // Blocks a step computing [num_computed_tokens, + num_new_tokens) has the
  // sequence hold, all groups together.
  int32_t blocks_for_step(int32_t num_computed_tokens, int32_t num_new_tokens) const;
  // The most blocks one sequence of up to max_len tokens ever holds when each
  // step computes at most step_tokens of its tokens.
  int32_t max_blocks_per_seq(int32_t max_len, int32_t step_tokens) const;
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }

  int32_t block_size() const { return pool_.block_size(); }
  int32_t num_usable_blocks() const { return pool_.num_usable_blocks(); }
  int32_t num_available_blocks() const { return pool_.num_available_blocks(); }
  bool prefix_caching() const { return config_.enable_prefix_caching; }
  const BlockPool& pool() const { return pool_; }
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  // O(blocks in use) for the fragmentation figure; call per step, not per token.
  KVCacheStats stats() const;

  // Pool invariants plus: every block's ref count equals the number of block
  // tables holding it; no table holds block 0 or one block twice; tables are
  // sized for their tokens; committed hashes agree with the pool. Throws Error.
  void check_invariants() const;

 private:
  struct SeqBlocks {
    std::vector<std::vector<BlockId>> tables;  // [group]
    std::vector<BlockHash> hashes;  // [num committed full blocks]
    int32_t num_tokens = 0;         // token slots the tables were sized for
    // Group 0 (sliding KV eviction): blocks [evicted_begin, evicted_end) are kNullBlock.
    int32_t evicted_begin = 0, evicted_end = 0;
    // Sliding groups: tables[g][0, dropped[g]) are kNullBlock (out of the window).
    std::vector<int32_t> dropped;  // [group]
    int32_t state_slot = -1;       // linear-attention state (has_state())
  };

  SeqBlocks& new_seq(SeqId seq);
  // Releases the blocks of sliding groups that no query from
  // num_computed_tokens on can see.
  void drop_invisible(SeqBlocks& s, int32_t num_computed_tokens);
  // The hash a group's block is registered under (group 0: the chain hash).
  static BlockHash group_hash(BlockHash h, int g);

  KVCacheConfig config_;
  std::vector<KvGroup> groups_;
  BlockPool pool_;
  std::unordered_map<SeqId, SeqBlocks> seqs_;
  std::vector<int32_t> free_state_slots_;  // a stack: the lowest slot on top
  std::vector<BlockCopy> state_copies_;
  std::vector<CommittedBlock> committed_;
  std::unordered_map<int32_t, std::vector<BlockId>> pins_;
  int32_t next_pin_ = 0, pinned_blocks_ = 0;
  int64_t imported_blocks_ = 0;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace pagellm
