// Mixture-of-experts pieces of the CPU backend that are not matrix products:
// top-k routing of router logits and the grouping of a step's (token, slot)
// pairs by expert, so that each routed expert's weights stream once per step.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace pagellm::cpu {

// More experts than any released model has (DeepSeek V3 and Kimi: 256-384).
constexpr int kMaxExperts = 1024;

// Routes one token: ids[k] and weights[k] from logits[n_expert]. Scores are
// softmax or sigmoid of the logits; the k best (by score + choice_bias, which
// may be null; within the best groups when r.grouped()) are chosen, ties to
// the lower id, their unbiased scores optionally renormalised to sum to 1,
// then scaled.
void route_token(const float* logits, const MoeRouting& r, const float* choice_bias, int32_t* ids, float* weights);

// The slots (t * k + j) routed to each expert, in increasing slot order:
// slots[offsets[e] .. offsets[e + 1]) belong to expert e.
struct ExpertGroups {
  std::vector<int32_t> offsets;  // [n_expert + 1]
  std::vector<int32_t> slots;    // [n * k]
  std::vector<int32_t> cursor;   // scratch of group_by_expert, kept to avoid allocating per call
  int32_t count(int e) const { return offsets[e + 1] - offsets[e]; }
};
// Throws Error for an id outside [0, n_expert).
void group_by_expert(const int32_t* ids, int64_t n_slots, int n_expert, ExpertGroups& out);

}  // namespace pagellm::cpu
