// Keys of the KV offload tier (kv/kv_tier.h): a full block's identity that
// holds across processes. The pool's chain hash (block_hash.h) is 64 bits and
// its root carries the engine's LoRA id, which is only an index of this run;
// a block found again after a restart must be the same prefix under the same
// model, adapter, tokenizer and cache layout. So the tier chains its own keys:
// 128 bits (two independently seeded 64-bit chains over the block's tokens)
// from a root made of the engine's fingerprint (model, tokenizer, KV dtype and
// layout, backend) and the adapter's. Each file also stores its block's
// tokens, checked on load, so a collision would need both chains to collide.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "kv/kv_types.h"

namespace pagellm {

struct TierKey {
  uint64_t hi = 0, lo = 0;
  bool operator==(const TierKey&) const = default;
  // 32 hex digits, hi then lo (file names).
  std::string hex() const;
};

struct TierKeyHash {
  size_t operator()(const TierKey& k) const { return static_cast<size_t>(k.hi ^ (k.lo * 0x9e3779b97f4a7c15ULL)); }
};

// The parent of a sequence's first block: the engine's fingerprint mixed with
// the adapter's (0: the base model).
TierKey tier_root(const TierKey& fingerprint, uint64_t adapter_fingerprint);
// Block after `parent` holding `tokens`.
TierKey tier_next(const TierKey& parent, std::span<const TokenId> tokens);
// The key of KV-cache group g's block (group 0: the chain key itself).
TierKey tier_group_key(const TierKey& chain, int group);

// A 64-bit checksum of bytes (file payloads and headers): word-wise
// multiply-fold mixing, seeded.
uint64_t tier_checksum(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace pagellm
