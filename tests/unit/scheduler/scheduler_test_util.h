// Small builders the scheduler tests share, and a fake engine to drive them.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "kv/kv_test_util.h"
#include "scheduler/scheduler.h"

namespace pagellm::test {

// n token ids first, first + 1, ... (the KV tests' iota_tokens, from 100 here).
inline std::vector<TokenId> tokens(int32_t n, TokenId first = 100) { return iota_tokens(n, first); }

inline SchedulerConfig sched_config(int32_t budget, int32_t max_seqs = 256, int32_t max_model_len = 1024) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = max_model_len;
  return c;
}

inline KVCacheConfig kv_config(int32_t num_blocks, int32_t bs = 16, bool prefix = true) {
  KVCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = bs;
  c.enable_prefix_caching = prefix;
  return c;
}

// A fake engine: owns the sequences, appends a token for every sampled entry,
// finishes sequences at max_tokens, checks invariants around every step.
class FakeEngine {
 public:
  FakeEngine(const SchedulerConfig& sc, const KVCacheConfig& kc) : sched(sc, kc) {}

  // A request of one sequence (request_id = id), or of several when
  // `request_id` names one that exists already.
  Sequence* add(SeqId id, std::vector<TokenId> prompt, int32_t max_tokens, int32_t priority = 0,
                uint64_t request_id = 0) {
    auto seq = std::make_unique<Sequence>();
    seq->id = id;
    seq->request_id = request_id != 0 ? request_id : static_cast<uint64_t>(id);
    seq->priority = priority;
    seq->num_prompt_tokens = static_cast<int32_t>(prompt.size());
    seq->token_ids = std::move(prompt);
    Sequence* p = seq.get();
    seqs[id] = std::move(seq);
    max_tokens_[id] = max_tokens;
    sched.add(p);
    sched.check_invariants();
    return p;
  }

  // n > 1 as the engine does it: after the parent's prompt step, a child with
  // the prompt and its own first sampled token.
  Sequence* fork(SeqId parent, SeqId id) {
    const Sequence& p = *seqs.at(parent);
    auto seq = std::make_unique<Sequence>();
    seq->id = id;
    seq->request_id = p.request_id;
    seq->priority = p.priority;
    seq->num_prompt_tokens = p.num_prompt_tokens;
    seq->token_ids.assign(p.token_ids.begin(), p.token_ids.begin() + p.num_prompt_tokens);
    seq->token_ids.push_back(sampled_token(id, 0));
    Sequence* c = seq.get();
    seqs[id] = std::move(seq);
    max_tokens_[id] = max_tokens_.at(parent);
    sched.fork(parent, c);
    sched.check_invariants();
    return c;
  }

  static TokenId sampled_token(SeqId id, int32_t k) { return static_cast<TokenId>(50000 + id * 100 + k); }

  StepPlan step(bool stop_at_max_model_len = true) {
    StepPlan plan = sched.schedule();
    sched.check_invariants();
    EXPECT_LE(plan.num_batched_tokens, sched.config().max_num_batched_tokens);
    for (const auto& s : plan.seqs) {
      EXPECT_LE(s.end_pos(), sched.config().max_model_len);
      if (s.sample) s.seq->token_ids.push_back(sampled_token(s.seq_id, s.seq->num_output_tokens()));
    }
    sched.on_step_done(plan);
    sched.check_invariants();
    for (const auto& s : plan.seqs) {
      if (!s.sample || s.seq->status != SeqStatus::Running) continue;
      if (s.seq->num_output_tokens() >= max_tokens_[s.seq_id] ||
          (stop_at_max_model_len && sched.reached_max_model_len(*s.seq))) {
        EXPECT_TRUE(sched.finish(s.seq_id, SeqStatus::FinishedLength));
      }
    }
    sched.check_invariants();
    return plan;
  }

  // Steps until nothing is left (bounded).
  int run_to_completion(int max_steps = 10000) {
    int steps = 0;
    while (sched.has_unfinished() && steps < max_steps) {
      step();
      ++steps;
    }
    EXPECT_FALSE(sched.has_unfinished());
    return steps;
  }

  std::vector<TokenId> expected_tokens(SeqId id) const {
    const Sequence& s = *seqs.at(id);
    std::vector<TokenId> t(s.token_ids.begin(), s.token_ids.begin() + s.num_prompt_tokens);
    for (int32_t k = 0; k < max_tokens_.at(id); ++k) t.push_back(sampled_token(id, k));
    return t;
  }

  Scheduler sched;
  std::map<SeqId, std::unique_ptr<Sequence>> seqs;

 private:
  std::map<SeqId, int32_t> max_tokens_;
};

}  // namespace pagellm::test
