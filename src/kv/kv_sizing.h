// How much memory a KV block takes and how many blocks fit in a budget.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/kv_layout.h"

namespace pagellm {

// Blocks that fit in `budget_bytes`, including the reserved null block 0
// (the value to pass as KVCacheConfig::num_blocks). Throws Error when the
// budget holds fewer than 2 blocks, naming the bytes needed.
int32_t kv_num_blocks_for_budget(const KVCacheLayout& layout, int64_t budget_bytes);

// The most blocks one sequence of up to max_len tokens holds, all KV-cache
// groups together, when each step computes at most step_tokens of it: a
// full group's table covers the sequence, a sliding one's the window plus
// the step's tokens (empty groups: one full group).
int32_t kv_blocks_per_seq(std::span<const KvGroup> groups, int32_t block_size, int32_t max_len, int32_t step_tokens);

// "full x1, sliding 512 x5": the groups by kind, for logs.
std::string describe_kv_groups(std::span<const KvGroup> groups);

}  // namespace pagellm
