#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"

namespace pagellm {
namespace {

// How many free-list entries Contiguous inspects when it looks for a run;
// bounds the cost of a placement to O(kRunSearchLimit * blocks wanted).
constexpr int32_t kRunSearchLimit = 16;

bool valid_block_size(int32_t bs) { return bs == 8 || bs == 16 || bs == 32 || bs == 64; }

}  // namespace

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  PAGELLM_CHECK(valid_block_size(block_size), "KV block size {} is not one of 8, 16, 32, 64",
                block_size);
  PAGELLM_CHECK(num_blocks >= 2, "KV cache needs at least 2 blocks (block 0 is reserved), got {}",
                num_blocks);
  const size_t n = static_cast<size_t>(num_blocks);
  state_.assign(n, State::Free);
  ref_.assign(n, 0);
  prev_.assign(n, -1);
  next_.assign(n, -1);
  registered_.assign(n, 0);
  hash_.assign(n, 0);
  prefix_id_.assign(n, 0);
  parent_prefix_id_.assign(n, 0);
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
  announced_.assign(n, 0);
  state_[kNullBlock] = State::Null;
  for (BlockId b = 1; b < num_blocks; ++b) push_back(free_, b);
}

void BlockPool::check_block(BlockId b) const {
  PAGELLM_CHECK(b > kNullBlock && b < num_blocks_, "block id {} out of range [1, {})", b,
                num_blocks_);
}

int32_t BlockPool::ref_count(BlockId b) const {
  check_block(b);
  return ref_[b];
}

bool BlockPool::is_cached_free(BlockId b) const {
  check_block(b);
  return state_[b] == State::Cached;
}

bool BlockPool::is_registered(BlockId b) const {
  check_block(b);
  return registered_[b] != 0;
}

std::optional<BlockHash> BlockPool::registered_hash(BlockId b) const {
  check_block(b);
  if (!registered_[b]) return std::nullopt;
  return hash_[b];
}

uint64_t BlockPool::prefix_id(BlockId b) const {
  check_block(b);
  return prefix_id_[b];
}

void BlockPool::push_back(List& list, BlockId b) {
  prev_[b] = list.tail;
  next_[b] = -1;
  if (list.tail >= 0) {
    next_[list.tail] = b;
  } else {
    list.head = b;
  }
  list.tail = b;
  ++list.size;
}

void BlockPool::unlink(List& list, BlockId b) {
  const BlockId p = prev_[b], n = next_[b];
  if (p >= 0) {
    next_[p] = n;
  } else {
    list.head = n;
  }
  if (n >= 0) {
    prev_[n] = p;
  } else {
    list.tail = p;
  }
  prev_[b] = next_[b] = -1;
  --list.size;
}

void BlockPool::forget_contents(BlockId b) {
  if (registered_[b]) {
    map_.erase(hash_[b]);
    registered_[b] = 0;
  }
  if (announced_[b]) {
    announced_[b] = 0;
    if (record_events_) {
      if (events_.empty() || events_.back().type != KvEventType::BlockRemoved)
        events_.push_back(kv_event(KvEventType::BlockRemoved));
      events_.back().block_hashes.push_back(hash_[b]);
    }
  }
  hash_[b] = 0;
  prefix_id_[b] = 0;
  parent_prefix_id_[b] = 0;
}

void BlockPool::claim(BlockId b) {
  if (state_[b] == State::Free) {
    unlink(free_, b);
  } else {
    unlink(cached_, b);
    ++num_evictions_;
  }
  forget_contents(b);
  state_[b] = State::Used;
  ref_[b] = 1;
}

BlockId BlockPool::find_run_start(int32_t wanted) const {
  BlockId best = free_.head;
  int32_t best_len = 0;
  BlockId c = free_.head;
  for (int32_t seen = 0; c >= 0 && seen < kRunSearchLimit; ++seen, c = next_[c]) {
    int32_t len = 0;
    while (len < wanted && c + len < num_blocks_ && state_[c + len] == State::Free) ++len;
    if (len > best_len) {
      best = c;
      best_len = len;
      if (len == wanted) break;
    }
  }
  return best;
}

BlockId BlockPool::take_fresh(AllocationPolicy policy, BlockId prev, int32_t remaining) {
  BlockId b = -1;
  if (free_.size > 0) {
    if (policy == AllocationPolicy::Contiguous) {
      const BlockId next = prev + 1;
      if (prev > kNullBlock && next < num_blocks_ && state_[next] == State::Free) {
        b = next;
      } else {
        b = find_run_start(remaining);
      }
    } else {
      b = free_.head;
    }
  } else {
    b = cached_.head;  // least recently freed
  }
  claim(b);
  return b;
}

bool BlockPool::allocate(int32_t n, AllocationPolicy policy, BlockId after,
                         std::vector<BlockId>& out) {
  PAGELLM_CHECK(n >= 0, "cannot allocate {} blocks", n);
  if (n > num_available_blocks()) return false;
  BlockId prev = after;
  for (int32_t i = 0; i < n; ++i) {
    const BlockId b = take_fresh(policy, prev, n - i);
    if (prev > kNullBlock) {
      ++following_allocations_;
      contiguous_allocations_ += b == prev + 1;
    }
    prev = b;
    out.push_back(b);
  }
  return true;
}

std::vector<std::pair<int32_t, int32_t>> BlockPool::available_runs() const {
  std::map<int32_t, int32_t> runs;
  int32_t len = 0;
  for (BlockId b = 1; b <= num_blocks_; ++b) {
    if (b < num_blocks_ && (state_[b] == State::Free || state_[b] == State::Cached)) {
      ++len;
    } else if (len > 0) {
      ++runs[len];
      len = 0;
    }
  }
  return {runs.begin(), runs.end()};
}

void BlockPool::acquire(BlockId b) {
  check_block(b);
  switch (state_[b]) {
    case State::Used:
      ++ref_[b];
      return;
    case State::Cached:
      unlink(cached_, b);
      state_[b] = State::Used;
      ref_[b] = 1;
      return;
    default:
      fail("cannot acquire block {}: it is free (no contents to share)", b);
  }
}

void BlockPool::release(BlockId b) {
  check_block(b);
  PAGELLM_CHECK(state_[b] == State::Used && ref_[b] > 0, "release of block {} which is not in use",
                b);
  if (--ref_[b] > 0) return;
  if (registered_[b]) {
    state_[b] = State::Cached;
    push_back(cached_, b);
  } else {
    forget_contents(b);
    state_[b] = State::Free;
    push_back(free_, b);
  }
}

BlockId BlockPool::find_cached(BlockHash hash, uint64_t parent_prefix_id,
                               std::span<const TokenId> tokens) const {
  PAGELLM_CHECK(static_cast<int32_t>(tokens.size()) == block_size_,
                "prefix lookup with {} tokens, block size is {}", tokens.size(), block_size_);
  const auto it = map_.find(hash);
  if (it == map_.end()) return kNullBlock;
  const BlockId b = it->second;
  if (parent_prefix_id_[b] != parent_prefix_id) return kNullBlock;
  const TokenId* stored = &tokens_[static_cast<size_t>(b) * block_size_];
  if (std::memcmp(stored, tokens.data(), tokens.size_bytes()) != 0) return kNullBlock;
  return b;
}

bool BlockPool::commit_full_block(BlockId b, BlockHash hash, uint64_t parent_prefix_id,
                                  std::span<const TokenId> tokens) {
  check_block(b);
  PAGELLM_CHECK(state_[b] == State::Used, "commit of block {} which is not in use", b);
  PAGELLM_CHECK(static_cast<int32_t>(tokens.size()) == block_size_,
                "commit of block {} with {} tokens, block size is {}", b, tokens.size(),
                block_size_);
  if (prefix_id_[b] != 0) return false;  // shared block committed by another holder
  const auto it = map_.find(hash);
  if (it != map_.end()) {
    // Same hash held by another block: a duplicate computed concurrently
    // (same prefix: share its identity) or a collision (new identity). The
    // block stays unregistered either way; the registered one keeps serving.
    const BlockId other = it->second;
    const TokenId* stored = &tokens_[static_cast<size_t>(other) * block_size_];
    const bool same = parent_prefix_id_[other] == parent_prefix_id &&
                      std::memcmp(stored, tokens.data(), tokens.size_bytes()) == 0;
    prefix_id_[b] = same ? prefix_id_[other] : next_prefix_id_++;
    return false;
  }
  map_.emplace(hash, b);
  registered_[b] = 1;
  hash_[b] = hash;
  prefix_id_[b] = next_prefix_id_++;
  parent_prefix_id_[b] = parent_prefix_id;
  std::memcpy(&tokens_[static_cast<size_t>(b) * block_size_], tokens.data(), tokens.size_bytes());
  return true;
}

void BlockPool::record_cleared() {
  std::fill(announced_.begin(), announced_.end(), 0);
  if (record_events_) events_.push_back(kv_event(KvEventType::AllBlocksCleared));
}

void BlockPool::stored(BlockId b, std::optional<BlockHash> parent_hash, uint64_t lora_id) {
  check_block(b);
  if (!record_events_ || !registered_[b] || announced_[b]) return;
  announced_[b] = 1;
  const TokenId* t = &tokens_[static_cast<size_t>(b) * block_size_];
  // One sequence's blocks committed together make one event, as in vLLM.
  if (!events_.empty() && parent_hash) {
    KvEvent& last = events_.back();
    if (last.type == KvEventType::BlockStored && last.lora_id == lora_id && last.block_hashes.back() == *parent_hash) {
      last.block_hashes.push_back(hash_[b]);
      last.token_ids.insert(last.token_ids.end(), t, t + block_size_);
      return;
    }
  }
  KvEvent e = kv_event(KvEventType::BlockStored);
  e.block_hashes = {hash_[b]};
  e.parent_block_hash = parent_hash;
  e.token_ids.assign(t, t + block_size_);
  e.block_size = block_size_;
  e.lora_id = lora_id;
  events_.push_back(std::move(e));
}

std::vector<BlockId> BlockPool::free_list_order() const {
  std::vector<BlockId> out;
  for (BlockId b = free_.head; b >= 0; b = next_[b]) out.push_back(b);
  return out;
}

std::vector<BlockId> BlockPool::cached_lru_order() const {
  std::vector<BlockId> out;
  for (BlockId b = cached_.head; b >= 0; b = next_[b]) out.push_back(b);
  return out;
}

void BlockPool::walk_list(const List& list, State state, const char* name) const {
  int32_t count = 0;
  BlockId prev = -1;
  for (BlockId b = list.head; b >= 0; b = next_[b]) {
    PAGELLM_CHECK(b > kNullBlock && b < num_blocks_, "{} list holds bad block id {}", name, b);
    PAGELLM_CHECK(++count <= list.size, "{} list is longer than its size {} (cycle?)", name,
                  list.size);
    PAGELLM_CHECK(state_[b] == state, "block {} is on the {} list in another state", b, name);
    PAGELLM_CHECK(prev_[b] == prev, "block {} on the {} list has a broken back link", b, name);
    PAGELLM_CHECK(ref_[b] == 0, "block {} on the {} list has ref count {}", b, name, ref_[b]);
    prev = b;
  }
  PAGELLM_CHECK(count == list.size, "{} list holds {} blocks, its size says {}", name, count,
                list.size);
  PAGELLM_CHECK(list.tail == prev, "{} list tail is {}, last node is {}", name, list.tail, prev);
}

void BlockPool::check_invariants() const {
  PAGELLM_CHECK(state_[kNullBlock] == State::Null && ref_[kNullBlock] == 0 &&
                    !registered_[kNullBlock],
                "null block 0 was handed out or changed");
  walk_list(free_, State::Free, "free");
  walk_list(cached_, State::Cached, "cached");
  int32_t used = 0, free = 0, cached = 0, registered = 0;
  for (BlockId b = 1; b < num_blocks_; ++b) {
    switch (state_[b]) {
      case State::Used:
        ++used;
        PAGELLM_CHECK(ref_[b] > 0, "used block {} has ref count {}", b, ref_[b]);
        PAGELLM_CHECK(prev_[b] < 0 && next_[b] < 0, "used block {} is linked into a list", b);
        break;
      case State::Free:
        ++free;
        PAGELLM_CHECK(!registered_[b] && prefix_id_[b] == 0, "free block {} keeps contents", b);
        break;
      case State::Cached:
        ++cached;
        PAGELLM_CHECK(registered_[b], "cached block {} has no registered hash", b);
        break;
      case State::Null:
        fail("block {} is marked as the null block", b);
    }
    if (registered_[b]) {
      ++registered;
      const auto it = map_.find(hash_[b]);
      PAGELLM_CHECK(it != map_.end() && it->second == b,
                    "block {} is marked registered but the hash map disagrees", b);
      PAGELLM_CHECK(prefix_id_[b] != 0, "registered block {} has no prefix id", b);
    }
  }
  PAGELLM_CHECK(registered == static_cast<int32_t>(map_.size()),
                "hash map has {} entries, {} blocks are registered", map_.size(), registered);
  PAGELLM_CHECK(free == free_.size && cached == cached_.size,
                "state counts (free {}, cached {}) disagree with the lists ({}, {})", free, cached,
                free_.size, cached_.size);
  PAGELLM_CHECK(used + free + cached == num_usable_blocks(),
                "used {} + cached {} + free {} != usable blocks {}", used, cached, free,
                num_usable_blocks());
}

}  // namespace pagellm
