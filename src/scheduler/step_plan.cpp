#include "scheduler/step_plan.h"

#include "core/error.h"

namespace pagellm {

int64_t StepPlan::slot_of(std::span<const BlockId> block_table, int32_t pos, int32_t block_size) {
  const size_t index = static_cast<size_t>(pos / block_size);
  PAGELLM_CHECK(pos >= 0 && index < block_table.size(),
                "position {} is outside a block table of {} blocks of {}", pos, block_table.size(),
                block_size);
  return int64_t{block_table[index]} * block_size + pos % block_size;
}

void ScheduledSeq::append_input_ids(std::vector<TokenId>& out) const {
  const int32_t real = num_new_tokens - num_draft_tokens();
  const auto ids = std::span<const TokenId>(seq->token_ids).subspan(start_pos, real);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), draft_tokens.begin(), draft_tokens.end());
}

void StepPlan::append_positions_and_slots(const ScheduledSeq& s, std::vector<int32_t>& positions,
                                          std::vector<int64_t>& slots,
                                          std::vector<std::vector<int64_t>>* group_slots) const {
  for (int32_t pos = s.start_pos; pos < s.end_pos(); ++pos) {
    positions.push_back(pos);
    slots.push_back(slot_of(s.block_table, pos, block_size));
  }
  if (!group_slots) return;
  group_slots->resize(s.group_tables.size());
  for (size_t g = 0; g < s.group_tables.size(); ++g)
    for (int32_t pos = s.start_pos; pos < s.end_pos(); ++pos)
      (*group_slots)[g].push_back(slot_of(s.group_tables[g], pos, block_size));
}

}  // namespace pagellm
