// ModelRunner: turns a StepPlan into ONE forward pass over every scheduled
// token (prefill chunks and decodes mixed) and returns the logits of the
// sequences that sample this step. It never looks at requests or text.
//
// Under tensor or pipeline parallelism (a communicator of several ranks) the
// runner on rank 0 broadcasts each step's block moves and batch; the runner
// on every other rank (serve_worker) runs its shard of the same pass. With
// pipeline stages the batch is cut into micro-batches of whole sequences that
// flow through the stages one after another, so every stage has work while
// the next one runs (GPipe's schedule, forward only).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runner/step_message.h"
#include "scheduler/step_plan.h"

namespace pagellm::dist {
class Communicator;
}

namespace pagellm {

class ModelRunner {
 public:
  // comm: the ranks the model is sharded over (model.shard() says how), or
  // null for one rank. micro_batches: per step under pipeline parallelism
  // (0: twice the number of stages).
  explicit ModelRunner(Model& model, dist::Communicator* comm = nullptr, int micro_batches = 0);

  struct Output {
    std::vector<int32_t> entries;    // indices into plan.seqs that sample (sample == true)
    // Per entry: its first row of logits. Entry i has plan.seqs[entries[i]].num_logits()
    // consecutive rows: one per draft token, then the one after the last.
    std::vector<int32_t> first_row;
    std::vector<float> logits;       // [rows, n_vocab]
    // Row j of entry i.
    const float* row(size_t i, int32_t j, int n_vocab) const {
      return logits.data() + static_cast<size_t>(first_row[i] + j) * static_cast<size_t>(n_vocab);
    }
  };

  // Performs the plan's block moves (swap-out, swap-in, copy-on-write), then
  // the forward pass over its tokens, if any.
  void execute(const StepPlan& plan, Output& out);

  // Rank > 0: runs the steps rank 0 sends until it sends stop.
  void serve_worker();
  // Rank 0: tells the workers to stop (once; later calls do nothing).
  void stop_workers();

 private:
  bool parallel() const;
  void run(const StepMessage& m, float* logits);
  void pipeline_forward(const BatchInfo& batch, const std::vector<int32_t>& logits_rows, float* logits);
  void broadcast(const StepMessage& m);
  StepMessage receive();

  Model& model_;
  dist::Communicator* comm_;
  int micro_batches_;
  bool workers_stopped_ = false;
  StepMessage msg_;                  // reused across steps
  std::vector<float> scratch_;       // a worker's logits, a stage's hidden states
  std::vector<float> stage_logits_;  // the last stage's logits of the whole step
};

}  // namespace pagellm
