#include "runner/micro_batch.h"

#include <gtest/gtest.h>

namespace pagellm {
namespace {

// Two sequences: a 10-token prefill chunk at positions [4, 14) and a decode at position 20.
BatchInfo two_sequences() {
  BatchInfo b;
  for (int32_t i = 0; i < 10; ++i) {
    b.token_ids.push_back(100 + i);
    b.positions.push_back(4 + i);
    b.slot_mapping.push_back(64 + 4 + i);
  }
  b.token_ids.push_back(7);
  b.positions.push_back(20);
  b.slot_mapping.push_back(16 * 9 + 4);
  SeqInfo a;
  a.q_start = 0;
  a.q_len = 10;
  a.ctx_len = 14;
  a.block_table = {4};
  SeqInfo d;
  d.q_start = 10;
  d.q_len = 1;
  d.ctx_len = 21;
  d.block_table = {8, 9};
  b.seqs = {a, d};
  return b;
}

TEST(MicroBatch, EndsSplitEvenlyAndKeepAMinimum) {
  EXPECT_EQ(micro_batch_ends(1000, 4, 64), (std::vector<int32_t>{250, 500, 750, 1000}));
  EXPECT_EQ(micro_batch_ends(130, 4, 64), (std::vector<int32_t>{65, 130}));
  EXPECT_EQ(micro_batch_ends(8, 4, 64), (std::vector<int32_t>{8}));  // a decode step stays whole
  EXPECT_EQ(micro_batch_ends(7, 8, 1), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(MicroBatch, SliceCutsASequenceIntoChunks) {
  const BatchInfo b = two_sequences();
  BatchInfo first, second;
  slice_batch(b, 0, 6, first);
  ASSERT_EQ(first.seqs.size(), 1u);
  EXPECT_EQ(first.seqs[0].q_start, 0);
  EXPECT_EQ(first.seqs[0].q_len, 6);
  EXPECT_EQ(first.seqs[0].ctx_len, 10);  // positions [4, 10): the cache holds 10 tokens after it
  EXPECT_EQ(first.token_ids, (std::vector<int32_t>{100, 101, 102, 103, 104, 105}));
  slice_batch(b, 6, 11, second);
  ASSERT_EQ(second.seqs.size(), 2u);
  EXPECT_EQ(second.seqs[0].q_start, 0);
  EXPECT_EQ(second.seqs[0].q_len, 4);
  EXPECT_EQ(second.seqs[0].ctx_len, 14);
  EXPECT_EQ(second.seqs[1].q_start, 4);
  EXPECT_EQ(second.seqs[1].q_len, 1);
  EXPECT_EQ(second.seqs[1].ctx_len, 21);
  EXPECT_EQ(second.seqs[1].block_table, (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(second.positions, (std::vector<int32_t>{10, 11, 12, 13, 20}));
  EXPECT_EQ(second.slot_mapping.back(), 16 * 9 + 4);
}

// A sliding group's slots travel with the rows (a stage that holds those
// layers writes them).
TEST(MicroBatch, SliceKeepsEveryKvGroupsSlots) {
  BatchInfo b = two_sequences();
  std::vector<int64_t> slots(static_cast<size_t>(b.n_tokens()));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = 1000 + static_cast<int64_t>(i);
  b.group_slots = {slots, slots};
  BatchInfo second;
  slice_batch(b, 6, 11, second);
  ASSERT_EQ(second.group_slots.size(), 2u);
  EXPECT_EQ(second.group_slots[1], (std::vector<int64_t>{1006, 1007, 1008, 1009, 1010}));
}

}  // namespace
}  // namespace pagellm
