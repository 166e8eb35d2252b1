// How much memory a KV block takes and how many blocks fit in a budget.
#pragma once

#include <cstdint>

#include "core/kv_layout.h"

namespace pagellm {

// Blocks that fit in `budget_bytes`, including the reserved null block 0
// (the value to pass as KVCacheConfig::num_blocks). Throws Error when the
// budget holds fewer than 2 blocks, naming the bytes needed.
int32_t kv_num_blocks_for_budget(const KVCacheLayout& layout, int64_t budget_bytes);

}  // namespace pagellm
