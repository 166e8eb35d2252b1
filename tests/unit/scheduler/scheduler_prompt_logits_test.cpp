// Sequences that need their prompt's logits (prompt logprobs): every prompt
// position is computed (no prefix-cache hit), each plan entry asks for the
// rows of its prompt positions, and max_prompt_logit_rows bounds a step's rows.
#include <gtest/gtest.h>

#include "core/error.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_test_util.h"

namespace pagellm {
namespace {

using test::FakeEngine;
using test::kv_config;
using test::sched_config;
using test::tokens;

// Each prompt position p < P - 1 of sequence `id` appears in exactly one of
// its entries' prompt rows, in order; sequences that need no prompt logits
// have none.
void expect_rows_cover_prompt(const std::vector<StepPlan>& plans, SeqId id, int32_t prompt_len) {
  int32_t next = 0;
  for (const StepPlan& plan : plans)
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.seq_id != id) {
        if (!s.seq->needs_prompt_logits && s.start_pos == 0) EXPECT_EQ(s.num_prompt_logits, 0) << s.seq_id;
        continue;
      }
      if (s.num_prompt_logits == 0) continue;
      EXPECT_EQ(s.start_pos, next);
      EXPECT_LE(s.num_prompt_logits, s.num_new_tokens);
      next = s.start_pos + s.num_prompt_logits;
    }
  EXPECT_EQ(next, prompt_len - 1);
}

TEST(SchedulerPromptLogits, NoPrefixHitAndRowsForEveryPromptPosition) {
  FakeEngine e(sched_config(16), kv_config(100));
  const auto prompt = tokens(40);
  e.add(1, prompt, 1);
  e.run_to_completion();
  EXPECT_EQ(e.sched.kv_stats().cached_blocks, 2);

  // The same prompt again, chunked by the budget of 16: a plain request would
  // find 32 tokens cached; this one computes all 40.
  Sequence* seq = e.add(2, prompt, 2);
  seq->needs_prompt_logits = true;
  e.add(3, tokens(20, 500), 2);
  std::vector<StepPlan> plans;
  while (e.sched.has_unfinished()) plans.push_back(e.step());
  EXPECT_EQ(seq->num_cached_tokens, 0);
  expect_rows_cover_prompt(plans, 2, 40);
  // The chunk with the last prompt position samples; its rows stop before it.
  for (const StepPlan& plan : plans)
    for (const ScheduledSeq& s : plan.seqs)
      if (s.seq_id == 2 && s.sample && s.start_pos < 40) EXPECT_EQ(s.num_prompt_logits, s.num_new_tokens - 1);
}

TEST(SchedulerPromptLogits, OnePromptTokenNeedsNoRows) {
  FakeEngine e(sched_config(64), kv_config(100));
  Sequence* seq = e.add(1, tokens(1), 1);
  seq->needs_prompt_logits = true;
  const StepPlan plan = e.step();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].num_prompt_logits, 0);
  EXPECT_TRUE(plan.seqs[0].sample);
}

TEST(SchedulerPromptLogits, RowCapBoundsThoseSequencesTogether) {
  SchedulerConfig sc = sched_config(256);
  sc.max_prompt_logit_rows = 16;
  FakeEngine e(sc, kv_config(100));
  Sequence* a = e.add(1, tokens(20), 1);
  a->needs_prompt_logits = true;
  e.add(2, tokens(35, 700), 1);
  Sequence* b = e.add(3, tokens(10, 300), 1);
  b->needs_prompt_logits = true;
  std::vector<StepPlan> plans;
  while (e.sched.has_unfinished()) plans.push_back(e.step());
  for (const StepPlan& plan : plans) {
    int32_t rows = 0;
    for (const ScheduledSeq& s : plan.seqs)
      if (s.seq_id != 2) rows += s.num_new_tokens;
    EXPECT_LE(rows, 16);
  }
  // Step 1: 16 tokens of sequence 1, all 35 of sequence 2 (no cap), none of 3.
  ASSERT_EQ(plans[0].seqs.size(), 2u);
  EXPECT_EQ(plans[0].seqs[0].num_new_tokens, 16);
  EXPECT_EQ(plans[0].seqs[1].seq_id, 2);
  EXPECT_EQ(plans[0].seqs[1].num_new_tokens, 35);
  expect_rows_cover_prompt(plans, 1, 20);
  expect_rows_cover_prompt(plans, 3, 10);
  EXPECT_THROW(
      [] {
        SchedulerConfig bad = sched_config(16);
        bad.max_prompt_logit_rows = -1;
        bad.validate();
      }(),
      Error);
}

// A whole-prompt sequence (an encoder's: bidirectional attention) is computed
// in one step, never chunked, never taken from the prefix cache, and its
// blocks never join it.
TEST(SchedulerWholePrompt, OneStepNoChunksNoPrefixCache) {
  FakeEngine e(sched_config(48), kv_config(100));
  const auto prompt = tokens(40);
  e.add(1, prompt, 1);
  e.run_to_completion();
  const int32_t cached = e.sched.kv_stats().cached_blocks;
  EXPECT_EQ(cached, 2);

  // A plain prompt takes 20 of the budget of 48 first: the whole prompt of
  // 40 does not fit beside it and waits for a step of its own.
  e.add(2, tokens(20, 500), 1);
  Sequence* whole = e.add(3, prompt, 1);
  whole->whole_prompt = true;
  std::vector<StepPlan> plans;
  while (e.sched.has_unfinished()) plans.push_back(e.step());
  EXPECT_EQ(whole->num_cached_tokens, 0);
  int entries = 0;
  for (const StepPlan& plan : plans)
    for (const ScheduledSeq& s : plan.seqs)
      if (s.seq_id == 3 && s.start_pos < 40) {
        ++entries;
        EXPECT_EQ(s.start_pos, 0);
        EXPECT_EQ(s.num_new_tokens, 40);
      }
  EXPECT_EQ(entries, 1);

  // A new whole prompt of its own tokens leaves no reusable blocks behind.
  e.add(4, tokens(40, 900), 1)->whole_prompt = true;
  const int32_t before = e.sched.kv_stats().cached_blocks;
  e.run_to_completion();
  EXPECT_EQ(e.sched.kv_stats().cached_blocks, before);
}

}  // namespace
}  // namespace pagellm
