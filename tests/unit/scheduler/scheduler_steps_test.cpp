// The steps of Scheduler::schedule() one at a time: the pure rules of
// step_rules.h as tables of cases, the stateful steps (through
// SchedulerStepsPeer) as the state expected after each iteration, and the
// plan written from recorded decisions.
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "scheduler/scheduler.h"
#include "scheduler/step_decisions.h"
#include "scheduler/step_rules.h"
#include "scheduler_steps_peer.h"
#include "scheduler_test_util.h"

namespace pagellm {
namespace {

using test::kv_config;
using test::sched_config;
using test::tokens;

// A sequence with num_tokens tokens, num_computed of them computed.
std::unique_ptr<Sequence> seq_of(SeqId id, int32_t num_tokens, int32_t num_computed = 0) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->request_id = id;
  s->token_ids = tokens(num_tokens, static_cast<TokenId>(1000 * id));
  s->num_prompt_tokens = num_tokens;
  s->num_computed_tokens = num_computed;
  return s;
}

std::vector<SeqId> ids_of(const auto& seqs) {
  std::vector<SeqId> out;
  for (const Sequence* s : seqs) out.push_back(s->id);
  return out;
}

// (sequence, tokens incl. drafts) of each grant, in order.
using Granted = std::vector<std::pair<SeqId, int32_t>>;
Granted granted(const StepDecisions& step) {
  Granted out;
  for (const TokenGrant& g : step.grants) out.emplace_back(g.seq->id, g.num_tokens());
  return out;
}

// What the engine does after a plan: a token for every sampled entry, then
// on_step_done.
void finish_step(Scheduler& sched, const StepPlan& plan) {
  for (const ScheduledSeq& s : plan.seqs)
    if (s.sample) s.seq->token_ids.push_back(static_cast<TokenId>(7000 + s.seq->num_tokens()));
  sched.on_step_done(plan);
  sched.check_invariants();
}

// ---- 1. order ----

TEST(SchedStepsOrder, AgedPriorityTable) {
  const std::vector<int32_t> levels = {-3, 0, 5};
  struct Case {
    int32_t priority;
    int64_t age;
    int32_t aging_steps;
    int64_t expected;
  };
  const Case cases[] = {
      {7, 100, 0, 7},                                 // no aging: the priority itself
      {-3, 0, 4, 0},  {0, 0, 4, 1}, {5, 0, 4, 2},     // ranks, not values
      {5, 7, 4, 1},   {5, 8, 4, 0}, {-3, 12, 4, -3},  // one rank per aging_steps of age
      {2, 0, 4, 2},   {9, 0, 4, 3},                   // not among the levels: the rank of the next one above
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "priority " << c.priority << " age " << c.age);
    EXPECT_EQ(aged_priority(c.priority, c.age, levels, c.aging_steps), c.expected);
  }
  EXPECT_EQ(priority_levels({5, -3, 5, 0, 0}), levels);
  EXPECT_TRUE(priority_levels({}).empty());
}

// A(5) arrives at step 0, C(0) at step 2, E(0) at step 4; aging every 2
// steps. The queue is re-sorted every step as the ranks move: C passes A
// once the ranks know its value, E (4 steps after A) never does.
TEST(SchedStepsOrder, OrderQueuesIterationByIteration) {
  SchedulerConfig c = sched_config(64, /*max_seqs=*/1);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = 2;
  Scheduler sched(c, kv_config(100));
  SchedulerStepsPeer peer(sched);
  auto a = seq_of(1, 8), cc = seq_of(2, 8), e = seq_of(3, 8);
  a->priority = 5;
  cc->priority = 0;
  e->priority = 0;
  sched.add(a.get());
  struct Iteration {
    int64_t step;
    Sequence* arrives;  // after the step's ordering
    std::vector<SeqId> waiting;
    std::vector<int64_t> effective;  // of A, C, E while present
  };
  const Iteration iterations[] = {
      {1, nullptr, {1}, {0}},
      {2, cc.get(), {1, 2}, {-1, 0}},  // C ranked against the levels of step 2 ({5})
      {3, nullptr, {2, 1}, {0, 0}},    // levels {0, 5}: a tie, the better value first
      {4, e.get(), {2, 1, 3}, {-1, -1, 0}},
      {5, nullptr, {2, 1, 3}, {-1, -1, 0}},
      {6, nullptr, {2, 1, 3}, {-2, -2, -1}},
  };
  for (const Iteration& it : iterations) {
    SCOPED_TRACE(testing::Message() << "step " << it.step);
    peer.begin_step();
    peer.order_queues();
    if (it.arrives) sched.add(it.arrives);
    EXPECT_EQ(ids_of(sched.waiting()), it.waiting);
    std::vector<int64_t> effective;
    for (const Sequence* s : {a.get(), cc.get(), e.get()})
      if (sched.find(s->id) == s) effective.push_back(sched.effective_priority(*s));
    EXPECT_EQ(effective, it.effective);
    sched.check_invariants();
  }
}

// ---- 2. capacity ----

TEST(SchedStepsCapacity, KvVictimTable) {
  struct Case {
    std::vector<SeatHolder> running;  // {priority class, seats}, policy order
    bool fair;
    size_t expected;
  };
  const Case cases[] = {
      {{{0, 1}}, true, 0},
      {{{0, 1}, {0, 3}, {0, 1}}, false, 2},         // no fairness: the last
      {{{0, 1}, {0, 1}, {0, 1}}, true, 2},          // nobody holds more than the last
      {{{0, 1}, {0, 3}, {0, 3}, {0, 1}}, true, 2},  // the newest of the most seated
      {{{0, 5}, {1, 1}, {1, 2}, {1, 1}}, true, 2},  // only the last class counts
      {{{0, 5}, {1, 1}}, true, 1},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(testing::Message() << "case " << i);
    EXPECT_EQ(kv_victim(cases[i].running, cases[i].fair), cases[i].expected);
  }
}

TEST(SchedStepsCapacity, LeavesReserveTable) {
  struct Case {
    bool conservative;
    double watermark;
    int32_t usable, available, running, new_blocks;
    bool expected;
  };
  const Case cases[] = {
      {false, 0.5, 100, 0, 10, 50, true},   // aggressive: whenever the blocks can be had
      {true, 0.5, 100, 10, 0, 10, true},    // nothing running: no reserve to keep
      {true, 0.01, 100, 20, 3, 16, true},   // one block per running sequence + the new one: 4
      {true, 0.01, 100, 20, 3, 17, false},  //
      {true, 0.2, 100, 30, 3, 10, true},    // the watermark is larger: 20
      {true, 0.2, 100, 30, 3, 11, false},   //
      {true, 0.01, 99, 3, 1, 1, true},      // ceil(0.99) = 1 < 2 per running
      {true, 0.01, 99, 3, 1, 2, false},     //
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(testing::Message() << "case " << i);
    EXPECT_EQ(leaves_reserve(c.conservative, c.watermark, c.usable, c.available, c.running, c.new_blocks), c.expected);
  }
}

// Short of blocks, a prefill chunk takes those of a decode that was already
// granted its token this step: the grant goes and its token returns to the
// budget before the plan exists. 5 usable blocks of 8 tokens, budget 16;
// B (priority 1, 7 tokens) runs first, A (priority 0, 32 tokens) joins.
TEST(SchedStepsCapacity, RunningIterationByIteration) {
  SchedulerConfig c = sched_config(16, 256, 40);
  c.policy = SchedulingPolicy::Priority;
  c.priority_aging_steps = 0;
  Scheduler sched(c, kv_config(6, 8));
  SchedulerStepsPeer peer(sched);
  auto a = seq_of(1, 32), b = seq_of(2, 7);
  a->priority = 0;
  b->priority = 1;
  sched.add(b.get());
  struct Iteration {
    Sequence* arrives;       // before the step
    Granted running_grants;  // after schedule_running
    std::vector<SeqId> preempted;
    int32_t budget_left;  // after schedule_running
    Granted all_grants;   // after admission
    std::vector<SeqId> running;
    int32_t free_blocks;
  };
  const Iteration iterations[] = {
      {nullptr, {}, {}, 16, {{2, 7}}, {2}, 4},
      {a.get(), {{2, 1}}, {}, 15, {{2, 1}, {1, 15}}, {1, 2}, 2},
      // B's decode needs a second block, then A's chunk needs two: B goes,
      // its grant withdrawn (budget 16 again) before A takes its 15 tokens.
      {nullptr, {{1, 15}}, {2}, 1, {{1, 15}}, {1}, 1},
      // B waits: its prompt block is cached, but the block after it is not
      // free, it outranks nobody, and no request holds more than its share.
      {nullptr, {{1, 2}}, {}, 14, {{1, 2}}, {1}, 1},
  };
  for (size_t i = 0; i < std::size(iterations); ++i) {
    const Iteration& it = iterations[i];
    SCOPED_TRACE(testing::Message() << "iteration " << i);
    if (it.arrives) sched.add(it.arrives);
    StepDecisions step = peer.begin_step();
    peer.order_queues();
    peer.schedule_running(step);
    EXPECT_EQ(granted(step), it.running_grants);
    EXPECT_EQ(step.preempted, it.preempted);
    EXPECT_EQ(step.budget, it.budget_left);
    if (step.preempted.empty()) peer.admit_waiting(step);
    EXPECT_EQ(granted(step), it.all_grants);
    EXPECT_EQ(ids_of(sched.running()), it.running);
    EXPECT_EQ(sched.kv_stats().free_blocks + sched.kv_stats().cached_blocks, it.free_blocks);
    finish_step(sched, peer.build(step));
  }
  EXPECT_EQ(b->num_preemptions, 1);
}

// A sequence the engine did not finish at max_model_len is finished by the
// running step itself (no position left for its next token).
TEST(SchedStepsCapacity, LengthCapFinishesWithoutAGrant) {
  Scheduler sched(sched_config(64, 256, 16), kv_config(16, 8));
  SchedulerStepsPeer peer(sched);
  auto s = seq_of(1, 15);
  sched.add(s.get());
  const std::vector<int32_t> computed_after = {15, 16};  // prompt, then the last position
  for (int32_t computed : computed_after) {
    StepDecisions step = peer.begin_step();
    peer.schedule_running(step);
    peer.admit_waiting(step);
    EXPECT_TRUE(step.length_capped.empty());
    finish_step(sched, peer.build(step));
    EXPECT_EQ(s->num_computed_tokens, computed);
  }
  StepDecisions step = peer.begin_step();
  peer.schedule_running(step);
  EXPECT_TRUE(step.grants.empty());
  EXPECT_EQ(step.length_capped, std::vector<SeqId>{1});
  EXPECT_EQ(s->status, SeqStatus::FinishedLength);
  EXPECT_EQ(sched.kv_stats().used_blocks, 0);
  EXPECT_FALSE(sched.has_unfinished());
}

// ---- 3. admission ----

TEST(SchedStepsAdmission, FairShareTable) {
  const int32_t cases[][3] = {{256, 0, 0}, {256, 1, 0}, {256, 2, 128}, {10, 3, 3}, {3, 4, 1}};
  for (const auto& [max_seqs, requests, expected] : cases) EXPECT_EQ(fair_share(max_seqs, requests), expected);
}

TEST(SchedStepsAdmission, FairVictimTable) {
  struct Case {
    std::vector<SeatHolder> running;
    SeatHolder waiting;
    int32_t share;
    std::optional<size_t> expected;
  };
  const Case cases[] = {
      {{{0, 3}}, {0, 0}, 0, std::nullopt},                     // no fairness to keep
      {{{0, 5}}, {0, 2}, 2, std::nullopt},                     // not below its share
      {{{0, 1}, {0, 3}, {0, 3}, {0, 1}}, {0, 0}, 2, 2},        // the newest above the share
      {{{0, 1}, {0, 3}, {0, 3, true}, {0, 1}}, {0, 0}, 2, 1},  // spared: joined this step
      {{{0, 3}, {0, 3}}, {1, 0}, 2, std::nullopt},             // never a better class
      {{{1, 3}}, {0, 0}, 2, 0},                                // a worse class gives way
      {{{0, 2}, {0, 2}}, {0, 0}, 2, std::nullopt},             // nobody above the share
      {{{0, 4}, {0, 3}, {0, 4}, {0, 3}}, {0, 1}, 2, 2},        // the furthest above first
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(testing::Message() << "case " << i);
    EXPECT_EQ(fair_victim(cases[i].running, cases[i].waiting, cases[i].share), cases[i].expected);
  }
}

TEST(SchedStepsAdmission, NextToAdmitTable) {
  using C = AdmissionCandidate;
  struct Case {
    std::vector<C> waiting;  // {class, seats, keeps_turn, tokens}
    bool fair, length_aware;
    size_t expected;
    size_t looked_at;  // candidates asked for
  };
  const Case cases[] = {
      {{{0, 2, false, 10}, {0, 0, false, 1}}, false, false, 0, 0},  // the head, unasked
      {{{0, 2, false, 10}, {0, 1, false, 10}, {0, 0, false, 10}, {0, 0, false, 5}}, true, false, 2, 3},
      {{{0, 2, false, 10}, {1, 0, false, 10}}, true, false, 0, 2},  // not past its class
      {{{0, 0, false, 50}, {0, 0, false, 10}, {0, 0, true, 80}, {0, 0, false, 5}}, false, true, 2, 3},
      {{{0, 0, false, 50}, {0, 0, false, 10}, {0, 0, false, 5}, {0, 0, false, 5}}, false, true, 2, 4},
      {{{0, 1, false, 5}, {0, 0, false, 50}, {0, 0, false, 20}}, true, true, 2, 3},  // seats, then length
      {{{0, 0, true, 50}, {0, 0, false, 1}}, false, true, 0, 1},                     // its turn: nothing before it
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(testing::Message() << "case " << i);
    size_t asked = 0;
    const auto candidate = [&](size_t k) {
      ++asked;
      return c.waiting.at(k);
    };
    EXPECT_EQ(next_to_admit(c.waiting.size(), candidate, c.fair, c.length_aware), c.expected);
    EXPECT_EQ(asked, c.looked_at);
  }
}

// Seats (max_num_seqs 2), the budget (32) and the prefix cache: 1 and 2 share
// a 20-token prompt, 3 too; 2's prompt is chunked by the budget, 3 waits for a
// seat (no request is above its share of 1), then finds 1's two full blocks
// in the cache.
TEST(SchedStepsAdmission, AdmitWaitingIterationByIteration) {
  Scheduler sched(sched_config(32, 2, 64), kv_config(32, 8));
  SchedulerStepsPeer peer(sched);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (SeqId id : {1, 2, 3}) {
    seqs.push_back(seq_of(id, 20));
    seqs.back()->token_ids = tokens(20);
  }
  struct Iteration {
    std::vector<SeqId> arrive;
    std::vector<SeqId> finish;  // before the step
    Granted admitted;           // grants of admit_waiting
    std::vector<SeqId> waiting;
    int32_t cached_tokens_of_3;
  };
  const Iteration iterations[] = {
      {{1, 2}, {}, {{1, 20}, {2, 12}}, {}, -1},
      {{3}, {}, {}, {3}, -1},       // no seat, and no victim
      {{}, {1}, {{3, 4}}, {}, 16},  // the prompt's two full blocks are cached: 3 computes 4
  };
  for (size_t i = 0; i < std::size(iterations); ++i) {
    const Iteration& it = iterations[i];
    SCOPED_TRACE(testing::Message() << "iteration " << i);
    for (SeqId id : it.arrive) sched.add(seqs[id - 1].get());
    for (SeqId id : it.finish) EXPECT_TRUE(sched.finish(id));
    StepDecisions step = peer.begin_step();
    peer.schedule_running(step);
    const size_t before = step.grants.size();
    peer.admit_waiting(step);
    const Granted all = granted(step);
    EXPECT_EQ(Granted(all.begin() + static_cast<std::ptrdiff_t>(before), all.end()), it.admitted);
    EXPECT_EQ(ids_of(sched.waiting()), it.waiting);
    EXPECT_EQ(seqs[2]->num_cached_tokens, it.cached_tokens_of_3);
    finish_step(sched, peer.build(step));
  }
  EXPECT_EQ(seqs[2]->num_computed_tokens, 20);
}

// Swap preemption: the swapped sequence comes back (its blocks copied in
// from the host pool) before any waiting one, and joins running this step.
TEST(SchedStepsAdmission, ResumeSwappedBringsTheBlocksBack) {
  SchedulerConfig c = sched_config(256, 256, 48);
  c.preemption_mode = PreemptionMode::Swap;
  c.num_swap_blocks = 16;
  Scheduler sched(c, kv_config(7, 8));
  SchedulerStepsPeer peer(sched);
  auto a = seq_of(1, 16), b = seq_of(2, 16);
  sched.add(a.get());
  sched.add(b.get());
  size_t swapped_blocks = 0;
  bool resumed = false;
  for (int i = 0; i < 100 && !resumed; ++i) {
    StepDecisions step = peer.begin_step();
    peer.schedule_running(step);
    if (!step.swapped_out.empty()) {
      EXPECT_EQ(step.swapped_out, std::vector<SeqId>{2});
      swapped_blocks = step.swap_out.size();
    }
    if (step.preempted.empty()) {
      peer.resume_swapped(step);
      if (!step.swap_in.empty()) {
        resumed = true;
        EXPECT_EQ(step.swap_in.size(), swapped_blocks);
        EXPECT_EQ(ids_of(step.joined), std::vector<SeqId>{2});
        EXPECT_EQ(granted(step).back(), (std::pair<SeqId, int32_t>{2, 1}));
      }
      if (sched.swapped().empty()) peer.admit_waiting(step);
    }
    finish_step(sched, peer.build(step));
    if (a->num_output_tokens() >= 20 && a->status == SeqStatus::Running) {
      EXPECT_TRUE(sched.finish(1));
    }
  }
  EXPECT_GT(swapped_blocks, 0u);
  EXPECT_TRUE(resumed);
}

// ---- 4. composition ----

TEST(SchedStepsComposition, TokensToComputeTable) {
  const TokenLimits plain{.max_model_len = 64};
  TokenLimits whole = plain;
  whole.chunked_prefill = false;
  TokenLimits capped = plain;
  capped.long_prefill_threshold = 8;
  const TokenLimits sliding{.max_model_len = 64, .sliding = true, .window_tokens = 32};
  const TokenLimits tiny_window{.max_model_len = 64, .sliding = true, .window_tokens = 1};
  struct Case {
    const TokenLimits* limits;
    int32_t num_tokens, num_computed, budget, expected;
  };
  const Case cases[] = {
      {&plain, 10, 0, 100, 10},       {&plain, 10, 0, 4, 4},    {&plain, 10, 9, 100, 1},
      {&plain, 10, 10, 100, 0},       {&plain, 70, 0, 100, 64}, {&plain, 70, 64, 100, 0},
      {&plain, 10, 0, 0, 0},          {&whole, 10, 0, 4, 0},    {&whole, 10, 0, 10, 10},
      {&capped, 30, 0, 100, 8},       {&capped, 30, 0, 5, 5},   {&sliding, 100, 0, 100, 16},
      {&sliding, 100, 90, 100, 10},   {&sliding, 100, 0, 5, 5}, {&sliding, 10, 10, 100, 0},
      {&tiny_window, 100, 0, 100, 1},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(testing::Message() << "case " << i);
    EXPECT_EQ(tokens_to_compute(*c.limits, c.num_tokens, c.num_computed, c.budget), c.expected);
  }
}

TEST(SchedStepsComposition, DraftsToVerifyTable) {
  struct Case {
    int32_t proposed, budget_after, decodes_to_come, room;
    bool sliding;
    int32_t expected;
  };
  const Case cases[] = {
      {4, 100, 0, 100, false, 4}, {4, 3, 0, 100, false, 3}, {4, 5, 3, 100, false, 2},  {4, 2, 3, 100, false, 0},
      {4, 100, 0, 1, false, 1},   {4, 100, 0, 0, false, 0}, {4, 100, 0, 100, true, 0},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(testing::Message() << "case " << i);
    EXPECT_EQ(drafts_to_verify(c.proposed, c.budget_after, c.decodes_to_come, c.room, c.sliding), c.expected);
  }
}

TEST(SchedStepsComposition, RunningPassTable) {
  // (tokens, computed): decodes 1 and 3, prefills 2 (40 behind), 4 (5), 6 (20), nothing for 5.
  std::vector<std::unique_ptr<Sequence>> owned;
  std::vector<Sequence*> running;
  const std::pair<int32_t, int32_t> shapes[] = {{10, 9}, {50, 10}, {20, 19}, {30, 25}, {5, 5}, {30, 10}};
  for (const auto& [n, computed] : shapes) {
    owned.push_back(seq_of(static_cast<SeqId>(owned.size() + 1), n, computed));
    running.push_back(owned.back().get());
  }
  struct Case {
    bool decodes, length_aware;
    std::vector<SeqId> expected;
  };
  const Case cases[] = {
      {true, false, {1, 3}}, {true, true, {1, 3}}, {false, false, {2, 4, 6}}, {false, true, {4, 6, 2}}};
  for (const Case& c : cases) EXPECT_EQ(ids_of(running_pass(running, c.decodes, c.length_aware)), c.expected);
  EXPECT_EQ(count_decodes(running), 2);
}

TEST(SchedStepsComposition, WaitingTokensShorterThanTable) {
  std::vector<std::unique_ptr<Sequence>> owned;
  std::deque<Sequence*> waiting;
  for (int32_t n : {30, 5, 50, 8, 3}) {
    owned.push_back(seq_of(static_cast<SeqId>(owned.size() + 1), n));
    waiting.push_back(owned.back().get());
  }
  struct Case {
    int64_t free_seats;
    int32_t remaining, expected;
  };
  const Case cases[] = {{10, 20, 16}, {2, 20, 13}, {0, 20, 0}, {10, 4, 3}, {10, 100, 96}, {-1, 100, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "seats " << c.free_seats << " remaining " << c.remaining);
    EXPECT_EQ(waiting_tokens_shorter_than(waiting, c.free_seats, c.remaining), c.expected);
  }
}

// ---- 5. the plan ----

TEST(SchedStepsPlan, BuildPlanWritesTheDecisionsInOrder) {
  KVCacheManager kv(kv_config(16, 8));
  auto a = seq_of(1, 24), b = seq_of(2, 9, 8);
  b->spec_token_ids = {7, 8, 9};
  ASSERT_TRUE(kv.allocate_slots(1, 0, 24));
  ASSERT_TRUE(kv.allocate_slots(2, 0, 8));
  ASSERT_TRUE(kv.allocate_slots(2, 8, 3));
  kv.evict(1, 1, 2);  // sliding eviction took a's second block
  StepDecisions step(64);
  step.grant({.seq = a.get(), .num_new_tokens = 24, .copies = {{3, 9}}});
  step.grant({.seq = b.get(), .num_new_tokens = 1, .num_draft_tokens = 2, .copies = {{4, 10}}});
  step.swap_out = {{5, 0}};
  step.swap_in = {{1, 6}};
  step.preempted = {7};
  step.swapped_out = {7};
  step.length_capped = {8};
  EXPECT_EQ(step.budget, 64 - 27);

  const StepPlan plan = build_plan(step, kv, /*attention_sinks=*/4);
  EXPECT_EQ(plan.block_size, 8);
  ASSERT_EQ(plan.seqs.size(), 2u);
  const ScheduledSeq& sa = plan.seqs[0];
  EXPECT_EQ(sa.seq_id, 1u);
  EXPECT_EQ(sa.start_pos, 0);
  EXPECT_EQ(sa.num_new_tokens, 24);
  EXPECT_TRUE(sa.sample);
  EXPECT_TRUE(sa.draft_tokens.empty());
  EXPECT_EQ(std::vector<BlockId>(sa.block_table.begin(), sa.block_table.end()),
            std::vector<BlockId>(kv.block_table(1).begin(), kv.block_table(1).end()));
  EXPECT_EQ(sa.kv_sinks, 4);
  EXPECT_EQ(sa.kv_evicted_to, 16);
  const ScheduledSeq& sb = plan.seqs[1];
  EXPECT_EQ(sb.start_pos, 8);
  EXPECT_EQ(sb.num_new_tokens, 3);  // its token and two drafts
  EXPECT_TRUE(sb.sample);
  EXPECT_EQ(sb.draft_tokens, (std::vector<TokenId>{7, 8}));
  EXPECT_EQ(sb.kv_evicted_to, 0);
  EXPECT_EQ(plan.num_batched_tokens, 27);
  EXPECT_EQ(plan.num_draft_tokens, 2);
  EXPECT_EQ(plan.block_copies, (std::vector<BlockCopy>{{3, 9}, {4, 10}}));
  EXPECT_EQ(plan.swap_out, step.swap_out);
  EXPECT_EQ(plan.swap_in, step.swap_in);
  EXPECT_EQ(plan.preempted, step.preempted);
  EXPECT_EQ(plan.swapped_out, step.swapped_out);
  EXPECT_EQ(plan.length_capped, step.length_capped);
}

TEST(SchedStepsPlan, WithdrawTakesTheGrantAndItsCopiesBack) {
  auto a = seq_of(1, 12), b = seq_of(2, 9, 8), c = seq_of(3, 4);
  b->spec_token_ids = {7, 8};
  StepDecisions step(64);
  step.grant({.seq = a.get(), .num_new_tokens = 12, .copies = {{3, 9}}});
  step.grant({.seq = b.get(), .num_new_tokens = 1, .num_draft_tokens = 2});
  step.withdraw(a.get());
  EXPECT_EQ(step.budget, 61);
  EXPECT_EQ(granted(step), (Granted{{2, 3}}));
  step.withdraw(c.get());  // no grant: nothing changes
  EXPECT_EQ(step.budget, 61);
  EXPECT_EQ(granted(step), (Granted{{2, 3}}));
  KVCacheManager kv(kv_config(16, 8));
  ASSERT_TRUE(kv.allocate_slots(2, 0, 11));
  EXPECT_TRUE(build_plan(step, kv, 0).block_copies.empty());
}

// A swap-out reads a block that a copy-on-write copy of this step has not
// filled yet from the copy's source.
TEST(SchedStepsPlan, ContentsOfIsTheCopySource) {
  auto a = seq_of(1, 4), b = seq_of(2, 4);
  StepDecisions step(64);
  step.grant({.seq = a.get(), .num_new_tokens = 1, .copies = {{2, 5}}});
  step.grant({.seq = b.get(), .num_new_tokens = 1, .copies = {{3, 7}}});
  EXPECT_EQ(step.contents_of(5), 2);
  EXPECT_EQ(step.contents_of(7), 3);
  EXPECT_EQ(step.contents_of(4), 4);
  step.withdraw(b.get());
  EXPECT_EQ(step.contents_of(7), 7);
  step.preempted = {9};
  step.joined = {a.get()};
  EXPECT_TRUE(step.was_preempted(9));
  EXPECT_FALSE(step.was_preempted(1));
  EXPECT_TRUE(step.joined_now(a.get()));
  EXPECT_FALSE(step.joined_now(b.get()));
}

}  // namespace
}  // namespace pagellm
