// The size of one paged KV-cache block: what the scheduler's pool sizing
// (kv/kv_sizing.h) and every backend's cache (backend.h's KVCacheSpec) agree on.
#pragma once

#include <cstdint>

namespace pagellm {

struct KVCacheLayout {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;        // tokens per block
  int32_t bytes_per_element = 2;  // 2 for f16/bf16, 4 for f32, 1 for 8-bit caches
  int32_t scale_bytes = 0;        // per (token, KV head) vector: 4 in an int8 cache (its float scale)
};

// 2 (K and V) * n_layers * n_kv_heads * block_size * (head_dim * bytes_per_element + scale_bytes).
// Throws Error for non-positive fields.
int64_t kv_bytes_per_block(const KVCacheLayout& layout);

}  // namespace pagellm
