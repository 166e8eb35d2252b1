// Models with linear-attention states: every scheduled sequence carries its
// state slot, a fork's state copy rides the next plan, preemption gives the
// slot back and the sequence starts again from token 0, and swap or sliding
// eviction are refused at construction.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "scheduler_test_util.h"

namespace pagellm {
namespace {

using namespace test;

bool ran(const StepPlan& plan, SeqId id) {
  for (const ScheduledSeq& s : plan.seqs)
    if (s.seq_id == id) return true;
  return false;
}

KVCacheConfig state_kv(int32_t num_blocks, int32_t slots) {
  KVCacheConfig c = kv_config(num_blocks, 16, /*prefix=*/false);
  c.num_state_slots = slots;
  return c;
}

TEST(SchedulerState, ScheduledSequencesCarryDistinctSlotsAndForksCopyTheirState) {
  FakeEngine e(sched_config(256, 4, 256), state_kv(64, 4));
  e.add(1, tokens(20), 5);
  e.add(2, tokens(10, 300), 5);
  StepPlan plan = e.step();
  std::set<int32_t> slots;
  for (const ScheduledSeq& s : plan.seqs) {
    EXPECT_GE(s.state_slot, 0);
    slots.insert(s.state_slot);
  }
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_TRUE(plan.state_copies.empty());
  // n = 3: two children fork from sequence 1 after its prompt.
  e.fork(1, 3);
  e.fork(1, 4);
  plan = e.step();
  ASSERT_EQ(plan.state_copies.size(), 2u);
  const int32_t parent_slot = e.sched.kv().state_slot(1);
  for (const BlockCopy& c : plan.state_copies) EXPECT_EQ(c.src, parent_slot);
  EXPECT_EQ(plan.state_copies[0].dst, e.sched.kv().state_slot(3));
  EXPECT_EQ(plan.state_copies[1].dst, e.sched.kv().state_slot(4));
  // Seats are full: a new request takes one from the request holding three
  // (fairness), and the victim's slot with it.
  e.add(5, tokens(8, 500), 3);
  bool five_ran = false;
  while (e.sched.has_unfinished()) {
    plan = e.step();
    std::set<int32_t> used;
    for (const ScheduledSeq& s : plan.seqs) EXPECT_TRUE(used.insert(s.state_slot).second) << s.state_slot;
    five_ran = five_ran || ran(plan, 5);
  }
  EXPECT_TRUE(five_ran);
  for (SeqId id = 1; id <= 5; ++id) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
  EXPECT_EQ(e.sched.kv_stats().used_state_slots, 0);
}

TEST(SchedulerState, APreemptedSequenceGivesItsSlotBackAndRestartsFromTokenZero) {
  // 6 usable blocks of 16: two sequences growing to 60 tokens cannot both stay.
  FakeEngine e(sched_config(256, 2, 64), state_kv(7, 2));
  e.add(1, tokens(30), 30);
  e.add(2, tokens(30, 400), 30);
  bool restarted = false;
  while (e.sched.has_unfinished()) {
    const StepPlan plan = e.step();
    for (SeqId id : plan.preempted) EXPECT_EQ(e.sched.kv().state_slot(id), -1);
    for (const ScheduledSeq& s : plan.seqs) {
      EXPECT_GE(s.state_slot, 0);
      // Without prefix caching a sequence always starts again at 0.
      if (s.seq->num_output_tokens() > 0 && s.start_pos == 0) restarted = true;
    }
  }
  EXPECT_TRUE(restarted);
  for (SeqId id = 1; id <= 2; ++id) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
}

TEST(SchedulerState, SwapAndSlidingEvictionAreRefused) {
  SchedulerConfig swap = sched_config(256, 2, 64);
  swap.preemption_mode = PreemptionMode::Swap;
  swap.num_swap_blocks = 8;
  EXPECT_THROW(Scheduler(swap, state_kv(16, 2)), Error);
  SchedulerConfig sliding = sched_config(256, 2, 64);
  sliding.kv_eviction = KvEviction::Sliding;
  EXPECT_THROW(Scheduler(sliding, state_kv(16, 2)), Error);
  EXPECT_THROW(Scheduler(sched_config(256, 4, 64), state_kv(16, 2)), Error);  // fewer slots than seats
}

}  // namespace
}  // namespace pagellm
