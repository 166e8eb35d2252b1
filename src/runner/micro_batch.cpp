#include "runner/micro_batch.h"

#include <algorithm>

#include "core/error.h"

namespace pagellm {

std::vector<int32_t> micro_batch_ends(int64_t n, int parts, int64_t min_tokens) {
  PAGELLM_CHECK(n > 0, "empty batch");
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>(parts, n / std::max<int64_t>(1, min_tokens)));
  std::vector<int32_t> ends;
  for (int64_t i = 1; i <= k; ++i) ends.push_back(static_cast<int32_t>(n * i / k));
  return ends;
}

void slice_batch(const BatchInfo& batch, int32_t begin, int32_t end, BatchInfo& out) {
  PAGELLM_CHECK(begin >= 0 && begin < end && end <= batch.n_tokens(), "rows [{}, {}) outside a batch of {}", begin,
                end, batch.n_tokens());
  out.token_ids.assign(batch.token_ids.begin() + begin, batch.token_ids.begin() + end);
  out.positions.assign(batch.positions.begin() + begin, batch.positions.begin() + end);
  out.slot_mapping.assign(batch.slot_mapping.begin() + begin, batch.slot_mapping.begin() + end);
  out.group_slots.resize(batch.group_slots.size());
  for (size_t g = 0; g < batch.group_slots.size(); ++g)
    out.group_slots[g].assign(batch.group_slots[g].begin() + begin, batch.group_slots[g].begin() + end);
  out.seqs.clear();
  for (const SeqInfo& s : batch.seqs) {
    const int32_t lo = std::max(s.q_start, begin), hi = std::min(s.q_start + s.q_len, end);
    if (lo >= hi) continue;
    SeqInfo part = s;
    part.q_start = lo - begin;
    part.q_len = hi - lo;
    part.ctx_len = s.ctx_len - (s.q_start + s.q_len - hi);  // the rows after `hi` are not in the cache yet
    out.seqs.push_back(std::move(part));
  }
}

}  // namespace pagellm
