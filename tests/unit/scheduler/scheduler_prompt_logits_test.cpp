// Sequences that need their prompt's logits (prompt logprobs): every prompt
// position is computed (no prefix-cache hit), each plan entry asks for the
// rows of its prompt positions, and prompt_logits_chunk bounds their chunks.
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

// Each prompt position p < P - 1 appears in exactly one entry's prompt rows,
// in order, and only the prompt-logits sequence has any.
void expect_rows_cover_prompt(const std::vector<StepPlan>& plans, SeqId id, int32_t prompt_len) {
  int32_t next = 0;
  for (const StepPlan& plan : plans)
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.seq_id != id) {
        EXPECT_EQ(s.num_prompt_logits, 0) << "sequence " << s.seq_id;
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

TEST(SchedulerPromptLogits, ChunkCapBoundsOnlyThoseSequences) {
  SchedulerConfig sc = sched_config(256);
  sc.prompt_logits_chunk = 10;
  FakeEngine e(sc, kv_config(100));
  Sequence* seq = e.add(1, tokens(35), 1);
  seq->needs_prompt_logits = true;
  e.add(2, tokens(35, 700), 1);
  std::vector<StepPlan> plans;
  for (int i = 0; i < 4; ++i) plans.push_back(e.step());
  // Sequence 2 runs whole in the first step; sequence 1 in chunks of 10, 10, 10, 5.
  ASSERT_EQ(plans[0].seqs.size(), 2u);
  EXPECT_EQ(plans[0].seqs[0].num_new_tokens, 10);
  EXPECT_EQ(plans[0].seqs[1].num_new_tokens, 35);
  EXPECT_EQ(plans[3].seqs[0].num_new_tokens, 5);
  EXPECT_TRUE(plans[3].seqs[0].sample);
  expect_rows_cover_prompt(plans, 1, 35);
  EXPECT_THROW(
      [] {
        SchedulerConfig bad = sched_config(16);
        bad.prompt_logits_chunk = -1;
        bad.validate();
      }(),
      Error);
}

}  // namespace
}  // namespace pagellm
