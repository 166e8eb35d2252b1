// Runs the steps of Scheduler::schedule() one at a time, so a test can look
// at what each one decided (the Scheduler befriends this class).
#pragma once

#include "scheduler/scheduler.h"

namespace pagellm {

class SchedulerStepsPeer {
 public:
  explicit SchedulerStepsPeer(Scheduler& sched) : s_(sched) {}

  // What schedule() does before its steps, and the budget they start from.
  StepDecisions begin_step() {
    ++s_.step_;
    return StepDecisions(s_.config_.max_num_batched_tokens);
  }
  void order_queues() { s_.order_queues(); }
  void schedule_running(StepDecisions& step) { s_.schedule_running(step); }
  void resume_swapped(StepDecisions& step) { s_.resume_swapped(step); }
  void admit_waiting(StepDecisions& step) { s_.admit_waiting(step); }
  StepPlan build(const StepDecisions& step) const { return build_plan(step, s_.kv_, s_.config_.attention_sinks); }

 private:
  Scheduler& s_;
};

}  // namespace pagellm
