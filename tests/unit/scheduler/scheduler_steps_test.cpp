// The rules of the scheduling steps (step_rules.h) as tables of cases, and
// the plan written from recorded decisions (step_decisions.h).
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "scheduler/scheduler.h"
#include "scheduler/step_decisions.h"
#include "scheduler/step_rules.h"
#include "scheduler_test_util.h"

namespace pagellm {
namespace {

using test::kv_config;
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
