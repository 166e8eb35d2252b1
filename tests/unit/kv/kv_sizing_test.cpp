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

// Layers of different K/V shapes sharing slots (Gemma 4's global layers in
// the full group, local ones in the sliding groups): a slot holds its
// largest layer's row; a smaller layer has room for more heads of its size.
TEST(KVSizing, SlotsTakeTheirLargestLayer) {
  // Layers 0 and 2 share slot 0: 2 x 64 and 1 x 256; layer 1 alone in slot 1.
  const KvSlotShapes s = kv_slot_shapes(2, std::vector<int32_t>{0, 1, 0}, std::vector<int32_t>{2, 2, 1},
                                        std::vector<int32_t>{64, 64, 256});
  EXPECT_EQ(s.elems, (std::vector<int32_t>{256, 128}));
  EXPECT_EQ(s.vectors, (std::vector<int32_t>{4, 2}));  // 256 / 64 heads of room for layer 0
  KVCacheLayout l{2, 2, 64, 16, 2};
  l.slot_elems = s.elems;
  l.slot_vectors = s.vectors;
  EXPECT_EQ(kv_bytes_per_block(l), 2 * 16 * (256 + 128) * 2);  // K and V, 16 tokens, f16
  l.scale_bytes = 4;                                            // int8 caches' scales per vector
  l.bytes_per_element = 1;
  EXPECT_EQ(kv_bytes_per_block(l), 2 * 16 * ((256 + 128) + (4 + 2) * 4));
  // Without slots: each layer its own slot.
  EXPECT_EQ(kv_slot_shapes(2, {}, std::vector<int32_t>{1, 4}, std::vector<int32_t>{256, 64}).elems,
            (std::vector<int32_t>{256, 256}));
  // A slot whose row is no multiple of a layer's head cannot hold it.
  EXPECT_THROW(kv_slot_shapes(1, std::vector<int32_t>{0, 0}, std::vector<int32_t>{1, 1}, std::vector<int32_t>{96, 64}),
               Error);
  l.slot_elems.pop_back();
  EXPECT_THROW(kv_bytes_per_block(l), Error);
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
