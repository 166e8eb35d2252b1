// ModelRunner: turns a StepPlan into ONE forward pass over every scheduled
// token (prefill chunks and decodes mixed) and returns the logits of the
// sequences that sample this step. It never looks at requests or text.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "scheduler/step_plan.h"

namespace pagellm {

class ModelRunner {
 public:
  explicit ModelRunner(Model& model) : model_(model) {}

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

 private:
  Model& model_;
  BatchInfo batch_;               // reused across steps
  std::vector<int32_t> logits_rows_;
};

}  // namespace pagellm
