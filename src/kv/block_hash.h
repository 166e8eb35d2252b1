// Chained hashes of full KV blocks for prefix caching: a block's hash covers
// its parent's hash and its own token ids, so equal hashes mean (up to
// collisions) equal prefixes. Collisions cannot return a wrong block: the pool
// verifies a hit by its stored token ids and its parent's identity
// (block_pool.h, "prefix identity"); a collision only costs a cache miss.
#pragma once

#include <span>

#include "kv/kv_types.h"

namespace pagellm {

// Parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash = 0x6a09e667f3bcc908ULL;

// 64-bit hash of (parent, tokens): 128-bit multiply-fold mixing over 64-bit
// words, then a finalizer; every input bit affects every output bit.
BlockHash hash_block_tokens(BlockHash parent, std::span<const TokenId> tokens);

}  // namespace pagellm
