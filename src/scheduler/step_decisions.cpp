#include "scheduler/step_decisions.h"

#include <algorithm>

namespace pagellm {

void StepDecisions::grant(TokenGrant g) {
  budget -= g.num_tokens();
  if (g.seq->needs_prompt_logits) prompt_logit_rows += g.num_new_tokens;
  grants.push_back(std::move(g));
}

void StepDecisions::withdraw(const Sequence* seq) {
  const auto it = std::find_if(grants.begin(), grants.end(), [&](const TokenGrant& g) { return g.seq == seq; });
  if (it == grants.end()) return;
  budget += it->num_tokens();
  if (seq->needs_prompt_logits) prompt_logit_rows -= it->num_new_tokens;
  grants.erase(it);
}

bool StepDecisions::was_preempted(SeqId id) const {
  return std::find(preempted.begin(), preempted.end(), id) != preempted.end();
}

bool StepDecisions::joined_now(const Sequence* seq) const {
  return std::find(joined.begin(), joined.end(), seq) != joined.end();
}

BlockId StepDecisions::contents_of(BlockId block) const {
  for (const TokenGrant& g : grants)
    for (const BlockCopy& c : g.copies)
      if (c.dst == block) block = c.src;
  return block;
}

StepPlan build_plan(const StepDecisions& decisions, const KVCacheManager& kv, int32_t attention_sinks) {
  StepPlan plan;
  plan.block_size = kv.block_size();
  plan.seqs.reserve(decisions.grants.size());
  for (const TokenGrant& g : decisions.grants) {
    const Sequence& seq = *g.seq;
    ScheduledSeq s;
    s.seq = g.seq;
    s.seq_id = seq.id;
    s.start_pos = seq.num_computed_tokens;
    s.num_new_tokens = g.num_tokens();
    s.block_table = kv.block_table(seq.id);
    s.state_slot = kv.state_slot(seq.id);
    for (int gi = 1; gi < kv.num_groups(); ++gi) s.group_tables.push_back(kv.block_table(seq.id, gi));
    const bool reaches_end = seq.num_computed_tokens + g.num_new_tokens == seq.num_tokens();
    s.sample = reaches_end && seq.pool_rows == PoolRows::None;
    if (seq.pool_rows == PoolRows::All) {
      s.num_hidden = g.num_new_tokens;
    } else if (seq.pool_rows == PoolRows::Last && reaches_end) {
      s.hidden_begin = g.num_new_tokens - 1;
      s.num_hidden = 1;
    } else if (seq.pool_rows == PoolRows::First && (s.start_pos == 0 || reaches_end)) {
      s.num_hidden = 1;  // (the last chunk's too, unused: it tells the engine the prompt is done)
    }
    s.draft_tokens.assign(seq.spec_token_ids.begin(), seq.spec_token_ids.begin() + g.num_draft_tokens);
    // Positions [start, end) that score a prompt token (the last prompt position samples).
    if (seq.needs_prompt_logits) {
      const int32_t scored_end = std::min(s.start_pos + g.num_new_tokens, seq.num_prompt_tokens - 1);
      s.num_prompt_logits = std::max(0, scored_end - s.start_pos);
    }
    if (const int32_t end = kv.evicted_end(seq.id); end > 0) {
      s.kv_sinks = attention_sinks;
      s.kv_evicted_to = end * kv.block_size();
    }
    plan.seqs.push_back(std::move(s));
    plan.block_copies.insert(plan.block_copies.end(), g.copies.begin(), g.copies.end());
    plan.num_batched_tokens += g.num_tokens();
    plan.num_draft_tokens += g.num_draft_tokens;
  }
  plan.swap_out = decisions.swap_out;
  plan.swap_in = decisions.swap_in;
  plan.preempted = decisions.preempted;
  plan.swapped_out = decisions.swapped_out;
  plan.length_capped = decisions.length_capped;
  return plan;
}

}  // namespace pagellm
