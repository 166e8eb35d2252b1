// BlockPool: the fixed array of KV blocks and who holds them.
//
// Every usable block (1 .. num_blocks-1; block 0 is the reserved null block)
// is in exactly one state:
//   used    ref_count > 0, held by one or more sequences' block tables;
//   cached  ref_count == 0 but still holding a full block's contents under a
//           registered hash; kept in LRU order (least recently freed first)
//           and evicted only when a fresh block is needed;
//   free    ref_count == 0, no contents worth keeping.
// used + cached + free == num_blocks - 1 (block 0 is counted in none).
//
// Prefix identity. A registered block stores its token ids, and every
// committed full block carries a `prefix id`: a number that stands for the
// exact token prefix ending with that block. A new id is minted whenever a
// block's prefix is not verifiably equal to an existing one, so equal ids
// always mean equal prefixes. A lookup accepts a candidate only when its
// tokens match and its parent's prefix id is the id of the block matched just
// before, so a 64-bit hash collision can cost a miss, never a wrong block.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/kv_events.h"
#include "kv/kv_types.h"

namespace pagellm {

class BlockPool {
 public:
  // num_blocks includes the null block 0, so at least 2. block_size is 8,
  // 16, 32 or 64 tokens.
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_usable_blocks() const { return num_blocks_ - 1; }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return free_.size; }
  int32_t num_cached_blocks() const { return cached_.size; }
  int32_t num_used_blocks() const { return num_usable_blocks() - free_.size - cached_.size; }
  // What allocate() can hand out: free blocks, then cached ones by eviction.
  int32_t num_available_blocks() const { return free_.size + cached_.size; }
  int64_t num_evictions() const { return num_evictions_; }
  // Blocks handed out right after a predecessor (a sequence growing), and how
  // many of them were the predecessor's neighbour (id + 1): the contiguous
  // placement's hit rate.
  int64_t num_following_allocations() const { return following_allocations_; }
  int64_t num_contiguous_allocations() const { return contiguous_allocations_; }
  // Runs of consecutive available (free or cached) block ids: run length ->
  // how many runs. O(blocks); for reports, not per step.
  std::vector<std::pair<int32_t, int32_t>> available_runs() const;

  int32_t ref_count(BlockId b) const;
  bool is_cached_free(BlockId b) const;
  // True when the block is the one registered under its hash (findable).
  bool is_registered(BlockId b) const;
  std::optional<BlockHash> registered_hash(BlockId b) const;
  // 0 until the block is committed as a full block.
  uint64_t prefix_id(BlockId b) const;

  // Appends n fresh blocks (ref_count 1) to `out`, evicting least recently
  // used cached blocks when the free list runs dry. `after` is the block the
  // new ones follow in a sequence (kNullBlock for none); Contiguous tries
  // after+1, after+2, ... or else a free run. Returns false and changes
  // nothing when fewer than n blocks are available.
  [[nodiscard]] bool allocate(int32_t n, AllocationPolicy policy, BlockId after,
                              std::vector<BlockId>& out);
  // One more holder of a used block, or revive a cached block (ref 1).
  void acquire(BlockId b);
  // One holder fewer; at zero the block becomes cached (registered) at the
  // MRU end, or free.
  void release(BlockId b);

  // Prefix cache. The registered block with chain hash `hash` whose parent
  // prefix id is `parent_prefix_id` (0 for a sequence's first block) and
  // whose tokens equal `tokens`; kNullBlock when there is none.
  BlockId find_cached(BlockHash hash, uint64_t parent_prefix_id,
                      std::span<const TokenId> tokens) const;
  // A used block has just become full of computed tokens: give it its
  // prefix id and register it under `hash` unless another block already
  // holds that hash. Idempotent for an already committed block. Returns true
  // when the block got registered now.
  bool commit_full_block(BlockId b, BlockHash hash, uint64_t parent_prefix_id,
                         std::span<const TokenId> tokens);

  // KV events (kv/kv_events.h), off by default. While on, stored() records a
  // BlockStored for a block just registered (a chain continuing the previous
  // event's joins it) and the block's end as a registered block records a
  // BlockRemoved; take_events hands them over.
  void set_record_events(bool on) { record_events_ = on; }
  bool recording_events() const { return record_events_; }
  void stored(BlockId b, std::optional<BlockHash> parent_hash, uint64_t lora_id);
  std::vector<KvEvent> take_events() { return std::exchange(events_, {}); }
  // An AllBlocksCleared: what was announced before no longer counts.
  void record_cleared();

  // Inspection for tests and debugging.
  std::vector<BlockId> free_list_order() const;   // allocation order
  std::vector<BlockId> cached_lru_order() const;  // eviction order (LRU first)
  // Throws Error naming the first broken invariant.
  void check_invariants() const;

 private:
  enum class State : uint8_t { Null, Used, Free, Cached };
  struct List {
    BlockId head = -1;
    BlockId tail = -1;
    int32_t size = 0;
  };

  void check_block(BlockId b) const;
  void push_back(List& list, BlockId b);
  void unlink(List& list, BlockId b);
  BlockId take_fresh(AllocationPolicy policy, BlockId prev, int32_t remaining);
  BlockId find_run_start(int32_t wanted) const;
  void claim(BlockId b);  // a free/cached block becomes used, ref 1, contents forgotten
  void forget_contents(BlockId b);
  void walk_list(const List& list, State state, const char* name) const;

  int32_t num_blocks_;
  int64_t following_allocations_ = 0, contiguous_allocations_ = 0;
  int32_t block_size_;
  List free_;
  List cached_;
  int64_t num_evictions_ = 0;
  uint64_t next_prefix_id_ = 1;

  std::vector<State> state_;               // [num_blocks]
  std::vector<int32_t> ref_;               // [num_blocks]
  std::vector<BlockId> prev_, next_;       // [num_blocks] links of free_ / cached_
  std::vector<uint8_t> registered_;        // [num_blocks] in map_ under hash_
  std::vector<BlockHash> hash_;            // [num_blocks] valid when registered
  std::vector<uint64_t> prefix_id_;        // [num_blocks] 0: not committed
  std::vector<uint64_t> parent_prefix_id_; // [num_blocks] valid when registered
  std::vector<TokenId> tokens_;            // [num_blocks, block_size] valid when registered
  std::unordered_map<BlockHash, BlockId> map_;

  bool record_events_ = false;
  std::vector<uint8_t> announced_;  // [num_blocks] a BlockStored went out for it (while recording)
  std::vector<KvEvent> events_;
};

}  // namespace pagellm
