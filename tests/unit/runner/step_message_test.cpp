#include "runner/step_message.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace pagellm {
namespace {

StepMessage sample_message() {
  StepMessage m;
  m.swap_out = {{3, 1}};
  m.block_copies = {{5, 6}, {7, 8}};
  m.state_copies = {{0, 2}};
  m.batch.token_ids = {11, 12, 13, 14};
  m.batch.positions = {0, 1, 2, 9};
  m.batch.slot_mapping = {32, 33, 34, 105};
  SeqInfo a;
  a.q_start = 0;
  a.q_len = 3;
  a.ctx_len = 3;
  a.block_table = {2};
  SeqInfo b;
  b.q_start = 3;
  b.q_len = 1;
  b.ctx_len = 10;
  b.block_table = {4, 6};
  b.kv_sinks = 4;
  b.kv_evicted_to = 6;
  b.state_slot = 2;
  m.batch.seqs = {a, b};
  m.logits_rows = {2, 3};
  m.hidden_rows = {0, 1, 3};
  return m;
}

TEST(StepMessage, RoundTrips) {
  const StepMessage m = sample_message();
  const StepMessage d = decode_step(encode_step(m));
  EXPECT_EQ(d.kind, StepMessage::Step);
  EXPECT_EQ(d.swap_out, m.swap_out);
  EXPECT_TRUE(d.swap_in.empty());
  EXPECT_EQ(d.block_copies, m.block_copies);
  EXPECT_EQ(d.batch.token_ids, m.batch.token_ids);
  EXPECT_EQ(d.batch.positions, m.batch.positions);
  EXPECT_EQ(d.batch.slot_mapping, m.batch.slot_mapping);
  ASSERT_EQ(d.batch.seqs.size(), 2u);
  EXPECT_EQ(d.batch.seqs[1].block_table, m.batch.seqs[1].block_table);
  EXPECT_EQ(d.batch.seqs[1].ctx_len, 10);
  EXPECT_EQ(d.batch.seqs[1].kv_sinks, 4);
  EXPECT_EQ(d.batch.seqs[1].kv_evicted_to, 6);
  EXPECT_EQ(d.state_copies, m.state_copies);
  EXPECT_EQ(d.batch.seqs[0].state_slot, -1);
  EXPECT_EQ(d.batch.seqs[1].state_slot, 2);
  EXPECT_EQ(d.logits_rows, m.logits_rows);
  EXPECT_EQ(d.hidden_rows, m.hidden_rows);
  StepMessage stop;
  stop.kind = StepMessage::Shutdown;
  EXPECT_EQ(decode_step(encode_step(stop)).kind, StepMessage::Shutdown);
}

TEST(StepMessage, DamagedBytesAreErrors) {
  const std::vector<uint8_t> bytes = encode_step(sample_message());
  for (size_t cut = 0; cut < bytes.size(); cut += 7) {
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(decode_step(part), Error) << cut;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(decode_step(longer), Error);
  std::vector<uint8_t> bad = bytes;
  bad[0] ^= 0xff;
  EXPECT_THROW(decode_step(bad), Error);
}

}  // namespace
}  // namespace pagellm
