// Small value types shared by the KV-cache layers and the scheduler.
#pragma once

#include "core/enum_names.h"

#include <cstdint>

namespace pagellm {

using TokenId = int32_t;
using BlockId = int32_t;   // index into the paged KV cache (0 .. num_blocks-1)
using SeqId = uint64_t;    // one generated sequence (a request with n > 1 has n)
using BlockHash = uint64_t;

// Block 0 is never handed out: runners may point padding slots at it.
inline constexpr BlockId kNullBlock = 0;

// Where fresh blocks come from. Both are correct; Contiguous keeps a
// sequence's blocks physically adjacent when it can (friendlier to backends
// that read runs of blocks), Any takes the head of the free list.
enum class AllocationPolicy : uint8_t { Any, Contiguous };
inline constexpr EnumName<AllocationPolicy> kAllocationPolicyNames[] = {{"any", AllocationPolicy::Any},
                                                                         {"contiguous", AllocationPolicy::Contiguous}};

// Copy-on-write: the runner copies block `src` to block `dst` (all layers,
// K and V) before the forward pass that writes into `dst`.
struct BlockCopy {
  BlockId src = kNullBlock;
  BlockId dst = kNullBlock;
  bool operator==(const BlockCopy&) const = default;
};

inline int32_t blocks_for_tokens(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

}  // namespace pagellm
