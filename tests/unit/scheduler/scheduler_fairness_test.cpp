// Fairness between requests (seats, admission order, KV victims), n > 1 forks
// under max_num_seqs, and priority aging whatever the priority values.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "scheduler/scheduler.h"
#include "scheduler_test_util.h"

namespace pagellm {
namespace {

using test::FakeEngine;
using test::kv_config;
using test::sched_config;
using test::tokens;

std::vector<SeqId> ids_of(const StepPlan& plan) {
  std::vector<SeqId> out;
  for (const ScheduledSeq& s : plan.seqs) out.push_back(s.seq_id);
  return out;
}

bool ran(const StepPlan& plan, SeqId id) {
  const auto ids = ids_of(plan);
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// n = 8 with 4 seats: three children run beside the parent, four wait holding
// no blocks; once seated they find the prompt's two full blocks in the cache
// and compute the rest (4 prompt tokens + their first token).
TEST(SchedulerFairness, ForksBeyondTheFreeSeatsWaitAndHitThePrefixCache) {
  FakeEngine e(sched_config(256, 4, 256), kv_config(64, 8));
  e.add(1, tokens(20), 6);
  e.step();
  for (SeqId id = 2; id <= 8; ++id) e.fork(1, id);
  EXPECT_EQ(e.sched.num_running(), 4);
  EXPECT_EQ(e.sched.num_waiting(), 4);
  for (SeqId id = 2; id <= 4; ++id) EXPECT_EQ(e.seqs[id]->num_computed_tokens, 20) << id;
  for (SeqId id = 5; id <= 8; ++id) {
    EXPECT_EQ(e.seqs[id]->status, SeqStatus::Waiting) << id;
    EXPECT_FALSE(e.sched.kv().has_seq(id)) << id;
  }
  bool seated_late = false;
  while (e.sched.has_unfinished()) {
    const StepPlan plan = e.step();
    EXPECT_LE(e.sched.num_running(), 4);
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.seq_id < 5 || s.start_pos >= 21) continue;
      EXPECT_EQ(s.start_pos, 16) << s.seq_id;  // two cached blocks of 8
      EXPECT_EQ(s.num_new_tokens, 5) << s.seq_id;
      EXPECT_TRUE(s.sample);
      seated_late = true;
    }
  }
  EXPECT_TRUE(seated_late);
  for (SeqId id = 1; id <= 8; ++id) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 0);
}

// A request of 16 sequences holds all 8 seats, 8 more of its own wait. A
// one-sequence request arriving now is seated in the very next step: it is
// below its fair share (8 / 2 = 4) and the big one is above, so the big one's
// newest sequence gives up its seat. Its own waiting sequences go after.
TEST(SchedulerFairness, ASmallRequestGetsASeatWhileABigOneHoldsThemAll) {
  FakeEngine e(sched_config(256, 8, 256), kv_config(256, 8));
  e.add(1, tokens(16), 40);
  e.step();
  for (SeqId id = 2; id <= 16; ++id) e.fork(1, id);
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_EQ(e.sched.num_running(), 8);
  EXPECT_EQ(e.sched.num_waiting(), 8);

  e.add(100, tokens(8, 900), 3);
  EXPECT_EQ(e.sched.num_requests(), 2);
  EXPECT_EQ(e.sched.fair_share(), 4);
  const StepPlan plan = e.step();
  ASSERT_TRUE(ran(plan, 100));
  EXPECT_TRUE(plan.seqs.back().sample);  // the whole prompt: its first token now
  EXPECT_EQ(plan.preempted, std::vector<SeqId>{8});  // the big request's newest running one
  EXPECT_EQ(e.sched.num_preemptions_fair(), 1);
  // Its next tokens come every step; it finishes in two more.
  EXPECT_TRUE(ran(e.step(), 100));
  EXPECT_TRUE(ran(e.step(), 100));
  EXPECT_EQ(e.seqs[100]->status, SeqStatus::FinishedLength);

  e.run_to_completion();
  EXPECT_EQ(e.sched.num_preemptions_fair(), 1);  // alone again: no more
  for (SeqId id : {SeqId{1}, SeqId{8}, SeqId{16}, SeqId{100}})
    EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
}

// Free seats, a queue holding six sequences of one request and then one of
// another: admission takes the request with the fewest seats first, so the
// second request's sequence is seated second, not after the first's six.
TEST(SchedulerFairness, AdmissionTakesTheRequestWithFewestSeatsFirst) {
  FakeEngine e(sched_config(256, 4, 256), kv_config(128, 8));
  for (SeqId id = 1; id <= 6; ++id) e.add(id, tokens(8, static_cast<TokenId>(100 * id)), 4, 0, /*request_id=*/1);
  e.add(7, tokens(8, 900), 4);
  EXPECT_EQ(ids_of(e.step()), (std::vector<SeqId>{1, 7, 2, 3}));
  EXPECT_EQ(e.sched.num_preemptions_fair(), 0);  // nobody of a request below its share waits
  e.run_to_completion();
  for (SeqId id = 1; id <= 7; ++id) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
}

// Blocks run short, seats do not: the victim is the newest sequence of the
// request above its fair share (5 seats / 2 requests = 2), never the small
// request's one, although it is the last in arrival order.
TEST(SchedulerFairness, KvVictimsComeFromTheRequestAboveItsShare) {
  FakeEngine e(sched_config(256, 5, 64), kv_config(17, 8));  // 16 usable blocks; 5 x 6 needed
  for (SeqId id = 1; id <= 4; ++id) e.add(id, tokens(8, static_cast<TokenId>(100 * id)), 40, 0, /*request_id=*/1);
  e.add(10, tokens(8, 900), 40);
  e.run_to_completion();
  EXPECT_GT(e.sched.num_preemptions(), 0);
  EXPECT_EQ(e.seqs[10]->num_preemptions, 0);
  for (SeqId id : {1, 2, 3, 4, 10}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
}

// Under the priority policy fairness acts within a priority class only.
TEST(SchedulerFairness, NeverTakesSeatsFromABetterPriority) {
  for (const int32_t small_priority : {5, 0}) {
    SCOPED_TRACE(small_priority);
    SchedulerConfig c = sched_config(256, 4, 256);
    c.policy = SchedulingPolicy::Priority;
    c.priority_aging_steps = 0;
    FakeEngine e(c, kv_config(128, 8));
    for (SeqId id = 1; id <= 4; ++id) e.add(id, tokens(8, static_cast<TokenId>(100 * id)), 20, 0, /*request_id=*/1);
    e.step();
    e.add(10, tokens(8, 900), 3, small_priority);
    const StepPlan plan = e.step();
    EXPECT_EQ(ran(plan, 10), small_priority == 0);  // same class: seated now; worse class: waits
    EXPECT_EQ(e.sched.num_preemptions_fair(), small_priority == 0 ? 1 : 0);
    e.run_to_completion();
    for (SeqId id : {1, 2, 3, 4, 10}) EXPECT_EQ(e.seqs[id]->token_ids, e.expected_tokens(id)) << id;
  }
}

TEST(SchedulerAging, EffectivePriorityIsTheRankMinusTheAge) {
  SchedulerConfig c = sched_config(256, 1, 256);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = 4;
  FakeEngine e(c, kv_config(64, 8));
  Sequence* high = e.add(1, tokens(8), 100, INT32_MIN);
  Sequence* mid = e.add(2, tokens(8, 300), 5, 7);
  Sequence* low = e.add(3, tokens(8, 500), 5, INT32_MAX);
  e.step();
  EXPECT_EQ(e.sched.effective_priority(*high), 0);
  EXPECT_EQ(e.sched.effective_priority(*mid), 1);
  EXPECT_EQ(e.sched.effective_priority(*low), 2);
  for (int i = 0; i < 8; ++i) e.step();  // 9 steps in: two aging steps of 4
  EXPECT_EQ(e.sched.effective_priority(*low), 0);
  // A value never seen takes the rank of the next one above it; the value breaks the tie.
  Sequence* newer = e.add(4, tokens(8, 700), 5, 3);
  Sequence* same_rank = e.add(5, tokens(8, 800), 5, 7);
  EXPECT_EQ(e.sched.effective_priority(*newer), 1);
  EXPECT_EQ(e.sched.effective_priority(*same_rank), 1);
  EXPECT_EQ(std::vector<const Sequence*>(e.sched.waiting().begin(), e.sched.waiting().end()),
            (std::vector<const Sequence*>{mid, low, newer, same_rank}));
}

// One seat, a steady stream of the best priority, one request of the worst:
// with D distinct values present it runs before anything that arrives
// D x aging_steps steps after it, whatever the values are.
int first_step_of(int32_t low, int32_t high, int32_t aging_steps, int32_t third = 0, bool with_third = false) {
  SchedulerConfig c = sched_config(256, 1, 256);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = aging_steps;
  FakeEngine e(c, kv_config(128, 8));
  e.add(1, tokens(8, 7000), 2, low);
  if (with_third) e.add(2, tokens(8, 8000), 2, third);
  SeqId next = 3;
  for (int step = 0; step < 2000; ++step) {
    if (e.sched.num_waiting() < 2) {
      e.add(next, tokens(8, static_cast<TokenId>(10000 + 100 * next)), 3, high);
      ++next;
    }
    for (const ScheduledSeq& s : e.step().seqs)
      if (s.seq_id == 1) return step;
  }
  return -1;
}

TEST(SchedulerAging, BoundsTheWaitAtTheExtremesOfInt32) {
  constexpr int32_t kAging = 8;
  EXPECT_EQ(first_step_of(INT32_MAX, INT32_MIN, 0), -1);  // no aging: starved
  for (const auto& [low, high] : {std::pair{10, 0}, std::pair{INT32_MAX, INT32_MIN}, std::pair{INT32_MAX, 0},
                                  std::pair{0, INT32_MIN}}) {
    SCOPED_TRACE(::testing::Message() << low << " vs " << high);
    const int waited = first_step_of(low, high, kAging);
    EXPECT_GE(waited, 0);
    // Two values: 2 x 8 steps, plus the work of what arrived before that (3 steps each).
    EXPECT_LE(waited, 2 * kAging + 2 * 3 + 2);
  }
  // A third value in between: three ranks, 3 x 8 steps.
  const int waited = first_step_of(INT32_MAX, INT32_MIN, kAging, 0, /*with_third=*/true);
  EXPECT_GE(waited, 0);
  EXPECT_LE(waited, 3 * kAging + 2 * 3 + 2 + 2);
}

}  // namespace
}  // namespace pagellm
