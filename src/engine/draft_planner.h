// Speculative decoding's share of a step, before the scheduler plans it:
// which running sequences get drafts and how many (worth their cost in the
// step, by a fitted model of the forward pass's time), then the proposer's
// drafts into each sequence's spec_token_ids.
#pragma once

#include <vector>

#include "engine/engine.h"
#include "engine/request_state.h"

namespace pagellm {

class DraftPlanner {
 public:
  DraftPlanner(const SpeculativeConfig& config, const SchedulerConfig& sched_config, Proposer& proposer,
               const SeqOwners& owners)
      : config_(config), sched_config_(sched_config), proposer_(proposer), owners_(owners) {}

  // Proposes drafts for the scheduler's running sequences (decodes only).
  void propose(const Scheduler& scheduler);
  // The scheduler planned the step, which holds the drafts it runs now.
  void clear_drafts();
  // A step's forward pass over `plan` took forward_s seconds.
  void observe_step(const StepPlan& plan, double forward_s);

 private:
  void plan_draft_budget(const Scheduler& scheduler);

  const SpeculativeConfig& config_;
  const SchedulerConfig& sched_config_;
  Proposer& proposer_;
  const SeqOwners& owners_;
  std::vector<DraftRequest> draft_requests_;  // this step's, reused
  StepCostModel step_cost_;                   // forward time by tokens and logits rows
};

}  // namespace pagellm
