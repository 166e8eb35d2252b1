// StepDecisions: what the steps of one Scheduler::schedule() decided, before
// any plan exists: the sequences that compute tokens (grants, in scheduling
// order), the ones preempted or length-capped, and the block moves. The
// steps record into it as they take KV blocks; build_plan() then writes the
// StepPlan from it in one go.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "scheduler/sequence.h"
#include "scheduler/step_plan.h"

namespace pagellm {

// A sequence computes tokens this step: num_new_tokens of its own, then
// num_draft_tokens of its spec_token_ids, in KV slots already allocated
// (whose copy-on-write copies are `copies`).
struct TokenGrant {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;
  int32_t num_draft_tokens = 0;
  std::vector<BlockCopy> copies = {};

  int32_t num_tokens() const { return num_new_tokens + num_draft_tokens; }
};

struct StepDecisions {
  explicit StepDecisions(int32_t token_budget) : budget(token_budget) {}

  int32_t budget;                   // tokens still free this step
  int32_t prompt_logit_rows = 0;    // tokens granted to sequences that need their prompt's logits
  std::vector<TokenGrant> grants;   // scheduling order
  std::vector<BlockCopy> swap_out;  // device -> host, in preemption order
  std::vector<BlockCopy> swap_in;   // host -> device, in resume order
  std::vector<SeqId> preempted, swapped_out, length_capped;
  // Sequences that joined running this step (swapped in or admitted): never
  // priority or fair victims in the same step.
  std::vector<const Sequence*> joined;

  // Takes grant.num_tokens() from the budget.
  void grant(TokenGrant grant);
  // A preempted sequence computes nothing after all: its grant (if any) goes,
  // copies included, and its tokens return to the budget.
  void withdraw(const Sequence* seq);
  bool was_preempted(SeqId id) const;
  bool joined_now(const Sequence* seq) const;
  // Where the contents of `block` are before this step's copy-on-write
  // copies run: the source of the copy that fills it, else the block itself.
  BlockId contents_of(BlockId block) const;
};

// Step 5: the plan of these decisions. Block tables and sliding-window
// eviction come from `kv` as the steps left it; the copy-on-write copies
// follow the grants' order.
StepPlan build_plan(const StepDecisions& decisions, const KVCacheManager& kv, int32_t attention_sinks);

}  // namespace pagellm
