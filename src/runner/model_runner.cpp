#include "runner/model_runner.h"

#include <utility>

namespace pagellm {

void ModelRunner::execute(const StepPlan& plan, Output& out) {
  out.entries.clear();
  out.first_row.clear();
  Backend& be = model_.backend();
  // Block moves first, in the plan's order: a block swapped out may be
  // written by this very step's forward pass.
  auto pairs = [](const std::vector<BlockCopy>& v) {
    BlockPairs p;
    for (const auto& c : v) p.emplace_back(c.src, c.dst);
    return p;
  };
  if (!plan.swap_out.empty()) be.swap_out(pairs(plan.swap_out));
  if (!plan.swap_in.empty()) be.swap_in(pairs(plan.swap_in));
  if (!plan.block_copies.empty()) be.copy_blocks(pairs(plan.block_copies));
  if (plan.empty()) {
    be.synchronize();  // the moves are done before the next plan reuses their blocks
    return;
  }

  batch_.token_ids.clear();
  batch_.positions.clear();
  batch_.slot_mapping.clear();
  batch_.seqs.resize(plan.seqs.size());
  logits_rows_.clear();
  int32_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    s.append_input_ids(batch_.token_ids);
    plan.append_positions_and_slots(s, batch_.positions, batch_.slot_mapping);
    SeqInfo& info = batch_.seqs[i];
    info.q_start = row;
    info.q_len = s.num_new_tokens;
    info.ctx_len = s.end_pos();
    info.block_table.assign(s.block_table.begin(), s.block_table.end());
    info.kv_sinks = s.kv_sinks;
    info.kv_evicted_to = s.kv_evicted_to;
    row += s.num_new_tokens;
    if (s.sample) {
      out.entries.push_back(static_cast<int32_t>(i));
      out.first_row.push_back(static_cast<int32_t>(logits_rows_.size()));
      for (int32_t j = s.num_logits(); j >= 1; --j) logits_rows_.push_back(row - j);
    }
  }
  const size_t vocab = static_cast<size_t>(model_.config().n_vocab);
  out.logits.resize(logits_rows_.size() * vocab);
  model_.forward(batch_, logits_rows_, out.logits.data());
}

}  // namespace pagellm
