#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <vector>

#include "core/error.h"
#include "scheduler_test_util.h"

namespace pagellm {
namespace {

// What one plan entry says, in a form tables can spell.
struct Ran {
  SeqId id;
  int32_t start;
  int32_t n;
  bool sample;
  bool operator==(const Ran&) const = default;
};
void PrintTo(const Ran& r, std::ostream* os) {
  *os << "{seq " << r.id << ", start " << r.start << ", n " << r.n << (r.sample ? ", sample}" : "}");
}
std::vector<Ran> summary(const StepPlan& plan) {
  std::vector<Ran> out;
  for (const auto& s : plan.seqs) out.push_back({s.seq_id, s.start_pos, s.num_new_tokens, s.sample});
  return out;
}

using test::kv_config;
using test::sched_config;
using test::tokens;

using test::FakeEngine;

TEST(Scheduler, ValidatesConfig) {
  const auto kv = kv_config(100);
  auto bad = [&](auto mutate) {
    SchedulerConfig c = sched_config(256);
    mutate(c);
    EXPECT_THROW(Scheduler(c, kv), Error);
  };
  bad([](SchedulerConfig& c) { c.max_num_seqs = 0; });
  bad([](SchedulerConfig& c) { c.max_num_batched_tokens = 0; });
  bad([](SchedulerConfig& c) { c.max_model_len = 0; });
  bad([](SchedulerConfig& c) { c.long_prefill_token_threshold = -1; });
  bad([](SchedulerConfig& c) { c.preemption_mode = PreemptionMode::Swap; });
  bad([](SchedulerConfig& c) { c.enable_chunked_prefill = false; });  // budget 256 < max_model_len 1024
  bad([](SchedulerConfig& c) { c.max_model_len = 99 * 16 + 1; });      // more than the cache holds
  EXPECT_NO_THROW(Scheduler(sched_config(256, 8, 99 * 16), kv));
  EXPECT_THROW(Scheduler(sched_config(256), kv_config(100, 24)), Error);
}

TEST(Scheduler, RejectsBadSequences) {
  FakeEngine e(sched_config(256, 256, 64), kv_config(100));
  EXPECT_THROW(e.add(1, {}, 4), InvalidRequest);
  try {
    e.add(2, tokens(65), 4);
    FAIL() << "expected InvalidRequest";
  } catch (const InvalidRequest& err) {
    EXPECT_EQ(err.param(), "prompt");
  }
  e.add(3, tokens(64), 4);  // exactly max_model_len is fine
  Sequence dup;
  dup.id = 3;
  dup.token_ids = tokens(5);
  dup.num_prompt_tokens = 5;
  EXPECT_THROW(e.sched.add(&dup), Error);  // duplicate live id
  EXPECT_THROW(e.sched.add(nullptr), Error);
  EXPECT_EQ(e.sched.num_waiting(), 1);
}

TEST(Scheduler, TokenBudgetIterationByIteration) {
  FakeEngine e(sched_config(128), kv_config(100));
  e.add(1, tokens(100), 3);
  e.add(2, tokens(100, 1000), 3);
  e.add(3, tokens(50, 5000), 3);
  const std::vector<std::vector<Ran>> expected = {
      {{1, 0, 100, true}, {2, 0, 28, false}},                       // 3 waits: no budget left
      {{1, 100, 1, true}, {2, 28, 72, true}, {3, 0, 50, true}},     // decode first, then chunk, then admit
      {{1, 101, 1, true}, {2, 100, 1, true}, {3, 50, 1, true}},     // 1 finishes (3 tokens)
      {{2, 101, 1, true}, {3, 51, 1, true}},
      {},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(summary(e.step()), expected[i]);
  }
  EXPECT_FALSE(e.sched.has_unfinished());
  for (SeqId id : {1, 2, 3}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);
}

TEST(Scheduler, MaxNumSeqsLimitsAdmission) {
  FakeEngine e(sched_config(1000, 2), kv_config(100));
  for (SeqId id : {1, 2, 3}) e.add(id, tokens(10, TokenId(id * 100)), 2);
  const std::vector<std::vector<Ran>> expected = {
      {{1, 0, 10, true}, {2, 0, 10, true}},
      {{1, 10, 1, true}, {2, 10, 1, true}},  // both finish
      {{3, 0, 10, true}},
      {{3, 10, 1, true}},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(summary(e.step()), expected[i]);
    EXPECT_LE(e.sched.num_running(), 2);
  }
  EXPECT_FALSE(e.sched.has_unfinished());
}

TEST(Scheduler, LongPromptIsChunkedWhileOthersKeepDecoding) {
  // Two decoders take 1 token each; the 1000-token prompt gets the other 256.
  FakeEngine e(sched_config(258, 256, 2048), kv_config(200));
  e.add(1, tokens(5), 100);
  e.add(2, tokens(5, 900), 100);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 0, 5, true}, {2, 0, 5, true}}));
  e.add(3, tokens(1000, 7000), 2);
  const std::vector<std::vector<Ran>> expected = {
      {{1, 5, 1, true}, {2, 5, 1, true}, {3, 0, 256, false}},
      {{1, 6, 1, true}, {2, 6, 1, true}, {3, 256, 256, false}},
      {{1, 7, 1, true}, {2, 7, 1, true}, {3, 512, 256, false}},
      {{1, 8, 1, true}, {2, 8, 1, true}, {3, 768, 232, true}},
      {{1, 9, 1, true}, {2, 9, 1, true}, {3, 1000, 1, true}},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    const StepPlan plan = e.step();
    EXPECT_EQ(summary(plan), expected[i]);
    EXPECT_EQ(plan.num_batched_tokens, i < 3 ? 258 : (i == 3 ? 234 : 3));
  }
  EXPECT_EQ(e.seqs[3]->status, SeqStatus::FinishedLength);
}

TEST(Scheduler, DecodesRunBeforeAnOlderSequencesPrefillChunk) {
  // Priority policy puts the newer, more urgent long prompt ahead of the
  // decoding sequence in running order; decodes are still served first.
  SchedulerConfig c = sched_config(64);
  c.policy = SchedulingPolicy::Priority;
  FakeEngine e(c, kv_config(100));
  e.add(1, tokens(10), 50, /*priority=*/5);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 0, 10, true}}));
  e.add(2, tokens(200, 3000), 1, /*priority=*/0);
  const std::vector<std::vector<Ran>> expected = {
      {{1, 10, 1, true}, {2, 0, 63, false}},
      {{1, 11, 1, true}, {2, 63, 63, false}},
      {{1, 12, 1, true}, {2, 126, 63, false}},
      {{1, 13, 1, true}, {2, 189, 11, true}},
      {{1, 14, 1, true}},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(summary(e.step()), expected[i]);
  }
}

TEST(Scheduler, LongPrefillThresholdCapsOnePromptPerStep) {
  SchedulerConfig c = sched_config(1024);
  c.long_prefill_token_threshold = 256;
  FakeEngine e(c, kv_config(200));
  e.add(1, tokens(600), 1);
  e.add(2, tokens(100, 5000), 1);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 0, 256, false}, {2, 0, 100, true}}));
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 256, 256, false}}));
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 512, 88, true}}));
}

TEST(Scheduler, WithoutChunkedPrefillAPromptRunsWhole) {
  SchedulerConfig c = sched_config(64, 256, 64);
  c.enable_chunked_prefill = false;
  FakeEngine e(c, kv_config(100));
  e.add(1, tokens(50), 2);
  e.add(2, tokens(30, 500), 2);
  e.add(3, tokens(10, 900), 2);
  const std::vector<std::vector<Ran>> expected = {
      {{1, 0, 50, true}},                    // 2 does not fit the 14 left; 3 waits behind it (FCFS)
      {{1, 50, 1, true}, {2, 0, 30, true}, {3, 0, 10, true}},
      {{2, 30, 1, true}, {3, 10, 1, true}},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(summary(e.step()), expected[i]);
  }
}

TEST(Scheduler, PrefixHitsReduceComputedTokensAndLeaveTheLastOne) {
  FakeEngine e(sched_config(512), kv_config(100));
  const auto base = tokens(40);
  e.add(1, base, 1);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 0, 40, true}}));
  EXPECT_EQ(e.seqs[1]->num_cached_tokens, 0);
  EXPECT_FALSE(e.sched.has_unfinished());
  EXPECT_EQ(e.sched.kv_stats().cached_blocks, 2);

  auto longer = base;
  longer.insert(longer.end(), {7, 8, 9, 10, 11});
  e.add(2, longer, 1);                                             // 45 tokens: 2 blocks hit
  e.add(3, std::vector<TokenId>(base.begin(), base.begin() + 32), 1);  // 32: last block recomputed
  e.add(4, std::vector<TokenId>(base.begin(), base.begin() + 16), 1);  // 16: no hit at all
  EXPECT_EQ(summary(e.step()),
            (std::vector<Ran>{{2, 32, 13, true}, {3, 16, 16, true}, {4, 0, 16, true}}));
  EXPECT_EQ(e.seqs[2]->num_cached_tokens, 32);
  EXPECT_EQ(e.seqs[3]->num_cached_tokens, 16);
  EXPECT_EQ(e.seqs[4]->num_cached_tokens, 0);
  EXPECT_EQ(e.sched.prefix_query_tokens(), 40 + 45 + 32 + 16);
  EXPECT_EQ(e.sched.prefix_hit_tokens(), 32 + 16);
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);
}

TEST(Scheduler, PrefixCachingOffComputesEverything) {
  FakeEngine e(sched_config(512), kv_config(100, 16, /*prefix=*/false));
  e.add(1, tokens(40), 1);
  e.step();
  e.add(2, tokens(40), 1);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{2, 0, 40, true}}));
  EXPECT_EQ(e.sched.prefix_hit_tokens(), 0);
}

TEST(Scheduler, PriorityPolicyOrdersWaitingFcfsIgnoresPriority) {
  for (SchedulingPolicy policy : {SchedulingPolicy::Fcfs, SchedulingPolicy::Priority}) {
    SCOPED_TRACE(policy == SchedulingPolicy::Fcfs ? "fcfs" : "priority");
    SchedulerConfig c = sched_config(100);
    c.policy = policy;
    FakeEngine e(c, kv_config(100));
    e.add(1, tokens(60), 1, /*priority=*/5);
    e.add(2, tokens(60, 1000), 1, /*priority=*/1);
    e.add(3, tokens(60, 2000), 1, /*priority=*/3);
    e.add(4, tokens(60, 3000), 1, /*priority=*/1);
    const auto first = summary(e.step());
    const auto second = summary(e.step());
    if (policy == SchedulingPolicy::Priority) {
      EXPECT_EQ(first, (std::vector<Ran>{{2, 0, 60, true}, {4, 0, 40, false}}));
      EXPECT_EQ(second, (std::vector<Ran>{{4, 40, 20, true}, {3, 0, 60, true}, {1, 0, 20, false}}));
    } else {
      EXPECT_EQ(first, (std::vector<Ran>{{1, 0, 60, true}, {2, 0, 40, false}}));
      EXPECT_EQ(second, (std::vector<Ran>{{2, 40, 20, true}, {3, 0, 60, true}, {4, 0, 20, false}}));
    }
    e.run_to_completion();
  }
}

TEST(Scheduler, PreemptsTheNewestWhenBlocksRunOutAndResumesIt) {
  // 6 blocks of 8 tokens; two sequences of 16 + 20 tokens cannot both fit.
  FakeEngine e(sched_config(256, 256, 48), kv_config(7, 8));
  e.add(1, tokens(16), 20);
  e.add(2, tokens(16, 500), 20);
  int preempt_step = -1, resume_step = -1, step = 0;
  while (e.sched.has_unfinished() && step < 200) {
    const StepPlan plan = e.step();
    if (!plan.preempted.empty()) {
      EXPECT_EQ(plan.preempted, std::vector<SeqId>{2});
      EXPECT_EQ(preempt_step, -1);
      preempt_step = step;
      // The victim left this step's plan; the survivor ran.
      for (const auto& s : plan.seqs) EXPECT_NE(s.seq_id, 2u);
      EXPECT_EQ(e.seqs[2]->status, SeqStatus::Preempted);
      EXPECT_EQ(e.seqs[2]->num_computed_tokens, 0);
      EXPECT_EQ(e.sched.num_waiting(), 1);
    }
    for (const auto& s : plan.seqs) {
      if (s.seq_id == 2 && preempt_step >= 0 && resume_step < 0) {
        resume_step = step;
        // Its full blocks that survived in the cache are reused.
        EXPECT_EQ(s.start_pos % 8, 0);
        // Recompute catches up in one step and samples (the token is appended by now).
        EXPECT_TRUE(s.sample);
        EXPECT_EQ(s.end_pos() + 1, s.seq->num_tokens());
      }
    }
    ++step;
  }
  EXPECT_GE(preempt_step, 0);
  EXPECT_GT(resume_step, preempt_step);
  EXPECT_EQ(e.seqs[1]->num_preemptions, 0);
  EXPECT_EQ(e.seqs[2]->num_preemptions, 1);
  EXPECT_EQ(e.sched.num_preemptions(), 1);
  for (SeqId id : {1, 2}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);
}

TEST(Scheduler, PriorityPreemptsTheLeastUrgentEvenIfOlder) {
  SchedulerConfig c = sched_config(256, 256, 48);
  c.policy = SchedulingPolicy::Priority;
  FakeEngine e(c, kv_config(7, 8));
  e.add(1, tokens(16), 20, /*priority=*/9);
  e.add(2, tokens(16, 500), 20, /*priority=*/0);
  e.run_to_completion();
  EXPECT_EQ(e.seqs[1]->num_preemptions, 1);
  EXPECT_EQ(e.seqs[2]->num_preemptions, 0);
  for (SeqId id : {1, 2}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
}

TEST(Scheduler, AbortFreesBlocksInTheSameCall) {
  FakeEngine e(sched_config(64), kv_config(100));
  e.add(1, tokens(40), 10);
  e.add(2, tokens(40, 900), 10);
  e.add(3, tokens(40, 1900), 10);
  e.step();  // 1 runs 40, 2 runs 24; 3 waits
  EXPECT_EQ(e.sched.num_running(), 2);
  EXPECT_EQ(e.sched.num_waiting(), 1);
  const int32_t used = e.sched.kv_stats().used_blocks;
  EXPECT_EQ(used, 3 + 2);
  EXPECT_TRUE(e.sched.abort(2));
  EXPECT_EQ(e.seqs[2]->status, SeqStatus::FinishedAborted);
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 3);
  e.sched.check_invariants();
  EXPECT_TRUE(e.sched.abort(3));  // waiting: just leaves the queue
  EXPECT_EQ(e.sched.num_waiting(), 0);
  EXPECT_EQ(e.seqs[3]->status, SeqStatus::FinishedAborted);
  EXPECT_FALSE(e.sched.abort(3));
  EXPECT_FALSE(e.sched.abort(42));
  EXPECT_THROW(e.sched.finish(1, SeqStatus::Running), Error);
  e.sched.check_invariants();
  EXPECT_TRUE(e.sched.abort(1));
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);
  EXPECT_TRUE(e.step().empty());
}

TEST(Scheduler, AbortBetweenScheduleAndStepDoneIsSkipped) {
  FakeEngine e(sched_config(64), kv_config(100));
  e.add(1, tokens(10), 10);
  e.add(2, tokens(10, 900), 10);
  StepPlan plan = e.sched.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_TRUE(e.sched.abort(1));
  e.sched.on_step_done(plan);
  EXPECT_EQ(e.seqs[2]->num_computed_tokens, 10);
  e.sched.check_invariants();
  EXPECT_THROW(e.sched.on_step_done(plan), Error);  // applied twice
}

TEST(Scheduler, MaxModelLenIsNeverExceeded) {
  // The engine here ignores reached_max_model_len: the scheduler caps the sequence.
  FakeEngine e(sched_config(64, 256, 32), kv_config(10, 8));
  e.add(1, tokens(30), 100);
  const std::vector<std::vector<Ran>> expected = {
      {{1, 0, 30, true}}, {{1, 30, 1, true}}, {{1, 31, 1, true}}, {},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    const StepPlan plan = e.step(/*stop_at_max_model_len=*/false);
    EXPECT_EQ(summary(plan), expected[i]);
    if (i == 3) {
      EXPECT_EQ(plan.length_capped, std::vector<SeqId>{1});
    }
  }
  EXPECT_EQ(e.seqs[1]->status, SeqStatus::FinishedLength);
  EXPECT_EQ(e.seqs[1]->num_tokens(), 33);
  EXPECT_FALSE(e.sched.has_unfinished());
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);

  // A prompt of exactly max_model_len yields one token; the engine stops it.
  e.add(2, tokens(32, 600), 100);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{2, 0, 32, true}}));
  EXPECT_TRUE(e.sched.reached_max_model_len(*e.seqs[2]));
  EXPECT_EQ(e.seqs[2]->status, SeqStatus::FinishedLength);
}

TEST(Scheduler, ForkSharesThePromptAndCopiesTheSharedPartialBlock) {
  FakeEngine e(sched_config(64, 256, 256), kv_config(20));
  Sequence* parent = e.add(1, tokens(20), 3);
  e.step();  // prompt + first sampled token
  ASSERT_EQ(parent->num_computed_tokens, 20);
  auto child = std::make_unique<Sequence>();
  child->id = 2;
  child->request_id = 1;
  child->num_prompt_tokens = 20;
  child->token_ids = tokens(20);
  child->token_ids.push_back(77);
  e.sched.fork(1, child.get());
  e.sched.check_invariants();
  EXPECT_EQ(child->num_computed_tokens, 20);
  EXPECT_EQ(child->parent, std::optional<SeqId>{1});
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 2);
  const StepPlan plan = e.sched.schedule();
  e.sched.check_invariants();
  ASSERT_EQ(summary(plan), (std::vector<Ran>{{1, 20, 1, true}, {2, 20, 1, true}}));
  ASSERT_EQ(plan.block_copies.size(), 1u);
  const auto t1 = plan.seqs[0].block_table, t2 = plan.seqs[1].block_table;
  EXPECT_EQ(t1[0], t2[0]);  // full prompt block still shared
  EXPECT_NE(t1[1], t2[1]);
  // The parent ran first, so it took the copy; the child writes in place.
  EXPECT_EQ(plan.block_copies[0], (BlockCopy{t2[1], t1[1]}));
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 3);
  // Bad forks.
  auto stranger = std::make_unique<Sequence>();
  stranger->id = 3;
  stranger->num_prompt_tokens = 20;
  stranger->token_ids = tokens(21, 5);
  EXPECT_THROW(e.sched.fork(1, stranger.get()), Error);  // different tokens
  stranger->token_ids = tokens(21);
  EXPECT_THROW(e.sched.fork(9, stranger.get()), Error);  // unknown parent
  EXPECT_THROW(e.sched.fork(1, child.get()), Error);     // already live
  e.sched.check_invariants();
  EXPECT_TRUE(e.sched.abort(1));
  EXPECT_TRUE(e.sched.abort(2));
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);
}

TEST(StepPlan, SlotMappingAndPositions) {
  const std::vector<BlockId> table = {5, 2, 9};
  struct Case {
    int32_t pos;
    int64_t slot;
  };
  for (const Case& c : {Case{0, 80}, Case{15, 95}, Case{16, 32}, Case{17, 33}, Case{40, 152}, Case{47, 159}}) {
    EXPECT_EQ(StepPlan::slot_of(table, c.pos, 16), c.slot) << c.pos;
  }
  EXPECT_THROW(StepPlan::slot_of(table, 48, 16), Error);
  EXPECT_THROW(StepPlan::slot_of(table, -1, 16), Error);

  Sequence seq;
  seq.token_ids = tokens(20);
  StepPlan plan;
  plan.block_size = 16;
  ScheduledSeq s;
  s.seq = &seq;
  s.start_pos = 14;
  s.num_new_tokens = 4;
  s.block_table = table;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  plan.append_positions_and_slots(s, positions, slots);
  EXPECT_EQ(positions, (std::vector<int32_t>{14, 15, 16, 17}));
  EXPECT_EQ(slots, (std::vector<int64_t>{94, 95, 32, 33}));
  std::vector<TokenId> ids;
  s.append_input_ids(ids);
  EXPECT_EQ(ids, (std::vector<TokenId>{114, 115, 116, 117}));
  // The last two of the new tokens are drafts that follow token_ids.
  seq.token_ids = tokens(16);
  s.draft_tokens = {7, 8};
  ids.clear();
  s.append_input_ids(ids);
  EXPECT_EQ(ids, (std::vector<TokenId>{114, 115, 7, 8}));
}

}  // namespace
}  // namespace pagellm

namespace pagellm {
namespace {

// Twelve requests of 24-token prompts that grow by 40 tokens each, in a pool
// that holds a few of them at full length: admitting eagerly preempts
// running decodes; keeping a reserve preempts fewer and finishes everything.
int64_t preemptions_with(AdmissionPolicy policy) {
  SchedulerConfig c = sched_config(256, 256, 128);
  c.admission_policy = policy;
  c.admission_watermark = 0.0;
  FakeEngine e(c, kv_config(25, 8));
  for (SeqId id = 1; id <= 12; ++id) e.add(id, tokens(24, static_cast<TokenId>(1000 * id)), 40);
  e.run_to_completion();
  for (SeqId id = 1; id <= 12; ++id) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
  return e.sched.num_preemptions();
}

TEST(Scheduler, ConservativeAdmissionPreemptsLessThanAggressive) {
  const int64_t aggressive = preemptions_with(AdmissionPolicy::Aggressive);
  const int64_t conservative = preemptions_with(AdmissionPolicy::Conservative);
  EXPECT_GT(aggressive, 0);
  EXPECT_LT(conservative, aggressive);
}

// Two 16-token prompts that grow to 24 tokens (3 blocks each) and a third
// of 24 in 8 usable blocks: admitting the third at once leaves one free block
// for the two that both need a third one.
int64_t preemptions_admitting(AdmissionPolicy policy, int32_t* running_after_first_step) {
  SchedulerConfig c = sched_config(256, 256, 48);
  c.admission_policy = policy;
  c.admission_watermark = 0.0;
  FakeEngine e(c, kv_config(9, 8));
  e.add(1, tokens(16), 8);
  e.add(2, tokens(16, 500), 8);
  e.add(3, tokens(24, 900), 8);
  e.step();
  *running_after_first_step = e.sched.num_running();
  e.run_to_completion();
  for (SeqId id : {1, 2, 3}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
  return e.sched.num_preemptions();
}

TEST(Scheduler, ConservativeAdmissionKeepsOneBlockPerRunningSequence) {
  int32_t running = 0;
  EXPECT_GT(preemptions_admitting(AdmissionPolicy::Aggressive, &running), 0);
  EXPECT_EQ(running, 3);
  EXPECT_EQ(preemptions_admitting(AdmissionPolicy::Conservative, &running), 0);
  EXPECT_EQ(running, 2);  // 3 more blocks would leave 1 for 3 running sequences
}

TEST(Scheduler, ConservativeAdmissionStillRunsAPromptThatNeedsTheWholePool) {
  SchedulerConfig c = sched_config(256, 256, 64);
  c.admission_policy = AdmissionPolicy::Conservative;
  c.admission_watermark = 0.5;
  FakeEngine e(c, kv_config(9, 8));
  e.add(1, tokens(60), 4);  // 8 blocks at the end: all of them
  e.run_to_completion();
  EXPECT_EQ(e.seqs[1]->token_ids, e.expected_tokens(1));
}

TEST(Scheduler, HigherPriorityTakesTheSeatOfALowerOne) {
  SchedulerConfig c = sched_config(256, 1, 256);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = 0;
  FakeEngine e(c, kv_config(64, 8));
  e.add(1, tokens(8), 50, /*priority=*/5);
  e.step();
  e.step();
  e.add(2, tokens(8, 500), 5, /*priority=*/0);
  const StepPlan plan = e.step();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].seq_id, 2);
  EXPECT_EQ(plan.preempted, std::vector<SeqId>{1});
  EXPECT_EQ(e.sched.num_preemptions_priority(), 1);
  e.add(3, tokens(8, 900), 5, /*priority=*/5);  // equal priority: waits its turn, no preemption
  e.run_to_completion();
  EXPECT_EQ(e.sched.num_preemptions_priority(), 1);
  for (SeqId id : {1, 2, 3}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
}

TEST(Scheduler, HigherPriorityTakesTheBlocksOfALowerOne) {
  SchedulerConfig c = sched_config(256, 16, 48);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = 0;
  FakeEngine e(c, kv_config(7, 8));  // 6 usable blocks
  e.add(1, tokens(40), 8, /*priority=*/3);
  e.step();
  e.add(2, tokens(24, 500), 4, /*priority=*/1);  // needs 3 blocks; 1 is free
  const StepPlan plan = e.step();
  EXPECT_EQ(plan.preempted, std::vector<SeqId>{1});
  e.run_to_completion();
  for (SeqId id : {1, 2}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
}

// Swap preemption, a host pool of one block: C is swapped out for X, then in
// step 3 swapped back in while W takes E's blocks. The runner swaps out
// before it swaps in, so E must not be given the host block C is read from
// in the same step; with no other free, E is recomputed instead.
TEST(Scheduler, AHostBlockReadBackIsNotReusedInTheSameStep) {
  SchedulerConfig c = sched_config(256, 3, 40);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = 0;
  c.preemption_mode = PreemptionMode::Swap;
  c.num_swap_blocks = 1;
  FakeEngine e(c, kv_config(6, 8));  // 5 usable blocks
  e.add(1, tokens(8, 100), 2, /*priority=*/1);  // A
  e.add(3, tokens(8, 300), 10, /*priority=*/5);  // C
  e.step();
  e.add(4, tokens(16, 400), 1, /*priority=*/0);  // X: needs 2 blocks, 1 is free
  e.add(5, tokens(8, 500), 10, /*priority=*/6);  // E: takes what C left
  const StepPlan second = e.step();
  EXPECT_EQ(second.swapped_out, std::vector<SeqId>{3});
  EXPECT_EQ(e.seqs[5]->status, SeqStatus::Running);
  e.add(6, tokens(24, 600), 2, /*priority=*/0);  // W: 3 blocks
  const StepPlan third = e.step();
  ASSERT_EQ(third.swap_in.size(), 1u);  // C comes back ...
  EXPECT_EQ(third.preempted, std::vector<SeqId>{5});  // ... while W takes E's blocks
  EXPECT_TRUE(third.swap_out.empty());
  EXPECT_EQ(e.seqs[5]->status, SeqStatus::Preempted);
  e.run_to_completion();
  for (SeqId id : {1, 3, 4, 5, 6}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
  EXPECT_EQ(e.sched.num_free_swap_blocks(), 1);
}

// One seat, a steady stream of urgent requests: without aging the patient
// low-priority request never runs; with aging it runs within a bounded wait.
int first_step_of_low_priority(int32_t aging_steps) {
  SchedulerConfig c = sched_config(256, 1, 256);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = aging_steps;
  FakeEngine e(c, kv_config(128, 8));
  e.add(1, tokens(8, 7000), 2, /*priority=*/10);
  SeqId next = 2;
  for (int step = 0; step < 300; ++step) {
    if (e.sched.num_waiting() < 2) {
      e.add(next, tokens(8, static_cast<TokenId>(10000 + 100 * next)), 3, /*priority=*/0);
      ++next;
    }
    for (const ScheduledSeq& s : e.step().seqs)
      if (s.seq_id == 1) return step;
  }
  return -1;
}

TEST(Scheduler, AgingBoundsTheWaitOfLowPriority) {
  EXPECT_EQ(first_step_of_low_priority(0), -1);  // starved
  const int waited = first_step_of_low_priority(8);
  EXPECT_GE(waited, 0);
  // Ten levels apart at one level per 8 steps: it outranks every new arrival after ~80 steps.
  EXPECT_LE(waited, 10 * 8 + 16);
}

// A long prompt first, three short ones behind it, a budget that cannot take
// them all: FCFS gives the whole step to the long prompt's chunk; length-aware
// composition runs the short prompts whole and the long one in what is left.
TEST(Scheduler, LengthAwareCompositionRunsShortPromptsBesideALongOne) {
  for (const StepComposition comp : {StepComposition::Fcfs, StepComposition::LengthAware}) {
    SchedulerConfig c = sched_config(256, 16, 2048);
    c.composition = comp;
    FakeEngine e(c, kv_config(256, 16));
    e.add(1, tokens(1000, 100), 4);
    for (SeqId id : {2, 3, 4}) e.add(id, tokens(20, static_cast<TokenId>(3000 + 100 * id)), 4);
    const StepPlan plan = e.step();
    if (comp == StepComposition::Fcfs) {
      EXPECT_EQ(summary(plan), (std::vector<Ran>{{1, 0, 256, false}}));
    } else {
      EXPECT_EQ(summary(plan), (std::vector<Ran>{{2, 0, 20, true}, {3, 0, 20, true}, {4, 0, 20, true}, {1, 0, 196, false}}));
    }
    // The next step: decodes first; then the long prompt's next chunk (one prefill running).
    const StepPlan next = e.step();
    if (comp == StepComposition::LengthAware) {
      EXPECT_EQ(summary(next), (std::vector<Ran>{{2, 20, 1, true}, {3, 20, 1, true}, {4, 20, 1, true}, {1, 196, 253, false}}));
    }
    e.run_to_completion();
    for (SeqId id : {1, 2, 3, 4}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
  }
}

// Running prefills closest to done go first.
TEST(Scheduler, LengthAwareCompositionFinishesTheShortestRunningPrefillFirst) {
  SchedulerConfig c = sched_config(100, 16, 2048);
  c.composition = StepComposition::LengthAware;
  FakeEngine e(c, kv_config(256, 16));
  e.add(1, tokens(500, 100), 2);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{1, 0, 100, false}}));
  // A shorter prompt arrives: the long prefill leaves it the room it needs.
  e.add(2, tokens(130, 2000), 2);
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{2, 0, 100, false}}));
  // Both are running prefills now; 2 (30 left) goes before 1 (400 left).
  EXPECT_EQ(summary(e.step()), (std::vector<Ran>{{2, 100, 30, true}, {1, 100, 70, false}}));
  e.run_to_completion();
  for (SeqId id : {1, 2}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id));
}

// A steady stream of short prompts never starves a long one: it is admitted
// within length_aware_max_wait_steps steps.
TEST(Scheduler, LengthAwareCompositionBoundsTheWaitOfALongPrompt) {
  SchedulerConfig c = sched_config(64, 4, 2048);
  c.composition = StepComposition::LengthAware;
  c.length_aware_max_wait_steps = 20;
  FakeEngine e(c, kv_config(512, 16));
  e.add(1, tokens(16, 9000), 200);  // keeps one seat busy
  e.step();
  e.add(2, tokens(600, 100), 2);
  SeqId next = 3;
  int admitted = -1;
  for (int step = 0; step < 200 && admitted < 0; ++step) {
    while (e.sched.num_waiting() < 4) {
      e.add(next, tokens(40, static_cast<TokenId>(20000 + 100 * next)), 2);
      ++next;
    }
    for (const ScheduledSeq& s : e.step().seqs)
      if (s.seq_id == 2) admitted = step;
  }
  EXPECT_GE(admitted, 1);  // short ones went first
  EXPECT_LE(admitted, 20 + 2);
}

}  // namespace
}  // namespace pagellm
