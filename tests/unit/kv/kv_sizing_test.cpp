#include "kv/kv_sizing.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace pagellm {
namespace {

TEST(KVSizing, BytesPerBlock) {
  struct Case {
    KVCacheLayout layout;
    int64_t bytes;
  };
  const Case cases[] = {
      // Llama-2-7B, f16, 16 tokens: 2 * 32 * 32 * 128 * 16 * 2 = 8 MiB.
      {{32, 32, 128, 16, 2}, int64_t{8} << 20},
      // Llama-3-8B (GQA: 8 KV heads), f16.
      {{32, 8, 128, 16, 2}, int64_t{2} << 20},
      // stories260K-like: 5 layers, 4 KV heads, head dim 8, f32, 8 tokens.
      {{5, 4, 8, 8, 4}, 2 * 5 * 4 * 8 * 8 * 4},
      {{80, 8, 128, 64, 1}, int64_t{2} * 80 * 8 * 128 * 64},
  };
  for (const Case& c : cases) EXPECT_EQ(kv_bytes_per_block(c.layout), c.bytes);
  EXPECT_THROW(kv_bytes_per_block({0, 8, 128, 16, 2}), Error);
  EXPECT_THROW(kv_bytes_per_block({32, 8, 128, 16, 0}), Error);
}

TEST(KVSizing, BlocksFromBudget) {
  const KVCacheLayout l{32, 8, 128, 16, 2};  // 2 MiB per block
  EXPECT_EQ(kv_num_blocks_for_budget(l, int64_t{1} << 30), 512);
  EXPECT_EQ(kv_num_blocks_for_budget(l, (int64_t{1} << 30) + (int64_t{2} << 20) - 1), 512);
  EXPECT_EQ(kv_num_blocks_for_budget(l, int64_t{4} << 20), 2);
  EXPECT_THROW(kv_num_blocks_for_budget(l, (int64_t{4} << 20) - 1), Error);
  EXPECT_THROW(kv_num_blocks_for_budget(l, -5), Error);
  // Capped at what a BlockId can index.
  EXPECT_EQ(kv_num_blocks_for_budget({1, 1, 1, 8, 1}, int64_t{1} << 40), INT32_MAX);
}

}  // namespace
}  // namespace pagellm
