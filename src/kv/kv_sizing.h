// How much memory a KV block takes and how many blocks fit in a budget.
#pragma once

#include <cstdint>

namespace pagellm {

struct KVCacheLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;        // tokens per block
  int32_t bytes_per_element = 2;  // 2 for f16/bf16, 4 for f32, 1 for 8-bit caches
};

// 2 (K and V) * n_layers * n_kv_heads * head_dim * block_size * bytes_per_element.
// Throws Error for non-positive fields.
int64_t kv_bytes_per_block(const KVCacheLayout& layout);

// Blocks that fit in `budget_bytes`, including the reserved null block 0
// (the value to pass as KVCacheConfig::num_blocks). Throws Error when the
// budget holds fewer than 2 blocks, naming the bytes needed.
int32_t kv_num_blocks_for_budget(const KVCacheLayout& layout, int64_t budget_bytes);

}  // namespace pagellm
