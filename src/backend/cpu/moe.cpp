#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace pagellm::cpu {

void route_token(const float* logits, const MoeRouting& r, const float* choice_bias, int32_t* ids, float* weights) {
  const int ne = r.n_expert, k = r.k;
  // Scores in double: the same token gets the same route in any batch, and
  // near-ties are decided by the logits, not by float rounding of exp().
  double scores[kMaxExperts], choice[kMaxExperts];
  if (r.scoring == RouterScoring::Softmax) {
    const float mx = *std::max_element(logits, logits + ne);
    double sum = 0;
    for (int e = 0; e < ne; ++e) sum += scores[e] = std::exp(static_cast<double>(logits[e]) - mx);
    for (int e = 0; e < ne; ++e) scores[e] /= sum;
  } else {
    for (int e = 0; e < ne; ++e) scores[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
  }
  for (int e = 0; e < ne; ++e) choice[e] = scores[e] + (choice_bias ? choice_bias[e] : 0.0);
  // Experts outside the best groups are out of the competition.
  bool taken[kMaxExperts] = {};
  if (r.grouped()) {
    const int per = ne / r.n_group;
    double group[kMaxExperts];
    for (int g = 0; g < r.n_group; ++g) {
      double best = -INFINITY, second = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > best) second = best, best = choice[e];
        else if (choice[e] > second) second = choice[e];
      }
      group[g] = r.group_score == GroupScore::Max || per < 2 ? best : best + second;
    }
    bool group_in[kMaxExperts] = {};
    for (int j = 0; j < r.topk_group; ++j) {
      int bg = -1;
      for (int g = 0; g < r.n_group; ++g)
        if (!group_in[g] && (bg < 0 || group[g] > group[bg])) bg = g;
      group_in[bg] = true;
    }
    for (int e = 0; e < ne; ++e) taken[e] = !group_in[e / per];
  }
  // Partial selection sort: k is small (<= 16 in every released model).
  double chosen_sum = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < ne; ++e)
      if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
    taken[best] = true;
    ids[j] = best;
    chosen_sum += scores[best];
  }
  const double norm = r.normalize && chosen_sum > 0 ? 1.0 / chosen_sum : 1.0;
  for (int j = 0; j < k; ++j) weights[j] = static_cast<float>(scores[ids[j]] * norm * r.scale);
}

void group_by_expert(const int32_t* ids, int64_t n_slots, int n_expert, ExpertGroups& g) {
  g.offsets.assign(static_cast<size_t>(n_expert) + 1, 0);
  for (int64_t s = 0; s < n_slots; ++s) {
    PAGELLM_CHECK(ids[s] >= 0 && ids[s] < n_expert, "expert id {} outside [0, {})", ids[s], n_expert);
    ++g.offsets[ids[s] + 1];
  }
  for (int e = 0; e < n_expert; ++e) g.offsets[e + 1] += g.offsets[e];
  g.slots.resize(static_cast<size_t>(n_slots));
  g.cursor.assign(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t s = 0; s < n_slots; ++s) g.slots[g.cursor[ids[s]]++] = static_cast<int32_t>(s);
}

}  // namespace pagellm::cpu
