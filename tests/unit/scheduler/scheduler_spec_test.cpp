// The scheduler with speculative decoding: drafts run with their decode in
// the same plan, count against the token budget, get KV slots, and the slots
// of rejected drafts go back in on_step_done. A fake engine proposes drafts
// (some right, some wrong), accepts the right prefix and appends the true
// next token, so every sequence must end with exactly its expected tokens
// whatever was accepted, preempted or recomputed on the way.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "scheduler_test_util.h"
#include "scheduler/scheduler.h"

namespace pagellm {
namespace {

using test::kv_config;
using test::sched_config;
using test::tokens;

constexpr TokenId kWrong = 7;  // a draft the fake target never accepts

class SpecEngine {
 public:
  SpecEngine(const SchedulerConfig& sc, const KVCacheConfig& kc, uint32_t seed = 1) : sched(sc, kc), rng_(seed) {}

  static TokenId truth(SeqId id, int32_t k) { return static_cast<TokenId>(50000 + id * 1000 + k); }

  Sequence* add(SeqId id, int32_t prompt_len, int32_t max_tokens) {
    auto seq = std::make_unique<Sequence>();
    seq->id = id;
    seq->token_ids = tokens(prompt_len, static_cast<TokenId>(100 + id));
    seq->num_prompt_tokens = prompt_len;
    Sequence* p = seq.get();
    seqs[id] = std::move(seq);
    max_tokens_[id] = max_tokens;
    sched.add(p);
    return p;
  }

  // Drafts for every decode: `k` of them, each right with probability `p_right`.
  void propose(int32_t k, double p_right) {
    for (Sequence* seq : sched.running()) {
      if (seq->num_tokens() - seq->num_computed_tokens != 1) continue;
      const int32_t room = std::min(max_tokens_[seq->id] - seq->num_output_tokens(),
                                    sched.config().max_model_len - seq->num_tokens()) - 1;
      for (int32_t j = 0; j < std::min(k, room); ++j)
        seq->spec_token_ids.push_back(std::bernoulli_distribution(p_right)(rng_)
                                          ? truth(seq->id, seq->num_output_tokens() + j)
                                          : kWrong);
    }
  }

  StepPlan step(int32_t k = 4, double p_right = 0.6) {
    propose(k, p_right);
    StepPlan plan = sched.schedule();
    for (auto& [id, seq] : seqs) seq->spec_token_ids.clear();
    sched.check_invariants();
    EXPECT_LE(plan.num_batched_tokens, sched.config().max_num_batched_tokens);
    int32_t drafts = 0;
    for (const auto& s : plan.seqs) {
      EXPECT_LE(s.end_pos(), sched.config().max_model_len);
      drafts += s.num_draft_tokens();
      if (s.num_draft_tokens() > 0) {
        EXPECT_TRUE(s.sample);
        EXPECT_EQ(s.end_pos() - s.num_draft_tokens(), s.seq->num_tokens());
      }
      if (!s.sample) continue;
      Sequence& seq = *s.seq;
      // Accept the right prefix, then the true next token.
      for (TokenId d : s.draft_tokens) {
        if (d != truth(seq.id, seq.num_output_tokens()) || seq.num_output_tokens() >= max_tokens_[seq.id]) break;
        seq.token_ids.push_back(d);
        ++accepted;
      }
      if (seq.num_output_tokens() < max_tokens_[seq.id])
        seq.token_ids.push_back(truth(seq.id, seq.num_output_tokens()));
    }
    EXPECT_EQ(drafts, plan.num_draft_tokens);
    verified += drafts;
    sched.on_step_done(plan);
    sched.check_invariants();
    // A running sequence holds blocks for its computed tokens and the one to come, no more.
    for (const Sequence* seq : sched.running()) {
      EXPECT_LE(static_cast<int32_t>(sched.kv().block_table(seq->id).size()),
                blocks_for_tokens(std::max(seq->num_tokens(), seq->num_computed_tokens + 1), 16))
          << "sequence " << seq->id;
    }
    for (const auto& s : plan.seqs) {
      if (!s.sample || s.seq->status != SeqStatus::Running) continue;
      if (s.seq->num_output_tokens() >= max_tokens_[s.seq_id] || sched.reached_max_model_len(*s.seq))
        EXPECT_TRUE(sched.finish(s.seq_id, SeqStatus::FinishedLength));
    }
    sched.check_invariants();
    return plan;
  }

  void expect_done_with_expected_tokens() {
    EXPECT_FALSE(sched.has_unfinished());
    EXPECT_EQ(sched.kv_stats().used_blocks, 0);
    for (const auto& [id, seq] : seqs) {
      const int32_t n = std::min(max_tokens_[id], sched.config().max_model_len - seq->num_prompt_tokens);
      ASSERT_EQ(seq->num_output_tokens(), n) << "sequence " << id;
      for (int32_t k = 0; k < n; ++k)
        ASSERT_EQ(seq->token_ids[seq->num_prompt_tokens + k], truth(id, k)) << "sequence " << id << " token " << k;
    }
  }

  Scheduler sched;
  std::map<SeqId, std::unique_ptr<Sequence>> seqs;
  int64_t accepted = 0, verified = 0;

 private:
  std::map<SeqId, int32_t> max_tokens_;
  std::mt19937 rng_;
};

TEST(SchedulerSpec, DraftsRunWithTheDecodeAndRejectedSlotsGoBack) {
  SpecEngine e(sched_config(256, 256, 200), kv_config(20));
  Sequence* seq = e.add(1, 14, 100);
  StepPlan plan = e.step(4, 1.0);  // the prompt: no drafts yet
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].num_draft_tokens(), 0);
  EXPECT_EQ(seq->num_tokens(), 15);

  // Four wrong drafts: the step runs positions 14..18 (two blocks), keeps
  // position 14 and gives the second block back.
  plan = e.step(4, 0.0);
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].start_pos, 14);
  EXPECT_EQ(plan.seqs[0].num_new_tokens, 5);
  EXPECT_EQ(plan.seqs[0].draft_tokens, std::vector<TokenId>(4, kWrong));
  EXPECT_EQ(plan.seqs[0].num_logits(), 5);
  EXPECT_EQ(seq->num_computed_tokens, 15);
  EXPECT_EQ(seq->num_tokens(), 16);
  EXPECT_EQ(e.sched.kv().block_table(1).size(), 1u);
  EXPECT_EQ(e.sched.kv_stats().used_blocks, 1);

  // Four right drafts: all kept, plus the token after them.
  plan = e.step(4, 1.0);
  EXPECT_EQ(plan.seqs[0].start_pos, 15);
  EXPECT_EQ(plan.seqs[0].num_new_tokens, 5);
  EXPECT_EQ(seq->num_computed_tokens, 20);
  EXPECT_EQ(seq->num_tokens(), 21);
  EXPECT_EQ(e.accepted, 4);
  while (e.sched.has_unfinished()) e.step();
  e.expect_done_with_expected_tokens();
}

// Linear-attention states: a step that verifies drafts first snapshots the
// sequence's state (slot s into slot num_state_slots + s); when a draft is
// rejected the state is restored before the next step, which computes the
// accepted tokens again; when all are accepted nothing is restored.
TEST(SchedulerSpec, StateSnapshotRestoredWhenADraftIsRejected) {
  KVCacheConfig kc = kv_config(20, 16, false);
  kc.num_state_slots = 4;
  kc.state_snapshots = true;
  SpecEngine e(sched_config(256, 4, 200), kc);
  Sequence* seq = e.add(1, 14, 100);
  e.step(4, 1.0);  // the prompt
  const int32_t slot = e.sched.kv().state_slot(1);
  ASSERT_GE(slot, 0);
  EXPECT_EQ(e.sched.kv().num_backend_state_slots(), 8);

  StepPlan plan = e.step(4, 0.0);  // four wrong drafts at positions 15..18
  ASSERT_EQ(plan.seqs[0].num_draft_tokens(), 4);
  ASSERT_EQ(plan.state_copies.size(), 1u);
  EXPECT_EQ(plan.state_copies[0].src, slot);
  EXPECT_EQ(plan.state_copies[0].dst, 4 + slot);
  EXPECT_EQ(seq->num_computed_tokens, 14);  // back to before the step: the state went past 15
  EXPECT_EQ(seq->num_tokens(), 16);

  plan = e.step(4, 1.0);  // positions 14 and 15 again, no drafts (not a decode), after the restore
  ASSERT_EQ(plan.state_copies.size(), 1u);
  EXPECT_EQ(plan.state_copies[0].src, 4 + slot);
  EXPECT_EQ(plan.state_copies[0].dst, slot);
  EXPECT_EQ(plan.seqs[0].start_pos, 14);
  EXPECT_EQ(plan.seqs[0].num_new_tokens, 2);
  EXPECT_EQ(plan.seqs[0].num_draft_tokens(), 0);

  plan = e.step(4, 1.0);  // four right drafts: kept, and the snapshot is not needed
  ASSERT_EQ(plan.seqs[0].num_draft_tokens(), 4);
  EXPECT_EQ(plan.state_copies.size(), 1u);  // the snapshot only
  EXPECT_EQ(seq->num_computed_tokens, plan.seqs[0].end_pos());
  plan = e.step(0, 1.0);
  EXPECT_TRUE(plan.state_copies.empty());
  while (e.sched.has_unfinished()) e.step();
  e.expect_done_with_expected_tokens();
}

// Random acceptance with preemption over state slots: the outputs are the
// expected ones and a finished or preempted sequence's restore is dropped.
TEST(SchedulerSpec, StateSnapshotsWithRandomAcceptanceAndPreemption) {
  for (uint32_t seed : {1u, 2u}) {
    KVCacheConfig kc = kv_config(12, 16, false);
    kc.num_state_slots = 6;
    kc.state_snapshots = true;
    SpecEngine e(sched_config(64, 6, 128), kc, seed);
    for (SeqId id = 1; id <= 10; ++id)
      e.add(id, 5 + static_cast<int32_t>(id * 7 % 30), 10 + static_cast<int32_t>(id % 4) * 9);
    while (e.sched.has_unfinished()) {
      const StepPlan plan = e.step(3, 0.5);
      for (const BlockCopy& c : plan.state_copies) {
        EXPECT_NE(c.src, c.dst);
        EXPECT_EQ(std::abs(c.src - c.dst), 6);  // a slot and its own snapshot
      }
    }
    e.expect_done_with_expected_tokens();
    EXPECT_GT(e.accepted, 0);
  }
}

// Drafts take what the budget leaves after one token for every decode.
TEST(SchedulerSpec, DraftsShareTheBudgetAfterEveryDecode) {
  SpecEngine e(sched_config(8, 256, 200), kv_config(40));
  for (SeqId id = 1; id <= 3; ++id) e.add(id, 2, 50);
  e.step(0, 1.0);  // three prompts of 2 tokens
  const StepPlan plan = e.step(4, 1.0);
  ASSERT_EQ(plan.seqs.size(), 3u);
  EXPECT_EQ(plan.seqs[0].num_draft_tokens(), 4);  // 8 - 1 - (2 decodes to come) = 5 tokens
  EXPECT_EQ(plan.seqs[1].num_draft_tokens(), 1);  // 3 left, 1 kept for the last decode
  EXPECT_EQ(plan.seqs[2].num_draft_tokens(), 0);
  EXPECT_EQ(plan.num_batched_tokens, 8);
  EXPECT_EQ(plan.num_draft_tokens, 5);
}

// Drafts never take a position past max_model_len.
TEST(SchedulerSpec, DraftsStopAtMaxModelLen) {
  SpecEngine e(sched_config(256, 256, 20), kv_config(10));
  e.add(1, 16, 100);
  e.step(4, 1.0);  // 17 tokens
  StepPlan plan = e.step(10, 1.0);
  // Positions 16..19 at most: the real token and 3 drafts.
  EXPECT_EQ(plan.seqs[0].num_draft_tokens(), 2);  // the fake engine leaves room for one token after them
  while (e.sched.has_unfinished()) e.step(10, 1.0);
  e.expect_done_with_expected_tokens();
}

// With blocks short, a decode runs without its drafts rather than preempt
// another sequence.
TEST(SchedulerSpec, ShortOfBlocksTheDecodeRunsWithoutDrafts) {
  // 4 usable blocks: two sequences of 32 tokens hold 2 each.
  SpecEngine e(sched_config(256, 256, 64), kv_config(5));
  e.add(1, 31, 3);
  e.add(2, 31, 3);
  e.step(0, 1.0);
  const StepPlan plan = e.step(4, 1.0);  // drafts would cross into a third block each
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.num_draft_tokens, 0);
  EXPECT_TRUE(plan.preempted.empty());
  while (e.sched.has_unfinished()) e.step();
  e.expect_done_with_expected_tokens();
}

// Many sequences, random acceptance, a pool small enough to preempt: every
// output is the expected one, and the invariants hold every step.
TEST(SchedulerSpec, RandomAcceptanceWithPreemption) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SpecEngine e(sched_config(96, 256, 200), kv_config(30), seed);
    std::mt19937 rng(seed);
    for (SeqId id = 1; id <= 40; ++id)
      e.add(id, 1 + static_cast<int32_t>(rng() % 60), 1 + static_cast<int32_t>(rng() % 50));
    int steps = 0;
    while (e.sched.has_unfinished() && steps < 20000) {
      e.step(1 + static_cast<int32_t>(rng() % 5), 0.7);
      ++steps;
    }
    e.expect_done_with_expected_tokens();
    EXPECT_GT(e.sched.num_preemptions(), 0) << "the pool should be too small for all at once";
    EXPECT_GT(e.accepted, 0);
    EXPECT_LT(e.accepted, e.verified);
  }
}

}  // namespace
}  // namespace pagellm
